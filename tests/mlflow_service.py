"""A real `mlflow server` for the tests marked `service`: the full `mlflow` package lives in a
venv of its own (.ci/mlflow.sh makes /opt/nightshift-mlflow; NIGHTSHIFT_TEST_MLFLOW names
another `mlflow` binary), never in nightshift's environment. Each server listens on 127.0.0.1
with one worker and MLflow's job execution off (README Services), stores its runs in SQLite (or
the PostgreSQL URL it is given) and serves artifacts itself (`--artifacts-destination`).

Where the binary is missing the tests skip with the reason, except under CI=true, where they
fail."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

DEFAULT_BIN = "/opt/nightshift-mlflow/bin/mlflow"


def mlflow_bin() -> Path:
    path = Path(os.environ.get("NIGHTSHIFT_TEST_MLFLOW") or DEFAULT_BIN)
    if not path.exists():
        why = f"no MLflow server at {path} (bash .ci/mlflow.sh, or NIGHTSHIFT_TEST_MLFLOW)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"MLflow is required in CI: {why}")
        pytest.skip(why)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MlflowServer:
    url: str
    port: int
    base: Path
    proc: subprocess.Popen

    @property
    def python(self) -> Path:
        """The server venv's interpreter: it has the `mlflow` client a job's program imports."""
        return mlflow_bin().parent / "python"


def start(base: Path, backend: str | None = None, port: int | None = None) -> MlflowServer:
    """Start a server (SQLite under `base` unless `backend` is given) and wait until it answers."""
    binary = mlflow_bin()
    base.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    backend = backend or f"sqlite:///{base / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = open(base / "server.log", "w")  # noqa: SIM115  # closed with the process
    proc = subprocess.Popen(
        [str(binary), "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--backend-store-uri", backend, "--artifacts-destination", str(base / "artifacts")]
        + ["--workers", "1"],
        cwd=base,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        if proc.poll() is not None or time.monotonic() > end:
            stop(proc)
            raise AssertionError(
                f"mlflow server did not start:\n{(base / 'server.log').read_text()[-4000:]}"
            )
        time.sleep(0.3)
    return MlflowServer(url, port, base, proc)


def stop(proc: subprocess.Popen) -> None:
    """The server and its worker (a process group of its own)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextlib.contextmanager
def served(
    base: Path, backend: str | None = None, port: int | None = None
) -> Iterator[MlflowServer]:
    server = start(base, backend, port)
    try:
        yield server
    finally:
        stop(server.proc)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[MlflowServer]:
    """One SQLite-backed server for a test module (tests keep apart by experiment name)."""
    with served(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture
def mlflow_served():
    """`served(base, backend=None, port=None)`: a server of the test's own, as a context."""
    mlflow_bin()
    return served
