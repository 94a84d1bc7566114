"""compare_jobs: jobs side by side (`nightshift compare JOB JOB…`): their parameters, the final
and best value of each one's watched metric, how their provenance differs from the first job's,
and their curves, for a plot of them overlaid."""

from __future__ import annotations

import math
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from nightshift.runtime.errors import UnknownJob
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

MAX_POINTS = 2000  # per curve: longer curves are thinned evenly, the last point always kept
P = TypeVar("P")


class CompareJobsInput(SkillInput):
    job_ids: list[int] = Field(min_length=2, max_length=20, description="The jobs to compare")

    def claims(self) -> Claims:
        return Claims(jobs=list(self.job_ids))


class Difference(BaseModel):
    field: str = Field(description="commit, packages, image digest, seed, driver, ...")
    first: Any = Field(description="The first job's value")
    this: Any = Field(description="This job's value")


class ComparedJob(BaseModel):
    job_id: int
    name: str
    state: str
    params: dict[str, Any]
    metric: str = Field(description="The metric the spec watches (metrics.name)")
    mode: str = Field(description="min or max: which way is better")
    final: float | None = Field(description="Its last recorded value")
    final_step: int | None
    best: float | None = Field(description="Its best value, by mode")
    best_step: int | None
    attempts: int
    provenance_attempt: int | None = Field(
        description="The attempt whose provenance is compared (the newest with one)"
    )
    provenance: dict[str, Any] | None
    differences: list[Difference] = Field(
        description="Where its provenance differs from the first job's (empty for the first)"
    )
    curve: list[tuple[int, float]] = Field(description="(step, value) of its metric, by step")


class CompareJobsResult(BaseModel):
    jobs: list[ComparedJob]
    params_differ: list[str] = Field(description="Parameters whose values are not all equal")


@skill("compare_jobs", capability="read")
def compare_jobs(ctx: SkillContext, inp: CompareJobsInput) -> CompareJobsResult:
    """Put jobs side by side: each one's parameters, the final and best value of the metric its
    spec watches (with their steps), the differences of its provenance (commit, dirty diff,
    packages, image digest, seed, data, GPU, driver, host) from the first job's, and its metric
    curve by step (for a plot of them overlaid). Reads only."""
    from sqlmodel import col, select

    from nightshift.runtime.store.db import MetricPoint
    from nightshift.runtime.training import provenance

    out: list[ComparedJob] = []
    first: dict[str, Any] | None = None
    for n, job_id in enumerate(inp.job_ids):
        job = ctx.store.job(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}; list_jobs shows the jobs")
        attempts = ctx.store.attempts(job_id)
        metrics = job.spec.get("metrics") or {}
        name, mode = str(metrics.get("name") or "loss"), str(metrics.get("mode") or "min")
        with ctx.store.session() as s:
            rows = s.exec(
                select(MetricPoint.step, MetricPoint.value)
                .where(MetricPoint.job_id == job_id, MetricPoint.name == name)
                .order_by(col(MetricPoint.step), col(MetricPoint.id))
            ).all()
        by_step: dict[int, float] = {}
        for step, value in rows:  # a resumed attempt's steps replace the earlier ones
            if value is not None and math.isfinite(value):
                by_step[int(step)] = float(value)
        curve = sorted(by_step.items())
        final = curve[-1] if curve else None
        pick = min if mode == "min" else max
        best = pick(curve, key=lambda p: p[1]) if curve else None
        kept = [a for a in attempts if a.provenance is not None]
        rec = kept[-1].provenance if kept else None
        if n == 0:
            first = rec
        diffs = (
            []
            if n == 0
            else [
                Difference(field=d["field"], first=d["a"], this=d["b"])
                for d in provenance.differences(first, rec)
            ]
        )
        out.append(
            ComparedJob(
                job_id=job_id,
                name=job.name,
                state=job.state,
                params=dict(job.params),
                metric=name,
                mode=mode,
                final=final[1] if final else None,
                final_step=final[0] if final else None,
                best=best[1] if best else None,
                best_step=best[0] if best else None,
                attempts=len(attempts),
                provenance_attempt=kept[-1].number if kept else None,
                provenance=rec,
                differences=diffs,
                curve=thin(curve),
            )
        )
    keys = sorted({k for j in out for k in j.params})
    differ = [k for k in keys if len({repr(j.params.get(k)) for j in out}) > 1]
    return CompareJobsResult(jobs=out, params_differ=differ)


def thin(curve: list[P], most: int = MAX_POINTS) -> list[P]:
    """At most `most` points (plus the last) of `curve`, every k-th, evenly; the last always kept
    (the dashboard's curves are thinned the same way)."""
    if len(curve) <= most:
        return curve
    stride = math.ceil(len(curve) / most)
    return curve[::stride] + ([curve[-1]] if (len(curve) - 1) % stride else [])
