"""The loop survives its environment: a full disk, a write lock held past the busy timeout and a
store file deleted under it are reported once, waited out with backoff and recovered from, while
runs go on; a call the store fails under after it started is never told as a plain failure."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from sqlalchemy import event
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.runtime.errors import CallInDoubt, DiskFull, StoreFull, StoreGone
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.store.db import AuditEvent, Job, Store

from conftest import REPO, store_row, tmpfs

SPEC = str(REPO / "examples/specs/quickstart.yaml")


# A store that fills up (SQLite's own max_page_count: a real SQLITE_FULL) ----------------------


@pytest.fixture
def full_store(home) -> Iterator[tuple[Client, dict[str, bool]]]:
    """A client whose store may not grow while `armed["on"]`, or, while `armed["at_job"]`, from
    the moment a job row is about to be inserted (that write, if it needs a page, fails)."""
    c = Client()
    armed = {"on": False, "at_job": False}

    @event.listens_for(c.w.store.engine, "checkout")
    def _limit(dbapi_conn, _record, _proxy):  # noqa: ANN001
        cur = dbapi_conn.cursor()
        if armed["on"]:
            pages = cur.execute("PRAGMA page_count").fetchone()[0]
            cur.execute(f"PRAGMA max_page_count={pages}")
        else:
            cur.execute("PRAGMA max_page_count=1073741823")
        cur.close()

    @event.listens_for(c.w.store.engine, "before_cursor_execute")
    def _at_job(conn, cursor, statement, *_: object) -> None:  # noqa: ANN001
        if armed["at_job"] and statement.lstrip().upper().startswith("INSERT INTO JOB"):
            cur = conn.connection.dbapi_connection.cursor()
            pages = cur.execute("PRAGMA page_count").fetchone()[0]
            cur.execute(f"PRAGMA max_page_count={pages}")
            cur.close()

    yield c, armed


# A long parameter makes each event that carries it need new pages rather than fit in free space.
BIG = {"seed": "7" * 6000}


def test_store_full_as_the_job_is_written_leaves_nothing_and_a_retry_queues_it_once(full_store):
    """The job row and the call's audit events commit in one transaction: the store filling up
    as the job is written leaves no job and no event of the call, so the caller is told a plain
    StoreFull (nothing is in doubt), and the retry with that call id queues the job once."""
    c, armed = full_store
    c.submit(SPEC, call_id="warm-up")
    armed["at_job"] = True
    with pytest.raises(StoreFull, match="database or disk is full") as caught:
        c.submit(SPEC, params=BIG, call_id="submit-1")
    assert not isinstance(caught.value, CallInDoubt)
    with c.w.store.session() as s:
        assert s.exec(select(Job.submitted_by_call)).all() == ["warm-up"]
        said = s.exec(select(AuditEvent).where(AuditEvent.call_id == "submit-1")).all()
    # Recorded afterwards on another connection: it started, and its rows were rolled back.
    assert [e.action for e in said] == ["policy.verdict", "skill.start", "skill.result"]
    assert said[-1].payload["ok"] is False and said[-1].payload["rolled_back"] is True

    armed["at_job"] = False  # space freed
    job_id = c.submit(SPEC, params=BIG, call_id="submit-1")
    with c.w.store.session() as s:
        assert s.exec(select(Job.id).where(Job.submitted_by_call == "submit-1")).all() == [job_id]
        results = s.exec(
            select(AuditEvent).where(
                AuditEvent.action == "skill.result", AuditEvent.call_id == "submit-1"
            )
        ).all()
    assert [r.payload.get("result", {}).get("already_submitted") for r in results] == [
        None,  # the rolled-back try
        False,  # the retry queued it, once
    ]
    assert c.w.audit.verify().ok


def test_store_full_before_the_call_started_is_a_plain_fault_and_queues_nothing(full_store):
    """Full from the start: the verdict cannot be recorded, nothing ran, so it is no doubt."""
    c, armed = full_store
    c.submit(SPEC, call_id="warm-up")  # the tables exist and have pages
    armed["on"] = True
    with pytest.raises(StoreFull, match="database or disk is full") as caught:
        c.submit(SPEC, params=BIG, call_id="submit-2")
    assert not isinstance(caught.value, CallInDoubt)
    with c.w.store.session() as s:
        assert s.exec(select(Job.submitted_by_call)).all() == ["warm-up"]


# A vanished store --------------------------------------------------------------------------------


def test_a_deleted_store_is_noticed_and_never_silently_made_again(tmp_path):
    """Open connections keep the unlinked file; a new one refuses to create a fresh, empty store
    at the path (mode=rw), and check_file says what happened."""
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}", busy_timeout_s=1)
    store.set_kv("k", "v")
    store.check_file()
    db.unlink()
    with pytest.raises(StoreGone, match=r"was deleted or replaced \(it is gone\)"):
        store.check_file()
    store.engine.dispose()  # every connection after this one is new
    with pytest.raises(StoreGone):
        store.get_kv("k")
    assert not db.exists()


def test_a_replaced_store_file_is_noticed(tmp_path):
    """A copy put in its place is another inode: not the store this process opened."""
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}", busy_timeout_s=1)
    store.set_kv("k", "v")
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    os.replace(copy, db)
    with pytest.raises(StoreGone, match="another file is there now"):
        store.check_file()


def test_the_loop_reports_a_vanished_store_once_backs_off_and_recovers(home):
    """Each step checks the file; while it is away the loop places nothing, says so once, waits
    longer each time, and says so again (and audits it) when the same file is back."""
    w = Wiring.load()
    lines: list[str] = []
    loop = w.loop
    loop.report = lines.append
    loop.fault_backoff = Backoff(base_s=0.05, factor=2, cap_s=0.2, jitter_frac=0)
    loop.step()  # a clean first step (health check, empty tick)
    db = home / "nightshift.db"
    away = home / "moved.db"
    db.rename(away)
    waits = []
    for _ in range(4):
        time.sleep(max(0.0, loop._retry_at - time.monotonic()))  # noqa: SLF001
        before = time.monotonic()
        loop.step()
        waits.append(loop._retry_at - before)  # noqa: SLF001
        retry_at = loop._retry_at  # noqa: SLF001
        loop.step()  # within the backoff: does nothing
        assert loop._retry_at == retry_at  # noqa: SLF001
    assert waits == pytest.approx([0.05, 0.1, 0.2, 0.2], abs=0.03)
    assert len(lines) == 1 and "was deleted or replaced (it is gone)" in lines[0]
    assert lines[0].startswith("warning: the loop cannot go on: the store file")
    assert isinstance(loop.fault, StoreGone)
    away.rename(db)
    time.sleep(0.25)
    loop.step()
    assert loop.fault is None and len(lines) == 2
    assert lines[1].startswith("recovered: the loop runs again; the fault (StoreGone) cleared")
    with w.store.session() as s:
        rec = s.exec(select(AuditEvent).where(AuditEvent.action == "loop.recovered")).one()
    assert rec.payload["fault"] == "StoreGone"


def test_a_programming_error_still_surfaces(home):
    """Only environment faults are waited out; a bug in a step is raised as before."""
    w = Wiring.load()

    def broken() -> None:
        raise KeyError("a bug")

    w.engine.tick = broken  # type: ignore[method-assign]
    with pytest.raises(KeyError):
        w.loop.step()
    assert w.loop.fault is None


def test_file_faults_are_told_as_such_and_other_errors_are_not(tmp_path):
    """ENOSPC writing a file names the file and the fix; a ValueError is no environment fault."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    full = store.fault_of(OSError(errno.ENOSPC, "No space left on device", "/x/log"))
    assert isinstance(full, DiskFull)
    assert str(full) == (
        "cannot write /x/log: No space left on device; free space on that filesystem "
        "(or raise the quota)"
    )
    assert store.fault_of(ValueError("bug")) is None
    assert store.fault_of(sqlite3.OperationalError("no such table: x")) is None


# A real daemon ----------------------------------------------------------------------------------


class DaemonProc:
    """`nightshift daemon` in a subprocess, its output collected line by line."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200", **env},
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in self.lines:
                if text in line:
                    return line
            assert self.proc.poll() is None, "the daemon died:\n" + "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@contextmanager
def daemon_with_job(home: Path, tmp_path: Path) -> Iterator[tuple[DaemonProc, Path, int]]:
    """A daemon with one long job running under it (runs outside the home); the job's process
    group is killed after."""
    spec = yaml.safe_load(Path(SPEC).read_text())
    spec["code"]["path"] = str(REPO / "examples")
    spec["environment"]["env"] = {}
    spec["parameters"]["steps"] = 1_000_000
    spec_file = tmp_path / "long.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {
        "NIGHTSHIFT_EXECUTOR__RUNS_DIR": str(tmp_path / "runs"),
        "NIGHTSHIFT_STORE__BUSY_TIMEOUT_S": "0.5",
    }
    os.environ.update(env)  # the in-test client sees the same settings
    handle = None
    d = None
    try:
        Client().submit(str(spec_file))
        d = DaemonProc(env)
        db = home / "nightshift.db"
        (raw,) = store_row(db, "select handle from attempt where state='running'", 15, d.proc)
        handle = json.loads(raw)
        store_row(db, "select 1 from metricpoint", 15, d.proc)  # the loop records progress
        yield d, db, handle["pid"]
    finally:
        if d is not None:
            d.stop()
        for key in env:
            os.environ.pop(key, None)
        if handle is not None:
            try:
                os.killpg(handle["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def running_job(home, tmp_path) -> Iterator[tuple[DaemonProc, Path, int]]:
    with daemon_with_job(home, tmp_path) as running:
        yield running


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_write_lock_held_past_the_busy_timeout_is_waited_out(running_job):
    """Another process holds BEGIN IMMEDIATE for 3 s (busy timeout 0.5 s): the daemon says so
    once, keeps living, the run keeps running, and it says when the lock is gone."""
    d, db, pid = running_job
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        line = d.wait_for("warning: the loop cannot go on")
        assert "stayed locked by another process past the busy timeout" in line
        time.sleep(2)
        assert d.proc.poll() is None and alive(pid)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    d.wait_for("recovered: the loop runs again; the fault (StoreLocked) cleared")
    assert sum("cannot go on" in ln for ln in d.lines) == 1
    assert "Traceback" not in "\n".join(d.lines)


def test_a_store_deleted_under_the_daemon_stops_new_work_and_is_not_recreated(running_job):
    """rm nightshift.db: the daemon notices at its next step, says what to do, stays up and
    writes nothing more; it never makes a new store at the path."""
    d, db, pid = running_job
    db.unlink()
    line = d.wait_for("warning: the loop cannot go on")
    assert f"the store file {db} was deleted or replaced (it is gone)" in line
    assert "Restore the file, or restart the daemon" in line
    time.sleep(1.5)
    assert d.proc.poll() is None and alive(pid)
    assert not db.exists()
    assert sum("cannot go on" in ln for ln in d.lines) == 1


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 16 MiB tmpfs (needs root and permission to mount)."""
    with tmpfs(tmp_path / "disk", "16m") as mnt:
        yield mnt


def test_a_full_disk_under_the_home_is_waited_out(home, small_disk, monkeypatch, tmp_path):
    """NIGHTSHIFT_HOME on a small disk that then fills: the daemon reports it once and lives,
    the run goes on, and the loop records again once space is freed."""
    home = small_disk / "home"
    home.mkdir()
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(home))
    with daemon_with_job(home, tmp_path) as (d, _db, pid):
        filler = small_disk / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        line = d.wait_for("warning: the loop cannot go on")
        assert "full" in line
        time.sleep(1)
        assert d.proc.poll() is None and alive(pid)
        filler.unlink()
        d.wait_for("recovered: the loop runs again")
        assert sum("cannot go on" in ln for ln in d.lines) == 1
        assert "Traceback" not in "\n".join(d.lines)
