"""`nightshift logs JOB -f` and `submit --watch` follow a job to its end, as a researcher watches
one: every attempt under its header line, the newest as it grows, the next when a retry starts,
and an exit code that says how the job ended (0 succeeded, 6 failed, 7 cancelled). Against a
real daemon, through its socket (a shared install's client, which cannot open the log) and in
the single-user mode on the same home."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from served_daemon import Daemon, cli, served

from conftest import write_spec


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    with served(tmp_path_factory.mktemp("follow")) as d:
        yield d


def test_a_crash_and_its_resume_are_followed_to_success(daemon: Daemon, tmp_path: Path) -> None:
    """The issue's job 28: attempt 1 crashes, attempt 2 resumes and succeeds. The follow shows
    the crash, then the resume under its own header, and ends by itself with 0."""
    spec = write_spec(
        tmp_path,
        steps=200,
        env={"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140", "NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.01"},
        name="crashes-once",
        retry_wait_s=1,
    )
    r = daemon.run("submit", str(spec), "--watch", "--json", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr + daemon.log.read_text()[-3000:]
    first, *stream = r.stdout.splitlines()
    (job_id,) = json.loads(first)["job_ids"]
    out = "\n".join(stream)
    headers = [x for x in stream if x.startswith("── attempt")]
    assert headers == ["── attempt 1 ──", "── attempt 2 (resumed from step 125) ──"], out
    assert out.index("injected crash at step 140") < out.index("── attempt 2")
    assert stream[-1].startswith("done:"), out
    assert f"job {job_id} succeeded after 2 attempt(s)" in r.stderr
    assert "Traceback" not in r.stderr

    # The same job, finished, followed again: printed and done at once, in both modes.
    for mode in ("client", "embedded"):
        began = time.monotonic()
        again = daemon.run("logs", str(job_id), "-f", "-n", "2", mode=mode, timeout=60)
        took = time.monotonic() - began
        assert again.returncode == 0, again.stderr
        lines = again.stdout.splitlines()
        assert lines[0] == "── attempt 1 ──" and "injected crash at step 140" in lines[2], lines
        assert lines[3] == "── attempt 2 (resumed from step 125) ──", lines
        assert lines[-1].startswith("done:") and len(lines) == 6, lines
        assert took < 30, f"{mode}: {took:.1f}s"


def test_a_job_that_fails_for_good_ends_the_follow_with_6(daemon: Daemon, tmp_path: Path) -> None:
    """A program that cannot import its module: recovery has nothing to retry, and the follow
    ends with the failure's code, the traceback on stdout."""
    r = daemon.run(
        "submit",
        "--watch",
        "--retries",
        "1",
        "--",
        sys.executable,
        "-c",
        "import no_such_module_here",
        cwd=tmp_path,
        timeout=180,
    )
    assert r.returncode == 6, r.stdout + r.stderr
    assert "── attempt 1 ──" in r.stdout
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in r.stdout
    assert "failed after" in r.stderr and "Traceback" not in r.stderr


def test_a_cancelled_job_ends_the_follow_with_7(daemon: Daemon, tmp_path: Path) -> None:
    """`logs -f` started while the job runs follows it as it grows and stops when someone
    cancels it."""
    program = (
        "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"
    )
    r = daemon.run(
        "submit", "--json", "--name", "ticks", "--", sys.executable, "-c", program, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    (job_id,) = json.loads(r.stdout)["job_ids"]
    follow = daemon.start("logs", str(job_id), "-f")
    interrupted = daemon.start("logs", str(job_id), "-f")
    try:
        assert follow.stdout is not None and interrupted.stdout is not None
        assert follow.stdout.readline().strip() == "── attempt 1 ──"
        seen = [follow.stdout.readline().strip() for _ in range(3)]
        assert all(x.startswith("tick ") for x in seen), seen
        # Ctrl-C stops a follow, not the job.
        assert interrupted.stdout.readline().strip() == "── attempt 1 ──"
        interrupted.send_signal(signal.SIGINT)
        _, said = interrupted.communicate(timeout=60)
        assert interrupted.returncode == 130 and "it goes on" in said, said
        assert _state(daemon, job_id) == "running"
        cancel = daemon.run("cancel", str(job_id), "--yes", "--reason", "enough")
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        _, err = follow.communicate(timeout=60)
    finally:
        for proc in (follow, interrupted):
            if proc.poll() is None:
                proc.kill()
    assert follow.returncode == 7, err
    assert f"job {job_id} cancelled" in err
    # Each follow is its verdict and its end in the audit: the one that hung up and the one
    # the cancel ended, with what each was sent counted, not copied.
    with sqlite3.connect(daemon.home / "nightshift.db") as db:
        ends = [
            json.loads(p)
            for (p,) in db.execute(
                "SELECT payload FROM auditevent WHERE action = 'logs.follow.end' AND job_id = ?",
                (job_id,),
            )
        ]
    assert sorted(e["ended"] for e in ends) == ["cancelled", "hung_up"], ends
    cancelled = next(e for e in ends if e["ended"] == "cancelled")
    assert cancelled["lines"] >= 3 and "tick" not in json.dumps(ends), ends


def _state(daemon: Daemon, job_id: int) -> str:
    r = daemon.run("show", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["state"])


def test_the_exit_codes_are_in_the_help() -> None:
    r = subprocess.run(cli("logs", "--help"), capture_output=True, text=True, timeout=60)
    text = " ".join(r.stdout.split())
    assert "0 the job succeeded, 6 it failed for good, 7 it was cancelled" in text
