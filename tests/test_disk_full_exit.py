"""A run that fills its disk ends as an exit with its code, diagnosed disk_full, never as a lost
(SIGKILLed) run: on a real full filesystem (a 1 MiB tmpfs, mounted here as root), the supervisor
records the exit in the space it reserved at launch and says in the run's log why."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.runtime.executors.local_executor import LocalExecutor
from nightshift.runtime.executors.supervise import RESERVE_BYTES, reserve_file
from nightshift.runtime.store.db import Attempt
from nightshift.skills.diagnose_failure import DiagnoseFailureInput, diagnose_failure

from conftest import tmpfs

# Fills the folder it is given until the disk refuses, then fails as a training program does
# (no braces: it is also a spec's command template).
FILL = """
import sys
with open(sys.argv[1] + "/fill", "wb") as f:
    try:
        while True:
            f.write(b"x" * 65536)
            f.flush()
    except OSError as exc:
        print("OSError:", exc, file=sys.stderr, flush=True)
        sys.exit(1)
"""


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a filesystem that really fills up (needs root and mount)."""
    with tmpfs(tmp_path / "tiny", "1m") as mnt:
        yield mnt


def wait_ended(ex: LocalExecutor, handle: dict, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = ex.poll(handle)
        if status.state != "running":
            return status
        time.sleep(0.05)
    raise AssertionError("the run did not end")


def diagnose(log_path: str, exit_code: int | None, signal: int | None = None):
    inp = DiagnoseFailureInput(log_path=log_path, exit_code=exit_code, signal=signal)
    return diagnose_failure.fn(None, inp)  # type: ignore[arg-type]


def test_the_exit_is_recorded_when_the_disk_is_full(tiny_disk: Path) -> None:
    """Exit files, log and the program's output all on the disk it fills: the exit record goes
    into the reserved space, the log says why, and the diagnosis is disk_full."""
    ex = LocalExecutor(tiny_disk / "runs")
    log = tiny_disk / "run.log"
    handle = ex.start(
        LaunchRequest(
            key="fills",
            argv=[sys.executable, "-c", FILL, str(tiny_disk)],
            cwd=str(tiny_disk),
            log_path=str(log),
        )
    )
    status = wait_ended(ex, handle)
    assert status.state == "exited" and status.exit_code == 1 and status.signal is None, status
    assert "on a full disk: [Errno 28] No space left on device" in (status.detail or "")
    assert "nightshift supervise: the run exited with code 1 on a full disk" in log.read_text()
    assert not Path(reserve_file(handle["exit_file"])).exists()
    verdict = diagnose(str(log), status.exit_code)
    assert verdict.category == "disk_full" and verdict.confidence == "high", verdict


def test_a_job_that_fills_its_disk_fails_as_an_exit_diagnosed_disk_full(
    home: Path, tiny_disk: Path, monkeypatch
) -> None:
    """Through the real loop: the store is elsewhere, the job's folder (its log, and the
    executor's exit files) on the disk the program fills. The attempt exited with code 1 (not
    lost, no signal), the job failed saying why, and diagnose_failure reads disk_full."""
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__RUNS_DIR", str(tiny_disk))
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "none")
    w = Wiring.load()
    spec = {
        "name": "fills-its-disk",
        "command": ["{python}", "-c", FILL, "{run_dir}"],
        "retries": 0,
    }
    job = Client(w).submit(spec=spec)
    assert w.engine.run_until_settled([job], deadline_s=60) == {job: "failed"}
    with w.store.session() as s:
        (att,) = s.exec(select(Attempt).where(Attempt.job_id == job)).all()
    assert (att.state, att.outcome, att.exit_code, att.signal) == ("exited", "failed", 1, None)
    assert "on a full disk" in (w.store.job(job).reason or "")
    result = Client(w).call(
        "diagnose_failure",
        {"log_path": att.log_path, "exit_code": att.exit_code, "signal": att.signal},
    )
    assert result.category == "disk_full", result  # type: ignore[attr-defined]


def test_a_record_left_in_the_reserve_is_read(tmp_path: Path) -> None:
    """Where even the rename found no room, the reserve holds the record; zeros (a supervisor
    killed before it wrote one) are no record: the run is lost."""
    ex = LocalExecutor(tmp_path / "runs")
    handle = ex.start(
        LaunchRequest(
            key="quick",
            argv=[sys.executable, "-c", "pass"],
            cwd=str(tmp_path),
            log_path=str(tmp_path / "quick.log"),
        )
    )
    assert wait_ended(ex, handle).exit_code == 0
    while ex._supervisor_alive(ex._handle(handle)):  # noqa: SLF001 - it records, then exits
        time.sleep(0.02)
    exit_file = Path(handle["exit_file"])
    exit_file.unlink()
    reserve = Path(reserve_file(str(exit_file)))
    reserve.write_bytes(b"\0" * RESERVE_BYTES)
    assert ex.poll(handle).state == "lost"
    record = {"exit_code": 3, "signal": None, "detail": "the run exited with code 3 on a full disk"}
    reserve.write_bytes(json.dumps(record).encode())
    status = ex.poll(handle)
    assert (status.state, status.exit_code, status.detail) == ("exited", 3, record["detail"])
