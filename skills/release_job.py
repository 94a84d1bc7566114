"""release_job: let a job that a person held run again (the end of `nightshift hold`)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import col, select

from nightshift.runtime.errors import SkillFailed, UnknownJob
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, Job
from nightshift.runtime.store.lifecycle import JobState, Outcome
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill


class ReleaseJobInput(SkillInput):
    job_id: int = Field(description="The held job to let run again")

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


class ReleaseJobResult(BaseModel):
    job_id: int
    before: str
    after: str = Field(
        description="queued (it waits for a slot), or paused when its run was stopped by the "
        "hold: recovery then resumes it from its newest checkpoint"
    )


@skill("release_job", capability="modify")
def release_job(ctx: SkillContext, inp: ReleaseJobInput) -> ReleaseJobResult:
    """Release a held job: one whose run the hold stopped becomes `paused`, and recovery resumes
    it from its newest valid checkpoint; one held before it ran (again) is queued. Costs no
    retry. Releasing a job that is not held changes nothing."""
    with ctx.store.write_session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise UnknownJob(f"no job {inp.job_id}; `nightshift jobs` lists the jobs")
        if job.state != JobState.HELD:
            if job.state in (JobState.QUEUED, JobState.RUNNING, JobState.PAUSED):
                return ReleaseJobResult(job_id=job.id, before=job.state, after=job.state)
            raise SkillFailed(f"job {job.id} is {job.state}, not held; nothing to release")
        last = s.exec(
            select(Attempt.outcome)
            .where(Attempt.job_id == job.id)
            .order_by(col(Attempt.number).desc())
        ).first()
        after = JobState.PAUSED if last == Outcome.HELD else JobState.QUEUED
        lifecycle.move_job(
            s, job, after, ctx.now, reason=f"released by {ctx.principal}", by=ctx.principal
        )
        return ReleaseJobResult(job_id=job.id, before=JobState.HELD.value, after=after.value)
