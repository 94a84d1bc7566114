"""The issue-31 speed-ups of `place()` change no decision: on random snapshots (pending and
running jobs, gangs wider than a host, GPUs on several hosts, tariff on and off, every order and
host fit, deadlines, holds, backoff, recovery, the starvation guard, preemption) its fast path
(`_fast`, on by default; the columns forced on every queue) returns exactly what its plain loops
return, call after call, while the world changes between calls as between a daemon's ticks."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightshift.runtime.scheduling import pending_columns, placement
from nightshift.runtime.scheduling.placement import (
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
    place,
)
from nightshift.runtime.scheduling.tariff import PriceWindow, Tariff

NOW = datetime(2026, 12, 2, 21, 40)  # naive UTC; 22:40 in Berlin, just before the night price


def _tariff() -> Tariff:
    return Tariff(
        timezone="Europe/Berlin",
        currency="EUR",
        windows=[
            PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.12),
            PriceWindow(name="shoulder", start="07:00", end="09:00", price_per_kwh=0.25),
            PriceWindow(name="day", start="09:00", end="23:00", price_per_kwh=0.35),
        ],
    )


def _pending(rnd: random.Random, jid: int, now: datetime, wide: int) -> PendingJob:
    share = rnd.random() < 0.2
    submitted = now - timedelta(seconds=rnd.choice([0, 60, 3600, 7200, rnd.randint(0, 200_000)]))
    backoff = rnd.random() < 0.1
    return PendingJob(
        id=jid,
        name=rnd.choice(["", f"exp{jid}"]),
        priority=rnd.randint(0, 6),
        gpus=rnd.choice([0, 0, 1, 1, 1, 2, 2, 4, wide]),
        gpu_memory_gb=rnd.choice([None, 8, 20, 40, 70, 200]),
        share_gpu=share,
        gpu_memory_cap_gb=rnd.choice([None, 10, 20]) if share else None,
        blocked_by=["prep"] if rnd.random() < 0.08 else [],
        submitted_at=submitted,
        not_before=now + timedelta(minutes=rnd.randint(1, 180)) if backoff else None,
        attempt=rnd.choice([0, 1, 2]) if backoff else 0,
        cost_class=rnd.choice(["urgent", "cost_sensitive"]),
        expected_duration_s=rnd.choice(
            [None, 0.0, 300, 1800, 3600, 4 * 3600, 12 * 3600, 40 * 3600]
        ),
        pausable=rnd.random() < 0.8,
        deadline=rnd.choice([None, None, submitted + timedelta(hours=rnd.choice([2, 8, 30, 90]))]),
        attained_gpu_s=rnd.choice([0.0, 0.0, 1800.0, 20_000.0, 100_000.0]),
        span_hosts=rnd.random() < 0.2,
        expected_upper_s=rnd.choice([None, None, 1800.0, 6 * 3600, 30 * 3600]),
    )


def _world(rnd: random.Random) -> Snapshot:
    per_host = rnd.choice([2, 4, 8])
    gpus = [
        GpuSlot(
            index=i,
            host=f"h{i // per_host}",
            memory_total_mib=rnd.choice([16384.0, 40960.0, 81920.0, 81920.0]),
            memory_used_mib=rnd.choice([0.0, 0.0, 0.0, 4096.0, None]),
            verdict=rnd.choice(["OK"] * 12 + ["CRITICAL", "UNKNOWN", "WARN"]),
            # a quarantined GPU expected back (passing its checks), overdue, or not expected
            back_by=rnd.choice(
                [None, None, NOW + timedelta(minutes=rnd.randint(1, 600)), NOW - timedelta(hours=1)]
            ),
        )
        for i in range(per_host * rnd.randint(1, 5))
    ]
    running, rid = [], 10_000
    i = 0
    while i < len(gpus):
        roll = rnd.random()
        host_end = (i // per_host + 1) * per_host
        k = min(rnd.choice([1, 1, 2, 4]), host_end - i)
        end = rnd.choice([NOW + timedelta(minutes=rnd.randint(1, 900)), NOW - timedelta(hours=1)])
        common = {
            "priority": rnd.randint(0, 6),
            "submitted_at": NOW - timedelta(hours=rnd.randint(1, 30)),
            "started_at": NOW - timedelta(minutes=rnd.randint(1, 600)),
            "expected_end": rnd.choice([end, end, None]),
            "upper_end": rnd.choice([None, None, end + timedelta(hours=rnd.randint(1, 20))]),
            "pausable": rnd.random() < 0.6,
            "cost_class": rnd.choice(["urgent", "cost_sensitive"]),
            "deadline": rnd.choice([None, NOW + timedelta(hours=rnd.randint(1, 40))]),
            "attained_gpu_s": rnd.choice([0.0, 50_000.0]),
        }
        if roll < 0.45:
            running.append(RunningJob(id=rid, gpus=list(range(i, i + k)), **common))
            rid += 1
            i += k
            continue
        if roll < 0.65:
            for _ in range(rnd.randint(1, 2)):
                running.append(
                    RunningJob(
                        id=rid,
                        gpus=[i],
                        share_gpu=True,
                        gpu_memory_cap_gb=rnd.choice([8, 16]),
                        **common,
                    )
                )
                rid += 1
        i += 1
    running += [
        RunningJob(id=rid + n, gpus=[], started_at=NOW - timedelta(minutes=5))
        for n in range(rnd.randint(0, 2))
    ]
    wide = per_host * 2  # wider than any host: a gang across hosts
    pending = [_pending(rnd, j, NOW, wide) for j in range(1, rnd.randint(2, 60))]
    recovering = [
        _pending(rnd, 5000 + j, NOW, wide).model_copy(
            update={"attempt": 1, "not_before": NOW + timedelta(minutes=rnd.randint(1, 90))}
        )
        for j in range(rnd.randint(0, 3))
    ]
    tariff = _tariff() if rnd.random() < 0.6 else None
    return Snapshot(
        now=NOW,
        pending=pending,
        running=running,
        recovering=recovering,
        gpus=gpus,
        cpu_slots=rnd.randint(0, 3),
        tariff=tariff,
        cost_threshold=rnd.choice([None, "not_peak", 0.2]),
        hold_slack_s=rnd.choice([0.0, 3600.0]),
        hold_min_gpu_h=rnd.choice([0.0, 0.0, 2.0]),
        hold_max_wait_s=rnd.choice([None, None, 3600.0, 12 * 3600.0, 30 * 3600.0]),
        aging_per_hour=rnd.choice([0.0, 1.0, 2.5]),
        order=rnd.choice(["priority", "sjf_aging", "las", "srpt"]),
        sjf_per_doubling=rnd.choice([1.0, 2.0]),
        promote_after_h=rnd.choice([None, None, 1.0, 24.0]),
        host_fit=rnd.choice(["first", "best"]),
        preempt_margin=rnd.choice([None, 1, 3]),
        preempt_max_per_call=rnd.choice([0, 1, 4]),
        preempt_wider=rnd.random() < 0.7,
        migrate_after_s=rnd.choice([None, None, 0.0, 1800.0]),
        preempt_min_left_s=rnd.choice([0.0, 0.0, 1800.0]),
        display_tz=rnd.choice([None, "America/New_York"]),
        cannot_span=rnd.choice([None, None, "executor local cannot span hosts"]),
    )


def _tick(rnd: random.Random, s: Snapshot, started: set[int]) -> Snapshot:
    """The next call, as a daemon or the simulator makes it: time moves on, started jobs leave
    the queue, new ones arrive, and some waiting jobs change (a dependency met, a priority
    raised in place, a copy with another estimate): the same job objects, reused or replaced."""
    now = s.now + timedelta(seconds=rnd.choice([1, 60, 600, 3 * 3600]))
    kept = [j for j in s.pending if j.id not in started]
    for j in kept:
        roll = rnd.random()
        if roll < 0.05:
            j.priority += 3  # mutated in place between calls
        elif roll < 0.08 and j.blocked_by:
            j.blocked_by.clear()  # a list field changed in place: the dependency succeeded
        elif roll < 0.12:  # a learned estimate moved, as the daemon's load renews it
            j.renew_estimate(rnd.choice([None, 60.0, 7200.0]), rnd.choice([None, 9000.0]))
    replaced = [
        j.model_copy(update={"expected_duration_s": 7200.0}) if rnd.random() < 0.05 else j
        for j in kept
    ]
    top = max((j.id for j in s.pending), default=0)
    wide = 64
    fresh = [_pending(rnd, top + n + 1, now, wide) for n in range(rnd.randint(0, 8))]
    return s.model_copy(update={"now": now, "pending": replaced + fresh})


def _same(s: Snapshot) -> set[int]:
    """The fast path (a short queue's loop, a long one's columns, forced here on every queue)
    against the plain one."""
    want = place(s, _fast=False).model_dump()
    assert place(s).model_dump() == want
    was = placement.COLUMNS_FROM, pending_columns.SORT_CHUNK
    placement.COLUMNS_FROM = 0
    pending_columns.SORT_CHUNK = 1  # buckets put in order a job or two at a time
    try:
        assert place(s).model_dump() == want
        assert place(s).model_dump() == want  # the second sight of these objects: as columns
    finally:
        placement.COLUMNS_FROM, pending_columns.SORT_CHUNK = was
    return {st_["job_id"] for st_ in want["starts"]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), ticks=st.integers(1, 4))
def test_the_fast_path_decides_as_the_plain_one_call_after_call(seed: int, ticks: int) -> None:
    """Why: the speed-ups keep state between calls and skip work; none of it may show."""
    rnd = random.Random(seed)
    s = _world(rnd)
    for _ in range(ticks):
        started = _same(s)
        s = _tick(rnd, s, started)
    _same(s)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), ticks=st.integers(1, 3))
def test_under_the_starvation_guard_with_preemption_too(seed: int, ticks: int) -> None:
    """Why: the fast path holds promoted jobs at once while a later job might still preempt
    (a promoted job never does, except under sjf_aging); worlds where most jobs are promoted
    and preemption is on test exactly that."""
    rnd = random.Random(seed)
    s = _world(rnd).model_copy(
        update={
            "promote_after_h": rnd.choice([0.5, 1.0, 2.0]),
            "preempt_margin": 1,
            "preempt_max_per_call": rnd.choice([1, 4]),
            "aging_per_hour": rnd.choice([0.0, 1.0]),
        }
    )
    for _ in range(ticks):
        started = _same(s)
        s = _tick(rnd, s, started)
    _same(s)


def _long_world(seed: int) -> Snapshot:
    """The benchmark's world at 3,000 jobs: long enough for the column path."""
    from nightshift.evals.bench_scale import synthetic_snapshot

    s = synthetic_snapshot(3_000, 128, seed=seed)
    assert len(s.pending) >= placement.COLUMNS_FROM
    return s


def test_a_job_changed_in_place_between_calls_is_seen():
    """Why: the columns outlive a call; a job assigned a new priority, given a dependency, or
    whose dependency list is emptied in place must be placed as it now is, not as it was."""
    s = _long_world(4)
    place(s)  # first sight of these objects: the loop; the second puts them in columns
    first = place(s)
    assert first.model_dump() == place(s, _fast=False).model_dump()
    held = [j for j in s.pending if j.id in first.holds and j.blocked_by]
    waiting = [j for j in s.pending if j.id in first.holds and not j.blocked_by]
    started = next(j for j in s.pending if j.id in {st_.job_id for st_ in first.starts})
    held[0].blocked_by.clear()  # in place: no assignment to see
    held[0].priority = 100
    waiting[0].priority = 99
    started.blocked_by = ["prep"]
    again = place(s)
    assert again.model_dump() == place(s, _fast=False).model_dump()
    assert again.holds[started.id] == "waiting on prep"
    assert held[0].id not in again.holds or "waiting on" not in again.holds[held[0].id]
    assert again.model_dump() != first.model_dump()


@pytest.mark.parametrize("order", ["srpt", "sjf_aging"])
def test_an_estimate_renewed_in_place_between_calls_is_seen(order):
    """Why: the daemon keeps a job whose learned estimate alone moved as the same object
    (`renew_estimate`); its row must take the new estimate and its rank the new penalty."""
    s = _long_world(7).model_copy(update={"order": order})
    place(s)
    first = place(s)  # in columns now, penalties computed
    held = [j for j in s.pending if j.id in first.holds and not j.blocked_by]
    for j in held[:200]:
        j.renew_estimate(60.0, 90.0)
    again = place(s)
    assert again.model_dump() == place(s, _fast=False).model_dump()
    assert again.model_dump() != first.model_dump()


def test_the_same_jobs_in_new_objects_decide_alike():
    """Why: a daemon reloads its queue every tick (new objects, equal fields); the columns are
    looked up by object, so equal copies must give the same decision as the originals."""
    s = _long_world(5)
    place(s)
    copy = s.model_copy(update={"pending": [j.model_copy() for j in s.pending]})
    want = place(copy, _fast=False).model_dump()
    assert place(s).model_dump() == place(copy).model_dump() == want
    assert place(copy).model_dump() == want  # the copies, now seen twice: as columns


def test_the_same_jobs_under_other_orders_are_ranked_anew():
    """Why: the columns keep what the queue order takes off each job; a caller that places the
    same jobs under another order or weight (the simulator runs policies over one trace) must
    get that order's ranking, not the one kept."""
    s = _long_world(6)
    place(s)
    place(s)  # in columns now
    for update in (
        {"order": "srpt"},
        {"order": "srpt", "sjf_per_doubling": 3.0},
        {"order": "sjf_aging"},
        {"order": "las", "las_thresholds_gpu_h": [0.1]},
        {"order": "srpt", "default_duration_s": 60.0},
    ):
        other = s.model_copy(update=update)
        assert place(other).model_dump() == place(other, _fast=False).model_dump(), update


def test_bench_place_only_times_both_placements(tmp_path):
    """Why: the issue-31 figures come from `bench_scale --place-only --compare-with`: it must
    run, time both modules on the same snapshots and daemon ticks (an older placement.py with
    the pending_columns.py beside it, each its own module) and refuse to report if they
    disagree."""
    import csv
    import shutil
    import subprocess
    import sys

    from conftest import REPO

    for name in ("placement.py", "pending_columns.py"):
        shutil.copy(REPO / "runtime" / "scheduling" / name, tmp_path / name)
    out = tmp_path / "place.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nightshift.evals.bench_scale",
            "--place-only",
            "--quick",
            "--compare-with",
            str(tmp_path / "placement.py"),
            "--csv",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    # 2 sizes x (the same, a changing, a rebuilt queue, the daemon's order, the daemon's ticks
    # from a store with jobs kept between ticks, all new) x 2 modules
    assert len(rows) == 24
    assert sum("compared" in r["measure"] for r in rows) == 12
    assert sum("daemon's tick" in r["measure"] for r in rows) == 8
    assert all(float(r["value"]) > 0 and "p95" in r["detail"] for r in rows)
