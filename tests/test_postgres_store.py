"""The store on a real PostgreSQL server (tests/postgres_service.py starts one on loopback):
the same migrations, a job run end to end, the audit chain kept linear under concurrent writers,
and two daemons on one store that never start one job twice."""

from __future__ import annotations

import csv
import random
import subprocess
import sys
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.evals import team_load
from nightshift.evals.bench_scale import NOW, NullExecutor, populate
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling.placement import place
from nightshift.runtime.scheduling.snapshot import SpecFields, load_snapshot
from nightshift.runtime.store import job_holds
from nightshift.runtime.store.db import Job, JobHold, Store
from nightshift.runtime.store.migrations import HEAD

from conftest import REPO, write_spec

# One worker runs every test of the group: the service starts once (pytest-xdist, loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("postgres")]
pytest_plugins = ["postgres_service"]


@pytest.fixture
def pg_home(home, monkeypatch, postgres_url):
    monkeypatch.setenv("NIGHTSHIFT_STORE__URL", postgres_url)
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "none")
    return home


def test_migrations_bring_a_fresh_database_to_head(postgres_url):
    store = Store(postgres_url)
    with store.engine.connect() as c:
        assert c.execute(text("select version_num from alembic_version")).scalar_one() == HEAD
        tables = set(
            c.execute(text("select tablename from pg_tables where schemaname='public'")).scalars()
        )
    assert {"job", "attempt", "auditevent", "approval", "channel_message", "goalrun"} <= tables
    Store(postgres_url)  # opening it again changes nothing


def test_a_job_runs_end_to_end_and_the_audit_verifies(pg_home):
    w = Wiring.load()
    job = Client(w).submit(str(write_spec(pg_home.parent, steps=20)))
    assert w.engine.run_until_settled([job]) == {job: "succeeded"}
    att = w.store.attempts(job)[0]
    assert att.last_step == 20 and att.node == w.settings.node
    assert w.audit.verify().ok


APPEND = """
import sys
from nightshift.agent.brain.wiring import Wiring
w = Wiring.load()
for i in range(int(sys.argv[1])):
    w.audit.append("system", "test.concurrent", payload={"i": i, "who": sys.argv[2]})
w.audit.flush()
"""


def test_concurrent_writers_keep_one_linear_chain(pg_home):
    """Four processes appending at once: every event chained to exactly one predecessor, the
    chain verifies. (The audit table is locked SHARE ROW EXCLUSIVE for each append: appends
    take turns, each reading the head it chains to under the lock.)"""
    Wiring.load().audit.append("system", "test.first")
    procs = [subprocess.Popen([sys.executable, "-c", APPEND, "150", f"p{i}"]) for i in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    w = Wiring.load()
    with w.store.engine.connect() as c:
        n = c.execute(text("select count(*) from auditevent where action='test.concurrent'"))
        assert n.scalar_one() == 600
        forks = c.execute(
            text(
                "select count(*) from (select prev_hash from auditevent group by prev_hash having count(*) > 1) f"
            )
        )
        assert forks.scalar_one() == 0
    assert w.audit.verify().ok


def test_two_daemons_never_start_one_job_twice(postgres_url, tmp_path):
    """The team load eval's quick form: 2 submitters × 30 jobs, 2 daemons (nodes) on one store."""
    r = team_load.run(
        postgres_url,
        tmp_path,
        submitters=2,
        per_submitter=30,
        daemons=2,
        cpu_slots=4,
        timeout_s=240,
    )
    assert r.submitted == 60 and r.ok, r
    assert r.launches == 60 and sum(r.started_by_node.values()) == 60
    assert len(r.started_by_node) == 2  # both nodes took work


def test_doctor_reports_the_store_without_its_password(pg_home, monkeypatch, postgres_url):
    import json

    from conftest import nightshift

    with_password = postgres_url.replace("postgres@", "postgres:sekrit@")
    monkeypatch.setenv("NIGHTSHIFT_STORE__URL", with_password)
    done = nightshift("doctor", "--json")
    store = {c["area"]: c for c in json.loads(done.stdout)}["store"]
    assert store["status"] == "ok" and store["detail"].startswith("postgresql at 127.0.0.1")
    assert "sekrit" not in done.stdout + done.stderr


def test_a_sweeps_study_lives_in_its_own_schema_of_the_store(postgres_url, tmp_path):
    """Optuna's tables and Alembic revision go to the nightshift_optuna schema: the store keeps
    its own revision, and a second process (another daemon) loads the same study."""
    from datetime import UTC, datetime

    import yaml

    from nightshift.runtime.scheduling.sweeps import create_sweep, load_study
    from nightshift.runtime.spec import ExperimentSpec

    store = Store(postgres_url)
    spec = yaml.safe_load((REPO / "examples/specs/sweep_numpy.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    row = create_sweep(
        store,
        ExperimentSpec.model_validate(spec),
        spec_path=None,
        owner="alice",
        name="pg-sweep",
        now=datetime(2026, 12, 4, 20, 0),
        tz=UTC,
    )
    assert row.storage == "schema:nightshift_optuna"  # no URL, no password, in the store
    study = load_study(row, store.url)
    trial = study.ask()
    study.tell(trial, 0.25)
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from nightshift.runtime.store.db import Store, Sweep; "
            "from nightshift.runtime.scheduling.sweeps import load_study; from sqlmodel import select; "
            "s = Store(sys.argv[1]); r = s.session().__enter__().exec(select(Sweep)).one(); "
            "print(load_study(r, s.url).best_value)",
            postgres_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.stdout.strip() == "0.25", other.stderr
    with store.engine.connect() as c:
        assert c.execute(text("select version_num from alembic_version")).scalar_one() == HEAD
        optuna_rev = c.execute(text("select version_num from nightshift_optuna.alembic_version"))
        assert optuna_rev.scalar_one() != HEAD


def test_hold_reasons_are_written_as_on_sqlite(postgres_url, tmp_path):
    """The daemon's hold reasons go in as one statement over the changed rows (an executemany):
    on PostgreSQL too every queued job ends the tick with the reason placement gave it."""
    store = Store(postgres_url)
    populate(store, 120, 4)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    for minute in (0, 5):
        holds = engine.place_queued(NOW + timedelta(minutes=minute))
        with store.session() as s:
            queued = s.exec(select(Job.id).where(Job.state == "queued")).all()
            whole = job_holds.of(s)
            tails = s.exec(select(JobHold.tail).where(col(JobHold.tail).is_not(None))).all()
        stored = {jid: whole.get(jid) for jid in queued}
        assert len(stored) >= 100 and stored == {jid: holds.get(jid) for jid in stored}
        assert tails  # the reservation's clause kept once, as on SQLite


def test_hold_reasons_go_only_to_queued_jobs_on_postgresql(postgres_url, tmp_path):
    """PostgreSQL writes the changed reasons as one statement over three arrays: a job no longer
    queued gets none, a changed one is replaced (its reservation's clause kept once), one that
    waits for nothing loses its row."""
    store = Store(postgres_url)
    populate(store, 40, 2)
    engine = Engine(store, NullExecutor(), Settings(home=str(tmp_path)), clock=lambda: NOW)
    with store.session() as s:
        waiting = sorted(s.exec(select(Job.id).where(Job.state == "queued")).all())
    gone, kept, freed = waiting[:3]
    engine._record_holds([kept, freed], {kept: "held: first", freed: "held: first"})
    with store.session() as s:
        s.exec(text("update job set state = 'cancelled' where id = :j").bindparams(j=gone))
    engine._record_holds(
        [gone, kept, freed],
        {gone: "held: stale", kept: "held: now past R"},
        {"reservation": " past R"},
    )
    with store.session() as s:
        rows = s.exec(select(JobHold.job_id, JobHold.reason, JobHold.tail)).all()
        # the clause kept once, under the loop's node
        assert [tuple(r) for r in rows] == [
            (kept, "held: now", f"{engine.settings.node}/reservation")
        ]
        assert job_holds.of(s) == {kept: "held: now past R"}


def test_the_same_rows_load_the_same_snapshot_as_on_sqlite(postgres_url, tmp_path):
    """PostgreSQL hands the loop each spec's placement fields as one small array and the
    parameters as text (decoding 100,000 whole specs took most of a 10 s load): the snapshot,
    the jobs it fails and the decision are those SQLite's rows give, hand-edited fields too."""
    good = populate_job_spec()
    edited = [
        ("gpus-a-word", {**good, "resources": {**good["resources"], "gpus": "two"}}),
        ("spec-a-list", ["not", "a", "mapping"]),
        ("deadline", {**good, "deadline": "2h", "cost_class": "cost_sensitive"}),
        ("no-checkpoint", {k: v for k, v in good.items() if k != "checkpoint"}),
    ]
    loaded = []
    for url in (postgres_url, f"sqlite:///{tmp_path}/s.db"):
        store = Store(url)
        populate(store, 300, 16)
        with store.session() as s:
            last = max(s.exec(select(Job.id)).all())  # populate gives ids of its own
            for i, (name, spec) in enumerate(edited, start=last + 1):
                params = {"lr": 0.1, "n": [1, 2]}
                s.add(
                    Job(id=i, name=name, spec=spec, params=params, created_at=NOW, updated_at=NOW)
                )
        snap = load_snapshot(store, NOW + timedelta(minutes=1))
        with store.session() as s:
            states = sorted(s.exec(select(Job.name, Job.state, Job.reason)).all())
        loaded.append((snap.model_dump(), place(snap).model_dump(), states))
        store.engine.dispose()
    on_postgres, on_sqlite = loaded
    assert len(on_sqlite[0]["pending"]) >= 250
    failed = {n for n, st, _ in on_sqlite[2] if st == "failed" and n in dict(edited)}
    assert failed == {"gpus-a-word"}
    assert on_postgres == on_sqlite


def populate_job_spec() -> dict:
    from nightshift.evals.bench_scale import bench_spec

    return bench_spec(1, random.Random(1))


def test_the_bench_of_the_load_from_postgresql_runs(postgres_url, tmp_path):
    """`python -m nightshift.evals.bench_scale --postgres URL` (docs/benchmarks.md), at its
    smoke-test size: both paths timed on the same filled database, each a positive time."""
    from nightshift.evals.bench_scale import main

    out = tmp_path / "load.csv"
    assert main(["--postgres", postgres_url, "--quick", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert ["own path" in r["measure"] for r in rows] == [True, False]
    assert all(float(r["value"]) > 0 and "1,000 queued" in r["measure"] for r in rows)
    with pytest.raises(SystemExit, match="empty database"):
        main(["--postgres", postgres_url, "--quick"])


def test_a_spec_edited_by_hand_is_read_again_on_postgresql(postgres_url, tmp_path):
    """PostgreSQL's trigger gives a spec edited in SQL a new revision, so a load that keeps the
    fields between loads reads that job's again: it is the load that reads them all."""
    store = Store(postgres_url)
    populate(store, 200, 8)
    kept_fields, previous = SpecFields(), {}
    load_snapshot(store, NOW, previous=previous, spec_fields=kept_fields)
    with store.session() as s:
        job_id, rev = s.exec(
            select(Job.id, Job.spec_rev).where(Job.state == "queued").order_by(Job.id)
        ).first()
        s.exec(
            text(
                "update job set spec = json_build_object('name', 'x', 'command', "
                "json_build_array('true'), 'resources', json_build_object('gpus', 8)) "
                "where id = :j"
            ).bindparams(j=job_id)
        )
        s.exec(text("update job set priority = 9 where id = :j").bindparams(j=job_id + 1))
        ids = [job_id, job_id + 1]
        revs = dict(s.exec(select(Job.id, Job.spec_rev).where(col(Job.id).in_(ids))).all())
    assert revs[job_id] > rev and revs[job_id] > revs[job_id + 1]
    later = NOW + timedelta(minutes=1)
    kept = load_snapshot(store, later, previous=previous, spec_fields=kept_fields)
    fresh = load_snapshot(store, later)
    assert kept.model_dump() == fresh.model_dump()
    assert next(p.gpus for p in kept.pending if p.id == job_id) == 8
