"""start_sweep: create an Optuna sweep over a spec's `search` space; the daemon runs its trials.

A skill, so starting a sweep passes the policy gate like any launch (the same claims as one of
its trials; each trial is then submitted through the gate as the caller), is audited, and works
through the daemon's socket in a shared install. The study is created here, once, before any
trial exists (runtime/scheduling/sweeps.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from nightshift.runtime.errors import BadArguments
from nightshift.runtime.scheduling.local_time import local_zone
from nightshift.runtime.scheduling.sweeps import create_sweep, objective, seed_lr_prior
from nightshift.runtime.spec import MAX_SEED, SWEEP_MAX_TRIALS, SweepSpec
from nightshift.skills.base import SkillContext, skill
from nightshift.skills.submit_job import SubmitJobInput


class StartSweepInput(SubmitJobInput):
    """The spec (with `search:`), fixed overrides for every trial (`params`, `priority`,
    `cost_class`), and overrides of the spec's `sweep:` budget."""

    name: str | None = Field(
        None, max_length=200, description="Sweep name; default: the spec's name and the time"
    )
    trials: int | None = Field(None, ge=1, le=SWEEP_MAX_TRIALS, description="Trials at most")
    gpu_hours: float | None = Field(None, gt=0, le=1e9, description="GPU-hours at most")
    until: str | None = Field(None, max_length=5, description="No new trial after HH:MM (local)")
    deadline: datetime | None = Field(
        None, description="No new trial after this ISO date-time (naive: local)"
    )
    max_parallel: int | None = Field(None, ge=1, le=10_000, description="Trials at once at most")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Seeds the sampler")
    lr_prior: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="A learning rate tune_lr's range test suggested: the lr dimension narrows "
        "to a decade either side of it and the first trial uses it",
    )

    @model_validator(mode="after")
    def _no_group(self) -> StartSweepInput:
        if self.group is not None:
            raise ValueError("group: a sweep's trials are grouped under the sweep's name")
        return self

    def budget_overrides(self) -> dict[str, Any]:
        named = ("trials", "gpu_hours", "until", "deadline", "max_parallel", "seed")
        return {k: getattr(self, k) for k in named if getattr(self, k) is not None}


class StartSweepResult(BaseModel):
    name: str
    budget: dict[str, Any] = Field(
        description="trials, gpu_hours, deadline (UTC), max_parallel, seed"
    )
    sampler: Literal["tpe", "random"]
    startup_trials: int
    pruner: str
    metric: str
    mode: Literal["min", "max"]


@skill("start_sweep", capability="launch")
def start_sweep(ctx: SkillContext, inp: StartSweepInput) -> StartSweepResult:
    """Start an Optuna sweep over the spec's `search` space (TPE after a few random trials,
    median pruning by default) under a budget: trials, GPU-hours, a time of day or a deadline.
    Returns at once; the daemon queues each trial as a job of its own, reports the metric to
    Optuna and stops trials the pruner gives up on as early_stopped. `nightshift report --sweep
    NAME` shows the best trial."""
    spec, path = inp.loaded()
    base = (spec.sweep or SweepSpec()).model_dump()
    try:
        effective = SweepSpec.model_validate({**base, **inp.budget_overrides()})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadArguments(
            f"start_sweep: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
        ) from None
    update: dict[str, Any] = {"sweep": effective}
    if inp.params:
        unknown = set(inp.params) - set(spec.parameters)
        if unknown:
            raise BadArguments(
                f"start_sweep: params {sorted(unknown)} are not parameters of spec "
                f"'{spec.name}' (known: {sorted(spec.parameters)})"
            )
        update["parameters"] = {**spec.parameters, **inp.params}
    if inp.priority is not None:
        update["priority"] = inp.priority
    if inp.cost_class is not None:
        update["cost_class"] = inp.cost_class
    spec = spec.model_copy(update=update)
    if inp.lr_prior is not None:
        spec = seed_lr_prior(spec, inp.lr_prior)
    row = create_sweep(
        ctx.store,
        spec,
        spec_path=path,
        owner=ctx.principal,
        name=inp.name or f"{spec.name}-{ctx.now:%Y%m%d-%H%M%S}",
        now=ctx.now,
        tz=local_zone(ctx.settings.scheduler.display_tz),
    )
    metric, mode = objective(spec)
    return StartSweepResult(
        name=row.name,
        budget=row.budget,
        sampler=effective.sampler,
        startup_trials=effective.startup_trials,
        pruner=effective.pruner,
        metric=metric,
        mode=mode,
    )
