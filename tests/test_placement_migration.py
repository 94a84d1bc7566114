"""Migration (`migrate_after_s`, as Gandiva moves jobs to defragment): a job that finds enough
GPUs free, but on no one host, pauses pausable jobs on one host at a checkpoint, where they can
start again at once on other hosts; nothing else waits for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_setups import hand_setup
from sqlmodel import select
from test_gang_placement import RecordingRay, _two_hosts
from test_placement_srpt import NOW, pending, running

from nightshift.evals import simulate as S
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling.placement import (
    Decision,
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
    place,
)
from nightshift.runtime.store.db import Attempt, Job


def hosts(n: int, per: int) -> list[GpuSlot]:
    return [
        GpuSlot(index=h * per + i, host=f"h{h}", memory_total_mib=81920, memory_used_mib=0)
        for h in range(n)
        for i in range(per)
    ]


def snap(pend, run, gpus, **kw) -> Snapshot:
    kw.setdefault("migrate_after_s", 600.0)
    kw.setdefault("host_fit", "best")
    return Snapshot(
        now=NOW,
        order="srpt",
        aging_per_hour=0.0,
        preempt_margin=1,
        pending=list(pend),
        running=list(run),
        gpus=gpus,
        **kw,
    )


def after(s: Snapshot, d: Decision, hours_run: float = 0.0) -> Snapshot:
    """The next call once the proposed pauses took effect: each paused job waits again with
    what remains of its estimate."""
    paused = {p.victim_job_id for p in d.preemptions}
    back = [
        PendingJob(
            id=r.id,
            name=r.name,
            gpus=len(r.gpus),
            expected_duration_s=(r.expected_end - NOW).total_seconds() if r.expected_end else None,
            submitted_at=r.submitted_at or NOW,
        )
        for r in s.running
        if r.id in paused
    ]
    kept = [r for r in s.running if r.id not in paused]
    return s.model_copy(update={"pending": [*s.pending, *back], "running": kept})


def test_a_wide_job_moves_the_fewest_gpus_off_one_host_and_all_start_next():
    """Two 4-GPU hosts, one with a 1-GPU job, the other with a 2-GPU job: the 4-GPU job
    (which outranks neither by a doubling) moves the 1-GPU job, and both start next."""
    gpus = hosts(2, 4)
    s = snap([pending(10, 4, 8.0)], [running(1, [0], 10.0), running(2, [4, 5], 10.0)], gpus)
    d = place(s)
    assert [(p.victim_job_id, p.for_job_id) for p in d.preemptions] == [(1, 10)]
    assert "on no one host" in d.preemptions[0].reason
    assert d.holds[10].startswith("moving job(s) 1 for it")
    nxt = place(after(s, d))
    assert {st.job_id: st.gpus for st in nxt.starts} == {10: [0, 1, 2, 3], 1: [6]}
    assert nxt.preemptions == []


def test_no_move_without_room_elsewhere():
    """The other host is full: the job it would move has nowhere to go, so it waits instead."""
    gpus = hosts(2, 4)
    s = snap([pending(10, 4, 8.0)], [running(1, [0], 10.0), running(2, [4, 5, 6, 7], 10.0)], gpus)
    d = place(s)
    assert d.preemptions == [] and d.starts == []
    assert d.reservation is not None and d.reservation.job_id == 10


def test_no_move_when_its_gpus_free_up_soon_or_when_off():
    gpus = hosts(2, 4)
    soon = [running(1, [0], 5 / 60), running(2, [4], 10.0)]
    assert place(snap([pending(10, 4, 8.0)], soon, gpus)).preemptions == []
    late = [running(1, [0], 10.0), running(2, [4], 10.0)]
    assert place(snap([pending(10, 4, 8.0)], late, gpus, migrate_after_s=None)).preemptions == []
    # first fit would put the moved job back where it was: migration is for best fit only
    assert place(snap([pending(10, 4, 8.0)], late, gpus, host_fit="first")).preemptions == []
    assert len(place(snap([pending(10, 4, 8.0)], late, gpus)).preemptions) == 1


def test_what_is_never_moved():
    """A job that cannot pause, one the starvation guard promoted and a gang stay; with only
    those in the way the wide job reserves."""
    gpus = hosts(3, 4)
    cases = [
        [running(1, [0], 10.0, pausable=False)],
        [running(1, [0], 10.0, submitted_at=NOW - timedelta(hours=31))],
        [running(1, [3, 4], 10.0)],  # across hosts h0 and h1
    ]
    for run in cases:
        blocker = [running(2, [8, 9], 10.0)]  # h2 half full: no host has 4 free but h0/h1's
        others = [running(3, [5], 10.0)] if run[0].gpus != [3, 4] else []
        s = snap([pending(10, 4, 8.0)], [*run, *blocker, *others], gpus, promote_after_h=24)
        d = place(s)
        moved = {p.victim_job_id for p in d.preemptions}
        assert 1 not in moved, run


def test_a_job_whose_deadline_its_estimate_nearly_meets_is_not_moved():
    """A move redoes the work since a checkpoint: the 1-GPU job due 30 minutes after its
    estimated end (less than `hold_slack_s`, an hour) stays; the other host's is moved."""
    gpus = hosts(3, 4)
    due = running(1, [0], 10.0, deadline=NOW + timedelta(hours=10.5))
    roomy = running(2, [4], 10.0, deadline=NOW + timedelta(hours=12))
    run = [due, roomy, running(3, [8, 9], 10.0)]
    d = place(snap([pending(10, 4, 8.0)], run, gpus))
    assert [p.victim_job_id for p in d.preemptions] == [2]
    d = place(snap([pending(10, 4, 8.0)], run, gpus, hold_slack_s=0.0))
    assert [p.victim_job_id for p in d.preemptions] == [1]  # by host order, when both may move


def test_several_jobs_of_more_than_one_gpu_are_not_moved_together():
    """Two 2-GPU jobs on a host would each need a host with room when they come back, in
    whatever order: such a move is not made (one job of any width, or one-GPU jobs)."""
    gpus = hosts(3, 4)
    run = [running(1, [0, 1], 10.0), running(2, [2, 3], 10.0), running(3, [4], 10.0)]
    run += [running(4, [8], 10.0)]
    d = place(snap([pending(10, 4, 8.0)], run, gpus))
    assert {p.victim_job_id for p in d.preemptions} in ({3}, {4})


@settings(max_examples=80, deadline=None)
@given(
    per=st.sampled_from([2, 4, 8]),
    n_hosts=st.integers(2, 5),
    seed=st.randoms(use_true_random=False),
    width=st.integers(2, 8),
)
def test_a_move_always_lets_the_waiting_job_and_the_moved_ones_start_next(
    per, n_hosts, seed, width
):
    """Any cluster of pausable jobs: when a move is proposed, the next call starts the waiting
    job and every job it moved (nothing the move was for is blocked by what it moved). About a
    third of these clusters propose one."""
    width = min(width, per)
    gpus = hosts(n_hosts, per)
    run: list[RunningJob] = []
    jid = 1
    for h in range(n_hosts):
        i = h * per
        end = i + per
        while i < end:
            if seed.random() < 0.5:
                i += 1  # left free
                continue
            w = min(seed.choice([1, 1, 1, 2, 4]), end - i)
            run.append(running(jid, list(range(i, i + w)), seed.uniform(2.0, 20.0)))
            jid += 1
            i += w
    s = snap([pending(100, width, 30.0)], run, gpus)
    d = place(s)
    assert place(s, _fast=False).model_dump() == d.model_dump()  # the plain path decides alike
    if not d.preemptions or any(not p.reason.count("on no one host") for p in d.preemptions):
        return
    moved = {p.victim_job_id for p in d.preemptions}
    nxt = place(after(s, d))
    assert {st.job_id for st in nxt.starts} == moved | {100}


@pytest.mark.parametrize("after_min", [30.0, None])
def test_the_daemon_moves_a_job_between_ray_nodes_as_its_settings_say(tmp_path, after_min):
    """`scheduler.migrate_after_min` reaches placement: on two 2-GPU Ray nodes, each with one
    GPU taken by a 1-GPU job that checkpoints and has 5 hours left, a 2-GPU job of 2 hours
    (which outranks neither by a doubling) moves one of them under the default and waits
    for a node under null."""
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 2)
    busy_spec = {
        "name": "b",
        "command": ["true"],
        "checkpoint": {"dir": "ckpt"},
        "resources": {"gpus": 1, "expected_duration_min": 300},
    }
    with store.session() as s:
        (job,) = s.exec(select(Job)).all()
        job.spec = {**job.spec, "resources": {"gpus": 2, "expected_duration_min": 120}}
        s.add(job)
        for n, host in enumerate(("ray:10.0.0.5", "ray:10.0.0.6")):
            busy = Job(name=f"busy{n}", spec=busy_spec, state="running", created_at=NOW)
            s.add(busy)
            s.flush()
            s.add(Attempt(job_id=busy.id, number=1, host=host, gpus=[0], started_at=NOW))
        wide = job.id
    settings = Settings(
        home=str(tmp_path), executor={"kind": "ray"}, scheduler={"migrate_after_min": after_min}
    )
    engine = Engine(store, RecordingRay(tmp_path / "runs"), settings, clock=lambda: NOW)
    holds = engine.place_queued(NOW)
    decision = engine.last_decision
    assert decision is not None
    if after_min is None:
        assert decision.preemptions == []
        assert "reserved for it" in holds[wide]
    else:
        (moved,) = decision.preemptions
        assert moved.for_job_id == wide and "on no one host" in moved.reason
        assert holds[wide].startswith(f"moving job(s) {moved.victim_job_id} for it")


def test_in_the_simulator_a_wide_job_starts_at_once_instead_of_after_the_stragglers():
    """Two 4-GPU hosts, each with a 10-hour 1-GPU job among three 1-hour ones. At 1.5 h a
    4-GPU job arrives: three GPUs stand free on each host. Without migration it waits for a
    10-hour job to end; with it, one of them moves to the other host (its last 300 s redone)
    and the wide job starts at once."""
    hour = 3600.0
    jobs = [(0.0, 10 * hour, 1), (1.0, hour, 1), (2.0, hour, 1), (3.0, hour, 1)]
    jobs += [(4.0, 10 * hour, 1), (5.0, hour, 1), (6.0, hour, 1), (7.0, hour, 1)]
    jobs += [(1.5 * hour, 8 * hour, 4)]
    setup = hand_setup(jobs, [4, 4])
    moved = S.simulate(setup, S.NOTARIFF)
    kept = S.simulate(setup, "nightshift-nomove")
    assert kept.first_start[9] == pytest.approx(10 * hour, abs=10.0)
    assert moved.first_start[9] == 1.5 * hour
    assert moved.metrics["preemptions"] == 1 and kept.metrics["preemptions"] == 0
    assert moved.metrics["unfinished"] == 0
