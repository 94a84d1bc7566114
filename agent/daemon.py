"""`nightshift daemon`: the one scheduler/monitor loop, run for as long as it lives.

It ticks the engine (place, start, watch, enforce the spec's own limits) and hands every failed or
paused job to the agent graph as a `recover job N` goal, so each change to a job passes the policy
gate and lands in the audit. Recovery threads are named after the attempt they follow
(`recover-job-7-after-2`), so a restarted daemon resumes the same thread instead of starting a
second recovery, and a recovery waiting for approval simply waits across restarts.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.types import Command
from sqlmodel import func, select

from nightshift.agent.api import Client
from nightshift.agent.goals import recover_goal
from nightshift.agent.graph import build_graph, sqlite_checkpointer
from nightshift.agent.planner import DeterministicPlanner, Planner
from nightshift.agent.wiring import Wiring, local_now
from nightshift.runtime.errors import NightshiftError, OperatorError
from nightshift.runtime.store import Attempt, Job


class DaemonLock:
    """One daemon per NIGHTSHIFT_HOME: two loops would both place the same queued job."""

    def __init__(self, home: Path):
        self.path = home / "daemon.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OperatorError(f"another nightshift daemon holds {self.path} (pid "
                                f"{self.path.read_text().strip() or '?'}); stop it first") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def held(home: Path) -> bool:
        """Whether a live daemon holds the lock (a stale file from a killed one does not count)."""
        path = home / "daemon.lock"
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


class Daemon:
    def __init__(self, w: Wiring, planner: Planner | None = None,
                 on_progress: Callable[[str, dict[str, Any]], None] | None = None):
        self.w = w
        self.say = on_progress or (lambda kind, data: None)
        self.graph = build_graph(w, planner or DeterministicPlanner(),
                                 checkpointer=sqlite_checkpointer(w), on_progress=on_progress)
        self.lock = DaemonLock(w.settings.home_path)
        self.stop_event = threading.Event()
        self._finished: set[str] = set()  # recovery threads known to be over
        self.client = Client(w, principal="system")
        self._last_health = float("-inf")

    def run(self, *, max_ticks: int | None = None) -> None:
        """Tick until stopped (SIGTERM/SIGINT set `stop_event`). Runs keep going when the daemon
        stops; the next daemon re-attaches to them."""
        self.lock.acquire()
        self.w.audit.append("system", "daemon.start", payload={"pid": os.getpid()})
        ticks = 0
        try:
            while not self.stop_event.is_set():
                self.step()
                ticks += 1
                if max_ticks is not None and ticks >= max_ticks:
                    break
                self.stop_event.wait(self.w.settings.loop.poll_interval_s)
        finally:
            self.w.audit.append("system", "daemon.stop", payload={"pid": os.getpid(), "ticks": ticks})
            self.lock.release()

    def step(self) -> None:
        self._health_check_if_due()
        self.w.engine.tick()
        self._preempt()
        for job_id, attempts in self._needing_recovery():
            self._recover(job_id, attempts)

    def _health_check_if_due(self) -> None:
        """GPU verdicts are what placement quarantines by; keep them fresh, as a system read."""
        now = time.monotonic()
        if now - self._last_health < self.w.settings.loop.health_interval_min * 60:
            return
        self._last_health = now
        try:
            self.client.call("gpu_health_check", {})
        except NightshiftError as exc:  # a failed check is recorded in the audit; keep going
            self.say("health", {"error": str(exc)})

    def _preempt(self) -> None:
        """Placement only proposes; each pause passes the gate as a `modify` by `system`."""
        decision = self.w.engine.last_decision
        for p in decision.preemptions if decision else []:
            try:
                self.client.call("pause_job", {"job_id": p.victim_job_id,
                                               "reason": f"preempted for job {p.for_job_id}: {p.reason}"})
            except NightshiftError as exc:
                self.say("preempt", {"job_id": p.victim_job_id, "error": str(exc)})
        if decision:
            decision.preemptions = []  # acted on (or refused); the next tick proposes afresh

    def _needing_recovery(self) -> list[tuple[int, int]]:
        with self.w.store.session() as s:
            rows = s.exec(select(Job.id, func.count(Attempt.id))
                          .join(Attempt, Attempt.job_id == Job.id)
                          .where(Job.state.in_(("failed", "paused")))
                          .group_by(Job.id)).all()
        return [(j, n) for j, n in rows]

    def _recover(self, job_id: int, attempts: int) -> None:
        thread = f"recover-job-{job_id}-after-{attempts}"
        if thread in self._finished:
            return
        cfg = {"configurable": {"thread_id": thread}, "recursion_limit": 200}
        snap = self.graph.get_state(cfg)
        if not snap.values:
            self.say("recover", {"job_id": job_id, "thread": thread})
            goal = recover_goal(job_id, watch=False)
            self.graph.invoke({"goal": goal.model_dump(mode="json"), "history": [],
                               "on_behalf_of": "system"}, cfg)
            return
        pending = [i for t in snap.tasks for i in t.interrupts]
        if pending:
            state = self.w.approvals.status(pending[0].value["approval_id"], local_now()).state
            if state != "pending":
                self.graph.invoke(Command(resume=state), cfg)
        elif snap.next:
            self.graph.invoke(None, cfg)
        else:  # that recovery finished (requeued, or gave up): nothing more for this attempt
            self._finished.add(thread)
