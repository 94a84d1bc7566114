"""`nightshift show | logs | cancel | retry JOB` as a user types them: real CLI subprocesses over
a real SQLite store, every call through the gate and in the audit, errors as one line."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from nightshift.agent.brain.wiring import Wiring
from nightshift.runtime.spec import load_spec
from nightshift.runtime.store.db import Attempt, Job, utcnow

from conftest import REPO, nightshift


@pytest.fixture
def failed_job(home):
    """A job whose two attempts failed: the first killed at step 120, the second (resumed from the
    step-100 checkpoint with a lower lr) diverged at step 140; its retries are used up."""
    w = Wiring.load()
    spec = load_spec(REPO / "examples/specs/quickstart.yaml").model_dump(mode="json")
    t0 = utcnow() - timedelta(hours=1)
    with w.store.session() as s:
        job = Job(
            name="quickstart",
            spec=spec,
            params={"lr": 0.1},
            state="failed",
            owner=w.user,  # the caller's own: another person's needs someone else's vote
            reason="failed twice the same way",
            max_attempts=2,
            resume_step=100,
            resume_from=str(home / "ck" / "step_00000100.npz"),
        )
        s.add(job)
        s.commit()
        s.refresh(job)
        logs = []
        for n, (start, last, params, argv_tail) in enumerate(
            [
                (0, 120, {"lr": 0.1}, []),
                (100, 140, {"lr": 0.05}, ["--resume", str(home / "ck" / "step_00000100.npz")]),
            ],
            start=1,
        ):
            log = home / f"attempt-{n}.log"
            log.write_text("".join(f"line {i} of attempt {n}\n" for i in range(300)))
            logs.append(log)
            s.add(
                Attempt(
                    job_id=job.id,
                    number=n,
                    state="exited",
                    outcome="failed",
                    params=params,
                    argv=["python", "train.py", *argv_tail],
                    start_step=start,
                    last_step=last,
                    log_path=str(log),
                    signal=9 if n == 1 else None,
                    exit_code=None if n == 1 else 0,
                    evidence=None if n == 1 else "metrics diverged: loss is nan at step 131",
                    first_bad_step=None if n == 1 else 131,
                    cause="killed" if n == 1 else "nan_loss",
                    started_at=t0 + timedelta(minutes=20 * n),
                    ended_at=t0 + timedelta(minutes=20 * n + 5),
                )
            )
        s.commit()
        return job.id, logs


def test_show_gives_every_attempt_as_sacct_would(failed_job):
    job_id, _ = failed_job
    r = nightshift("show", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["state"] == "failed" and [a["number"] for a in got["attempts"]] == [1, 2]
    first, second = got["attempts"]
    assert first["steps_lost"] == 20  # reached 120, the next attempt started from 100
    assert second["param_changes"] == {"lr": {"before": 0.1, "after": 0.05}}
    assert second["resumed_from"].endswith("step_00000100.npz") and second["first_bad_step"] == 131
    table = nightshift("show", str(job_id))
    assert table.returncode == 0 and "loss is nan at step 131" in table.stdout
    assert "nan_loss" in table.stdout and "lr 0.1→0.05" in table.stdout


def test_logs_tail_attempt_and_follow(failed_job):
    job_id, logs = failed_job
    r = nightshift("logs", str(job_id), "--attempt", "1", "-n", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"line {i} of attempt 1" for i in (297, 298, 299)]
    # -f on a job that failed for good (its retries used up): every attempt under its header,
    # then the exit code of a failed job, at once.
    r = nightshift("logs", str(job_id), "-f", "-n", "1", timeout=60)
    assert r.returncode == 6, r.stderr
    assert r.stdout.splitlines() == [
        "── attempt 1 ──",
        "line 299 of attempt 1",
        "── attempt 2 (resumed from step 100) ──",
        "line 299 of attempt 2",
    ]
    assert f"job {job_id} failed after 2 attempt(s): failed twice the same way" in r.stderr


def test_retry_requeues_once_and_is_audited(failed_job):
    job_id, _ = failed_job
    r = nightshift("retry", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["before"], got["after"]) == ("failed", "queued")
    assert got["max_attempts_after"] == 3 and got["resume_step"] == 100
    again = nightshift("retry", str(job_id))
    assert again.returncode != 0 and "already queued" in again.stderr + again.stdout
    assert "Traceback" not in again.stderr
    audit = nightshift("audit", "show", "--job", str(job_id))
    assert "retry_job" in audit.stdout
    with Wiring.load().store.session() as s:
        assert s.get(Job, job_id).state == "queued"


@pytest.mark.parametrize("command", ["show", "logs", "retry", "cancel"])
def test_a_job_that_does_not_exist_is_one_line(home, command):
    r = nightshift(command, "999")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "999" in r.stderr and "Traceback" not in r.stderr


def test_a_retry_someone_asks_for_starts_without_the_backoff(home, tmp_path, monkeypatch):
    """Why: a newcomer fixed a missing file, typed `nightshift retry N`, and waited half a minute
    for the loop's retry backoff (30 s after a first failure) before anything ran. The backoff is
    for the loop's own retries; a person's starts as soon as there is room."""
    import sqlite3
    import subprocess
    import sys
    from datetime import datetime

    from conftest import store_row

    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "60")  # the loop's own retry would wait 48–60 s
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    db = home / "nightshift.db"
    try:
        (tmp_path / "train.py").write_text("import json; json.load(open('settings.json'))")
        cli = [sys.executable, "-m", "nightshift.agent.doors.cli"]
        subprocess.run([*cli, "submit", "--", sys.executable, "train.py"], cwd=tmp_path, check=True)
        store_row(db, "select 1 from job where id=1 and state='failed'", proc=daemon)
        (tmp_path / "settings.json").write_text("{}")
        assert nightshift("retry", "1").returncode == 0
        store_row(db, "select 1 from attempt where job_id=1 and number=2", 30, proc=daemon)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    (ended,), (started,) = sqlite3.connect(db).execute(
        "select ended_at from attempt where number=1 union all "
        "select started_at from attempt where number=2"
    )
    waited = datetime.fromisoformat(started) - datetime.fromisoformat(ended)
    assert waited.total_seconds() < 15, waited
