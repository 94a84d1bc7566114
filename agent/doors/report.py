"""The morning report: what ran overnight, what broke and why, what was recovered, and what it
cost in GPU-hours, kWh and money. Computed from the store only."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from sqlmodel import col, func, select

from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.store import job_holds
from nightshift.runtime.store.db import Attempt, AuditEvent, Job, MetricPoint, Store

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring


class JobLine(BaseModel):
    id: int
    name: str
    state: str
    attempts: int
    reason: str | None
    final_metric: float | None
    metric: str


class Report(BaseModel):
    since: datetime
    until: datetime
    jobs: list[JobLine]
    states: dict[str, int]
    attempts: int
    failures_by_cause: dict[str, int]
    recoveries: int
    gpu_hours: float
    cpu_hours: float
    energy_kwh: float | None = Field(
        None, description="None when no attempt had a meter or a declared draw"
    )
    energy_cost: float | None = None
    currency: str | None = None
    kept_checkpoint_bytes: int = Field(
        0,
        description="Disk taken by nightshift's own copies of "
        "good checkpoints (runs/job-N/good-checkpoints/) of these jobs",
    )


def metric_name(spec: dict[str, Any]) -> str:
    """The metric a job's spec names: read from the stored spec (validated when it was
    submitted), the default where it names none (one odd row does not stop a report; validating
    a thousand specs again took half a second)."""
    name = (spec.get("metrics") or {}).get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) and name else str(MetricSpec.model_fields["name"].default)


def build_report(
    store: Store,
    since: datetime,
    until: datetime,
    cost_of: Any = None,
    currency: str | None = None,
    kept_bytes_of: Any = None,
) -> Report:
    """`cost_of(start, end, kwh)` prices an attempt's energy (a tariff); None leaves cost out.
    `kept_bytes_of(job)` is the disk its kept good checkpoints take (the only figure read from
    disk, not the store)."""
    with store.session() as s:
        atts = list(
            s.exec(
                select(Attempt).where(
                    Attempt.started_at < until,
                    (Attempt.ended_at.is_(None)) | (Attempt.ended_at >= since),
                )
            )
        )
        job_ids = sorted(
            {a.job_id for a in atts}
            | {
                j.id
                for j in s.exec(select(Job).where(Job.created_at >= since, Job.created_at < until))
            }
        )
        jobs = {j.id: j for j in s.exec(select(Job).where(Job.id.in_(job_ids)))}
        holds = job_holds.of(s, job_ids)
        recoveries = len(
            list(
                s.exec(
                    select(AuditEvent.id).where(
                        AuditEvent.action == "skill.result",
                        AuditEvent.skill == "resume_job",
                        AuditEvent.ts >= since.isoformat(),
                    )
                )
            )
        )
        metric = {jid: metric_name(job.spec) for jid, job in jobs.items()}
        newest = (
            select(func.max(MetricPoint.id))
            .where(col(MetricPoint.job_id).in_(job_ids))
            .group_by(MetricPoint.job_id, MetricPoint.name)
        )
        finals: dict[int, float | None] = dict.fromkeys(jobs)
        for jid, name, value in s.exec(
            select(MetricPoint.job_id, MetricPoint.name, MetricPoint.value).where(
                col(MetricPoint.id).in_(newest)
            )
        ):
            if name == metric.get(jid):
                finals[jid] = value
    per_job = Counter(a.job_id for a in atts)
    causes = Counter(
        (a.cause or a.outcome or "unknown")
        for a in atts
        if a.outcome not in (None, "succeeded", "early_stopped")
    )
    gpu_h = cpu_h = 0.0
    kwh: float | None = None
    cost: float | None = None
    for a in atts:
        hours = ((a.ended_at or until) - max(a.started_at, since)).total_seconds() / 3600
        if a.gpus:
            gpu_h += hours * len(a.gpus)
        else:
            cpu_h += hours
        if a.energy_kwh is not None:
            kwh = (kwh or 0.0) + a.energy_kwh
            if cost_of is not None:
                cost = (cost or 0.0) + cost_of(a.started_at, a.ended_at or until, a.energy_kwh)
    lines = [
        JobLine(
            id=j.id,
            name=j.name,
            state=j.state,
            attempts=per_job.get(j.id, 0),
            reason=j.reason if j.state != "queued" else holds.get(j.id),
            final_metric=finals[j.id],
            metric=metric[j.id],
        )
        for j in (jobs[i] for i in job_ids)
    ]
    return Report(
        since=since,
        until=until,
        jobs=lines,
        states=dict(Counter(j.state for j in lines)),
        attempts=len(atts),
        failures_by_cause=dict(causes),
        recoveries=recoveries,
        gpu_hours=round(gpu_h, 4),
        cpu_hours=round(cpu_h, 4),
        energy_kwh=kwh,
        energy_cost=cost,
        currency=currency if cost is not None else None,
        kept_checkpoint_bytes=sum(kept_bytes_of(j) for j in jobs.values()) if kept_bytes_of else 0,
    )


def report_of(w: Wiring, since: datetime, until: datetime) -> Report:
    """The report of this installation: its store, its tariff's prices, the disk its kept
    checkpoints take."""
    from nightshift.runtime.engine import job_workspace
    from nightshift.runtime.training import keeper

    cost_of, currency = w.energy_pricing()
    return build_report(
        w.store,
        since,
        until,
        cost_of,
        currency,
        kept_bytes_of=lambda job: sum(
            k["bytes"] for k in keeper.kept(job_workspace(w.settings, job.id))
        ),
    )


def to_markdown(r: Report, plot_name: str | None = None) -> str:
    out = [f"# nightshift report {r.since:%Y-%m-%d %H:%M} – {r.until:%Y-%m-%d %H:%M} UTC", ""]
    states = ", ".join(f"{n} {k}" for k, n in sorted(r.states.items())) or "none"
    out += [
        f"- jobs: {len(r.jobs)} ({states})",
        f"- attempts: {r.attempts}",
        f"- recoveries (resumes through the policy gate): {r.recoveries}",
        f"- GPU-hours: {r.gpu_hours:.2f} · CPU-hours: {r.cpu_hours:.2f}",
        "- energy: "
        + (
            "not measured (no meter, no declared power)"
            if r.energy_kwh is None
            else f"{r.energy_kwh:.3f} kWh"
            + (f" · cost {r.energy_cost:.2f} {r.currency}" if r.energy_cost is not None else "")
        ),
        f"- disk: {r.kept_checkpoint_bytes / 2**20:.1f} MiB in kept good checkpoints",
        "",
    ]
    if r.failures_by_cause:
        out += ["## Failures by cause", "", "| cause | attempts |", "| --- | --- |"]
        out += [
            f"| {c} | {n} |" for c, n in sorted(r.failures_by_cause.items(), key=lambda x: -x[1])
        ]
        out.append("")
    out += [
        "## Jobs",
        "",
        "| id | name | state | attempts | final metric | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for j in r.jobs:
        m = "-" if j.final_metric is None else f"{j.metric} {j.final_metric:.4g}"
        out.append(f"| {j.id} | {j.name} | {j.state} | {j.attempts} | {m} | {j.reason or ''} |")
    if plot_name:
        out += ["", f"![metric per job]({plot_name})"]
    return "\n".join(out) + "\n"


def summary_lines(r: Report) -> list[str]:
    """The report's headline figures, one per line (the morning report a channel posts)."""
    head = to_markdown(r).split("## Jobs")[0]
    lines = [x.removeprefix("- ") for x in head.splitlines()[1:] if x.startswith("- ")]
    failed = [j for j in r.jobs if j.state == "failed"]
    lines += [f"failed: job {j.id} {j.name}: {j.reason or 'no reason recorded'}" for j in failed]
    return lines


def plot_metrics(store: Store, job_ids: list[int], path: Path) -> bool:
    """Each job's metric over steps, one line per attempt so resumes show; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    with store.session() as s:
        for jid in job_ids:
            job = s.get(Job, jid)
            name = metric_name(job.spec)
            pts = s.exec(
                select(MetricPoint)
                .where(MetricPoint.job_id == jid, MetricPoint.name == name)
                .order_by(MetricPoint.id)
            ).all()
            by_attempt: dict[int, list[MetricPoint]] = {}
            for p in pts:
                by_attempt.setdefault(p.attempt_id, []).append(p)
            for i, (_, ps) in enumerate(sorted(by_attempt.items())):
                ax.plot(
                    [p.step for p in ps],
                    [p.value for p in ps],
                    lw=1,
                    label=f"job {jid} {job.name}"
                    + (f" (attempt {i + 1})" if len(by_attempt) > 1 else ""),
                )
    ax.set_xlabel("step")
    ax.set_ylabel("metric")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("metric per job; a new line where a run resumed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def default_window(now: datetime, hours: float) -> tuple[datetime, datetime]:
    return now - timedelta(hours=hours), now
