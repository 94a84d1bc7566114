"""Early stopping: the pure rules, and the loop stopping a real run that stopped improving — a
success with reason early_stopped, not a failure."""

from __future__ import annotations

import pytest

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.runtime.training.early_stop import median_rule, patience_exhausted

from conftest import write_spec


def test_patience_counts_evaluations_without_real_improvement():
    """Stops only when the last `patience` values beat the earlier best by no more than min_delta."""
    improving = [1.0, 0.9, 0.8, 0.7, 0.6]
    assert patience_exhausted(improving, mode="min", patience=3) is None
    flat = [1.0, 0.5, 0.51, 0.5, 0.52]
    assert "last 3 evaluations" in patience_exhausted(flat, mode="min", patience=3)
    assert (
        patience_exhausted([1.0, 0.5, 0.49, 0.495, 0.5], mode="min", patience=3, min_delta=0.0)
        is None
    )
    assert (
        patience_exhausted([1.0, 0.5, 0.49, 0.495, 0.5], mode="min", patience=3, min_delta=0.05)
        is not None
    )
    assert patience_exhausted([0.1, 0.5, 0.6, 0.55], mode="max", patience=2) is None
    assert patience_exhausted([None, None, None], mode="min", patience=2) is None


def test_median_rule_needs_enough_siblings_and_compares_to_their_median():
    """A trial worse than its siblings' median stops; too few siblings never decide."""
    assert median_rule(0.9, [0.5, 0.6], mode="min") is None
    assert "median 0.6" in median_rule(0.9, [0.5, 0.6, 0.7], mode="min")
    assert median_rule(0.55, [0.5, 0.6, 0.7], mode="min") is None
    assert median_rule(0.55, [0.5, 0.6, 0.7], mode="max") is not None


@pytest.mark.slow
def test_loop_stops_a_run_that_stopped_improving(home, tmp_path):
    """A real run whose loss cannot improve by the asked margin is stopped and counts as done."""
    spec = write_spec(
        tmp_path,
        steps=2000,
        env={"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.01"},
        early_stopping={"patience": 20, "min_delta": 5.0, "grace_steps": 10},
    )
    w = Wiring.load()
    job = Client(w).submit(str(spec))
    assert w.engine.run_until_settled([job])[job] == "succeeded"
    att = w.store.attempts(job)[0]
    assert att.outcome == "early_stopped" and att.last_step < 2000
    assert w.store.job(job).reason.startswith("early_stopped")
