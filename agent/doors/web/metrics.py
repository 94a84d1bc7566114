"""Prometheus metrics of the daemon, served at /metrics on its HTTP app (`prometheus_client`,
a registry of its own per app: no global state).

Read at each scrape from the store, a fixed number of aggregate or bounded queries (GROUP BY,
MIN, SUM, LIMIT), on a read-only connection of its own: a scrape never holds the loop's lock
nor waits on it (SQLite in WAL mode lets a reader read while the loop writes). One scrape reads
at a time; scrapes within `CACHE_S` of the last share its answer, and one that waits past
`metrics.scrape_timeout_s` gets a 503.

GPU readings are those the daemon's health check last recorded (NVML, nvidia-smi or the declared
inventory, as configured): a value the probe could not read has no sample, and neither has a GPU
with no recorded reading. Two histograms live in the process: the loop's tick latency (the loop
reports each tick) and the queue wait of each attempt started since the daemon began (from
submission, or from the previous attempt's end for a retry, to its start).

Names (all `nightshift_`): gpu_utilization_percent, gpu_memory_used_bytes,
gpu_memory_total_bytes, gpu_temperature_celsius, gpu_power_watts, gpu_power_limit_watts,
gpu_health (0 OK, 1 WARNING, 2 UNKNOWN, 3 CRITICAL), gpu_health_verdict{verdict} (1 for the
current verdict), gpu_reading_timestamp_seconds — labelled host, gpu, uuid, bus_id, name;
jobs{state}; queue_oldest_wait_seconds; queue_wait_at_start_seconds (histogram);
loop_tick_seconds (histogram); recoveries_total{cause}; energy_kwh_total;
energy_cost_total{currency}; approvals_pending.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, func, select
from sqlalchemy.orm import aliased

from nightshift.runtime.config import Settings
from nightshift.runtime.gpu.gpu import health_sources
from nightshift.runtime.store.db import (
    Approval,
    Attempt,
    GpuSample,
    Job,
    Store,
    latest_gpu_sample_ids,
    utcnow,
)
from nightshift.runtime.store.lifecycle import JobState

CACHE_S = 1.0
# At most this many newly started attempts are read into the wait histogram per scrape.
LAUNCH_BATCH = 1000
# At most this many newly ended attempts are priced per scrape (the rest at the next).
PRICE_BATCH = 5000
MIB = 1024 * 1024
SEVERITY = {"OK": 0, "WARNING": 1, "UNKNOWN": 2, "CRITICAL": 3}
GPU_LABELS = ["host", "gpu", "uuid", "bus_id", "name"]
# (metric, help, field of the reading, scale)
GPU_VALUES: list[tuple[str, str, str, float]] = [
    ("gpu_utilization_percent", "GPU utilisation at the last health check", "utilization_pct", 1),
    ("gpu_memory_used_bytes", "GPU memory in use at the last health check", "memory_used_mib", MIB),
    ("gpu_memory_total_bytes", "GPU memory in all", "memory_total_mib", MIB),
    ("gpu_temperature_celsius", "GPU temperature at the last health check", "temperature_c", 1),
    ("gpu_power_watts", "GPU power draw at the last health check", "power_w", 1),
    ("gpu_power_limit_watts", "GPU power limit", "power_limit_w", 1),
]
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WAIT_BUCKETS = (10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200)


def _ts(value: Any) -> datetime | None:
    """A datetime from the store (SQLite may hand an aggregate's back as text)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def latest_gpu_samples(conn: Connection, settings: Settings) -> list[Any]:
    """The latest recorded verdict per GPU of this daemon's probe (its source), on its own node
    (and "localhost", from before nodes) — or every host of a Ray cluster's census."""
    ray = settings.executor.kind == "ray"
    latest = latest_gpu_sample_ids(
        node=None if ray else settings.node, sources=health_sources(settings)
    )
    return list(
        conn.execute(
            select(
                GpuSample.host,
                GpuSample.gpu_index,
                GpuSample.uuid,
                GpuSample.verdict,
                GpuSample.data,
                GpuSample.taken_at,
            )
            .where(GpuSample.id.in_(latest))  # type: ignore[union-attr]
            .order_by(GpuSample.host, GpuSample.gpu_index)
        ).all()
    )


def gpu_labels(row: Any) -> list[str]:
    data = row.data or {}
    return [
        str(row.host),
        str(row.gpu_index),
        str(row.uuid or data.get("uuid") or ""),
        str(data.get("pci_bus_id") or ""),
        str(data.get("name") or ""),
    ]


class Metrics:
    """The registry of one app, read from `store` at each scrape. `observe_tick(seconds)` is
    the loop's hook; `cost_of(start, end, kWh)` prices energy (a tariff), None leaves cost out."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        clock: Callable[[], datetime] = utcnow,
        cost_of: Any = None,
        currency: str | None = None,
    ):
        self.store, self.settings, self.clock = store, settings, clock
        self.cost_of, self.currency = cost_of, currency
        self.registry = CollectorRegistry(auto_describe=False)
        self.tick_seconds = Histogram(
            "nightshift_loop_tick_seconds",
            "How long each of the loop's ticks took",
            buckets=TICK_BUCKETS,
            registry=self.registry,
        )
        self.wait_at_start = Histogram(
            "nightshift_queue_wait_at_start_seconds",
            "Each attempt's wait in the queue, from submission (or its previous attempt's end) "
            "to its start; attempts started since the daemon began",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(self))
        self._lock = threading.Lock()
        self._cached: tuple[float, bytes] | None = None
        self._launch_cursor: int | None = None
        self._priced: set[int] = set()  # attempts whose cost is counted
        self._priced_until: datetime | None = None
        self.cost_total = 0.0

    def observe_tick(self, seconds: float) -> None:
        self.tick_seconds.observe(seconds)

    def exposition(self) -> bytes:
        """The text a scrape gets. TimeoutError when another scrape holds the store past
        `metrics.scrape_timeout_s`."""
        if not self._lock.acquire(timeout=self.settings.metrics.scrape_timeout_s):
            raise TimeoutError("another scrape is still reading the store")
        try:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_S:
                return self._cached[1]
            with self.store.engine.connect() as conn:  # the histogram before it is written
                self._launches(conn)
            data = generate_latest(self.registry)
            self._cached = (time.monotonic(), data)
            return data
        finally:
            self._lock.release()

    # ------------------------------------------------------------------------- the store
    def collect(self) -> Iterator[Metric]:
        with self.store.engine.connect() as conn:
            yield from self._gpus(conn)
            yield from self._jobs(conn)
            yield from self._recoveries(conn)
            yield from self._energy(conn)
            pending = conn.execute(
                select(func.count()).where(Approval.state == "pending")  # type: ignore[arg-type]
            ).scalar_one()
            g = GaugeMetricFamily("nightshift_approvals_pending", "Approvals awaiting a decision")
            g.add_metric([], float(pending))
            yield g

    def _gpus(self, conn: Connection) -> Iterator[Metric]:
        rows = latest_gpu_samples(conn, self.settings)
        families = {
            field: (GaugeMetricFamily(f"nightshift_{name}", text, labels=GPU_LABELS), scale)
            for name, text, field, scale in GPU_VALUES
        }
        health = GaugeMetricFamily(
            "nightshift_gpu_health",
            "The last health verdict: 0 OK, 1 WARNING, 2 UNKNOWN, 3 CRITICAL",
            labels=GPU_LABELS,
        )
        verdicts = GaugeMetricFamily(
            "nightshift_gpu_health_verdict",
            "1 for the GPU's last health verdict, 0 for the others",
            labels=[*GPU_LABELS, "verdict"],
        )
        taken = GaugeMetricFamily(
            "nightshift_gpu_reading_timestamp_seconds",
            "When the GPU's last health reading was taken (Unix time)",
            labels=GPU_LABELS,
        )
        for row in rows:
            labels = gpu_labels(row)
            data = row.data or {}
            for field, (family, scale) in families.items():
                value = data.get(field)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    family.add_metric(labels, float(value) * scale)
            if row.verdict in SEVERITY:
                health.add_metric(labels, float(SEVERITY[row.verdict]))
                for verdict in SEVERITY:
                    verdicts.add_metric([*labels, verdict], float(verdict == row.verdict))
            taken_at = _ts(row.taken_at)
            if taken_at is not None:
                taken.add_metric(labels, taken_at.replace(tzinfo=UTC).timestamp())
        for family, _ in families.values():
            yield family
        yield from (health, verdicts, taken)

    def _jobs(self, conn: Connection) -> Iterator[Metric]:
        counts: dict[str, int] = dict(
            conn.execute(select(Job.state, func.count()).group_by(Job.state)).all()  # type: ignore[call-overload]
        )
        jobs = GaugeMetricFamily("nightshift_jobs", "Jobs by state", labels=["state"])
        for state in [*(s.value for s in JobState), *sorted(set(counts) - set(JobState))]:
            jobs.add_metric([state], float(counts.get(state, 0)))
        yield jobs
        queued = select(Job.id).where(Job.state == JobState.QUEUED.value)  # type: ignore[arg-type]
        last_end = (  # the attempts of queued jobs only (job_id is indexed)
            select(Attempt.job_id, func.max(Attempt.ended_at).label("last_end"))
            .where(Attempt.job_id.in_(queued))  # type: ignore[attr-defined]
            .group_by(Attempt.job_id)  # type: ignore[arg-type]
            .subquery()
        )
        since = func.coalesce(last_end.c.last_end, Job.created_at)
        oldest = conn.execute(
            select(func.min(since))
            .select_from(Job)
            .outerjoin(last_end, last_end.c.job_id == Job.id)
            .where(Job.state == JobState.QUEUED.value)  # type: ignore[arg-type]
        ).scalar_one()
        wait = GaugeMetricFamily(
            "nightshift_queue_oldest_wait_seconds",
            "How long the longest-waiting queued job has waited (0: none waits)",
        )
        oldest_at = _ts(oldest)
        wait.add_metric(
            [], max(0.0, (self.clock() - oldest_at).total_seconds()) if oldest_at else 0.0
        )
        yield wait

    def _launches(self, conn: Connection) -> None:
        """Observe the queue wait of each attempt started since the last scrape."""
        if self._launch_cursor is None:  # from the daemon's start on
            self._launch_cursor = conn.execute(select(func.max(Attempt.id))).scalar_one() or 0
            return
        rows = conn.execute(
            select(Attempt.id, Attempt.job_id, Attempt.number, Attempt.started_at, Job.created_at)
            .join(Job, Job.id == Attempt.job_id)  # type: ignore[arg-type]
            .where(Attempt.id > self._launch_cursor)  # type: ignore[operator]
            .order_by(Attempt.id)  # type: ignore[arg-type]
            .limit(LAUNCH_BATCH)
        ).all()
        if not rows:
            return
        prev = aliased(Attempt)
        retried = [(r.job_id, r.number - 1) for r in rows if r.number > 1]
        ended: dict[tuple[int, int], datetime | None] = {}
        if retried:
            for job_id, number, end in conn.execute(
                select(prev.job_id, prev.number, prev.ended_at).where(
                    prev.job_id.in_({j for j, _ in retried})  # type: ignore[attr-defined]
                )
            ).all():
                ended[(job_id, number)] = _ts(end)
        for r in rows:
            since = ended.get((r.job_id, r.number - 1)) if r.number > 1 else None
            since = since or _ts(r.created_at)
            started = _ts(r.started_at)
            if since is not None and started is not None:
                self.wait_at_start.observe(max(0.0, (started - since).total_seconds()))
        self._launch_cursor = rows[-1].id

    def _recoveries(self, conn: Connection) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "nightshift_recoveries",
            "Failed attempts that recovery handled, by the diagnosed cause",
            labels=["cause"],
        )
        for cause, n in conn.execute(
            select(Attempt.cause, func.count())  # type: ignore[call-overload]
            .where(Attempt.cause.is_not(None))  # type: ignore[union-attr]
            .group_by(Attempt.cause)
            .order_by(Attempt.cause)
        ).all():
            c.add_metric([str(cause)], float(n))
        yield c

    def _energy(self, conn: Connection) -> Iterator[Metric]:
        kwh = conn.execute(select(func.sum(Attempt.energy_kwh))).scalar_one() or 0.0
        e = CounterMetricFamily(
            "nightshift_energy_kwh", "Energy of the attempts that have ended so far (kWh)"
        )
        e.add_metric([], float(kwh))
        yield e
        if self.cost_of is None:
            return
        self._price(conn)
        c = CounterMetricFamily(
            "nightshift_energy_cost",
            "Cost of that energy at the configured tariff",
            labels=["currency"],
        )
        c.add_metric([self.currency or ""], self.cost_total)
        yield c

    def _price(self, conn: Connection) -> None:
        """Price the attempts ended since the last scrape (a minute's slack for late commits;
        each attempt once)."""
        q = select(Attempt.id, Attempt.started_at, Attempt.ended_at, Attempt.energy_kwh).where(
            Attempt.energy_kwh.is_not(None),  # type: ignore[union-attr]
            Attempt.ended_at.is_not(None),  # type: ignore[union-attr]
        )
        if self._priced_until is not None:
            q = q.where(Attempt.ended_at >= self._priced_until - timedelta(minutes=1))  # type: ignore[operator]
        rows = conn.execute(q.order_by(Attempt.ended_at).limit(PRICE_BATCH)).all()  # type: ignore[arg-type]
        for r in rows:
            if r.id in self._priced:
                continue
            start, end = _ts(r.started_at), _ts(r.ended_at)
            assert start is not None and end is not None
            cost = float(self.cost_of(start, end, float(r.energy_kwh)))
            self._priced.add(r.id)
            self.cost_total += cost
            self._priced_until = max(self._priced_until or end, end)


class _StoreCollector(Collector):
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.collect()
