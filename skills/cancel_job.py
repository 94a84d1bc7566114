"""cancel_job: end a job for good; a running attempt is stopped without a checkpoint."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import col, select

from nightshift.runtime.errors import UnknownJob
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, Job
from nightshift.runtime.store.lifecycle import JobState
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill
from nightshift.skills.live_runs import stop_attempt


class CancelJobInput(SkillInput):
    job_id: int = Field(description="The job to cancel")
    reason: str = Field("cancelled", description="Why; recorded on the job")

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


class CancelJobResult(BaseModel):
    job_id: int
    before: str
    after: str
    stopped_attempt: int | None = None


@skill("cancel_job", capability="destroy")
def cancel_job(ctx: SkillContext, inp: CancelJobInput) -> CancelJobResult:
    """Cancel a job for good — queued, running, paused, held or failed: a running attempt is
    stopped (SIGTERM, then SIGKILL after the grace period) and the job never runs again.
    Cancelling a finished job changes nothing."""
    with ctx.store.write_session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise UnknownJob(f"no job {inp.job_id}; `nightshift status` lists jobs")
        before = job.state
        if not lifecycle.can_move(before, JobState.CANCELLED):
            return CancelJobResult(job_id=job.id, before=before, after=before)
        lifecycle.move_job(s, job, JobState.CANCELLED, ctx.now, reason=inp.reason, by=ctx.principal)
        live = s.exec(
            select(Attempt).where(
                Attempt.job_id == job.id, col(Attempt.state).in_(("starting", "running"))
            )
        ).first()
    stopped = stop_attempt(ctx, live) if live is not None else None
    return CancelJobResult(
        job_id=inp.job_id, before=before, after="cancelled", stopped_attempt=stopped
    )
