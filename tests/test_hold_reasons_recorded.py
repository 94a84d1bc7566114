"""The daemon writes each waiting job's hold reason into the store at every tick, for `nightshift
jobs`: what placement decided, read back from the rows; only to jobs still queued; kept in a
table of its own (`job_hold`: most reasons name a time, so most change from tick to tick, and on
the job row each change rewrote the whole row, docs/benchmarks.md); gone when the job leaves the
queue; and carried over from the job row by the migration that made the table."""

from __future__ import annotations

import csv
import sqlite3
from datetime import timedelta

from alembic import command
from alembic.config import Config
from sqlmodel import select

from nightshift.evals.bench_scale import NOW, NullExecutor, populate
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Job, JobHold, Store
from nightshift.runtime.store.migrations import SCRIPT_LOCATION


def _reasons(store: Store) -> dict[int, str | None]:
    """Each queued job's stored reason (None: the table has no row for it)."""
    with store.session() as s:
        return dict(
            s.exec(
                select(Job.id, JobHold.reason)
                .join(JobHold, JobHold.job_id == Job.id, isouter=True)
                .where(Job.state == "queued")
            ).all()
        )


def _holds(store: Store) -> dict[int, str]:
    with store.session() as s:
        return dict(s.exec(select(JobHold.job_id, JobHold.reason)).all())


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
    holds = _holds(store)
    assert gone not in holds
    assert holds[kept] == "held: now"


def test_while_the_kill_switch_is_on_every_queued_job_waits_for_it(tmp_path):
    """A paused loop places nothing; each queued job's reason is the switch's, and the next
    tick after `resume` replaces it with placement's."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 60, 2)
    why: list[str | None] = ["paused by alice (GPU fire drill)"]
    engine = Engine(
        store,
        NullExecutor(),
        Settings(home=str(tmp_path)),
        clock=lambda: NOW,
        paused=lambda: why[0],
    )
    holds = engine.tick()
    stored = _reasons(store)
    assert len(stored) >= 50 and holds == stored
    assert set(stored.values()) == {"paused by alice (GPU fire drill)"}
    why[0] = None
    holds = engine.tick()
    assert _reasons(store) == {jid: holds.get(jid) for jid in _reasons(store)}
    assert "paused by alice (GPU fire drill)" not in set(_reasons(store).values())


def test_a_reason_goes_when_its_job_leaves_the_queue_and_a_job_back_in_it_waits_anew(tmp_path):
    """Claiming a job, failing a queued one and any transition remove its reason; a job that
    comes back to the queue shows no reason from before until the next tick gives it one."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 40, 2)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    waiting = sorted(_reasons(store))
    claimed, failed, cancelled, kept = waiting[:4]
    engine._record_holds(waiting[:4], dict.fromkeys(waiting[:4], "held: a reason"))
    with store.write_session() as s:
        assert lifecycle.claim(s, claimed, NOW) is not None
        assert lifecycle.fail_queued(s, failed, "spec unreadable", NOW)
        job = s.get(Job, cancelled)
        assert job is not None
        lifecycle.move_job(s, job, lifecycle.JobState.CANCELLED, NOW, reason="by alice")
    assert _holds(store) == {kept: "held: a reason"}
    with store.write_session() as s:
        s.add(JobHold(job_id=claimed, reason="held: late"))  # a tick that raced the claim
        job = s.get(Job, claimed)
        assert job is not None
        lifecycle.move_job(s, job, lifecycle.JobState.FAILED, NOW, reason="exit 1")
        lifecycle.move_job(s, job, lifecycle.JobState.QUEUED, NOW, reason="retry")
    assert claimed not in _holds(store)
    engine._record_holds([claimed, kept], {claimed: "held: anew"})
    assert _holds(store) == {claimed: "held: anew"}  # kept now waits for nothing


def test_the_migration_moves_queued_jobs_reasons_into_their_table(tmp_path):
    """A store from before `job_hold` keeps its queued jobs' reasons; a stale reason on a job
    that left the queue is dropped, and the job table loses the column."""
    db = tmp_path / "nightshift.db"
    Store(f"sqlite:///{db}").engine.dispose()
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.downgrade(cfg, "0019_point_time_and_reproduces")
    con = sqlite3.connect(db)
    for jid, state, hold in (
        (1, "queued", "held: gang"),
        (2, "running", "stale"),
        (3, "queued", None),
    ):
        con.execute(
            "insert into job (id, name, spec, params, state, priority, owner, max_attempts, "
            "hold_reason, created_at, updated_at) values (?, 'j', '{}', '{}', ?, 0, 'carol', 3, "
            "?, '2026-12-01 00:00:00', '2026-12-01 00:00:00')",
            (jid, state, hold),
        )
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")  # opening it upgrades it
    assert _holds(store) == {1: "held: gang"}
    columns = [c[1] for c in sqlite3.connect(db).execute("pragma table_info(job)")]
    assert "hold_reason" not in columns and "reproduces" in columns
    with store.session() as s:
        assert [j.state for j in s.exec(select(Job).order_by(Job.id))] == [
            "queued",
            "running",
            "queued",
        ]


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
