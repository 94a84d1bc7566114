"""The audit against someone who can write the store (and the anchor beside it) but cannot read
the audit key nor rewrite the published heads kept elsewhere: every tamper case of issue 10 is
its own test that edits the SQLite file with sqlite3 and must be caught."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import sqlite3
import stat
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import GENESIS, AuditLog, event_hash, sign
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.gate import Gate
from nightshift.policies.model import Policy, load_policy
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import ApprovalRequired, PolicyDenied, StoreError
from nightshift.runtime.store.db import Job, Store
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

from conftest import Clock, empty_store

FIXTURE = Path(__file__).parent / "fixtures/stores/release-0.1.0-schema2.db"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "ns.db"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """The published heads: a file the store's owner cannot rewrite (another host, a share)."""
    return tmp_path / "elsewhere" / "heads.jsonl"


def open_log(db: Path, publish: Path | None = None) -> AuditLog:
    return AuditLog(
        Store(f"sqlite:///{db}"), db.parent / "audit.anchor", clock=Clock(), publish_file=publish
    )


@pytest.fixture
def log(db: Path, elsewhere: Path) -> AuditLog:
    return open_log(db, elsewhere)


def fill(log: AuditLog, n: int, what: str = "test.step") -> None:
    for i in range(n):
        log.append("alice", what, call_id=f"c{i}", payload={"i": i})
    log.flush()


def sql(db: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(statement, params)


def rechain(db: Path, from_id: int = 1) -> None:
    """What a forger without the key does after editing events: recompute every hash from
    `from_id` on (keeping the old signatures, having no key to make new ones)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, ts, actor, action, skill, call_id, job_id, payload FROM auditevent "
            "ORDER BY id"
        ).fetchall()
        prev = GENESIS
        for ev_id, ts, actor, action, skill, call_id, job_id, payload in rows:
            if ev_id >= from_id:
                digest = event_hash(
                    prev, ts, actor, action, skill, call_id, job_id, json.loads(payload)
                )
                conn.execute(
                    "UPDATE auditevent SET prev_hash = ?, hash = ? WHERE id = ?",
                    (prev, digest, ev_id),
                )
            prev = conn.execute("SELECT hash FROM auditevent WHERE id = ?", (ev_id,)).fetchone()[0]


def repoint_anchor(log: AuditLog, db: Path, *, with_key: bool = True) -> None:
    """The forger rewrites the anchor beside the store to name the newest event as it now is,
    with the count of events up to it, signed with the audit key (a forger who has it) or not."""
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT id, hash FROM auditevent ORDER BY id DESC LIMIT 1").fetchone()
        count = conn.execute("SELECT count(*) FROM auditevent").fetchone()[0]
    if row is None:
        log.anchor_path.unlink(missing_ok=True)
        return
    body = {"id": row[0], "hash": row[1], "count": count}
    if with_key:
        body["signature"] = sign(log.key, f"anchor:{row[0]}:{row[1]}:{count}")
    log.anchor_path.write_text(json.dumps(body))


def legacy_rows(db: Path) -> None:
    """Mark every job and attempt the test writes by hand as made before rows were audited (an
    upgraded store): the checks below are those that hold for such rows too."""
    for key in ("audit.rows_after_job", "audit.rows_after_attempt"):
        sql(db, "UPDATE keyvalue SET value = '1000000' WHERE key = ?", key)


# Signing ------------------------------------------------------------------------------------------


def test_the_key_is_made_0600_in_a_0700_folder_and_signs_each_hash(log: AuditLog) -> None:
    """The key: 32 random bytes, only its owner may read it; an event's signature is the HMAC-SHA256
    of its chain hash under it (pinned: other tools check it)."""
    ev = log.append("alice", "x", payload={"a": 1})
    key_file = log.key_path
    assert key_file == log.anchor_path.parent / "keys" / "audit.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    key = bytes.fromhex(key_file.read_text().strip())
    assert len(key) == 32
    assert ev.signature == hmac.new(key, ev.hash.encode(), hashlib.sha256).hexdigest()
    again = AuditLog(log.store, log.anchor_path)  # another process: the same key
    assert again.key == key


def test_a_key_others_can_read_is_refused(log: AuditLog) -> None:
    log.append("alice", "x")
    log.key_path.chmod(0o644)
    with pytest.raises(StoreError, match="chmod 600"):
        AuditLog(log.store, log.anchor_path).append("alice", "y")


def test_rewritten_payload_hash_and_anchor_are_caught_by_the_signature(
    log: AuditLog, db: Path
) -> None:
    """Finding: whoever writes the store rewrites the chain and the anchor. Without the key the
    rewritten events cannot carry valid signatures."""
    fill(log, 5)
    sql(db, "UPDATE auditevent SET payload = ? WHERE id = 3", json.dumps({"i": 99}))
    rechain(db, from_id=3)
    repoint_anchor(log, db)
    res = open_log(db).verify()
    assert (res.ok, res.first_bad_id) == (False, 3), res
    assert "signature is not the audit key's" in res.reason


def test_forged_events_appended_after_the_anchor_are_caught(log: AuditLog, db: Path) -> None:
    """Finding: a trailing run after the anchor is accepted. Forged events are unsigned, or carry
    a signature the forger could not compute: both fail."""
    fill(log, 3)
    with sqlite3.connect(db) as conn:
        prev = conn.execute("SELECT hash FROM auditevent ORDER BY id DESC LIMIT 1").fetchone()[0]
        payload = {"forged": True}
        ts = "2026-12-02T04:00:00.000000Z"
        digest = event_hash(prev, ts, "bob", "approval.vote", None, "c9", None, payload)
        conn.execute(
            "INSERT INTO auditevent (ts, actor, action, skill, call_id, job_id, payload, "
            "prev_hash, hash, signature) VALUES (?, 'bob', 'approval.vote', NULL, 'c9', NULL, ?, "
            "?, ?, NULL)",
            (ts, json.dumps(payload), prev, digest),
        )
    res = open_log(db).verify()
    assert (res.ok, res.first_bad_id) == (False, 4), res
    assert "not signed" in res.reason
    sql(db, "UPDATE auditevent SET signature = ? WHERE id = 4", "ab" * 32)
    res = open_log(db).verify()
    assert (res.ok, res.first_bad_id) == (False, 4) and "signature" in res.reason


def test_stripping_every_signature_does_not_pass_for_a_store_from_before_signing(
    log: AuditLog, db: Path
) -> None:
    """A forger who rewrites the whole chain and clears the signatures: the key exists and no
    record says signing began later, so unsigned events are not 'before signing'."""
    fill(log, 3)
    sql(db, "UPDATE auditevent SET payload = ? WHERE id = 1", json.dumps({"i": 7}))
    sql(db, "UPDATE auditevent SET signature = NULL")
    rechain(db)
    repoint_anchor(log, db)
    res = open_log(db).verify()
    assert not res.ok and "signatures were stripped" in res.reason


def test_a_deleted_key_is_reported_not_skipped(log: AuditLog, db: Path) -> None:
    fill(log, 2)
    log.key_path.unlink()
    res = open_log(db).verify()
    assert not res.ok and "audit key" in res.reason and "missing" in res.reason


def test_an_upgraded_store_reports_its_events_from_before_signing(tmp_path: Path) -> None:
    """Release 0.1.0's events carry no signature: verify says so, and accepts them only before
    the first signed event (recorded beside the key, signed)."""
    db = tmp_path / "home" / "ns.db"
    db.parent.mkdir()
    shutil.copy(FIXTURE, db)
    log = open_log(db)
    log.append("alice", "after.upgrade")
    log.flush()
    res = log.verify()
    assert (res.ok, res.count, res.unsigned) == (True, 2, 1), res
    assert "1 unsigned (before signing)" in res.reason
    assert json.loads(log.since_path.read_text())["seq"] == 2
    # Clearing the signatures of the events after it does not make them "before signing".
    sql(db, "UPDATE auditevent SET signature = NULL")
    res = open_log(db).verify()
    assert (res.ok, res.first_bad_id) == (False, 2) and "not signed" in res.reason


# Published heads --------------------------------------------------------------------------------


def test_publish_head_appends_a_line_and_logs_to_syslog(
    db: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head (seq, hash, signature, ts) goes to the file kept elsewhere and to syslog."""
    import syslog

    said: list[str] = []
    monkeypatch.setattr(syslog, "syslog", lambda _prio, msg: said.append(msg))
    log = AuditLog(
        Store(f"sqlite:///{db}"),
        db.parent / "audit.anchor",
        publish_file=elsewhere,
        publish_syslog=True,
        publish_every_s=3600,
    )
    assert log.publish_head() is None  # empty log: nothing to publish
    ev = log.append("alice", "x")
    log.flush()  # the process's first flush publishes at once
    lines = [json.loads(x) for x in elsewhere.read_text().splitlines()]
    assert [(h["seq"], h["hash"], h["signature"]) for h in lines] == [
        (ev.id, ev.hash, ev.signature)
    ]
    assert said and f"seq={ev.id} hash={ev.hash}" in said[-1]
    log.append("alice", "y")
    log.flush()  # within publish_every_s: not yet
    assert len(elsewhere.read_text().splitlines()) == 1
    log.publish_if_unpublished()  # what the exit handler does
    assert len(elsewhere.read_text().splitlines()) == 2
    res = log.verify()
    assert res.ok and res.heads_checked == 2, res


def test_deleted_newest_events_and_repointed_anchor_are_caught_by_the_published_head(
    log: AuditLog, db: Path, elsewhere: Path
) -> None:
    """Finding: delete the newest events and repoint the anchor at the new newest one. The chain
    and anchor agree again; the head published elsewhere names an event the store lost."""
    fill(log, 5)
    log.publish_head()
    sql(db, "DELETE FROM auditevent WHERE id >= 4")
    repoint_anchor(log, db)
    assert open_log(db).verify().ok  # with the key, only the published heads can tell
    res = open_log(db).verify(against=elsewhere)
    assert (res.ok, res.first_bad_id) == (False, 5), res
    assert "newest events were removed, or the store (and its anchor) rolled back" in res.reason
    assert not open_log(db, elsewhere).verify().ok  # the configured publish file by default


def test_rolling_back_store_and_anchor_is_caught_by_the_published_head(
    log: AuditLog, db: Path, elsewhere: Path, tmp_path: Path
) -> None:
    """Finding: roll back both files to an older copy; also when the rolled-back store was
    written again since (the same seq now holds another event)."""
    fill(log, 2)
    backup = tmp_path / "backup"
    backup.mkdir()
    with sqlite3.connect(db) as src, sqlite3.connect(backup / "ns.db") as dst:
        src.backup(dst)  # the whole store, its WAL included
    shutil.copy(log.anchor_path, backup / "audit.anchor")
    fill(log, 3)
    log.publish_head()  # names event 5
    log.store.engine.dispose()
    for f in db.parent.glob("ns.db*"):
        f.unlink()
    shutil.copy(backup / "ns.db", db)
    shutil.copy(backup / "audit.anchor", log.anchor_path)
    rolled = open_log(db)
    res = rolled.verify(against=elsewhere)
    assert (res.ok, res.first_bad_id) == (False, 5), res
    fill(rolled, 3, "test.rewritten")  # events 3-5 again, different ones
    res = open_log(db).verify(against=elsewhere)
    assert (res.ok, res.first_bad_id) == (False, 5), res
    assert "hash or signature differs" in res.reason


def test_verify_against_a_missing_file_fails(log: AuditLog, tmp_path: Path) -> None:
    fill(log, 1)
    res = log.verify(against=tmp_path / "nope.jsonl")
    assert not res.ok and "does not exist" in res.reason


# Rows without their events ------------------------------------------------------------------------


def submit(log: AuditLog, db: Path, job_id: int, call: str, attempts: int = 0) -> None:
    """What a gated submit leaves: the call's skill.start, then the job row; then each attempt row
    and the engine's job.state event naming it."""
    log.append("alice", "skill.start", skill="submit_job", call_id=call, payload={})
    legacy_rows(db)
    sql(
        db,
        "INSERT INTO job (id, name, spec, params, state, priority, owner, max_attempts, "
        "submitted_by_call, created_at, updated_at) VALUES (?, 'j', '{}', '{}', 'queued', 0, "
        "'alice', 3, ?, '2026-12-02 03:00:00', '2026-12-02 03:00:00')",
        job_id,
        call,
    )
    for n in range(1, attempts + 1):
        sql(
            db,
            "INSERT INTO attempt (job_id, number, key, state, executor, handle, argv, params, "
            "gpus, start_step, metrics_offset, metrics_cursor, started_at) VALUES (?, ?, ?, "
            "'exited', 'local', '{}', '[]', '{}', '[]', 0, 0, '{}', '2026-12-02 03:00:00')",
            job_id,
            n,
            f"attempt-{job_id}-{n}",
        )
        log.append(
            "system",
            "job.state",
            job_id=job_id,
            payload={"job_id": job_id, "before": "queued", "after": "running", "attempt": n},
        )
    log.flush()


def test_an_emptied_log_with_a_deleted_anchor_is_not_ok_while_jobs_exist(
    log: AuditLog, db: Path
) -> None:
    """Finding: empty the table, delete the anchor: 'OK: 0 events'. The jobs and attempts that
    the events made are still there, and say the log was emptied."""
    submit(log, db, 1, "call-1", attempts=2)
    submit(log, db, 2, "sweep#0")  # submit_jobs keys its jobs call#i
    assert log.verify().ok
    sql(db, "DELETE FROM auditevent")
    log.anchor_path.unlink()
    res = open_log(db).verify()
    assert not res.ok and "the store holds jobs: the history was deleted" in res.reason, res
    log.append("mallory", "test.restart")  # a fresh log begun over the old rows
    res = open_log(db).verify()
    assert "2 jobs (first: 1, 2) have no skill.start event" in res.reason
    assert "2 attempts (first: job 1 attempt 1, job 1 attempt 2) have no job.state" in res.reason


def test_an_attempt_whose_event_was_cut_is_reported(log: AuditLog, db: Path) -> None:
    """The newest event (an attempt's job.state) cut and the anchor repointed: chain and anchor
    agree, the attempt row still says it ran."""
    submit(log, db, 1, "call-1", attempts=1)
    sql(db, "DELETE FROM auditevent WHERE action = 'job.state'")
    repoint_anchor(log, db)
    res = open_log(db).verify()
    assert not res.ok and "job 1 attempt 1) have no job.state event" in res.reason, res


def test_an_empty_store_is_ok_and_an_attempt_still_starting_is_excused(
    log: AuditLog, db: Path
) -> None:
    """No jobs, no events: OK. An attempt row still `starting` has its event just after the commit
    that made it (or, after a crash there, the engine's finish event): not yet a finding."""
    res = log.verify()
    assert res.ok and res.count == 0
    submit(log, db, 1, "call-1")
    sql(
        db,
        "INSERT INTO attempt (job_id, number, key, state, executor, handle, argv, params, gpus, "
        "start_step, metrics_offset, metrics_cursor, started_at) VALUES (1, 1, 'attempt-x', "
        "'starting', 'local', '{}', '[]', '{}', '[]', 0, 0, '{}', '2026-12-02 03:00:00')",
    )
    assert log.verify().ok


def test_a_job_written_into_the_store_directly_is_named(log: AuditLog, db: Path) -> None:
    """A job no gated call submitted has no event to match; verify names it (the CLI fails)."""
    fill(log, 1)
    legacy_rows(db)
    sql(
        db,
        "INSERT INTO job (id, name, spec, params, state, priority, owner, max_attempts, "
        "created_at, updated_at) VALUES (7, 'j', '{}', '{}', 'queued', 0, 'mallory', 3, "
        "'2026-12-02 03:00:00', '2026-12-02 03:00:00')",
    )
    res = log.verify()
    assert res.unaudited_jobs == [7] and "jobs 7 were not submitted by a gated call" in res.reason


# Approvals: the signed votes, not the row ------------------------------------------------------


class Destroyed(BaseModel):
    job_id: int


class DestroyArgs(SkillInput):
    job_id: int

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


RAN: list[int] = []


@skill("tamper_destroy", capability="destroy")
def tamper_destroy(ctx: SkillContext, inp: DestroyArgs) -> Destroyed:
    """Record that it ran (test skill)."""
    RAN.append(inp.job_id)
    return Destroyed(job_id=inp.job_id)


class Gated:
    """The policy stack on one store, with job 4 to destroy."""

    def __init__(self, home: Path) -> None:
        self.store = Store(f"sqlite:///{home / 'ns.db'}")
        self.audit = AuditLog(self.store, home / "audit.anchor")
        self.engine = PolicyEngine(None)
        self.approvals = Approvals(self.store, self.audit, engine=self.engine)
        self.gate = Gate(self.engine, self.audit, self.approvals, self.store)
        self.settings = Settings(home=str(home))
        self.db = home / "ns.db"
        with self.store.session() as s:
            s.add(Job(id=4, name="victim", spec={}, owner="alice"))

    def call(self, principal: str, call_id: str) -> BaseModel:
        ctx = SkillContext(
            store=self.store,
            settings=self.settings,
            now=datetime(2026, 12, 2, 3, 0),
            call_id=call_id,
            principal=principal,
            policy_limits=self.engine.limits(),
        )
        return self.gate.call(ctx, tamper_destroy, {"job_id": 4})

    def parked(self, call_id: str) -> int:
        with pytest.raises(ApprovalRequired) as exc:
            self.call("agent", call_id)
        return exc.value.approval_id


@pytest.fixture
def gated(tmp_path: Path) -> Gated:
    RAN.clear()
    home = tmp_path / "home"
    home.mkdir()
    empty_store(home / "ns.db")  # Gated opens it, already at HEAD
    return Gated(home)


def test_a_voted_approval_runs(gated: Gated) -> None:
    """The ordinary path still works: alice's signed vote carries the agent's call."""
    approval_id = gated.parked("c1")
    gated.approvals.vote(approval_id, "alice", True, datetime(2026, 12, 2, 3, 1))
    assert gated.call("agent", "c1") == Destroyed(job_id=4) and RAN == [4]


def test_an_approval_row_set_to_approved_in_the_database_does_not_run(gated: Gated) -> None:
    """Finding: an approval row written straight into the database as `approved` is never checked
    against anything. Without signed votes in the chain the gate refuses it, and says why."""
    approval_id = gated.parked("c1")
    sql(gated.db, "UPDATE approval SET state = 'approved' WHERE id = ?", approval_id)
    with pytest.raises(PolicyDenied, match="signed votes in the audit reach 0 of the 1"):
        gated.call("agent", "c1")
    assert RAN == []
    assert gated.approvals.get(approval_id).state == "rejected"  # the loop stops retrying it
    assert gated.audit.events(action="approval.unsupported")


def test_a_forged_approval_row_with_forged_votes_does_not_run(gated: Gated) -> None:
    """A whole approval row written by hand, with a vote list and an unsigned vote event."""
    sql(
        gated.db,
        "INSERT INTO approval (call_id, skill, args, requester, rule, quorum, state, votes, "
        "created_at, files, requested_via) VALUES ('c2', 'tamper_destroy', '{\"job_id\": 4}', "
        "'agent', 'destroy', 1, 'approved', '[{\"principal\": \"alice\", \"approve\": true}]', "
        "'2026-12-02 03:00:00', '{}', 'api')",
    )
    with pytest.raises(PolicyDenied, match="no approval.request event"):
        gated.call("agent", "c2")
    assert RAN == []


def test_a_lowered_quorum_is_held_to_the_signed_request(gated: Gated) -> None:
    """Two approvals needed (the signed request says so); lowering the row's quorum to one and
    approving it after one vote does not run it."""
    data = yaml.safe_load(
        Path(load_policy.__code__.co_filename).with_name("default.yaml").read_text()
    )
    data["approvals"].insert(0, {"id": "two", "skills": ["tamper_destroy"], "quorum": 2})
    gated.engine = PolicyEngine(Policy.model_validate(data))
    gated.approvals.engine = gated.engine
    gated.gate = Gate(gated.engine, gated.audit, gated.approvals, gated.store)
    approval_id = gated.parked("c3")
    assert gated.approvals.get(approval_id).quorum == 2
    gated.approvals.vote(approval_id, "alice", True, datetime(2026, 12, 2, 3, 1))
    sql(gated.db, "UPDATE approval SET quorum = 1, state = 'approved' WHERE id = ?", approval_id)
    with pytest.raises(PolicyDenied, match="reach 1 of the 2"):
        gated.call("agent", "c3")
    assert RAN == []


def test_every_report_publishes_and_names_the_chain_head(home, tmp_path: Path) -> None:
    """A report kept by a person is one more copy of the head, so `report` publishes it too."""
    from nightshift.agent.doors.api import Client

    from conftest import nightshift

    Client().submit(spec={"name": "r", "command": ["{python}", "-c", "pass"]})
    heads = tmp_path / "heads.jsonl"
    r = nightshift("report", env={"NIGHTSHIFT_AUDIT__PUBLISH_FILE": str(heads)})
    assert r.returncode == 0, r.stdout + r.stderr
    head = json.loads(heads.read_text().splitlines()[-1])
    newest = (
        sqlite3.connect(home / "nightshift.db")
        .execute("select id, hash from auditevent order by id desc limit 1")
        .fetchone()
    )
    assert (head["seq"], head["hash"]) == newest
    assert f"audit head: event {newest[0]}, hash {newest[1]}" in r.stdout


def test_a_command_that_appends_publishes_the_head_at_exit(home, tmp_path: Path) -> None:
    """The publish settings reach every process (the daemon's schedule, a CLI call's exit), not
    only `audit publish`: a submit leaves the head it wrote in the published file."""
    from conftest import nightshift

    heads = tmp_path / "heads.jsonl"
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "p", "command": ["{python}", "-c", "pass"]}))
    r = nightshift("submit", str(spec), env={"NIGHTSHIFT_AUDIT__PUBLISH_FILE": str(heads)})
    assert r.returncode == 0, r.stdout + r.stderr
    newest = (
        sqlite3.connect(home / "nightshift.db")
        .execute("select id, hash from auditevent order by id desc limit 1")
        .fetchone()
    )
    head = json.loads(heads.read_text().splitlines()[-1])
    assert (head["seq"], head["hash"]) == newest


# Removals that need no key -------------------------------------------------------------------


def test_cut_events_with_an_unsigned_anchor_are_caught_without_published_heads(
    log: AuditLog, db: Path
) -> None:
    """Finding: cut the newest events and rewrite audit.anchor (it was unsigned): verify said OK.
    The anchor is signed now; one written without the key is refused."""
    fill(log, 5)
    sql(db, "DELETE FROM auditevent WHERE id >= 4")
    repoint_anchor(log, db, with_key=False)
    res = open_log(db).verify()
    assert not res.ok and "is not signed by the audit key" in res.reason, res


def test_events_cut_before_a_signed_anchor_change_its_count(log: AuditLog, db: Path) -> None:
    """The anchor carries the count of events up to it: removing events before it, then
    rechaining (keeping the old signatures is impossible: they sign the old hashes) is caught by
    the signatures; here the count alone tells a deletion in the middle without rechaining."""
    fill(log, 5)
    sql(db, "DELETE FROM auditevent WHERE id = 5")
    sql(db, "UPDATE auditevent SET prev_hash = prev_hash WHERE id = 4")
    anchor = json.loads(log.anchor_path.read_text())
    anchor["id"], anchor["hash"] = (
        4,
        sqlite3.connect(db).execute("SELECT hash FROM auditevent WHERE id = 4").fetchone()[0],
    )
    log.anchor_path.write_text(json.dumps(anchor))  # count 5 and the old signature kept
    res = open_log(db).verify()
    assert not res.ok, res


def test_an_emptied_log_and_anchor_are_not_ok_while_the_key_exists(log: AuditLog, db: Path) -> None:
    """Finding: delete all history and the anchor: 'OK: 0 audit events'. The key exists, so
    events were written: an empty log is a deleted one."""
    fill(log, 3)
    sql(db, "DELETE FROM auditevent")
    log.anchor_path.unlink()
    res = open_log(db).verify()
    assert not res.ok and "the history was deleted" in res.reason, res


def test_a_deleted_key_and_stripped_signatures_are_not_ok(log: AuditLog, db: Path) -> None:
    """Finding: delete the key, strip every signature, rehash: 'signatures intact; N unsigned'.
    The store records which key signs its events."""
    fill(log, 3)
    log.key_path.unlink()
    sql(db, "UPDATE auditevent SET signature = NULL")
    res = open_log(db).verify()
    assert not res.ok and "the key was deleted or replaced" in res.reason, res
