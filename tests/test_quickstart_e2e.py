"""The quickstart end to end, as a user runs it: a real crash, a real resume, a verified audit."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import nightshift

pytestmark = pytest.mark.slow


def _db(home):
    return sqlite3.connect(home / "nightshift.db")


def test_quickstart_crashes_resumes_and_finishes(home):
    """The README's first command must work: crash at step 140, resume from the checkpoint, finish."""
    res = nightshift("run", "examples/goals/quickstart.yaml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "steps lost to failures" in res.stdout and "wall time" in res.stdout

    db = _db(home)
    (state,) = db.execute("select state from job").fetchone()
    assert state == "succeeded"
    attempts = db.execute(
        "select number, outcome, exit_code, start_step, last_step from attempt order by number"
    ).fetchall()
    assert len(attempts) == 2
    (n1, out1, code1, start1, last1), (n2, out2, code2, start2, last2) = attempts
    assert (out1, code1, start1) == ("failed", 1, 0)
    assert last1 == 139  # the fault fires at the start of step 140
    assert start2 == 125  # the newest checkpoint before the crash (every 25 steps)
    assert (out2, code2, last2) == ("succeeded", 0, 300)
    assert last1 - start2 <= 25  # at most one checkpoint interval lost

    # The loss right after the resume continues from the checkpoint's, not from scratch.
    loss = {
        (att, step): v
        for att, step, v in db.execute(
            "select attempt_id, step, value from metricpoint where name='loss'"
        )
    }
    first_try = {s: v for (a, s), v in loss.items() if a == 1}
    second_try = {s: v for (a, s), v in loss.items() if a == 2}
    assert min(second_try) == 126
    assert second_try[126] == pytest.approx(first_try[126], rel=1e-9)
    assert second_try[126] < first_try[1] / 2
    final = db.execute(
        "select value from metricpoint where name='loss' order by id desc"
    ).fetchone()[0]
    assert final < 0.5

    # The run's own log of its arguments shows the resume.
    log2 = (home / "runs" / "job-1" / "attempt-2.log").read_text()
    assert "resumed from step 125" in log2

    verify = nightshift("audit", "verify")
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stdout + verify.stderr


def test_edited_audit_row_is_detected(home):
    """Editing any audit row after the fact must break `nightshift audit verify`."""
    assert nightshift("skill", "gpu_health_check").returncode == 0
    assert nightshift("skill", "list_jobs").returncode == 0
    assert nightshift("audit", "verify").returncode == 0
    db = _db(home)
    first_id, payload = db.execute(
        "select id, payload from auditevent order by id limit 1"
    ).fetchone()
    edited = json.loads(payload)
    edited["tampered"] = True
    db.execute("update auditevent set payload=? where id=?", (json.dumps(edited), first_id))
    db.commit()
    res = nightshift("audit", "verify")
    assert res.returncode == 1
    assert f"event {first_id}" in res.stderr
