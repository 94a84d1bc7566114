"""list_jobs: what is queued, running and finished, with attempts."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, field_validator

from nightshift.runtime.training.attempt_diagnosis import Diagnosis
from nightshift.skills.base import SkillContext, skill


class ListJobsInput(BaseModel):
    states: list[str] | None = Field(
        None, description="Only jobs in these states, e.g. ['running']"
    )
    limit: int = Field(50, ge=1, le=10_000)


class AttemptSummary(BaseModel):
    number: int
    state: str
    outcome: str | None
    exit_code: int | None
    signal: int | None
    start_step: int
    last_step: int | None
    last_loss: float | None
    started_at: datetime
    ended_at: datetime | None
    diagnosis: Diagnosis | None = Field(
        None,
        description="Why it failed (category, evidence line, summary, recommended action), "
        "diagnosed as it ended; None: it did not fail, or it ended before diagnoses were kept",
    )

    @field_validator("diagnosis", mode="before")
    @classmethod
    def _stored(cls, raw: object) -> Diagnosis | None:
        """A row's stored diagnosis; one that does not parse is none, not a broken listing."""
        return raw if isinstance(raw, Diagnosis) else Diagnosis.stored(raw)


class JobSummary(BaseModel):
    id: int
    name: str
    state: str
    priority: int
    owner: str
    params: dict
    reason: str | None
    hold_reason: str | None = Field(None, description="Why a queued job waits")
    cost_class: str | None = None
    group: str | None = Field(None, description="The sweep it belongs to")
    attempts: list[AttemptSummary]


class ListJobsResult(BaseModel):
    jobs: list[JobSummary]


@skill("list_jobs", capability="read")
def list_jobs(ctx: SkillContext, inp: ListJobsInput) -> ListJobsResult:
    """List jobs (newest first) with their state, parameters, why they stopped, and every attempt
    with its exit code, the steps it covered and, for a failed one, its diagnosis."""
    # Imported here: a client of the daemon parses this module's result models, without the ORM.
    from sqlmodel import select

    from nightshift.runtime.store import job_holds
    from nightshift.runtime.store.db import Attempt, Job

    with ctx.store.session() as s:
        q = select(Job).order_by(Job.id.desc()).limit(inp.limit)
        if inp.states:
            q = q.where(Job.state.in_(inp.states))
        jobs = list(s.exec(q))
        ids = [j.id for j in jobs]
        holds = job_holds.of(s, ids)
        attempts: dict[int, list[Attempt]] = {}
        for a in s.exec(select(Attempt).where(Attempt.job_id.in_(ids)).order_by(Attempt.number)):
            attempts.setdefault(a.job_id, []).append(a)
    return ListJobsResult(
        jobs=[
            JobSummary(
                id=j.id,
                name=j.name,
                state=j.state,
                priority=j.priority,
                owner=j.owner,
                params=j.params,
                reason=j.reason,
                hold_reason=holds.get(j.id),
                cost_class=j.spec.get("cost_class"),
                group=j.group,
                attempts=[
                    AttemptSummary.model_validate(a, from_attributes=True)
                    for a in attempts.get(j.id, [])
                ],
            )
            for j in jobs
        ]
    )
