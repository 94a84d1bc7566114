"""Holds in the simulator keep their margin from how the finished jobs' estimates turned out
(issue 31: "a hold keeps a margin from the error distribution of past estimates … with
estimate errors 0.25–4× tried"), as the daemon's Estimator does from the store."""

from __future__ import annotations

import pytest

from nightshift.evals import simulate as S
from nightshift.runtime.scheduling.estimates import MIN_RATIOS, upper_ratio


@pytest.fixture(scope="module")
def short_estimates() -> S.Setup:
    """Alibaba's first day at load 0.8, seed 0, estimates 0.25–4× the run time."""
    opts = S.Options(seed=0, min_overestimate=0.25)
    return S.make_setups(["alibaba"], [0.8], {"alibaba": 1.0}, None, opts)[0]


@pytest.fixture(scope="module")
def broken_hold() -> S.Setup:
    """Alibaba's first day at load 0.8 and estimates 0.25–4×, seed 4: a day on which a hold
    that trusts a short estimate breaks a deadline (seed 0's did until stop 51, when the
    policy stopped pausing jobs about to end and that day's miss went away)."""
    opts = S.Options(seed=4, min_overestimate=0.25)
    return S.make_setups(["alibaba"], [0.8], {"alibaba": 1.0}, None, opts)[0]


def misses(setup: S.Setup) -> dict[str, float]:
    runs = [S.simulate(setup, p) for p in ("fifo", S.NOTARIFF, S.NIGHTSHIFT)]
    S.add_shares(runs)
    return runs[2].metrics


def test_a_held_jobs_upper_bound_is_learned_from_finished_jobs(short_estimates):
    """No margin before MIN_RATIOS jobs finished; then the estimate × upper_ratio of
    took ÷ asked over them, for cost-sensitive jobs of a policy that holds."""
    run = S._Run(short_estimates, S.POLICIES[S.NIGHTSHIFT])
    job = next(j for j in short_estimates.jobs if j.cost_sensitive)
    assert run._pending_model(job, 3600.0, 0.0).expected_upper_s is None
    run.ratios = [0.5, 1.0, 3.0, 4.0]
    assert len(run.ratios) >= MIN_RATIOS
    worst = upper_ratio(run.ratios)
    assert worst is not None and worst > 1
    assert run._pending_model(job, 3600.0, 0.0).expected_upper_s == pytest.approx(3600 * worst)
    easy = S._Run(short_estimates, S.POLICIES["easy"])
    easy.ratios = run.ratios
    assert easy._pending_model(job, 3600.0, 0.0).expected_upper_s is None  # it never holds


def test_learned_margins_keep_the_deadlines_holds_broke(broken_hold, monkeypatch):
    """On this day the hold that trusted a short estimate made one job miss a deadline the
    no-tariff twin met; with the learned margin it meets it."""
    learned = misses(broken_hold)
    monkeypatch.setattr(S, "upper_ratio", lambda ratios: None)  # holds trust the estimate
    trusting = misses(broken_hold)
    assert trusting["hold_misses_caused"] >= 1
    assert learned["hold_misses_caused"] == 0
    assert learned["misses_vs_twin"] < trusting["misses_vs_twin"]


def test_a_quarantined_gpu_is_expected_back_only_during_its_last_checks(short_estimates):
    """As the daemon sees it (gpu_health's `held` count, snapshot's `back_by`): while a GPU
    fails its checks nobody knows when it is back; during its last `recovery_s` (its healthy
    checks) placement is told when, and counts it busy until then."""
    run = S._Run(short_estimates, S.POLICIES["easy"])
    run._health(0, 100.0)  # down
    assert run.slots[0].verdict == "CRITICAL" and run.slots[0].back_by is None
    back = run.back[0]
    assert back is not None and back > 100.0
    t, kind, _, gpu = next(e for e in run.heap if e[1] == S.RECOVER)
    assert gpu == 0 and t == max(100.0, back - short_estimates.opts.recovery_s)
    run._recover(0, t)
    assert run.slots[0].verdict == "UNKNOWN" and run.slots[0].back_by == run._dt(back)
    run._health(0, back)  # up again: an expectation left over is never applied
    run._recover(0, back)
    assert run.slots[0].verdict == "OK" and run.slots[0].back_by is None
