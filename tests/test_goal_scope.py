"""Goals touch only what they name: a goal run without a daemon places the jobs it submitted or
requeued, never a job it only cancels, watches or reads. Before this, a goal with
`cancel_job job_id=N` started job N and trained it to the end while the cancel waited for approval."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import yaml

from nightshift.agent.doors.api import Client

from conftest import REPO, nightshift

SLEEPER = {"name": "victim", "command": ["{python}", "-c", "import time; time.sleep(30)"]}


def attempts(home, job_id: int) -> int:
    with sqlite3.connect(home / "nightshift.db") as c:
        return c.execute("select count(*) from attempt where job_id=?", (job_id,)).fetchone()[0]


def pending_approval(home) -> int | None:
    with sqlite3.connect(home / "nightshift.db") as c:
        row = c.execute("select id from approval where state='pending'").fetchone()
    return row[0] if row else None


def test_a_goal_that_cancels_a_queued_job_never_starts_it(home, tmp_path):
    job = Client().submit(spec=SLEEPER, call_id="victim")
    goal = tmp_path / "cancel.yaml"
    goal.write_text(yaml.safe_dump({"steps": [{"skill": "cancel_job", "args": {"job_id": job}}]}))
    run = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + 60
        while (approval := pending_approval(home)) is None:
            assert run.poll() is None, run.stdout.read() if run.stdout else ""
            assert time.monotonic() < end, "no approval was asked for"
            time.sleep(0.1)
        time.sleep(2.0)  # twenty ticks of the goal's own loop (poll interval 0.1 s)
        assert attempts(home, job) == 0, "the goal's loop started the job it was cancelling"
        r = nightshift("approvals", "reject", str(approval))
        assert r.returncode == 0, r.stdout + r.stderr
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, out  # the cancel was rejected
    assert attempts(home, job) == 0
    with sqlite3.connect(home / "nightshift.db") as c:
        assert c.execute("select state from job where id=?", (job,)).fetchone()[0] == "queued"


def test_watching_a_queued_job_without_a_daemon_says_so_and_does_not_start_it(home, tmp_path):
    job = Client().submit(spec=SLEEPER, call_id="watched")
    goal = tmp_path / "watch.yaml"
    goal.write_text(yaml.safe_dump({"steps": [{"watch": job}]}))
    r = nightshift("run", str(goal), timeout=60)
    assert attempts(home, job) == 0
    assert "no daemon" in r.stdout, r.stdout + r.stderr


def test_a_goal_on_a_job_that_does_not_exist_fails_at_once_with_exit_2(home, tmp_path):
    Client().submit(spec=SLEEPER, call_id="other")
    for step in ({"skill": "cancel_job", "args": {"job_id": 999}}, {"watch": 999}):
        goal = tmp_path / "missing.yaml"
        goal.write_text(yaml.safe_dump({"steps": [step]}))
        started = time.monotonic()
        r = nightshift("run", str(goal), timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "999" in r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        assert time.monotonic() - started < 20
    assert attempts(home, 1) == 0
