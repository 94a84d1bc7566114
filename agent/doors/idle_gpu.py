"""The idle-GPU rule: a GPU whose utilisation stays under `alerts.idle_gpu.threshold_pct` for
`alerts.idle_gpu.for_s` while jobs wait in the queue (`idle_while_queued`), or that a running
attempt holds without using it for that long (`held_unused`), is told once: an audit event
(`alert.idle_gpu`) and a notice to every channel through the outbox. It is not told again until
the condition clears (a reading at or over the threshold, the queue empty, the attempt gone).

Readings are those the health check records (GpuSample): the condition starts at the first
check that sees it (a reading under the threshold, and jobs waiting or a live attempt on the GPU)
and holds while every later check does. A GPU with no utilisation reading is never judged idle. The clock is handed in;
`IdleGpuRule` is pure (readings in, alerts out) and `IdleWatch` reads the store for it. The
state lives in the daemon's memory: a restarted daemon may tell a standing condition once more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import func, select

from nightshift.agent.doors.web.metrics import _ts, gpu_labels, latest_gpu_samples
from nightshift.policies.audit import AuditLog
from nightshift.runtime.config import IdleGpuSettings, Settings
from nightshift.runtime.executors.executor import gang_ranks
from nightshift.runtime.store.db import Attempt, Job, Store, utcnow
from nightshift.runtime.store.lifecycle import JobState

Kind = Literal["idle_while_queued", "held_unused"]
LIVE_ATTEMPTS = ("starting", "running")


@dataclass(frozen=True)
class GpuUse:
    """One GPU's latest reading as the rule sees it."""

    host: str
    index: int
    uuid: str
    utilization_pct: float | None
    taken_at: datetime
    held_by: tuple[int, ...] = ()  # the jobs whose running attempts hold it


@dataclass(frozen=True)
class IdleAlert:
    kind: Kind
    host: str
    index: int
    uuid: str
    since: datetime
    utilization_pct: float
    jobs: tuple[int, ...]  # the waiting jobs' count is in `queued`; these hold the GPU
    queued: int

    @property
    def title(self) -> str:
        what = (
            f"with {self.queued} job(s) waiting in the queue"
            if self.kind == "idle_while_queued"
            else f"held by job(s) {', '.join(map(str, self.jobs))} that do not use it"
        )
        return f"GPU {self.index} on {self.host} idle (under its threshold) {what}"


class IdleGpuRule:
    """Readings in, alerts out: each (GPU, kind) told once per spell."""

    def __init__(self, cfg: IdleGpuSettings):
        self.cfg = cfg
        self._since: dict[tuple[str, int, Kind], datetime] = {}
        self._told: set[tuple[str, int, Kind]] = set()

    def observe(self, now: datetime, gpus: Iterable[GpuUse], queued: int) -> list[IdleAlert]:
        out: list[IdleAlert] = []
        seen: set[tuple[str, int, Kind]] = set()
        for g in gpus:
            idle = g.utilization_pct is not None and g.utilization_pct < self.cfg.threshold_pct
            conditions: dict[Kind, bool] = {
                "idle_while_queued": idle and queued > 0 and not g.held_by,
                "held_unused": idle and bool(g.held_by),
            }
            for kind, holds in conditions.items():
                key = (g.host, g.index, kind)
                if not holds:
                    continue
                seen.add(key)
                since = self._since.setdefault(key, now)
                if key in self._told or (now - since).total_seconds() < self.cfg.for_s:
                    continue
                self._told.add(key)
                assert g.utilization_pct is not None
                out.append(
                    IdleAlert(
                        kind=kind,
                        host=g.host,
                        index=g.index,
                        uuid=g.uuid,
                        since=since,
                        utilization_pct=g.utilization_pct,
                        jobs=g.held_by,
                        queued=queued,
                    )
                )
        for key in set(self._since) - seen:  # cleared: may be told again next time
            del self._since[key]
            self._told.discard(key)
        return out


class IdleWatch:
    """The rule on the store's readings, every `every_s` at most; `notify(alert)` hands an
    alert to the channels (None: audited only)."""

    def __init__(
        self,
        store: Store,
        audit: AuditLog,
        settings: Settings,
        *,
        notify: Callable[[IdleAlert], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
        every_s: float = 30.0,
    ):
        self.store, self.audit, self.settings = store, audit, settings
        self.notify, self.clock, self.every_s = notify, clock, every_s
        self.rule = IdleGpuRule(settings.alerts.idle_gpu)
        self._last: datetime | None = None

    def check(self) -> list[IdleAlert]:
        if not self.settings.alerts.idle_gpu.enabled:
            return []
        now = self.clock()
        if self._last is not None and (now - self._last).total_seconds() < self.every_s:
            return []
        self._last = now
        gpus, queued = self.read()
        alerts = self.rule.observe(now, gpus, queued)
        for a in alerts:
            self.audit.append(
                "system",
                "alert.idle_gpu",
                payload={
                    "kind": a.kind,
                    "host": a.host,
                    "gpu": a.index,
                    "uuid": a.uuid,
                    "since": a.since.isoformat(),
                    "utilization_pct": a.utilization_pct,
                    "threshold_pct": self.settings.alerts.idle_gpu.threshold_pct,
                    "for_s": self.settings.alerts.idle_gpu.for_s,
                    "jobs": list(a.jobs),
                    "queued": a.queued,
                },
            )
            if self.notify is not None:
                self.notify(a)
        return alerts

    def read(self) -> tuple[list[GpuUse], int]:
        """The latest readings of this daemon's GPUs, who holds each, and the queue's length."""
        with self.store.engine.connect() as conn:
            rows = latest_gpu_samples(conn, self.settings)
            queued = conn.execute(
                select(func.count()).where(Job.state == JobState.QUEUED.value)  # type: ignore[arg-type]
            ).scalar_one()
            live = conn.execute(
                select(Attempt.job_id, Attempt.gpus, Attempt.node, Attempt.host).where(
                    Attempt.state.in_(LIVE_ATTEMPTS)  # type: ignore[attr-defined]
                )
            ).all()
        holders: dict[tuple[str, int], list[int]] = {}
        for job_id, gpus, node, host in live:
            where = host or node or self.settings.node
            # a gang holds GPUs on each of its hosts ("ray:A/2+ray:B/2", executor.gang_host)
            ranks = [(r.host, r.gpus) for r in gang_ranks(where, list(gpus or []))]
            for on, held_gpus in ranks or [(where, gpus or [])]:
                for g in held_gpus:
                    try:
                        holders.setdefault((on, int(g)), []).append(job_id)
                    except (TypeError, ValueError):
                        continue
        out = []
        for row in rows:
            util = (row.data or {}).get("utilization_pct")
            taken = _ts(row.taken_at)
            if taken is None:
                continue
            host = str(row.host)
            node = self.settings.node if host == "localhost" else host
            held = holders.get((node, row.gpu_index), []) + (
                holders.get(("localhost", row.gpu_index), []) if host == "localhost" else []
            )
            out.append(
                GpuUse(
                    host=host,
                    index=row.gpu_index,
                    uuid=gpu_labels(row)[2],
                    utilization_pct=float(util) if isinstance(util, int | float) else None,
                    taken_at=taken,
                    held_by=tuple(sorted(set(held))),
                )
            )
        return out, int(queued)
