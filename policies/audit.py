"""The audit log: append-only, hash-chained events; the newest hash is kept outside the database.

Each event's hash is sha256 over the previous event's hash and the canonical JSON of
(ts, actor, action, skill, call_id, job_id, payload); the first event chains from 64 zeros. After
every append the newest (id, hash) is written to an anchor file, so `verify` also notices when the
newest events are removed, or the whole chain is rewritten. Appends from several processes are
serialised by a write lock taken before the last event is read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import insert
from sqlmodel import Session, col, select

from nightshift.runtime import locks
from nightshift.runtime.errors import StoreError
from nightshift.runtime.store import AuditEvent, Store, dumps, utcnow

GENESIS = "0" * 64
_PAGE = 1000


class VerifyResult(BaseModel):
    """What `nightshift audit verify` reports."""

    ok: bool
    count: int
    first_bad_id: int | None = None
    reason: str


def iso_utc(when: datetime) -> str:
    """ISO 8601 in UTC with a `Z`; a naive datetime is taken to be UTC already (as the store's)."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds") + "Z"


def event_hash(prev_hash: str, ts: str, actor: str, action: str, skill: str | None,
               call_id: str | None, job_id: int | None, payload: dict[str, Any]) -> str:
    body = dumps({"ts": ts, "actor": actor, "action": action, "skill": skill,
                  "call_id": call_id, "job_id": job_id, "payload": payload})
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def job_id_of(args: dict[str, Any]) -> int | None:
    """The `job_id` argument of a call, when it has an integer one: audit rows index it."""
    v = args.get("job_id")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _hash_of(ev: AuditEvent, prev_hash: str) -> str:
    return event_hash(prev_hash, ev.ts, ev.actor, ev.action, ev.skill, ev.call_id, ev.job_id,
                      ev.payload)


@contextmanager
def write_transaction(store: Store, table: str) -> Iterator[Session]:
    """A session holding the database's write lock from its first statement, so that a read
    followed by a write cannot interleave with another process (SQLite: BEGIN IMMEDIATE)."""
    with store.session() as s:
        conn = s.connection()
        dialect = conn.dialect.name
        if dialect == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif dialect == "postgresql":
            conn.exec_driver_sql(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE')
        yield s


class AuditLog:
    """Appends and verifies the chain; `clock` gives the time of events appended without a `ts`."""

    def __init__(self, store: Store, anchor_path: str | Path, *,
                 clock: Callable[[], datetime] = utcnow):
        self.store = store
        self.anchor_path = Path(anchor_path)
        self.clock = clock
        self._deferred: tuple[int, str] | None = None
        self._depth = 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Appends inside write the anchor once, at the end (one call's verdict, start and
        result). Each event is committed as it is appended; only the anchor waits."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._deferred is not None:
                pending, self._deferred = self._deferred, None
                self._write_anchor(*pending)

    def now_iso(self) -> str:
        return iso_utc(self.clock())

    def append(self, actor: str, action: str, *, skill: str | None = None,
               call_id: str | None = None, job_id: int | None = None,
               payload: dict[str, Any] | None = None,
               ts: str | datetime | None = None) -> AuditEvent:
        """Append one event; safe from several processes at once. Returns the stored event."""
        return self.append_many([{"actor": actor, "action": action, "skill": skill,
                                  "call_id": call_id, "job_id": job_id, "payload": payload,
                                  "ts": ts}])[0]

    def append_many(self, items: list[dict[str, Any]]) -> list[AuditEvent]:
        """Append several events (each with append's keywords) in one write transaction: one
        call's verdict and start land together, chained in order."""
        rows = []
        for it in items:
            ts = it.get("ts")
            stamp = iso_utc(ts) if isinstance(ts, datetime) else (ts or self.now_iso())
            # Canonical round trip: what is hashed is exactly what the JSON column gives back.
            body = json.loads(dumps(it.get("payload") or {}))
            rows.append({"ts": stamp, "actor": it["actor"], "action": it["action"],
                         "skill": it.get("skill"), "call_id": it.get("call_id"),
                         "job_id": it.get("job_id"), "payload": body})
        table = AuditEvent.__table__  # type: ignore[attr-defined]
        with write_transaction(self.store, AuditEvent.__tablename__) as s:
            conn = s.connection()
            last = conn.execute(select(table.c.hash).order_by(table.c.id.desc()).limit(1)).first()
            prev = last[0] if last else GENESIS
            for r in rows:
                r["prev_hash"] = prev
                r["hash"] = prev = event_hash(prev, r["ts"], r["actor"], r["action"], r["skill"],
                                              r["call_id"], r["job_id"], r["payload"])
            ids = conn.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True),
                               rows).scalars().all()
        events = [AuditEvent(id=i, **r) for i, r in zip(ids, rows, strict=True)]
        newest = events[-1]
        assert newest.id is not None
        if self._depth:
            self._deferred = (newest.id, newest.hash)
        else:
            self._write_anchor(newest.id, newest.hash)
        return events

    def events(self, *, actor: str | None = None, action: str | None = None,
               skill: str | None = None, call_id: str | None = None, job_id: int | None = None,
               after_id: int | None = None, limit: int | None = None,
               newest_first: bool = False) -> list[AuditEvent]:
        """Events matching every filter given, oldest first (or newest first)."""
        q = select(AuditEvent)
        for column, value in ((AuditEvent.actor, actor), (AuditEvent.action, action),
                              (AuditEvent.skill, skill), (AuditEvent.call_id, call_id),
                              (AuditEvent.job_id, job_id)):
            if value is not None:
                q = q.where(column == value)
        if after_id is not None:
            q = q.where(col(AuditEvent.id) > after_id)
        q = q.order_by(col(AuditEvent.id).desc() if newest_first else col(AuditEvent.id))
        if limit is not None:
            q = q.limit(limit)
        with self.store.session() as s:
            return list(s.exec(q))

    def head(self) -> AuditEvent | None:
        found = self.events(limit=1, newest_first=True)
        return found[0] if found else None

    def anchor(self) -> dict[str, Any] | None:
        """The anchor file's {id, hash}, or None when there is none."""
        try:
            data = json.loads(self.anchor_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read the audit anchor {self.anchor_path}: {exc}") from exc
        if not (isinstance(data, dict) and isinstance(data.get("id"), int)
                and isinstance(data.get("hash"), str)):
            raise StoreError(f"the audit anchor {self.anchor_path} is not {{id, hash}}: {data!r}")
        return data

    def verify(self) -> VerifyResult:
        """Recompute the chain and compare its end with the anchor."""
        anchor = self.anchor()  # read first: an append racing with us only moves the end further
        count, prev, last_id = 0, GENESIS, None
        anchored_hash: str | None = None
        with self.store.session() as s:
            while True:
                q = select(AuditEvent).order_by(col(AuditEvent.id)).limit(_PAGE)
                if last_id is not None:
                    q = q.where(col(AuditEvent.id) > last_id)
                page = list(s.exec(q))
                for ev in page:
                    count += 1
                    if ev.prev_hash != prev:
                        what = ("the first event does not start the chain" if prev == GENESIS
                                else "its prev_hash is not the hash of the event before it")
                        return VerifyResult(ok=False, count=count, first_bad_id=ev.id, reason=(
                            f"event {ev.id}: {what}: an event before it was removed, reordered "
                            "or edited"))
                    if _hash_of(ev, prev) != ev.hash:
                        return VerifyResult(ok=False, count=count, first_bad_id=ev.id, reason=(
                            f"event {ev.id}: its contents do not match its hash: it was edited"))
                    if anchor is not None and ev.id == anchor["id"]:
                        anchored_hash = ev.hash
                    prev, last_id = ev.hash, ev.id
                if len(page) < _PAGE:
                    break
        if anchor is None:
            if count:
                return VerifyResult(ok=False, count=count, reason=(
                    f"the anchor file {self.anchor_path} is missing but the log holds {count} "
                    "events: it was deleted, or this is not the anchor of this database"))
            return VerifyResult(ok=True, count=0, reason="empty log")
        if last_id is None or anchor["id"] > last_id:
            return VerifyResult(ok=False, count=count, first_bad_id=anchor["id"], reason=(
                f"the anchor names event {anchor['id']} but the newest event in the database is "
                f"{last_id}: the newest events were removed"))
        if anchored_hash is None:
            return VerifyResult(ok=False, count=count, first_bad_id=anchor["id"], reason=(
                f"event {anchor['id']}, named by the anchor, is missing from the database"))
        if anchored_hash != anchor["hash"]:
            return VerifyResult(ok=False, count=count, first_bad_id=anchor["id"], reason=(
                f"event {anchor['id']} has a different hash than the anchor records: the chain "
                "was rewritten"))
        return VerifyResult(ok=True, count=count, reason=f"{count} events, chain and anchor intact")

    # The anchor ---------------------------------------------------------------------------------

    def _write_anchor(self, event_id: int, digest: str) -> None:
        """Atomically replace the anchor; never move it back (appends may finish out of order).
        Not fsynced, like the store's own commits (WAL, synchronous=NORMAL): a power cut can cost
        either its last writes; an anchor trailing the database is accepted by verify."""
        path = self.anchor_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with locks.exclusive(path.with_name(path.name + ".lock"), error=StoreError):
                current = self.anchor()
                if current is not None and current["id"] >= event_id:
                    return
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                with open(tmp, "w") as fh:
                    fh.write(json.dumps({"id": event_id, "hash": digest}))
                os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write the audit anchor {path}: {exc}") from exc
