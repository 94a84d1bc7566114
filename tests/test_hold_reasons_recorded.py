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

from nightshift.evals.bench_scale import NOW, NullExecutor, populate, synthetic_snapshot
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling.placement import place
from nightshift.runtime.store import job_holds, lifecycle, quick_read
from nightshift.runtime.store.db import HoldTail, Job, JobHold, Store
from nightshift.runtime.store.migrations import SCRIPT_LOCATION


def _reasons(store: Store) -> dict[int, str | None]:
    """Each queued job's stored reason, whole (None: the table has no row for it)."""
    with store.session() as s:
        queued = s.exec(select(Job.id).where(Job.state == "queued")).all()
        holds = job_holds.of(s)
    return {jid: holds.get(jid) for jid in queued}


def _holds(store: Store) -> dict[int, str]:
    with store.session() as s:
        return job_holds.of(s)


def _rows(store: Store) -> dict[int, tuple[str, str | None]]:
    """The `job_hold` rows as stored: (reason, the loop whose kept clause ends it)."""
    with store.session() as s:
        return {r.job_id: (r.reason, r.tail) for r in s.exec(select(JobHold)).all()}


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


def test_placement_names_the_clauses_many_reasons_end_with():
    """`Decision.shared_tails`: the reservation's clause, which most of a busy queue's reasons
    end with (the jobs that would run past the reservation), and who holds the CPU slots."""
    d = place(synthetic_snapshot(2_000, 64))
    assert d.reservation is not None
    tail = d.shared_tails["reservation"]
    assert tail.startswith(" outside GPU") and f"job {d.reservation.job_id}" in tail
    ending = [why for why in d.holds.values() if why.endswith(tail)]
    assert len(ending) > len(d.holds) / 2
    cpu = d.shared_tails["cpu"]
    assert cpu.startswith(": held by job ")
    assert any(why == f"all 4 CPU slot(s) busy{cpu}" for why in d.holds.values())


def test_shared_clauses_are_kept_once_and_a_tick_rewrites_only_what_else_changed(tmp_path):
    """The rows of the jobs that would run past the reservation (and of the CPU jobs waiting for
    a slot) hold their reason without the shared clause and point at the loop's one copy of it;
    a tick that moves the reservation rewrites that copy, not their rows; every reader gets the
    reason whole."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 300, 8)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    holds = engine.place_queued(NOW)
    rows = _rows(store)
    with store.session() as s:
        kept = {t.key: t.text for t in s.exec(select(HoldTail)).all()}
    node = engine.settings.node  # the loop's name among daemons sharing a store
    decided = engine.last_decision.shared_tails
    assert kept == {f"{node}/{name}": text for name, text in decided.items()}
    assert set(decided) == {"reservation", "cpu"}
    key = f"{node}/reservation"
    pointing = {jid for jid, (_, k) in rows.items() if k == key}
    assert len(pointing) >= 50  # 109 of the 289 reasons here
    for jid in pointing:
        assert rows[jid][0] + kept[key] == holds[jid] and not rows[jid][0].endswith(kept[key])
    assert any(k == f"{node}/cpu" for _, k in rows.values())
    assert _reasons(store) == {jid: holds.get(jid) for jid in _reasons(store)}
    # the same whole reasons through the quick reader (`nightshift jobs`, `show`)
    quick = quick_read.status_rows(store.url, ["queued"], 5.0)
    assert quick is not None
    assert {j.id: j.hold_reason for j in quick[0]} == _reasons(store)
    one = sorted(pointing)[0]
    shown = quick_read.job_with_attempts(store.url, one, 5.0)
    assert shown is not None and shown[0] is not None and shown[0].hold_reason == holds[one]
    assert store.hold_reason(one) == holds[one]

    # a tick whose reservation moved (another job holds it, other GPUs, another time)
    moved = " outside GPU 9, reserved for job 1 from 09:00"
    engine._record_holds(
        sorted(holds),
        {j: w.removesuffix(kept[key]) + moved if j in pointing else w for j, w in holds.items()},
        {**decided, "reservation": moved},
    )
    assert _rows(store) == rows  # not one job's row was written again
    assert all(_holds(store)[jid].endswith(moved) for jid in pointing)


def test_each_loop_on_a_shared_store_keeps_its_own_clause(tmp_path):
    """Two daemons on one store (nodes) each keep their reservation's clause under their node:
    a job's reason ends with the clause of the loop that wrote it last."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    populate(store, 20, 2)
    waiting = sorted(_reasons(store))
    a, b = waiting[:2]
    with store.session() as s:
        job_holds.record(
            s, [a, b], {a: "held X", b: "held Y"}, tails={"reservation": " X"}, loop="node-a"
        )
        job_holds.record(s, [b], {b: "held Z"}, tails={"reservation": " Z"}, loop="node-b")
    assert _holds(store) == {a: "held X", b: "held Z"}
    assert _rows(store) == {a: ("held", "node-a/reservation"), b: ("held", "node-b/reservation")}


def test_the_downgrade_puts_each_clause_back_on_its_rows(tmp_path):
    """Going back a revision writes every reason whole again, so an older nightshift reads the
    same reasons."""
    db = tmp_path / "nightshift.db"
    store = Store(f"sqlite:///{db}")
    populate(store, 60, 4)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    holds = engine.place_queued(NOW)
    assert any(key is not None for _, key in _rows(store).values())
    store.engine.dispose()
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.downgrade(cfg, "0021_job_spec_rev")
    con = sqlite3.connect(db)
    stored = dict(con.execute("select job_id, reason from job_hold").fetchall())
    columns = [c[1] for c in con.execute("pragma table_info(job_hold)")]
    con.close()
    assert columns == ["job_id", "reason"]
    assert stored == {jid: why for jid, why in holds.items() if jid in stored}
    assert len(stored) >= 50


def test_the_bench_of_the_hold_reasons_write_runs(capsys):
    """`python -m nightshift.evals.bench_hold_writes` (the figures in docs/benchmarks.md) at a
    small size: a tick, the write and the rows it changed, counted from the table."""
    from nightshift.evals.bench_hold_writes import main, measure

    got = measure(300, 8, 2, 60.0, None)
    assert got["tick_s"] > got["write_s"] > 0
    assert len(got["rows_written"]) == 2 and all(n >= 0 for n in got["rows_written"])
    assert main(["--jobs", "200", "--gpus", "8", "--ticks", "1"]) == 0
    assert "rows written a tick" in capsys.readouterr().out
