"""What the panels show, read without Textual: the GPUs (the probe, judged by the health rules)
and the jobs (the store). Display reads only: no skill runs and nothing is recorded; a GPU
verdict that placement should act on comes from `gpu_health_check` through the gate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlmodel import col, select

from nightshift.agent.doors.job_views import why_of
from nightshift.runtime.training.attempt_diagnosis import Diagnosis

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 16) -> str:
    """The last `width` finite values as block characters, lowest ▁ to highest █."""
    points = [v for v in values if v is not None and math.isfinite(v)][-width:]
    if not points:
        return ""
    lo, hi = min(points), max(points)
    if hi == lo:
        return SPARK[0] * len(points)
    top = len(SPARK) - 1
    return "".join(SPARK[round((v - lo) / (hi - lo) * top)] for v in points)


def downsample(values: list[float], width: int) -> list[float]:
    """At most `width` values, evenly spread over the series, keeping the last."""
    if len(values) <= width:
        return values
    step = len(values) / width
    return [values[min(len(values) - 1, round((i + 1) * step) - 1)] for i in range(width)]


@dataclass(frozen=True)
class GpuRow:
    index: int | None
    name: str
    verdict: str
    util: str
    memory: str
    temp: str
    power: str
    why: str


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    state: str
    attempts: int
    why: str
    metric: str
    spark: str


def _fmt(value: float | int | None, unit: str, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{unit}"


def gpu_rows(w: Wiring) -> tuple[list[GpuRow], str]:
    """Each GPU the configured probe reads, with the health rules' verdict; and a note (the
    backend, or why there are none)."""
    from nightshift.runtime.gpu.gpu import make_probe
    from nightshift.skills.gpu_health import judge_reading

    probe = make_probe(w.settings)
    result = probe.read()
    rows = []
    for g in sorted(result.gpus, key=lambda g: g.index):
        v = judge_reading(g, w.settings.health)
        mem = (
            f"{g.memory_used_mib / 1024:.1f}/{g.memory_total_mib / 1024:.0f}G"
            if g.memory_used_mib is not None and g.memory_total_mib
            else _fmt(g.memory_total_mib and g.memory_total_mib / 1024, "G")
        )
        power = (
            f"{g.power_w:.0f}/{g.power_limit_w:.0f}W"
            if g.power_w is not None and g.power_limit_w is not None
            else _fmt(g.power_w, "W")
        )
        rows.append(
            GpuRow(
                index=g.index,
                name=(g.name or "").removeprefix("NVIDIA ").strip(),
                verdict=v.verdict,
                util=_fmt(g.utilization_pct, "%"),
                memory=mem,
                temp=_fmt(g.temperature_c, "°C"),
                power=power,
                why="; ".join(r.message for r in v.reasons if r.severity != "OK")[:200],
            )
        )
    note = result.error or (f"{result.backend}" if result.gpus else (result.message or "no GPUs"))
    return rows, note


def job_rows(w: Wiring, limit: int = 50, spark_width: int = 12) -> list[JobRow]:
    """The newest jobs with their attempts, why each waits or stopped (a failed one: its
    diagnosis first, as `nightshift jobs` shows it), the last value of the spec's metric and a
    sparkline of it."""
    from nightshift.runtime.store import job_holds
    from nightshift.runtime.store.db import Attempt, Job, MetricPoint

    with w.store.session() as s:
        jobs = list(s.exec(select(Job).order_by(col(Job.id).desc()).limit(limit)))
        ids = [j.id for j in jobs]
        holds = job_holds.of(s, ids)
        latest: dict[int, Attempt] = {}  # the newest attempt of each job: its diagnosis
        counts: dict[int, int] = {}
        for a in s.exec(
            select(Attempt).where(col(Attempt.job_id).in_(ids)).order_by(col(Attempt.number))
        ):
            latest[a.job_id] = a
            counts[a.job_id] = counts.get(a.job_id, 0) + 1
        series: dict[int, list[float]] = {}
        for j in jobs:
            name = ((j.spec or {}).get("metrics") or {}).get("name") or "loss"
            points = s.exec(
                select(MetricPoint.value)
                .where(MetricPoint.job_id == j.id, MetricPoint.name == name)
                .order_by(col(MetricPoint.id).desc())
                .limit(400)
            ).all()
            series[j.id or 0] = [p for p in reversed(points) if p is not None]
    rows = []
    for j in jobs:
        values = series.get(j.id or 0, [])
        last = values[-1] if values else None
        last_attempt = latest.get(j.id or 0)
        diagnosis = Diagnosis.stored(last_attempt.diagnosis) if last_attempt is not None else None
        why = why_of(j.state, j.reason, holds.get(j.id or 0), diagnosis) or ""
        rows.append(
            JobRow(
                id=j.id or 0,
                name=j.name,
                state=j.state,
                attempts=counts.get(j.id, 0),
                why=why,
                metric="-" if last is None else f"{last:.4g}",
                spark=sparkline(
                    downsample([v for v in values if math.isfinite(v)], spark_width), spark_width
                ),
            )
        )
    return rows
