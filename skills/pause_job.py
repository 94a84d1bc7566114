"""pause_job: stop a job at its last checkpoint and keep it back — a person's hold that only
release_job ends, or the loop's preemption that recovery resumes when there is room."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import col, select

from nightshift.runtime.errors import SkillFailed, UnknownJob
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, Job
from nightshift.runtime.store.lifecycle import JobState
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill
from nightshift.skills.live_runs import stop_attempt


class PauseJobInput(SkillInput):
    job_id: int
    reason: str = Field("paused", description="Why; recorded on the job")
    preempted_for: int | None = Field(
        None,
        description="Set by the scheduler only: the job this one makes room for. Then the job "
        "is `paused` and resumed when there is room; without it the job is `held` until a "
        "person releases it (release_job)",
    )

    def claims(self) -> Claims:
        return Claims(jobs=[self.job_id])


class PauseJobResult(BaseModel):
    job_id: int
    before: str
    after: str
    stopped_attempt: int | None
    last_step: int | None


@skill("pause_job", capability="modify")
def pause_job(ctx: SkillContext, inp: PauseJobInput) -> PauseJobResult:
    """Hold a job: a running one is stopped at its newest checkpoint (SIGTERM, then SIGKILL after
    the grace period; its spec must allow pausing), a queued or paused one is kept from starting.
    The job stays `held` — recovery never touches it and it costs no retry — until release_job.
    With preempted_for (the scheduler's preemption), a running job becomes `paused` instead and
    is resumed from its checkpoint when there is room. A finished job is left as it is."""
    after = JobState.PAUSED if inp.preempted_for is not None else JobState.HELD
    with ctx.store.write_session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise UnknownJob(f"no job {inp.job_id}; `nightshift jobs` lists the jobs")
        before = job.state
        if not lifecycle.can_move(before, after) or (
            after is JobState.PAUSED and before != JobState.RUNNING
        ):
            return PauseJobResult(
                job_id=job.id, before=before, after=before, stopped_attempt=None, last_step=None
            )
        if before == JobState.RUNNING:
            spec = ExperimentSpec.model_validate(job.spec)
            if not spec.pausable or spec.checkpoint is None:
                why = (
                    "its spec says pausable: false"
                    if not spec.pausable
                    else "it has no checkpoint to stop at (its spec has no checkpoint section; "
                    "a plain command has none), so stopping it now would lose its work"
                )
                raise SkillFailed(
                    f"job {job.id} is running and cannot be held: {why}. Let it finish, end it "
                    f"with `nightshift cancel {job.id}`, or give its spec a checkpoint section "
                    "next time; a queued job can always be held"
                )
        live = s.exec(
            select(Attempt).where(
                Attempt.job_id == job.id,
                col(Attempt.state).in_(("starting", "running")),
            )
        ).first()
        lifecycle.move_job(
            s, job, after, ctx.now, reason=_why(inp, ctx.principal), by=ctx.principal
        )
    stopped = stop_attempt(ctx, live) if live is not None else None
    return PauseJobResult(
        job_id=inp.job_id,
        before=before,
        after=after.value,
        stopped_attempt=stopped,
        last_step=live.last_step if live is not None else None,
    )


def _why(inp: PauseJobInput, principal: str) -> str:
    if inp.preempted_for is not None:
        return inp.reason
    return f"held by {principal}" + (f": {inp.reason}" if inp.reason != "paused" else "")
