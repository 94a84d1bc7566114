"""Opening a store brings any store nightshift ever made to the newest schema, once, even when
several processes open it at the same moment; the migrations and the models agree; and the lock
module that serialises it (and the executors) is released by a holder's death."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, MetaData, String
from sqlmodel import SQLModel

from nightshift.runtime import locks
from nightshift.runtime.errors import OperatorError, StoreError
from nightshift.runtime.store.db import Approval, Attempt, AuditEvent, Job, Store
from nightshift.runtime.store.migrations import HEAD, SCRIPT_LOCATION

from conftest import REPO, nightshift

FIXTURE = REPO / "tests/fixtures/stores/release-0.1.0-schema2.db"


def url(db: Path) -> str:
    return f"sqlite:///{db}"


def revisions(db: Path) -> list[str]:
    return [r for (r,) in sqlite3.connect(db).execute("select version_num from alembic_version")]


def ddl(db: Path) -> dict[str, str]:
    return dict(
        sqlite3.connect(db).execute("select name, sql from sqlite_master where sql is not null")
    )


def dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def schema_differences(
    store: Store, metadata: MetaData = SQLModel.metadata, *, server_defaults: bool = True
) -> list:
    """What autogenerate would write to bring the store to `metadata` (alembic_version aside)."""
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "compare_server_default": server_defaults,
                "include_name": lambda name, kind, _parent: (
                    not (kind == "table" and name == "alembic_version")
                ),
            },
        )
        return compare_metadata(ctx, metadata)


def run_py(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


# The migrations ------------------------------------------------------------------------------


def test_head_names_the_newest_revision():
    """The fast path compares against HEAD without loading Alembic, so HEAD must be the head."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    assert ScriptDirectory.from_config(cfg).get_heads() == [HEAD]


def test_models_match_migrations(tmp_path):
    """A model change without a revision fails here: the migrated schema is the models' schema."""
    store = Store(url(tmp_path / "fresh.db"))
    assert revisions(tmp_path / "fresh.db") == [HEAD]
    assert schema_differences(store) == []
    # The comparison has teeth: a column the migrations lack is reported.
    changed = MetaData()
    for table in SQLModel.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["approval"].append_column(Column("not_migrated", String, nullable=True))
    diff = schema_differences(store, changed)
    assert [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "approval", "not_migrated")]


def test_a_store_made_by_the_previous_release_is_upgraded_in_place(tmp_path):
    """release-0.1.0-schema2.db was written by release 0.1.0's own code (see its README): opening
    it keeps every row, adds the approval columns with their defaults, and ends with exactly the
    schema a fresh store gets; opening it again changes nothing and takes no lock."""
    db = tmp_path / "nightshift.db"
    shutil.copy(FIXTURE, db)
    store = Store(url(db))
    assert revisions(db) == [HEAD]
    with store.session() as s:
        job = s.get(Job, 1)
        assert (job.name, job.state, job.owner, job.params) == (
            "prev-release-job",
            "failed",
            "alice",
            {"lr": 0.1},
        )
        attempt = s.get(Attempt, 1)
        assert (
            attempt.job_id,
            attempt.exit_code,
            attempt.metrics_cursor,
            attempt.first_bad_step,
        ) == (1, 1, {"jsonl": 123}, 41)
        approval = s.get(Approval, 1)
        assert (approval.call_id, approval.state, approval.args) == (
            "call-prev-1",
            "pending",
            {"job_id": 1},
        )
        assert (approval.files, approval.requested_via) == ({}, "api")
        assert (
            approval.result,
            approval.error,
            approval.executed_at,
            approval.claimed_by,
            approval.claimed_at,
        ) == (None, None, None, None, None)
        event = s.get(AuditEvent, 1)
        assert (event.actor, event.action, event.payload) == (
            "alice",
            "submit",
            {"name": "prev-release-job"},
        )
    assert store.get_kv("kill_switch") == '{"by": "alice", "reason": "fixture"}'
    fresh = tmp_path / "fresh.db"
    Store(url(fresh))
    assert ddl(db) == ddl(fresh)
    assert schema_differences(store) == []

    # The new columns are written and read back.
    with store.session() as s:
        s.add(
            Approval(
                call_id="call-new",
                skill="retry_job",
                requester="bob",
                rule="r",
                state="executed",
                result={"ok": True},
                files={"a.yaml": "x"},
                requested_via="cli",
                claimed_by="pid 7",
            )
        )
    with store.session() as s:
        new = s.get(Approval, 2)
        assert (new.result, new.files, new.requested_via) == ({"ok": True}, {"a.yaml": "x"}, "cli")
    store.engine.dispose()

    before = dump(db)
    lock = db.with_name(db.name + ".migrate.lock")
    with locks.exclusive(lock):  # were the second open to take the lock, it would time out
        Store(url(db), busy_timeout_s=0.2).engine.dispose()
    assert dump(db) == before


def make_schema1_store(db: Path) -> None:
    """The tables as the create_all before schema 2 made them: attempt without metrics_cursor,
    evidence and first_bad_step, and keyvalue schema_version "1"."""
    old = sqlite3.connect(FIXTURE)
    statements = [
        sql
        for (sql,) in old.execute(
            "select sql from sqlite_master where sql is not null order by type = 'index'"
        )
    ]
    con = sqlite3.connect(db)
    for sql in statements:
        if sql.startswith("CREATE TABLE attempt"):
            sql = "\n".join(
                line
                for line in sql.splitlines()
                if line.strip().split(" ")[0]
                not in ("metrics_cursor", "evidence", "first_bad_step")
            )
            assert "metrics_cursor" not in sql and "first_bad_step" not in sql
        con.execute(sql)
    con.execute(
        "insert into job (id, name, spec, params, state, priority, owner, max_attempts, "
        "created_at, updated_at) values (1, 'old', '{}', '{}', 'succeeded', 0, 'carol', 3, "
        "'2024-06-01 00:00:00', '2024-06-01 00:00:00')"
    )
    con.execute(
        "insert into attempt (id, job_id, number, state, executor, handle, argv, params, "
        "gpus, start_step, metrics_offset, started_at) values (1, 1, 1, 'exited', 'local',"
        " '{}', '[]', '{}', '[]', 0, 0, '2024-06-01 00:00:00')"
    )
    con.execute("insert into keyvalue values ('schema_version', '1')")
    con.commit()
    con.close()


def test_a_schema_1_store_gets_the_attempt_columns_then_the_revisions(tmp_path):
    """The oldest stores (schema_version "1") get the three attempt columns release 0.1.0 added in
    place, are stamped at the baseline and upgraded to the head, keeping their rows."""
    db = tmp_path / "nightshift.db"
    make_schema1_store(db)
    store = Store(url(db))
    assert revisions(db) == [HEAD]
    attempt = store.attempts(1)[0]
    assert (attempt.state, attempt.metrics_cursor, attempt.evidence) == ("exited", {}, None)
    assert store.job(1).owner == "carol"
    assert store.get_kv("schema_version") == "2"  # what release 0.1.0 would find, if run again
    # Release 0.1.0's ALTER gave metrics_cursor a server default '{}' that fresh stores lack;
    # harmless (the model always sets it), and how 0.1.0 itself left such stores.
    assert schema_differences(store, server_defaults=False) == []


@pytest.mark.parametrize("version", ["7", None])
def test_a_pre_alembic_store_of_unknown_schema_is_refused_unchanged(tmp_path, version):
    """Tables of ours but no schema version we know: refuse, say what to do, touch nothing."""
    db = tmp_path / "nightshift.db"
    shutil.copy(FIXTURE, db)
    con = sqlite3.connect(db)
    if version is None:
        con.execute("delete from keyvalue where key = 'schema_version'")
    else:
        con.execute("update keyvalue set value = ? where key = 'schema_version'", (version,))
    con.commit()
    con.close()
    before = dump(db)
    with pytest.raises(StoreError, match="schema is unknown; the store was not changed"):
        Store(url(db))
    assert dump(db) == before


def test_a_store_from_a_newer_release_is_refused_unchanged(tmp_path, home):
    """A revision this code does not know: a StoreError that says a newer release made it and
    what to do, the same message (exit 5, no traceback) from the CLI, and the file untouched."""
    db = home / "nightshift.db"
    Store(url(db)).engine.dispose()
    con = sqlite3.connect(db)
    con.execute("update alembic_version set version_num = '0099_from_the_future'")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(StoreError) as err:
        Store(url(db))
    assert "0099_from_the_future" in str(err.value)
    assert "newer release" in str(err.value) and "Upgrade nightshift" in str(err.value)
    assert db.read_bytes() == before
    r = nightshift("jobs", timeout=60)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    said = " ".join(r.stderr.split())  # one message, which the console wraps at its width
    assert said.startswith("error: the store at") and "0099_from_the_future" in said
    assert db.read_bytes() == before


# Several processes at once --------------------------------------------------------------------

RACER = r"""
import os, sys, time
from pathlib import Path
# Loaded before the barrier, so the processes race on the store and not on their imports.
import alembic.command, alembic.config, alembic.script, filelock
from nightshift.runtime.store.db import Job, Store
db, go, ready = sys.argv[1:4]
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.001)
store = Store(f"sqlite:///{db}")
with store.session() as s:
    s.add(Job(name=f"racer-{os.getpid()}", spec={}))
"""


@pytest.mark.parametrize("start", ["fresh", "release-0.1.0"])
def test_processes_opening_one_store_at_once_all_succeed_with_one_schema(tmp_path, start):
    """The first-use race: six processes released together open the same new (or old) store and
    each writes a job. All succeed; there is one schema, one alembic_version row, six jobs more."""
    db = tmp_path / "nightshift.db"
    if start != "fresh":
        shutil.copy(FIXTURE, db)
    go, n = tmp_path / "go", 6
    procs = [run_py(RACER, str(db), str(go), str(tmp_path / f"ready-{i}")) for i in range(n)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < n:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.communicate()[0] for p in procs if p.poll() is not None
        ]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, outs
    assert revisions(db) == [HEAD]
    con = sqlite3.connect(db)
    names = [name for (name,) in con.execute("select name from job order by id")]
    assert len([x for x in names if x.startswith("racer-")]) == n
    assert len(names) == n + (start != "fresh")
    assert schema_differences(Store(url(db))) == []


OPENER = r"""
import sys
from nightshift.runtime.store.db import Store
Store(f"sqlite:///{sys.argv[1]}")
"""


def test_opening_a_fresh_store_waits_for_the_migration_lock(tmp_path):
    """While another process holds <db>.migrate.lock, a store being opened waits (and does not
    build the schema around it); once the lock is free it goes on."""
    db = tmp_path / "nightshift.db"
    with locks.exclusive(tmp_path / "nightshift.db.migrate.lock"):
        proc = run_py(OPENER, str(db))
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()[0]
        assert not db.exists() or "alembic_version" not in ddl(db)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert revisions(db) == [HEAD]


def test_a_migration_lock_held_too_long_is_a_store_error(tmp_path):
    """Waiting on the migration lock ends after busy_timeout_s with a message naming the lock."""
    lock = tmp_path / "nightshift.db.migrate.lock"
    with locks.exclusive(lock), pytest.raises(StoreError, match=f"lock {lock} for more than"):
        Store(url(tmp_path / "nightshift.db"), busy_timeout_s=0.2)


# The lock module -------------------------------------------------------------------------------

TRY_LOCK = r"""
import sys
from nightshift.runtime import locks
from nightshift.runtime.errors import OperatorError
try:
    with locks.exclusive(sys.argv[1], timeout=float(sys.argv[2])):
        print("got it")
except OperatorError as exc:
    print(exc)
    sys.exit(3)
"""

HOLD_LOCK = r"""
import os, sys, time
from nightshift.runtime import locks
held = locks.try_exclusive(sys.argv[1])
assert held is not None
held.write_note(str(os.getpid()))
print("held", flush=True)
time.sleep(600)
"""


def test_exclusive_excludes_another_process(tmp_path):
    """A second process cannot take a held lock: it times out with the file named and how to
    find the holder; once released, it takes it."""
    lock = tmp_path / "x.lock"
    with locks.exclusive(lock):
        assert locks.is_held(lock)
        r = run_py(TRY_LOCK, str(lock), "0.3")
        out = r.communicate(timeout=60)[0]
        assert r.returncode == 3, out
        assert f"another process held the lock {lock} for more than 0.3s" in out
        assert f"fuser {lock}" in out
    r = run_py(TRY_LOCK, str(lock), "5")
    assert r.communicate(timeout=60)[0].strip() == "got it" and r.returncode == 0


def test_a_holder_killed_with_sigkill_releases_the_lock(tmp_path):
    """The kernel drops a killed holder's lock: its file stays, but nothing holds it."""
    lock = tmp_path / "daemon.lock"
    proc = run_py(HOLD_LOCK, str(lock))
    try:
        assert proc.stdout.readline().strip() == "held"
        assert locks.is_held(lock)
        assert locks.try_exclusive(lock) is None
        assert locks.note(lock) == str(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert lock.exists()
    assert not locks.is_held(lock)
    held = locks.try_exclusive(lock)
    assert held is not None
    held.release()
    held.release()  # twice is harmless


def test_is_held_is_false_for_a_stale_or_missing_file(tmp_path):
    """A lock file nobody holds (left by a killed holder, say) is not held; probing a missing
    one does not create it."""
    stale = tmp_path / "stale.lock"
    stale.write_text(str(os.getpid()))
    assert not locks.is_held(stale)
    assert stale.read_text() == str(os.getpid())
    missing = tmp_path / "missing.lock"
    assert not locks.is_held(missing) and not missing.exists()


def test_exclusive_excludes_within_one_process_too(tmp_path):
    """Locks belong to open files: a second taker in the same process waits like any other,
    and the timeout raises the error class asked for."""
    lock = tmp_path / "sub" / "x.lock"  # the folder is created
    with locks.exclusive(lock) as held:
        assert held.path == lock
        with pytest.raises(StoreError):
            with locks.exclusive(lock, timeout=0.1, error=StoreError):
                pass
        with pytest.raises(OperatorError):
            with locks.exclusive(lock, timeout=0):
                pass
    with locks.exclusive(lock, timeout=0):
        pass
