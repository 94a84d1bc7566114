"""Shared fixtures, and the loopback guard: no test may reach a remote host.

The guard (tests/loopback_guard.py) covers the test process and every Python process it starts
(the CLI subprocesses, the training runs they launch), through a copy put first on PYTHONPATH for
the session as `sitecustomize.py`: a TCP or UDP connection to anything but 127.0.0.0/8, ::1 or
`localhost` is refused and written to a log, and an autouse fixture fails the test during which a
line appeared (even when the code under test swallowed the error). Unix sockets are fine. A
process started with a PYTHONPATH of its own that drops ours (the multi-user test's clients, which
run as other users with a minimal environment) is not covered; pip is exempt (it reaches the
package index by design, as `pip wheel` in test_packaging may).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import lifecycle_guard
import loopback_guard  # noqa: F401  (installs the guard in this process on import)
import pytest
import yaml

from nightshift.runtime.config import STANDARD_ENV

REPO = Path(__file__).resolve().parents[1]


def _install_guard() -> Path:
    """Put a copy of the guard first on PYTHONPATH as sitecustomize.py, for every process the
    tests start; it is already installed here (imported above). Returns the violations log."""
    folder = Path(tempfile.mkdtemp(prefix="nightshift-loopback-guard-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    folder.chmod(0o755)
    shutil.copyfile(Path(loopback_guard.__file__), folder / "sitecustomize.py")
    log = folder / "violations.log"
    log.touch()
    log.chmod(0o666)  # a process of the test's that runs as another user may still report
    os.environ[loopback_guard.LOG_VAR] = str(log)
    paths = [str(folder), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    return log


GUARD_LOG = _install_guard()


def _violations_since(offset: int) -> tuple[str, int]:
    with GUARD_LOG.open() as f:
        f.seek(offset)
        new = f.read()
    return new, offset + len(new.encode())


@pytest.fixture(autouse=True)
def _only_the_lifecycle_moves_jobs():
    """Fails a test during which our code wrote a job's state or an attempt's end anywhere but
    runtime/store/lifecycle.py (tests/lifecycle_guard.py)."""
    seen = len(lifecycle_guard.VIOLATIONS)
    yield
    new = lifecycle_guard.VIOLATIONS[seen:]
    if new:
        pytest.fail("state written outside the lifecycle:\n" + "\n".join(new), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`, pyproject's addopts) a module's tests stay on one
    worker, so a module-scoped fixture (a real eval run, a served daemon) is set up once; the
    service modules share a named group (`xdist_group("ray")`), so one Ray head, one dockerd
    and one PostgreSQL server serve them. Runs before xdist reads the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_GUARD_OFFSET] = GUARD_LOG.stat().st_size


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A test during which it, or a process it started, tried to reach a host that is not this
    one fails (its teardown errs for what happened after the call), even when the code under
    test swallowed the refusal."""
    report = yield
    if call.when in ("call", "teardown") and _GUARD_OFFSET in item.stash:
        new, item.stash[_GUARD_OFFSET] = _violations_since(item.stash[_GUARD_OFFSET])
        if new.strip() and report.outcome != "skipped":
            report.outcome = "failed"
            report.longrepr = f"non-loopback connection(s) during this test:\n{new}"
    return report


_GUARD_OFFSET = pytest.StashKey[int]()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh NIGHTSHIFT_HOME for this test, also seen by subprocesses."""
    h = tmp_path / "home"
    h.mkdir()
    use_home(monkeypatch, h)
    return h


def use_home(monkeypatch: pytest.MonkeyPatch, h: Path) -> None:
    """The environment of `home`, on `h`: a module-scoped fixture that fills a home once for
    its tests sets it up under `pytest.MonkeyPatch.context()`."""
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(h))
    for key in list(os.environ):
        if key.startswith("NIGHTSHIFT_") and "__" in key:
            monkeypatch.delenv(key)
    # No developer's model, Slack app or WeChat Work app.
    for key in STANDARD_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "0.1")
    # The wait before a retry is 30 s by default (doubling); the waits are tested on their own
    # (test_backoff, test_placement), and a second here keeps every recovery test short.
    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "1")


class Clock:
    """A clock that ticks one second per reading: deterministic timestamps."""

    def __init__(self) -> None:
        self.t = datetime(2026, 12, 2, 3, 0)

    def __call__(self) -> datetime:
        self.t += timedelta(seconds=1)
        return self.t


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 12, 2, 3, 0)


def nightshift(
    *args: str, env: dict | None = None, timeout: float = 180, **kw
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.entry", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


_MIGRATED: list[Path] = []


def empty_store(path: Path):
    """A fresh SQLite store at `path`, at the newest schema, for a unit test that needs an empty
    store and not its making: a copy of one this process migrated once. Migrating a new file
    takes a fifth of a second, a copy a hundredth; the migrations are tested on their own
    (test_store_migrations), and a store opened at HEAD is what every later open sees."""
    from nightshift.runtime.store.db import Store

    if not _MIGRATED:
        folder = Path(tempfile.mkdtemp(prefix="nightshift-empty-store-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        made = Store(f"sqlite:///{folder / 'empty.db'}")
        with made.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        made.engine.dispose()
        _MIGRATED.append(folder / "empty.db")
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED[0], path)
    return Store(f"sqlite:///{path}")


def need(module: str, why: str):
    """Import an optional dependency of a service-backed test: skip with the reason when it is
    missing, except in CI (CI=true), where .ci/run installs it and its absence is a failure."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is required in CI ({why}); .ci/run installs it")
        pytest.skip(f"{module} is not installed ({why}); .ci/run shows how it is installed")


def write_spec(
    tmp_path: Path,
    *,
    steps: int,
    env: dict[str, str] | None = None,
    file: str = "spec.yaml",
    params: dict | None = None,
    **top,
) -> Path:
    """The quickstart spec, pointed at the examples folder, with its own length, faults,
    parameters and top-level fields (name, stall_min, early_stopping, ...)."""
    spec = yaml.safe_load((REPO / "examples/specs/quickstart.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    spec["environment"]["env"] = env or {}
    spec["parameters"]["steps"] = steps
    spec["parameters"].update(params or {})
    spec.update(top)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(spec))
    return path


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of `size` mounted at `mnt` (a filesystem that really fills up; needs root and
    mount: the test is skipped, saying why, where it cannot be had)."""
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill ({res.stderr.decode().strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def run_skill(skill, ctx, args):
    """Run a skill's own function on parsed arguments, around the policy gate: for unit tests of
    a deterministic skill only (nightshift itself calls skills through `Gate.call`)."""
    return skill.fn(ctx, skill.parse(args))


def made_by_hand(store) -> None:
    """Count the jobs and attempts a test wrote straight into `store` (no gated call, no
    transition) as made before rows were audited, as in an upgraded store: `audit verify` and
    the engine's launch check then take only later rows to their events."""
    from sqlalchemy import func
    from sqlmodel import select

    from nightshift.runtime.store.db import Attempt, Job
    from nightshift.runtime.store.transition_events import ROWS_AFTER_ATTEMPT, ROWS_AFTER_JOB

    with store.session() as s:
        top_job = s.exec(select(func.max(Job.id))).one() or 0
        top_attempt = s.exec(select(func.max(Attempt.id))).one() or 0
    store.set_kv(ROWS_AFTER_JOB, str(top_job))
    store.set_kv(ROWS_AFTER_ATTEMPT, str(top_attempt))


def store_row(db: Path, query: str, timeout: float = 60.0, proc: subprocess.Popen | None = None):
    """Poll a nightshift store until `query` returns a row (failing early if `proc`, the
    nightshift process being watched, ends first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"nightshift ended early:\n{out[-4000:]}")
        try:
            got = sqlite3.connect(db).execute(query).fetchone() if db.exists() else None
        except sqlite3.OperationalError:
            got = None
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {query}")


def reproduce_goal(folder: Path, job_id: int) -> Path:
    """A goal file that reproduces `job_id` and watches the new job to its end."""
    goal = folder / "again.yaml"
    steps = [
        {"id": "r", "skill": "reproduce_job", "args": {"job_id": job_id}},
        {"watch": "${r.job_id}"},
    ]
    goal.write_text(yaml.safe_dump({"name": "again", "steps": steps}))
    return goal


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonRun:
    """A real `nightshift daemon` process; `output` is what it printed, once it has stopped."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output = ""

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def running_daemon(env: dict[str, str]) -> Iterator[DaemonRun]:
    """The daemon with `env`, stopped (SIGTERM) and its output read when the block ends."""
    run = DaemonRun(env)
    try:
        yield run
    finally:
        run.proc.terminate()
        run.output, _ = run.proc.communicate(timeout=30)
