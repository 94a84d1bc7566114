"""Learning from the operator: `nightshift diagnose JOB --correct CATEGORY [--attempt N]` records
the right answer with the end of the attempt's log, who said it and when, through the gate and
the audit (skills/correct_diagnosis.py, the store's diagnosis_correction table); a bad category is
a clear error naming the choices, exit 2, nothing recorded; another person's job is theirs; and
`nightshift eval diagnosis --local` measures the rules on that history."""

from __future__ import annotations

import os
import pwd
import sqlite3
import typing
from pathlib import Path

from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.training.attempt_diagnosis import FailedRun
from nightshift.skills.attempt_diagnosis import diagnose_attempt
from nightshift.skills.diagnose_failure import Category

from conftest import nightshift

ME = pwd.getpwuid(os.getuid()).pw_name
ODD = "step 1 loss 2.30\nframe 17: widget bus lost sync\n"
OOM = "step 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def failed_job(home: Path, text: str, *, owner: str = ME, attempts: int = 1) -> int:
    """A failed job whose attempts wrote `text`, each with the loop's diagnosis of it."""
    store = Store(f"sqlite:///{home / 'nightshift.db'}")
    with store.session() as s:
        job = Job(name="j", spec={"name": "j", "command": ["true"]}, state="failed", owner=owner)
        s.add(job)
        s.flush()
        assert job.id is not None
        for n in range(1, attempts + 1):
            log = home / f"runs/job-{job.id}/attempt-{n}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(text)
            d = diagnose_attempt(FailedRun(log_tail=text, exit_code=1))
            s.add(
                Attempt(
                    job_id=job.id,
                    number=n,
                    state="exited",
                    outcome="failed",
                    exit_code=1,
                    log_path=str(log),
                    diagnosis=d.model_dump(),
                )
            )
        job_id = job.id
    store.engine.dispose()
    return job_id


def corrections(home: Path) -> list[tuple]:
    db = sqlite3.connect(home / "nightshift.db")
    return db.execute(
        "select job_id, attempt_number, category, rules_category, corrected_by, corrected_at, "
        "log_excerpt, first_line_no, exit_code, note from diagnosis_correction order by id"
    ).fetchall()


def audited(home: Path, skill: str) -> list[tuple]:
    db = sqlite3.connect(home / "nightshift.db")
    return db.execute(
        "select actor, action from auditevent where skill = ? order by id", (skill,)
    ).fetchall()


def test_a_correction_is_recorded_with_the_log_who_and_when_and_audited(home):
    job = failed_job(home, ODD)
    r = nightshift("diagnose", str(job), "--correct", "crashed", "--note", "widget bus bug")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"recorded: job {job} attempt 1 is crashed (the rules said unknown), by {ME}" in r.stdout
    assert "kept the log's last 2 lines" in r.stdout
    [row] = corrections(home)
    assert row[:5] == (job, 1, "crashed", "unknown", ME)
    assert row[5]  # when
    assert row[6] == ODD and row[7] == 1 and row[8] == 1 and row[9] == "widget bus bug"
    trail = audited(home, "correct_diagnosis")
    assert trail == [(ME, "policy.verdict"), (ME, "skill.start"), (ME, "skill.result")], trail
    # the rules' own diagnosis of the attempt is not touched
    shown = nightshift("show", str(job), "--json").stdout
    assert '"category": "unknown"' in shown

    # a second word on the same attempt replaces the first
    again = nightshift("diagnose", str(job), "--correct", "hang_or_timeout", "--json")
    assert again.returncode == 0, again.stderr
    assert '"replaced": "crashed"' in again.stdout
    assert [c[2] for c in corrections(home)] == ["hang_or_timeout"]


def test_a_bad_category_is_a_clear_error_and_nothing_is_recorded(home):
    job = failed_job(home, ODD)
    r = nightshift("diagnose", str(job), "--correct", "gremlins")
    assert r.returncode == 2
    assert "--correct 'gremlins': not a category; one of:" in r.stderr
    for cat in typing.get_args(Category):
        assert cat in r.stderr
    assert corrections(home) == [] and audited(home, "correct_diagnosis") == []


def test_the_attempt_and_the_target_are_checked(home, tmp_path):
    job = failed_job(home, ODD, attempts=2)
    r = nightshift("diagnose", str(job), "--correct", "crashed", "--attempt", "1")
    assert r.returncode == 0, r.stderr
    assert corrections(home)[0][1] == 1
    missing = nightshift("diagnose", str(job), "--correct", "crashed", "--attempt", "5")
    assert missing.returncode == 2 and "has no attempt 5" in missing.stderr
    log = tmp_path / "x.log"
    log.write_text(ODD)
    on_file = nightshift("diagnose", str(log), "--correct", "crashed")
    assert on_file.returncode == 2 and "only for a job id" in on_file.stderr
    assert nightshift("diagnose", "99", "--correct", "crashed").returncode == 2
    assert len(corrections(home)) == 1


def test_another_persons_job_is_theirs_to_correct(home):
    job = failed_job(home, ODD, owner="somebody-else")
    r = nightshift("diagnose", str(job), "--correct", "crashed")
    assert r.returncode != 0
    assert "others-job-logs" in r.stdout + r.stderr
    assert corrections(home) == []


def test_the_eval_measures_the_rules_on_the_corrected_history(home):
    odd = failed_job(home, ODD)
    oom = failed_job(home, OOM)
    nobody = nightshift("eval", "diagnosis", "--local")
    assert nobody.returncode == 2 and "no corrections in this store yet" in nobody.stderr
    assert nightshift("diagnose", str(odd), "--correct", "crashed").returncode == 0
    assert nightshift("diagnose", str(oom), "--correct", "cuda_oom").returncode == 0
    r = nightshift("eval", "diagnosis", "--local")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "corrected history: 2 attempts" in out
    assert "cuda_oom" in out and "crashed" in out and "unknown" in out
    assert "overall accuracy" in out and "0.500" in out
    assert "misses: 1" in out and f"job {odd} attempt 1" in out


def test_only_a_person_corrects_a_diagnosis(home):
    """The agent and the loop may modify jobs, but a correction is a person's word: the rules
    are measured against it."""
    from nightshift.policies.engine import PolicyEngine
    from nightshift.policies.model import load_policy
    from nightshift.skills.correct_diagnosis import CorrectDiagnosisInput, correct_diagnosis

    engine = PolicyEngine(load_policy(None))
    inp = CorrectDiagnosisInput(job_id=1, category="crashed")
    for who in ("agent", "system"):
        assert engine.evaluate(who, correct_diagnosis, inp, inp.claims()).decision == "deny", who
    assert engine.evaluate(ME, correct_diagnosis, inp, inp.claims()).decision == "allow"
