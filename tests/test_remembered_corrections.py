"""A person's correction, used the next time (skills/remembered_corrections.py): once an operator
said what a failure was (`nightshift diagnose JOB --correct CATEGORY`), a later attempt whose log
ends the same way — numbers, paths and quoted values aside — and which the rules read as they read
the corrected one is kept with the person's category, saying whose and which attempt, the rules'
reading beside it; a log that ends otherwise, a bare `Killed`, a correction that agreed with the
rules and the attempt's own correction change nothing."""

from __future__ import annotations

import json
import os
import pwd
from functools import partial

import yaml

from nightshift.runtime.store.db import Attempt, DiagnosisCorrection, Job, Store
from nightshift.runtime.training.attempt_diagnosis import FailedRun
from nightshift.skills.attempt_diagnosis import diagnose_attempt
from nightshift.skills.remembered_corrections import ending

from conftest import nightshift

pytest_plugins = ["postgres_service"]

ME = pwd.getpwuid(os.getuid()).pw_name


def say(line: str) -> list[str]:
    """A job that prints a step and `line`, then exits 1."""
    return [
        "{python}",
        "-c",
        f"import sys; print('step 1 loss 2.31'); print({line!r}); sys.exit(1)",
    ]


def run_job(tmp_path, name: str, command: list[str]) -> dict:
    """Submit one job and watch it fail with `nightshift run` (the loop's own diagnosis)."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": command, "retries": 0}))
    goal = tmp_path / f"{name}-goal.yaml"
    goal.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "steps": [{"skill": "submit_job", "args": {"spec_path": str(spec)}}, {"watch": 1}],
            }
        )
    )
    r = nightshift("run", str(goal), timeout=120)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    rows = json.loads(nightshift("jobs", "--json").stdout)
    return max(rows, key=lambda row: row["id"])


def test_an_ending_is_compared_without_its_numbers_paths_and_values():
    a = ending("step 3\nRuntimeError: widget bus 3 lost sync on '/dev/wb0' after 12.5 s\n")
    b = ending("[rank1]: RuntimeError: widget bus 17 lost sync on '/dev/wb9' after 3 s\n")
    assert a is not None and a == b
    assert ending("RuntimeError: widget bus 3 lost sync\n") != a  # said less: another ending
    # the last line that says something failed, not a traceback's frame or a later progress line
    log = 'Traceback (most recent call last):\n  File "t.py", line 3\nOSError: disk 4 gone bad\n'
    assert ending(log + "epoch 9 done\n") == "oserror: disk # gone bad"
    assert ending("step 1\nKilled\n") is None  # too little to carry a judgement across runs
    assert ending("all fine\n") is None


def test_the_loop_keeps_the_operators_category_for_a_log_that_ends_the_same_way(home, tmp_path):
    first = run_job(tmp_path, "a", say("RuntimeError: widget bus 3 lost sync on /dev/wb0"))
    rules_said = first["why"]
    r = nightshift("diagnose", str(first["id"]), "--correct", "driver_mismatch", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    said_then = json.loads(r.stdout)["rules_said"]
    assert said_then != "driver_mismatch", rules_said

    second = run_job(tmp_path, "b", say("RuntimeError: widget bus 11 lost sync on /dev/wb7"))
    shown = json.loads(nightshift("show", str(second["id"]), "--json").stdout)
    [att] = [a for a in shown["attempts"] if a.get("diagnosis")]
    d = att["diagnosis"]
    assert d["category"] == "driver_mismatch", d
    assert d["remembered"]["rules_category"] == said_then
    assert (d["remembered"]["job_id"], d["remembered"]["attempt"]) == (first["id"], 1)
    assert d["remembered"]["corrected_by"] == ME
    assert (
        f"{ME} corrected job {first['id']} attempt 1, whose log ended the same way" in d["summary"]
    )
    assert d["action"] == "stop" and not d["retryable"]  # driver_mismatch's own remedy
    # and diagnose_failure itself (what the recover playbook acts on, what `diagnose` prints)
    again = nightshift("diagnose", str(second["id"]), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    out = json.loads(again.stdout)
    assert out["category"] == "driver_mismatch" and out["remembered"]["job_id"] == first["id"]
    # the corrected attempt's own log is not its own evidence
    own = json.loads(nightshift("diagnose", str(first["id"]), "--json").stdout)
    assert own["category"] == said_then and own.get("remembered") is None

    # a log that ends otherwise keeps the rules' reading
    third = run_job(tmp_path, "c", say("RuntimeError: widget fan 2 stopped"))
    shown = json.loads(nightshift("show", str(third["id"]), "--json").stdout)
    [att] = [a for a in shown["attempts"] if a.get("diagnosis")]
    assert att["diagnosis"]["category"] == said_then
    assert att["diagnosis"].get("remembered") is None


def attempt(store: Store, owner: str) -> int:
    """A failed attempt of a job of `owner`'s; its row id."""
    with store.session() as s:
        job = Job(name="j", spec={"name": "j", "command": ["true"]}, state="failed", owner=owner)
        s.add(job)
        s.flush()
        att = Attempt(job_id=job.id, number=1, state="exited", outcome="failed", exit_code=1)
        s.add(att)
        s.flush()
        assert att.id is not None
        return att.id


def correction(store: Store, text: str, category: str, rules: str, by: str = "ops") -> int:
    """`by`'s correction of a failed attempt of theirs whose log was `text`; its attempt id."""
    att_id = attempt(store, by)
    with store.session() as s:
        att = s.get(Attempt, att_id)
        assert att is not None
        s.add(
            DiagnosisCorrection(
                job_id=att.job_id,
                attempt_id=att_id,
                attempt_number=1,
                category=category,
                rules_category=rules,
                corrected_by=by,
                log_excerpt=text,
            )
        )
    return att_id


def test_what_is_not_remembered(tmp_path):
    """ops is a user (not the account the loop runs as): their corrections are for their jobs."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    diagnose = partial(diagnose_attempt, store=store)
    log = "step 1\nRuntimeError: widget bus 3 lost sync on /dev/wb0\n"
    rules = diagnose_attempt(FailedRun(log_tail=log, exit_code=1)).category
    mine = attempt(store, "ops")

    def ops_job() -> FailedRun:
        return FailedRun(log_tail=log, exit_code=1, attempt_id=mine)

    # a correction that agreed with the rules teaches nothing
    correction(store, log, rules, rules)
    assert diagnose(ops_job()).remembered is None
    # an attempt's own correction is not its evidence
    own = correction(store, log, "host_oom", rules)
    assert diagnose(FailedRun(log_tail=log, exit_code=1, attempt_id=own)).remembered is None
    # where the rules read the log otherwise now, the person corrected another reading
    correction(store, "step 1\nValueError: widget bus 3 lost sync\n", "disk_full", "unknown")
    got = diagnose(ops_job())
    assert got.category == "host_oom" and got.remembered is not None
    # another user's word never changes how this job is read, nor a job-less failure
    correction(store, log, "config_error", rules, by="eve")
    assert diagnose(ops_job()).category == "host_oom"
    bobs = FailedRun(log_tail=log, exit_code=1, attempt_id=attempt(store, "bob"))
    assert diagnose(bobs).remembered is None
    assert diagnose(FailedRun(log_tail=log, exit_code=1)).remembered is None
    # the newest correction of an ending wins
    correction(store, log, "killed", rules)
    assert diagnose(ops_job()).category == "killed"
    # the operator's (the account the loop runs as) counts for every job
    correction(store, log, "nan_loss", rules, by=ME)
    assert diagnose(bobs).category == "nan_loss" and diagnose(ops_job()).category == "nan_loss"


def test_a_correction_is_recalled_from_a_postgresql_store(postgres_url):
    """The excerpt's end is cut in the database (PostgreSQL's right(), SQLite's substr()); a
    correction's long excerpt is compared by its last lines alike."""
    store = Store(postgres_url)
    log = "step 1\nRuntimeError: widget bus 3 lost sync on /dev/wb0\n"
    rules = diagnose_attempt(FailedRun(log_tail=log, exit_code=1)).category
    long_excerpt = "".join(f"step {i} loss 1.{i}\n" for i in range(5000)) + log
    correction(store, long_excerpt, "host_oom", rules)
    run = FailedRun(log_tail=log, exit_code=1, attempt_id=attempt(store, "ops"))
    got = diagnose_attempt(run, store=store)
    assert got.category == "host_oom" and got.remembered is not None
    store.engine.dispose()
