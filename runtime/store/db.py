"""The durable state: sqlmodel tables over SQLite (WAL) by default, any SQLAlchemy URL for a team.

Every other part reads and writes jobs, attempts, metrics, checkpoints, GPU samples, approvals,
audit events and planned calls through these tables. The schema is Alembic's revisions in
`nightshift.runtime.store.migrations`, applied when a store is opened: a fresh database gets them all,
an older store the ones it lacks, under an inter-process lock so that processes opening a store
at the same moment end with one schema. An up-to-date store costs one read.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import NaiveDatetime
from sqlalchemy import Connection, UniqueConstraint, event, func, inspect, text
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.types import TypeDecorator
from sqlmodel import JSON, Column, Field, Session, SQLModel, col, create_engine, select

from nightshift.runtime.errors import (
    DiskFull,
    OperatorError,
    StoreError,
    StoreFull,
    StoreGone,
    StoreLocked,
    StoreUnavailable,
)
from nightshift.runtime.store.migrations import BASELINE, HEAD, SCRIPT_LOCATION

# Defined beside the light reader, which needs no ORM; the job states are one tuple.
from nightshift.runtime.store.quick_read import JOB_STATES as JOB_STATES
from nightshift.runtime.store.quick_read import is_unreadable as is_unreadable
from nightshift.runtime.store.quick_read import sqlite_file as sqlite_file
from nightshift.runtime.store.quick_read import unreadable_value
from nightshift.runtime.store.unreachable import is_unreachable, store_unavailable

# Stores from before Alembic say which create_all made them in keyvalue `schema_version`: "2" is
# the baseline revision; "1" lacks these attempt columns (release 0.1.0 added them in place).
_SCHEMA_1_COLUMNS = {
    "metrics_cursor": "ALTER TABLE attempt ADD COLUMN metrics_cursor JSON NOT NULL DEFAULT '{}'",
    "evidence": "ALTER TABLE attempt ADD COLUMN evidence VARCHAR",
    "first_bad_step": "ALTER TABLE attempt ADD COLUMN first_bad_step INTEGER",
}
# pg_advisory_xact_lock key serialising migrations on a PostgreSQL store ("nshtmigr").
_PG_MIGRATE_LOCK = 0x6E7368746D696772


def _lock_retries(budget_s: float) -> Iterator[float | None]:
    """Waits between tries of a step that met a lock, within `budget_s`; None on the last."""
    spent, wait = 0.0, 0.05
    while spent + wait < budget_s:
        yield wait
        spent += wait
        wait = min(wait * 2, 1.0)
    yield None


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class StoredJSON(TypeDecorator[Any]):
    """A JSON column that a raw edit may have broken (SQLite keeps JSON as text): a value that
    does not decode is read as `unreadable_value` (`{UNREADABLE: <its start>}`) instead of
    raising, so one tampered row cannot make every listing, tick or report that reads the table
    fail. What reads it sees a value that does not validate (a spec with no fields), and the row's
    digest differs from its events'. The column's SQL type is unchanged."""

    impl = JSON
    cache_ok = True

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        inner = super().result_processor(dialect, coltype)
        if inner is None:
            return None

        def process(value: Any) -> Any:
            try:
                return inner(value)
            except ValueError:
                return unreadable_value(value)

        return process


class Job(SQLModel, table=True):
    """One experiment to run to completion, across as many attempts as recovery needs."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    spec: dict = Field(sa_column=Column(StoredJSON, nullable=False))
    spec_path: str | None = None
    params: dict = Field(default_factory=dict, sa_column=Column(StoredJSON, nullable=False))
    # queued → running → succeeded | failed (attempt failed, recovery may requeue) | cancelled;
    # running → paused (stopped at a checkpoint by the loop: tariff window closed, preempted)
    state: str = Field(default="queued", index=True)
    priority: int = 0
    owner: str = "unknown"
    resume_from: str | None = None
    resume_step: int | None = None
    max_attempts: int = 3
    group: str | None = Field(
        default=None, index=True, description="trials of one sweep share a group"
    )
    submitted_by_call: str | None = Field(default=None, unique=True)
    reason: str | None = None
    # The spec's revision, given by the database's triggers (migration 0021) on every insert and
    # every update of `spec`, a raw edit's too: the loop reads a spec's fields again only when it
    # moved. Never set by nightshift.
    spec_rev: int = Field(default=0, sa_column_kwargs={"server_default": text("0")}, index=True)
    # The job a reproduce_job call queued this one from; None for any other job (and before 0019).
    reproduces: int | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    updated_at: NaiveDatetime = Field(default_factory=utcnow)


class JobHold(SQLModel, table=True):
    """Why a queued job waits, as of the loop's last tick (runtime/store/job_holds.py): a narrow
    row of its own, because most reasons name a time and change every tick, and on the job row
    each change rewrote the whole row, spec included."""

    __tablename__ = "job_hold"

    job_id: int = Field(foreign_key="job.id", primary_key=True)
    reason: str
    # the `hold_tail` row whose text ends the reason (None: the reason is whole): a clause
    # many waiting jobs share and that moves from tick to tick, kept once
    tail: str | None = None


class HoldTail(SQLModel, table=True):
    """A clause that ends many waiting jobs' reasons (the reservation's, who holds the CPU
    slots: runtime/store/job_holds.py), one row per loop and clause (`key`: "node/name")."""

    __tablename__ = "hold_tail"

    key: str = Field(primary_key=True)
    text: str


class Attempt(SQLModel, table=True):
    """One process (or container) that ran a job; the executor handle lets a new process re-attach."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    number: int
    # Globally unique: names the run's folder, intent and exit files and keys the executor's
    # idempotent launch, so a recreated store (whose row ids start again at 1) never adopts the
    # runs of another. Attempts from before 0009 keep "attempt-<id>".
    key: str = Field(default_factory=lambda: f"attempt-{uuid.uuid4().hex}", unique=True, index=True)
    # starting → running → exited | lost | stopped
    state: str = Field(default="starting", index=True)
    executor: str = "local"
    # The daemon (`loop.node`) that started it, the only one that watches it: a local pid or a
    # GPU index means something on that node only. "" for attempts from before nodes existed.
    node: str = Field(default="", sa_column_kwargs={"server_default": text("''")}, index=True)
    # The cluster host whose GPUs it runs on ("ray:10.0.0.5"), when the executor is a cluster's
    # and placement chose the node; "" for a run on the daemon's own node.
    host: str = Field(default="", sa_column_kwargs={"server_default": text("''")})
    handle: dict = Field(default_factory=dict, sa_column=Column(StoredJSON, nullable=False))
    argv: list = Field(default_factory=list, sa_column=Column(StoredJSON, nullable=False))
    params: dict = Field(default_factory=dict, sa_column=Column(StoredJSON, nullable=False))
    gpus: list = Field(default_factory=list, sa_column=Column(StoredJSON, nullable=False))
    log_path: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    start_step: int = 0
    last_step: int | None = None
    last_loss: float | None = None
    metrics_offset: int = 0  # where this attempt's lines start in the job's metrics file
    # Where each metric source was last read (runtime.metric_sources), so tailing is incremental
    # and survives a restart; also what the good-checkpoint keeper last copied.
    metrics_cursor: dict = Field(default_factory=dict, sa_column=Column(StoredJSON, nullable=False))
    evidence: str | None = None  # what the monitor saw: the first bad metric, the leftovers stopped
    first_bad_step: int | None = None  # the first step whose metrics diverged
    last_progress_at: NaiveDatetime | None = None
    # The kernel's monotonic clock (time.monotonic) at start and at the last progress, valid on
    # the boot `boot_id`: timeouts and stalls are elapsed time, immune to wall-clock steps.
    boot_id: str | None = None
    started_mono: float | None = None
    progress_mono: float | None = None
    ended_mono: float | None = None  # at the end, on the same boot (else None): retry backoff
    # succeeded | failed | lost | diverged | early_stopped | timeout | stalled | paused |
    # preempted | cancelled
    outcome: str | None = None
    cause: str | None = (
        None  # the diagnosed failure category, recorded by the recovery that followed
    )
    # Why a failed attempt ended, diagnosed by the loop as it ended: category, the evidence line
    # and its number, a summary, the recommended action (runtime/training/attempt_diagnosis.py).
    # None for an attempt that did not fail, and for those from before 0012.
    diagnosis: dict | None = Field(default=None, sa_column=Column(StoredJSON, nullable=True))
    # What the machine said as a failed attempt ended (runtime/training/machine_evidence.py
    # `MachineEvidence`), read once by the loop: a later diagnosis of the attempt reads it here.
    machine: dict | None = Field(default=None, sa_column=Column(StoredJSON, nullable=True))
    # What makes it reproducible, read as it started (runtime/training/provenance.py): commit and
    # dirty diff, packages, image digest, seed, argv, env, data fingerprints, GPUs, host. None
    # for attempts from before 0016.
    provenance: dict | None = Field(default=None, sa_column=Column(StoredJSON, nullable=True))
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
    # When the point was made: the source's own time where it has one (a TensorBoard event's
    # wall_time, a JSONL line's `time`), else when the loop read it; None before 0019.
    wall_time: NaiveDatetime | None = None


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
    # Who judged it: the probe as the recording process is configured (runtime/gpu/gpu.py
    # `health_source`). Placement reads only its own source's verdicts, so a client with other
    # GPU settings never quarantines the daemon's GPUs. "": recorded before revision 0013.
    source: str = Field(default="", sa_column_kwargs={"server_default": text("''")}, index=True)
    uuid: str | None = Field(default=None, index=True)
    verdict: str
    data: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    taken_at: NaiveDatetime = Field(default_factory=utcnow)


def latest_gpu_sample_ids(
    *,
    node: str | None = None,
    cluster: str | None = None,
    sources: tuple[str, ...] | None = None,
) -> Any:
    """The ids of the newest sample per (host, GPU), as a subquery: a reader wants the GPU as it
    is now, not its history. `cluster`: a Ray census's hosts (prefix); else `node`: this node's
    samples and those from before nodes existed ("localhost"); `sources`: only these probes'."""
    latest = select(func.max(GpuSample.id)).group_by(GpuSample.host, GpuSample.gpu_index)  # type: ignore[arg-type]
    if cluster is not None:
        latest = latest.where(col(GpuSample.host).startswith(cluster, autoescape=True))
    elif node is not None:
        latest = latest.where(col(GpuSample.host).in_((node, "localhost")))
    if sources is not None:
        latest = latest.where(col(GpuSample.source).in_(sources))
    return latest


class Approval(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    call_id: str = Field(index=True, unique=True)
    skill: str
    args: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    requester: str
    rule: str
    quorum: int = 1
    # pending → approved | rejected | expired; approved → executing → executed | failed
    state: str = Field(default="pending", index=True)
    votes: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    thread_id: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    expires_at: NaiveDatetime | None = None
    decided_at: NaiveDatetime | None = None
    result: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    error: str | None = None
    executed_at: NaiveDatetime | None = None
    claimed_by: str | None = None
    claimed_at: NaiveDatetime | None = None
    files: dict = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    requested_via: str = Field(default="api", sa_column_kwargs={"server_default": "api"})
    # Who may vote (names, `role:<name>`), as the rule resolved them; []: anyone who may approve.
    approvers: list = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]")
    )


class CanonicalJSON(TypeDecorator[Any]):
    """JSON stored as its canonical text (`dumps`: sorted keys, no spaces), the very text the
    audit hash covers, so `AuditLog.verify` can hash what is stored without decoding and
    re-encoding it. Read back as the impl's JSON; the column's SQL type is unchanged."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Any) -> Any:
        return lambda value: None if value is None else dumps(value)


class AuditEvent(SQLModel, table=True):
    """Append-only; `hash` chains over `prev_hash` and the canonical JSON of the event, and
    `signature` is the audit key's HMAC of `hash`."""

    id: int | None = Field(default=None, primary_key=True)
    ts: str
    actor: str
    action: str
    skill: str | None = None
    call_id: str | None = Field(default=None, index=True)
    job_id: int | None = Field(default=None, index=True)
    payload: dict = Field(default_factory=dict, sa_column=Column(CanonicalJSON, nullable=False))
    prev_hash: str
    hash: str = Field(unique=True)
    signature: str | None = None  # HMAC-SHA256 of `hash` (None: written before signing)


class PlannedCall(SQLModel, table=True):
    """A skill call recorded before it runs, so a re-run node returns the result instead of acting twice."""

    call_id: str = Field(primary_key=True)
    thread_id: str | None = Field(default=None, index=True)
    skill: str
    args: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    principal: str
    # planned → done | error | denied | rejected (a row found planned after a crash runs again)
    state: str = "planned"
    result: dict | None = Field(default=None, sa_column=Column(JSON))
    error: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    finished_at: NaiveDatetime | None = None


class GoalRun(SQLModel, table=True):
    """The goal that started an agent thread, recorded before its first step: a run killed before
    LangGraph checkpointed it is replayed from this, its planned calls answering from their rows."""

    thread_id: str = Field(primary_key=True)
    goal: dict = Field(sa_column=Column(JSON, nullable=False))
    on_behalf_of: str
    created_at: NaiveDatetime = Field(default_factory=utcnow)


class ChannelMessage(SQLModel, table=True):
    """The channels' outbox: one row per message a channel must show, written before it is sent,
    so a request is never lost while a channel is down. An approval's row is sent again whenever
    its card changes (`shown` is the card version last shown); a notice's row is sent once."""

    __tablename__ = "channel_message"
    __table_args__ = (UniqueConstraint("channel", "subject"),)

    id: int | None = Field(default=None, primary_key=True)
    channel: str  # slack | wechat
    subject: str  # "approval:12", "event:345" (a job event's audit id), "report:2026-12-04"
    notice: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # queued → sent (an approval's row is queued again when its card changes) | dropped
    state: str = Field(default="queued", index=True)
    shown: str | None = None
    ref: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    attempts: int = 0
    next_try_at: NaiveDatetime = Field(default_factory=utcnow)
    last_error: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    sent_at: NaiveDatetime | None = None


class ChannelReceipt(SQLModel, table=True):
    """What a channel's callback may carry only once (its signature, its event id): a replayed
    request finds its key here and is refused."""

    __tablename__ = "channel_receipt"

    key: str = Field(primary_key=True)
    channel: str
    received_at: NaiveDatetime = Field(default_factory=utcnow)


class Sweep(SQLModel, table=True):
    """A search over a spec's `search` space (`nightshift sweep`): its trials are jobs of the
    group `name`, submitted under the call id `sweep-<id>-trial-<n>`, and the Optuna study that
    asks for them lives in `storage` under `study`."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    study: str
    storage: str
    spec: dict = Field(sa_column=Column(JSON, nullable=False))
    spec_path: str | None = None
    owner: str
    # running → done (budget spent, or every trial told) | failed (a trial could not be queued)
    # | stopped (by a person)
    state: str = Field(default="running", index=True)
    # trials, gpu_hours, deadline (naive UTC ISO), max_parallel, seed: the spec's, with the
    # command line's overrides
    budget: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    result: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    reason: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    updated_at: NaiveDatetime = Field(default_factory=utcnow)


class DiagnosisCorrection(SQLModel, table=True):
    """The right answer for a failed attempt, as a person gave it (`nightshift diagnose JOB
    --correct CATEGORY`), with what the rules said then and the bounded end of the attempt's log
    they read, so the rules can be measured on the operator's own history (`nightshift eval
    diagnosis --local`) even after the job's folder is gone. One per attempt: a newer correction
    replaces it (the audit keeps each)."""

    __tablename__ = "diagnosis_correction"

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    attempt_id: int = Field(foreign_key="attempt.id", unique=True, index=True)
    attempt_number: int
    category: str = Field(index=True)  # the person's
    rules_category: str | None = None  # attempt.diagnosis's category when corrected
    rules_confidence: str | None = None
    note: str | None = None
    corrected_by: str
    corrected_at: NaiveDatetime = Field(default_factory=utcnow)
    log_path: str | None = None
    log_excerpt: str = ""  # the end of the log (skills/correct_diagnosis.py bounds it)
    first_line_no: int = 1  # the log's line number of the excerpt's first line
    log_note: str | None = None  # why the log could not be read, or how much of it was
    exit_code: int | None = None
    signal: int | None = None
    monitor_says: str | None = None  # stalled | timeout | lost | diverged: the loop's verdict
    monitor_detail: str | None = None


class MlflowRun(SQLModel, table=True):
    """A job's mirror in MLflow (runtime/training/mlflow_mirror.py): the run it is, how far its
    metric points were sent (`metric_cursor`: the last MetricPoint id MLflow acknowledged), and
    what the mirror still owes it. The run id is kept here so a restarted daemon (or one killed
    with -9) goes on with the same run; the run also carries the tag `nightshift.job_id`."""

    __tablename__ = "mlflow_run"

    job_id: int = Field(foreign_key="job.id", primary_key=True)
    run_id: str = Field(index=True)
    experiment_id: str
    tracking_uri: str
    metric_cursor: int = 0
    params_sent: bool = False
    status: str | None = (
        None  # the last status MLflow was told: RUNNING | FINISHED | FAILED | KILLED
    )
    artifacts_attempt: int | None = None  # the attempt whose end's artifacts were uploaded
    synced_update: NaiveDatetime | None = None  # job.updated_at when it was last mirrored whole
    failures: int = 0  # failed syncs in a row
    next_try_at: NaiveDatetime | None = None
    last_error: str | None = None
    created_at: NaiveDatetime = Field(default_factory=utcnow)


class StoreLease(SQLModel, table=True):
    """Who serves the store: on SQLite one daemon from any home, refused to a second while its
    heartbeat is fresh (a killed daemon's lease goes stale and is taken over)."""

    __tablename__ = "store_lease"

    name: str = Field(primary_key=True)  # "daemon"
    node: str
    home: str
    pid: int
    token: str  # this holder's random token: a heartbeat renews only its own lease
    acquired_at: NaiveDatetime = Field(default_factory=utcnow)
    heartbeat_at: NaiveDatetime = Field(default_factory=utcnow)


class WebToken(SQLModel, table=True):
    """A person's sign-in to the web dashboard (`nightshift web token`): only the sha256 of its
    32-byte random secret is kept; `user` is the OS user who made it, never a name a request
    gives. A revoked token is refused from the next request on."""

    __tablename__ = "web_token"

    id: int | None = Field(default=None, primary_key=True)
    user: str = Field(index=True)
    digest: str = Field(unique=True)  # sha256 hex of the secret
    created_at: NaiveDatetime = Field(default_factory=utcnow)
    revoked_at: NaiveDatetime | None = None


class KeyValue(SQLModel, table=True):
    """Small switches that every process must see, such as the kill switch."""

    key: str = Field(primary_key=True)
    value: str


class Store:
    """Opens the database, brings its schema to the newest revision, hands out sessions.

    A SQLite store remembers which file it opened (device and inode): `check_file` notices that
    file deleted or replaced, and once open no new connection creates a missing file, so a store
    deleted under a running process is never silently replaced by an empty one."""

    def __init__(self, url: str, busy_timeout_s: float = 30.0):
        self.url = url
        self.busy_timeout_s = busy_timeout_s
        # Writes the audit events of the lifecycle's transitions inside their transaction (the
        # audit log, set by whoever wires one; runtime/store/lifecycle.py says how). None: not audited.
        self.recorder: RowRecorder | None = None
        self._db_path: Path | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        try:
            if url.startswith("sqlite:///"):
                path = Path(url[len("sqlite:///") :])
                if path.name and str(path) != ":memory:":
                    path = self._db_path = path.resolve()
                    try:
                        path.parent.mkdir(parents=True, exist_ok=True)
                    except OSError as exc:
                        raise StoreError(
                            f"cannot create the store folder {path.parent}: "
                            f"{exc.strerror or exc}; fix store.url (or NIGHTSHIFT_HOME)"
                        ) from exc
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

                @event.listens_for(self.engine, "do_connect")
                def _existing_file_only(dialect, _record, cargs, cparams):  # noqa: ANN001
                    """After the first open, connect with mode=rw: SQLite itself refuses to
                    create the file again."""
                    if self._identity is None or self._db_path is None:
                        return None  # the first open may create a fresh store
                    self.check_file()
                    uri = "file:" + urllib.parse.quote(str(self._db_path)) + "?mode=rw"
                    return dialect.loaded_dbapi.connect(uri, *cargs[1:], **{**cparams, "uri": True})
            else:
                # A pooled connection the server dropped (a restart) is tested and replaced
                # before use; one that cannot be had is StoreUnavailable, wherever it is met.
                self.engine = create_engine(url, pool_pre_ping=True)

                @event.listens_for(self.engine, "handle_error")
                def _unreachable(ctx):  # noqa: ANN001
                    exc = ctx.sqlalchemy_exception
                    if not ctx.is_pre_ping and exc is not None and is_unreachable(exc):
                        return store_unavailable(url)
                    return None
        except (ArgumentError, NoSuchModuleError, ImportError) as exc:
            raise StoreError(
                f"cannot open the store at {url}: {exc}. Fix store.url, or install "
                "the database driver it names"
            ) from None
        self._open_schema()
        if self._db_path is not None:
            try:
                st = os.stat(self._db_path)
            except OSError as exc:
                raise StoreError(
                    f"the store file {self._db_path} vanished while it was opened "
                    f"({exc.strerror or exc}); open it again"
                ) from exc
            self._identity = (st.st_dev, st.st_ino)

    # The schema ---------------------------------------------------------------------------

    def _open_schema(self) -> None:
        """Leave the schema at HEAD. The common case, a store already there, is one read and no
        lock; anything else is decided again under the migration lock."""
        try:
            with self.engine.connect() as conn:
                if _revisions(conn) == {HEAD}:
                    return
        except OperationalError as exc:
            # A fresh SQLite file that another process is switching to WAL (or migrating) is
            # "locked" even to this read: decide under the migration lock instead, after it.
            if "locked" not in str(exc.orig):
                raise StoreError(
                    f"cannot open the store at {self.url}: {exc.orig}. Check that the "
                    "path or server is reachable and writable, or set store.url (or "
                    "NIGHTSHIFT_HOME) to another store"
                ) from exc
        # Only here, and before the lock: loading Alembic takes longer than the read above.
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", SCRIPT_LOCATION)
        known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
        with self._migrate_lock():
            try:
                for wait in _lock_retries(self.busy_timeout_s):
                    try:
                        self._migrate(cfg, known)
                        break
                    except OperationalError as exc:  # a reader mid-way through its first open
                        if "locked" not in str(exc.orig) or wait is None:
                            raise
                        time.sleep(wait)
            except OperationalError as exc:
                raise StoreError(
                    f"cannot bring the store at {self.url} to schema {HEAD}: "
                    f"{exc.orig}; nothing was changed. Retry, or restore the store "
                    "from a backup"
                ) from exc

    def _migrate_lock(self) -> AbstractContextManager[object]:
        """SQLite: a file lock beside the database (other URLs lock inside the transaction)."""
        if self._db_path is None:
            return nullcontext()
        # Imported here: filelock takes ~20 ms to import, which the fast path never needs.
        from nightshift.runtime import locks

        lock = self._db_path.with_name(self._db_path.name + ".migrate.lock")
        return locks.exclusive(lock, timeout=self.busy_timeout_s, error=StoreError)

    def _migrate(self, cfg: Any, known: set[str]) -> None:
        """Upgrade to HEAD in one transaction: all of it or, on any error, none of it."""
        from alembic import command

        with self.engine.connect() as conn:
            dialect = conn.dialect.name
            if dialect == "sqlite":  # pysqlite would run DDL outside any transaction
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif dialect == "postgresql":
                conn.execute(text(f"SET LOCAL lock_timeout = {int(self.busy_timeout_s * 1000)}"))
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATE_LOCK})
            found = _revisions(conn)  # again: another process may have migrated meanwhile
            if found == {HEAD}:
                return
            cfg.attributes["connection"] = conn
            if found is None:
                if self._adopt_pre_alembic(conn):
                    command.stamp(cfg, BASELINE)
            elif not found <= known:
                raise StoreError(
                    f"the store at {self.url} has schema revision "
                    f"{', '.join(sorted(found - known))}, which this nightshift does not know "
                    f"(it knows up to {HEAD}): a newer release upgraded it. Upgrade nightshift "
                    "to that release, or point store.url (or NIGHTSHIFT_HOME) at another store; "
                    "the store was not changed"
                )
            command.upgrade(cfg, "head")
            conn.commit()

    def _adopt_pre_alembic(self, conn: Connection) -> bool:
        """True if the database is a store made before Alembic (now brought to the baseline,
        ready to stamp); False if it has none of our tables (a fresh one)."""
        tables = set(inspect(conn).get_table_names())
        if not tables & set(SQLModel.metadata.tables):
            return False
        version = None
        if "keyvalue" in tables:
            version = conn.execute(
                text("SELECT value FROM keyvalue WHERE key = 'schema_version'")
            ).scalar()
        if version == "1":
            have = {c["name"] for c in inspect(conn).get_columns("attempt")}
            for column, statement in _SCHEMA_1_COLUMNS.items():
                if column not in have:
                    conn.exec_driver_sql(statement)
            # What release 0.1.0 would have recorded, should it open the store again.
            conn.execute(text("UPDATE keyvalue SET value = '2' WHERE key = 'schema_version'"))
        elif version != "2":
            raise StoreError(
                f"the store at {self.url} has nightshift tables but "
                + ("no schema version" if version is None else f"schema version {version!r}")
                + " and no alembic_version table, so its schema is unknown; the store was not "
                "changed. Point store.url (or NIGHTSHIFT_HOME) at another store, or restore "
                "this one from a backup"
            )
        return True

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error: nothing half-written.
        Inside a CallTransaction on this store, its session: the call's owner commits it."""
        tx = _CALL_TX.get()
        if tx is not None and tx.store is self:
            s = tx.session()
            yield s
            try:
                s.flush()
            except DBAPIError as exc:
                self.raise_if_busy(exc)
                raise
            return
        with Session(self.engine, expire_on_commit=False, info={STORE_INFO: self}) as s:
            try:
                yield s
                s.commit()
            except DBAPIError as exc:
                s.rollback()
                self.raise_if_busy(exc)
                raise
            except Exception:
                s.rollback()
                raise

    @contextmanager
    def write_session(self, lock_table: str = "auditevent") -> Iterator[Session]:
        """A session holding the write lock from its first statement (as a call's transaction
        does), so that what it reads and the audit chain head it extends are read under it.
        Inside a CallTransaction on this store: its session, which holds the lock already."""
        tx = _CALL_TX.get()
        if tx is not None and tx.store is self:
            with self.session() as s:
                yield s
            return
        with self.session() as s:
            try:
                lock_for_write(s.connection(), lock_table)
            except OperationalError as exc:
                self.raise_if_busy(exc)
                raise
            yield s

    def raise_if_busy(self, exc: DBAPIError) -> None:
        """A lock held past busy_timeout_s, a full disk, a read-only, broken or vanished file or
        a database server that cannot be reached is the operator's to solve (or to wait out),
        not a crash: raise it as such (else return)."""
        if is_unreachable(exc):
            raise store_unavailable(self.url) from exc
        fault = self._sqlite_fault(exc.orig, f"the store {self.url}")
        if fault is not None:
            raise fault from exc

    def check_file(self) -> None:
        """Raise StoreGone if the SQLite file opened at start was deleted or replaced (one
        os.stat; nothing to check for other URLs). Cheap enough for every loop step."""
        if self._identity is None or self._db_path is None:
            return
        try:
            st = os.stat(self._db_path)
        except FileNotFoundError:
            what = "it is gone"
        except OSError as exc:
            what = f"it cannot be read: {exc.strerror or exc}"
        else:
            if (st.st_dev, st.st_ino) == self._identity:
                return
            what = "another file is there now"
        raise StoreGone(
            f"the store file {self._db_path} was deleted or replaced ({what}); nothing more is "
            "written, and no new store is made in its place. Restore the file, or restart "
            "the daemon (or command) to open what is at that path now"
        )

    def fault_of(self, exc: BaseException) -> OperatorError | None:
        """The environment fault behind `exc`, as an error that says what happened and how to
        fix it: a full disk or quota, a lock held past busy_timeout_s, a read-only, broken or
        vanished store, a database server that cannot be reached, a file that cannot be written
        for lack of space. None for anything else: a programming error, which must surface."""
        seen: set[int] = set()
        todo: list[BaseException | None] = [exc]
        general: StoreError | None = None
        while todo:
            e = todo.pop(0)
            if e is None or id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, StoreFull | StoreLocked | StoreGone | StoreUnavailable | DiskFull):
                return e
            if is_unreachable(e):
                return store_unavailable(self.url)
            if isinstance(e, DBAPIError):
                fault = self._sqlite_fault(e.orig, f"the store {self.url}")
                if fault is not None:
                    return fault
            elif isinstance(e, sqlite3.Error):
                fault = self._sqlite_fault(e, "the agent's checkpoint database (graph.db)")
                if fault is not None:
                    return fault
            elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                where = e.filename or "a file under NIGHTSHIFT_HOME"
                fix = (
                    "remount that filesystem read-write"
                    if e.errno == errno.EROFS
                    else "free space on that filesystem (or raise the quota)"
                )
                return DiskFull(f"cannot write {where}: {e.strerror or e}; {fix}")
            if isinstance(e, StoreError) and general is None:
                general = e
            todo += [e.__cause__, e.__context__]
        return general

    def _sqlite_fault(self, err: BaseException | None, where: str) -> StoreError | None:
        """A SQLite error that the environment caused, by its result code (or its text)."""
        if err is None:
            return None
        name = str(getattr(err, "sqlite_errorname", "") or "")
        text = str(err)
        if name.startswith("SQLITE_FULL") or "disk is full" in text:
            return StoreFull(
                f"{where} is full (database or disk is full): nothing more is recorded until "
                "space is freed. Free space on the disk that holds it (or raise the quota)"
            )
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
            return StoreLocked(
                f"{where} stayed locked by another process past the busy timeout "
                f"(store.busy_timeout_s, {self.busy_timeout_s:g} s); this write was rolled back. "
                "Find the holder with `fuser` on the file, or retry"
            )
        if name.startswith("SQLITE_READONLY") or "readonly database" in text:
            return StoreError(
                f"{where} cannot be written ({text}): make the file and its folder writable "
                "by this user, or remount the filesystem read-write"
            )
        if name.startswith("SQLITE_CANTOPEN") or "unable to open database file" in text:
            try:
                self.check_file()
            except StoreGone as gone:  # the usual reason, after the first open
                return gone
            return StoreError(
                f"{where} cannot be opened ({text}): check that its folder exists and is "
                "writable by this user"
            )
        if name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
            return StoreError(
                f"{where} met a disk I/O error ({text}): check the disk (`dmesg`) and its "
                "free space"
            )
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text:
            return StoreError(
                f"{where} is damaged ({text}): stop nightshift and restore it from a backup"
            )
        return None

    # Small helpers used by several layers -------------------------------------------------

    def call_transaction(self, lock_table: str) -> CallTransaction:
        return CallTransaction(self, lock_table)

    def get_kv(self, key: str, default: str | None = None) -> str | None:
        try:  # Core: the ORM's identity map costs more than this
            with self.engine.connect() as conn:
                value = conn.execute(_KV_VALUE, {"key": key}).scalar()
        except DBAPIError as exc:
            self.raise_if_busy(exc)
            raise
        return default if value is None else value

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

    def planned_call(self, call_id: str) -> PlannedCall:
        with self.session() as s:
            row = s.get(PlannedCall, call_id)
        if row is None:
            raise StoreError(f"planned call {call_id} is missing from the store {self.url}")
        return row

    def job(self, job_id: int) -> Job | None:
        with self.session() as s:
            return s.get(Job, job_id)

    def hold_reason(self, job_id: int) -> str | None:
        """Why the loop's last tick left this job waiting (None: it gave no reason)."""
        with self.session() as s:
            hold = s.get(JobHold, job_id)
            if hold is None:
                return None
            tail = None if hold.tail is None else s.get(HoldTail, hold.tail)
            return hold.reason + ("" if tail is None else tail.text)  # as job_holds.of reads it

    def attempts(self, job_id: int) -> list[Attempt]:
        with self.session() as s:
            return list(
                s.exec(
                    select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
                )
            )

    def metrics(self, job_id: int, name: str | None = None) -> list[MetricPoint]:
        with self.session() as s:
            q = select(MetricPoint).where(MetricPoint.job_id == job_id)
            if name:
                q = q.where(MetricPoint.name == name)
            return list(s.exec(q.order_by(col(MetricPoint.id))))

    # Identity -----------------------------------------------------------------------------

    _instance_id: str | None = None

    def instance_id(self) -> str:
        """This store's UUID, made by the first process that asks (an insert that yields to
        another's, then a read back, so two processes opening a fresh store agree). A runs
        folder records it (runtime/store/runs_binding.py): a store recreated at the same path, whose
        row ids start again at 1, is told apart from the one those runs belong to."""
        if self._instance_id is None:
            found = self.get_kv(INSTANCE_KEY)
            if found is None:
                with self.engine.connect() as conn:
                    try:
                        conn.execute(
                            _insert_if_missing(conn.dialect.name),
                            {"key": INSTANCE_KEY, "value": str(uuid.uuid4())},
                        )
                        conn.commit()
                    except IntegrityError:  # a dialect without an upsert: another was first
                        conn.rollback()
                    except OperationalError as exc:
                        self.raise_if_busy(exc)
                        raise
                found = self.get_kv(INSTANCE_KEY)
            if found is None:
                raise StoreError(f"the store {self.url} did not keep its instance id; retry")
            self._instance_id = found
        return self._instance_id


INSTANCE_KEY = "store.instance_id"


def _insert_if_missing(dialect: str) -> Any:
    """An insert into keyvalue that leaves an existing row alone (plain on other dialects)."""
    if dialect == "sqlite":
        return text("INSERT OR IGNORE INTO keyvalue (key, value) VALUES (:key, :value)")
    if dialect == "postgresql":
        return text(
            "INSERT INTO keyvalue (key, value) VALUES (:key, :value) ON CONFLICT (key) DO NOTHING"
        )
    return text("INSERT INTO keyvalue (key, value) VALUES (:key, :value)")


_KV_VALUE = text("SELECT value FROM keyvalue WHERE key = :key")
# A session's info key naming the Store that made it (the lifecycle's audit hook reads it).
STORE_INFO = "nightshift.store"


class RowRecorder(Protocol):
    """Appends events to the audit chain inside a transaction that holds the write lock
    (policies.audit.AuditLog); runtime knows it only by this shape."""

    def record_in(self, conn: Connection, events: list[dict[str, Any]]) -> Callable[[], None]:
        """Chain and insert `events` on `conn`; returns what to run once they are committed."""
        ...

    def authentic(self, event: AuditEvent) -> bool:
        """Whether a stored event's hash matches its contents and its signature is the key's."""
        ...


def lock_for_write(conn: Connection, table: str) -> None:
    """Take the database's write lock at the first statement, so that a read followed by a write
    cannot interleave with another process (SQLite: BEGIN IMMEDIATE; PostgreSQL: `table`)."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        conn.exec_driver_sql(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE')


_CALL_TX: ContextVar[CallTransaction | None] = ContextVar("nightshift_call_tx", default=None)


class CallTransaction:
    """One call's rows and its audit events in one write transaction, for a skill whose only
    effects are rows in the store: nothing to record before a side effect, so its rows and the
    events that say why they exist commit together, or not at all.

        with store.call_transaction("auditevent") as tx:
            result = skill(...)          # its store.session() joins tx, begun at first use
            audit.append_in(tx, events)  # the events, chained under the same lock
            tx.commit()

    The write lock is taken at the first statement (`lock_table` names what PostgreSQL locks), so
    the skill's reads and the chain head are read under it. Leaving without commit rolls back."""

    def __init__(self, store: Store, lock_table: str):
        self.store, self.lock_table = store, lock_table
        self._session: Session | None = None
        self._mutex: int | None = None
        self._after: list[Callable[[], None]] = []

    def __enter__(self) -> CallTransaction:
        self._token = _CALL_TX.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CALL_TX.reset(self._token)
        self.rollback()

    def session(self) -> Session:
        if self._session is None:
            s = Session(self.store.engine, expire_on_commit=False, info={STORE_INFO: self.store})
            try:
                lock_for_write(s.connection(), self.lock_table)
            except OperationalError as exc:
                s.close()
                self.store.raise_if_busy(exc)
                raise
            self._session = s
        return self._session

    def after_commit(self, fn: Callable[[], None]) -> None:
        self._after.append(fn)

    def commit(self) -> None:
        s = self.session()
        try:
            s.commit()
        except OperationalError as exc:
            self.rollback()
            self.store.raise_if_busy(exc)
            raise
        s.close()
        self._session = None
        self._unlock()
        after, self._after = self._after, []
        for fn in after:
            fn()

    def rollback(self) -> None:
        """Undo what the call wrote (its events too); nothing of it is ever seen."""
        s, self._session, self._after = self._session, None, []
        if s is not None:
            s.rollback()
            s.close()
        self._unlock()

    def _unlock(self) -> None:
        m, self._mutex = self._mutex, None
        if m is not None:
            os.close(m)


def _revisions(conn: Connection) -> set[str] | None:
    """The revisions in `alembic_version`; None when the table is missing (no Alembic yet)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def dumps(obj: Any) -> str:
    """Canonical JSON: sorted keys, no spaces; used for hashing and for stable output. Keys that
    are not strings (YAML reads `{&a,=}` as {None: None, "=": None}) become the strings JSON
    stores them as before they are sorted, so a value hashes as it reads back."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    except TypeError:  # keys of mixed types cannot be sorted as they are
        stored = json.loads(json.dumps(obj, separators=(",", ":"), default=str))
        return json.dumps(stored, sort_keys=True, separators=(",", ":"))
