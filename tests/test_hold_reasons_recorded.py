"""The daemon writes each waiting job's hold reason into the store at every tick, for `nightshift
jobs`: what placement decided, read back from the rows; only to jobs still queued; and written as
one statement over the changed rows (most reasons name a time, so most change from tick to tick:
as row objects, a queue of 100,000 took 8-12 s a tick, docs/benchmarks.md)."""

from __future__ import annotations

import csv
from datetime import timedelta

from sqlmodel import select

from nightshift.evals.bench_scale import NOW, NullExecutor, populate
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.store.db import Job, Store


def _reasons(store: Store) -> dict[int, str | None]:
    with store.session() as s:
        return dict(s.exec(select(Job.id, Job.hold_reason).where(Job.state == "queued")).all())


def test_every_queued_job_has_the_reason_placement_gave_it_tick_after_tick(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 300, 8)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    for minute in (0, 1, 30):
        holds = engine.place_queued(NOW + timedelta(minutes=minute))
        stored = _reasons(store)
        assert len(stored) >= 250
        assert stored == {jid: holds.get(jid) for jid in stored}


def test_a_job_that_left_the_queue_gets_no_reason(tmp_path):
    """A reason decided for a job that is no longer queued when it is written (cancelled, or
    started by another loop, in between) is not written into its row."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 40, 2)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    waiting = sorted(_reasons(store))
    gone, kept = waiting[0], waiting[1]
    with store.session() as s:
        job = s.get(Job, gone)
        assert job is not None
        job.state = "cancelled"
        s.add(job)
    engine._record_holds([gone, kept], {gone: "held: stale", kept: "held: now"})
    with store.session() as s:
        assert s.get(Job, gone).hold_reason is None  # type: ignore[union-attr]
        assert s.get(Job, kept).hold_reason == "held: now"  # type: ignore[union-attr]


def test_the_bench_of_the_whole_tick_runs(tmp_path):
    """`python -m nightshift.evals.bench_scale --engine-ticks` (the figures in docs/benchmarks.md),
    at its smoke-test size: a row with the collector as in any process and one with the heap
    frozen after each tick as the daemon does, each a positive time."""
    from nightshift.evals.bench_scale import main

    out = tmp_path / "ticks.csv"
    assert main(["--engine-ticks", "--quick", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [("whole tick" in r["measure"], "TickHeap" in r["measure"]) for r in rows] == [
        (True, False),
        (True, True),
    ]
    assert all(float(r["value"]) > 0 for r in rows)
