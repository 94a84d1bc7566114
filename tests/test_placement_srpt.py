"""`order: srpt` and the starvation guard: the fewest estimated GPU-seconds left go first, a job
preempts one whose remainder is at least `preempt_margin` doublings longer, and a job that has
waited `promote_after_h` in all goes ahead, is not preempted once running, and reserves rather
than preempts."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.runtime.scheduling.placement import (
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
    place,
    waited_s,
)

NOW = datetime(2026, 12, 2, 3, 0)
H = 3600.0


def gpus(n: int) -> list[GpuSlot]:
    return [GpuSlot(index=i, memory_total_mib=81920, memory_used_mib=0) for i in range(n)]


def pending(id: int, k: int, hours: float, waited_h: float = 0.0, **kw) -> PendingJob:
    return PendingJob(
        id=id,
        name=f"j{id}",
        gpus=k,
        expected_duration_s=hours * H,
        submitted_at=NOW - timedelta(hours=waited_h),
        **kw,
    )


def running(id: int, gpu_ids: list[int], left_h: float, **kw) -> RunningJob:
    kw.setdefault("submitted_at", NOW - timedelta(hours=1))
    kw.setdefault("started_at", NOW - timedelta(minutes=30))
    kw.setdefault("pausable", True)
    return RunningJob(
        id=id, name=f"r{id}", gpus=gpu_ids, expected_end=NOW + timedelta(hours=left_h), **kw
    )


def srpt(pend, n_gpus, run=(), **kw) -> Snapshot:
    kw.setdefault("aging_per_hour", 0.0)
    return Snapshot(
        now=NOW, order="srpt", pending=list(pend), running=list(run), gpus=gpus(n_gpus), **kw
    )


def test_fewest_gpu_seconds_first_not_shortest_time():
    """A 1-GPU 4-hour job (4 GPU-h) goes before a 8-GPU 1-hour job (8 GPU-h); sjf_aging, which
    weighs time alone, picks the other; a hold names nothing it cannot start."""
    jobs = [pending(1, 8, 1.0), pending(2, 1, 4.0)]
    d = place(srpt(jobs, 8))
    assert [s.job_id for s in d.starts] == [2]
    assert 1 in d.holds
    sjf = place(srpt(jobs, 8).model_copy(update={"order": "sjf_aging"}))
    assert [s.job_id for s in sjf.starts] == [1]


def test_preempts_only_a_remainder_at_least_one_doubling_longer():
    """margin 1: a 1-hour job pauses a job with 3 hours left, not one with 1.5 hours left."""
    run_long = running(10, [0], left_h=3.0)
    d = place(srpt([pending(1, 1, 1.0)], 1, [run_long], preempt_margin=1))
    assert [p.victim_job_id for p in d.preemptions] == [10]
    run_short = running(10, [0], left_h=1.5)
    d = place(srpt([pending(1, 1, 1.0)], 1, [run_short], preempt_margin=1))
    assert d.preemptions == [] and d.starts == []


def test_a_running_job_near_its_end_is_not_paused_for_a_new_one():
    """What a job has left, not what it asked for at first, weighs: a 10-hour job with 20
    minutes left is not paused for a 1-hour one."""
    r = running(10, [0], left_h=1 / 3, started_at=NOW - timedelta(hours=9.7))
    d = place(srpt([pending(1, 1, 1.0)], 1, [r], preempt_margin=1))
    assert d.preemptions == []


def test_the_guard_puts_a_long_waiter_ahead_of_a_shorter_job():
    jobs = [pending(1, 1, 0.1), pending(2, 1, 50.0, waited_h=25)]
    assert [s.job_id for s in place(srpt(jobs, 1)).starts] == [1]  # no guard: shortest first
    d = place(srpt(jobs, 1, promote_after_h=24))
    assert [s.job_id for s in d.starts] == [2]


def test_oldest_first_among_the_promoted():
    jobs = [pending(1, 1, 1.0, waited_h=30), pending(2, 1, 50.0, waited_h=40)]
    d = place(srpt(jobs, 1, promote_after_h=24))
    assert [s.job_id for s in d.starts] == [2]


def test_a_promoted_running_job_is_not_preempted():
    """r10 waited 30 h before it started: a 1-minute job does not pause it; r11, which waited
    an hour, is paused for the same job."""
    promoted = running(
        10,
        [0],
        left_h=40.0,
        submitted_at=NOW - timedelta(hours=31),
        started_at=NOW - timedelta(hours=1),
    )
    d = place(srpt([pending(1, 1, 1 / 60)], 1, [promoted], preempt_margin=1, promote_after_h=24))
    assert d.preemptions == []
    plain = running(11, [0], left_h=40.0)
    d = place(srpt([pending(1, 1, 1 / 60)], 1, [plain], preempt_margin=1, promote_after_h=24))
    assert [p.victim_job_id for p in d.preemptions] == [11]


def test_a_promoted_job_reserves_instead_of_preempting():
    """The guard does not pause others for the old job: it gets the reservation, so nothing
    backfills past it."""
    r = running(10, [0], left_h=5.0)
    old = pending(2, 1, 10.0, waited_h=30)
    d = place(srpt([old, pending(3, 1, 8.0)], 1, [r], preempt_margin=1, promote_after_h=24))
    assert d.preemptions == []
    assert d.reservation is not None and d.reservation.job_id == 2


def test_paused_time_counts_as_waiting_and_run_time_does_not():
    """Submitted 30 h ago and ran 10 h on 2 GPUs (20 GPU-h attained): it has waited 20 h."""
    assert waited_s(NOW, NOW - timedelta(hours=30), 20 * H, 2) == 20 * H
    j = pending(2, 2, 5.0, waited_h=30, attained_gpu_s=20 * H)
    short = pending(1, 2, 0.5)
    assert [s.job_id for s in place(srpt([j, short], 2, promote_after_h=16)).starts] == [2]
    assert [s.job_id for s in place(srpt([j, short], 2, promote_after_h=24)).starts] == [1]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 4), st.floats(0.02, 100.0), st.floats(0, 48)),
        min_size=1,
        max_size=12,
    ),
    n=st.integers(1, 8),
)
def test_with_no_waiter_promoted_the_first_start_has_the_fewest_gpu_seconds(sizes, n):
    """Over random queues on an idle cluster: nothing promoted (guard above every wait), the
    first job started is one with the fewest estimated GPU-seconds among those that fit."""
    jobs = [pending(i + 1, k, h, waited_h=w) for i, (k, h, w) in enumerate(sizes)]
    d = place(srpt(jobs, n, promote_after_h=49))
    fits = [j for j in jobs if j.gpus <= n]
    if not fits:
        assert d.starts == []
        return
    first = next(j for j in jobs if j.id == d.starts[0].job_id)
    least = min(max(60.0, j.gpus * j.expected_duration_s) for j in fits)
    assert max(60.0, first.gpus * first.expected_duration_s) <= least * 1.000001


def test_preempt_wider_off_never_pauses_a_job_wider_than_the_waiting_one():
    """A pause redoes work on every GPU the victim held: with preempt_wider off a 1-GPU job
    does not pause an 8-GPU one (it does with the default), but still pauses a 1-GPU one."""
    wide = running(10, list(range(8)), left_h=20.0)
    d = place(srpt([pending(1, 1, 0.5)], 8, [wide], preempt_margin=1))
    assert [p.victim_job_id for p in d.preemptions] == [10]
    d = place(srpt([pending(1, 1, 0.5)], 8, [wide], preempt_margin=1, preempt_wider=False))
    assert d.preemptions == []
    narrow = [running(10 + i, [i], left_h=20.0) for i in range(8)]
    d = place(srpt([pending(1, 1, 0.5)], 8, narrow, preempt_margin=1, preempt_wider=False))
    assert len(d.preemptions) == 1
