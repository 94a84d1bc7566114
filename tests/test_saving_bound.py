"""The saving any schedule could keep beside issue 31's delay goals (evals/saving_bound.py): a
bound, so it must never exceed what a real schedule costs, and it must be exact where the
answer can be worked out by hand."""

from __future__ import annotations

import csv
import itertools
import math
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.evals import saving_bound as B
from nightshift.evals import scheduler_table as T
from nightshift.evals import simulate as S
from nightshift.evals.output import write_csv

HOUR = 3600.0
ORIGIN = datetime(2024, 1, 1)  # midnight UTC: the simulation tariff's clock
KW = S.uncapped_watts(S.Options()) / 1000.0  # one busy GPU at its default limit


def _setup(jobs: list[tuple[float, float, int]]) -> S.Setup:
    """Jobs of (submitted at hour, run hours, GPUs) on a cluster big enough for all of them."""
    sims = [
        S.SimJob(
            id=i,
            submit_s=h * HOUR,
            duration_s=d * HOUR,
            gpus=g,
            share=1.0,
            priority=0,
            censored=False,
            overestimate=1.0,
            cost_sensitive=True,
            deadline_s=(h + 10 * d + 24) * HOUR,
        )
        for i, (h, d, g) in enumerate(jobs)
    ]
    return S.Setup("hand", ORIGIN, (0.0, S.DAY), 1.0, sims, [8], {"gangs": 0}, S.Options())


@pytest.mark.parametrize(
    ("max_wait_h", "price"),
    [
        (0.0, 0.35),  # 17:00-18:00: peak
        (3.0, 0.35),  # may end by 21:00: still all peak
        (4.0, 0.20),  # may end by 22:00: the evening's 0.20
        (5.0, 0.20),  # 21:00-22:00 (23:00 is still an hour off)
        (6.0, 0.10),  # 23:00-24:00: the valley
        (None, 0.10),  # no limit: the valley
    ],
)
def test_one_job_at_the_peak_pays_what_its_longest_wait_lets_it_reach(max_wait_h, price):
    """A 1-GPU hour submitted at 17:00 (peak 17-21, evening 21-23 at 0.20, valley from 23)."""
    got = B.cost_floor(
        _setup([(17.0, 1.0, 1)]),
        S.NIGHTSHIFT,
        max_wait_s=None if max_wait_h is None else max_wait_h * HOUR,
    )
    assert got == pytest.approx(price * KW)


def test_a_wait_in_pieces_takes_the_cheapest_seconds():
    """Two hours from 20:00 with a 2-hour limit: the window is 20:00-24:00; its cheapest two
    hours are 23-24 (0.10) and one of 21-23 (0.20), not the peak hour 20-21."""
    got = B.cost_floor(_setup([(20.0, 2.0, 1)]), S.NIGHTSHIFT, max_wait_s=2 * HOUR)
    assert got == pytest.approx((0.10 + 0.20) * KW)


def test_a_cap_lowers_the_energy_of_each_unit_of_work_and_widens_the_window():
    """Under the peak cap the same hour of work costs the cap's watts ÷ its speed per second
    of work, and takes 1 ÷ speed hours, so with no wait it may reach past 18:00 (still peak)."""
    power = B.policy_power("nightshift-cap", S.Options())
    assert power.slowest < 1.0 and power.e_min_w < KW * 1000.0
    got = B.cost_floor(_setup([(17.0, 1.0, 1)]), "nightshift-cap", max_wait_s=0.0)
    assert got == pytest.approx(0.35 * power.e_min_w / 1000.0)


def test_a_capped_job_may_take_longer_so_its_work_reaches_later_prices():
    """An hour of work from 22:30 with no wait, under the cap: at its speed it may run until
    22:30 + 1/speed hours, so the cheapest hour of price it can pay for lies in that longer
    stretch (the valley from 23:00), not in 22:30-23:30."""
    power = B.policy_power("nightshift-cap", S.Options())
    end_h = 22.5 + 1.0 / power.slowest
    valley_h = min(1.0, end_h - 23.0)
    want = (0.10 * valley_h + 0.20 * (1.0 - valley_h)) * power.e_min_w / 1000.0
    got = B.cost_floor(_setup([(22.5, 1.0, 1)]), "nightshift-cap", max_wait_s=0.0)
    assert valley_h > 0.5 and got == pytest.approx(want)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 47.0),  # submitted at hour
            st.sampled_from([0.25, 0.5, 1.0, 3.0, 7.0]),  # run hours
            st.integers(1, 8),
        ),
        min_size=1,
        max_size=2,
    ),
    st.floats(0.0, 10.0),  # mean limit, hours
    st.one_of(st.none(), st.floats(0.0, 12.0)),  # longest-wait limit, hours
)
def test_the_mean_budget_bound_is_below_every_split_of_the_budget(jobs, mean_h, max_h):
    """Lagrangian duality must give a lower bound: below the cost of every way to split the
    total wait between the jobs (each job priced at its own longest-wait floor), searched on a
    fine grid of splits."""
    setup = _setup(jobs)
    budget = len(jobs) * mean_h * HOUR
    got = B.cost_floor(
        setup,
        S.NIGHTSHIFT,
        mean_wait_s=mean_h * HOUR,
        max_wait_s=None if max_h is None else max_h * HOUR,
    )
    cap = math.inf if max_h is None else max_h * HOUR
    steps = [budget * k / 24 for k in range(25)]
    best = math.inf
    for split in itertools.product(steps, repeat=len(jobs)):
        if sum(split) > budget * (1 + 1e-12) or max(split) > cap:
            continue
        best = min(
            best,
            sum(
                B.cost_floor(_setup([job]), S.NIGHTSHIFT, max_wait_s=w)
                for job, w in zip(jobs, split, strict=True)
            ),
        )
    assert got <= best * (1 + 1e-9) + 1e-12
    # and it is a bound worth having: never below the cost of everything at the valley price
    assert got >= B.cost_floor(setup, S.NIGHTSHIFT) * (1 - 1e-9) - 1e-12


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.0, 47.0),
    st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0]),
    st.floats(0.0, 30.0),
    st.sampled_from([S.NIGHTSHIFT, "nightshift-cap"]),
)
def test_one_job_with_a_mean_budget_is_held_to_its_own_longest_wait(hour, run_h, mean_h, policy):
    """For one job a mean limit is a longest-wait limit, whose floor is exact: the duality bound
    may fall below it (a coarser answer), never above, wherever the tariff's corners fall
    between the points of its grid of waits."""
    setup = _setup([(hour, run_h, 1)])
    exact = B.cost_floor(setup, policy, max_wait_s=mean_h * HOUR)
    got = B.cost_floor(setup, policy, mean_wait_s=mean_h * HOUR)
    assert got <= exact * (1 + 1e-9) + 1e-12
    assert got >= B.cost_floor(setup, policy) * (1 - 1e-9) - 1e-12  # not below the valley


def test_no_simulated_schedule_costs_less_than_the_floor_its_own_delays_allow():
    """Counted from the simulator, not from the bound: every policy's cost on the small windows,
    baselines, the tariff and the power cap among them, is at least the floor for its own
    longest and mean delay. A bound that forgot a way to save (a cap, a pause, a piece of a
    run) would fall below one of them."""
    runs = 0
    for w in T.TINY:
        (setup,) = S.make_setups([w.trace], [w.load], {w.trace: w.days}, None, S.Options())
        for policy in (
            "fifo",
            "easy-sjf",
            "2d-gittins",
            S.NOTARIFF,
            S.NIGHTSHIFT,
            "nightshift-cap",
        ):
            m = S.simulate(setup, policy).metrics
            floor = B.cost_floor(
                setup,
                policy,
                max_wait_s=m["delay_max_h"] * HOUR,
                mean_wait_s=m["delay_mean_h"] * HOUR,
            )
            assert floor <= m["cost"] * (1 + 1e-9), (w.trace, policy, floor, m["cost"])
            runs += 1
    assert runs == 6 * len(T.TINY)


def test_the_goals_table_shows_where_no_schedule_can_save_enough(tmp_path, capsys):
    """The tiny table: a saving verdict of a tariff policy carries its ceiling; the count of
    windows where no schedule reaches 0.9 is printed; `saving-bound --from` its CSV gives the
    same ceilings under both goals, and every case's beside them."""
    table = T.run(T.TINY, T.POLICIES, 0, 1)
    rows = [g for g in table.goals if g["saving_share_deadline_pass"] is not None]
    assert rows and all("saving_ceiling" in g for g in table.goals)
    for g in rows:
        v = g["saving_ceiling"]
        assert isinstance(v, float)
        if not math.isnan(v) and g["max_vs_easy_pass"] and g["delay_vs_strongest_pass"]:
            # a run that met both delay goals saved no more than the bound allows
            assert g["saving_share_deadline"] <= v + 1e-9
    text = T.markdown(table, "cmd")
    assert T.UNREACHABLE in text
    assert "(≤ " in text
    src = tmp_path / "scheduler_table.csv"
    write_csv(src, T.csv_rows(table))
    assert B.main(["--from", str(src), "--csv", str(tmp_path / "bound.csv")]) == 0
    assert "No schedule can reach a saving share of 0.9" in capsys.readouterr().out
    with (tmp_path / "bound.csv").open() as f:
        again = {(r["trace"], r["policy"]): float(r["both"]) for r in csv.DictReader(f)}
    for g in rows:  # the CSV rounds the metrics to 6 digits
        v = again[(g["trace"], g["policy"])]
        assert v == pytest.approx(g["saving_ceiling"], rel=1e-4, abs=1e-4, nan_ok=True)


def test_a_missing_or_empty_table_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        B.main(["--from", str(tmp_path / "none.csv")])
    assert "--from: no file" in capsys.readouterr().err
