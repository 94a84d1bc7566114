"""The audit covers the rows: each transition's event binds a digest of the rows it left, so an
edited, inserted, flipped or deleted job or attempt row is named by `audit verify`, and the
engine refuses to launch a job whose content no longer matches what its events recorded.
A real store, real gated calls and a real local run; the tampering is raw SQL, as an intruder
with write access to the database file would do it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psutil
import pytest

from nightshift.agent.brain.wiring import Wiring

from conftest import empty_store, nightshift, write_spec


def submit(w: Wiring, spec: Path, call_id: str) -> int:
    ctx = w.context("alice", call_id)
    return int(w.gate.call(ctx, "submit_job", {"spec_path": str(spec)}, via="cli").job_id)


@pytest.fixture
def w(home) -> Wiring:
    empty_store(home / "nightshift.db")  # Wiring opens it, already at HEAD
    return Wiring.load()


def db_of(w: Wiring) -> Path:
    return w.settings.home_path / "nightshift.db"


def sql(db: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(statement, params)


def test_an_edited_queued_job_is_named_and_not_launched(w, tmp_path):
    """Finding: a queued job's spec.command edited in the database to a shell command: verify
    said OK and the daemon ran it. Now verify names the job and the engine refuses it."""
    job_id = submit(w, write_spec(tmp_path, steps=5), "call-edit")
    assert w.audit.verify().ok
    row = sqlite3.connect(db_of(w)).execute("select spec from job where id=?", (job_id,)).fetchone()
    spec = json.loads(row[0])
    spec["command"] = ["/bin/sh", "-c", "touch " + str(tmp_path / "pwned")]
    sql(db_of(w), "update job set spec=? where id=?", json.dumps(spec), job_id)
    res = Wiring.load().audit.verify()
    assert not res.ok and f"edited: job {job_id}: its spec" in res.reason, res
    fresh = Wiring.load()
    fresh.engine.tick()
    job = fresh.store.job(job_id)
    assert job.state == "failed" and "not launched" in job.reason and "edited" in job.reason
    assert fresh.store.attempts(job_id) == [] and not (tmp_path / "pwned").exists()


def test_an_inserted_job_borrowing_a_call_id_is_named_and_not_launched(w, tmp_path):
    """Finding: a job row inserted with an existing call id plus `#7` verified OK and ran."""
    submit(w, write_spec(tmp_path, steps=5), "call-real")
    w.gate.call(w.context("alice"), "pause_job", {"job_id": 1}, via="cli")  # held: out of the way
    with sqlite3.connect(db_of(w)) as conn:
        names = [r[1] for r in conn.execute("pragma table_info(job)") if r[1] != "id"]
        cols = ", ".join(f'"{c}"' for c in names)
        forged = {"submitted_by_call": "'call-real#7'", "state": "'queued'", "reason": "NULL"}
        picked = ", ".join(forged.get(c, f'"{c}"') for c in names)
        conn.execute(f"insert into job ({cols}) select {picked} from job where id=1")
        new_id = conn.execute("select max(id) from job").fetchone()[0]
    res = Wiring.load().audit.verify()
    assert not res.ok and f"inserted: job {new_id} (no event submitted it)" in res.reason, res
    fresh = Wiring.load()
    fresh.engine.tick()
    assert fresh.store.job(new_id).state == "failed"
    assert "written into the store directly" in fresh.store.job(new_id).reason


def test_a_spec_edited_into_something_not_json_fails_its_job_and_is_named(w, tmp_path):
    """Found by a test of the snapshot's one scan: a queued job whose spec text was edited into
    something that is not JSON made every tick raise (failing the job loaded its row, and its
    spec could not be decoded), so no job ran for anyone. Now the job fails with the reason, the
    tick goes on, and `audit verify` names the edited row."""
    job_id = submit(w, write_spec(tmp_path, steps=5), "call-edit")
    sql(db_of(w), "update job set spec=? where id=?", '{"command": ["python", ', job_id)
    fresh = Wiring.load()
    fresh.engine.tick()
    with sqlite3.connect(db_of(w)) as conn:
        state, reason = conn.execute(
            "select state, reason from job where id=?", (job_id,)
        ).fetchone()
    assert state == "failed" and "stored spec is not valid JSON" in reason
    res = Wiring.load().audit.verify()
    assert not res.ok and f"job {job_id}: its stored spec is not valid JSON" in res.reason, res
    for command in (("show", str(job_id)), ("status",), ("jobs",)):  # shown, not a traceback
        out = nightshift(*command)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (command, out.stderr)


def test_a_running_jobs_spec_edited_so_it_no_longer_validates_stops_that_run_alone(w, tmp_path):
    """Found while reading the watch step: a running job's spec edited in the database into one
    that does not validate made every tick raise (watching a run reads its spec), so no other
    job was watched or placed. Now that run is stopped, its job fails saying why (an audited
    `run.unwatchable` event), and the tick goes on. A real local run, slowed so it is running."""
    slow = {"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.5"}
    job_id = submit(w, write_spec(tmp_path, steps=1000, env=slow), "call-run")
    w.engine.tick()
    assert w.store.job(job_id).state == "running"
    row = sqlite3.connect(db_of(w)).execute("select spec from job where id=?", (job_id,)).fetchone()
    spec = json.loads(row[0])
    del spec["command"]
    sql(db_of(w), "update job set spec=? where id=?", json.dumps(spec), job_id)
    fresh = Wiring.load()
    fresh.engine.tick()  # no exception: every other job would be watched and placed as before
    job = fresh.store.job(job_id)
    assert job.state == "failed" and "spec.command: Field required" in job.reason, job.reason
    (att,) = fresh.store.attempts(job_id)
    assert att.state == "exited" and att.outcome == "failed"
    pid = att.handle["pid"]  # the run itself was stopped, not left running unwatched
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with sqlite3.connect(db_of(w)) as conn:  # the audit says why the run was stopped
        (payload,) = conn.execute(
            "select payload from auditevent where action='run.unwatchable'"
        ).fetchone()
    assert json.loads(payload)["job_id"] == job_id and "no longer validates" in payload


def test_a_running_attempts_row_edited_into_something_not_json_stops_that_run_alone(w, tmp_path):
    """Found with the test above: an attempt row whose handle and GPU list were edited into text
    that is not JSON made every tick raise (loading the attempts could not decode them). Now the
    run is found again by its attempt key and stopped, the attempt ends failed saying why, the
    tick goes on, and `audit verify` names the attempt row."""
    slow = {"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.5"}
    job_id = submit(w, write_spec(tmp_path, steps=1000, env=slow), "call-run")
    w.engine.tick()
    (att,) = w.store.attempts(job_id)
    assert att.state == "running"
    pid = att.handle["pid"]
    sql(db_of(w), "update attempt set handle='{\"pid\": ', gpus='[0,' where id=?", att.id)
    fresh = Wiring.load()
    fresh.engine.tick()
    (att,) = fresh.store.attempts(job_id)
    assert att.state == "exited" and att.outcome == "failed"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    res = fresh.audit.verify()
    assert not res.ok and f"attempt {att.id} (job {job_id} #1)" in res.reason, res


@pytest.mark.slow
def test_flipped_and_deleted_rows_of_a_finished_job_are_named(w, tmp_path):
    """Finding: a finished attempt flipped to failed, and deleted job and attempt rows, verified
    OK. A real run to success first, then each tampering on its own copy of the store."""
    job_id = submit(w, write_spec(tmp_path, steps=20), "call-run")
    states = w.engine.run_until_settled([job_id], deadline_s=120)
    assert states == {job_id: "succeeded"}
    assert w.audit.verify().ok, w.audit.verify()
    att_id = w.store.attempts(job_id)[0].id
    db = db_of(w)
    w.store.engine.dispose()
    backup = tmp_path / "clean.db"
    with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)

    def restore() -> None:
        with sqlite3.connect(backup) as src, sqlite3.connect(db) as dst:
            src.backup(dst)

    sql(db, "update attempt set outcome='failed', exit_code=1 where id=?", att_id)
    res = Wiring.load().audit.verify()
    assert not res.ok and f"edited: attempt {att_id} (job {job_id} #1)" in res.reason, res
    restore()
    sql(db, "update job set state='failed' where id=?", job_id)
    res = Wiring.load().audit.verify()
    assert f"job {job_id}: its state is failed, event" in res.reason, res
    restore()
    sql(db, "delete from metricpoint")
    sql(db, "delete from attempt")
    sql(db, "delete from job")
    res = Wiring.load().audit.verify()
    assert not res.ok and f"deleted: job {job_id}" in res.reason, res
    assert f"attempt {att_id} (last bound by event" in res.reason
    restore()
    assert Wiring.load().audit.verify().ok


def test_the_cli_fails_verify_naming_the_row(home, tmp_path):
    """`nightshift audit verify` exits non-zero and names the edited job."""
    spec = write_spec(tmp_path, steps=5)
    assert nightshift("submit", str(spec)).returncode == 0
    sql(home / "nightshift.db", "update job set owner='mallory' where id=1")
    out = nightshift("audit", "verify")
    assert out.returncode != 0 and "edited: job 1" in out.stdout + out.stderr


def test_a_parameter_whose_keys_yaml_reads_as_mixed_types_is_submitted_and_verifies(w, tmp_path):
    """Found by fuzzing the CLI: `--param 'lr={&a,=}'` is {None: None, "=": None} to YAML; its
    row digest (sorted keys) made a traceback. It hashes as JSON stores it."""
    ctx = w.context("alice", "c-mixed")
    args = {"spec_path": str(write_spec(tmp_path, steps=5)), "params": {"lr": {None: None, "=": 1}}}
    job_id = w.gate.call(ctx, "submit_job", args, via="cli").job_id
    assert w.store.job(job_id).params["lr"] == {"null": None, "=": 1}
    assert Wiring.load().audit.verify().ok
