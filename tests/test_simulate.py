"""Trace-driven scheduler simulation: real traces through the daemon's own placement function."""

from __future__ import annotations

import csv
import gzip
import math
import random
from collections import Counter
from datetime import datetime, timedelta

import pytest

from nightshift.evals import simulate as S
from nightshift.runtime import engine
from nightshift.runtime.scheduling import placement

QUICK = {"philly": S.QUICK_DAYS["philly"], "alibaba": S.QUICK_DAYS["alibaba"]}


def quick_setups(load: float = 0.8, **opts) -> list[S.Setup]:
    return S.make_setups(list(QUICK), [load], QUICK, None, S.Options(**opts))


@pytest.fixture(scope="module")
def philly() -> S.Trace:
    return S.load_trace("philly")


@pytest.fixture(scope="module")
def alibaba() -> S.Trace:
    return S.load_trace("alibaba")


# ------------------------------------------------------------------------------ the same place()
def test_simulator_calls_the_daemons_place_function(monkeypatch):
    """Every policy goes through nightshift.runtime.scheduling.placement.place, the object the daemon calls."""
    assert engine.place is placement.place  # the daemon's engine imported this very object
    assert S.placement is placement
    calls: Counter[str] = Counter()
    real = placement.place

    def counting(snap):
        calls[current] += 1
        return real(snap)

    monkeypatch.setattr(placement, "place", counting)
    setup = S.make_setups(["alibaba"], [1.0], {"alibaba": 0.25}, None, S.Options())[0]
    for current in S.POLICIES:
        S.simulate(setup, current)
    assert all(calls[p] > 0 for p in S.POLICIES), calls


# ------------------------------------------------------------------------------ determinism
def test_same_seed_gives_identical_results():
    """Two runs with one seed agree to the last job; another seed samples another window."""
    a, b = quick_setups(), quick_setups()
    assert [s.window for s in a] == [s.window for s in b] and [s.hosts for s in a] == [
        s.hosts for s in b
    ]
    for sa, sb in zip(a, b, strict=True):
        ra, rb = (
            S.simulate(sa, "nightshift"),
            S.simulate(sb, "nightshift"),
        )  # tariff, health, pauses
        assert ra.metrics.pop("wall_s") and rb.metrics.pop("wall_s")
        assert (
            ra.metrics == rb.metrics and ra.first_start == rb.first_start and ra.queue == rb.queue
        )
    for name in QUICK:  # seeded windows (Tiresias is one window; Pollux's is its busiest)
        trace = S.load_trace(name)
        assert S.pick_window(trace, 1.0, 1) != S.pick_window(trace, 1.0, 0)


# ------------------------------------------------------------------------------ backfill
@pytest.mark.parametrize("trace,days,load", [("philly", 2.0, 1.0), ("alibaba", 1.0, 1.0)])
def test_backfill_never_delays_the_head_jobs_reservation(monkeypatch, trace, days, load):
    """Record the head's reservation when first set: it starts no later, under EASY and nightshift.

    Health events are off (a reserved GPU that fails is no fault of backfill). For nightshift a
    reservation is checked only while its job stays at the head: a job ranked ahead of it started
    (a higher priority, a cost-sensitive job let through by the tariff) or the reservation went to
    another job; EASY, in arrival order, must never lose one."""
    seen: list[tuple[datetime, placement.Decision]] = []
    real = placement.place

    def recording(snap):
        d = real(snap)
        seen.append((snap.now, d))
        return d

    monkeypatch.setattr(placement, "place", recording)
    setup = S.make_setups([trace], [load], {trace: days}, None, S.Options(health_fraction=0.0))[0]
    for pol in ("easy", "nightshift"):
        seen.clear()
        result = S.simulate(setup, pol)
        active: dict[int, tuple[datetime, bool]] = {}  # job -> (first reservation, still head)
        checked = lost = 0
        for now, d in seen:
            started = {s.job_id for s in d.starts}
            overtaken = any(not s.note.startswith("backfill") for s in d.starts)
            for jid, (at, head) in list(active.items()):
                if jid in started:
                    if head:
                        assert now <= at + timedelta(milliseconds=1), (pol, jid, now, at)
                        checked += 1
                    else:
                        lost += 1
                    del active[jid]
                elif d.reservation is None or d.reservation.job_id != jid or overtaken:
                    active[jid] = (at, False)
            r = d.reservation
            if r is not None and r.job_id not in active and r.job_id not in started:
                active[r.job_id] = (r.at, True)
        assert checked >= 5, (pol, checked)
        if pol == "easy":
            assert lost == 0
        assert result.metrics["unfinished"] == 0


def test_fifo_starts_jobs_in_arrival_order():
    """FIFO keeps only place()'s starts before the first blocked job: no job passes an earlier one."""
    for setup in quick_setups(load=1.0):
        r = S.simulate(setup, "fifo")
        order = sorted(setup.jobs, key=lambda j: (j.submit_s, j.id))
        starts = [r.first_start[j.id] for j in order]
        assert starts == sorted(starts)
        easy = S.simulate(setup, "easy")
        if setup.trace == "alibaba":  # it queues in this window: EASY backfills past the head
            assert [easy.first_start[j.id] for j in order] != sorted(easy.first_start.values())


# ------------------------------------------------------------------------------ traces
def test_philly_trace_parses_with_its_units(philly):
    """Philly: 82,247 jobs; duration in seconds (gpu_time = duration x num_gpus); unsorted file."""
    assert philly.rows == len(philly.jobs) == 82_247
    with gzip.open(S.PHILLY_FILE, "rt", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]
    assert all(float(r["gpu_time"]) == float(r["duration"]) * int(r["num_gpus"]) for r in rows)
    assert [r["timestamp"] for r in rows] != sorted(r["timestamp"] for r in rows)
    counts = Counter(j.gpus for j in philly.jobs)
    assert (counts[1], counts[2], counts[4], counts[8], counts[16]) == (
        76627,
        1818,
        1870,
        1643,
        199,
    )
    durations = sorted(j.duration_s for j in philly.jobs)
    assert durations[0] == 1.0 and durations[-1] == 4_628_226.0
    assert durations[len(durations) // 2] == 1144.0  # the median SOURCES.md gives, in seconds
    subs = [j.submit_s for j in philly.jobs]
    assert subs == sorted(subs) and philly.origin == datetime(2017, 9, 4)
    assert philly.origin + timedelta(seconds=subs[-1]) == datetime(2017, 12, 22, 8, 2, 11)
    assert all(j.share == 1.0 and j.priority == 0 and not j.censored for j in philly.jobs)


def test_alibaba_trace_parses_censored_and_never_started_pods(alibaba):
    """Alibaba: 8,152 pods; CPU-only and never-started pods left out and counted; pods still
    running at the trace's end kept as censored; GPU-sharing pods as fractions of a GPU."""
    assert alibaba.rows == 8152
    assert alibaba.excluded == {"cpu_only": 1088, "never_started": 861}
    assert len(alibaba.jobs) == 8152 - 1088 - 861 == 6203
    with open(S.ALIBABA_PODS, newline="") as fh:
        rows = {i: r for i, r in enumerate(csv.DictReader(fh), 1)}
    end = max(int(r["deletion_time"]) for r in rows.values())
    assert end == 12_902_960
    censored = [j for j in alibaba.jobs if j.censored]
    assert censored and all(int(rows[j.id]["deletion_time"]) == end for j in censored)
    assert len(censored) == sum(
        1
        for r in rows.values()
        if r["num_gpu"] != "0" and r["scheduled_time"] and int(r["deletion_time"]) == end
    )
    j = alibaba.jobs[0]
    r = rows[j.id]
    assert j.duration_s == int(r["deletion_time"]) - int(r["scheduled_time"])
    assert j.submit_s == int(r["creation_time"])
    shared = [j for j in alibaba.jobs if j.share < 1.0]
    assert shared and all(
        j.gpus == 1 and j.share * 1000 == int(rows[j.id]["gpu_milli"]) for j in shared
    )
    assert {j.priority for j in alibaba.jobs} == {0, 1, 2}
    assert alibaba.host_sizes is not None and len(alibaba.host_sizes) == 1213
    assert sum(alibaba.host_sizes) == 6212


def test_cluster_is_sized_for_the_offered_load_and_holds_its_widest_job(philly):
    """GPUs = offered load's share of the window's demand, rounded up to hosts; no job is left
    out: the ones wider than a host of 8 are counted as gangs and their demand sized for."""
    opts = S.Options()
    window = S.pick_window(philly, 7.0, 0)
    jobs = [j for j in S.seeded_jobs(philly, opts) if window[0] <= j.submit_s < window[1]]
    for load in (0.6, 0.8, 1.0):
        hosts, kept, gangs = S.size_cluster(philly, jobs, window, load, None, 0)
        assert set(hosts) == {8} and gangs == sum(j.gpus > 8 for j in jobs) > 0
        assert kept == jobs and sum(hosts) >= max(j.gpus for j in jobs)
        demand = sum(j.gpus * j.duration_s for j in jobs)
        offered = demand / (sum(hosts) * (window[1] - window[0]))
        assert load * (1 - 8 / sum(hosts)) <= offered <= load
    hosts, kept, gangs = S.size_cluster(philly, jobs, window, 0.8, 0, 0)
    assert len(hosts) == 1 and gangs == 0 and hosts[0] >= max(j.gpus for j in jobs)


def test_a_trace_whose_jobs_are_wider_than_its_hosts_runs_them_all_as_gangs(monkeypatch):
    """Tiresias' trace on its 4-GPU hosts: its ten 8-GPU jobs were dropped before sizing; now
    every job of the window completes, each 8-GPU one on two whole hosts at once."""
    (setup,) = S.make_setups(["tiresias"], [2.0], {"tiresias": None}, None, S.Options())
    assert setup.counts["gangs"] == 10 and len(setup.jobs) == 60
    gangs: list[list[str]] = []
    real = placement.place

    def recording(snap):
        d = real(snap)
        host = {g.index: g.host for g in snap.gpus}
        gangs.extend(sorted(host[i] for i in s.gpus) for s in d.starts if len(s.gpus) > 4)
        return d

    monkeypatch.setattr(placement, "place", recording)
    r = S.simulate(setup, "easy")
    assert r.metrics["completed"] == 60 and r.metrics["unfinished"] == 0
    assert len(gangs) == 10
    for hosts in gangs:
        assert len(hosts) == 8 and len(set(hosts)) == 2 and hosts.count(hosts[0]) == 4


def test_energy_cost_is_the_tariffs_energy_cost():
    """The simulator's prefix-sum pricing agrees with Tariff.energy_cost, segment by segment."""
    origin = datetime(2023, 7, 3)
    tar = S.tariff()
    segments = [
        (3600.0 * 5, 3600.0 * 30.5, 2.0, 300.0),
        (100.0, 200.0, 0.5, 300.0),
        (7 * 86400.0, 9 * 86400.0, 8, 150.0),
    ]
    kwh, cost = S._energy(segments, origin)
    want = sum(
        g * tar.energy_cost(origin + timedelta(seconds=a), origin + timedelta(seconds=b), w)
        for a, b, g, w in segments
    )
    assert math.isclose(cost, want, rel_tol=1e-9)
    assert math.isclose(kwh, sum(g * w * (b - a) for a, b, g, w in segments) / 3.6e6)


def test_simulation_tariff_answers_cheap_periods_like_the_tariff():
    """place() gets a Tariff subclass with a table of cheap periods: same answers as Tariff's."""
    plain, fast = S.tariff(), S.tariff(S._SimTariff)
    assert isinstance(fast, S.Tariff) and fast.windows == plain.windows
    rnd = random.Random(7)
    for _ in range(400):
        t = datetime(2017, 9, 4) + timedelta(seconds=rnd.uniform(0, 200 * 86400))
        threshold = rnd.choice([0.10, 0.20, 0.35])
        horizon = timedelta(hours=rnd.choice([1, 24, 168, 500]))
        assert fast.cheap_periods(t, threshold, horizon) == plain.cheap_periods(
            t, threshold, horizon
        )


def test_seeded_rules_mark_the_documented_fractions(philly):
    """About 25 % cost-sensitive, estimates 1-4x the run time, deadlines after submit + run time."""
    jobs = S.seeded_jobs(philly, S.Options())
    share = sum(j.cost_sensitive for j in jobs) / len(jobs)
    assert 0.24 < share < 0.26
    assert all(1.0 <= j.overestimate <= 4.0 for j in jobs)
    assert all(j.deadline_s >= j.submit_s + 1800 + 1.5 * j.duration_s for j in jobs)


# ------------------------------------------------------------------------------ end to end
def test_quick_run_writes_csv_and_plots(tmp_path):
    """`--quick` runs the traces and policies asked for and writes the CSV, the ratios, the
    goals, the markdown tables and four PNGs (every policy runs in the test above)."""
    pols = "fifo,easy,easy-pool,easy-sjf,nightshift-notariff,nightshift"
    args = ["--quick", "--jobs", "1", "--traces", "philly,alibaba", "--policies", pols]
    assert S.main([*args, "--out", str(tmp_path)]) == 0
    with open(tmp_path / "simulate.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["trace"], r["policy"]) for r in rows} == {
        (t, p) for t in ("philly", "alibaba") for p in pols.split(",")
    }
    for r in rows:
        assert int(r["unfinished"]) == 0 and 0 < float(r["util"]) <= 1
        assert float(r["cost"]) >= float(r["cost_lower_bound"]) > 0
    with open(tmp_path / "simulate_headline.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * 4  # fifo, easy, easy-sjf, strongest
    with open(tmp_path / "simulate_goals.csv", newline="") as fh:
        assert [g["trace"] for g in csv.DictReader(fh)] == ["philly", "alibaba"]
    assert "| nightshift |" in (tmp_path / "simulate.md").read_text()
    for name in (
        "simulate_queue.png",
        "simulate_delay_cdf.png",
        "simulate_cost_delay.png",
        "simulate_ablation.png",
    ):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 200_000
