"""The audit log: append-only, hash-chained events; the newest hash is kept outside the database.

Each event's hash is sha256 over the previous event's hash and the canonical JSON of
(ts, actor, action, skill, call_id, job_id, payload); the first event chains from 64 zeros. After
appends the newest (id, hash) is written to an anchor file, so `verify` also notices when the
newest events are removed, or the whole chain is rewritten. Appends from several processes are
serialised by a write lock taken before the last event is read.

The anchor is group-committed: written after the events it names are committed (never ahead of the
database), at most `anchor_every` events and `anchor_lag_s` seconds behind a running process, and
when the process exits. Rewriting a file per event would cost more than the event. A process killed
with SIGKILL can leave its last events after the anchor until the next append anchors them;
`verify` counts such a trailing run and says that removing it would not be noticed.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, Field
from sqlalchemy import Connection, insert
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from nightshift.runtime import locks
from nightshift.runtime.errors import StoreError
from nightshift.runtime.store import AuditEvent, Store, dumps, utcnow

GENESIS = "0" * 64
_PAGE = 5000
ANCHOR_EVERY = 1000
ANCHOR_LAG_S = 0.2


class Appended(NamedTuple):
    """An event as stored by append (the ORM object would cost more to build than the insert)."""

    id: int
    ts: str
    actor: str
    action: str
    skill: str | None
    call_id: str | None
    job_id: int | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str


class VerifyResult(BaseModel):
    """What `nightshift audit verify` reports."""

    ok: bool
    count: int
    first_bad_id: int | None = None
    unanchored: int = Field(
        0,
        description="events after the anchor: chained, but their removal "
        "would not be noticed (see the module docstring)",
    )
    reason: str


def iso_utc(when: datetime) -> str:
    """ISO 8601 in UTC with a `Z`; a naive datetime is taken to be UTC already (as the store's)."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds") + "Z"


def event_hash(
    prev_hash: str,
    ts: str,
    actor: str,
    action: str,
    skill: str | None,
    call_id: str | None,
    job_id: int | None,
    payload: dict[str, Any],
) -> str:
    body = dumps(
        {
            "ts": ts,
            "actor": actor,
            "action": action,
            "skill": skill,
            "call_id": call_id,
            "job_id": job_id,
            "payload": payload,
        }
    )
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def job_id_of(args: dict[str, Any]) -> int | None:
    """The `job_id` argument of a call, when it has an integer one: audit rows index it."""
    v = args.get("job_id")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _lock_for_write(conn: Connection, table: str) -> None:
    """Take the database's write lock at the first statement, so that a read followed by a write
    cannot interleave with another process (SQLite: BEGIN IMMEDIATE)."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        conn.exec_driver_sql(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE')


@contextmanager
def write_transaction(store: Store, table: str) -> Iterator[Session]:
    """A session holding the database's write lock from its first statement."""
    with store.session() as s:
        _lock_for_write(s.connection(), table)
        yield s


_TABLE = AuditEvent.__table__  # type: ignore[attr-defined]
_NEWEST_HASH = select(_TABLE.c.hash).order_by(_TABLE.c.id.desc()).limit(1)
_INSERT = insert(_TABLE).returning(_TABLE.c.id, sort_by_parameter_order=True)

_OPEN_LOGS: weakref.WeakSet[AuditLog] = weakref.WeakSet()


@atexit.register
def _anchor_at_exit() -> None:
    for log in list(_OPEN_LOGS):
        log.flush()


class AuditLog:
    """Appends and verifies the chain; `clock` gives the time of events appended without a `ts`.
    The anchor trails by at most `anchor_every` events and `anchor_lag_s` seconds (0: every
    append writes it)."""

    def __init__(
        self,
        store: Store,
        anchor_path: str | Path,
        *,
        clock: Callable[[], datetime] = utcnow,
        anchor_every: int = ANCHOR_EVERY,
        anchor_lag_s: float = ANCHOR_LAG_S,
    ):
        self.store = store
        self.anchor_path = Path(anchor_path)
        self.clock = clock
        self.anchor_every = max(1, anchor_every)
        self.anchor_lag_s = anchor_lag_s
        self._guard = threading.Lock()
        self._pending: tuple[int, str] | None = None  # committed, not yet in the anchor
        self._behind = 0
        self._timer: threading.Timer | None = None
        self._pid = os.getpid()
        self._anchored_once = False  # a process's first append anchors at once
        _OPEN_LOGS.add(self)

    def now_iso(self) -> str:
        return iso_utc(self.clock())

    def append(
        self,
        actor: str,
        action: str,
        *,
        skill: str | None = None,
        call_id: str | None = None,
        job_id: int | None = None,
        payload: dict[str, Any] | None = None,
        ts: str | datetime | None = None,
    ) -> Appended:
        """Append one event; safe from several processes at once. Returns the stored event."""
        return self.append_many(
            [
                {
                    "actor": actor,
                    "action": action,
                    "skill": skill,
                    "call_id": call_id,
                    "job_id": job_id,
                    "payload": payload,
                    "ts": ts,
                }
            ]
        )[0]

    def append_many(self, items: list[dict[str, Any]]) -> list[Appended]:
        """Append several events (each with append's keywords) in one write transaction: one
        call's verdict and start land together, chained in order."""
        rows = []
        for it in items:
            ts = it.get("ts")
            stamp = iso_utc(ts) if isinstance(ts, datetime) else (ts or self.now_iso())
            # Canonical round trip: what is hashed is exactly what the JSON column gives back.
            body = json.loads(dumps(it.get("payload") or {}))
            rows.append(
                {
                    "ts": stamp,
                    "actor": it["actor"],
                    "action": it["action"],
                    "skill": it.get("skill"),
                    "call_id": it.get("call_id"),
                    "job_id": it.get("job_id"),
                    "payload": body,
                }
            )
        # SQLAlchemy Core on one connection, statements built once: the ORM's session and unit
        # of work cost more than the insert itself.
        with self.store.engine.connect() as conn:
            try:
                _lock_for_write(conn, AuditEvent.__tablename__)
                last = conn.execute(_NEWEST_HASH).first()
                prev = last[0] if last else GENESIS
                for r in rows:
                    r["prev_hash"] = prev
                    r["hash"] = prev = event_hash(
                        prev,
                        r["ts"],
                        r["actor"],
                        r["action"],
                        r["skill"],
                        r["call_id"],
                        r["job_id"],
                        r["payload"],
                    )
                ids = conn.execute(_INSERT, rows).scalars().all()
                conn.commit()
            except OperationalError as exc:
                self.store.raise_if_busy(exc)
                raise
        self._committed(ids[-1], rows[-1]["hash"], len(rows))
        return [Appended(id=i, **r) for i, r in zip(ids, rows, strict=True)]

    def _committed(self, event_id: int, digest: str, n: int) -> None:
        """Note committed events; write the anchor when enough are behind it, else make sure a
        timer writes it within anchor_lag_s."""
        with self._guard:
            if os.getpid() != self._pid:  # a forked child: the parent's timer is not ours
                self._pid, self._timer, self._pending, self._behind = os.getpid(), None, None, 0
                self._anchored_once = False
            if self._pending is None or event_id > self._pending[0]:  # threads finish in any order
                self._pending = (event_id, digest)
            self._behind += n
            if self._anchored_once and self._behind < self.anchor_every and self.anchor_lag_s > 0:
                if self._timer is None:
                    self._timer = threading.Timer(self.anchor_lag_s, self._flush_from_timer)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def _flush_from_timer(self) -> None:
        try:
            self.flush()
        except StoreError:
            pass  # the next append or flush tries again and raises where a caller sees it

    def flush(self) -> None:
        """Write the anchor for every event committed so far by this log (at exit, before
        verify, and by the group commit)."""
        with self._guard:
            pending, self._pending, self._behind = self._pending, None, 0
            timer, self._timer = self._timer, None
            if timer is not None and timer is not threading.current_thread():
                timer.cancel()
            if pending is None or os.getpid() != self._pid:
                return
            try:
                self._write_anchor(*pending)
                self._anchored_once = True
            except StoreError:
                if self._pending is None:
                    self._pending = pending
                raise

    def events(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        skill: str | None = None,
        call_id: str | None = None,
        job_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[AuditEvent]:
        """Events matching every filter given, oldest first (or newest first)."""
        q = select(AuditEvent)
        for column, value in (
            (AuditEvent.actor, actor),
            (AuditEvent.action, action),
            (AuditEvent.skill, skill),
            (AuditEvent.call_id, call_id),
            (AuditEvent.job_id, job_id),
        ):
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
        if not (
            isinstance(data, dict)
            and isinstance(data.get("id"), int)
            and isinstance(data.get("hash"), str)
        ):
            raise StoreError(f"the audit anchor {self.anchor_path} is not {{id, hash}}: {data!r}")
        return data

    def verify(self) -> VerifyResult:
        """Recompute the chain and compare its end with the anchor."""
        self.flush()  # this process's own events are anchored before they are judged
        anchor = self.anchor()  # read first: an append racing with us only moves the end further
        count, prev, last_id = 0, GENESIS, None
        anchored_hash: str | None = None
        after_anchor = 0
        c = _TABLE.c
        # Core rows, a page at a time: ORM objects would cost more than hashing them.
        columns: list[Any] = [
            c.id,
            c.ts,
            c.actor,
            c.action,
            c.skill,
            c.call_id,
            c.job_id,
            c.payload,
            c.prev_hash,
            c.hash,
        ]
        with self.store.engine.connect() as conn:
            while True:
                q = select(*columns).order_by(c.id).limit(_PAGE)
                if last_id is not None:
                    q = q.where(c.id > last_id)
                page = conn.execute(q).all()
                for (
                    ev_id,
                    ts,
                    actor,
                    action,
                    skill,
                    call_id,
                    job_id,
                    payload,
                    prev_hash,
                    digest,
                ) in page:
                    count += 1
                    if prev_hash != prev:
                        what = (
                            "the first event does not start the chain"
                            if prev == GENESIS
                            else "its prev_hash is not the hash of the event before it"
                        )
                        return VerifyResult(
                            ok=False,
                            count=count,
                            first_bad_id=ev_id,
                            reason=(
                                f"event {ev_id}: {what}: an event before it was removed, reordered "
                                "or edited"
                            ),
                        )
                    if (
                        event_hash(prev, ts, actor, action, skill, call_id, job_id, payload)
                        != digest
                    ):
                        return VerifyResult(
                            ok=False,
                            count=count,
                            first_bad_id=ev_id,
                            reason=(
                                f"event {ev_id}: its contents do not match its hash: it was edited"
                            ),
                        )
                    if anchor is not None:
                        if ev_id == anchor["id"]:
                            anchored_hash = digest
                        elif ev_id > anchor["id"]:
                            after_anchor += 1
                    prev, last_id = digest, ev_id
                if len(page) < _PAGE:
                    break
        if anchor is None:
            if count:
                return VerifyResult(
                    ok=False,
                    count=count,
                    reason=(
                        f"the anchor file {self.anchor_path} is missing but the log holds {count} "
                        "events: it was deleted, or this is not the anchor of this database"
                    ),
                )
            return VerifyResult(ok=True, count=0, reason="empty log")
        if last_id is None or anchor["id"] > last_id:
            return VerifyResult(
                ok=False,
                count=count,
                first_bad_id=anchor["id"],
                reason=(
                    f"the anchor names event {anchor['id']} but the newest event in the database is "
                    f"{last_id}: the newest events were removed"
                ),
            )
        if anchored_hash is None:
            return VerifyResult(
                ok=False,
                count=count,
                first_bad_id=anchor["id"],
                reason=(f"event {anchor['id']}, named by the anchor, is missing from the database"),
            )
        if anchored_hash != anchor["hash"]:
            return VerifyResult(
                ok=False,
                count=count,
                first_bad_id=anchor["id"],
                reason=(
                    f"event {anchor['id']} has a different hash than the anchor records: the chain "
                    "was rewritten"
                ),
            )
        if after_anchor:
            return VerifyResult(
                ok=True,
                count=count,
                unanchored=after_anchor,
                reason=(
                    f"{count} events, chain intact; the anchor names event {anchor['id']} and the "
                    f"newest {after_anchor} come after it. The anchor is written at most "
                    f"{self.anchor_every} events or {self.anchor_lag_s:g} s behind a running process "
                    "and when it exits, so these were appended by a process still running or one "
                    "that was killed; the next append anchors them. Until then their removal would "
                    "not be noticed"
                ),
            )
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
