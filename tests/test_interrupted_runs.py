"""A `nightshift run` killed with SIGKILL — while waiting for an approval, or while its training
run is in flight — resumes in a new process without launching or killing anything twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, nightshift, store_row, write_spec

pytestmark = pytest.mark.slow


def start_run(goal: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def wait_for(query: str, db: Path, timeout: float = 60.0):
    return store_row(db, query, timeout)


def thread_of(db: Path) -> str:
    return sqlite3.connect(db).execute("select thread_id from plannedcall limit 1").fetchone()[0]


def test_approval_asked_and_decided_from_another_shell(home, tmp_path):
    """A destructive step stops for approval; `nightshift approve` from another shell lets it run."""
    spec = write_spec(tmp_path, steps=100_000)
    goal = tmp_path / "goal.yaml"
    goal.write_text(
        yaml.safe_dump(
            {
                "name": "cancel-demo",
                "steps": [
                    {"id": "submit", "skill": "submit_job", "args": {"spec_path": str(spec)}},
                    {"skill": "cancel_job", "args": {"job_id": "${submit.job_id}"}},
                ],
            }
        )
    )
    db = home / "nightshift.db"
    proc = start_run(goal)
    try:
        (approval_id,) = wait_for("select id from approval where state='pending'", db)
        listed = nightshift("approvals", "list")
        assert "cancel_job" in listed.stdout
        assert nightshift("approve", str(approval_id)).returncode == 0
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert sqlite3.connect(db).execute("select state from job").fetchone()[0] == "cancelled"


def test_killed_while_waiting_for_approval_resumes_without_repeating(home, tmp_path):
    """SIGKILL during the approval wait; a new process resumes: one job, one cancel, nothing twice."""
    spec = write_spec(tmp_path, steps=100_000)
    goal = tmp_path / "goal.yaml"
    goal.write_text(
        yaml.safe_dump(
            {
                "name": "cancel-demo",
                "steps": [
                    {"id": "submit", "skill": "submit_job", "args": {"spec_path": str(spec)}},
                    {"skill": "list_jobs", "args": {}},
                    {"skill": "cancel_job", "args": {"job_id": "${submit.job_id}"}},
                ],
            }
        )
    )
    db = home / "nightshift.db"
    proc = start_run(goal)
    (approval_id,) = wait_for("select id from approval where state='pending'", db)
    wait_for("select id from attempt where state='running'", db)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    assert nightshift("approve", str(approval_id)).returncode == 0
    res = nightshift("run", "--resume", thread_of(db), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr

    con = sqlite3.connect(db)
    assert con.execute("select count(*) from job").fetchone()[0] == 1
    assert con.execute("select count(*) from attempt").fetchone()[0] == 1
    assert con.execute("select state from job").fetchone()[0] == "cancelled"
    starts = con.execute("select skill from auditevent where action='skill.start'").fetchall()
    assert [s for (s,) in starts].count("submit_job") == 1
    assert [s for (s,) in starts].count("cancel_job") == 1
    assert con.execute("select count(*) from approval").fetchone()[0] == 1
    assert nightshift("audit", "verify").returncode == 0


def test_killed_while_training_in_flight_resumes_and_recovers(home, tmp_path):
    """SIGKILL of `nightshift run` mid-training: the run goes on, a new process re-attaches to it,
    sees its crash, resumes it once from the checkpoint, and every job state change is audited."""
    spec = write_spec(
        tmp_path,
        steps=400,
        env={"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "240", "NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.01"},
    )
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"name": "inflight", "goal": "train", "spec": str(spec)}))
    db = home / "nightshift.db"
    proc = start_run(goal)
    wait_for("select id from attempt where state='running' and last_step > 10", db)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    res = nightshift("run", "--resume", thread_of(db), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr

    con = sqlite3.connect(db)
    assert con.execute("select count(*) from job").fetchone()[0] == 1
    rows = con.execute("select number, outcome, start_step from attempt order by number").fetchall()
    assert [(n, o) for n, o, _ in rows] == [(1, "failed"), (2, "succeeded")]
    assert rows[1][2] == 225
    transitions = [
        (p["before"], p["after"])
        for p in (
            json.loads(x)
            for (x,) in con.execute(
                "select payload from auditevent where action='job.state' order by id"
            )
        )
    ]
    assert transitions == [
        ("queued", "running"),
        ("running", "failed"),
        ("failed", "queued"),  # resume_job, through the lifecycle
        ("queued", "running"),
        ("running", "succeeded"),
    ]
    resumed = [
        json.loads(x)["result"]
        for (x,) in con.execute(
            "select payload from auditevent where action='skill.result' and skill='resume_job'"
        )
    ]
    assert [(r["before"], r["after"]) for r in resumed] == [("failed", "queued")]
    assert nightshift("audit", "verify").returncode == 0


def test_approval_answered_at_the_terminal(home, tmp_path):
    """At a terminal, the run asks 'approve?' itself; answering y lets the destructive call run."""
    import pty

    spec = write_spec(tmp_path, steps=100_000)
    goal = tmp_path / "goal.yaml"
    goal.write_text(
        yaml.safe_dump(
            {
                "name": "tty-demo",
                "steps": [
                    {"id": "submit", "skill": "submit_job", "args": {"spec_path": str(spec)}},
                    {"skill": "cancel_job", "args": {"job_id": "${submit.job_id}"}},
                ],
            }
        )
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    os.close(slave)
    try:
        wait_for("select id from approval where state='pending'", home / "nightshift.db")
        time.sleep(0.5)
        os.write(master, b"y\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 0, out
    assert "approve as" in out
    con = sqlite3.connect(home / "nightshift.db")
    assert con.execute("select state from job").fetchone()[0] == "cancelled"
    votes = json.loads(con.execute("select votes from approval").fetchone()[0])
    assert len(votes) == 1 and votes[0]["approve"] is True
