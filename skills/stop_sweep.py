"""stop_sweep: no new trials for a sweep; the trials already queued or running finish and are
told, then the sweep ends `done` with who stopped it (runtime/scheduling/sweeps.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import select

from nightshift.runtime.errors import BadArguments
from nightshift.runtime.scheduling.sweeps import Budget
from nightshift.runtime.store.db import Job, Sweep
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill


class StopSweepInput(SkillInput):
    name: str = Field(max_length=200, description="The sweep (`nightshift report --sweep`)")
    reason: str = Field("", max_length=500, description="Why; recorded on the sweep")

    def claims(self) -> Claims:
        return Claims()  # it starts, changes and ends no job: its trials run on as they are


class StopSweepResult(BaseModel):
    name: str
    before: str
    after: str
    trials_left: int = Field(description="Its trials still queued or running: they finish")


@skill("stop_sweep", capability="modify", store_only=True)
def stop_sweep(ctx: SkillContext, inp: StopSweepInput) -> StopSweepResult:
    """Stop a sweep from asking for new trials. Trials already queued or running are not
    touched (cancel_job ends one); when the last one ends the sweep is done, its best trial
    kept. Stopping a sweep that already ended changes nothing."""
    with ctx.store.session() as s:
        row = s.exec(select(Sweep).where(Sweep.name == inp.name)).first()
        if row is None:
            raise BadArguments(
                f"stop_sweep: no sweep named {inp.name!r}; `nightshift report --sweep NAME` "
                "names the known ones"
            )
        left = len(
            s.exec(
                select(Job.id).where(Job.group == row.name, Job.state.in_(("queued", "running")))
            ).all()
        )
        if row.state != "running":
            return StopSweepResult(
                name=row.name, before=row.state, after=row.state, trials_left=left
            )
        budget = Budget.model_validate(row.budget)
        if budget.stopped is None:
            why = f"stopped by {ctx.principal}" + (f": {inp.reason}" if inp.reason else "")
            row.budget = budget.model_copy(update={"stopped": why}).model_dump(mode="json")
            row.updated_at = ctx.now
            s.add(row)
    return StopSweepResult(name=inp.name, before="running", after="stopping", trials_left=left)
