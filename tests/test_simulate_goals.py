"""Simulation, issue 14: every trace (Tiresias and the Pollux window too) through the policies
the goals compare, with the energy floors, misses caused by holds and the goals table."""

from __future__ import annotations

import math

import pytest

from nightshift.evals import simulate as S

TINY = {"philly": 0.1, "alibaba": 0.2, "tiresias": None, "pollux": 0.003}
POLICIES = ("fifo", "easy", "easy-sjf", "nightshift-notariff", "nightshift")


@pytest.fixture(scope="module")
def runs() -> tuple[list[S.Setup], list[S.RunResult]]:
    # pollux's busiest 4 minutes hold 300 long jobs: at load 8 it is 312 GPUs, not 3,000
    load_for = {"pollux": [8.0]}
    setups = S.make_setups(list(S.TRACES), [0.8], TINY, None, S.Options(), load_for)
    results = [S.simulate(s, p) for s in setups for p in POLICIES]
    S.add_shares(results)
    return setups, results


def test_every_trace_runs_every_goal_policy_to_completion(runs):
    """A tiny window of each of the four workloads: all jobs finish under every policy."""
    setups, results = runs
    assert [s.trace for s in setups] == list(S.TRACES)
    assert all(s.jobs for s in setups)
    for r in results:
        assert r.metrics["unfinished"] == 0, (r.trace, r.policy)
        assert not math.isnan(r.metrics["delay_mean_urgent_h"])


def test_floors_are_schedule_independent_and_ordered(runs):
    """Both floors are the same for every policy of a setup, and keeping deadlines can only
    cost more than the all-valley floor."""
    _, results = runs
    for trace in S.TRACES:
        floors = {
            (r.metrics["cost_floor"], r.metrics["cost_floor_deadline"])
            for r in results
            if r.trace == trace
        }
        assert len(floors) == 1
        valley, deadline = floors.pop()
        assert 0 < valley <= deadline + 1e-9


def test_goals_table_has_a_verdict_per_goal_and_trace(runs):
    """One row per trace, a pass/fail per goal; holds cause no missed deadline."""
    _, results = runs
    rows = S.goals(results)
    assert [r["trace"] for r in rows] == list(S.TRACES)
    for r in rows:
        for _, key, _, _ in S.GOALS:
            assert isinstance(r[f"{key}_ok"], bool)
        assert r["hold_misses_caused"] == 0


def test_tiresias_and_pollux_are_what_sources_md_says():
    """Tiresias: 60 jobs on 4-GPU nodes. Pollux: the Philly file itself (so the same jobs),
    sampled at its busiest stretch rather than at a seeded random week."""
    t = S.load_trace("tiresias")
    assert len(t.jobs) == 60 and t.host_sizes == [4]
    pollux, philly = S.load_trace("pollux"), S.load_trace("philly")
    assert pollux.jobs == philly.jobs and pollux.busiest
    assert S.pick_window(pollux, 2.0, 0) != S.pick_window(philly, 2.0, 0)
