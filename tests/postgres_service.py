"""A private PostgreSQL server for the tests marked `service`: Debian's `postgresql` package
(.ci/run installs it), `initdb` and `pg_ctl` run as the `postgres` user with a data folder and a
socket folder of this session's own, listening on 127.0.0.1 only, stopped by `pg_ctl stop` (and
its PID) at the end. Each test gets a database of its own: `postgres_url`.

Whatever cannot be had (not root, no postgres user, no server binaries) skips the tests that need
it with the reason, except under CI=true, where it fails them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import need


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI ({why}); .ci/run installs it")
    pytest.skip(f"no PostgreSQL server: {why}")


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    port: int
    base: Path
    bin_dir: Path

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f'CREATE DATABASE "{name}"')
        return name

    def psql(self, sql: str) -> str:
        done = subprocess.run(
            [str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
            + ["-d", "postgres", "-tA", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {done.stderr}")
        return done.stdout


def _as_postgres(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "postgres", "--", *argv], **kw)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    need("psycopg", "the store's PostgreSQL driver (pip install 'nightshift[postgres]')")
    bin_dir = _bin_dir()
    if bin_dir is None:
        _missing("no /usr/lib/postgresql/*/bin/pg_ctl (apt-get install postgresql)")
    assert bin_dir is not None
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        _missing("initdb must run as the postgres user: needs root and runuser")
    try:
        pg = pwd.getpwnam("postgres")
    except KeyError:
        _missing("no postgres user")
    base = Path(tempfile.mkdtemp(prefix="ns-pg-"))
    os.chown(base, pg.pw_uid, pg.pw_gid)
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    os.chown(sockets, pg.pw_uid, pg.pw_gid)
    port = _free_port()
    init = _as_postgres(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if init.returncode != 0:
        _missing(f"initdb failed: {init.stderr.strip()[-500:]}")
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={sockets} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    start = _as_postgres(
        [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "log"), "-w"]
        + ["start"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if start.returncode != 0:
        log = (base / "log").read_text() if (base / "log").exists() else ""
        _missing(f"pg_ctl start failed: {start.stderr.strip()} {log[-500:]}")
    server = PostgresServer(port=port, base=base, bin_dir=bin_dir)
    try:
        yield server
    finally:
        pid_file = data / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        _as_postgres(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.url(postgres_server.create_database())
