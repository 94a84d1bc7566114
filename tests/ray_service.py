"""A private Ray head for the tests marked `service` that run jobs on Ray; nothing downloaded.

`ray start --head` (the `ray[default]` package: its dashboard serves the Jobs API) is started once
for the test session, on 127.0.0.1 only, with two CPUs, its own ports (picked free, outside Ray's
worker port range), its own temporary folder (short: Ray's Unix sockets live under it), usage
statistics off, nothing that asks the network where it runs (see `_head_env`), and two logical
GPUs read through a stand-in nvidia-smi (`_fake_nvidia_smi`). Every process
it starts inherits a marker in its environment (the head's own processes, the workers the raylet
forks, the job drivers and Ray's watchers of them), so at the end all of them are found and
stopped by PID with SIGKILL (what `ray stop --force` sends). Not `ray stop` itself, which stops
every Ray process of this user on the machine by name, other sessions' heads included. For the
session, $RAY_ADDRESS and $RAY_API_SERVER_ADDRESS are unset: Ray's SDK prefers them to the
address it is given.

Without Ray the tests that need it are skipped with the reason, except under CI=true, where they
fail (.ci/run installs it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import need

MARKER_ENV = "NIGHTSHIFT_TEST_RAY_HEAD"
_START_TIMEOUT_S = 120.0
_READY_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 10.0
_OBJECT_STORE_BYTES = 100 * 1024**2  # the tests put nothing in it; Ray's default is 30% of RAM
# Ray's workers take ports 10002-19999 unless told otherwise; the OS hands out free ports from its
# ephemeral range (32768 and up on Linux), so the ones picked here never collide with them.
_NOT_BELOW_PORT = 20000


@dataclass
class RayHead:
    """A running private Ray head: its dashboard (Jobs API) address, and its folder."""

    address: str
    gcs_address: str
    temp_dir: Path
    marker: str
    smi_state: Path  # what the head's fake nvidia-smi reports: "ok", or "lost"

    def pids(self) -> list[int]:
        """The live processes of this head (the marker in their environment)."""
        return _marked(self.marker)

    def pss_mib(self) -> float:
        """The proportional memory of this head's processes together, in MiB."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
            except (OSError, ValueError):
                continue
        return total / 1024


def _free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= _NOT_BELOW_PORT:
            return port


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries MARKER_ENV=marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no output)"


def _stop(marker: str) -> None:
    """SIGKILL every process of the head by PID, as `ray stop --force` does by name (its gcs_server
    lingers for half a minute after a SIGTERM); again until none is left, in case one was forking."""
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        pids = _marked(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _fake_nvidia_smi(bin_dir: Path, state: Path) -> None:
    """The head has no GPUs: its two logical ones (--num-gpus=2) are read through a stand-in
    nvidia-smi on its PATH that answers from a real capture (tests/fake_nvidia_smi.py)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).parent / "fake_nvidia_smi.py"
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
        f'{shlex.quote(str(state))} "$@"\n'
    )
    wrapper.chmod(0o755)
    state.write_text("ok\n")


def _head_env(marker: str, home: Path) -> dict[str, str]:
    """The head's environment: ours (the loopback guard's PYTHONPATH included), the marker, usage
    statistics off, and a HOME of its own whose `ray_bootstrap_config.yaml` (an empty cluster
    config) keeps the dashboard from asking the cloud metadata address (169.254.169.254) which
    cloud it runs on, which it does at start even with usage statistics off."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env.update(
        {
            MARKER_ENV: marker,
            "HOME": str(home),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_USAGE_STATS_PROMPT_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
            "PATH": f"{home.parent / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    return env


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    """A private Ray head for the whole session, its Jobs API ready and one job run through it
    (so the first test does not pay for the first worker); stopped by PID at the end."""
    need(
        "ray.job_submission",
        "the Ray executor's tests start a Ray head: pip install 'ray[default]'",
    )
    from ray.job_submission import JobSubmissionClient

    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        pytest.fail("the `ray` command of the ray package is not on PATH", pytrace=False)
    # Short: Ray's Unix socket paths (under the session folder) must stay under 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="nsray-", dir="/tmp"))
    marker = temp_dir.name
    ports = {
        "--port": _free_port(),
        "--dashboard-port": _free_port(),
        "--dashboard-agent-listen-port": _free_port(),
        "--ray-client-server-port": _free_port(),
    }
    cmd = [
        ray,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        "--num-cpus=2",
        "--num-gpus=2",
        "--disable-usage-stats",
        f"--object-store-memory={_OBJECT_STORE_BYTES}",
        f"--temp-dir={temp_dir}",
        *(f"{opt}={port}" for opt, port in ports.items()),
    ]
    log = temp_dir / "ray-start.log"
    head = RayHead(
        address=f"http://127.0.0.1:{ports['--dashboard-port']}",
        gcs_address=f"127.0.0.1:{ports['--port']}",
        temp_dir=temp_dir,
        marker=marker,
        smi_state=temp_dir / "nvidia-smi-state",
    )
    _fake_nvidia_smi(temp_dir / "bin", head.smi_state)
    env = pytest.MonkeyPatch()
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.delenv(var, raising=False)
    try:
        with log.open("ab") as out:
            try:
                done = subprocess.run(
                    cmd,
                    env=_head_env(marker, temp_dir / "home"),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    timeout=_START_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"`ray start` took over {_START_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        if done.returncode != 0:
            pytest.fail(f"`ray start` failed (exit code {done.returncode}):\n{_tail(log)}")
        ready, last = False, None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        for n in range(10**6):
            if time.monotonic() > deadline:
                break
            try:
                client = JobSubmissionClient(head.address)
                # The agent that runs jobs answers later than the dashboard: run one through it.
                sid = client.submit_job(entrypoint="exit 0", submission_id=f"{marker}-ready-{n}")
                while not (status := client.get_job_status(sid)).is_terminal():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"a job of `exit 0` is still {status}")
                    time.sleep(0.1)
                if status != "SUCCEEDED":
                    raise RuntimeError(
                        f"a job of `exit 0` ended {status}: {client.get_job_logs(sid)}"
                    )
                ready = True
                break
            except Exception as exc:  # noqa: BLE001 - not up yet; the last error is reported
                last = exc
                time.sleep(0.5)
        if not ready:
            pytest.fail(
                f"the Ray Jobs API at {head.address} was not ready within "
                f"{_READY_TIMEOUT_S:.0f} s ({last}):\n{_tail(log)}"
            )
        yield head
    finally:
        _stop(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
        env.undo()
