"""`nightshift daemon`: the one loop (agent/loop.py), run for as long as it lives.

Each tick checks health, places and watches (the engine), preempts through the gate, carries out
approved calls whose requester is gone, and hands every failed or paused job to the agent graph as
a `recover job N` goal, so each change to a job passes the policy gate and lands in the audit. Recovery threads are named after the attempt they follow
(`recover-job-7-after-2`), so a restarted daemon resumes the same thread instead of starting a
second recovery, and a recovery waiting for approval simply waits across restarts.

A full disk, a store locked past its busy timeout or a store file deleted under it does not end
the daemon: the loop reports the fault once, waits it out with backoff and says when it cleared
(agent/loop.py), while the runs go on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.types import Command

from nightshift.agent.goals import recover_goal
from nightshift.agent.graph import build_graph, sqlite_checkpointer
from nightshift.agent.planner import DeterministicPlanner, Planner
from nightshift.agent.wiring import Wiring, local_now
from nightshift.runtime import locks
from nightshift.runtime.errors import OperatorError


class DaemonLock:
    """One daemon per NIGHTSHIFT_HOME: two loops would both place the same queued job."""

    def __init__(self, home: Path):
        self.path = home / "daemon.lock"
        self._held: locks.Held | None = None

    def acquire(self) -> None:
        held = locks.try_exclusive(self.path)
        if held is None:
            raise OperatorError(
                f"another nightshift daemon holds {self.path} (pid "
                f"{locks.note(self.path) or '?'}); stop it first"
            )
        held.write_note(str(os.getpid()))
        self._held = held

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    @staticmethod
    def held(home: Path) -> bool:
        """Whether a live daemon holds the lock (a stale file from a killed one does not count)."""
        return locks.is_held(home / "daemon.lock")


class Daemon:
    def __init__(
        self,
        w: Wiring,
        planner: Planner | None = None,
        on_progress: Callable[[str, dict[str, Any]], None] | None = None,
    ):
        self.w = w
        self.say = on_progress or (lambda kind, data: None)
        self.graph = build_graph(
            w,
            planner or DeterministicPlanner(),
            checkpointer=sqlite_checkpointer(w),
            on_progress=on_progress,
        )
        self.lock = DaemonLock(w.settings.home_path)
        self.stop_event = threading.Event()
        self._finished: set[str] = set()  # recovery threads known to be over
        w.loop.say = self.say
        w.loop.recover = self._recover
        w.loop.carry_out_approved = True

    def run(self, *, max_ticks: int | None = None) -> None:
        """Tick until stopped (SIGTERM/SIGINT set `stop_event`). Runs keep going when the daemon
        stops; the next daemon re-attaches to them."""
        self.lock.acquire()
        self.w.loop.survive(
            "the daemon's start in the audit",
            lambda: self.w.audit.append("system", "daemon.start", payload={"pid": os.getpid()}),
        )
        ticks = 0
        try:
            while not self.stop_event.is_set():
                self.step()
                ticks += 1
                if max_ticks is not None and ticks >= max_ticks:
                    break
                self.stop_event.wait(self.w.settings.loop.poll_interval_s)
        finally:
            try:
                self.w.loop.survive(
                    "the daemon's stop in the audit",
                    lambda: self.w.audit.append(
                        "system", "daemon.stop", payload={"pid": os.getpid(), "ticks": ticks}
                    ),
                )
            finally:
                self.lock.release()

    def step(self) -> None:
        self.w.loop.step()

    def _recover(self, job_id: int, attempts: int) -> None:
        thread = f"recover-job-{job_id}-after-{attempts}"
        if thread in self._finished:
            return
        cfg = {"configurable": {"thread_id": thread}, "recursion_limit": 200}
        snap = self.graph.get_state(cfg)
        if not snap.values:
            self.say("recover", {"job_id": job_id, "thread": thread})
            goal = recover_goal(job_id, watch=False)
            self.graph.invoke(
                {"goal": goal.model_dump(mode="json"), "history": [], "on_behalf_of": "system"}, cfg
            )
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
