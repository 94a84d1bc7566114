"""retry_job: one more attempt of a failed job, even after its retries ran out or the recover
playbook gave up on it (`nightshift retry JOB`)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import func, select

from nightshift.runtime.errors import SkillFailed, UnknownJob
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, Job, KeyValue
from nightshift.runtime.store.lifecycle import JobState
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

# The store's KeyValue rows that make a call idempotent: one per call id that requeued a job.
DONE_KEY = "retry_job:{call_id}"

# Why each state is refused, and what to do instead.
REFUSED = {
    "queued": "it is already queued for another attempt; `nightshift jobs` says why it waits",
    "running": "it is running now; wait for it to end, or `nightshift cancel {id}`",
    "paused": "it is paused at a checkpoint and the recover playbook resumes it "
    "(`nightshift run --recover {id}` to do that now)",
    "held": "a person holds it; `nightshift release {id}` lets it run again",
    "succeeded": "it succeeded; submit its spec again for another run",
    # Cancelling is for good, decided as a `destroy` call that a second person approved. A retry is
    # a `launch`, which needs no approval and which the agent may plan itself: letting it revive a
    # cancelled job would undo that decision without asking anyone.
    "cancelled": "it was cancelled, which is for good; submit its spec again "
    "(`nightshift submit SPEC`) to run it anew",
}


class RetryJobInput(SkillInput):
    job_id: int = Field(description="The failed job to run once more")
    from_scratch: bool = Field(
        False, description="Start again from step 0 instead of the job's recorded resume point"
    )

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


class RetryJobResult(BaseModel):
    """What the retry changed; the audit records it with the call."""

    job_id: int
    before: str = Field(description="The job's state before the call (failed)")
    after: str = Field(description="Its state after: queued")
    reason_before: str | None = Field(description="Why the job had stopped")
    attempts: int = Field(description="Attempts the job has had so far")
    max_attempts_before: int
    max_attempts_after: int = Field(
        description="Raised by one when the retries were used up, so "
        "that the new attempt is within the job's limit"
    )
    resume_from_before: str | None
    resume_step_before: int | None
    resume_from: str | None = Field(
        description="The checkpoint the new attempt resumes from; None: from scratch"
    )
    resume_step: int | None
    already_done: bool = Field(False, description="True when this call id had already requeued it")


@skill("retry_job", capability="launch")
def retry_job(ctx: SkillContext, inp: RetryJobInput) -> RetryJobResult:
    """Force one more attempt of a failed job, even when its retries are exhausted or the recover
    playbook stopped ("failed twice the same way"): raises the job's max_attempts by one if needed
    and requeues it from the resume point it has recorded (job.resume_from and resume_step as they
    stand; from_scratch=true starts at step 0), with the same parameters. To change parameters or
    pick a newer checkpoint, use auto_resume and resume_job instead. Only failed jobs are retried:
    a cancelled job stays cancelled (submit its spec again). The same call id never requeues twice.
    It starts as soon as there is room: the retry backoff is for the loop's own retries."""
    key = DONE_KEY.format(call_id=ctx.call_id) if ctx.call_id else None
    with ctx.store.write_session() as s:
        done = s.get(KeyValue, key) if key else None
        if done is not None:  # this very call already ran (a node re-run after a crash)
            return RetryJobResult.model_validate_json(done.value).model_copy(
                update={"already_done": True}
            )
        job = s.get(Job, inp.job_id)
        if job is None:
            raise UnknownJob(f"no job {inp.job_id}; list_jobs shows the jobs")
        if job.state != "failed":
            why = REFUSED.get(job.state, "only failed jobs are retried").format(id=job.id)
            raise SkillFailed(f"job {job.id} is {job.state}, not failed: {why}")
        attempts = s.exec(
            select(func.count()).select_from(Attempt).where(Attempt.job_id == job.id)
        ).one()
        result = RetryJobResult(
            job_id=job.id,
            before=job.state,
            after="queued",
            reason_before=job.reason,
            attempts=attempts,
            max_attempts_before=job.max_attempts,
            max_attempts_after=max(job.max_attempts, attempts + 1),
            resume_from_before=job.resume_from,
            resume_step_before=job.resume_step,
            resume_from=None if inp.from_scratch else job.resume_from,
            resume_step=None if inp.from_scratch else job.resume_step,
        )
        job.max_attempts = result.max_attempts_after
        job.resume_from, job.resume_step = result.resume_from, result.resume_step
        lifecycle.move_job(
            s,
            job,
            JobState.QUEUED,
            ctx.now,
            reason=f"{lifecycle.RETRY_ASKED}{ctx.principal}",
            by=ctx.principal,
        )
        if key:
            s.add(KeyValue(key=key, value=result.model_dump_json()))
        return result
