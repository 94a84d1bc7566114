"""Shared fixtures. No test may reach a remote host: sockets to anything but loopback fail."""

from __future__ import annotations

import ipaddress
import os
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

_real_connect = socket.socket.connect


def _loopback_only(self, address):  # noqa: ANN001
    host = address[0] if isinstance(address, tuple) else None
    if host is not None:
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise RuntimeError(f"tests may only talk to loopback, not {host}")
    return _real_connect(self, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh NIGHTSHIFT_HOME for this test, also seen by subprocesses."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(h))
    for key in list(os.environ):
        if key.startswith("NIGHTSHIFT_") and "__" in key:
            monkeypatch.delenv(key)
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "0.1")
    # The wait before a retry is 30 s by default (doubling); the waits are tested on their own
    # (test_backoff, test_placement), and a second here keeps every recovery test short.
    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "1")
    return h


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
        [sys.executable, "-m", "nightshift.agent.cli", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def need(module: str, why: str):
    """Import an optional dependency of a service-backed test: skip with the reason when it is
    missing, except in CI (CI=true), where .ci/run installs it and its absence is a failure."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is required in CI ({why}); .ci/run installs it")
        pytest.skip(
            f"{module} is not installed ({why}); `pip install torch==2.13.0` or see .ci/run"
        )


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
