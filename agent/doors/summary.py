"""What a goal run achieved, computed from the store: final metric, attempts, steps lost, time."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from rich.console import Group
from rich.text import Text
from sqlmodel import col, select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.console import key_values
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store.db import Attempt, Job, MetricPoint, PlannedCall


class JobOutcome(BaseModel):
    job_id: int
    name: str
    state: str
    attempts: int
    steps_lost: int
    resumed_from_steps: list[int]
    final_step: int | None
    metric: str
    final_metric: float | None
    reason: str | None


def job_outcome(w: Wiring, job_id: int) -> JobOutcome:
    with w.store.session() as s:
        job = s.get(Job, job_id)
        atts = list(
            s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))
        )
        metric = ExperimentSpec.model_validate(job.spec).metrics.name
        last = s.exec(
            select(MetricPoint)
            .where(MetricPoint.job_id == job_id, MetricPoint.name == metric)
            .order_by(MetricPoint.id.desc())
        ).first()
    lost = 0
    for before, after in zip(atts, atts[1:], strict=False):
        if before.last_step is not None:
            lost += max(0, before.last_step - after.start_step)
    return JobOutcome(
        job_id=job.id,
        name=job.name,
        state=job.state,
        attempts=len(atts),
        steps_lost=lost,
        resumed_from_steps=[a.start_step for a in atts[1:]],
        final_step=atts[-1].last_step if atts else None,
        metric=metric,
        final_metric=last.value if last else None,
        reason=job.reason,
    )


def thread_jobs(w: Wiring, thread: str) -> list[int]:
    """Jobs this goal run owns: those its launch calls (submit, resume, retry) queued. Without a
    daemon the run's own loop places these and no others, and waits for them, so a job a goal
    only cancels, watches or reads is never started by it."""
    from nightshift.skills.registry import registry

    skills = registry()
    return _jobs(
        w,
        thread,
        ("done",),
        lambda call: call.skill in skills and skills[call.skill].capability == "launch",
    )


def touched_jobs(w: Wiring, thread: str) -> list[int]:
    """Jobs this goal run submitted or named: those of its calls done or under way (a call
    refused or failed, say one naming a job that does not exist, touched none)."""
    return _jobs(w, thread, ("done", "planned"), lambda call: True)


def _jobs(w: Wiring, thread: str, states: tuple[str, ...], keep: Any) -> list[int]:
    ids: list[int] = []
    with w.store.session() as s:
        for call in s.exec(
            select(PlannedCall)
            .where(PlannedCall.thread_id == thread, col(PlannedCall.state).in_(states))
            .order_by(PlannedCall.created_at)
        ):
            if not keep(call):
                continue
            result = call.result or {}
            found: list[Any] = (
                [result.get("job_id")]
                if call.skill in ("submit_job", "reproduce_job")
                else [j.get("job_id") for j in result.get("jobs") or [] if isinstance(j, dict)]
                if call.skill == "submit_jobs"
                else [call.args.get("job_id")]
            )
            for jid in found:
                if isinstance(jid, int) and jid not in ids and s.get(Job, jid) is not None:
                    ids.append(jid)
    return ids


def run_summary(w: Wiring, thread: str, wall_s: float) -> Group:
    """One key/value table per job the goal touched, then the wall time (names, reasons and
    metric names are the job's: shown literally)."""
    parts: list[Any] = []
    for o in (job_outcome(w, j) for j in touched_jobs(w, thread)):
        state = o.state + (f" ({o.reason})" if o.reason and o.state != "succeeded" else "")
        final = "-" if o.final_metric is None else f"{o.final_metric:.4f}"
        rows = [
            ("state", state),
            ("attempts", o.attempts),
            ("resumed from step", ", ".join(map(str, o.resumed_from_steps)) or "-"),
            ("steps lost to failures", o.steps_lost),
            ("final step", "-" if o.final_step is None else str(o.final_step)),
            (f"final {o.metric}", final),
        ]
        parts.append(key_values(f"job {o.job_id} · {o.name}", rows))
    parts.append(Text(f"wall time {wall_s:.1f} s · thread {thread}"))
    return Group(*parts)
