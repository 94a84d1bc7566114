"""The hash-chained audit log: appends, verification, every kind of tampering, many writers."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.policies.audit import GENESIS, AuditLog, event_hash, stored_hash_matches
from nightshift.runtime.store.db import Store, dumps

from conftest import Clock, empty_store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ns.db"


@pytest.fixture
def log(db: Path, tmp_path: Path) -> AuditLog:
    return AuditLog(empty_store(db), tmp_path / "audit.anchor", clock=Clock())


def fill(log: AuditLog, n: int) -> None:
    for i in range(n):
        log.append(
            "alice",
            "test.step",
            skill="test_skill",
            call_id=f"c{i}",
            job_id=i,
            payload={"i": i, "nested": {"b": [1, 2.5, None], "a": "x"}},
        )


def sql(db: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(statement, params)


def test_hash_formula_is_pinned(log: AuditLog) -> None:
    """sha256(prev_hash + canonical JSON of the event) is pinned: other tools recompute it."""
    ev = log.append(
        "alice",
        "job.cancel",
        skill="cancel_job",
        call_id="c1",
        job_id=7,
        payload={"why": "stuck", "a": 1},
    )
    body = (
        '{"action":"job.cancel","actor":"alice","call_id":"c1","job_id":7,'
        '"payload":{"a":1,"why":"stuck"},"skill":"cancel_job",'
        '"ts":"2026-12-02T03:00:01.000000Z"}'
    )
    assert ev.ts == "2026-12-02T03:00:01.000000Z"
    assert ev.prev_hash == GENESIS == "0" * 64
    assert ev.hash == hashlib.sha256((GENESIS + body).encode()).hexdigest()
    second = log.append("system", "x", payload={})
    assert second.prev_hash == ev.hash


def test_ts_may_be_passed_in(log: AuditLog) -> None:
    """Callers that hold `now` (the gate, skills' contexts) stamp events with it; aware is UTC."""
    aware = datetime(2026, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=8)))
    assert log.append("a", "x", ts=aware).ts == "2026-01-01T04:00:00.000000Z"
    assert log.append("a", "x", ts="2026-01-01T05:00:00Z").ts == "2026-01-01T05:00:00Z"


def test_append_verify_and_list(log: AuditLog) -> None:
    """An untouched log verifies; `events` filters by job, actor, action and call."""
    assert log.verify().ok and log.verify().count == 0
    fill(log, 5)
    res = log.verify()
    assert (res.ok, res.count, res.first_bad_id) == (True, 5, None)
    assert [e.job_id for e in log.events(job_id=3)] == [3]
    assert [e.id for e in log.events(newest_first=True, limit=2)] == [5, 4]
    assert len(log.events(actor="alice", action="test.step")) == 5
    assert log.events(call_id="c2")[0].payload["nested"]["b"] == [1, 2.5, None]
    assert [e.id for e in log.events(after_id=3)] == [4, 5]
    anchor = log.anchor()
    assert (anchor["id"], anchor["hash"], anchor["count"]) == (5, log.head().hash, 5)


def test_edited_payload_is_detected(log: AuditLog, db: Path) -> None:
    """Someone editing an event's payload with sqlite3 breaks its hash."""
    fill(log, 5)
    sql(db, "UPDATE auditevent SET payload = ? WHERE id = 3", json.dumps({"i": 99}))
    res = log.verify()
    assert (res.ok, res.first_bad_id) == (False, 3)
    assert "edited" in res.reason


def test_edited_actor_is_detected(log: AuditLog, db: Path) -> None:
    """Every hashed field counts, not only the payload: blaming someone else is caught."""
    fill(log, 3)
    sql(db, "UPDATE auditevent SET actor = 'bob' WHERE id = 2")
    assert log.verify().first_bad_id == 2


def test_deleted_middle_event_is_detected(log: AuditLog, db: Path) -> None:
    """A removed event leaves the next one pointing at a hash that is no longer there."""
    fill(log, 5)
    sql(db, "DELETE FROM auditevent WHERE id = 3")
    res = log.verify()
    assert (res.ok, res.first_bad_id) == (False, 4)
    assert "removed, reordered or edited" in res.reason


def test_deleted_first_event_is_detected(log: AuditLog, db: Path) -> None:
    """The chain must start at 64 zeros; dropping the oldest event is not invisible."""
    fill(log, 3)
    sql(db, "DELETE FROM auditevent WHERE id = 1")
    res = log.verify()
    assert (res.ok, res.first_bad_id) == (False, 2)
    assert "first event" in res.reason


def test_reordered_events_are_detected(log: AuditLog, db: Path) -> None:
    """Swapping two events' places (ids) breaks the prev links."""
    fill(log, 4)
    sql(db, "UPDATE auditevent SET id = 100 WHERE id = 2")
    sql(db, "UPDATE auditevent SET id = 2 WHERE id = 3")
    sql(db, "UPDATE auditevent SET id = 3 WHERE id = 100")
    res = log.verify()
    assert (res.ok, res.first_bad_id) == (False, 2)


def test_deleted_newest_events_detected_by_anchor(log: AuditLog, db: Path) -> None:
    """Truncating the tail leaves a valid chain; only the anchor outside the DB can tell."""
    fill(log, 5)
    sql(db, "DELETE FROM auditevent WHERE id >= 4")
    res = log.verify()
    assert (res.ok, res.first_bad_id, res.count) == (False, 5, 3)
    assert "newest events were removed" in res.reason
    sql(db, "DELETE FROM auditevent")
    res = log.verify()
    assert (res.ok, res.count) == (False, 0) and "the history was deleted" in res.reason


def test_rewritten_chain_detected_by_anchor(db: Path, tmp_path: Path) -> None:
    """A forger who recomputes every hash still cannot match the anchored newest hash."""
    anchor = tmp_path / "audit.anchor"
    real = AuditLog(Store(f"sqlite:///{db}"), anchor, clock=Clock())
    fill(real, 3)
    forged_db = tmp_path / "forged.db"
    forged = AuditLog(Store(f"sqlite:///{forged_db}"), tmp_path / "scratch.anchor", clock=Clock())
    for i in range(3):
        forged.append("alice", "test.step", payload={"i": i, "forged": True})
    sql(db, "DELETE FROM auditevent")
    with sqlite3.connect(db) as conn:
        conn.execute("ATTACH DATABASE ? AS f", (str(forged_db),))
        conn.execute("INSERT INTO auditevent SELECT * FROM f.auditevent")
    res = real.verify()
    assert (res.ok, res.first_bad_id) == (False, 3)
    assert "rewritten" in res.reason


def test_missing_anchor_with_events_is_not_ok(log: AuditLog) -> None:
    """Deleting the anchor to hide a truncation must itself be reported."""
    fill(log, 2)
    log.flush()
    log.anchor_path.unlink()
    res = log.verify()
    assert not res.ok and "anchor file" in res.reason


def test_anchor_is_replaced_atomically_and_never_moves_back(log: AuditLog) -> None:
    """The anchor is written whole (tmp + rename) and an out-of-order writer cannot rewind it."""
    fill(log, 3)
    log.flush()
    head = log.head()
    log._write_anchor(2, "0" * 64)
    assert {k: log.anchor()[k] for k in ("id", "hash")} == {"id": 3, "hash": head.hash}
    assert sorted(
        p.name for p in log.anchor_path.parent.iterdir() if p.name.startswith("audit.anchor")
    ) == ["audit.anchor", "audit.anchor.lock"]


def test_the_anchor_trails_by_at_most_anchor_every_events(db: Path, tmp_path: Path) -> None:
    """Group commit: a process's first append anchors at once, then every anchor_every-th; in
    between, another process's verify finds the chain whole and counts the events after the
    anchor, saying what they are."""
    anchor = tmp_path / "audit.anchor"
    log = AuditLog(
        Store(f"sqlite:///{db}"), anchor, clock=Clock(), anchor_every=4, anchor_lag_s=600
    )
    fill(log, 1)
    assert log.anchor()["id"] == 1
    fill(log, 3)
    assert log.anchor()["id"] == 1  # three behind: not yet
    fill(log, 1)
    assert log.anchor()["id"] == 5
    fill(log, 2)
    other = AuditLog(Store(f"sqlite:///{db}"), anchor)
    res = other.verify()
    assert (res.ok, res.count, res.unanchored) == (True, 7, 2), res
    assert "the anchor names event 5 and the newest 2 come after it" in res.reason
    assert "would not be noticed" in res.reason
    assert log.verify().unanchored == 0  # verify anchors its own process's events first
    assert other.verify().reason.endswith("chain and anchor intact")


def test_the_anchor_catches_up_within_anchor_lag_s_without_more_appends(
    log: AuditLog, db: Path, tmp_path: Path
) -> None:
    quiet = AuditLog(
        Store(f"sqlite:///{db}"), tmp_path / "audit.anchor", anchor_every=1000, anchor_lag_s=0.05
    )
    fill(quiet, 3)
    deadline = time.monotonic() + 10
    while quiet.anchor()["id"] != 3:
        assert time.monotonic() < deadline, quiet.anchor()
        time.sleep(0.01)


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from nightshift.policies.audit import AuditLog
    from nightshift.runtime.store.db import Store
    db, anchor = sys.argv[1:]
    log = AuditLog(Store("sqlite:///" + db), anchor, anchor_every=100, anchor_lag_s=600)
    for i in range(10):
        log.append("writer", "test.killed", payload={"i": i})
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_writer_killed_between_anchors_leaves_a_trail_the_next_append_anchors(
    db: Path, tmp_path: Path
) -> None:
    anchor = tmp_path / "audit.anchor"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(db), str(anchor)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    log = AuditLog(Store(f"sqlite:///{db}"), anchor)
    assert log.anchor()["id"] == 1  # its first append, and no later one
    res = log.verify()
    assert (res.ok, res.count, res.unanchored) == (True, 10, 9), res
    log.append("alice", "test.after")
    res = log.verify()
    assert (res.ok, res.count, res.unanchored) == (True, 11, 0), res


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nightshift.policies.audit import AuditLog
    from nightshift.runtime.store.db import Store
    db, anchor, who, n, go = sys.argv[1:]
    log = AuditLog(Store("sqlite:///" + db), anchor)
    deadline = time.time() + 60
    while not Path(go).exists() and time.time() < deadline:
        time.sleep(0.005)
    for i in range(int(n)):
        log.append(who, "test.concurrent", payload={"i": i})
""")


def test_concurrent_appends_from_four_processes(db: Path, tmp_path: Path) -> None:
    """Several processes (CLI, daemon, chat) append at once; the chain must stay one line."""
    anchor = tmp_path / "audit.anchor"
    log = AuditLog(Store(f"sqlite:///{db}"), anchor)  # creates the schema once, up front
    go = tmp_path / "go"
    n = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), str(anchor), f"w{k}", str(n), str(go)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(4)
    ]
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    events = log.events()
    assert len(events) == 4 * n
    prevs = [e.prev_hash for e in events]
    assert len(set(prevs)) == len(prevs), "two events chained onto the same predecessor"
    assert {e.actor for e in events} == {"w0", "w1", "w2", "w3"}
    res = log.verify()
    assert (res.ok, res.count) == (True, 4 * n), res.reason
    assert log.anchor()["id"] == events[-1].id


# The verify fast path: hashing the stored canonical payload text must accept exactly what the
# slow path (decode, re-encode) accepts, whatever the fields hold.
_text = st.text(max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_text, kids, max_size=3),
    max_leaves=8,
)
_row = st.fixed_dictionaries(
    {
        "ts": _text,
        "actor": _text,
        "action": _text,
        "skill": st.none() | _text,
        "call_id": st.none() | _text,
        "job_id": st.none() | st.integers(),
        "payload": st.dictionaries(_text, _json, max_size=4),
    }
)


def _digest(r: dict) -> str:
    return event_hash(
        "p", r["ts"], r["actor"], r["action"], r["skill"], r["call_id"], r["job_id"], r["payload"]
    )


def _matches(digest: str, r: dict, text: str) -> bool:
    fields = (r["ts"], r["actor"], r["action"], r["skill"], r["call_id"], r["job_id"])
    return stored_hash_matches(digest, "p", *fields, text)


@settings(max_examples=300, deadline=None)
@given(row=_row, other=_row)
def test_verify_fast_path_accepts_what_the_slow_path_accepts(row, other) -> None:
    digest = _digest(row)
    assert _matches(digest, row, dumps(row["payload"]))  # canonical text: the fast path
    assert _matches(digest, row, json.dumps(row["payload"]))  # older text: the slow path
    # Any other row — fields or payload moved between columns, escapes, other values — is
    # accepted only if its canonical event is the same one.
    for mixed in (
        other,
        {**row, "payload": other["payload"]},
        {**row, "skill": other["skill"], "ts": other["ts"]},
    ):
        same = _digest(mixed) == digest
        assert _matches(digest, mixed, dumps(mixed["payload"])) == same


def test_verify_fast_path_refuses_a_payload_that_swallows_the_next_field() -> None:
    """A boundary shift: the payload text takes over the skill token of the hashed body."""
    row = {"ts": "t", "actor": "a", "action": "x", "skill": 'k"', "call_id": None, "job_id": 1}
    digest = _digest({**row, "payload": {}})
    forged = dict(row, skill=None)
    assert not _matches(digest, {**forged, "payload": {}}, '{},"skill":"k\\""')
    assert _matches(digest, {**row, "payload": {}}, "{}")
