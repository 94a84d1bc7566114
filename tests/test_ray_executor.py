"""The Ray executor against a real local Ray head (tests/ray_service.py): runs submitted through
the Jobs API end with the program's own exit status, their output lands in the attempt's log file
once however many processes copy it, a second start finds the first job, a stop is SIGTERM then
SIGKILL after the grace, and a training run killed on Ray is diagnosed and resumed from its
checkpoint through the engine, as a local one is."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from nightshift.runtime.errors import OperatorError
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.ray_executor import RayExecutor

from conftest import REPO, need, store_row, write_spec

# One worker runs every test of the group: the service starts once (pytest-xdist, loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("ray")]
pytest_plugins = ["ray_service"]

# Prints its working directory, its arguments and what it was given, then exits as told.
SHOW = (
    "import json, os, sys\n"
    "print('seen: ' + json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:], "
    "'foo': os.environ.get('FOO'), 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')}), flush=True)\n"
    "code = int(os.environ.get('EXIT', '0'))\n"
    "os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)\n"
)
LINES = (
    "import sys, time\n"
    "for i in range(int(sys.argv[1])):\n"
    "    print(f'line {i:03d}', flush=True)\n"
    "    time.sleep(0.05)\n"
)
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM, going on', flush=True))\n"
    "print('up', flush=True)\n"
    "time.sleep(120)\n"
)


def request(folder: Path, key: str, code: str, *args: str, **kw) -> LaunchRequest:
    return LaunchRequest(
        key=key,
        argv=[sys.executable, "-c", code, *args],
        cwd=str(folder),
        log_path=str(folder / f"{key}.log"),
        **kw,
    )


def settle(ex: RayExecutor, handle: dict, timeout: float = 60.0) -> RunStatus:
    """Poll until the run is no longer running."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = ex.poll(handle)
        if status.state != "running":
            return status
        time.sleep(0.1)
    raise AssertionError(f"run {handle['key']} still running after {timeout:g} s")


def seen(log: Path) -> dict:
    (line,) = [x for x in log.read_text().splitlines() if x.startswith("seen: ")]
    return json.loads(line.removeprefix("seen: "))


@pytest.fixture
def ex(tmp_path, ray_head) -> RayExecutor:
    return RayExecutor(tmp_path / "runs", address=ray_head.address, stop_grace_s=2)


def test_runs_end_with_the_programs_exit_status_in_their_cwd(tmp_path, ex):
    """Exit codes and signals come back as a local run's; the entrypoint is quoted word by word
    (a shell metacharacter in the folder or an argument is just text), and a run without GPUs
    sees none."""
    odd = tmp_path / "a dir; $(touch pwned) `touch pwned2`"
    odd.mkdir()
    words = ["$HOME", "; touch pwned3", "it's", "*"]
    runs = {
        "exit-3": request(odd, "exit-3", SHOW, *words, env={"FOO": "bar", "EXIT": "3"}),
        "sigkill": request(tmp_path, "sigkill", SHOW, env={"EXIT": "-9"}),
        "ok": request(tmp_path, "ok", SHOW, env={"CUDA_VISIBLE_DEVICES": "0"}),
    }
    handles = {key: ex.start(req) for key, req in runs.items()}
    ended = {key: settle(ex, h) for key, h in handles.items()}
    assert (ended["exit-3"].state, ended["exit-3"].exit_code) == ("exited", 3)
    assert (ended["sigkill"].exit_code, ended["sigkill"].signal) == (None, 9)
    assert (ended["ok"].exit_code, ended["ok"].signal, ended["ok"].detail) == (0, None, None)
    got = seen(odd / "exit-3.log")
    assert (got["cwd"], got["argv"], got["foo"], got["cuda"]) == (str(odd), words, "bar", "")
    assert seen(tmp_path / "ok.log")["cuda"] == ""
    assert not list(tmp_path.rglob("pwned*"))


def test_output_is_copied_once_across_processes(tmp_path, ray_head):
    """One process copies part of the output, a restarted one the rest, a third finds nothing
    new: every line is in the log file once, in order."""
    first = RayExecutor(tmp_path / "runs", address=ray_head.address)
    handle = first.start(request(tmp_path, "lines", LINES, "60"))
    log = tmp_path / "lines.log"
    end = time.monotonic() + 60
    while "line 005" not in log.read_text() and time.monotonic() < end:
        assert first.poll(handle).state == "running"
        time.sleep(0.1)
    second = RayExecutor(tmp_path / "runs", address=ray_head.address)
    assert second.find("lines") == handle
    assert settle(second, handle).exit_code == 0
    assert second.logs(handle, tail=2) == "line 058\nline 059\n"
    RayExecutor(tmp_path / "runs", address=ray_head.address).logs(handle)
    first.poll(handle)
    lines = [x for x in log.read_text().splitlines() if x.startswith("line ")]
    assert lines == [f"line {i:03d}" for i in range(60)]


def test_start_is_idempotent_and_a_restarted_process_re_attaches(tmp_path, ray_head, monkeypatch):
    """Two starts of one key, even racing from two processes' executors, submit one job; a new
    executor finds it by key ($RAY_ADDRESS does not send it elsewhere); another home's executor
    does not."""
    from ray.job_submission import JobSubmissionClient

    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")  # the SDK would prefer it
    req = request(tmp_path, "once", "open('ran', 'a').write('ran\\n')")
    pair = [RayExecutor(tmp_path / "runs", address=ray_head.address) for _ in range(2)]
    handles: list[dict] = []
    threads = [threading.Thread(target=lambda e=e: handles.append(e.start(req))) for e in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(handles) == 2 and handles[0] == handles[1]
    assert pair[0].start(req) == handles[0]
    later = RayExecutor(tmp_path / "runs", address=ray_head.address)
    assert later.find("once") == handles[0]
    assert settle(later, handles[0]).exit_code == 0
    assert (tmp_path / "ran").read_text() == "ran\n"
    sid = handles[0]["submission_id"]
    assert sid.startswith("nightshift-once-")
    monkeypatch.delenv("RAY_ADDRESS")
    jobs = JobSubmissionClient(ray_head.address).list_jobs()
    assert [j.submission_id for j in jobs].count(sid) == 1
    assert later.find("never-started") is None
    assert RayExecutor(tmp_path / "other-home", address=ray_head.address).find("once") is None


def test_stop_is_sigterm_then_sigkill_after_the_grace(tmp_path, ex):
    """A program that ignores SIGTERM is killed after the grace (2 s here); the run reads as
    stopped by nightshift, and cleanup afterwards has nothing left to stop."""
    handle = ex.start(request(tmp_path, "stubborn", STUBBORN))
    log = tmp_path / "stubborn.log"
    end = time.monotonic() + 60
    while "up" not in log.read_text().split() and time.monotonic() < end:
        assert ex.poll(handle).state == "running"
        time.sleep(0.1)
    began = time.monotonic()
    status = ex.stop(handle)
    took = time.monotonic() - began
    assert (status.state, status.exit_code, status.signal) == ("exited", None, 15)
    assert "stopped by nightshift" in (status.detail or "")
    assert 1.5 < took < 10, took
    assert "got SIGTERM, going on" in log.read_text()
    assert ex.poll(handle) == status
    assert ex.cleanup(handle) == [] and ex.poll(handle) == status


def test_what_never_ran_and_what_is_gone(tmp_path, ex, ray_head):
    """A missing folder or program fails as the shell says (2, 127); a run whose Ray supervisor
    was killed is lost (and Ray ends its program), as is a job the cluster does not know;
    cleaning those up stops nothing."""
    handles = {
        "no-dir": ex.start(
            request(tmp_path, "no-dir", "pass").model_copy(update={"cwd": str(tmp_path / "nil")})
        ),
        "no-program": ex.start(
            LaunchRequest(
                key="no-program",
                argv=["no-such-program-here"],
                cwd=str(tmp_path),
                log_path=str(tmp_path / "no-program.log"),
            )
        ),
    }
    no_dir, no_program = (settle(ex, h) for h in handles.values())
    assert no_dir.exit_code == 2 and "can't cd to" in (tmp_path / "no-dir.log").read_text()
    assert no_program.exit_code == 127 and "not found" in (no_program.detail or "")

    orphan = ex.start(request(tmp_path, "orphan", STUBBORN))
    end = time.monotonic() + 60
    while "up" not in (tmp_path / "orphan.log").read_text().split() and time.monotonic() < end:
        ex.poll(orphan)
        time.sleep(0.1)
    ours = _processes(ray_head.pids(), b"NIGHTSHIFT_RUN_KEY=orphan")
    (supervisor,) = [p for p, cmd in ours if cmd[0].startswith("ray::JobSupervisor")]
    (program,) = [p.pid for p, cmd in ours if cmd[:2] == [sys.executable, "-c"]]
    supervisor.kill()
    status = settle(ex, orphan)
    assert status.state == "lost" and "supervisor died" in (status.detail or "")
    assert not psutil.pid_exists(program) or psutil.Process(program).status() == "zombie"
    assert ex.cleanup(orphan) == []

    gone = {**handles["no-dir"], "submission_id": "nightshift-no-such-job"}
    status = ex.poll(gone)
    assert status.state == "lost" and "gone from the cluster" in (status.detail or "")
    assert ex.cleanup(gone) == []


def _processes(pids: list[int], marker: bytes) -> list[tuple[psutil.Process, list[str]]]:
    """The live processes among `pids` with `marker` in their environment, and their argv."""
    found = []
    for pid in pids:
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                proc = psutil.Process(pid)
                found.append((proc, proc.cmdline()))
        except (OSError, psutil.Error):
            continue
    return found


def test_render_shows_the_entrypoint_and_masks_secrets(tmp_path):
    """The dry run shows the shell command Ray would run and the job's options, never a
    secret's value."""
    need("ray.job_submission", "the Ray executor: pip install 'ray[default]'")
    ex = RayExecutor(tmp_path / "runs", address="127.0.0.1:8265")
    req = request(
        tmp_path, "attempt-7", "pass", env={"API_TOKEN": "s3cret", "LR": "0.1"}, gpus=[0, 1]
    )
    req = req.model_copy(update={"memory_gb": 1.5})
    text = ex.render(req)
    assert "s3cret" not in text and "API_TOKEN=***" in text and "LR=0.1" in text
    assert f"cd -- {tmp_path} && exec {sys.executable} -c pass" in text
    assert "entrypoint_num_gpus=2" in text and f"entrypoint_memory={int(1.5 * 1024**3)}" in text
    assert "http://127.0.0.1:8265" in text


def test_an_unreachable_head_is_an_operator_error(tmp_path):
    """With no head at the address, the operator is told which address and what to start; the
    run is not given up as lost."""
    need("ray.job_submission", "the Ray executor: pip install 'ray[default]'")
    ex = RayExecutor(tmp_path / "runs", address="http://127.0.0.1:9", timeout_s=5)
    with pytest.raises(
        OperatorError, match=r"cannot reach the Ray Jobs API at http://127\.0\.0\.1:9"
    ):
        ex.start(request(tmp_path, "nowhere", "pass"))
    with pytest.raises(OperatorError, match="127.0.0.1:9"):
        ex.poll({"kind": "ray", "key": "k", "submission_id": "nightshift-k-0", "log_path": "x"})


@pytest.mark.timeout(240)
def test_a_killed_ray_job_is_diagnosed_and_resumed_from_its_checkpoint(home, tmp_path, ray_head):
    """`nightshift run` on a Ray head: the training job is stopped through Ray mid-run (not by
    nightshift), diagnosed as preempted, and resumed from its last checkpoint to the end."""
    from ray.job_submission import JobSubmissionClient

    write_spec(tmp_path, steps=150, env={"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.03"}, retry_wait_s=1)
    goal = tmp_path / "goal.yaml"
    goal.write_text("name: ray-train\ngoal: train\nspec: spec.yaml\n")
    env = {
        **os.environ,
        "COLUMNS": "200",
        "NIGHTSHIFT_EXECUTOR__KIND": "ray",
        "NIGHTSHIFT_EXECUTOR__RAY_ADDRESS": ray_head.address,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        db = home / "nightshift.db"
        (handle,) = store_row(
            db, "select handle from attempt where number = 1 and last_step >= 60", 90, proc
        )
        JobSubmissionClient(ray_head.address).stop_job(json.loads(handle)["submission_id"])
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    rows = sqlite3.connect(db).execute(
        "select number, executor, outcome, cause, exit_code, signal, start_step, last_step "
        "from attempt order by number"
    )
    (_, ex1, out1, cause1, code1, sig1, start1, last1), second = rows.fetchall()
    (_, ex2, out2, _, code2, _, start2, last2) = second
    assert (ex1, out1, cause1, code1, sig1, start1) == ("ray", "failed", "preempted", None, 15, 0)
    assert (ex2, out2, code2, last2) == ("ray", "succeeded", 0, 150)
    assert 50 <= start2 <= last1 <= start2 + 25 and start2 % 25 == 0
    logs = [home / "runs" / "job-1" / f"attempt-{n}.log" for n in (1, 2)]
    texts = [p.read_text() for p in logs]
    assert [t.count("nightshift-args: ") for t in texts] == [1, 1]  # each copied once
    assert f"resumed from step {start2}" in texts[1]
