"""The local executor against real processes: exit codes, logs, stop, idempotency, re-attach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nightshift.runtime.errors import OperatorError
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.local_executor import LocalExecutor

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def request(tmp_path: Path, key: str, argv: list[str], **kw: object) -> LaunchRequest:
    return LaunchRequest(
        key=key, argv=argv, cwd=str(tmp_path), log_path=str(tmp_path / "logs" / f"{key}.log"), **kw
    )


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def wait_exit(ex: LocalExecutor, handle: dict, timeout: float = 10.0) -> RunStatus:
    wait_for(lambda: ex.poll(handle).state != "running", timeout)
    return ex.poll(handle)


@pytest.fixture
def ex(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(tmp_path / "runs")


def test_exit_codes_are_recorded(ex: LocalExecutor, tmp_path: Path) -> None:
    """The exit code is what recovery decides on, so both success and failure must be recorded."""
    ok = ex.start(request(tmp_path, "ok", py("pass")))
    bad = ex.start(request(tmp_path, "bad", py("import sys; sys.exit(3)")))
    # (the record also names the program's pid, which diagnose_failure reads)
    assert wait_exit(ex, ok).model_copy(update={"pid": None}) == RunStatus(
        state="exited", exit_code=0
    )
    assert wait_exit(ex, bad).model_copy(update={"pid": None}) == RunStatus(
        state="exited", exit_code=3
    )
    record = json.loads(Path(bad["exit_file"]).read_text())
    assert isinstance(record.pop("pid"), int)  # the program's, for the diagnosis
    assert record == {"exit_code": 3, "signal": None}


def test_logs_capture_stdout_and_stderr_tail(ex: LocalExecutor, tmp_path: Path) -> None:
    """Metrics parsing and failure diagnosis read the log, so both streams must land in it."""
    h = ex.start(
        request(
            tmp_path,
            "logs",
            py("""
        import sys
        for i in range(5000):
            print(f"step {i}")
        print("boom", file=sys.stderr)
    """),
        )
    )
    wait_exit(ex, h)
    assert ex.logs(h, tail=2) == "step 4999\nboom\n"
    assert ex.logs(h, tail=0) == ""
    assert len(ex.logs(h, tail=10_000).splitlines()) == 5001


def test_stop_sends_sigterm_first(ex: LocalExecutor, tmp_path: Path) -> None:
    """A training script gets SIGTERM first so it can save a checkpoint; the signal is recorded."""
    ready = tmp_path / "ready"
    h = ex.start(
        request(
            tmp_path,
            "sleepy",
            py(f"""
        import pathlib, time
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
    """),
        )
    )
    wait_for(ready.exists)
    t0 = time.monotonic()
    status = ex.stop(h, grace_s=5)
    assert status.model_copy(update={"pid": None}) == RunStatus(
        state="exited", signal=signal.SIGTERM
    )
    assert time.monotonic() - t0 < 3
    assert ex.stop(h, grace_s=1) == status  # stopping an ended run is harmless


def test_stop_kills_a_run_that_ignores_sigterm(ex: LocalExecutor, tmp_path: Path) -> None:
    """A hung or TERM-ignoring process must still end, with SIGKILL after the grace period."""
    ready = tmp_path / "ready"
    h = ex.start(
        request(
            tmp_path,
            "stubborn",
            py(f"""
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
    """),
        )
    )
    wait_for(ready.exists)
    t0 = time.monotonic()
    status = ex.stop(h, grace_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert status.state == "exited" and status.signal == signal.SIGKILL
    assert ex.poll(h).state == "exited"


def test_start_is_idempotent_on_key(ex: LocalExecutor, tmp_path: Path) -> None:
    """A replayed graph node must never launch the same attempt twice."""
    counter = tmp_path / "counter"
    req = request(tmp_path, "once", py(f"open({str(counter)!r}, 'a').write('x\\n')"))
    first = ex.start(req)
    second = ex.start(req)
    again = LocalExecutor(tmp_path / "runs").start(req)
    assert first == second == again
    wait_exit(ex, first)
    time.sleep(0.2)
    assert counter.read_text() == "x\n"
    assert ex.find("once") == first
    assert ex.find("never-started") is None


def test_reattach_from_another_process(ex: LocalExecutor, tmp_path: Path) -> None:
    """A restarted daemon must see a run it did not start as running, then learn its exit code."""
    go = tmp_path / "go"
    ex.start(
        request(
            tmp_path,
            "long",
            py(f"""
        import os, sys, time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
        sys.exit(7)
    """),
        )
    )
    probe = textwrap.dedent(f"""
        import json
        from nightshift.runtime.executors.local_executor import LocalExecutor
        ex = LocalExecutor({str(tmp_path / "runs")!r})
        h = ex.find("long")
        print(json.dumps(ex.poll(h).model_dump()))
    """)

    def poll_elsewhere() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
        )
        return json.loads(out.stdout)

    assert poll_elsewhere()["state"] == "running"
    go.touch()
    wait_for(lambda: ex.poll(ex.find("long")).state == "exited")
    elsewhere = poll_elsewhere()
    assert isinstance(elsewhere.pop("pid"), int) and elsewhere.pop("cgroup_memory") is None
    assert elsewhere.pop("descendants") == []  # a python program that started no process
    assert elsewhere == {
        "state": "exited",
        "exit_code": 7,
        "signal": None,
        "detail": None,
        "leftovers": [],
    }


def test_sigkill_of_the_whole_group_is_lost(ex: LocalExecutor, tmp_path: Path) -> None:
    """kill -9 or a reboot leaves no exit record; that must read as lost, not as success."""
    ready = tmp_path / "ready"
    h = ex.start(
        request(
            tmp_path,
            "victim",
            py(f"""
        import pathlib, time
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
    """),
        )
    )
    wait_for(ready.exists)
    assert ex.poll(h).state == "running"
    os.killpg(h["pgid"], signal.SIGKILL)
    status = wait_exit(ex, h)
    assert status.state == "lost" and "SIGKILL" in (status.detail or "")


def test_a_recycled_pid_is_not_our_run(ex: LocalExecutor, tmp_path: Path) -> None:
    """A pid reused by another process after a reboot must not make a dead run look alive."""
    h = ex.start(request(tmp_path, "short", py("pass")))
    wait_exit(ex, h)
    Path(h["exit_file"]).unlink()
    impostor = {**h, "pid": os.getpid(), "pgid": os.getpid(), "start_time": 1}
    assert ex.poll(impostor).state == "lost"


def test_cuda_visible_devices_follow_the_request(ex: LocalExecutor, tmp_path: Path) -> None:
    """A run may only see the GPUs it was placed on; [] must hide every GPU."""
    show = py("""
        import os
        print(repr(os.environ["CUDA_VISIBLE_DEVICES"]), os.environ["NIGHTSHIFT_RUN_KEY"],
              os.environ["EXTRA"])
    """)
    two = ex.start(
        request(
            tmp_path, "two", show, gpus=[0, 2], env={"EXTRA": "yes", "CUDA_VISIBLE_DEVICES": "5"}
        )
    )
    none = ex.start(request(tmp_path, "none", show, env={"EXTRA": "no"}))
    wait_exit(ex, two)
    wait_exit(ex, none)
    assert ex.logs(two).strip() == "'0,2' two yes"
    assert ex.logs(none).strip() == "'' none no"


def test_missing_program_or_cwd_is_an_operator_error(ex: LocalExecutor, tmp_path: Path) -> None:
    """A typo in a spec must fail at start with the path named, not as a mysterious lost run."""
    with pytest.raises(OperatorError, match="no-such-trainer"):
        ex.start(request(tmp_path, "a", ["no-such-trainer", "--lr", "1"]))
    with pytest.raises(OperatorError, match="missing/train.sh"):
        ex.start(request(tmp_path, "b", ["./missing/train.sh"]))
    gone = tmp_path / "not-here"
    with pytest.raises(OperatorError, match=str(gone)):
        ex.start(
            LaunchRequest(key="c", argv=py("pass"), cwd=str(gone), log_path=str(tmp_path / "c.log"))
        )
    assert ex.find("a") is None and ex.find("c") is None


def test_supervisor_records_a_program_that_cannot_start(tmp_path: Path) -> None:
    """If the program vanishes between validation and exec, the exit file still says why."""
    exit_file = tmp_path / "exit.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nightshift.runtime.executors.supervise",
            "--exit-file",
            str(exit_file),
            "--",
            str(tmp_path / "gone"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 127
    assert "gone" in out.stderr
    record = json.loads(exit_file.read_text())
    assert record["exit_code"] == 127 and record["signal"] is None and "gone" in record["detail"]


def test_render_shows_the_command_without_secrets(ex: LocalExecutor, tmp_path: Path) -> None:
    """A dry run shows what would run, quoted, but never prints secret env values."""
    req = request(
        tmp_path,
        "dry",
        ["python", "train.py", "--name", "a b"],
        gpus=[1],
        env={"WANDB_API_KEY": "hunter2", "LR": "0.1"},
    )
    line = ex.render(req)
    assert "train.py --name 'a b'" in line and "CUDA_VISIBLE_DEVICES=1" in line
    assert "LR=0.1" in line and "hunter2" not in line
    assert ex.find("dry") is None
