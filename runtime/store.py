"""The durable state: sqlmodel tables over SQLite (WAL) by default, any SQLAlchemy URL for a team.

Every other part reads and writes jobs, attempts, metrics, checkpoints, GPU samples, approvals,
audit events and planned calls through these tables. The schema is created on first use.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import NaiveDatetime
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlmodel import JSON, Column, Field, Session, SQLModel, create_engine, select

from nightshift.runtime.errors import StoreError

SCHEMA_VERSION = 2
# Explicit, ordered migrations: version N -> N+1 as plain SQL, run once in one transaction.
MIGRATIONS: dict[int, list[str]] = {
    1: ["ALTER TABLE attempt ADD COLUMN metrics_cursor JSON NOT NULL DEFAULT '{}'",
        "ALTER TABLE attempt ADD COLUMN evidence VARCHAR",
        "ALTER TABLE attempt ADD COLUMN first_bad_step INTEGER"],
}


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Job(SQLModel, table=True):
    """One experiment to run to completion, across as many attempts as recovery needs."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    spec: dict = Field(sa_column=Column(JSON, nullable=False))
    spec_path: str | None = None
    params: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    # queued → running → succeeded | failed (attempt failed, recovery may requeue) | cancelled;
    # running → paused (stopped at a checkpoint by the loop: tariff window closed, preempted)
    state: str = Field(default="queued", index=True)
    priority: int = 0
    owner: str = "unknown"
    resume_from: str | None = None
    resume_step: int | None = None
    max_attempts: int = 3
    group: str | None = Field(default=None, index=True, description="trials of one sweep share a group")
    hold_reason: str | None = None  # why a queued job waits, as of the loop's last tick
    submitted_by_call: str | None = Field(default=None, unique=True)
    reason: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    updated_at: NaiveDatetime = Field(default_factory=utcnow)


class Attempt(SQLModel, table=True):
    """One process (or container) that ran a job; the executor handle lets a new process re-attach."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    number: int
    # starting → running → exited | lost | stopped
    state: str = Field(default="starting", index=True)
    executor: str = "local"
    handle: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    argv: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    params: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    gpus: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    log_path: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    start_step: int = 0
    last_step: int | None = None
    last_loss: float | None = None
    metrics_offset: int = 0  # where this attempt's lines start in the job's metrics file
    # Where each metric source was last read (runtime.metric_sources), so tailing is incremental
    # and survives a restart; also what the good-checkpoint keeper last copied.
    metrics_cursor: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    evidence: str | None = None  # what the monitor saw: the first bad metric, the leftovers stopped
    first_bad_step: int | None = None  # the first step whose metrics diverged
    last_progress_at: NaiveDatetime | None = None
    # succeeded | failed | lost | diverged | early_stopped | timeout | stalled | paused |
    # preempted | cancelled
    outcome: str | None = None
    cause: str | None = None  # the diagnosed failure category, recorded by the recovery that followed
    energy_kwh: float | None = None
    energy_source: str | None = None  # nvml | declared_power | none
    started_at: NaiveDatetime = Field(default_factory=utcnow)
    ended_at: NaiveDatetime | None = None


class MetricPoint(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempt.id", index=True)
    job_id: int = Field(index=True)
    step: int
    name: str
    value: float | None


class CheckpointRecord(SQLModel, table=True):
    __tablename__ = "checkpoint"
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(index=True)
    attempt_id: int | None = None
    step: int
    path: str
    valid: bool = True
    seen_at: NaiveDatetime = Field(default_factory=utcnow)


class GpuSample(SQLModel, table=True):
    """A recorded health verdict for one GPU; placement quarantines GPUs whose latest is CRITICAL."""

    id: int | None = Field(default=None, primary_key=True)
    host: str = "localhost"
    gpu_index: int
    uuid: str | None = Field(default=None, index=True)
    verdict: str
    data: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    taken_at: NaiveDatetime = Field(default_factory=utcnow)


class Approval(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    call_id: str = Field(index=True, unique=True)
    skill: str
    args: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    requester: str
    rule: str
    quorum: int = 1
    # pending → approved | rejected | expired
    state: str = Field(default="pending", index=True)
    votes: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    thread_id: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    expires_at: NaiveDatetime | None = None
    decided_at: NaiveDatetime | None = None


class AuditEvent(SQLModel, table=True):
    """Append-only; `hash` chains over `prev_hash` and the canonical JSON of the event."""

    id: int | None = Field(default=None, primary_key=True)
    ts: str
    actor: str
    action: str
    skill: str | None = None
    call_id: str | None = Field(default=None, index=True)
    job_id: int | None = Field(default=None, index=True)
    payload: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    prev_hash: str
    hash: str = Field(unique=True)


class PlannedCall(SQLModel, table=True):
    """A skill call recorded before it runs, so a re-run node returns the result instead of acting twice."""

    call_id: str = Field(primary_key=True)
    thread_id: str | None = Field(default=None, index=True)
    skill: str
    args: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    principal: str
    # planned → running → done | error | denied | rejected
    state: str = "planned"
    result: dict | None = Field(default=None, sa_column=Column(JSON))
    error: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    finished_at: NaiveDatetime | None = None


class KeyValue(SQLModel, table=True):
    """Small switches that every process must see, such as the kill switch."""

    key: str = Field(primary_key=True)
    value: str


class Store:
    """Opens the database, creates the schema, hands out sessions."""

    def __init__(self, url: str, busy_timeout_s: float = 30.0):
        self.url = url
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the store folder {path.parent}: {exc}") from exc
            self.engine = create_engine(
                url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s}
            )

            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn, _record):  # noqa: ANN001
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
                cur.close()
        else:
            self.engine = create_engine(url)
        try:
            SQLModel.metadata.create_all(self.engine)
        except OperationalError as exc:
            raise StoreError(f"cannot open the store at {url}: {exc.orig}") from exc
        found = self.get_kv("schema_version")
        if found is None:
            self.set_kv("schema_version", str(SCHEMA_VERSION))
        elif found.isdigit() and int(found) < SCHEMA_VERSION and all(
                v in MIGRATIONS for v in range(int(found), SCHEMA_VERSION)):
            self._migrate(int(found))
        elif found != str(SCHEMA_VERSION):
            raise StoreError(f"the store at {url} has schema version {found}; this nightshift "
                             f"uses {SCHEMA_VERSION}. Migrations are explicit: back up the file "
                             "and run the matching migration, or point NIGHTSHIFT_HOME elsewhere")

    def _migrate(self, found: int) -> None:
        """Bring an older store up to SCHEMA_VERSION. Each step is idempotent (a column that a
        racing process already added is left as it is), so two processes opening an old store
        at once both end at the same schema."""
        for version in range(found, SCHEMA_VERSION):
            for statement in MIGRATIONS[version]:
                try:
                    with self.engine.begin() as conn:
                        conn.exec_driver_sql(statement)
                except OperationalError as exc:
                    if "duplicate column" not in str(exc.orig):
                        raise StoreError(f"migrating the store at {self.url} from schema "
                                         f"{version}: {exc.orig}") from exc
        self.set_kv("schema_version", str(SCHEMA_VERSION))

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error: nothing half-written."""
        with Session(self.engine, expire_on_commit=False) as s:
            try:
                yield s
                s.commit()
            except OperationalError as exc:
                s.rollback()
                if "locked" in str(exc.orig):
                    raise StoreError(
                        f"the store {self.url} stayed locked by another process past the busy "
                        "timeout (store.busy_timeout_s); nothing was written. Find the holder "
                        "with `fuser` on the file, or retry") from exc
                raise
            except Exception:
                s.rollback()
                raise

    # Small helpers used by several layers -------------------------------------------------

    def get_kv(self, key: str, default: str | None = None) -> str | None:
        with self.session() as s:
            row = s.get(KeyValue, key)
            return row.value if row else default

    def set_kv(self, key: str, value: str | None) -> None:
        with self.session() as s:
            row = s.get(KeyValue, key)
            if value is None:
                if row:
                    s.delete(row)
            elif row:
                row.value = value
                s.add(row)
            else:
                s.add(KeyValue(key=key, value=value))

    def job(self, job_id: int) -> Job | None:
        with self.session() as s:
            return s.get(Job, job_id)

    def attempts(self, job_id: int) -> list[Attempt]:
        with self.session() as s:
            return list(s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)))

    def metrics(self, job_id: int, name: str | None = None) -> list[MetricPoint]:
        with self.session() as s:
            q = select(MetricPoint).where(MetricPoint.job_id == job_id)
            if name:
                q = q.where(MetricPoint.name == name)
            return list(s.exec(q.order_by(MetricPoint.id)))


def dumps(obj: Any) -> str:
    """Canonical JSON: sorted keys, no spaces; used for hashing and for stable output."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
