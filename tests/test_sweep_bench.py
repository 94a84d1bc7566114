"""The sweep benchmark's bookkeeping (evals/sweep_bench.py), without running it: its specs are
valid sweeps, and its ratio charges a method that never reached the target all it spent."""

from __future__ import annotations

import pytest

from nightshift.evals import sweep_bench
from nightshift.runtime.spec import ExperimentSpec


@pytest.mark.parametrize("model", sorted(sweep_bench.MODELS))
def test_every_model_is_a_valid_sweep_spec_with_one_blas_thread(model):
    """A spec that fails validation would only show after minutes of random search."""
    make, steps = sweep_bench.MODELS[model]
    raw, every = make(steps)
    raw["sweep"] = {"trials": 2, "metric": "val_loss", "pruner": "successive_halving"}
    spec = ExperimentSpec.model_validate(raw)
    assert spec.environment.env["OPENBLAS_NUM_THREADS"] == "1"
    assert 1 <= every <= steps


def test_a_method_that_never_reached_the_target_is_a_lower_bound():
    """Random search sets the target and the yardstick (its time averaged over the order of its
    trials); a miss is charged every second it ran and flagged."""
    Out = sweep_bench.Outcome
    outcomes = [
        Out(
            "numpy",
            "random",
            seed=0,
            trials=50,
            best=0.1,
            total_s=100.0,
            reach_s=5.0,
            expect_s=50.0,
        ),
        Out("numpy", "tpe", seed=0, trials=12, best=0.09, total_s=30.0, reach_s=20.0),
        Out("numpy", "tpe+median", seed=0, trials=50, best=0.11, total_s=60.0),
    ]
    rows = {r["method"]: r for r in sweep_bench.ratio_rows(outcomes, {("numpy", 0): 0.1})}
    assert rows["random"]["ratio_vs_random"] == 1.0
    assert rows["tpe"]["ratio_vs_random"] == 0.4 and rows["tpe"]["reached"]
    assert rows["tpe"]["ratio_vs_random_as_run"] == 4.0  # random's best came lucky and early
    assert rows["tpe+median"]["ratio_vs_random"] == 1.2 and not rows["tpe+median"]["reached"]
