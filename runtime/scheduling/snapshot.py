"""The placement snapshot, loaded from the store the way the loop needs it: in a handful of
queries, reading only the spec fields placement uses, and only the latest health sample per GPU.
The daemon, `nightshift run` and the scale benchmark all load it through `load_snapshot`."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import (
    String,
    Text,
    and_,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
    true,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import aliased

from nightshift.runtime.executors.executor import HostGpus, gang_ranks
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.scheduling.estimates import Estimator, PastRun, params_key
from nightshift.runtime.scheduling.local_time import deadline_of
from nightshift.runtime.scheduling.placement import (
    QUARANTINED,
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
)
from nightshift.runtime.scheduling.tariff import Tariff
from nightshift.runtime.spec import MAX_MINUTES, Resources
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, GpuSample, Job, Store, latest_gpu_sample_ids
from nightshift.runtime.store.quick_read import stored_json

FAILED_OUTCOMES = ("failed", "lost", "timeout", "stalled")  # outcomes that earn a backoff


# What placement reads of a stored spec (model_dump(mode="json") of an ExperimentSpec).
SPEC_FIELDS: tuple[tuple[str, ...], ...] = (
    ("resources", "gpus"),
    ("resources", "gpu_memory_gb"),
    ("resources", "share_gpu"),
    ("resources", "gpu_memory_cap_gb"),
    ("resources", "expected_duration_min"),
    ("cost_class",),
    ("pausable",),
    ("checkpoint", "dir"),
    ("timeout_min",),
    ("depends_on",),
    ("retry_wait_s",),
    ("deadline",),
    ("begin",),
    ("resources", "span_hosts"),
)


class _Placed(BaseModel):
    """The plucked fields, under the spec's own constraints: a stored spec that a hand edit or
    an older version left with `inf`, a string or a negative count fails its job, not the loop."""

    model_config = ConfigDict(allow_inf_nan=False)

    resources: Resources
    cost_class: Literal["urgent", "cost_sensitive"] = "urgent"
    pausable: bool = True
    checkpoint_dir: str | None = None
    timeout_min: float | None = Field(None, gt=0, le=MAX_MINUTES)
    depends_on: list[str] = Field(default_factory=list)
    retry_wait_s: float | None = Field(None, ge=0, le=MAX_MINUTES * 60)


# Fields already found valid (the raw plucked text or its repr), so each is checked once; on
# SQLite also decoded once: the text -> its values.
_VALID: dict[str, list[Any]] = {}
_VALID_MAX = 100_000

# PendingJob's fields, in the order load_snapshot lists a waiting job's values: a job of the
# previous load is kept when these are all as loaded now
PENDING_ORDER = tuple(PendingJob.model_fields)
_pending_values = operator.attrgetter(*PENDING_ORDER)
# where the learned estimate's two values sit in them (a job whose estimate alone moved is kept)
_EXPECTED, _UPPER = sorted(
    PENDING_ORDER.index(f) for f in ("expected_duration_s", "expected_upper_s")
)


def stored_fields_problem(values: list[Any]) -> str | None:
    """Why the plucked fields of a stored spec (SPEC_FIELDS order) are unusable, or None."""
    (
        gpus,
        mem,
        share,
        cap,
        minutes,
        cost_class,
        pausable,
        ckpt,
        timeout,
        deps,
        wait,
        _,
        _,
        span,
    ) = values
    raw = {"gpus": gpus, "gpu_memory_gb": mem, "share_gpu": share, "span_hosts": span}
    raw |= {"gpu_memory_cap_gb": cap, "expected_duration_min": minutes}
    data = {
        "resources": {k: v for k, v in raw.items() if v is not None},
        "cost_class": cost_class if cost_class is not None else "urgent",
        "pausable": pausable if pausable is not None else True,
        "checkpoint_dir": ckpt,
        "timeout_min": timeout,
        "depends_on": deps if deps is not None else [],
        "retry_wait_s": wait,
    }
    try:
        _Placed.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]).replace("checkpoint_dir", "checkpoint.dir")
        return f"stored spec field {where}: {err['msg']}"
    return None


def _check_fields(key: str, values: Any) -> str | None:
    if key in _VALID:
        return None
    if not isinstance(values, list) or len(values) != len(SPEC_FIELDS):
        return "stored spec is not a mapping of spec fields"
    problem = stored_fields_problem(values)
    if problem is None:
        if len(_VALID) >= _VALID_MAX:
            _VALID.clear()
        _VALID[key] = values
    return problem


def _fields(raw: Any, as_text: bool) -> tuple[Any, str | None]:
    """A stored spec's plucked fields (SPEC_FIELDS order) and why they are unusable (None: they
    are fine). `as_text`: `raw` is the database's JSON array of them, each distinct text decoded
    once; else the spec itself."""
    if not as_text:
        values = _pluck(raw or {})
        return values, _check_fields(repr(values), values)
    known = _VALID.get(raw)
    if known is not None:
        return known, None
    values = json.loads(raw)
    return values, _check_fields(raw, values)


def _params_key(raw: Any, as_text: bool) -> str:
    """params_key() of a job's stored parameters; as text (`as_text`), decoded once per text."""
    if not as_text or raw is None:
        return params_key(raw)
    return _params_key_of_text(raw)


@functools.lru_cache(maxsize=_VALID_MAX)
def _params_key_of_text(raw: str) -> str:
    # text a raw edit broke reads as the ORM reads it: the tick goes on, and the launch's
    # check of the row against its audit refuses the job
    return params_key(stored_json(raw))


def _kept_or_new(old: PendingJob | None, values: tuple[Any, ...]) -> PendingJob:
    """The previous load's object for this job (`old`) when all its fields are as loaded now, or
    when only its learned estimate moved (set in place), else a new one: placement keeps a
    waiting job's fields as columns found by the object's identity, so a job that did not change
    between ticks costs it nothing (a new object costs a row), and a moved estimate one value."""
    if old is None:
        return PendingJob(**dict(zip(PENDING_ORDER, values, strict=True)))
    was = _pending_values(old)
    if was == values:
        return old
    e, u = _EXPECTED, _UPPER
    if (
        was[:e] == values[:e]
        and was[e + 1 : u] == values[e + 1 : u]
        and was[u + 1 :] == values[u + 1 :]
    ):
        # only the learned estimate moved (another run of its name finished)
        old.renew_estimate(values[e], values[u])
        return old
    return PendingJob(**dict(zip(PENDING_ORDER, values, strict=True)))


class SpecFields:
    """Each job's placement fields as of its spec's revision (`job.spec_rev`, which the
    database's own triggers move on every insert and every update of the spec, a raw edit's
    too), kept by the caller between loads: a load reads the fields only of jobs whose revision
    moved (at 100,000 queued jobs, extracting every spec's took 0.3-0.5 s of SQLite's load)."""

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[int, Any, Any]] = {}  # id -> (revision, fields, valid)


# Jobs whose fields are looked up by id; more than this are read in a scan of the table.
FIELDS_BY_ID_MAX = 10_000


def _rows_with_fields(
    conn: Any,
    columns: tuple[Any, ...],
    seen: Any,
    with_fields: Callable[..., Any],
    spec_fields: SpecFields | None,
) -> list[tuple[Any, ...]]:
    """The rows `seen` selects: `columns`, then their spec's fields and validity. Without
    `spec_fields`, or with none kept, one scan reads them all; else the columns and revisions
    first, then the fields of the jobs new or changed since (by id, or in a scan when many)."""
    n = len(columns)
    if spec_fields is None or not spec_fields.by_id:
        rows = conn.execute(with_fields(*columns, where=seen)).all()
        if spec_fields is not None:
            spec_fields.by_id = {r[0]: (r[n], r[n + 1], r[n + 2]) for r in rows}
        return [(*r[:n], r[n + 1], r[n + 2]) for r in rows]
    base = conn.execute(select(*columns, Job.spec_rev).where(seen)).all()
    known = spec_fields.by_id
    missing = [r[0] for r in base if (k := known.get(r[0])) is None or k[0] != r[n]]
    if missing:
        where = Job.id.in_(missing) if len(missing) <= FIELDS_BY_ID_MAX else seen
        for job_id, rev, raw, ok in conn.execute(with_fields(Job.id, where=where)):
            known[job_id] = (rev, raw, ok)  # a revision newer than base's: read again next load
    rows, kept = [], {}
    for r in base:
        k = known.get(r[0])
        if k is not None:  # else it left the table between the two reads
            kept[r[0]] = k
            rows.append((*r[:n], k[1], k[2]))
    spec_fields.by_id = kept
    return rows


def _fail_unloadable(store: Store, reasons: dict[int, str], now: datetime) -> None:
    """Set queued jobs whose stored spec cannot be used `failed`, with the reason in job.reason
    (this loader has no audit sink); a job that left the queue meanwhile is left alone."""
    with store.write_session() as s:
        for job_id, why in reasons.items():
            lifecycle.fail_queued(
                s, job_id, f"cannot be loaded: {why}; fix the spec and submit it again", now
            )


def _deadline(text: Any, submitted: datetime, tz: tzinfo) -> datetime | None:
    """The job's deadline as naive UTC; None without one (or with one a hand edit broke: the
    spec's validator refuses it at submit, and placement then simply has no deadline)."""
    if not isinstance(text, str):
        return None
    try:
        return deadline_of(text, submitted, tz)
    except ValueError:
        return None


def _past_runs(rows: Any, as_text: bool) -> list[PastRun]:
    """One PastRun per finished job of the history rows (one row per attempt); `as_text`: the
    rows' parameters are their JSON text and `asked` the spec's own estimate."""
    took: dict[int, float] = {}
    first: dict[int, Any] = {}
    for r in rows:
        first.setdefault(r.id, r)
        if r.ended_at is not None:
            took[r.id] = took.get(r.id, 0.0) + (r.ended_at - r.started_at).total_seconds()
    out = []
    for job_id, seconds in took.items():
        r = first[job_id]
        raw = (
            r.asked
            if as_text
            else ((r.asked or {}).get("resources") or {}).get("expected_duration_min")
        )
        try:
            minutes = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            minutes = None
        asked_s = minutes * 60.0 if minutes and 0 < minutes <= MAX_MINUTES else None
        out.append(PastRun(r.owner, r.name, _params_key(r.params, as_text), asked_s, seconds))
    return out


def _pluck(spec: dict[str, Any]) -> list[Any]:
    out = []
    for path in SPEC_FIELDS:
        v: Any = spec
        for part in path:
            v = v.get(part) if isinstance(v, dict) else None
        out.append(v)
    return out


HOST_STRIDE = 1000  # GPU ids across a cluster's hosts: host rank × stride + index on the host


def cluster_gpu_id(rank: int, index: int) -> int:
    return rank * HOST_STRIDE + index


def on_host(snap: Snapshot, gpus: list[int]) -> tuple[str, list[int]]:
    """The host and its own GPU indices of a start placed on a cluster snapshot's GPU ids."""
    if not gpus:
        return "", []
    host = next(g.host for g in snap.gpus if g.index == gpus[0])
    return host, [g % HOST_STRIDE for g in gpus]


def by_host(snap: Snapshot, gpus: list[int]) -> list[HostGpus]:
    """The hosts of a start placed on a cluster snapshot's GPU ids, each with its own GPU
    indices, in host rank order: one for a run on one host, several for a gang."""
    host_of = {g.index: g.host for g in snap.gpus}
    out: dict[str, list[int]] = {}
    for g in sorted(gpus):
        out.setdefault(host_of[g], []).append(g % HOST_STRIDE)
    return [HostGpus(host=h, gpus=ids) for h, ids in out.items()]


def _across_hosts(slots: list[GpuSlot]) -> tuple[list[GpuSlot], dict[str, int]]:
    """The cluster's GPUs under ids unique across hosts, and each host's rank. A host with a
    quarantined GPU has all of them quarantined: which of its GPUs a run gets is the cluster's
    choice, and it may be the bad one."""
    hosts = {h: rank for rank, h in enumerate(sorted({g.host for g in slots}))}
    bad = {g.host for g in slots if g.verdict in QUARANTINED}
    # the host is back when its last quarantined GPU is (never, if one of them is not expected)
    back: dict[str, datetime | None] = {}
    for g in slots:
        if g.verdict in QUARANTINED:
            was = back.get(g.host, g.back_by)
            back[g.host] = None if was is None or g.back_by is None else max(was, g.back_by)
    out = [
        g.model_copy(
            update={
                "index": cluster_gpu_id(hosts[g.host], g.index),
                "verdict": "CRITICAL" if g.host in bad else g.verdict,
                "back_by": back.get(g.host),
            }
        )
        for g in slots
        if 0 <= g.index < HOST_STRIDE
    ]
    return out, hosts


def _back_by(
    verdict: str, data: dict[str, Any] | None, taken_at: datetime, interval_s: float | None
) -> datetime | None:
    """When a quarantined GPU that is passing its healthy checks (gpu_health's `held` record:
    n of the needed checks in a row) is back in placement if the rest pass at the health
    check's interval; None for a GPU that is not passing them (nobody knows when it is back)."""
    held = data.get("held") if isinstance(data, dict) and verdict in QUARANTINED else None
    if not isinstance(held, dict) or interval_s is None or held.get("released"):
        return None  # (a row some other version wrote is read as "not known", never a crash)
    try:
        left = int(held["needed"]) - int(held["healthy_checks"])
    except (KeyError, TypeError, ValueError):
        return None
    return taken_at + timedelta(seconds=max(0, left) * interval_s)


def _left_after(expected: float, upper: float | None, ran: float) -> tuple[float, float]:
    """A job resumed from a checkpoint after its attempts ran `ran` seconds: what is left of its
    estimate (at least a minute) and of its worst case. One that outran its estimate has the
    rest of its worst case, else as long again as it ran (placement.outrun_end, for a running
    job past its end)."""
    if ran < expected:
        left = max(60.0, expected - ran)
    else:
        rest = (upper or 0.0) - ran
        left = rest if rest >= 60.0 else max(60.0, ran)
    return left, max(left, (upper or expected) - ran)


def load_snapshot(
    store: Store,
    now: datetime,
    *,
    cpu_slots: int = 1,
    backoff: Backoff | None = None,
    tariff: Tariff | None = None,
    cost_threshold: float | None = None,
    aging_per_hour: float = 1.0,
    preempt_margin: int | None = None,
    default_duration_s: float = 3600.0,
    scope: set[int] | None = None,
    node: str | None = None,
    cluster: str | None = None,
    tz: tzinfo = UTC,
    mono: tuple[float, str] | None = None,
    health_sources: tuple[str, ...] | None = None,
    recovery_interval_s: float | None = None,
    previous: dict[int, PendingJob] | None = None,
    spec_fields: SpecFields | None = None,
) -> Snapshot:
    """The placement snapshot from the store in five queries (six when `spec_fields` lacks some).

        Specs were validated at submit; the fields placement reads are checked again, once per
        distinct value, and a queued job whose stored fields fail is set `failed` with the reason
        (a running one is seen with neutral values) instead of stopping the loop. On SQLite
        only the fields placement needs leave the database (one `json_extract` with several paths:
        decoding each whole spec costs ten times more). Expected duration: learned from the
        finished jobs of the same names and owners (estimates.py: this job's earlier runs, else
        the owner's estimate scaled by how their estimates turned out, else runs of its name),
        else the snapshot default; a job resumed from a checkpoint, waiting or running, expects
        what remains after its earlier attempts (once they outran the estimate: the rest of its
        worst case, else as long again); a running job ends by its timeout at the latest.
        Backoff: a queued job whose last attempt failed waits its backoff from the attempt's
        end: counted on the monotonic clock given
    in `mono` (now, boot id) where the attempt ended on this boot, so a wall-clock step moves no
    backoff; else from `ended_at` by the wall clock. A job may be
        paused only when its spec allows it and it has a checkpoint to resume from. GPUs: the
        latest health sample of each (host, index), not the whole sample history. With `node`
        (several daemons on one store), the running jobs and the GPUs are that node's only: another
        node's GPU 0 is not this one's, and its CPU jobs take none of this node's slots. With
        `cluster` (a host prefix such as "ray:"), the GPUs are those of the cluster's hosts, as the
        census recorded them, numbered across hosts (`cluster_gpu_id`), and a host with any
        quarantined GPU is quarantined whole: the cluster, not nightshift, picks the GPUs on a host.
        With `health_sources` (runtime/gpu/gpu.py `health_sources`), only the verdicts of those
        probe sources: another process's GPU settings never quarantine this one's GPUs. With
        `previous` (the caller's, empty at first), a waiting job whose fields are all as at the
        last load, or whose learned estimate alone moved (updated in place), is the same object
        (`_kept_or_new`); the dict is left holding this load's. With `spec_fields` (the caller's,
        empty at first), a spec's fields are read again only when its revision moved."""
    backoff = backoff or Backoff()
    active = ("queued", "running")
    # Failed jobs whose backoff may still run (recovery may queue them again): they keep their
    # place in queue order (Snapshot.recovering). No backoff is longer than its cap.
    recent = now - timedelta(seconds=backoff.cap_s + 60)
    seen = or_(Job.state.in_(active), and_(Job.state == "failed", Job.updated_at >= recent))
    with store.session() as s:
        conn = s.connection()
        dialect = conn.dialect.name
        sqlite = dialect == "sqlite"
        # SQLite and PostgreSQL hand over the placement fields as one JSON array's text, the
        # parameters as their text and a spec's own estimate as a scalar: each distinct text is
        # decoded once (decoding every whole spec and parameters of 100,000 rows took ~8 s of a
        # 10 s load on PostgreSQL). Any other database hands over the JSON, plucked here.
        as_text = sqlite or dialect == "postgresql"
        # SQLite: a spec that is not valid JSON (a hand edit) gives no fields (json_extract would
        # raise on it) and is told by `valid`, in the same scan of the table (PostgreSQL's json
        # column takes valid JSON only)
        valid = func.json_valid(Job.spec) if sqlite else true()
        fields: Any = Job.spec
        params: Any = Job.params
        asked: Any = Job.spec
        if sqlite:
            fields = case(
                (
                    valid,
                    func.json_extract(
                        Job.spec, *("$." + ".".join(p) for p in SPEC_FIELDS), type_=String
                    ),
                ),
                else_=None,
            )
            params = type_coerce(Job.params, String)
            # a finished job's spec a hand edit broke gives no estimate (json_extract would
            # raise on it, and every tick with it)
            asked = case(
                (
                    func.json_valid(Job.spec),
                    func.json_extract(Job.spec, "$.resources.expected_duration_min", type_=String),
                ),
                else_=None,
            )
        elif as_text:  # the paths are this module's constants, never input
            params = cast(Job.params, Text)
            asked = literal_column("job.spec #>> '{resources,expected_duration_min}'")
        columns = (
            Job.id,
            Job.name,
            Job.owner,
            params.label("params"),
            Job.priority,
            Job.state,
            Job.created_at,
            Job.resume_from,
            Job.max_attempts,
            Job.reason,
        )

        def with_fields(*cols: Any, where: Any) -> Any:
            """`cols` of the rows `where` selects, then their spec's revision, fields and
            validity."""
            if dialect != "postgresql":
                return select(
                    *cols, Job.spec_rev, fields.label("fields"), valid.label("valid")
                ).where(where)
            # each spec parsed once, as jsonb, in a subquery the planner keeps (OFFSET 0), and its
            # fields picked from that: 1.8 s of the server's time at 100,000 rows, against 3.6 s
            # picking each field from the json text (which parses it again for every field)
            rows = select(*cols, Job.spec_rev, cast(Job.spec, JSONB).label("spec"))
            placed = rows.where(where).offset(0).subquery("placed")
            picked = cast(
                func.jsonb_build_array(
                    *(literal_column(f"placed.spec #> '{{{','.join(p)}}}'") for p in SPEC_FIELDS)
                ),
                Text,
            )
            return select(
                *(c for c in placed.c if c.name != "spec"),
                picked.label("fields"),
                valid.label("valid"),
            )

        jobs = _rows_with_fields(conn, columns, seen, with_fields, spec_fields)
        succeeded = set(
            conn.execute(select(Job.name).where(Job.state == "succeeded").distinct()).scalars()
        )
        atts = conn.execute(
            select(
                Attempt.job_id,
                Attempt.number,
                Attempt.outcome,
                Attempt.gpus,
                Attempt.started_at,
                Attempt.ended_at,
                Attempt.node,
                Attempt.host,
                Attempt.boot_id,
                Attempt.ended_mono,
            )
            .join(Job, Job.id == Attempt.job_id)
            .where(seen)
            .order_by(Attempt.job_id, Attempt.number)
        ).all()
        other = aliased(Job)
        # Finished jobs of the active jobs' names or owners, all their attempts: what a job
        # took is the time of every attempt it needed.
        history = conn.execute(
            select(
                Job.id,
                Job.owner,
                Job.name,
                params.label("params"),
                asked.label("asked"),
                Attempt.started_at,
                Attempt.ended_at,
            )
            .join(Job, Job.id == Attempt.job_id)
            .where(
                Job.state == "succeeded",
                or_(
                    Job.name.in_(select(other.name).where(other.state.in_(active))),
                    Job.owner.in_(select(other.owner).where(other.state.in_(active))),
                ),
            )
        ).all()
        latest = latest_gpu_sample_ids(node=node, cluster=cluster, sources=health_sources)
        samples = conn.execute(
            select(
                GpuSample.gpu_index,
                GpuSample.host,
                GpuSample.verdict,
                GpuSample.data,
                GpuSample.taken_at,
            )
            .where(GpuSample.id.in_(latest))
            .order_by(GpuSample.host, GpuSample.gpu_index)
        ).all()

    estimator = Estimator(_past_runs(history, as_text))
    last: dict[int, Any] = {}
    ran_s: dict[int, float] = {}
    failures: dict[int, int] = {}
    for a in atts:
        last[a.job_id] = a
        if a.outcome in FAILED_OUTCOMES:
            failures[a.job_id] = failures.get(a.job_id, 0) + 1
        if a.ended_at is not None:
            ran_s[a.job_id] = ran_s.get(a.job_id, 0.0) + (a.ended_at - a.started_at).total_seconds()

    slots = [
        GpuSlot(
            index=r.gpu_index,
            host=r.host,
            verdict=r.verdict,
            memory_total_mib=(r.data or {}).get("memory_total_mib"),
            memory_used_mib=(r.data or {}).get("memory_used_mib"),
            back_by=_back_by(r.verdict, r.data, r.taken_at, recovery_interval_s),
        )
        for r in samples
    ]
    hosts: dict[str, int] = {}
    if cluster is not None:
        slots, hosts = _across_hosts(slots)

    def held(att: Any) -> list[int]:
        """The attempt's GPUs as placement numbers them: a gang's on each of its hosts."""
        if not isinstance(att.gpus, list):
            return []  # a row edited in the store: the watch step stops that run (engine.py)
        if cluster is None:
            return list(att.gpus)
        out: list[int] = []
        for part in gang_ranks(att.host, list(att.gpus)) or [
            HostGpus(host=att.host, gpus=att.gpus)
        ]:
            rank = hosts.get(part.host)
            if rank is not None:
                out += [cluster_gpu_id(rank, i) for i in part.gpus]
        return out

    pending: list[PendingJob] = []
    # where each kept waiting job sat in the last load (`previous` keeps its order, the waiting
    # jobs first), -1 for the others: placement finds their rows by it (Snapshot._kept_from)
    was_at = {job_id: i for i, job_id in enumerate(previous)} if previous else {}
    kept_from: list[int] = []
    running: list[RunningJob] = []
    recovering: list[PendingJob] = []
    estimates: dict[tuple[Any, ...], Any] = {}  # most jobs share an owner, a name and a request
    unloadable: dict[int, str] = {}  # queued jobs whose stored spec cannot be used: why
    for j in jobs:
        (
            job_id,
            name,
            owner,
            params,
            priority,
            state,
            created_at,
            resume_from,
            max_attempts,
            reason,
            raw_fields,
            is_valid,
        ) = j  # each field read once: attribute access on 100,000 rows is what costs
        if not is_valid:  # queued: failed below; running: not seen, as before
            if state == "queued":
                unloadable[job_id] = "stored spec is not valid JSON"
            continue
        values, problem = _fields(raw_fields, as_text)
        if problem is not None:
            if state == "failed":
                continue
            if state == "queued":
                unloadable[job_id] = problem
                continue
            values = [None] * len(SPEC_FIELDS)  # running: seen as asking for nothing special
            values[6] = False  # and not pausable: its checkpoint folder is unknown
        (
            gpus,
            mem,
            share,
            cap,
            minutes,
            cost_class,
            pausable,
            ckpt,
            timeout_min,
            depends_on,
            retry_wait_s,
            deadline_text,
            begin_text,
            span_hosts,
        ) = values
        asked = (
            owner,
            name,
            _params_key(params, as_text),
            minutes * 60.0 if minutes else None,
        )
        if asked not in estimates:
            estimates[asked] = estimator.estimate(*asked)
        learned = estimates[asked]
        expected = learned.expected_s if learned is not None else None
        upper = learned.upper_s if learned is not None else None
        deadline = _deadline(deadline_text, created_at, tz)
        att = last.get(job_id)
        cost_class = cost_class or "urgent"
        pausable = pausable is not False and ckpt is not None
        if state in ("queued", "failed"):
            if scope is not None and job_id not in scope:
                continue
            if expected is not None and resume_from:
                expected, upper = _left_after(expected, upper, ran_s.get(job_id, 0.0))
            not_before = None
            if att is not None and att.outcome in FAILED_OUTCOMES and att.ended_at:
                not_before = backoff.not_before(att.ended_at, att.number, job_id, retry_wait_s)
                if mono is not None and att.ended_mono is not None and att.boot_id == mono[1]:
                    ended = now - timedelta(seconds=max(0.0, mono[0] - att.ended_mono))
                    not_before = backoff.not_before(ended, att.number, job_id, retry_wait_s)
            if state == "failed" and (
                not_before is None
                or not_before <= now
                or failures.get(job_id, 0) >= (max_attempts or 0)
            ):
                continue  # recovery will not queue it again, or its backoff is over
            if state == "queued" and lifecycle.retry_was_asked(reason):
                not_before = None  # a person's retry starts now: backoff is for the loop's own
            begin = _deadline(begin_text, created_at, tz)  # spec.begin: not before then
            if begin is not None and (not_before is None or begin > not_before):
                not_before = begin
            old = previous.get(job_id) if previous is not None else None
            job = _kept_or_new(
                old,
                (
                    job_id,
                    name,
                    priority,
                    gpus or 0,
                    mem,
                    bool(share),
                    cap,
                    [d for d in depends_on or () if d not in succeeded],
                    created_at,
                    not_before,
                    att.number if att is not None else 0,
                    cost_class,
                    expected,
                    pausable,
                    deadline,
                    0.0,
                    upper,
                    bool(span_hosts),
                ),
            )
            if state == "queued":
                pending.append(job)
                kept_from.append(was_at[job_id] if job is old else -1)
            else:
                recovering.append(job)
        else:
            if node is not None and att is not None and att.node not in (node, ""):
                continue  # another node's run: its GPUs and slots are not ours
            started = att.started_at if att is not None and att.ended_at is None else None
            if expected is not None and resume_from:  # this attempt carries on the earlier ones'
                expected, upper = _left_after(expected, upper, ran_s.get(job_id, 0.0))
            end = worst = None
            if started is not None:
                if expected is not None:
                    end = started + timedelta(seconds=expected)
                if upper is not None:
                    worst = started + timedelta(seconds=upper)
                if timeout_min:
                    limit = started + timedelta(minutes=timeout_min)
                    end = min(end, limit) if end is not None else limit
                    worst = min(worst, limit) if worst is not None else None
            running.append(
                RunningJob(
                    id=job_id,
                    name=name,
                    priority=priority,
                    share_gpu=bool(share),
                    gpu_memory_cap_gb=cap,
                    cost_class=cost_class,
                    pausable=pausable,
                    gpus=held(att) if att is not None and started is not None else [],
                    gpu_memory_gb=mem,
                    submitted_at=created_at,
                    started_at=started,
                    expected_end=end,
                    upper_end=worst,
                    deadline=deadline,
                )
            )
    if unloadable:
        _fail_unloadable(store, unloadable, now)
    if previous is not None:
        previous.clear()
        previous.update((p.id, p) for p in (*pending, *recovering))
    snap = Snapshot(
        now=now,
        pending=pending,
        running=running,
        recovering=recovering,
        gpus=slots,
        cpu_slots=cpu_slots,
        tariff=tariff,
        cost_threshold=cost_threshold,
        aging_per_hour=aging_per_hour,
        preempt_margin=preempt_margin,
        default_duration_s=default_duration_s,
    )
    if previous is not None:
        snap._kept_from = np.array(kept_from, dtype=np.int64)
    return snap
