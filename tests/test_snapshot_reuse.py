"""The daemon keeps its waiting jobs from one tick's snapshot to the next
(`load_snapshot(previous=...)`): a job whose fields are all as stored is the same object, so
placement finds its columns by identity (evals/bench_scale.py `bench_daemon_ticks`); a job whose
learned estimate alone moved is the same object with the new estimate; anything else changed, in
the store or in place by a caller, gives a new object with the stored values."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from sqlalchemy import update
from sqlmodel import select

from nightshift.evals.bench_scale import NOW, NullExecutor, populate, store_ticks
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling import placement
from nightshift.runtime.scheduling.pending_columns import PendingColumns
from nightshift.runtime.scheduling.placement import PendingJob, place
from nightshift.runtime.scheduling.snapshot import PENDING_ORDER, load_snapshot
from nightshift.runtime.store.db import Job, Store


def test_the_order_compared_is_the_models_own():
    """A field added to PendingJob must be compared too, or a changed one would be kept."""
    assert PENDING_ORDER == tuple(PendingJob.model_fields)


def test_unchanged_jobs_are_kept_and_changed_ones_are_loaded_anew(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 300, 16)
    previous: dict[int, PendingJob] = {}
    first = load_snapshot(store, NOW, previous=previous)
    waiting = {p.id: p for p in first.pending + first.recovering}
    assert previous == waiting and len(waiting) >= 300
    raised, cancelled, edited, *_ = sorted(waiting)
    with store.session() as s:
        s.execute(update(Job).where(Job.id == raised).values(priority=Job.priority + 5))
        s.execute(update(Job).where(Job.id == cancelled).values(state="cancelled"))
        s.commit()
    waiting[edited].gpus = 99  # a caller's edit in place is not what the store says
    later = NOW + timedelta(minutes=1)
    second = load_snapshot(store, later, previous=previous)
    assert cancelled not in previous and set(previous) == {p.id for p in second.pending}
    for job in second.pending:
        if job.id in (raised, edited):
            assert job is not waiting[job.id]
        else:
            assert job is waiting[job.id], job.id
    assert previous[raised].priority == waiting[raised].priority + 5
    assert previous[edited].gpus != 99
    # field for field what a load without the previous jobs gives, and the same decision
    fresh = load_snapshot(store, later)
    assert second.model_dump() == fresh.model_dump()
    assert place(second).model_dump() == place(fresh).model_dump()


def test_a_job_whose_estimate_alone_moved_is_kept_with_the_new_estimate(tmp_path):
    """Why: a finished run moves the learned estimate of every queued job of its name, a tenth
    of a deep queue a tick; each as a new object cost placement a whole row. Kept in place, the
    job's row takes the new value, and every decision is as a fresh load's."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, placement.COLUMNS_FROM + 500, 64)
    previous: dict[int, PendingJob] = {}
    ticks = store_ticks(store)  # each tick: runs finish, jobs leave and arrive, priorities move
    now = next(ticks)
    snap = load_snapshot(store, now, previous=previous)
    for _ in range(3):
        # the jobs' rows made and ranked, under the daemon's order, as its ticks leave them (all
        # GPUs free: which jobs start is the order's choice)
        place(snap.model_copy(update={"order": "srpt", "running": []}))
        before = {j.id: (j, j.expected_duration_s, j.expected_upper_s) for j in snap.pending}
        now = next(ticks)
        snap = load_snapshot(store, now, previous=previous)
        moved = [
            j
            for j in snap.pending
            if j.id in before
            and j is before[j.id][0]
            and (j.expected_duration_s, j.expected_upper_s) != before[j.id][1:]
        ]
        assert len(moved) > 10
        fresh = load_snapshot(store, now)
        assert snap.model_dump() == fresh.model_dump()
        for order in ("srpt", "sjf_aging", "priority"):
            got, want = (
                s.model_copy(update={"order": order, "running": []}) for s in (snap, fresh)
            )
            assert place(got).model_dump() == place(want, _fast=False).model_dump(), order


def test_a_dependency_list_changed_in_place_is_not_kept(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 50, 8)
    previous: dict[int, PendingJob] = {}
    job = load_snapshot(store, NOW, previous=previous).pending[0]
    job.blocked_by.append("nothing-by-this-name")  # no __setattr__: only the comparison sees it
    again = next(p for p in load_snapshot(store, NOW, previous=previous).pending if p.id == job.id)
    assert again is not job and "nothing-by-this-name" not in again.blocked_by


def test_the_engine_keeps_its_waiting_jobs_from_tick_to_tick(tmp_path):
    """The daemon's own placement step passes its last tick's jobs: the jobs still queued at the
    next tick are the same objects; the ones it started are gone from what it keeps."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 200, 32)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    engine.place_queued(NOW)
    first = dict(engine.waiting)
    engine.place_queued(NOW + timedelta(minutes=1))
    with store.session() as s:
        queued = set(s.exec(select(Job.id).where(Job.state == "queued")).all())
    assert set(engine.waiting) == queued and len(queued) >= 150
    assert all(engine.waiting[i] is first[i] for i in queued)


def test_placement_finds_kept_jobs_where_the_last_load_had_them(tmp_path):
    """Why: looking up 100,000 objects one by one was a sixth of the daemon's `place()`. The load
    says where each kept job sat last time (`Snapshot._kept_from`); the columns take a row from
    there only where the object is the very one, so a wrong or stale hint costs a lookup, never
    a row of another job."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 400, 16)
    previous: dict[int, PendingJob] = {}
    first = load_snapshot(store, NOW, previous=previous)
    assert first._kept_from is not None and (first._kept_from == -1).all()
    cols = PendingColumns(("cpu",), "backoff")
    cols.rows_of(first.pending, first._kept_from)  # new objects: copied in when seen again
    assert cols.rows_of(first.pending, first._kept_from) is not None
    with store.session() as s:  # one job changed, one gone: the rest are kept
        gone, raised = sorted(p.id for p in first.pending)[:2]
        s.execute(update(Job).where(Job.id == gone).values(state="cancelled"))
        s.execute(update(Job).where(Job.id == raised).values(priority=Job.priority + 5))
        s.commit()
    second = load_snapshot(store, NOW + timedelta(minutes=1), previous=previous)
    hint = second._kept_from
    assert hint is not None and (hint >= 0).sum() == len(second.pending) - 1
    shifted = np.roll(hint, 1)  # every position off by one: nothing is where it says
    for kept_from in (hint, shifted, None):
        rows = cols.rows_of(second.pending, kept_from)
        assert rows is not None
        assert cols.jid[rows].tolist() == [p.id for p in second.pending]
        cols.rows_of(first.pending)  # the last call's list is the first load's again
    # and the daemon's decisions are a fresh load's
    fresh = load_snapshot(store, NOW + timedelta(minutes=1))
    assert place(second).model_dump() == place(fresh).model_dump()
