"""Recovery runs off the loop's tick: while one job's recovery is slow (here a planner that takes
seconds to decide, as a model would), the loop still places and starts other work."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from nightshift.agent.brain.planner import DeterministicPlanner
from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.daemon import Daemon

from conftest import write_spec


class SlowPlanner(DeterministicPlanner):
    """The deterministic playbook, 4 s slower on its first decision."""

    def __init__(self) -> None:
        super().__init__()
        self.busy_until: float | None = None

    def next(self, goal: Any, history: list[Any]) -> Any:
        if self.busy_until is None:
            self.busy_until = time.monotonic() + 4
            time.sleep(4)
        return super().next(goal, history)


@pytest.mark.slow
def test_a_slow_recovery_does_not_hold_up_placement(home, tmp_path):
    w = Wiring.load()
    crashing = write_spec(
        tmp_path, steps=40, env={"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "5"}, file="crash.yaml"
    )
    ctx = w.context("alice", "c1")
    crash_id = w.gate.call(ctx, "submit_job", {"spec_path": str(crashing)}, via="cli").job_id
    planner = SlowPlanner()
    daemon = Daemon(w, planner)
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        end = time.monotonic() + 60
        while planner.busy_until is None:  # the crash was handed to recovery
            assert time.monotonic() < end, "the crash never reached recovery"
            time.sleep(0.05)
        normal = write_spec(tmp_path, steps=5, file="normal.yaml")
        ctx2 = w.context("alice", "c2")
        other = w.gate.call(ctx2, "submit_job", {"spec_path": str(normal)}, via="cli").job_id
        while not w.store.attempts(other):
            assert time.monotonic() < end, "the other job never started"
            time.sleep(0.05)
        started = time.monotonic()
    finally:
        daemon.stop_event.set()
        runner.join(timeout=90)
    assert started < planner.busy_until, "placement waited for the slow recovery"
    assert w.store.job(crash_id).state in ("queued", "running", "succeeded")  # it was recovered
