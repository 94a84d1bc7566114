"""Exactly-once attempts, piece by piece: a launcher SIGKILLed between any two steps of a launch
leaves one run or none (never two), a superseded supervisor runs nothing, and of two loops that
place one job at the same moment exactly one claims it. The whole daemon under random kills is
tests/test_crash_consistency.py; these pin each mechanism so a regression names its step."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from nightshift.runtime.executors import crashpoints
from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.runtime.executors.local_executor import LocalExecutor
from nightshift.runtime.executors.supervise import EXIT_NOT_CLAIMED

# The program appends its pid to a ledger when it starts: "ran once" is counted by the program.
PROGRAM = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(float(sys.argv[2]))
""")


def request(tmp_path: Path, ledger: Path, sleep_s: float = 1.5) -> LaunchRequest:
    return LaunchRequest(
        key="job-1-attempt-1",
        argv=[sys.executable, "-c", PROGRAM, str(ledger), str(sleep_s)],
        cwd=str(tmp_path),
        log_path=str(tmp_path / "logs" / "a.log"),
    )


def launch_in_child(tmp_path: Path, req: LaunchRequest, point: str) -> int:
    """Start `req` from another process that SIGKILLs itself at `point`; its return code."""
    code = textwrap.dedent(f"""
        import json
        from nightshift.runtime.executors.executor import LaunchRequest
        from nightshift.runtime.executors.local_executor import LocalExecutor
        LocalExecutor({str(tmp_path / "runs")!r}).start(LaunchRequest(**json.loads({req.model_dump_json()!r})))
    """)
    env = {**os.environ, crashpoints.ENV: point}
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode


def runs(ledger: Path) -> list[str]:
    return ledger.read_text().split() if ledger.exists() else []


def wait_for(cond, timeout: float = 15.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize("point", ["launch.intent", "launch.spawned", "launch.handle"])
def test_a_relaunch_after_the_launcher_died_never_runs_the_attempt_twice(
    tmp_path: Path, point: str
) -> None:
    """The daemon dies inside `start`; the next daemon starts the same key again. Before the fix
    (handle written after the spawn) a kill after the spawn gave two runs of one attempt."""
    ledger = tmp_path / "ledger"
    req = request(tmp_path, ledger)
    assert launch_in_child(tmp_path, req, point) == -9
    ex = LocalExecutor(tmp_path / "runs")
    handle = ex.start(req)  # the restarted daemon's launch of the same attempt
    wait_for(lambda: len(runs(ledger)) >= 1)
    time.sleep(0.5)  # a second run, if one were started, would have written by now
    assert len(runs(ledger)) == 1
    assert ex.find(req.key) == handle
    wait_for(lambda: ex.poll(handle).state == "exited")
    assert ex.poll(handle).exit_code == 0
    assert len(runs(ledger)) == 1


def test_a_launch_found_by_its_live_supervisor_is_adopted_not_repeated(tmp_path: Path) -> None:
    """Killed right after the spawn, the supervisor already claimed and runs the program: the
    relaunch returns that run's handle (same supervisor pid), not a new run."""
    ledger = tmp_path / "ledger"
    req = request(tmp_path, ledger, sleep_s=3)
    assert launch_in_child(tmp_path, req, "launch.spawned") == -9
    wait_for(lambda: len(runs(ledger)) == 1)
    ex = LocalExecutor(tmp_path / "runs")
    handle = ex.start(req)
    assert str(handle["pid"]) != runs(ledger)[0]  # the supervisor's pid, not the program's
    assert ex.poll(handle).state == "running"
    ex.stop(handle)


def supervise(tmp_path: Path, intent: dict, attempt_id: str) -> subprocess.CompletedProcess:
    intent_file, handle_file = tmp_path / "k.intent.json", tmp_path / "k.json"
    intent_file.write_text(json.dumps(intent))
    marker = tmp_path / "ran"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nightshift.runtime.executors.supervise",
            "--exit-file",
            str(tmp_path / "exit.json"),
            "--intent-file",
            str(intent_file),
            "--handle-file",
            str(handle_file),
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w').close()",
        ],
        env={**os.environ, "NIGHTSHIFT_ATTEMPT_ID": attempt_id},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_superseded_supervisor_runs_nothing(tmp_path: Path) -> None:
    """A supervisor whose launcher died before it could claim, while a relaunch wrote a new
    intent, must not run beside the relaunch."""
    res = supervise(tmp_path, {"attempt_id": "new"}, attempt_id="old")
    assert res.returncode == EXIT_NOT_CLAIMED
    assert "superseded" in res.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "k.json").exists()


def test_a_claimed_launch_is_not_claimed_twice(tmp_path: Path) -> None:
    first = supervise(tmp_path, {"attempt_id": "a"}, attempt_id="a")
    assert first.returncode == 0 and (tmp_path / "ran").exists()
    handle = json.loads((tmp_path / "k.json").read_text())
    assert handle["attempt_id"] == "a" and handle["pid"] > 0
    (tmp_path / "ran").unlink()
    again = supervise(tmp_path, {"attempt_id": "a"}, attempt_id="a")
    assert again.returncode == EXIT_NOT_CLAIMED and "already claimed" in again.stderr
    assert not (tmp_path / "ran").exists()


def _claim(home: str, job_id: int, barrier, out) -> None:  # noqa: ANN001
    os.environ["NIGHTSHIFT_HOME"] = home
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load(None)
    engine = w.engine
    barrier.wait(timeout=60)
    att = engine.start_attempt(job_id, [], datetime(2026, 12, 4, 3, 0))
    out.put(None if att is None else att.number)


def test_two_loops_placing_one_job_at_once_claim_it_once(home: Path) -> None:
    """`nightshift run` and a daemon both saw job N queued and placeable; before the claim was
    a conditional update both created attempt rows and both runs trained."""
    from sqlmodel import select

    from nightshift.agent.doors.api import Client
    from nightshift.runtime.store.db import Attempt

    client = Client()
    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        job = client.submit(
            spec={"name": f"race-{trial}", "command": ["{python}", "-c", "pass"]},
            call_id=f"race-{trial}",
        )
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_claim, args=(str(home), job, barrier, out)) for _ in range(2)]
        for p in procs:
            p.start()
        results = sorted([out.get(timeout=60), out.get(timeout=60)], key=str)
        for p in procs:
            p.join(timeout=60)
        assert results == [1, None], f"trial {trial}: {results}"
        with client.w.store.session() as s:
            assert len(s.exec(select(Attempt).where(Attempt.job_id == job)).all()) == 1
