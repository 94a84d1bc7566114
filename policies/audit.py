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

Each event is signed: `signature` is the HMAC-SHA256 of its hash under a 32-byte key kept in a
file only the daemon's user can read (`audit.key_file`, created 0600 on first use). Rewriting the
chain and the anchor without the key is caught; events from before signing are reported as
unsigned. The anchor sits beside the store, so whoever can write both can still cut the newest
events and repoint it, or roll both back: `publish_head` writes the newest (seq, hash, signature)
to sinks outside the store (a JSON-lines file the user keeps elsewhere, syslog), at most every
`publish_every_s` while events are appended and when the process exits, and `verify` fails on a
published head the store no longer holds. It also checks that every job and attempt row has the
events that made it, so an emptied log beside existing jobs is not "OK". Whoever holds the key can
still rewrite everything the published heads do not cover (README: "What the audit can prove").
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import hmac
import json
import json.encoder
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, Field
from sqlalchemy import Connection, Text, func, insert, type_coerce
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from nightshift.policies.row_audit import RowBindings
from nightshift.runtime import locks
from nightshift.runtime.errors import StoreError
from nightshift.runtime.store.db import (
    Attempt,
    AuditEvent,
    CallTransaction,
    Job,
    KeyValue,
    Store,
    dumps,
    lock_for_write,
    utcnow,
)

if TYPE_CHECKING:
    from nightshift.runtime.config import Settings

GENESIS = "0" * 64
_PAGE = 5000
ANCHOR_EVERY = 1000
ANCHOR_LAG_S = 0.2
PUBLISH_EVERY_S = 60.0
KEY_BYTES = 32


class Prepared(NamedTuple):
    """Events with their hashed bodies, made outside the write lock (see `AuditLog.prepare`)."""

    rows: list[dict[str, Any]]
    bodies: list[str]


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
    signature: str


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
    unsigned: int = Field(
        0, description="events written before signing (an upgraded store): chained, not signed"
    )
    heads_checked: int = Field(0, description="published heads compared with the store")
    unaudited_jobs: list[int] = Field(
        default_factory=list,
        description="jobs no gated call submitted (written into the store directly): the audit "
        "cannot say who made them; `nightshift audit verify` fails on them",
    )
    reason: str


def iso_utc(when: datetime) -> str:
    """ISO 8601 in UTC with a `Z`; a naive datetime is taken to be UTC already (as the store's)."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds") + "Z"


def event_body(
    ts: str,
    actor: str,
    action: str,
    skill: str | None,
    call_id: str | None,
    job_id: int | None,
    payload: dict[str, Any],
) -> str:
    """The canonical JSON an event's hash covers (everything but the chain link)."""
    return dumps(
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


def chain_hash(prev_hash: str, body: str) -> str:
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


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
    return chain_hash(prev_hash, event_body(ts, actor, action, skill, call_id, job_id, payload))


_enc = json.encoder.encode_basestring_ascii  # a str as json.dumps writes it (ensure_ascii)


def stored_hash_matches(
    digest: str,
    prev_hash: str,
    ts: Any,
    actor: Any,
    action: Any,
    skill: Any,
    call_id: Any,
    job_id: Any,
    payload_text: Any,
) -> bool:
    """Whether a stored row (its payload as the stored text) hashes to `digest`.

    Fast path: the canonical body built around the stored text, which `CanonicalJSON` wrote
    canonical. A match proves the row: the body was hashed with the fields encoded as complete
    JSON tokens, so the tokens before the payload can only match the same values, and with no
    backslash in the skill and ts tokens after it (no escaped quote to shift a boundary), the
    payload text can only be the text that was hashed. Anything else — text written before
    canonical storage, odd types, escapes — takes the slow path: decode, re-encode, hash."""
    if (
        type(payload_text) is str
        and type(ts) is str
        and type(actor) is str
        and type(action) is str
        and (skill is None or type(skill) is str)
        and (call_id is None or type(call_id) is str)
        and (job_id is None or type(job_id) is int)
    ):
        skill_tok = "null" if skill is None else _enc(skill)
        ts_tok = _enc(ts)
        if "\\" not in skill_tok and "\\" not in ts_tok:
            body = (
                f'{{"action":{_enc(action)},"actor":{_enc(actor)},'
                f'"call_id":{"null" if call_id is None else _enc(call_id)},'
                f'"job_id":{"null" if job_id is None else job_id},"payload":{payload_text},'
                f'"skill":{skill_tok},"ts":{ts_tok}}}'
            )
            if chain_hash(prev_hash, body) == digest:
                return True
    try:
        payload = json.loads(payload_text) if isinstance(payload_text, str) else payload_text
        return event_hash(prev_hash, ts, actor, action, skill, call_id, job_id, payload) == digest
    except (TypeError, ValueError):
        return False


def key_id(key: bytes) -> str:
    """A short public name for the audit key (not the key): the store records which key signs."""
    return hashlib.sha256(b"nightshift-audit-key-id:" + key).hexdigest()[:16]


def _anchor_text(anchor: dict[str, Any]) -> str:
    return f"anchor:{anchor['id']}:{anchor['hash']}:{anchor.get('count')}"


def anchor_signed(key: bytes, anchor: dict[str, Any]) -> bool:
    sig = anchor.get("signature")
    return isinstance(sig, str) and hmac.compare_digest(sig, sign(key, _anchor_text(anchor)))


def sign(key: bytes, digest: str) -> str:
    """The event's signature: HMAC-SHA256 of its chain hash under the audit key, hex."""
    return hmac.digest(key, digest.encode("ascii"), "sha256").hex()


def load_key(path: Path) -> bytes:
    """The audit key, created on first use: 32 random bytes, hex, in a file made 0600 in a folder
    made 0700. Two processes creating it at once end with one key (written whole, then linked)."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made it first: theirs is the key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    except OSError as exc:
        raise StoreError(
            f"cannot create the audit key {path}: {exc.strerror or exc}; set audit.key_file to a "
            "path this user can write"
        ) from exc
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        st = path.stat()
        text = path.read_text().strip()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreError(f"cannot read the audit key {path}: {exc.strerror or exc}") from exc
    if st.st_mode & 0o077:
        raise StoreError(
            f"the audit key {path} can be read by others (mode {st.st_mode & 0o777:o}): anyone "
            f"who reads it can sign forged events. `chmod 600 {path}`"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise StoreError(
            f"the audit key {path} is not {KEY_BYTES} bytes in hex; restore it from a backup (a "
            "new key makes every signed event fail verify)"
        )
    return key


def job_id_of(args: dict[str, Any]) -> int | None:
    """The `job_id` argument of a call, when it has an integer one: audit rows index it."""
    v = args.get("job_id")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@contextmanager
def write_transaction(store: Store, table: str) -> Iterator[Session]:
    """A session holding the database's write lock from its first statement."""
    with store.session() as s:
        lock_for_write(s.connection(), table)
        yield s


_TABLE = AuditEvent.__table__  # type: ignore[attr-defined]
_NEWEST = select(_TABLE.c.hash, _TABLE.c.signature).order_by(_TABLE.c.id.desc()).limit(1)
_INSERT = insert(_TABLE).returning(_TABLE.c.id, sort_by_parameter_order=True)

_OPEN_LOGS: weakref.WeakSet[AuditLog] = weakref.WeakSet()
KEY_ID = "audit.key_id"  # keyvalue: the id of the key that signs this store's events
# The actions whose payloads bind rows (and name attempts).
_BINDING = ("job.submitted", "job.state", "attempt.running", "attempt.ended", "attempt.cause")
_JobRow = tuple[int, str | None, str]  # id, submitted_by_call, created_at
_AttemptRow = tuple[int, int, str, str]  # job id, number, state, started_at


@atexit.register
def _anchor_at_exit() -> None:
    for log in list(_OPEN_LOGS):
        try:
            log.flush()
            log.publish_if_unpublished()
        except StoreError:
            pass  # nothing can be told at exit; the next process anchors and publishes the head


class AuditLog:
    """Appends, signs and verifies the chain; `clock` gives the time of events appended without a
    `ts`. The anchor trails by at most `anchor_every` events and `anchor_lag_s` seconds (0: every
    append writes it). `key_path` defaults to keys/audit.key beside the anchor; the head is
    published to `publish_file` and syslog, when given, at most every `publish_every_s`."""

    def __init__(
        self,
        store: Store,
        anchor_path: str | Path,
        *,
        clock: Callable[[], datetime] = utcnow,
        anchor_every: int = ANCHOR_EVERY,
        anchor_lag_s: float = ANCHOR_LAG_S,
        key_path: str | Path | None = None,
        publish_file: str | Path | None = None,
        publish_syslog: bool = False,
        publish_every_s: float = PUBLISH_EVERY_S,
    ):
        self.store = store
        self.anchor_path = Path(anchor_path)
        self.clock = clock
        self.anchor_every = max(1, anchor_every)
        self.anchor_lag_s = anchor_lag_s
        self.key_path = (
            Path(key_path).expanduser()
            if key_path
            else self.anchor_path.parent / "keys" / "audit.key"
        )
        self.publish_file = Path(publish_file).expanduser() if publish_file else None
        self.publish_syslog = publish_syslog
        self.publish_every_s = publish_every_s
        self._key: bytes | None = None
        self._unpublished = False  # this process appended since it last published
        self._published_at = float("-inf")
        self._publish_timer: threading.Timer | None = None
        self._guard = threading.Lock()
        self._pending: tuple[int, str] | None = None  # committed, not yet in the anchor
        self._behind = 0
        self._timer: threading.Timer | None = None
        self._pid = os.getpid()
        self._anchored_once = False  # a process's first append anchors at once
        _OPEN_LOGS.add(self)

    @classmethod
    def from_settings(cls, store: Store, settings: Settings) -> AuditLog:
        """The log as the settings describe it (anchor in the home folder; audit.* for the rest)."""
        a = settings.audit
        return cls(
            store,
            settings.home_path / "audit.anchor",
            anchor_every=a.anchor_every_events,
            anchor_lag_s=a.anchor_lag_s,
            key_path=settings.audit_key_file,
            publish_file=a.publish_file,
            publish_syslog=a.publish_syslog,
            publish_every_s=a.publish_every_s,
        )

    @property
    def key(self) -> bytes:
        """The signing key, read (or created) on first use."""
        if self._key is None:
            self._key = load_key(self.key_path)
        return self._key

    def _key_if_any(self) -> bytes | None:
        """The key if one exists; verify never creates one (a store upgraded from before signing
        and never appended to since has none, and its events are unsigned)."""
        if self._key is None and self.key_path.exists():
            self._key = load_key(self.key_path)
        return self._key

    @property
    def since_path(self) -> Path:
        """Where signing began in a store upgraded from before it: beside the key, as safe as it."""
        return self.key_path.with_name(self.key_path.name + ".since")

    def _write_since(self, seq: int, digest: str) -> None:
        """Record (signed) the first signed event after unsigned ones, inside the append's
        transaction: unsigned events are accepted before it only."""
        body = {"seq": seq, "hash": digest, "signature": sign(self.key, f"since:{seq}:{digest}")}
        tmp = self.since_path.with_name(f".{self.since_path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(body))
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.since_path)
        except OSError as exc:
            raise StoreError(f"cannot write {self.since_path}: {exc.strerror or exc}") from exc

    def _since(self, key: bytes | None) -> dict[str, Any] | None:
        try:
            data = json.loads(self.since_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {self.since_path}: {exc}") from exc
        ok = (
            key is not None
            and isinstance(data, dict)
            and isinstance(data.get("seq"), int)
            and isinstance(data.get("hash"), str)
            and hmac.compare_digest(
                str(data.get("signature")), sign(key, f"since:{data['seq']}:{data['hash']}")
            )
        )
        if not ok:
            raise StoreError(f"{self.since_path} is not signed by the audit key: it was edited")
        return data

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
        rows, bodies = self._event_rows(items)
        # SQLAlchemy Core on one connection, statements built once: the ORM's session and unit
        # of work cost more than the insert itself.
        with self.store.engine.connect() as conn:
            try:
                lock_for_write(conn, AuditEvent.__tablename__)
                ids = self._link(conn, rows, bodies)
                conn.commit()
            except OperationalError as exc:
                self.store.raise_if_busy(exc)
                raise
        self._committed(ids[-1], rows[-1]["hash"], len(rows))
        return [Appended(id=i, **r) for i, r in zip(ids, rows, strict=True)]

    def prepare(self, items: list[dict[str, Any]]) -> Prepared:
        """Events made ready for `append_in`, before the write lock is taken."""
        return Prepared(*self._event_rows(items))

    def append_in(self, tx: CallTransaction, *batches: Prepared) -> list[Appended]:
        """Append prepared events inside a call's transaction (which holds the write lock): they
        commit, or vanish, with the rows the call wrote; the anchor hears of them once
        committed."""
        rows = [r for b in batches for r in b.rows]
        bodies = [body for b in batches for body in b.bodies]
        try:
            ids = self._link(tx.session().connection(), rows, bodies)
        except OperationalError as exc:
            self.store.raise_if_busy(exc)
            raise
        tx.after_commit(lambda: self._committed(ids[-1], rows[-1]["hash"], len(rows)))
        return [Appended(id=i, **r) for i, r in zip(ids, rows, strict=True)]

    def record_in(self, conn: Connection, events: list[dict[str, Any]]) -> Callable[[], None]:
        """The lifecycle's events (runtime.store.RowRecorder), chained in on the transaction of
        the rows they bind, which holds the write lock on SQLite (its rows were written first);
        on PostgreSQL the chain's lock is taken here. Returns what to run after the commit."""
        if conn.dialect.name == "postgresql":
            lock_for_write(conn, AuditEvent.__tablename__)
        rows, bodies = self._event_rows(events)
        try:
            ids = self._link(conn, rows, bodies)
        except OperationalError as exc:
            self.store.raise_if_busy(exc)
            raise
        return lambda: self._committed(ids[-1], rows[-1]["hash"], len(rows))

    def authentic(self, event: AuditEvent) -> bool:
        """Whether a stored event's hash matches its contents and it carries this log's
        signature (an unsigned event is authentic only in a store that never signed)."""
        digest = event_hash(
            event.prev_hash,
            event.ts,
            event.actor,
            event.action,
            event.skill,
            event.call_id,
            event.job_id,
            event.payload,
        )
        if digest != event.hash:
            return False
        key = self._key_if_any()
        if event.signature is None:
            return key is None
        return key is not None and hmac.compare_digest(event.signature, sign(key, digest))

    def _event_rows(self, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """The rows and hashed bodies of events, made before the write lock: they do not depend
        on the chain, so the lock is held only for the link, the signature and the insert."""
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
        bodies = [
            event_body(
                r["ts"],
                r["actor"],
                r["action"],
                r["skill"],
                r["call_id"],
                r["job_id"],
                r["payload"],
            )
            for r in rows
        ]
        return rows, bodies

    def _link(self, conn: Connection, rows: list[dict[str, Any]], bodies: list[str]) -> list[int]:
        """Chain and sign the rows onto the newest event and insert them (the caller holds the
        write lock); returns their ids."""
        key = self.key
        last = conn.execute(_NEWEST).first()
        prev = last[0] if last else GENESIS
        for r, body in zip(rows, bodies, strict=True):
            r["prev_hash"] = prev
            r["hash"] = prev = chain_hash(prev, body)
            r["signature"] = sign(key, prev)
        ids = list(conn.execute(_INSERT, rows).scalars().all())
        if last is not None and last[1] is None:  # the first signed event of the store
            self._write_since(ids[0], rows[0]["hash"])
        if last is None or last[1] is None:  # from now on its events must carry this key
            kv = KeyValue.__table__  # type: ignore[attr-defined]
            conn.execute(kv.delete().where(kv.c.key == KEY_ID))
            conn.execute(kv.insert().values(key=KEY_ID, value=key_id(key)))
        return ids

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
            self._unpublished = True
        self._publish_when_due()

    # Published heads ----------------------------------------------------------------------------

    @property
    def publishes(self) -> bool:
        return self.publish_file is not None or self.publish_syslog

    def _publish_when_due(self) -> None:
        """Publish the head now if publish_every_s has passed since this process last did (its
        first publish is at once), else make sure a timer does it then."""
        if not self.publishes:
            return
        with self._guard:
            wait = self._published_at + self.publish_every_s - time.monotonic()
            if wait > 0:
                if self._publish_timer is None:
                    self._publish_timer = threading.Timer(wait, self._publish_from_timer)
                    self._publish_timer.daemon = True
                    self._publish_timer.start()
                return
        self.publish_if_unpublished()

    def _publish_from_timer(self) -> None:
        with self._guard:
            self._publish_timer = None
        try:
            self.publish_if_unpublished()
        except StoreError:
            pass  # the next flush tries again

    def publish_if_unpublished(self) -> dict[str, Any] | None:
        """Publish the head if this process appended since it last published (and has sinks)."""
        if not (self.publishes and self._unpublished) or os.getpid() != self._pid:
            return None
        return self.publish_head()

    def publish_head(self) -> dict[str, Any] | None:
        """Write the newest event's (seq, hash, signature, ts) and the time to every sink: a line
        of JSON appended to `publish_file`, a syslog (journald) message. Returns the head, or
        None when the log is empty. A head kept where the store's owner cannot rewrite it is what
        catches a rolled-back or truncated store (`verify(against=...)`)."""
        c = _TABLE.c
        with self.store.engine.connect() as conn:
            row = conn.execute(
                select(c.id, c.hash, c.signature, c.ts).order_by(c.id.desc()).limit(1)
            ).first()
        if row is None:
            return None
        with self._guard:
            self._unpublished, self._published_at = False, time.monotonic()
        head = {
            "seq": row[0],
            "hash": row[1],
            "signature": row[2],
            "ts": row[3],
            "published_at": self.now_iso(),
        }
        if self.publish_file is not None:
            line = (json.dumps(head, sort_keys=True) + "\n").encode("utf-8")
            try:
                self.publish_file.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.publish_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)  # one write, O_APPEND: lines from processes never mix
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StoreError(
                    f"cannot publish the audit head to {self.publish_file}: "
                    f"{exc.strerror or exc}; fix audit.publish_file"
                ) from exc
        if self.publish_syslog:
            _to_syslog(head)
        return head

    def published_heads(self, path: str | Path) -> tuple[list[dict[str, Any]], int]:
        """The heads in a publish file and how many of its lines could not be read (a line torn
        by a power cut); FileNotFoundError when there is no such file."""
        heads, unreadable = [], 0
        try:
            text = Path(path).expanduser().read_text()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read the published heads {path}: {exc}") from exc
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                head = json.loads(line)
            except ValueError:
                unreadable += 1
                continue
            if (
                isinstance(head, dict)
                and isinstance(head.get("seq"), int)
                and isinstance(head.get("hash"), str)
            ):
                heads.append(head)
            else:
                unreadable += 1
        return heads, unreadable

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

    def authentic_events(self, call_id: str) -> list[tuple[AuditEvent, bool]]:
        """One call's events whose hash matches their contents, each with whether it is signed by
        this log's key (False: written before signing). Events that fail either check are left
        out: what they say was not written by nightshift."""
        key, found = self._key_if_any(), []
        for e in self.events(call_id=call_id):
            digest = event_hash(
                e.prev_hash, e.ts, e.actor, e.action, e.skill, e.call_id, e.job_id, e.payload
            )
            if digest != e.hash:
                continue
            if e.signature is None:
                found.append((e, False))
            elif key is not None and hmac.compare_digest(e.signature, sign(key, digest)):
                found.append((e, True))
        return found

    def verify(self, against: str | Path | None = None) -> VerifyResult:
        """Recompute the chain and each event's signature, compare the chain's end with the anchor
        and with every head published to `against` (default: the configured publish file), and
        check that every job and attempt row has the events that made it.

        The cyclic garbage collector is off meanwhile: verify allocates a tuple per event and no
        cycles, and each collection it set off re-walked every live object of the process (a
        process that had imported LangGraph verified at half the speed)."""
        was = gc.isenabled()
        gc.disable()
        try:
            return self._verify(against)
        finally:
            if was:
                gc.enable()

    def _verify(self, against: str | Path | None) -> VerifyResult:
        self.flush()  # this process's own events are anchored before they are judged
        anchor = self.anchor()  # read first: an append racing with us only moves the end further
        published: list[dict[str, Any]] = []
        unreadable_heads = 0
        heads_from = Path(against) if against is not None else self.publish_file
        if heads_from is not None:
            try:
                published, unreadable_heads = self.published_heads(heads_from)
            except FileNotFoundError:
                if against is not None:
                    return VerifyResult(
                        ok=False,
                        count=0,
                        reason=f"no published heads at {against}: the file does not exist",
                    )
        wanted = {h["seq"]: h for h in sorted(published, key=lambda h: h["seq"])}
        # The rows before the chain: a job or attempt committed before this read has its events
        # in the chain read after it (a call's start precedes what it does).
        jobs, attempts = self._rows()
        key = self._key_if_any()
        try:
            since = self._since(key)
        except StoreError as exc:
            return VerifyResult(ok=False, count=0, reason=str(exc))
        count, prev, last_id = 0, GENESIS, None
        anchored_count: int | None = None
        anchored_hash: str | None = None
        after_anchor = unsigned = 0
        signed_seen = False
        first_signed_ts: str | None = None
        starts: set[str] = set()
        attempt_events: set[tuple[int, int]] = set()
        heads_checked = 0
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
            type_coerce(c.payload, Text),  # the stored text: hashed as it is (CanonicalJSON)
            c.prev_hash,
            c.hash,
            c.signature,
        ]

        def bad(ev_id: int | None, reason: str) -> VerifyResult:
            return VerifyResult(
                ok=False,
                count=count,
                first_bad_id=ev_id,
                unsigned=unsigned,
                heads_checked=heads_checked,
                reason=reason,
            )

        bindings = RowBindings()
        with self.store.engine.connect() as conn:
            # One snapshot for the chain and the rows it binds: a transition committed while we
            # read is either in both or in neither.
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN")
            elif conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
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
                    signature,
                ) in page:
                    count += 1
                    if prev_hash != prev:
                        what = (
                            "the first event does not start the chain"
                            if prev == GENESIS
                            else "its prev_hash is not the hash of the event before it"
                        )
                        return bad(
                            ev_id,
                            f"event {ev_id}: {what}: an event before it was removed, reordered "
                            "or edited",
                        )
                    if not stored_hash_matches(
                        digest, prev, ts, actor, action, skill, call_id, job_id, payload
                    ):
                        return bad(
                            ev_id,
                            f"event {ev_id}: its contents do not match its hash: it was edited",
                        )
                    if signature is None:
                        if signed_seen or (since is not None and ev_id >= since["seq"]):
                            return bad(
                                ev_id,
                                f"event {ev_id} is not signed, but this store signs its events "
                                "from "
                                + (f"event {since['seq']}" if since else "its first")
                                + ": it was written without the audit key (forged), or by a "
                                "nightshift older than signing",
                            )
                        unsigned += 1
                    elif key is None:
                        return bad(
                            ev_id,
                            f"event {ev_id} is signed, but the audit key {self.key_path} is "
                            "missing: restore it (without it no signature can be checked)",
                        )
                    elif not hmac.compare_digest(signature, sign(key, digest)):
                        return bad(
                            ev_id,
                            f"event {ev_id}: its signature is not the audit key's: it and its "
                            f"hash were rewritten without the key {self.key_path} (or that key "
                            "file was replaced)",
                        )
                    elif not signed_seen:
                        signed_seen, first_signed_ts = True, ts
                    if since is not None and ev_id == since["seq"] and digest != since["hash"]:
                        return bad(
                            ev_id,
                            f"event {ev_id} is not the first signed event {self.since_path} "
                            "records: the chain was rewritten",
                        )
                    if anchor is not None:
                        if ev_id == anchor["id"]:
                            anchored_hash = digest
                        elif ev_id > anchor["id"]:
                            after_anchor += 1
                    head = wanted.get(ev_id)
                    if head is not None:
                        heads_checked += 1
                        if head["hash"] != digest or (
                            head.get("signature") and head["signature"] != signature
                        ):
                            return bad(
                                ev_id,
                                f"event {ev_id} is not the event published at "
                                f"{head.get('published_at', '?')} in {heads_from} (its hash "
                                "or signature differs): the store was rolled back and written "
                                "again, or the chain rewritten",
                            )
                    if action == "skill.start" and call_id:
                        starts.add(call_id)
                    elif action in _BINDING and (body := _object(payload)) is not None:
                        j, n = body.get("job_id"), body.get("attempt")
                        if action == "job.state" and isinstance(j, int) and isinstance(n, int):
                            attempt_events.add((j, n))
                        bindings.observe(ev_id, action, body)
                    if anchor is not None and ev_id == anchor["id"]:
                        anchored_count = count
                    prev, last_id = digest, ev_id
                if len(page) < _PAGE:
                    break
            row_problems = bindings.problems(conn)
            jobs_exist = bool(conn.execute(select(func.count()).select_from(Job)).scalar())
            key_on_record = conn.execute(
                select(KeyValue.value).where(col(KeyValue.key) == KEY_ID)
            ).scalar()
        if key_on_record is not None and (key is None or key_id(key) != key_on_record):
            return bad(
                None,
                f"the store records that its events are signed with key {key_on_record}, but "
                + (
                    f"there is no key at {self.key_path}"
                    if key is None
                    else f"the key at {self.key_path} is {key_id(key)}"
                )
                + ": the key was deleted or replaced, and the chain cannot be trusted",
            )
        if key_on_record is not None and unsigned and not signed_seen:
            return bad(
                None,
                f"the store records signing key {key_on_record}, but none of its {count} events "
                "is signed: the signatures were stripped and the chain rehashed",
            )
        if count == 0 and (jobs_exist or key is not None):
            return bad(
                None,
                "the audit log is empty, but "
                + (
                    "the store holds jobs"
                    if jobs_exist
                    else f"the audit key {self.key_path} exists"
                )
                + ": the history was deleted",
            )
        if unsigned and since is None and key is not None:
            return bad(
                None,
                f"{unsigned} events are unsigned, but the audit key {self.key_path} exists and "
                f"{self.since_path} does not say where signing began: the signatures were "
                "stripped from a rewritten chain",
            )
        if since is not None and (last_id is None or since["seq"] > last_id):
            return bad(
                since["seq"],
                f"signing began at event {since['seq']} ({self.since_path}), but the newest event "
                f"in the database is {last_id or 'none'}: the newest events were removed",
            )
        beyond = [seq for seq in wanted if last_id is None or seq > last_id]
        if beyond:
            head = wanted[max(beyond)]
            return bad(
                head["seq"],
                f"event {head['seq']} was published at {head.get('published_at', '?')} in "
                f"{heads_from}, but the newest event in the database is {last_id or 'none'}: the "
                "newest events were removed, or the store (and its anchor) rolled back",
            )
        if unsigned:  # an upgraded store: rows from before signing have no events to match
            jobs = [r for r in jobs if first_signed_ts and r[2] >= first_signed_ts]
            attempts = [r for r in attempts if first_signed_ts and r[3] >= first_signed_ts]
        missing = _missing_rows(jobs, attempts, starts, attempt_events)
        if missing:
            return bad(None, missing)
        if row_problems:
            return bad(
                None,
                "rows were changed behind nightshift's back (they differ from the digests their "
                "audit events bound): " + " | ".join(row_problems),
            )
        unaudited = sorted(job_id for job_id, call, _ in jobs if not call)
        notes = []
        if unsigned:
            notes.append(f"{unsigned} unsigned (before signing)")
        if heads_checked:
            notes.append(f"{heads_checked} published heads match")
        if unreadable_heads:
            notes.append(f"{unreadable_heads} unreadable lines in {heads_from} skipped")
        if unaudited:
            notes.append(
                f"jobs {', '.join(map(str, unaudited[:10]))}{' …' if len(unaudited) > 10 else ''} "
                "were not submitted by a gated call (written into the store directly)"
            )
        tail = "; " + "; ".join(notes) if notes else ""

        def good(reason: str, unanchored: int = 0) -> VerifyResult:
            return VerifyResult(
                ok=True,
                count=count,
                unanchored=unanchored,
                unsigned=unsigned,
                heads_checked=heads_checked,
                unaudited_jobs=unaudited,
                reason=reason + tail,
            )

        if anchor is None:
            if count:
                return bad(
                    None,
                    f"the anchor file {self.anchor_path} is missing but the log holds {count} "
                    "events: it was deleted, or this is not the anchor of this database",
                )
            return good("empty log")
        if last_id is None or anchor["id"] > last_id:
            return bad(
                anchor["id"],
                f"the anchor names event {anchor['id']} but the newest event in the database is "
                f"{last_id}: the newest events were removed",
            )
        if anchored_hash is None:
            return bad(
                anchor["id"],
                f"event {anchor['id']}, named by the anchor, is missing from the database",
            )
        if anchored_hash != anchor["hash"]:
            return bad(
                anchor["id"],
                f"event {anchor['id']} has a different hash than the anchor records: the chain "
                "was rewritten",
            )
        if key is not None and not anchor_signed(key, anchor):
            return bad(
                anchor["id"],
                f"the anchor {self.anchor_path} is not signed by the audit key: it was written "
                "by hand (to hide removed events), or by a nightshift from before anchors were "
                "signed (the next event appended signs it)",
            )
        if "count" in anchor and anchor["count"] != anchored_count:
            return bad(
                anchor["id"],
                f"the anchor records {anchor['count']} events up to event {anchor['id']}, but "
                f"the database holds {anchored_count}: events before it were removed",
            )
        if after_anchor:
            return good(
                f"{count} events, chain intact; the anchor names event {anchor['id']} and the "
                f"newest {after_anchor} come after it. The anchor is written at most "
                f"{self.anchor_every} events or {self.anchor_lag_s:g} s behind a running process "
                "and when it exits, so these were appended by a process still running or one "
                "that was killed; the next append anchors them. Until then their removal would "
                "not be noticed",
                after_anchor,
            )
        return good(f"{count} events, chain and anchor intact")

    def _rows(self) -> tuple[list[_JobRow], list[_AttemptRow]]:
        """(id, submitted_by_call, created) of every job; (job id, number, state, started) of
        every attempt; times as the events' ISO strings."""
        j, a = Job.__table__.c, Attempt.__table__.c  # type: ignore[attr-defined]
        with self.store.engine.connect() as conn:
            jobs = [
                (r[0], r[1], iso_utc(r[2]))
                for r in conn.execute(select(j.id, j.submitted_by_call, j.created_at))
            ]
            attempts = [
                (r[0], r[1], r[2], iso_utc(r[3]))
                for r in conn.execute(select(a.job_id, a.number, a.state, a.started_at))
            ]
        return jobs, attempts

    # The anchor ---------------------------------------------------------------------------------

    def _count_to(self, event_id: int) -> int:
        """How many events the chain holds up to `event_id`, as the anchor records it: a later
        removal of events before the anchor changes the count even where the hashes are redone."""
        with self.store.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(_TABLE).where(_TABLE.c.id <= event_id)
                ).scalar()
                or 0
            )

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
                body = {"id": event_id, "hash": digest, "count": self._count_to(event_id)}
                body["signature"] = sign(self.key, _anchor_text(body))
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                with open(tmp, "w") as fh:
                    fh.write(json.dumps(body))
                os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write the audit anchor {path}: {exc}") from exc


def _missing_rows(
    jobs: list[_JobRow],
    attempts: list[_AttemptRow],
    starts: set[str],
    attempt_events: set[tuple[int, int]],
) -> str | None:
    """Why the rows are not all accounted for by the chain, or None. A job submitted by a gated
    call has that call's skill.start event (submit_jobs keys its jobs `call#i`); an attempt has a
    job.state event naming it, except one still `starting` (its event follows the commit that
    made it; a crash in between is finished by the engine, whose finish event names it)."""
    lost_jobs = [
        job_id
        for job_id, call, _ in jobs
        if call and call not in starts and _batch_call(call) not in starts
    ]
    lost_attempts = [
        (job_id, n)
        for job_id, n, state, _ in attempts
        if state != "starting" and (job_id, n) not in attempt_events
    ]
    if not (lost_jobs or lost_attempts):
        return None
    parts = []
    if lost_jobs:
        parts.append(
            f"{len(lost_jobs)} jobs (first: {', '.join(map(str, lost_jobs[:5]))}) have no "
            "skill.start event of the call that submitted them"
        )
    if lost_attempts:
        parts.append(
            f"{len(lost_attempts)} attempts (first: "
            + ", ".join(f"job {j} attempt {n}" for j, n in lost_attempts[:5])
            + ") have no job.state event"
        )
    return (
        "; ".join(parts) + ": their audit events were removed (the log emptied or cut short, "
        "perhaps with its anchor), or the rows were written into the store directly"
    )


def _object(text: Any) -> dict[str, Any] | None:
    """A stored payload's object (verify reads payloads as text), or None."""
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _batch_call(key: str) -> str | None:
    call, sep, index = key.rpartition("#")
    return call if sep and index.isdigit() else None


def _to_syslog(head: dict[str, Any]) -> None:
    """One syslog line (journald keeps it too) naming the head; nothing where there is none."""
    try:
        import syslog
    except ImportError:  # not a Unix
        return
    syslog.openlog("nightshift-audit", 0, syslog.LOG_USER)
    syslog.syslog(
        syslog.LOG_NOTICE,
        f"audit head seq={head['seq']} hash={head['hash']} signature={head['signature']} "
        f"ts={head['ts']}",
    )
