"""The daemon's recoveries, off the loop's tick: the loop names the failed and paused jobs it
finds, and one worker thread runs each job's `recover job N` graph (diagnose, find a checkpoint,
resume), so a slow diagnosis or checkpoint scan never delays placement, and a tick never waits on
one. Threads are named after the attempt they follow (`recover-job-7-after-2`): a restarted
daemon resumes the same thread instead of starting a second recovery, and one waiting for an
approval is polled each tick until the approval is decided.

Without `start()` (a daemon stepped by hand, as tests do) each recovery runs in the caller."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from langgraph.types import Command

from nightshift.agent.brain.goals import recover_goal
from nightshift.agent.brain.wiring import Wiring, local_now


class Recoveries:
    def __init__(
        self,
        w: Wiring,
        graph: Any,
        *,
        say: Callable[[str, dict[str, Any]], None],
        tell: Callable[[str], None],
    ):
        self.w, self.graph, self.say, self.tell = w, graph, say, tell
        self._queue: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._in_flight: set[str] = set()
        self._waiting: dict[str, tuple[int, int]] = {}  # threads parked on an approval
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        self._worker = threading.Thread(target=self._work, name="nightshift-recovery", daemon=True)
        self._worker.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Let the recovery in hand finish (its graph is checkpointed either way), then end."""
        worker, self._worker = self._worker, None
        if worker is not None:
            self._queue.put(None)
            worker.join(timeout_s)

    def request(self, job_id: int, attempts: int) -> None:
        """Recover `job_id` after its attempt `attempts` (the loop calls this each time it sees
        the job failed or paused; a thread already queued or running is not queued again)."""
        thread = _thread(job_id, attempts)
        with self._guard:
            if thread in self._in_flight:
                return
            self._in_flight.add(thread)
        if self._worker is None:
            self._run(job_id, attempts)
        else:
            self._queue.put((job_id, attempts))

    def poll_waiting(self) -> None:
        """Look again at the recoveries parked on an approval (decided elsewhere since)."""
        with self._guard:
            waiting = list(self._waiting.values())
        for job_id, attempts in waiting:
            self.request(job_id, attempts)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(*item)

    def _run(self, job_id: int, attempts: int) -> None:
        thread = _thread(job_id, attempts)
        try:
            waiting = self._recover(job_id, thread)
        except Exception as exc:  # one job's recovery never stops the others or the loop
            fault = self.w.store.fault_of(exc)
            waiting = fault is not None  # an environment fault: tried again next tick
            self.tell(
                f"warning: the recovery of job {job_id} ({thread}) stopped: "
                f"{fault or f'{type(exc).__name__}: {exc}'}"
            )
        finally:
            with self._guard:
                self._in_flight.discard(thread)
        with self._guard:
            if waiting:
                self._waiting[thread] = (job_id, attempts)
            else:
                self._waiting.pop(thread, None)

    def _recover(self, job_id: int, thread: str) -> bool:
        """Start, continue or resume the thread; True while it waits (for an approval)."""
        cfg = {"configurable": {"thread_id": thread}, "recursion_limit": 200}
        snap = self.graph.get_state(cfg)
        if not snap.values:
            self.say("recover", {"job_id": job_id, "thread": thread})
            goal = recover_goal(job_id, watch=False)
            self.graph.invoke(
                {"goal": goal.model_dump(mode="json"), "history": [], "on_behalf_of": "system"}, cfg
            )
            snap = self.graph.get_state(cfg)
            return bool(snap.next)
        pending = [i for t in snap.tasks for i in t.interrupts]
        if pending:
            state = self.w.approvals.status(pending[0].value["approval_id"], local_now()).state
            if state == "pending":
                return True
            self.graph.invoke(Command(resume=state), cfg)
        elif snap.next:
            self.graph.invoke(None, cfg)
        else:  # that recovery finished (requeued, or gave up): nothing more for this attempt
            return False
        return bool(self.graph.get_state(cfg).next)


def _thread(job_id: int, attempts: int) -> str:
    return f"recover-job-{job_id}-after-{attempts}"
