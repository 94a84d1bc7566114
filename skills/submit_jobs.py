"""submit_jobs: queue many experiments as one decision (a sweep's trials, a night's batch)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import select

from nightshift.runtime.store.db import Job
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill
from nightshift.skills.submit_job import (
    SubmitJobInput,
    SubmitJobResult,
    build_job,
    check_no_cycle,
    insert_jobs,
    job_result,
    job_row,
    spec_launch,
)


class SubmitJobsInput(SkillInput):
    items: list[SubmitJobInput] = Field(
        min_length=1, max_length=10_000, description="One submit_job argument set per job"
    )

    def files(self) -> dict[str, str]:
        return {path: digest for item in self.items for path, digest in item.files().items()}

    def claims(self) -> Claims:
        launches = []
        for i, item in enumerate(self.items):
            spec, path = item.loaded()
            launches.append(spec_launch(spec, f"items[{i}]" + (f" ({path})" if path else "")))
        return Claims(launches=launches)


class SubmitJobsResult(BaseModel):
    jobs: list[SubmitJobResult]


@skill("submit_jobs", capability="launch", store_only=True)
def submit_jobs(ctx: SkillContext, inp: SubmitJobsInput) -> SubmitJobsResult:
    """Queue several experiments at once, all or none: every item is validated before any job is
    stored, then all are stored in one transaction. The policy checks every item's limits. The
    same call id never queues them twice."""
    checked: set[str] = set()
    built = [
        build_job(ctx, item, f"{ctx.call_id}#{i}" if ctx.call_id else None, checked)
        for i, item in enumerate(inp.items)
    ]
    rows = [job_row(job) for job, _ in built]
    with ctx.store.session() as s:
        if ctx.call_id:
            keys = [job.submitted_by_call for job, _ in built]
            existing = {
                j.submitted_by_call: j
                for j in s.exec(select(Job).where(Job.submitted_by_call.in_(keys)))
            }
            if existing:
                return SubmitJobsResult(
                    jobs=[
                        job_result(existing[j.submitted_by_call], spec, True)
                        for j, spec in built
                        if j.submitted_by_call in existing
                    ]
                )
        check_no_cycle(s, [spec for _, spec in built])
        ids = insert_jobs(s, rows, by=ctx.principal)
        for (job, _), job_id in zip(built, ids, strict=True):
            job.id = job_id
        return SubmitJobsResult(jobs=[job_result(job, spec) for job, spec in built])
