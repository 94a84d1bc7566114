"""pause_job: stop a running job at its last checkpoint, to resume it later (nothing is lost but
the steps since that checkpoint)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import select

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import Attempt, Job
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill
from nightshift.skills.live_runs import stop_attempt


class PauseJobInput(SkillInput):
    job_id: int
    reason: str = Field("paused", description="Why; recorded on the job (e.g. preempted for job 7)")

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
    """Pause a running job whose spec allows it: its run is stopped (SIGTERM, then SIGKILL after
    the grace period) and the job waits as `paused` until it is resumed from its newest valid
    checkpoint. Used to preempt low-priority work; a job that is not running is left as it is."""
    with ctx.store.session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise SkillFailed(f"no job {inp.job_id}")
        if job.state != "running":
            return PauseJobResult(
                job_id=job.id,
                before=job.state,
                after=job.state,
                stopped_attempt=None,
                last_step=None,
            )
        spec = ExperimentSpec.model_validate(job.spec)
        if not spec.pausable or spec.checkpoint is None:
            raise SkillFailed(
                f"job {job.id} cannot be paused: its spec has pausable={spec.pausable}"
                f" and {'a' if spec.checkpoint else 'no'} checkpoint section"
            )
        live = s.exec(
            select(Attempt).where(Attempt.job_id == job.id, Attempt.state == "running")
        ).first()
        job.state, job.reason, job.updated_at = "paused", inp.reason, ctx.now
        s.add(job)
    if live is None:
        return PauseJobResult(
            job_id=inp.job_id,
            before="running",
            after="paused",
            stopped_attempt=None,
            last_step=None,
        )
    return PauseJobResult(
        job_id=inp.job_id,
        before="running",
        after="paused",
        stopped_attempt=stop_attempt(ctx, live, "preempted"),
        last_step=live.last_step,
    )
