"""resume_job: requeue a failed job from a checkpoint, optionally with changed parameters."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Job
from nightshift.runtime.store.lifecycle import JobState
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill


class ResumeJobInput(SkillInput):
    job_id: int
    checkpoint: str | None = Field(
        None, description="Checkpoint path to resume from; None restarts from scratch"
    )
    step: int | None = Field(None, description="Step of that checkpoint")
    param_changes: dict[str, Any] = Field(
        default_factory=dict, description="New values for existing parameters, e.g. {'lr': 0.005}"
    )

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


class ResumeJobResult(BaseModel):
    job_id: int
    before: str
    after: str
    resume_from: str | None
    resume_step: int | None
    params_before: dict[str, Any]
    params_after: dict[str, Any]


@skill("resume_job", capability="launch")
def resume_job(ctx: SkillContext, inp: ResumeJobInput) -> ResumeJobResult:
    """Put a failed (or paused) job back in the queue to resume from the given checkpoint, applying
    parameter changes (before and after values are recorded). The scheduler starts the new attempt."""
    with ctx.store.write_session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise SkillFailed(f"no job {inp.job_id}")
        wanted = {**job.params, **inp.param_changes}
        if (
            job.state in ("queued", "running")
            and job.resume_from == inp.checkpoint
            and job.params == wanted
        ):
            # Already done by this same decision (a node re-run after a crash): do not act twice.
            return ResumeJobResult(
                job_id=job.id,
                before=job.state,
                after=job.state,
                resume_from=job.resume_from,
                resume_step=job.resume_step,
                params_before=dict(job.params),
                params_after=dict(job.params),
            )
        if job.state == JobState.HELD:
            raise SkillFailed(
                f"job {job.id} is held by a person ({job.reason}); `nightshift release "
                f"{job.id}` (release_job) lets it run again"
            )
        if job.state not in (JobState.FAILED, JobState.PAUSED):
            raise SkillFailed(f"job {job.id} is {job.state}; only failed or paused jobs resume")
        unknown = set(inp.param_changes) - set(job.params)
        if unknown:
            raise SkillFailed(f"param_changes {sorted(unknown)} are not parameters of job {job.id}")
        before, params_before = job.state, dict(job.params)
        job.params = {**job.params, **inp.param_changes}
        job.resume_from, job.resume_step = inp.checkpoint, inp.step
        lifecycle.move_job(s, job, JobState.QUEUED, ctx.now, by=ctx.principal)
        return ResumeJobResult(
            job_id=job.id,
            before=before,
            after="queued",
            resume_from=inp.checkpoint,
            resume_step=inp.step,
            params_before=params_before,
            params_after=dict(job.params),
        )
