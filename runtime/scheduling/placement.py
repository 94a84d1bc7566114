"""Placement as one pure function: a snapshot of the world in; starts, a hold reason for every
waiting job, preemption proposals and tariff pauses out.

The loop, the daemon and the simulator in `evals/` all call `place`; it reads no clock, store or
GPU itself, so the same snapshot always gives the same decision.

What it decides, in order, for each pending job:

1. dependencies: a job whose `depends_on` names have not all succeeded waits on them;
2. backoff: a job whose last attempt failed waits until its `not_before`;
3. tariff: a cost_sensitive job starts only inside a cheap period (price at or below the
   threshold, a price or a band: `cheapest`, `not_peak`) that it fits in before the period ends;
   a job longer than every cheap period in the horizon starts only as one opens (within
   `long_job_start_grace_s`); a job with a `deadline` is held only for a cheap period that opens
   early enough to finish by the deadline on its estimate (with `hold_slack_s` to spare), and
   otherwise starts now; urgent jobs ignore prices;
4. resources, highest effective priority first (priority + `aging_per_hour` × hours waited, so a
   low priority cannot starve; `order: sjf_aging` takes `sjf_per_doubling` off per doubling of
   the estimate, `order: las` `las_points` per level of attained GPU time; a cost_sensitive job
   that a hold could have delayed and that has no slack left gets `deadline_boost`), on the first
   host that fits or (`host_fit: best`) the one left with the fewest free GPUs: CPU slots for jobs that ask for no GPU; otherwise healthy GPUs
   (CRITICAL and UNKNOWN are quarantined) on one host, all at once, each with the free memory the
   job asks for — a GPU of its own, or, when the spec allows sharing, a share of a GPU that no
   exclusive job holds, counted against the memory caps of the jobs already on it. A job wider
   than every host (or one whose `span_hosts` allows it) is a gang: whole GPUs across hosts, all
   at once or none, on the fewest hosts (the hosts with the most free GPUs first, as Slurm's and
   Kueue's topology-aware placement prefer) and the remainder on the host it leaves the fewest
   GPUs stranded on; where runs cannot span hosts (`cannot_span`) it waits, saying so;
5. EASY backfill: the first job that cannot start gets a reservation (the earliest time enough
   GPUs are expected free, from running jobs' expected ends) and every later job may start now
   only if it ends before that time or uses none of the reserved GPUs — so backfill never delays
   the head;
6. preemption (when `preempt_margin` is set): a blocked job whose effective priority exceeds a
   running pausable job's (aged alike, so it cannot flip back) by at least the margin proposes
   pausing it at a checkpoint; at most `preempt_max_per_call` jobs preempt per call (a gang
   does not preempt: victims are chosen per host; it waits on its reservation).

Running cost_sensitive pausable jobs get a pause proposal once their cheap period is over,
unless they have a deadline that resuming at the next cheap period would miss (or were started
off-peak because of it).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import operator
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Literal, TypeAlias
from zoneinfo import ZoneInfo

import numpy as np
from pydantic import BaseModel, Field, PrivateAttr

from nightshift.runtime.scheduling import pending_columns
from nightshift.runtime.scheduling.pending_columns import (
    NONE_US,
    ArrayBucket,
    PendingColumns,
    Unsupported,
    columns,
    micros,
)
from nightshift.runtime.scheduling.tariff import DAYS, Period, Tariff

QUARANTINED = ("CRITICAL", "UNKNOWN")  # a GPU we cannot read is not a GPU we place work on
CostClass = Literal["urgent", "cost_sensitive"]
_INF = datetime.max
_UTC_ZONE = ZoneInfo("UTC")


class GpuSlot(BaseModel):
    """One GPU as last recorded by gpu_health_check."""

    index: int
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    verdict: str = "OK"  # latest recorded verdict; CRITICAL or UNKNOWN means quarantined
    host: str = "localhost"  # a multi-GPU job gets all its GPUs on one host, unless a gang
    # A quarantined GPU's expected return (its remaining healthy checks): placement counts it as
    # busy until then, so a job that needs it keeps a reservation instead of the cluster filling
    # up around it; None: not expected back (placement leaves it out)
    back_by: datetime | None = None


class PendingJob(BaseModel):
    """A queued job, as placement needs to see it."""

    id: int
    name: str = ""
    priority: int = 0
    gpus: int = 0
    gpu_memory_gb: float | None = None
    share_gpu: bool = False
    gpu_memory_cap_gb: float | None = Field(
        None,
        description="Memory cap when sharing a GPU; default gpu_memory_gb; with neither, "
        "the job runs alone",
    )
    blocked_by: list[str] = Field(default_factory=list, description="unmet depends_on names")
    submitted_at: datetime
    not_before: datetime | None = Field(None, description="Backoff: no start before this")
    attempt: int = Field(0, description="Attempts made so far (the last one failed if not_before)")
    cost_class: CostClass = "urgent"
    expected_duration_s: float | None = Field(
        None, description="From the spec or history; for a resumed job, what remains"
    )
    pausable: bool = True
    deadline: datetime | None = Field(
        None,
        description="Finish by this; a cost_sensitive job is held for cheap hours only while "
        "it can still make it by its expected duration",
    )
    attained_gpu_s: float = Field(
        0.0, ge=0, description="GPU-seconds run in earlier attempts: what `order: las` ranks by"
    )
    expected_upper_s: float | None = Field(
        None,
        description="What it may take at worst by the history of such estimates (their error's "
        "90th percentile): a tariff hold leaves its deadline reachable at this, not only at "
        "the estimate",
    )
    span_hosts: bool = Field(
        False,
        description="May run as a gang across hosts when no one host has its GPUs free (a job "
        "wider than every host is a gang anyway)",
    )

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        pending_columns.forget(self)  # placement's copy of its fields is stale now

    def renew_estimate(self, expected_s: float | None, upper_s: float | None) -> None:
        """A new learned estimate for a job otherwise unchanged, set in place: placement keeps the
        job's row and takes the one value (a daemon's estimates move with every finished run of
        the name, and a new object would cost a whole row each time)."""
        BaseModel.__setattr__(self, "expected_duration_s", expected_s)
        BaseModel.__setattr__(self, "expected_upper_s", upper_s)
        pending_columns.renewed(self)


class RunningJob(BaseModel):
    """A running job; the defaults describe a job that is neither preempted nor paused."""

    id: int
    gpus: list[int] = Field(default_factory=list)
    share_gpu: bool = False
    name: str = ""
    priority: int = 0
    submitted_at: datetime | None = Field(
        None, description="For its aged priority; else started_at"
    )
    started_at: datetime | None = None
    expected_end: datetime | None = Field(
        None, description="Else started_at + the snapshot's default duration"
    )
    upper_end: datetime | None = Field(
        None,
        description="When it may end at worst by the history of such estimates: a tariff pause "
        "is proposed only if it can resume and still make its deadline reckoned on this too",
    )
    pausable: bool = False
    cost_class: CostClass = "urgent"
    gpu_memory_gb: float | None = None
    gpu_memory_cap_gb: float | None = None
    deadline: datetime | None = Field(
        None, description="A tariff pause is proposed only if it can resume and still make this"
    )
    attained_gpu_s: float = Field(
        0.0, ge=0, description="GPU-seconds run before this attempt (`order: las`)"
    )


CostBand = Literal["cheapest", "not_peak"]
Order = Literal["priority", "sjf_aging", "las", "srpt"]
HostFit = Literal["first", "best"]


class Snapshot(BaseModel):
    """Everything placement may look at."""

    now: datetime
    pending: list[PendingJob]
    running: list[RunningJob] = Field(default_factory=list)
    recovering: list[PendingJob] = Field(
        default_factory=list,
        description="Failed jobs that recovery may queue again, within their retry backoff: "
        "never started from here, but they keep their place in queue order for a CPU slot",
    )
    gpus: list[GpuSlot] = Field(default_factory=list)
    cpu_slots: int = 1
    tariff: Tariff | None = None
    cost_threshold: float | CostBand | None = Field(
        None,
        description="Price per kWh at or below which cost_sensitive jobs run, or a band: "
        "'cheapest' (the tariff's lowest price) or 'not_peak' (any price below its highest); "
        "None: 'cheapest'",
    )
    hold_slack_s: float = Field(
        3600.0,
        ge=0,
        description="A cost_sensitive job is held only if the cheap period it waits for opens "
        "at least this long before the latest start that meets its deadline; a running job "
        "with a deadline is moved (`migrate_after_s`) only if its estimate ends this long "
        "before it",
    )
    hold_min_gpu_h: float = Field(
        0.0,
        ge=0,
        description="Only cost_sensitive jobs expected to use at least this many GPU-hours are "
        "held for cheap hours (a CPU job counts as one GPU); smaller ones start at once: they "
        "are most of the jobs and little of the energy",
    )
    hold_max_wait_s: float | None = Field(
        None,
        ge=0,
        description="A cost_sensitive job is held or paused for a cheap period only if its "
        "wait in all (time not running since submission) stays within this until the period "
        "opens; None: no limit but its deadline. Bounds the tail in hours where estimates "
        "leave a deadline days of slack",
    )
    deadline_boost: float = Field(
        1000.0,
        ge=0,
        description="Priority points for a cost_sensitive job that had more than `hold_slack_s` "
        "to spare at submission (so a hold could have delayed it) and has no more now: a job "
        "released from a hold near its deadline goes first",
    )
    tariff_horizon_h: float = Field(
        168.0, gt=0, description="How far ahead to look for cheap periods"
    )
    long_job_start_grace_s: float = Field(
        1800.0,
        ge=0,
        description="A job longer than every cheap period starts this soon after one opens",
    )
    aging_per_hour: float = Field(1.0, ge=0, description="Priority points gained per hour waited")
    order: Order = Field(
        "priority",
        description="priority: aged priority only; sjf_aging: also minus `sjf_per_doubling` "
        "points per doubling of the expected duration above a minute (shortest first, aging "
        "so long jobs still run); las: also minus `las_points` per `las_thresholds_gpu_h` "
        "threshold of GPU time already run (Tiresias' least attained service; with "
        "`preempt_margin` it preempts at checkpoints); srpt: also minus `sjf_per_doubling` "
        "points per doubling of the estimated remaining GPU time (GPUs x expected seconds) "
        "above a GPU-minute, for running jobs too (shortest remaining first; with "
        "`preempt_margin` a job preempts one whose remainder is that many doublings longer)",
    )
    sjf_per_doubling: float = Field(
        1.0,
        ge=0,
        description="sjf_aging, srpt: priority points lost per doubling of the estimate",
    )
    promote_after_h: float | None = Field(
        None,
        gt=0,
        description="The starvation guard: a job that has waited this long in all (queued or "
        "paused) goes ahead of every job that has not, oldest first, and once running is "
        "never preempted; None: no guard (aging alone bounds the wait)",
    )
    las_thresholds_gpu_h: list[float] = Field(
        default_factory=lambda: [1.0, 10.0],
        description="las: attained GPU-hours at which a job drops one level",
    )
    las_points: float = Field(4.0, ge=0, description="las: priority points lost per level")
    host_fit: HostFit = Field(
        "first",
        description="first: the first host (by name) that fits; best: the host left with the "
        "fewest free GPUs, keeping whole hosts for wide jobs",
    )
    preempt_margin: int | None = Field(None, ge=1, description="None: never propose preemption")
    preempt_max_per_call: int = Field(
        4, ge=0, description="Pending jobs that may preempt per call (no preemption storms)"
    )
    preempt_min_left_s: float = Field(
        0.0,
        ge=0,
        description="A running job expected to end within this long is never paused for "
        "another (preemption or migration): its GPUs free up soon anyway, and a pause would "
        "redo its work since its checkpoint for little gain",
    )
    preempt_wider: bool = Field(
        True,
        description="A job may pause one on more GPUs than it asks for. A pause redoes the "
        "victim's work since its checkpoint on every GPU it held, so off saves that energy "
        "(measured in docs/benchmarks.md) at some delay",
    )
    migrate_after_s: float | None = Field(
        None,
        ge=0,
        description="A job that would wait at least this long while enough GPUs stand free, "
        "but on no one host, pauses pausable jobs on one host at a checkpoint so that it can "
        "start there, where they can start again at once on the free GPUs of other hosts "
        "(Gandiva's migration; with best fit, which puts them there, and only where "
        "`preempt_margin` is set: it leaves alone the jobs preemption would); None: never",
    )
    default_duration_s: float = Field(
        3600.0, gt=0, description="For jobs with no expected duration"
    )
    display_tz: str | None = Field(
        None, description="Zone of times in reasons; default the tariff's, else UTC"
    )
    cannot_span: str | None = Field(
        None,
        description="Why no run can span hosts here ('executor local cannot span hosts'): a job "
        "wider than every host then waits with this reason; None: it runs as a gang",
    )
    # From load_snapshot: where each waiting job that is the very object of the last load sat
    # in that load's list, -1 for the others. A hint that spares placement's columns looking up
    # 100,000 objects one by one (`PendingColumns.rows_of`, which checks it job by job).
    _kept_from: np.ndarray | None = PrivateAttr(None)


class Start(BaseModel):
    """Start this job now on these GPUs ([] = a CPU slot)."""

    job_id: int
    gpus: list[int]
    expected_end: datetime | None = None
    note: str = Field("", description="Why now, when it is not simply its turn (backfill, tariff)")


class Reservation(BaseModel):
    """The GPUs the blocked head job will get, and when they are expected free."""

    job_id: int
    at: datetime
    gpus: list[int]


class Preempt(BaseModel):
    """Pause `victim_job_id` at a checkpoint (modify, resumed later) so `for_job_id` can start."""

    victim_job_id: int
    for_job_id: int
    reason: str


class Pause(BaseModel):
    """Pause a running cost_sensitive job at a checkpoint: its cheap period is over."""

    job_id: int
    reason: str
    resume_at: datetime | None = None


class Decision(BaseModel):
    """What `place` decided; every pending job is in `starts` or `holds`, never both."""

    starts: list[Start] = Field(default_factory=list)
    holds: dict[int, str] = Field(default_factory=dict)
    preemptions: list[Preempt] = Field(default_factory=list)
    pauses: list[Pause] = Field(default_factory=list)
    reservation: Reservation | None = None
    # clauses that end many reasons and move from call to call, by name: "reservation", what
    # every job that would run past the reservation is told (most of a deep queue); "cpu", who
    # holds the CPU slots (every waiting CPU job's). The store keeps each once per loop, not on
    # each job's row (runtime/store/job_holds.py).
    shared_tails: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------- formatting
class _Clock:
    """Times in reasons: HH:MM in the display zone, with the weekday or date when not today."""

    def __init__(self, now: datetime, tz: ZoneInfo):
        self.tz = tz
        self.today = now.replace(tzinfo=UTC).astimezone(tz).date()
        self._seen: dict[datetime, str] = {}

    def __call__(self, t: datetime) -> str:
        got = self._seen.get(t)
        if got is None:
            got = self._seen[t] = self._format(t)
        return got

    def _format(self, t: datetime) -> str:
        loc = t.replace(tzinfo=UTC).astimezone(self.tz)
        days = (loc.date() - self.today).days
        if days == 0:
            return f"{loc:%H:%M}"
        if 0 < days < 7:
            return f"{DAYS[loc.weekday()].capitalize()} {loc:%H:%M}"
        return f"{loc:%Y-%m-%d %H:%M}"


def _hours(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"


def _gpu_list(ids: list[int]) -> str:
    return ("GPU " if len(ids) == 1 else "GPUs ") + ",".join(str(i) for i in sorted(ids))


def _gb(x: float) -> str:
    return f"{x:g}"


def free_mib(g: GpuSlot) -> float:
    if g.memory_total_mib is None:
        return 0.0
    return g.memory_total_mib - (g.memory_used_mib or 0.0)


# ---------------------------------------------------------------------------------- GPU state
class _Gpu:
    __slots__ = ("idx", "host", "total", "free", "excl", "caps", "jobs", "last", "holders")

    def __init__(self, g: GpuSlot):
        f = g.__dict__  # the field values: a 4,096-GPU cluster is built at every call
        self.idx, self.host = f["index"], f["host"]
        total = f["memory_total_mib"]
        self.total = total or 0.0
        self.free = 0.0 if total is None else max(0.0, total - (f["memory_used_mib"] or 0.0))
        self.excl = False  # an exclusive job holds it
        self.caps = 0.0  # memory caps (MiB) of the sharing jobs on it
        self.jobs: list[tuple[datetime, float]] = []  # (expected end, cap MiB) of jobs on it
        # the latest of those ends, kept as they are added (a reservation asks it of every GPU)
        self.last: datetime | None = None
        self.holders: list[tuple[int, str]] = []  # (id, name) of the jobs on it: hold reasons


_BY_INDEX = operator.attrgetter("idx")
_HOST = operator.attrgetter("host")


class _Request:
    """What a GPU job asks of each GPU: `need` MiB free, alone or sharing with a cap; a gang
    (`gang`) takes whole GPUs across hosts and shares none: its ranks must not wait on others."""

    __slots__ = ("k", "need", "shared", "cap", "gang", "key")

    def __init__(
        self, k: int, mem_gb: float | None, share: bool, cap_gb: float | None, gang: bool = False
    ):
        cap = cap_gb if cap_gb is not None else mem_gb
        self.k = k
        self.gang = gang
        # sharing without any cap is not safe
        self.shared = bool(share and cap is not None and not gang)
        self.cap = cap * 1024 if self.shared and cap is not None else 0.0
        self.need = max((mem_gb or 0.0) * 1024, self.cap)
        self.key = (k, self.need, self.shared, gang)


class _HolderState:
    """`_Cluster.holders` for one class of GPUs: its holders in order, as of `seen` log entries."""

    __slots__ = ("seen", "floor", "entries", "keys")

    def __init__(
        self,
        seen: int,
        floor: float,
        entries: list[tuple[tuple[int, int], int, str]],
        keys: dict[int, tuple[tuple[int, int], str]],
    ):
        self.seen, self.floor, self.entries, self.keys = seen, floor, entries, keys


class _Cluster:
    """The GPUs as a call sees them: who is on each, what is free, per host. Expected ends are
    kept as given (a job that outran its estimate comes with the end `outrun_end` gives it)
    and read as now at the earliest (`ready_at`)."""

    def __init__(
        self,
        snap: Snapshot,
        ends_of: dict[int, datetime],
        fast: bool = True,
        runs: list[tuple[int, _RunKey]] | None = None,
    ):
        """`runs`: `_run_keys(snap, ends_of)`, when the caller has it already."""
        self.gpus: dict[int, _Gpu] = {}
        self.quarantined = 0  # quarantined and not expected back: left out
        for slot in snap.gpus:
            if slot.verdict not in QUARANTINED:
                self.gpus[slot.index] = _Gpu(slot)
            elif slot.back_by is None:
                self.quarantined += 1
            else:  # expected back: a GPU nobody may take, busy until then
                back = self.gpus[slot.index] = _Gpu(slot)
                self._occupy(back, False, 0.0, slot.back_by)
        gpus = self.gpus
        for jid, (ids, shared, cap, end, name) in runs or _run_keys(snap, ends_of):
            holder = (jid, name)
            for i in ids:
                g = gpus.get(i)
                if g is None:
                    continue
                self._occupy(g, shared, cap, end)
                g.holders.append(holder)
        # per host, GPUs nobody uses and GPUs only sharing jobs use, by index; hosts in the
        # order of their first such GPU
        free_excl: dict[str, list[int]] = {}
        sharing: dict[str, list[int]] = {}
        per_host: dict[str, int] = {}
        by_index = sorted(gpus.values(), key=_BY_INDEX)
        for g in by_index:
            host = g.host
            if not g.jobs:
                free_excl.setdefault(host, []).append(g.idx)
            elif not g.excl:
                sharing.setdefault(host, []).append(g.idx)
            per_host[host] = per_host.get(host, 0) + 1
        self.hosts = sorted(per_host)  # a fixed order: set order would vary between processes
        self.most_per_host = max(per_host.values(), default=0)
        self.per_host = per_host  # healthy GPUs of each host
        self.rank = {h: r for r, h in enumerate(self.hosts)}
        totals = {g.total for g in by_index}
        self.largest_mib = max(totals, default=0.0)
        self.in_order = sorted(by_index, key=_HOST)  # by host, then index (a stable sort)
        # The GPU sizes, largest first: the GPUs a request could hold once free are those of the
        # sizes at or above its need, so `holders` is computed once per such prefix, not per need.
        self.sizes = sorted(totals, reverse=True)
        self.pos = {g.idx: p for p, g in enumerate(self.in_order)}
        self.begin(snap, fast, free_excl, sharing)

    def begin(
        self,
        snap: Snapshot,
        fast: bool,
        free_excl: dict[str, list[int]],
        sharing: dict[str, list[int]],
    ) -> None:
        """The state of one call, on GPUs as the snapshot has them before anything starts (a
        kept cluster starts each call here: `_KeptCluster`). `free_excl` and `sharing` become
        the call's own, to take GPUs from."""
        self.now = snap.now
        self.fast = fast  # skip full hosts, keep holders per GPU class (`place`'s `_fast`)
        self.best_fit = snap.host_fit == "best"
        self.free_excl = free_excl  # per host, GPUs nobody uses, by index
        self.sharing = sharing  # per host, GPUs only sharing jobs use
        self.version = 0  # bumped by every take and claim: `holders` is computed once between
        self._holders: dict[float, tuple[int, list[tuple[int, str]]]] = {}
        # Hosts with a GPU some request could still take (free, or shared only), in host order.
        # Within a call GPUs only leave both pools, so a host that left never comes back, and
        # `pick` looks at these alone: at 4,096 GPUs nearly every host is full.
        self.open_hosts = [h for h in self.hosts if h in free_excl or h in sharing]
        self.log: list[tuple[int, int, tuple[int, str]]] = []  # (GPU, index, job) put on since
        self._classes: dict[int, _HolderState] = {}
        # what each GPU the call changes was before it (`_KeptCluster` puts it back); None: the
        # cluster is the call's alone
        self.undo: dict[int, tuple[bool, float, list, datetime | None, list]] | None = None

    def _keep(self, g: _Gpu) -> None:
        """Note what `g` is before the call changes it, once, if the cluster is kept."""
        if self.undo is not None and g.idx not in self.undo:
            self.undo[g.idx] = (g.excl, g.caps, list(g.jobs), g.last, list(g.holders))

    @staticmethod
    def _occupy(g: _Gpu, shared: bool, cap: float, end: datetime) -> None:
        if shared:
            g.caps += cap
        else:
            g.excl = True
        g.jobs.append((end, cap if shared else 0.0))
        if g.last is None or end > g.last:
            g.last = end

    def impossible(self, req: _Request) -> str | None:
        """Why the request can never be met on these healthy GPUs, or None."""
        q = f" ({self.quarantined} quarantined)" if self.quarantined else ""
        if req.gang and req.k > len(self.gpus):
            return (
                f"needs {req.k} GPU(s); {len(self.gpus)} healthy across {len(self.hosts)} hosts{q}"
            )
        if not req.gang and req.k > self.most_per_host:
            if len(self.hosts) <= 1:
                return f"needs {req.k} GPU(s); {self.most_per_host} healthy{q}"
            return (
                f"needs {req.k} GPU(s) on one host; at most {self.most_per_host} healthy on "
                f"any host{q}"
            )
        if req.need > self.largest_mib and req.need > 0:
            return (
                f"needs {_gb(req.need / 1024)} GiB per GPU; the largest healthy GPU has "
                f"{_gb(self.largest_mib / 1024)} GiB"
            )
        return None

    def pick(self, req: _Request, avoid: set[int], allow_avoid: bool) -> list[int] | None:
        """k GPUs on one host that fit now: those not in `avoid` first, then (if allowed) those in
        it; a sharing job prefers GPUs already shared, keeping whole GPUs for exclusive jobs. A
        gang's GPUs span hosts (`_pick_gang`)."""
        if req.gang:
            return self._pick_gang(req, avoid, allow_avoid)
        if self.best_fit:
            return self._pick_best(req, avoid, allow_avoid)
        k, need = req.k, req.need
        free_excl, sharing = self.free_excl, self.sharing
        for host in self.open_hosts if self.fast else self.hosts:
            if self.fast and (
                len(free_excl.get(host, ())) + (len(sharing.get(host, ())) if req.shared else 0) < k
            ):
                continue  # too few GPUs left on it for this request, whatever their memory
            first: list[int] = []
            later: list[int] = []
            pools = (
                (self.sharing.get(host, ()), self.free_excl.get(host, ()))
                if req.shared
                else (self.free_excl.get(host, ()),)
            )
            for pool in pools:
                for i in pool:
                    g = self.gpus[i]
                    if g.free - g.caps < need:
                        continue
                    if i in avoid:
                        if allow_avoid and len(later) < k:
                            later.append(i)
                    else:
                        first.append(i)
                        if len(first) == k:
                            return first
            if allow_avoid and len(first) + len(later) >= k:
                return first + later[: k - len(first)]
        return None

    def _pick_best(self, req: _Request, avoid: set[int], allow_avoid: bool) -> list[int] | None:
        """Best fit: of the hosts that can take the job, the one with the fewest GPUs that fit it
        (a sharing job: the fullest shared GPUs first), so free hosts stay whole for wide jobs.
        GPUs outside `avoid` are preferred over any host's GPUs inside it."""
        k, need = req.k, req.need
        best: tuple[tuple[int, int, int], list[int]] | None = None
        free_excl, sharing = self.free_excl, self.sharing
        for host in self.open_hosts if self.fast else self.hosts:
            if self.fast and (
                len(free_excl.get(host, ())) + (len(sharing.get(host, ())) if req.shared else 0) < k
            ):
                continue  # too few GPUs left on it for this request: it could not be counted
            rank = self.rank[host]
            pools = (
                (self.sharing.get(host, ()), self.free_excl.get(host, ()))
                if req.shared
                else (self.free_excl.get(host, ()),)
            )
            first: list[tuple[float, int]] = []
            later: list[tuple[float, int]] = []
            for p, pool in enumerate(pools):
                for i in pool:
                    g = self.gpus[i]
                    room = g.free - g.caps
                    if room < need:
                        continue
                    # sharing: pool 0 (already shared) before pool 1 (whole GPUs), least room first
                    (later if i in avoid else first).append((p * 1e18 + room, i))
            n = len(first) + (len(later) if allow_avoid else 0)
            if n < k:
                continue
            mixed = 1 if len(first) < k else 0
            score = (mixed, n, rank)
            if best is None or score < best[0]:
                first.sort()
                later.sort()
                best = (score, [i for _, i in (first + later)[:k]])
                if score[:2] == (0, k):
                    break  # an exact fit outside `avoid`: nothing beats it
        return None if best is None else best[1]

    def _pick_gang(self, req: _Request, avoid: set[int], allow_avoid: bool) -> list[int] | None:
        """k whole free GPUs across hosts, or None: never part of them. Outside `avoid` if that is
        enough, else (if allowed) with GPUs in it, those outside first on each host."""
        first: dict[str, list[int]] = {}
        later: dict[str, list[int]] = {}
        for host, pool in self.free_excl.items():
            for i in pool:
                if self.gpus[i].free < req.need:
                    continue
                (later if i in avoid else first).setdefault(host, []).append(i)
        got = self.gang_choice(first, req.k)
        if got is None and allow_avoid and later:
            both = {h: first.get(h, []) + later.get(h, []) for h in first.keys() | later.keys()}
            got = self.gang_choice(both, req.k)
        return got

    def gang_choice(self, usable: dict[str, list[int]], k: int) -> list[int] | None:
        """Of each host's usable GPUs (in the order to take them), k on the fewest hosts: the
        hosts with the most usable GPUs whole while no one host holds the rest, then the rest
        on the host that fits it with the fewest left over (stranded). None: fewer than k."""
        if sum(len(v) for v in usable.values()) < k:
            return None
        rank = self.rank
        left = sorted((h for h in usable if usable[h]), key=lambda h: (-len(usable[h]), rank[h]))
        out: list[int] = []
        while True:
            need = k - len(out)
            fits = [h for h in left if len(usable[h]) >= need]
            if fits:
                host = min(fits, key=lambda h: (len(usable[h]), rank[h]))
                return out + usable[host][:need]
            out += usable[left.pop(0)]  # the largest, whole

    def hosts_needed(self, k: int) -> int:
        """The fewest hosts whose healthy GPUs add up to k (0: not even all of them)."""
        n = got = 0
        for size in sorted(self.per_host.values(), reverse=True):
            if got >= k:
                break
            got, n = got + size, n + 1
        return n if got >= k else 0

    def take(self, req: _Request, ids: list[int], end: datetime, job: tuple[int, str]) -> None:
        self.version += 1
        for i in ids:
            g = self.gpus[i]
            self._keep(g)
            was_free = not g.jobs
            self._occupy(g, req.shared, req.cap, end)
            self.log.append((i, len(g.holders), job))
            g.holders.append(job)
            if was_free:
                self.free_excl[g.host].remove(i)
                if req.shared:
                    self.sharing.setdefault(g.host, []).append(i)
                    self.sharing[g.host].sort()
                else:
                    self._maybe_close(g.host)

    def holders(self, req: _Request) -> tuple[list[tuple[int, str]], int]:
        """The jobs on the healthy GPUs that could hold `req` once free (who a waiting job waits
        for): the first `_HELD_BY_NAMED` in host and GPU order, and how many in all."""
        if self.fast:
            return self._class_holders(req)
        got = self._holders.get(req.need)
        if got is not None and got[0] == self.version:
            return got[1][:_HELD_BY_NAMED], len(got[1])
        seen: dict[int, str] = {}
        for g in self.in_order:
            if g.holders and g.total >= req.need:
                for jid, name in g.holders:
                    if jid not in seen:
                        seen[jid] = name
        out = list(seen.items())
        self._holders[req.need] = (self.version, out)
        return out[:_HELD_BY_NAMED], len(out)

    def _class_holders(self, req: _Request) -> tuple[list[tuple[int, str]], int]:
        """`holders`, kept per class of GPUs (those of a size at or above the need) and brought
        up to date from the log of jobs put on GPUs since, rather than recounted over every GPU
        for every new hold reason."""
        n = sum(1 for t in self.sizes if t >= req.need)
        state = self._classes.get(n)
        if state is None:
            floor = self.sizes[n - 1] if n else math.inf
            keys: dict[int, tuple[tuple[int, int], str]] = {}
            for p, g in enumerate(self.in_order):
                if g.holders and g.total >= floor:
                    for h, (jid, name) in enumerate(g.holders):
                        if jid not in keys:
                            keys[jid] = ((p, h), name)
            entries = sorted((key, jid, name) for jid, (key, name) in keys.items())
            state = self._classes[n] = _HolderState(len(self.log), floor, entries, keys)
        elif state.seen < len(self.log):
            for gi, h, (jid, name) in self.log[state.seen :]:
                g = self.gpus[gi]
                if g.total < state.floor:
                    continue
                key = (self.pos[gi], h)
                old = state.keys.get(jid)
                if old is not None:
                    if old[0] < key:
                        continue  # seen earlier in the order: its first place stands
                    state.entries.remove((old[0], jid, old[1]))
                state.keys[jid] = (key, name)
                bisect.insort(state.entries, (key, jid, name))
            state.seen = len(self.log)
        return [(jid, name) for _, jid, name in state.entries[:_HELD_BY_NAMED]], len(state.entries)

    def _maybe_close(self, host: str) -> None:
        """Drop a host from `open_hosts` once neither pool has a GPU left on it."""
        if not self.free_excl.get(host) and not self.sharing.get(host):
            self.open_hosts.remove(host)

    def claim(self, ids: list[int], holder: tuple[int, str] | None = None) -> None:
        """GPUs promised to a preempting job, or kept for one in its retry backoff (`holder`):
        nobody else may take the free ones among them."""
        self.version += 1
        for i in ids:
            g = self.gpus[i]
            self._keep(g)
            g.excl = True
            if not g.jobs:
                g.jobs.append((_INF, 0.0))
                g.last = _INF
                self.free_excl[g.host].remove(i)
                self._maybe_close(g.host)
            elif i in self.sharing.get(g.host, ()):
                self.sharing[g.host].remove(i)
                self._maybe_close(g.host)
            if holder is not None:
                self.log.append((i, len(g.holders), holder))
                g.holders.append(holder)

    def ready_at(self, g: _Gpu, req: _Request) -> datetime:
        """Earliest expected time `g` could take `req`, if jobs end when expected. Memory freed by
        an ending job is taken to be that job's (so a GPU whose jobs all ended has all of it)."""
        now = self.now
        if not g.jobs:
            return now if g.free >= req.need else _INF
        if g.total < req.need:
            return _INF
        last = g.last or _INF
        if g.excl or not req.shared:
            return last if last > now else now
        avail = g.free - g.caps
        if avail >= req.need:
            return now
        for end, cap in sorted(g.jobs):
            avail += cap
            if avail >= req.need:
                return end if end > now else now
        return last if last > now else now

    def reserve(self, req: _Request, claimed: set[int]) -> tuple[datetime, list[int]] | None:
        """The earliest time the request fits if jobs end when expected, and the GPUs it would
        take then: on one host, or, for a gang, the GPUs free by then across hosts chosen as
        `gang_choice` chooses (so backfill may use every other GPU)."""
        if req.gang:
            return self._reserve_gang(req, claimed)
        best: tuple[datetime, list[int]] | None = None
        by_host: dict[str, list[tuple[datetime, int]]] = {}
        now, need, whole = self.now, req.need, not req.shared
        for g in self.gpus.values():
            if g.idx in claimed:
                continue
            last = g.last
            if last is not None and (whole or g.excl):  # `ready_at` for a busy GPU, inline:
                if g.total < need:  # most GPUs are busy, and this runs over every GPU
                    continue
                t = last if last > now else now
            else:
                t = self.ready_at(g, req)
            if t is not _INF:
                by_host.setdefault(g.host, []).append((t, g.idx))
        for times in by_host.values():
            if len(times) < req.k:
                continue
            times.sort()
            at = times[req.k - 1][0]
            if best is None or at < best[0]:
                best = (max(at, self.now), [i for _, i in times[: req.k]])
        return best

    def _reserve_gang(self, req: _Request, claimed: set[int]) -> tuple[datetime, list[int]] | None:
        times = []
        for g in self.in_order:
            if g.idx in claimed:
                continue
            t = self.ready_at(g, req)
            if t is not _INF:
                times.append((t, g.host, g.idx))
        if len(times) < req.k:
            return None
        at = sorted(t for t, _, _ in times)[req.k - 1]
        usable: dict[str, list[int]] = {}
        for t, host, idx in times:  # by host and index: the GPUs ready by then
            if t <= at:
                usable.setdefault(host, []).append(idx)
        ids = self.gang_choice(usable, req.k)
        assert ids is not None  # at least k GPUs are ready by `at`
        return max(at, self.now), ids


def _first_pooled(host_pool: tuple[str, list[int]]) -> int:
    return host_pool[1][0]


_RunKey: TypeAlias = tuple[tuple[int, ...], bool, float, datetime, str]


def _run_keys(snap: Snapshot, ends_of: dict[int, datetime]) -> list[tuple[int, _RunKey]]:
    """What each running job puts on its GPUs, in the snapshot's order: its id, and its GPUs,
    sharing, cap (MiB), expected end and name. A cluster is built from these, and a kept one
    compares them between calls."""
    keys: list[tuple[int, _RunKey]] = []
    for r in snap.running:
        f = r.__dict__  # the field values: thousands of running jobs at every call
        cap_gb = f["gpu_memory_cap_gb"]
        if cap_gb is None:
            cap_gb = f["gpu_memory_gb"]
        shared = f["share_gpu"] and cap_gb is not None
        keys.append(
            (
                f["id"],
                (tuple(f["gpus"]), shared, (cap_gb or 0.0) * 1024, ends_of[f["id"]], f["name"]),
            )
        )
    return keys


class _KeptCluster:
    """The cluster of the last call as it stood before the call took any GPU, and what it was
    built from. The next call puts back the GPUs it changed, then rebuilds only the GPUs whose
    running jobs or free memory moved: at 4,096 GPUs and 1,500 running jobs a build costs
    ≈ 8 ms, a call where a few jobs started and ended ≈ 2.5 ms.

    Anything else (a GPU added, moved, resized, quarantined or released; the running jobs in
    another order; more than `most` of the GPUs changed) builds it afresh. The result is the
    cluster a fresh build would give, field for field (tests/test_placement_kept_cluster.py)."""

    def __init__(self, most: float = 0.25, busy: float = 0.05, rest: int = 8) -> None:
        self.most = most  # the share of GPUs changed above which it is built afresh
        # Past `busy` (a share of the GPUs changed or moved), a diff costs about what it saves
        # (measured: 4,096 GPUs, 1,500 running jobs, 8 % of GPUs changed a tick: ≈ 7 ms either
        # way): the next `rest` calls build afresh without keeping anything, then it tries again.
        self.busy, self.rest, self.resting = busy, rest, 0
        self.cluster: _Cluster | None = None
        # each GpuSlot's (index, host, total, verdict, whether it is expected back; then what
        # may change without a build afresh: memory_used_mib, back_by)
        self.slots: list[tuple] = []
        self.where: dict[int, int] = {}  # GPU index -> its slot's place in the list
        self.jobs: dict[int, _RunKey] = {}  # running jobs, by id, in the snapshot's order
        # the pools as the call found them (the call takes GPUs from copies)
        self.free_excl: dict[str, list[int]] = {}
        self.sharing: dict[str, list[int]] = {}

    def get(self, snap: Snapshot, ends_of: dict[int, datetime]) -> _Cluster:
        cluster = self.cluster
        if cluster is not None and cluster.undo:
            for i, (excl, caps, on, last, holders) in cluster.undo.items():
                g = cluster.gpus[i]
                g.excl, g.caps, g.jobs, g.last, g.holders = excl, caps, on, last, holders
            cluster.undo = {}
        if self.resting:
            self.resting -= 1
            self.cluster = None
            return _Cluster(snap, ends_of)  # the call's alone
        slots = [
            (
                f["index"],
                f["host"],
                f["memory_total_mib"],
                f["verdict"],
                f["back_by"] is None,
                f["memory_used_mib"],
                f["back_by"],
            )
            for f in (s.__dict__ for s in snap.gpus)
        ]
        runs = _run_keys(snap, ends_of)
        jobs = dict(runs)
        moved: list[tuple[int, _RunKey]] = []  # exclusive jobs whose expected end alone moved
        dirty = (
            None
            if cluster is None or not self.where or len(jobs) != len(runs)
            else self._dirty(slots, jobs, moved)
        )
        self.cluster = None  # until it is whole again: an error half way builds afresh next time
        if cluster is None or dirty is None or len(dirty) > self.most * len(cluster.gpus):
            cluster = _Cluster(snap, ends_of, runs=runs)
            where = {slot[0]: k for k, slot in enumerate(slots)}
            self.where = where if len(where) == len(slots) else {}  # {}: an index twice
            self.free_excl = {h: list(v) for h, v in cluster.free_excl.items()}
            self.sharing = {h: list(v) for h, v in cluster.sharing.items()}
        else:
            if len(dirty) + len(moved) > self.busy * len(cluster.gpus):
                self.resting = self.rest
            self._rebuild(cluster, snap, dirty, jobs, moved)
            cluster.begin(
                snap,
                True,
                {h: list(v) for h, v in self.free_excl.items()},
                {h: list(v) for h, v in self.sharing.items()},
            )
        self.slots, self.jobs = slots, jobs
        cluster.undo = {}
        self.cluster = cluster
        return cluster

    def _dirty(
        self, slots: list[tuple], jobs: dict[int, _RunKey], moved: list[tuple[int, _RunKey]]
    ) -> set[int] | None:
        """The GPUs whose state moved since the kept build (None: build afresh); exclusive jobs
        whose expected end alone moved (a learned estimate does, as runs of its name end) go to
        `moved` instead."""
        dirty: set[int] = set()
        if slots != self.slots:
            if len(slots) != len(self.slots):
                return None
            for now, was in zip(slots, self.slots, strict=True):
                if now != was:
                    if now[:5] != was[:5]:
                        return None  # the cluster's shape changed
                    dirty.add(now[0])
        old = self.jobs
        changed = [jid for jid, key in jobs.items() if old.get(jid) != key]
        gone = old.keys() - jobs.keys()
        if changed or gone:
            skip = gone.union(changed)
            if [jid for jid in old if jid not in skip] != [jid for jid in jobs if jid not in skip]:
                return None  # the jobs that stayed come in another order: so would each GPU's
        elif list(old) != list(jobs):
            return None
        for jid in changed:
            key = jobs[jid]
            before = old.get(jid)
            if before is not None and not key[1] and before[:3] == key[:3] and before[4] == key[4]:
                moved.append((jid, key))
                continue
            dirty.update(key[0])
            if before is not None:
                dirty.update(before[0])
        for jid in gone:
            dirty.update(old[jid][0])
        return dirty

    def _rebuild(
        self,
        cluster: _Cluster,
        snap: Snapshot,
        dirty: set[int],
        jobs: dict[int, _RunKey],
        moved: list[tuple[int, _RunKey]],
    ) -> None:
        """Each dirty GPU built again, in place, from its slot and its running jobs in the
        snapshot's order, and put in the pool it now belongs to; a GPU that a moved job holds
        alone takes the new end, one it shares is built again."""
        gpus, where, slots = cluster.gpus, self.where, snap.gpus
        patch: list[tuple[_Gpu, datetime]] = []
        for _, (ids, _, _, end, _) in moved:
            for i in ids:
                g = gpus.get(i)
                if g is None or i in dirty:
                    continue
                if len(g.jobs) == 1:
                    patch.append((g, end))
                else:
                    dirty.add(i)
        for g, end in patch:
            if g.idx not in dirty:  # (a GPU two moved jobs list is built again)
                g.jobs[0] = (end, 0.0)
                g.last = end
        redo: dict[int, _Gpu] = {}
        for i in dirty:
            g = gpus.get(i)
            if g is None:
                continue  # quarantined, or no such GPU
            slot = slots[where[i]]
            _Gpu.__init__(g, slot)
            redo[g.idx] = g
            if slot.verdict in QUARANTINED:  # expected back (the others are left out)
                assert slot.back_by is not None
                cluster._occupy(g, False, 0.0, slot.back_by)
        if not redo:
            return
        for jid, (ids, shared, cap, end, name) in jobs.items():
            for i in ids:
                g = redo.get(i)
                if g is not None:
                    cluster._occupy(g, shared, cap, end)
                    g.holders.append((jid, name))
        for i, g in redo.items():
            for pools in (self.free_excl, self.sharing):
                pool = pools.get(g.host)
                if pool is not None and i in pool:
                    pool.remove(i)
                    if not pool:
                        del pools[g.host]
            if not g.jobs:
                bisect.insort(self.free_excl.setdefault(g.host, []), i)
            elif not g.excl:
                bisect.insort(self.sharing.setdefault(g.host, []), i)
        # hosts in the order of their first pooled GPU, as a fresh build adds them
        self.free_excl = dict(sorted(self.free_excl.items(), key=_first_pooled))
        self.sharing = dict(sorted(self.sharing.items(), key=_first_pooled))


def _no_slack_left(
    deadline: datetime,
    now: datetime,
    submitted: datetime,
    dur: float,
    upper: float | None,
    slack: float,
) -> bool:
    """A job a hold could have delayed (it had more than the slack to spare at submission) and
    that has no more now, reckoned on what it may take at worst (its estimates' history)."""
    need = max(dur, upper or 0.0)
    return (
        (deadline - now).total_seconds() - need
        <= slack
        < (deadline - submitted).total_seconds() - need
    )


# ---------------------------------------------------------------------------------- tariff gate
class _TariffGate:
    """Whether a cost_sensitive job may start now, and which running ones must pause. A job with
    a deadline is held only for a cheap period that opens in time for it to finish by the
    deadline on its estimate; otherwise it starts now at whatever price."""

    def __init__(self, snap: Snapshot, tariff: Tariff, clock: _Clock):
        self.now, self.clock = snap.now, clock
        self.tariff = tariff
        self.grace = snap.long_job_start_grace_s
        self.slack = snap.hold_slack_s
        self.threshold = band_price(tariff, snap.cost_threshold)
        self.horizon_h = snap.tariff_horizon_h
        self.currency = tariff.currency
        self.periods = tariff.cheap_periods(
            snap.now, self.threshold, timedelta(hours=snap.tariff_horizon_h)
        )
        ps = self.periods
        self.current: Period | None = ps[0] if ps and ps[0].start <= snap.now else None
        self.future = [p for p in ps if p.start > snap.now]
        self.longest = max((p.seconds for p in ps), default=0.0)
        self.left = (self.current.end - snap.now).total_seconds() if self.current else 0.0
        self.since_open = (snap.now - self.current.start).total_seconds() if self.current else 0.0
        self.max_wait = snap.hold_max_wait_s
        self.min_gpu_s = snap.hold_min_gpu_h * 3600.0
        self._memo: dict[float, str | None] = {}
        # when the hold `hold` last gave ends (the cheap period it waits for; the horizon's end
        # where none is known): what `hold_max_wait_s` is checked against
        self.until = snap.now

    def waits_too_long(self, waited: float) -> bool:
        """Whether a hold (or pause) until `self.until` would take a job that has waited
        `waited` seconds so far past `hold_max_wait_s`."""
        return (
            self.max_wait is not None
            and waited + (self.until - self.now).total_seconds() > self.max_wait
        )

    def hold(self, dur: float, deadline: datetime | None, upper: float | None = None) -> str | None:
        """None when the job may start now; else why it waits. With a deadline it waits only
        for a cheap period that opens in time to finish by the deadline on its estimate — or on
        `upper`, what such estimates have come to at worst, when that is longer: the first that
        fits it whole, else (when no cheap period is under way) the next to open, which it runs
        past, pausing at its end only if it can resume and still make it."""
        if self.current is not None and dur <= self.left:
            return None
        if dur in self._memo:
            why = self._memo[dur]
        else:
            why = self._memo[dur] = self._why(dur)
        if why is None or deadline is None:
            if why is not None and self.max_wait is not None:
                self.until = self._until(dur)
            return why
        need = max(dur, upper or 0.0)
        fits = next((p for p in self.future if p.seconds >= dur), None)
        if fits is not None and self._in_time(fits.start, need, deadline):
            self.until = fits.start
            return (
                f"held for off-peak until {self.clock(fits.start)}, when a cheap period long "
                f"enough for its {_hours(dur)} opens; deadline {self.clock(deadline)} still met"
            )
        nxt = self.future[0] if self.future and self.current is None else None
        if nxt is not None and self._in_time(nxt.start, need, deadline):
            self.until = nxt.start
            return (
                f"held for off-peak until {self.clock(nxt.start)}, when a cheap period opens "
                f"(its {_hours(dur)} outlasts it; deadline {self.clock(deadline)} still met)"
            )
        return None  # waiting would miss the deadline: start at today's price

    def _until(self, dur: float) -> datetime:
        """When the hold `_why(dur)` gives ends: the cheap period it waits for, the next to
        open for a job longer than all of them, else (none known) the horizon's end."""
        fits = next((p for p in self.future if p.seconds >= dur), None)
        if fits is not None:
            return fits.start
        if dur > self.longest and self.future:
            return self.future[0].start
        return self.now + timedelta(hours=self.horizon_h)

    def _in_time(self, at: datetime, dur: float, deadline: datetime) -> bool:
        return (deadline - at).total_seconds() - dur >= self.slack

    def _why(self, dur: float) -> str | None:
        """Why a job of `dur` seconds with no deadline waits; None: it may start now."""
        if not self.periods:
            return (
                f"held for off-peak: no price at or below {self.threshold:g} {self.currency}"
                f"/kWh in the next {self.horizon_h:g} h"
            )
        fits = next((p for p in self.future if p.seconds >= dur), None)
        if fits is not None:
            why = f"held for off-peak until {self.clock(fits.start)}"
            if self.current is not None:
                why += (
                    f" (needs {_hours(dur)}; this cheap period ends at "
                    f"{self.clock(self.current.end)})"
                )
            return why
        if dur <= self.longest:  # only the cheap period under way was long enough
            return (
                f"held for off-peak: no cheap period in the next {self.horizon_h:g} h is "
                f"left long enough for {_hours(dur)}"
            )
        # Longer than every cheap period ahead: it starts as one opens.
        if self.current is not None and self.since_open <= self.grace:
            return None
        longer = f"{_hours(dur)} expected, longer than every cheap period: starts as one opens"
        if not self.future:
            return f"held for off-peak: {longer}, and none opens in the next {self.horizon_h:g} h"
        return f"held for off-peak until {self.clock(self.future[0].start)} ({longer})"

    def start_note(
        self, dur: float, pausable: bool, deadline: datetime | None, upper: float | None = None
    ) -> str:
        if self.max_wait is not None and self.hold(dur, deadline, upper) is not None:
            # a hold its deadline allowed: the limit let it through
            return (
                f"starts now: waiting for a cheap period would take its wait past "
                f"{_hours(self.max_wait)} (hold_max_wait)"
            )
        if deadline is not None and self.hold(dur, None) is not None:  # held but for its deadline
            return (
                f"starts off-peak: waiting for a cheap period would miss its deadline "
                f"{self.clock(deadline)} on its {_hours(dur)} estimate"
            )
        if self.current is None or dur <= self.left:
            return ""
        then = "pauses at a checkpoint then" if pausable else "runs through it (not pausable)"
        return (
            f"cheap period opened at {self.clock(self.current.start)}; the {_hours(dur)} job "
            f"{then}, cheap period ends at {self.clock(self.current.end)}"
        )

    def pause(self, job: RunningJob) -> Pause | None:
        if self.current is not None or job.cost_class != "cost_sensitive" or not job.pausable:
            return None
        resume = self.future[0].start if self.future else None
        if job.deadline is not None:
            if job.started_at is not None and self.tariff.price_at(job.started_at) > self.threshold:
                return None  # started off-peak on purpose: its deadline could not wait
            ends = [e for e in (job.expected_end, job.upper_end) if e is not None]
            left = (max(ends) - self.now).total_seconds() if ends else 0.0
            if resume is None or not self._in_time(resume, max(0.0, left), job.deadline):
                return None  # a pause now would miss the deadline: run through
        if self.max_wait is not None:
            if resume is None or job.started_at is None or job.submitted_at is None:
                return None  # no end to the pause known: it could outlast the limit
            if self.tariff.price_at(job.started_at) > self.threshold:
                return None  # started off-peak on purpose: its wait could not stretch that far
            self.until = resume
            waited = waited_s(job.started_at, job.submitted_at, job.attained_gpu_s, len(job.gpus))
            if self.waits_too_long(waited):
                return None  # the pause would take its wait past hold_max_wait_s: run through
        then = f"resume at {self.clock(resume)}" if resume else "resume in the next cheap period"
        return Pause(
            job_id=job.id,
            resume_at=resume,
            reason=(
                f"cheap period over (price above {self.threshold:g} {self.currency}/kWh): pause at a "
                f"checkpoint, {then}"
            ),
        )


def band_price(tariff: Tariff, threshold: float | str | None) -> float:
    """The price a cost_threshold names: a price as it is; 'cheapest' (or None) the tariff's
    lowest; 'not_peak' the highest price below its peak (every price, if it has one only)."""
    if isinstance(threshold, int | float):
        return float(threshold)
    prices = tariff.prices()
    if threshold == "not_peak" and len(prices) > 1:
        return prices[-2]
    return prices[0]


# ---------------------------------------------------------------------------------- place
COLUMNS_FROM = 2_000  # from this many pending jobs, screen them as columns (`_screen_columns`)

Entry = tuple[
    float, float, int, float, PendingJob
]  # (−aged priority, −waited s, id, duration s, job)
_CPU: tuple = (0,)  # the request of every job that asks for no GPU
_BACKOFF = "backoff"  # first item of the request of a GPU job's stand-in during its backoff


def _effective(priority: int, since: datetime | None, now: datetime, rate_s: float) -> float:
    if since is None:
        return float(priority)
    return priority + rate_s * (now - since).total_seconds()


def penalty_of(snap: Snapshot) -> Callable[[float, float, int], float]:
    """The priority points `snap.order` takes off a job, as f(expected seconds, attained
    GPU-seconds, GPUs): none (priority); the estimate's doublings above a minute (sjf_aging:
    shorter first, and aging lets a long job through once it has waited its doublings' worth);
    the job's level of attained GPU time (las: Tiresias' discretised least-attained-service);
    the doublings of the estimated remaining GPU time above a GPU-minute (srpt: the fewest
    GPU-seconds left first, which a job's own progress lowers while it runs)."""
    if snap.order == "sjf_aging":
        w = snap.sjf_per_doubling
        return lambda dur, _att, _k: w * math.log2(dur / 60.0) if dur > 60.0 else 0.0
    if snap.order == "srpt":
        w = snap.sjf_per_doubling

        def srpt(dur: float, _att: float, gpus: int) -> float:
            gpu_s = dur * max(1, gpus)
            return w * math.log2(gpu_s / 60.0) if gpu_s > 60.0 else 0.0

        return srpt
    if snap.order == "las":
        cuts = sorted(h * 3600.0 for h in snap.las_thresholds_gpu_h)
        pts = snap.las_points
        return lambda _dur, att, _k: pts * bisect.bisect_right(cuts, att)
    return lambda _dur, _att, _k: 0.0


def outrun_end(
    expected_end: datetime,
    upper_end: datetime | None,
    now: datetime,
    started: datetime,
    attained_gpu_s: float,
    gpus: int,
) -> datetime:
    """When a running job that has outrun its estimate is taken to end, for whom to preempt and
    when its GPUs free up (reservations): at its worst case by the history of such estimates
    while that is ahead; past it, about as long again as it has run (backfill schedulers
    extend a runtime prediction a job outlives; Tsafrir et al. 2007). Read as about to end, a
    job whose estimate was far too short (or a lie: a minute for a day) would never be paused,
    would rank above every waiting job, and a reservation on its GPUs would keep the free ones
    beside them idle for as long as it overran.

    "As long again" is read in steps: the estimate grows by a quarter at a time until the end
    lies at least as far ahead as the job has run (so 1 to 1.5 times that), and stays put
    from one call to the next until the job has run a quarter longer. Half of the jobs outrun
    a median estimate: an end that moved at every call would rebuild the cluster kept between
    calls at every call."""
    if upper_end is not None and upper_end > now:
        return upper_end
    origin = started - timedelta(seconds=attained_gpu_s / max(1, gpus))  # its earlier attempts
    span = max(60.0, ((upper_end or expected_end) - origin).total_seconds())
    ran = (now - origin).total_seconds()
    while span < 2.0 * ran:
        span *= OUTRUN_STEP
    return origin + timedelta(seconds=span)


OUTRUN_STEP = 1.25  # how much an outrun estimate grows at a time (`outrun_end`)


PROMOTED = 1e12  # the starvation guard's boost: above any priority, aging or deadline boost


def waited_s(now: datetime, submitted_at: datetime, attained_gpu_s: float, gpus: int) -> float:
    """How long a job has waited in all since submission: queued, held or paused, not run."""
    return (now - submitted_at).total_seconds() - attained_gpu_s / max(1, gpus)


def _waiting_on(blocked: list[list[str]]) -> list[str]:
    """Each blocked job's reason, one string per distinct list of dependencies (a sweep's trials
    wait on the same job): built once and shared."""
    made: dict[tuple[str, ...], str] = {}
    out = []
    for names in blocked:
        key = tuple(names)
        why = made.get(key)
        if why is None:
            why = made[key] = "waiting on " + ", ".join(names)
        out.append(why)
    return out


def place(snap: Snapshot, *, _fast: bool = True) -> Decision:
    """Starts, a hold reason for every waiting job, preemption proposals and tariff pauses.

    `_fast` (on; off only in tests) takes the shortcuts that make a long queue on a large
    cluster cheap: a queue of `COLUMNS_FROM` jobs or more screened as numpy columns kept between
    calls, the cluster kept between calls (`_KeptCluster`), full hosts skipped, who holds a GPU
    class kept from a log, tables for CPU slots kept for jobs in backoff, preemption plans cut
    short. Off, the plain loops decide; the two must
    agree on every decision (tests/test_placement_fast_path.py).

    The collector is paused for the call (and resumed as it was): a call builds one tuple per
    waiting job and one reason per held one, and at 100,000 jobs the collections those
    allocations trigger, each walking every object the caller holds, cost as much as the
    placement itself. A call makes no reference cycles that would wait for it."""
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        if not _fast:
            return _Placer(snap, False).run()
        with _kept_cluster() as kept:
            return _Placer(snap, True, kept).run()
    finally:
        if collecting:
            gc.enable()


_KEPT = _KeptCluster()
_KEPT_LOCK = threading.Lock()


@contextmanager
def _kept_cluster() -> Iterator[_KeptCluster | None]:
    """The process's kept cluster for one call, or None while another thread's call has it."""
    if not _KEPT_LOCK.acquire(blocking=False):
        yield None
        return
    try:
        yield _KEPT
    finally:
        _KEPT_LOCK.release()


class _ListBucket:
    """The eligible jobs that make one request; sorted best first once more than one is needed.
    (`pending_columns.ArrayBucket` is the same for the column path.)"""

    __slots__ = ("raw", "items", "pos", "sorted", "short_only")

    def __init__(self, raw: tuple, items: list[Entry]):
        self.raw, self.items = raw, items
        self.pos = 0  # index of its entry on the heap, once sorted
        self.sorted = False
        self.short_only = False  # only jobs that end before the reservation are left in it

    def first(self) -> Entry:
        return min(self.items)

    def visited(self, entry: Entry) -> None:
        if not self.sorted:  # its first visit: the entry was its minimum
            self.items = [e for e in self.items if e is not entry]
            self.pos = -1

    def left(self) -> int:
        return len(self.items) - self.pos - 1

    def rest_ids(self) -> list[int]:
        return [e[2] for e in self.items[self.pos + 1 :]]

    def split_long(self, left: float) -> list[int]:
        """Take out the jobs that would run past `left` seconds: their ids."""
        rest = self.items[self.pos + 1 :]
        self.items = [e for e in rest if e[3] <= left]
        self.pos, self.sorted, self.short_only = -1, False, True
        return [e[2] for e in rest if e[3] > left]

    def advance(self) -> Entry:
        if not self.sorted:
            self.items.sort()
            self.sorted = True
        self.pos += 1
        return self.items[self.pos]

    def take_promoted(
        self, ne_max: float, left: float, short_too: bool
    ) -> tuple[list[int], list[int]]:
        """Take out the jobs still to visit whose −priority is at most `ne_max`: those that
        would run past `left` seconds, and (`short_too`) the others; their ids."""
        rest = self.items[self.pos + 1 :]
        out = [e for e in rest if e[0] <= ne_max and (short_too or e[3] > left)]
        if out:
            gone = {e[2] for e in out}
            self.items = self.items[: self.pos + 1] + [e for e in rest if e[2] not in gone]
        return [e[2] for e in out if e[3] > left], [e[2] for e in out if e[3] <= left]


_Bucket: TypeAlias = _ListBucket | ArrayBucket


def _cuts(*keys: np.ndarray) -> list[int]:
    """Where a run of equal values ends in sorted `keys` (taken together): 0, each change, n."""
    n = len(keys[0])
    if not n:
        return [0]
    change = np.zeros(n - 1, dtype=bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    return [0, *(np.flatnonzero(change) + 1).tolist(), n]


def _array_buckets(
    at: np.ndarray,
    cols: PendingColumns,
    rows: np.ndarray,
    eff: np.ndarray,
    wait: np.ndarray,
    jid: np.ndarray,
    dur: np.ndarray,
    raw_of: Callable[[tuple], tuple],
) -> list[_Bucket]:
    """The jobs `at` (positions in `rows`), one bucket per request, as arrays: sorted by request
    once (a radix sort where the request codes are few) and cut into slices."""
    if not len(at):
        return []
    codes = cols.code[rows[at]]
    small = codes.astype(np.int16) if cols.n_codes() < 2**15 else codes
    by_code = np.argsort(small, kind="stable")
    at, codes = at[by_code], codes[by_code]
    ne, nw, ids, ds, rs = -eff[at], -wait[at], jid[at], dur[at], rows[at]
    cuts = _cuts(codes)
    return [
        ArrayBucket(
            raw_of(cols.raws[int(codes[a])]), ne[a:b], nw[a:b], ids[a:b], ds[a:b], rs[a:b], cols.job
        )
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]


class _Placer:
    """One call of `place`. Jobs are visited best first, merged from per-request buckets, and a
    bucket whose fate is settled (say, no GPU has 40 GiB free outside the reservation, and no
    preemption can help) has all its remaining jobs held at once: 10,000 waiting jobs cost
    little more than the few that could still start."""

    def __init__(self, snap: Snapshot, fast: bool = True, kept: _KeptCluster | None = None):
        self.snap = snap
        self.now = snap.now
        self.fast = fast
        self.kept = kept  # the cluster kept between calls, when this call may use it
        tz = (
            ZoneInfo(snap.display_tz)
            if snap.display_tz
            else (snap.tariff.tz if snap.tariff is not None else _UTC_ZONE)
        )
        self.clock = _Clock(snap.now, tz)
        self.default_s = snap.default_duration_s
        self.rate_s = snap.aging_per_hour / 3600.0
        self.starts: list[Start] = []
        self.holds: dict[int, str] = {}
        self.preemptions: list[Preempt] = []
        self.pauses: list[Pause] = []
        self.gate: _TariffGate | None = None  # built once a cost_sensitive job needs it
        if snap.tariff is not None and any(r.cost_class == "cost_sensitive" for r in snap.running):
            self.gate = _TariffGate(snap, snap.tariff, self.clock)
        self.reservation: Reservation | None = None
        self.res_left = 0.0  # seconds from now to the reservation
        self.reserved: set[int] = set()
        self.claimed: set[int] = set()
        self.victims: _Victims | None = None
        self.cluster: _Cluster | None = None
        self.cpu_free = snap.cpu_slots - sum(1 for r in snap.running if not r.gpus)
        self.cpu_holders = [(r.id, r.name) for r in snap.running if not r.gpus]
        self.cpu_reason: str | None = None  # once every slot is taken: by whom
        # CPU jobs waiting out a retry backoff: (queue rank, not_before, id, name). A slot stays
        # theirs against lower-ranked jobs that would still run when their backoff ends.
        self.cpu_backoff: list[tuple[tuple[float, float, int], datetime, int, str]] = []
        self.backoff_by_rank: list[int] | None = None  # indices into cpu_backoff, by rank
        self.backoff_ranks: list[tuple[float, float, int]] = []
        self.kept_tables: dict[datetime, tuple[list[int], list[int]]] = {}
        self.backoff_ends = np.empty(0, dtype=object)  # their not_before, by rank
        self.margin = snap.preempt_margin or 0
        self.sjf = snap.order == "sjf_aging"
        self.preempt_budget = snap.preempt_max_per_call
        # Failures only grow within one call (starts and claims only take resources away), so
        # a request that failed once fails for every later job that makes it.
        self.requests: dict[tuple, _Request] = {}
        self.reasons: dict[tuple, str] = {}
        self.res_reasons: dict[tuple, str] = {}
        self.res_tail: str | None = None  # `_reservation_tail`, once made
        self.fail_clear: set[tuple] = set()  # fits nowhere outside the reservation
        self.fail_any: set[tuple] = set()  # fits nowhere at all
        self.fail_preempt: set[tuple] = set()
        self.fail_reserve: set[tuple] = set()
        # pausable jobs migration may move (`migrate_after_s`); [] when none or it is off
        self.movable: list[RunningJob] = []
        self.never: set[tuple] = set()  # requests no healthy GPU set can ever meet
        self.keep_failed: set[tuple] = set()  # stand-in requests that found no GPUs to keep
        self.held_by: dict[tuple, str] = {}  # ": held by job 3 (a), job 5": who is in the way

    def run(self) -> Decision:
        if self.gate is not None:
            for r in self.snap.running:
                p = self.gate.pause(r)
                if p is not None:
                    self.pauses.append(p)
        order: list[_Bucket] | None = None
        if self.fast and len(self.snap.pending) >= COLUMNS_FROM and self.now.tzinfo is None:
            with columns(_CPU, _BACKOFF) as cols:
                try:
                    rows = cols.rows_of(self.snap.pending, self.snap._kept_from)
                except Unsupported:
                    rows = None
                if rows is not None:
                    order = self._screen_columns(cols, rows)
        if order is None:
            order = [_ListBucket(raw, items) for raw, items in self._screen().items()]
        if order:
            self._setup(any(b.raw is not _CPU for b in order))
            self._allocate(order)
        return Decision.model_construct(
            starts=self.starts,
            holds=self.holds,
            preemptions=self.preemptions,
            pauses=self.pauses,
            reservation=self.reservation,
            shared_tails=self._shared_tails(),
        )

    def _screen(self) -> dict[tuple, list[Entry]]:
        """Dependencies, backoff and tariff, in any order; the rest bucketed by request."""
        now, holds, clock, gate = self.now, self.holds, self.clock, self.gate
        default_s, rate_s, tariff = self.default_s, self.rate_s, self.snap.tariff
        penalty = None if self.snap.order == "priority" else penalty_of(self.snap)
        slack, boost = self.snap.hold_slack_s, self.snap.deadline_boost
        promote_h = self.snap.promote_after_h
        promote_s = promote_h * 3600.0 if promote_h is not None else None
        min_gpu_s = self.snap.hold_min_gpu_h * 3600.0
        buckets: dict[tuple, list[Entry]] = {}
        for j in self.snap.recovering:
            self._keep_place(j, penalty, buckets)
        for j in self.snap.pending:
            f = j.__dict__  # the field values; half the cost of attribute access on a model
            jid = f["id"]
            if f["blocked_by"]:
                holds[jid] = "waiting on " + ", ".join(f["blocked_by"])
                continue
            nb = f["not_before"]
            if nb is not None and nb > now:
                holds[jid] = (
                    f"backoff until {clock(nb)} after attempt {f['attempt']}"
                    if f["attempt"]
                    else f"not before {clock(nb)}"
                )
                if f["attempt"]:
                    self._keep_place(j, penalty, buckets)
                continue
            dur = f["expected_duration_s"] or default_s
            if (
                tariff is not None
                and f["cost_class"] == "cost_sensitive"
                and max(1, f["gpus"]) * dur >= min_gpu_s
            ):
                if gate is None:
                    gate = self.gate = _TariffGate(self.snap, tariff, clock)
                why = gate.hold(dur, f["deadline"], f["expected_upper_s"])
                if why is not None and (
                    gate.max_wait is None
                    or not gate.waits_too_long(
                        waited_s(now, f["submitted_at"], f["attained_gpu_s"], f["gpus"])
                    )
                ):
                    holds[jid] = why
                    continue
            wait = (now - f["submitted_at"]).total_seconds()
            k = f["gpus"]
            raw = (
                (k, f["gpu_memory_gb"], f["share_gpu"], f["gpu_memory_cap_gb"], f["span_hosts"])
                if k
                else _CPU
            )
            eff = f["priority"] + rate_s * wait
            if penalty is not None:
                eff -= penalty(dur, f["attained_gpu_s"], k)
            if promote_s is not None and (
                waited_s(now, f["submitted_at"], f["attained_gpu_s"], k) >= promote_s
            ):
                eff = PROMOTED + wait  # oldest first among the promoted
            dl = f["deadline"]
            if (
                dl is not None
                and tariff is not None
                and f["cost_class"] == "cost_sensitive"
                and _no_slack_left(dl, now, f["submitted_at"], dur, f["expected_upper_s"], slack)
            ):
                # a job a hold could have delayed (it had more than the slack to spare) and that
                # has no more now: first, so that a hold never costs a deadline
                eff += boost
            entry = (-eff, -wait, jid, dur, j)
            got = buckets.get(raw)
            if got is None:
                buckets[raw] = [entry]
            else:
                got.append(entry)
        return buckets

    def _screen_columns(self, cols: PendingColumns, rows: np.ndarray) -> list[_Bucket]:
        """`_screen` for a long queue, on the pending jobs' columns: the same decisions, with
        the same arithmetic (so the same floating-point results), on all rows at once. Only the
        jobs that wait on something get a loop of their own: they need their own reasons."""
        snap, now, holds, clock = self.snap, self.now, self.holds, self.clock
        tariff, rate_s, default_s = snap.tariff, self.rate_s, self.default_s
        penalty = None if snap.order == "priority" else penalty_of(snap)
        lists: dict[tuple, list[Entry]] = {}
        for j in snap.recovering:
            self._keep_place(j, penalty, lists)
        now_us = micros(now)
        jid, jobs = cols.jid[rows], cols.job
        # the lists that had a dependency when their jobs were added, read now (one may have
        # been emptied in place): reading 100,000 lists is what would cost
        blocked = cols.deps[rows]
        had = np.flatnonzero(blocked)
        blocked[had] = cols.blocked[rows[had]].astype(bool)
        nb = cols.nb[rows]
        backoff = ~blocked & (nb > now_us)
        exp = cols.exp[rows]
        dur = np.where(np.isnan(exp), default_s, exp)
        wait = (now_us - cols.sub[rows]) / 1e6  # as timedelta.total_seconds(): µs / 10**6
        eff = cols.prio[rows] + rate_s * wait
        gpus = cols.gpus[rows]
        att = cols.att[rows]
        if penalty is not None:
            # a row's penalty depends on its fields and the order's settings alone: computed
            # once per row (at 100,000 jobs the distinct values cost a sort per call)
            key = (
                snap.order,
                snap.sjf_per_doubling,
                tuple(snap.las_thresholds_gpu_h),
                snap.las_points,
                default_s,
            )
            if cols.pen_key != key:
                cols.pen_key, cols.pen_n, cols.repen = key, 0, []
            stale: list[np.ndarray | slice] = []
            if cols.repen:  # rows whose estimate moved in place
                moved, cols.repen = cols.repen, []
                stale.append(np.unique(np.array(moved, dtype=np.int64)))
            if cols.pen_n < cols.n:  # rows added since
                stale.append(slice(cols.pen_n, cols.n))
                cols.pen_n = cols.n
            for at in stale:
                exp_at = cols.exp[at]
                cols.pen[at] = self._penalties(
                    penalty,
                    np.where(np.isnan(exp_at), default_s, exp_at),
                    cols.att[at],
                    cols.gpus[at],
                )
            eff = eff - cols.pen[rows]
        at = np.flatnonzero(blocked)
        holds.update(
            zip(jid[at].tolist(), _waiting_on(cols.blocked[rows[at]].tolist()), strict=True)
        )
        at = np.flatnonzero(backoff)
        order: list[_Bucket] = []
        if len(at):
            r_at = rows[at]
            tries = cols.attempt[r_at]
            # one reason per distinct (not_before, attempt), given to its jobs at once
            by = np.lexsort((tries, nb[at]))
            cuts = _cuts(nb[at][by], tries[by])
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                n = int(by[a])
                nbt, tried = cols.nb_obj[int(r_at[n])], int(tries[n])
                why = (
                    f"backoff until {clock(nbt)} after attempt {tried}"
                    if tried
                    else f"not before {clock(nbt)}"
                )
                holds.update(zip(jid[at[by[a:b]]].tolist(), repeat(why)))
            # a job whose last attempt failed keeps its rank (`_keep_place`): a CPU job for a
            # slot, a GPU job through a stand-in of its request
            kept = at[tries > 0]
            cpu = kept[gpus[kept] == 0]
            for n, nbt, j in zip(
                cpu.tolist(),
                cols.nb_obj[rows[cpu]].tolist(),
                jobs[rows[cpu]].tolist(),
                strict=True,
            ):
                rank = (-float(eff[n]), -float(wait[n]), int(jid[n]))
                self.cpu_backoff.append((rank, nbt, rank[2], j.name))
            gpu = kept[gpus[kept] > 0]
            order += _array_buckets(
                gpu, cols, rows, eff, wait, jid, dur, lambda raw: (_BACKOFF, *raw)
            )
        if snap.promote_after_h is not None:
            # the starvation guard (`waited_s`), for the eligible: oldest first among them
            # (a job in backoff keeps its rank unpromoted, as `_keep_place` ranks it)
            promoted = wait - att / np.maximum(gpus, 1) >= snap.promote_after_h * 3600.0
            eff = np.where(promoted, PROMOTED + wait, eff)
        eligible = ~blocked & ~backoff
        if tariff is not None:
            cs = cols.cs[rows]
            gated = eligible & cs & (np.maximum(gpus, 1) * dur >= snap.hold_min_gpu_h * 3600.0)
            if gated.any():
                if self.gate is None:
                    self.gate = _TariffGate(snap, tariff, clock)
                gate = self.gate
                at = np.flatnonzero(gated)
                with_dl = cols.dl[rows[at]] != NONE_US
                # the same reason for every job of one estimate and no deadline: asked once,
                # given to its jobs at once
                plain = at[~with_dl]
                by = np.argsort(dur[plain], kind="stable")
                cuts = _cuts(dur[plain][by])
                for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                    held = gate.hold(float(dur[plain[by[a]]]), None)
                    if held is not None:
                        sel = plain[by[a:b]]
                        if gate.max_wait is not None:  # `waited_s`, row by row
                            waited = wait[sel] - att[sel] / np.maximum(gpus[sel], 1)
                            span = (gate.until - gate.now).total_seconds()
                            sel = sel[~(waited + span > gate.max_wait)]
                        holds.update(zip(jid[sel].tolist(), repeat(held)))
                        eligible[sel] = False
                for n in at[with_dl].tolist():
                    r = int(rows[n])
                    held = gate.hold(float(dur[n]), cols.dl_obj[r], cols.job[r].expected_upper_s)
                    if held is not None and (
                        gate.max_wait is None
                        or not gate.waits_too_long(
                            float(wait[n]) - float(att[n]) / max(1, int(gpus[n]))
                        )
                    ):
                        holds[int(jid[n])] = held
                        eligible[n] = False
            # a job a hold could have delayed (it had more than the slack to spare) and that
            # has no more now: first, so that a hold never costs a deadline
            late = np.flatnonzero(eligible & cs & (cols.dl[rows] != NONE_US))
            if len(late):
                dl_l, sub_l, dur_l = cols.dl[rows[late]], cols.sub[rows[late]], dur[late]
                # what each may take at worst, by its estimates' history (few jobs: from objects)
                upper = [cols.job[int(r)].expected_upper_s or 0.0 for r in rows[late]]
                dur_l = np.maximum(dur_l, np.array(upper, dtype=float))
                slack = snap.hold_slack_s
                boost = ((dl_l - now_us) / 1e6 - dur_l <= slack) & (
                    slack < (dl_l - sub_l) / 1e6 - dur_l
                )
                eff[late[boost]] += snap.deadline_boost
        order += [_ListBucket(raw, items) for raw, items in lists.items()]
        return order + _array_buckets(
            np.flatnonzero(eligible), cols, rows, eff, wait, jid, dur, lambda raw: raw
        )

    def _penalties(
        self,
        penalty: Callable[[float, float, int], float],
        dur: np.ndarray,
        att: np.ndarray,
        gpus: np.ndarray,
    ) -> np.ndarray:
        """What the order takes off each job: computed by the very function `_screen` calls,
        once per distinct value of what the order reads (sjf_aging: the estimate; las: the
        attained time; srpt: the estimate and the GPUs, as one complex number)."""
        order = self.snap.order
        if order == "sjf_aging":
            uniq, inv = np.unique(dur, return_inverse=True)
            pts = [penalty(d, 0.0, 0) for d in uniq.tolist()]
        elif order == "las":
            uniq, inv = np.unique(att, return_inverse=True)
            pts = [penalty(0.0, a, 0) for a in uniq.tolist()]
        elif order == "srpt":
            uniq, inv = np.unique(dur + 1j * gpus, return_inverse=True)
            pts = [penalty(z.real, 0.0, int(z.imag)) for z in uniq.tolist()]
        else:  # an order this does not know: every job its own call
            return np.array([penalty(d, a, int(k)) for d, a, k in zip(dur, att, gpus, strict=True)])
        return np.array(pts)[inv.reshape(-1)]

    def _keep_place(
        self,
        j: PendingJob,
        penalty: Callable[[float, float, int], float] | None,
        buckets: dict[tuple, list[Entry]],
    ) -> None:
        """A job waiting out a retry backoff keeps its rank, as `_screen` ranks an eligible job:
        a CPU job for a slot (`_kept_for_backoff`); a GPU job through a stand-in entry visited
        in its turn, which keeps the GPUs it would take now (`_keep_gpus`)."""
        if j.not_before is None or j.not_before <= self.now:
            return
        dur = j.expected_duration_s or self.default_s
        wait = (self.now - j.submitted_at).total_seconds()
        eff = j.priority + self.rate_s * wait
        if penalty is not None:
            eff -= penalty(dur, j.attained_gpu_s, j.gpus)
        if not j.gpus:
            self.cpu_backoff.append(((-eff, -wait, j.id), j.not_before, j.id, j.name))
            return
        raw = (_BACKOFF, j.gpus, j.gpu_memory_gb, j.share_gpu, j.gpu_memory_cap_gb, j.span_hosts)
        buckets.setdefault(raw, []).append((-eff, -wait, j.id, dur, j))

    def _setup(self, any_gpu: bool) -> None:
        snap, now = self.snap, self.now
        if not any_gpu:
            return
        default_end = timedelta(seconds=self.default_s)
        # When each running job is taken to end. One that outran its estimate is not about to
        # end (`outrun_end`): read as ending any moment, its GPUs would be reserved (and the
        # free ones beside them kept idle) for as long as it overruns.
        ends_of: dict[int, datetime] = {}
        for r in snap.running:
            end = r.expected_end or ((r.started_at or now) + default_end)
            if end <= now:
                started = r.started_at or now
                end = outrun_end(end, r.upper_end, now, started, r.attained_gpu_s, len(r.gpus))
            ends_of[r.id] = end
        self.cluster = (
            self.kept.get(snap, ends_of)
            if self.kept is not None
            else _Cluster(snap, ends_of, self.fast)
        )
        if snap.preempt_margin is not None:
            penalty = penalty_of(
                snap.model_copy(update={"order": "priority"}) if self.sjf else snap
            )

            promote_h = snap.promote_after_h
            promote_s = promote_h * 3600.0 if promote_h is not None else None
            rate_s = self.rate_s
            # Each pausable job's priority as a waiting job's is aged, less what the ordering
            # takes off for what remains (srpt) or what it has run (las); a job the starvation
            # guard promoted before it started is not preempted. Sorted lowest first, by id on a
            # tie (then by place: what a key of the two would keep), as tuples: no key calls.
            keyed: list[tuple[float, int, int, RunningJob]] = []
            for k, r in enumerate(snap.running):
                f = r.__dict__  # the field values: thousands of running jobs at every call
                held = f["gpus"]
                if not (f["pausable"] and held):
                    continue
                started = f["started_at"] or now
                n = len(held)
                submitted = f["submitted_at"]
                if (
                    promote_s is not None
                    and submitted is not None
                    and waited_s(started, submitted, f["attained_gpu_s"], n) >= promote_s
                ):
                    e = 2 * PROMOTED
                else:
                    left = (ends_of[f["id"]] - now).total_seconds()
                    if left < snap.preempt_min_left_s:
                        continue  # nearly done: not worth its redone work
                    ran = n * (now - started).total_seconds()
                    e = _effective(
                        f["priority"], submitted or f["started_at"], now, rate_s
                    ) - penalty(left, f["attained_gpu_s"] + ran, n)
                keyed.append((e, f["id"], k, r))
            keyed.sort()
            victims = _Victims(
                self.cluster,
                [(e, r) for e, _, _, r in keyed],
                narrow=not snap.preempt_wider,
                fast=self.fast,
            )
            self.victims = victims or None
            if self.fast and self.preempt_budget <= 0:
                self.victims = None  # none may preempt in this call
            # best fit only: first fit would put a moved job back on the host it left
            if (
                snap.migrate_after_s is not None
                and self.cluster.best_fit
                and self.preempt_budget > 0
            ):
                slack = timedelta(seconds=snap.hold_slack_s)
                self.movable = [
                    r
                    for e, _, _, r in keyed
                    if e < PROMOTED
                    and not r.share_gpu
                    # a move redoes work: not for a job whose deadline its estimate nearly meets
                    and (r.deadline is None or r.deadline - ends_of[r.id] >= slack)
                ]

    def _allocate(self, order: list[_Bucket]) -> None:
        """Visit jobs best first; hold what is left of a bucket once its outcome is settled."""
        holds = self.holds
        heap = [(b.first(), i) for i, b in enumerate(order)]
        heapq.heapify(heap)
        while heap:
            entry, bi = heapq.heappop(heap)
            b = order[bi]
            self._one(entry, b.raw)
            if b.raw[0] == _BACKOFF and b.raw[1:] in self.keep_failed:
                continue  # no later stand-in of this request finds GPUs to keep either
            b.visited(entry)
            if not b.left():
                continue
            why_short, why_long = self._settled(b.raw)
            if why_short is None and why_long is None and self.fast:
                self._settle_promoted(b)
            if why_short is not None and why_short == why_long:
                holds.update(zip(b.rest_ids(), repeat(why_short)))
                continue
            if why_long is not None and not b.short_only:
                holds.update(zip(b.split_long(self.res_left), repeat(why_long)))
            if why_short is not None:
                holds.update(zip(b.rest_ids(), repeat(why_short)))
                continue
            if not b.left():
                continue
            heapq.heappush(heap, (b.advance(), bi))

    def _settled(self, raw: tuple) -> tuple[str | None, str | None]:
        """Why every later job of this request will be held, as far as this call can already
        tell: (for jobs that end before the reservation, for jobs that would run past it)."""
        if raw is _CPU:
            if self.cpu_free > 0:
                return None, None
            why = self._cpu_busy()
            return why, why
        if raw[0] == _BACKOFF:
            return None, None  # stand-ins hold nothing: each is visited in its turn
        key = self.requests[raw].key
        if key in self.never:
            return self.reasons[key], self.reasons[key]
        if self.reservation is None or (self.victims is not None and key not in self.fail_preempt):
            return None, None
        long = self._past_reservation(key) if key in self.fail_clear else None
        return (self._reason(key) if key in self.fail_any else None), long

    def _settle_promoted(self, b: _Bucket) -> None:
        """Hold at once the bucket's jobs that the starvation guard promoted and whose turn
        can only end in a hold, where `_settled` waits because a later job might still
        preempt: a promoted job never preempts (outside sjf_aging) and, with the reservation
        taken, finds what every job of its request found before it (the daemon's defaults
        promote half of a 100,000-job queue: otherwise 34,000 turns, one by one)."""
        if self.sjf or self.reservation is None or b.raw is _CPU or b.raw[0] == _BACKOFF:
            return
        key = self.requests[b.raw].key
        why_short = self._reason(key) if key in self.fail_any else None
        why_long = self._past_reservation(key) if key in self.fail_clear else None
        if why_long is None:  # fail_any implies fail_clear: nothing is settled yet
            return
        long, short = b.take_promoted(-PROMOTED, self.res_left, why_short is not None)
        self.holds.update(zip(long, repeat(why_long)))
        if why_short is not None:
            self.holds.update(zip(short, repeat(why_short)))

    def _migrate(
        self, req: _Request, got: tuple[datetime, list[int]] | None
    ) -> tuple[list[tuple[float, RunningJob]], list[int]] | None:
        """Jobs to move for `req` (`_move_plan`), when it would otherwise wait at least
        `migrate_after_s` for its GPUs (until `got`, its reservation): None when it would not,
        or nothing can move."""
        assert self.cluster is not None
        after = self.snap.migrate_after_s or 0.0
        if got is not None and (got[0] - self.now).total_seconds() < after:
            return None  # its GPUs free up soon enough: no work redone for it
        return _move_plan(self.cluster, self.movable, req, self.reserved | self.claimed)

    def _why_held(self, key: tuple, dur: float) -> str:
        """Order-independent: a job that would run past the reservation is told so; one that
        would not (it may use the reserved GPUs) found no GPU at all."""
        if self.reservation is not None and dur > self.res_left and key not in self.never:
            return self._past_reservation(key)
        return self._reason(key)

    def _past_reservation(self, key: tuple) -> str:
        got = self.res_reasons.get(key)
        if got is None:
            got = self.res_reasons[key] = self.reasons[key] + self._reservation_tail()
        return got

    def _shared_tails(self) -> dict[str, str]:
        """`Decision.shared_tails`, from where the call ended (whichever way it got there)."""
        tails = {}
        if self.reservation is not None:
            tails["reservation"] = self._reservation_tail()
        if self.cpu_holders and self.cpu_free <= 0:
            tails["cpu"] = self._cpu_holders()
        return tails

    def _reservation_tail(self) -> str:
        """What the reason of every job that would run past the reservation ends with."""
        if self.res_tail is None:
            res = self.reservation
            assert res is not None
            self.res_tail = (
                f" outside {_gpu_list(res.gpus)}, reserved for job {res.job_id} from "
                f"{self.clock(res.at)}, and it would run past that"
            )
        return self.res_tail

    def _one(self, entry: Entry, raw: tuple) -> None:
        """Start one job, or say why it waits (proposing preemption or taking the reservation)."""
        neg_eff, _, _, dur, j = entry
        now, holds = self.now, self.holds
        if raw is _CPU:
            kept = self._kept_for_backoff(entry) if self.cpu_free > 0 else None
            if kept is not None:
                holds[j.id] = kept
            elif self.cpu_free > 0:
                self.cpu_free -= 1
                self.cpu_holders.append((j.id, j.name))
                self.starts.append(
                    Start(
                        job_id=j.id,
                        gpus=[],
                        expected_end=now + timedelta(seconds=dur),
                        note=_note(self.gate, j, dur),
                    )
                )
            else:
                holds[j.id] = self._cpu_busy()
            return
        cluster = self.cluster
        assert cluster is not None
        if raw[0] == _BACKOFF:
            self._keep_gpus(j, raw[1:])
            return
        req = self.requests.get(raw)
        if req is None:
            req = self.requests[raw] = self._request(raw)
            if req.key not in self.reasons:
                never = self._cannot_span(req) or cluster.impossible(req)
                self.reasons[req.key] = never or _no_fit(req)
                if never:
                    self.never.add(req.key)
                    for failed in (
                        self.fail_clear,
                        self.fail_any,
                        self.fail_preempt,
                        self.fail_reserve,
                    ):
                        failed.add(req.key)
        key = req.key
        fail_any, fail_clear = self.fail_any, self.fail_clear

        ids: list[int] | None = None
        note = ""
        res = self.reservation
        if res is None:
            if key not in fail_any:
                ids = cluster.pick(req, self.reserved, True)
                if ids is None:
                    fail_any.add(key)
                    fail_clear.add(key)  # fits nowhere, so nowhere outside a reservation either
                    self._name_holders(req)
        else:
            if key not in fail_clear:
                ids = cluster.pick(req, self.reserved, False)
                if ids is None:
                    fail_clear.add(key)
                    self._name_holders(req)
                else:
                    note = f"backfill ahead of job {res.job_id} on GPUs it does not need"
            if ids is None and key not in fail_any and dur <= self.res_left:
                ids = cluster.pick(req, self.reserved, True)
                if ids is None:
                    fail_any.add(key)
                    self._name_holders(req)
                else:
                    note = (
                        f"backfill ahead of job {res.job_id}: ends before its reservation "
                        f"at {self.clock(res.at)}"
                    )
        if ids is not None:
            end = now + timedelta(seconds=dur)
            cluster.take(req, ids, end, (j.id, j.name))
            tnote = _note(self.gate, j, dur)
            self.starts.append(
                Start(
                    job_id=j.id,
                    gpus=ids,
                    expected_end=end,
                    note="; ".join(n for n in (note, tnote) if n),
                )
            )
            return

        # Blocked. Preempt lower-priority pausable work, if allowed and it would help.
        victims = self.victims
        if self.sjf:  # shortest-first orders the queue; preemption still weighs aged priority
            eff = j.priority - self.rate_s * entry[1]
            if victims is not None and self.preempt_budget <= 0:
                victims = self.victims = None
            elif victims is not None and eff < victims.lowest + self.margin:
                victims = None  # not this job; a later, longer one may outrank a victim
        else:
            eff = -neg_eff
            if eff >= PROMOTED:
                victims = None  # the starvation guard reserves for a job; it does not preempt
            elif victims is not None and (
                eff < victims.lowest + self.margin or self.preempt_budget <= 0
            ):
                victims = self.victims = None  # sorted: no later job outranks a victim enough
        if victims is not None and key not in self.fail_preempt:
            plan = victims.plan(req, eff - self.margin, self.reserved | self.claimed)
            if plan is None:
                self.fail_preempt.add(key)
            else:
                self._preempt(j, plan, eff)
                return

        if res is None and key not in self.fail_reserve:
            # the first job that must wait: it would take the reservation, unless it moves
            # jobs off a host (once per call: the reservation then stands for the rest)
            got = cluster.reserve(req, self.claimed)
            if self.movable and not req.gang:
                moved = self._migrate(req, got)
                if moved is not None:
                    self._preempt(j, moved, migrate=True)
                    return
            if got is None:
                self.fail_reserve.add(key)
            else:
                at, gids = got
                self.reservation = Reservation(job_id=j.id, at=at, gpus=sorted(gids))
                self.reserved, self.res_left = set(gids), (at - now).total_seconds()
                holds[j.id] = (
                    f"{self._reason(key)}; {_gpu_list(gids)} reserved for it from {self.clock(at)}"
                )
                return
        holds[j.id] = self._why_held(key, dur)

    def _name_holders(self, req: _Request) -> None:
        """At a request's first failure, before any job is told its reason: by whom it is held
        (the jobs on the GPUs it could use)."""
        if req.key not in self.held_by and req.key not in self.never:
            assert self.cluster is not None
            self.held_by[req.key] = _held_by(*self.cluster.holders(req))

    def _reason(self, key: tuple) -> str:
        return self.reasons[key] + self.held_by.get(key, "")

    def _request(self, raw: tuple) -> _Request:
        """A GPU request; a gang when the job is wider than every host (by healthy GPUs) or may
        span hosts, and there is more than one host. Where runs cannot span hosts, only a job
        wider than every host is a gang (and `_cannot_span` holds it)."""
        k, mem, share, cap, span = raw
        cluster = self.cluster
        assert cluster is not None
        wide = k > cluster.most_per_host
        gang = len(cluster.hosts) > 1 and (wide or (span and self.snap.cannot_span is None))
        return _Request(k, mem, share, cap, gang)

    def _cannot_span(self, req: _Request) -> str | None:
        """Why a gang waits for good here: the runs of this daemon cannot span hosts."""
        why = self.snap.cannot_span
        if why is None or not req.gang:
            return None
        assert self.cluster is not None
        n = self.cluster.hosts_needed(req.k)
        return f"needs {req.k} GPUs across {n} hosts; {why}" if n else None

    def _keep_gpus(self, j: PendingJob, raw: tuple) -> None:
        """In the turn of a GPU job waiting out its retry backoff: keep the GPUs it would get
        now (as a preempting job's are kept), so no job ranked below it takes them before it
        comes back. Shorter jobs do not slip in here (unlike on a CPU slot): GPUs are few and
        the wait is short."""
        assert self.cluster is not None
        if raw in self.keep_failed:
            return
        ids = self.cluster.pick(self._request(raw), self.reserved | self.claimed, False)
        if ids is None:
            self.keep_failed.add(raw)  # resources only shrink within a call: so for every later one
            return
        assert j.not_before is not None
        why = f"in retry backoff until {self.clock(j.not_before)}"
        self.cluster.claim(ids, (j.id, f"{j.name}, {why}" if j.name else why))
        self.claimed.update(ids)

    def _cpu_busy(self) -> str:
        """Why a CPU job waits once every slot is taken; the takers no longer change."""
        if self.cpu_reason is None:
            self.cpu_reason = f"all {self.snap.cpu_slots} CPU slot(s) busy" + self._cpu_holders()
        return self.cpu_reason

    def _cpu_holders(self) -> str:
        return _held_by(self.cpu_holders, len(self.cpu_holders))

    def _kept_for_backoff(self, entry: Entry) -> str | None:
        """Why this CPU job may not take a free slot: as many jobs ahead of it in queue order
        wait out a retry backoff that ends while it would still run (by its estimate) as there
        are slots left. A failed job keeps its place; a short job may still slip in before."""
        if not self.cpu_backoff:
            return None
        rank, ends = entry[:3], self.now + timedelta(seconds=entry[3])
        if self.fast:
            kept = self._kept_by_table(rank, ends)
            if kept is None:
                return None
            _, nb, jid, name = kept
        else:
            ahead = [b for b in self.cpu_backoff if b[0] < rank and b[1] < ends]
            if len(ahead) < self.cpu_free:
                return None
            _, nb, jid, name = ahead[0]
        return (
            f"the free CPU slot is kept for job {jid}{_named(name)}, ahead in queue order and "
            f"back from its retry backoff at {self.clock(nb)}; this job would not end by then"
        )

    def _kept_by_table(
        self, rank: tuple[float, float, int], ends: datetime
    ) -> tuple[tuple[float, float, int], datetime, int, str] | None:
        """`_kept_for_backoff`'s count of the backoff jobs ahead (ranked below `rank`, back
        before `ends`) and the first of them in list order, from a prefix table per end time
        built once: a CPU job asks at every turn while a slot is free, and a scan of every
        backoff job for each took 600 ms on the tick where a slot freed at 100,000 jobs."""
        if self.backoff_by_rank is None:
            self.backoff_by_rank = sorted(
                range(len(self.cpu_backoff)), key=lambda i: self.cpu_backoff[i][0]
            )
            self.backoff_ranks = [self.cpu_backoff[i][0] for i in self.backoff_by_rank]
            self.backoff_ends = np.empty(len(self.cpu_backoff), dtype=object)
            self.backoff_ends[:] = [self.cpu_backoff[i][1] for i in self.backoff_by_rank]
        table = self.kept_tables.get(ends)
        if table is None:
            # over the backoff jobs by rank: how many of the first i end before `ends`, and the
            # least list index among them (-1: none)
            back = (self.backoff_ends < ends).astype(bool)
            idx = np.where(back, np.array(self.backoff_by_rank), len(self.cpu_backoff))
            first = np.minimum.accumulate(idx)
            counts = [0, *np.cumsum(back).tolist()]
            firsts = [-1, *np.where(first == len(self.cpu_backoff), -1, first).tolist()]
            table = self.kept_tables[ends] = (counts, firsts)
        below = bisect.bisect_left(self.backoff_ranks, rank)
        if table[0][below] < self.cpu_free:
            return None
        return self.cpu_backoff[table[1][below]]

    def _preempt(
        self,
        j: PendingJob,
        plan: tuple[list[tuple[float, RunningJob]], list[int]],
        eff: float = 0.0,
        migrate: bool = False,
    ) -> None:
        """Pause the chosen jobs for `j`: ones it outranks by the margin, or (`migrate`) ones
        that can start again at once on other hosts, whatever their priority."""
        chosen, gpu_ids = plan
        assert self.cluster is not None
        self.cluster.claim(gpu_ids)
        self.claimed.update(gpu_ids)
        self.preempt_budget -= 1
        if self.victims is not None:
            self.victims.drop(chosen)
            if not self.victims or (self.fast and self.preempt_budget <= 0):
                # no more preemption in this call: the buckets may settle now, where the plain
                # path visits job after job to find out (34,000 of them at 100,000 under the
                # daemon's defaults, whose starvation guard puts half the queue ahead of any
                # preemptor)
                self.victims = None
        for veff, v in chosen:
            self.preemptions.append(
                Preempt(
                    victim_job_id=v.id,
                    for_job_id=j.id,
                    reason=(
                        f"job {j.id}{_named(j.name)} finds enough GPUs free but on no one "
                        f"host: pause job {v.id}{_named(v.name)} at a checkpoint, to start "
                        "again at once on another host's free GPUs"
                        if migrate
                        else f"job {j.id}{_named(j.name)} at priority {eff:.1f} outranks job "
                        f"{v.id}{_named(v.name)} at {veff:.1f} by {self.margin} or more: pause "
                        "it at a checkpoint and resume it later"
                    ),
                )
            )
        self.holds[j.id] = (
            f"{'moving' if migrate else 'preempting'} job(s) "
            f"{', '.join(str(v.id) for _, v in chosen)} for it: waiting for them to pause at a "
            f"checkpoint ({_gpu_list(gpu_ids)})"
        )
        if self.reservation is None:
            self.reservation = Reservation(job_id=j.id, at=self.now, gpus=sorted(gpu_ids))
            self.reserved, self.res_left = set(gpu_ids), 0.0


def _named(name: str) -> str:
    return f" ({name})" if name else ""


_HELD_BY_NAMED = 3  # jobs a hold reason names; the rest are counted


def _held_by(jobs: list[tuple[int, str]], total: int) -> str:
    """': held by job 3 (train), job 5 +2 more': who holds what a waiting job needs (`jobs`:
    the first of them, `total`: how many)."""
    if not total:
        return ""
    most = _HELD_BY_NAMED
    named = ", ".join(f"job {jid}{_named(name)}" for jid, name in jobs[:most])
    more = f" +{total - most} more" if total > most else ""
    return f": held by {named}{more}"


def _note(gate: _TariffGate | None, j: PendingJob, dur: float) -> str:
    if gate is None or j.cost_class != "cost_sensitive" or max(1, j.gpus) * dur < gate.min_gpu_s:
        return ""  # never held: too small for the tariff to gate (`hold_min_gpu_h`)
    return gate.start_note(dur, j.pausable, j.deadline, j.expected_upper_s)


def _no_fit(req: _Request) -> str:
    mem = f" with {_gb(req.need / 1024)} GiB free" if req.need else " free"
    share = " to share" if req.shared else ""
    if req.gang:
        return f"no {req.k} healthy GPUs{mem}{' each' if req.need else ''} across hosts"
    if req.k == 1:
        return f"no healthy GPU{mem}{share}"
    return f"no {req.k} healthy GPUs{mem}{' each' if req.need else ''}{share} on one host"


def _move_plan(
    cluster: _Cluster, movable: list[RunningJob], req: _Request, forbidden: set[int]
) -> tuple[list[tuple[float, RunningJob]], list[int]] | None:
    """The host where moving the fewest GPUs' worth of jobs frees `req.k` GPUs, and those
    jobs fit, each on one other host, in GPUs free now outside `forbidden`: one job of any
    width, or one-GPU jobs. Best fit then puts them back on those hosts whatever order they
    come back in (each has less room than `req.k`, the host they left at least that), so
    the waiting job is not blocked again by the jobs it moved. Migration: pausable jobs on
    one host, paused so that nobody waits for them (only the work since their checkpoints is
    redone); asked once per call."""
    gpus = cluster.gpus
    free: dict[str, int] = {}
    for host, pool in cluster.free_excl.items():
        n = sum(1 for i in pool if i not in forbidden)
        if n:
            free[host] = n
    if sum(free.values()) < req.k:
        return None  # the host it would start on and the others' room hold fewer than k
    by_host: dict[str, list[RunningJob]] = {}
    for r in movable:
        hosts = {g.host for i in r.gpus if (g := gpus.get(i)) is not None}
        if len(hosts) == 1:
            by_host.setdefault(hosts.pop(), []).append(r)
    best: tuple[tuple[int, int, int], list[RunningJob], list[int]] | None = None
    for host, jobs in by_host.items():
        have = [
            i
            for i in cluster.free_excl.get(host, ())
            if i not in forbidden and gpus[i].free >= req.need
        ]
        if len(have) >= req.k:
            continue  # it fits there without moving anyone (some other reason holds it)
        chosen: list[RunningJob] = []
        vacated: list[int] = []
        for r in sorted(jobs, key=lambda r: (len(r.gpus), r.id)):  # fewest GPUs first
            if forbidden.intersection(r.gpus):
                continue
            ours = [
                i
                for i in r.gpus
                if (g := gpus.get(i)) is not None and len(g.jobs) == 1 and g.total >= req.need
            ]
            if not ours:
                continue
            chosen.append(r)
            vacated += ours
            if len(have) + len(vacated) >= req.k:
                break
        if len(have) + len(vacated) < req.k:
            continue
        if len(chosen) > 1 and any(len(r.gpus) > 1 for r in chosen):
            continue  # jobs of several widths may not all fit in the order they come back
        moved = sum(len(r.gpus) for r in chosen)
        score = (moved, len(chosen), cluster.rank[host])
        if best is not None and score >= best[0]:
            continue
        room = {h: n for h, n in free.items() if h != host}
        if not _fits_elsewhere([len(r.gpus) for r in chosen], room):
            continue
        best = (score, chosen, (vacated + have)[: req.k])
    if best is None:
        return None
    return [(0.0, r) for r in best[1]], best[2]


def _fits_elsewhere(widths: list[int], room: dict[str, int]) -> bool:
    """Whether jobs of these widths fit, each on one host, in `room` free GPUs per host
    (largest first, each on the host it leaves the least room on)."""
    room = dict(room)
    for w in sorted(widths, reverse=True):
        fits = [h for h, n in room.items() if n >= w]
        if not fits:
            return False
        h = min(fits, key=lambda h: room[h])
        room[h] -= w
    return True


class _Victims:
    """Running pausable GPU jobs that preemption may pause, per host, lowest aged priority first."""

    def __init__(
        self,
        cluster: _Cluster,
        victims: list[tuple[float, RunningJob]],
        narrow: bool = False,
        fast: bool = True,
    ):
        self.cluster = cluster
        self.fast = fast  # hosts by their lowest victim, stopping where none can pause less
        # pause only jobs on no more GPUs than the preemptor asks for (`preempt_wider` off)
        self.narrow = narrow
        self.lowest = victims[0][0] if victims else float("inf")
        self.by_host: dict[str, list[tuple[float, RunningJob]]] = {}
        for v in victims:
            hosts = {g.host for i in v[1].gpus if (g := cluster.gpus.get(i)) is not None}
            if len(hosts) == 1:  # a gang is not paused: every rank would redo its work, and it
                # would start again on its reservation only to be paused again (measured: two
                # 16-GPU gangs paused 7,300 times in one simulated Philly week)
                self.by_host.setdefault(hosts.pop(), []).append(v)

    def __bool__(self) -> bool:
        return bool(self.by_host)

    def drop(self, gone: list[tuple[float, RunningJob]]) -> None:
        ids = {v[1].id for v in gone}
        hosts = {g.host for v in gone for i in v[1].gpus if (g := self.cluster.gpus.get(i))}
        for host in hosts & self.by_host.keys():
            kept = [v for v in self.by_host[host] if v[1].id not in ids]
            if kept:
                self.by_host[host] = kept
            else:
                del self.by_host[host]
        self.lowest = min((vs[0][0] for vs in self.by_host.values()), default=float("inf"))

    def plan(
        self, req: _Request, max_eff: float, forbidden: set[int]
    ) -> tuple[list[tuple[float, RunningJob]], list[int]] | None:
        """Jobs to pause so that `req` gets a place: on one host, lowest aged priority first,
        only jobs at or below `max_eff`, only as many as it takes (a GPU frees when every job on
        it pauses). None when pausing all of them would not be enough, and for a gang."""
        if req.gang:
            return None
        cluster = self.cluster
        best: tuple[tuple[float, int, str], list[tuple[float, RunningJob]], list[int]] | None = None
        hosts = (
            sorted(self.by_host.items(), key=lambda hv: hv[1][0][0])
            if self.fast
            else self.by_host.items()
        )
        for host, vs in hosts:
            if self.fast and (vs[0][0] > max_eff or (best is not None and vs[0][0] > best[0][0])):
                break  # hosts by their lowest victim: none from here can pause less
            if vs[0][0] > max_eff:
                continue
            free = [
                i
                for i in cluster.free_excl.get(host, ())
                if i not in forbidden and cluster.gpus[i].free >= req.need
            ]
            left: dict[int, int] = {}
            vacated: list[int] = []
            chosen: list[tuple[float, RunningJob]] = []
            enough = False
            for v in vs:
                if v[0] > max_eff:
                    break
                gpus = v[1].gpus
                if forbidden.intersection(gpus) or (self.narrow and len(gpus) > req.k):
                    continue
                chosen.append(v)
                for i in gpus:
                    g = cluster.gpus.get(i)
                    if g is None:
                        continue
                    n = left[i] = left.get(i, len(g.jobs)) - 1
                    if n == 0 and g.total >= req.need:
                        vacated.append(i)
                if vacated and len(vacated) + len(free) >= req.k:
                    enough = True
                    break
            if not enough:
                continue
            picked = (vacated + free)[: req.k]
            needed = [v for v in chosen if not set(v[1].gpus).isdisjoint(picked)]
            score = (max(v[0] for v in needed), len(needed), host)
            if best is None or score < best[0]:
                best = (score, needed, picked)
        return None if best is None else (best[1], best[2])
