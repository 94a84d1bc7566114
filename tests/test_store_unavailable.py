"""A team's PostgreSQL store restarted under nightshift (tests/postgres_service.py runs a real
server on loopback, stopped and started here): a store call during the outage is StoreUnavailable,
the loop reports the fault once and runs again when the server is back, the daemon lives through
it, the CLI says so in one line (through the daemon's socket too), and a pooled connection that
the restart closed is replaced before use, not handed to a caller."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError

from nightshift.agent.brain.wiring import Wiring
from nightshift.runtime.errors import StoreUnavailable
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.store.db import Job, Store
from nightshift.runtime.store.unreachable import is_unreachable

from conftest import REPO, DaemonRun

pytestmark = pytest.mark.xdist_group("postgres")
pytest_plugins = ["postgres_service"]
service = pytest.mark.service  # the tests that need the server


class PgError(Exception):
    """What psycopg raises: a message, and the server's SQLSTATE (None: the client's own)."""

    def __init__(self, text: str, sqlstate: str | None = None):
        super().__init__(text)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (OperationalError("x", {}, PgError("terminating connection due to admin", "57P01")), True),
        (OperationalError("x", {}, PgError("the database system is starting up", "57P03")), True),
        (OperationalError("x", {}, PgError("connection failed: Connection refused")), True),
        (OperationalError("x", {}, PgError("server closed the connection unexpectedly")), True),
        (InterfaceError("x", {}, PgError("the connection is closed")), True),
        (DisconnectionError("pool"), True),
        (OperationalError("x", {}, PgError("password authentication failed for user")), False),
        (OperationalError("x", {}, PgError('database "t" does not exist', "3D000")), False),
        (OperationalError("x", {}, PgError("canceling statement: lock timeout", "55P03")), False),
        (OperationalError("x", {}, sqlite3.OperationalError("database is locked")), False),
        (OperationalError("x", {}, Exception("Lock wait timeout exceeded")), False),  # MySQL
        (ValueError("a bug"), False),
    ],
)
def test_what_counts_as_a_server_that_cannot_be_reached(tmp_path, error, unreachable) -> None:
    """A server away (refused, terminated, starting or stopping) is StoreUnavailable; the
    configuration (a password, a database name), a lock and SQLite's faults are not."""
    assert is_unreachable(error) is unreachable
    fault = Store(f"sqlite:///{tmp_path / 's.db'}").fault_of(error)
    assert isinstance(fault, StoreUnavailable) is unreachable


def pg_ctl(server, *args: str) -> None:
    """`pg_ctl` on the session's server; `restart` on a stopped server starts it with the options
    it last ran with (its postmaster.opts)."""
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", str(server.bin_dir / "pg_ctl")]
        + ["-D", str(server.base / "data"), "-l", str(server.base / "log"), "-w", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def outage(postgres_server) -> Iterator[dict[str, Callable[[], None]]]:
    """`outage["stop"]()` stops the server (fast: its sessions are terminated),
    `outage["start"]()` starts it again, `outage["restart"]()` does both at once; it is running
    after the test whatever happened."""
    state = {"down": False}

    def stop() -> None:
        pg_ctl(postgres_server, "-m", "fast", "stop")
        state["down"] = True

    def start() -> None:
        pg_ctl(postgres_server, "restart")
        state["down"] = False

    def restart() -> None:
        pg_ctl(postgres_server, "-m", "fast", "restart")

    yield {"stop": stop, "start": start, "restart": restart}
    if state["down"]:
        start()


@service
def test_store_calls_during_an_outage_are_store_unavailable(postgres_url, outage) -> None:
    store = Store(postgres_url)
    store.set_kv("k", "v")  # the pool now holds a connection the stop will close
    outage["stop"]()
    calls = {
        "get_kv": lambda: store.get_kv("k"),
        "set_kv": lambda: store.set_kv("k", "w"),
        "session": lambda: store.job(1),
        "attempts": lambda: store.attempts(1),
    }
    for name, call in calls.items():
        with pytest.raises(StoreUnavailable) as caught:
            call()
        said = str(caught.value)
        assert said.startswith(f"the store at {postgres_url} cannot be reached"), (name, said)
        assert "retry the command once the server answers again" in said
    # What a raw engine (Alembic's, Optuna's) raises is recognised as the same fault.
    with pytest.raises(Exception) as raw:
        create_engine(postgres_url).connect()
    assert isinstance(store.fault_of(raw.value), StoreUnavailable)
    outage["start"]()
    assert store.get_kv("k") == "v"


@service
def test_a_restart_between_calls_is_not_seen_by_the_next_call(postgres_url, outage) -> None:
    """The pool's connection died with the restart; the next call gets a fresh one (pre-ping)
    instead of failing once with "terminating connection due to administrator command"."""
    store = Store(postgres_url)
    store.set_kv("k", "v")
    outage["stop"]()
    outage["start"]()
    assert store.get_kv("k") == "v"
    with store.session() as s:
        assert s.exec(text("select 1")).scalar_one() == 1  # type: ignore[call-overload]


@service
def test_a_password_is_not_shown(postgres_server, outage) -> None:
    url = postgres_server.url("nowhere").replace("postgres@", "postgres:hunter2@")
    outage["stop"]()
    with pytest.raises(StoreUnavailable) as caught:
        Store(url)
    assert "hunter2" not in str(caught.value) and "postgres:***@" in str(caught.value)


@service
def test_the_loop_waits_out_the_outage_and_runs_again(home, monkeypatch, postgres_url, outage):
    monkeypatch.setenv("NIGHTSHIFT_STORE__URL", postgres_url)
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "none")
    w = Wiring.load()
    lines: list[str] = []
    loop = w.loop
    loop.report = lines.append
    loop.fault_backoff = Backoff(base_s=0.05, factor=2, cap_s=0.2, jitter_frac=0)
    loop.step()
    outage["stop"]()
    for _ in range(5):
        time.sleep(max(0.0, loop._retry_at - time.monotonic()))  # noqa: SLF001
        loop.step()  # no exception: the fault is waited out
    assert isinstance(loop.fault, StoreUnavailable)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"warning: the loop cannot go on: the store at {postgres_url} cannot be reached"
    )
    outage["start"]()
    time.sleep(0.25)
    loop.step()
    assert loop.fault is None
    assert lines[1].startswith("recovered: the loop runs again; the fault (StoreUnavailable)")
    with w.store.session() as s:
        assert s.get(Job, 1) is None  # the store answers again


# A real daemon, the real CLI ------------------------------------------------------------------


def whoami(sock: Path) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(sock))
        s.sendall(b'{"op": "whoami"}\n')
        return json.loads(s.makefile("rb").readline())


class Daemon(DaemonRun):
    """The daemon, its output read line by line as it comes."""

    def __init__(self, env: dict[str, str]):
        super().__init__(env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def serving(self, sock: Path, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, "the daemon died:\n" + "\n".join(self.lines)
            try:
                whoami(sock)
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"no API on {sock}:\n" + "\n".join(self.lines))

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in self.lines:
                if text in line:
                    return line
            assert self.proc.poll() is None, "the daemon died:\n" + "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}:\n" + "\n".join(self.lines))


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@service
def test_the_daemon_and_its_clients_live_through_a_restart(tmp_path, postgres_url, outage):
    run = Path(tempfile.mkdtemp(prefix="ns-api-", dir="/tmp"))  # a socket path under 108 bytes
    sock = run / "api.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env.update(
        NIGHTSHIFT_HOME=str(tmp_path / "home"),
        NIGHTSHIFT_STORE__URL=postgres_url,
        NIGHTSHIFT_API__SOCKET=str(sock),
        NIGHTSHIFT_GPU__PROBE="none",
        NIGHTSHIFT_LOOP__POLL_INTERVAL_S="0.1",
        COLUMNS="200",
        # A root daemon serving a socket outside its home runs jobs as their submitters (the
        # OS accounts of test_jobs_as_submitters.py); these tests are about the socket.
        NIGHTSHIFT_EXECUTOR__RUN_AS="daemon",
    )
    client = {**env, "NIGHTSHIFT_API__MODE": "client"}  # through the daemon's socket
    d = Daemon(env)
    try:
        d.serving(sock)
        assert cli(client, "jobs").returncode == 0
        outage["stop"]()
        line = d.wait_for("warning: the loop cannot go on")
        assert f"the store at {postgres_url} cannot be reached" in line
        for who in (client, env):  # through the socket, and straight to the store
            r = cli(who, "jobs")
            assert r.returncode == 5, r.stdout + r.stderr
            assert r.stderr.startswith(f"error: the store at {postgres_url} cannot be reached")
            assert "Traceback" not in r.stdout + r.stderr
            assert r.stderr.count("error:") == 1, r.stderr  # one error, wrapped to the terminal
        time.sleep(1.5)  # several steps meet the outage
        outage["start"]()
        d.wait_for("recovered: the loop runs again; the fault (StoreUnavailable)")
        assert cli(client, "jobs").returncode == 0
        assert sum("cannot go on" in ln for ln in d.lines) == 1, d.lines
        outage["restart"]()  # `pg_ctl restart` while the loop steps: nothing for anyone to do
        time.sleep(1.5)
        assert cli(client, "jobs").returncode == 0
        assert d.proc.poll() is None
        assert "Traceback" not in "\n".join(d.lines)
    finally:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            d.proc.wait(timeout=30)
        shutil.rmtree(run, ignore_errors=True)
