"""show_job: one job in full, as `sacct` shows a Slurm user — the job, then every attempt with
its cause, steps, the steps the next attempt lost, the parameters it changed and the checkpoint it
resumed from (`nightshift show JOB`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from nightshift.runtime.errors import UnknownJob
from nightshift.runtime.training import job_history, keeper
from nightshift.runtime.training.attempt_diagnosis import Diagnosis
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill


class ShowJobInput(SkillInput):
    job_id: int = Field(description="The job to show")

    def claims(self) -> Claims:
        """The job it shows: a policy may judge by its owner (claims.others_jobs)."""
        return Claims(jobs=[self.job_id])


class ParamChange(BaseModel):
    before: Any = Field(description="The previous attempt's value (None: it had no such parameter)")
    after: Any = Field(description="This attempt's value (None: it has no such parameter)")


class KeptCheckpoint(BaseModel):
    step: int
    path: str = Field(description="The copy, where a resume would read it")
    original: str = Field(description="Where the program wrote it")
    bytes: int = Field(description="Disk the copy takes")


class AttemptDetail(BaseModel):
    number: int
    state: str = Field(description="starting | running | exited | lost | stopped")
    outcome: str | None = Field(description="How it ended: succeeded, failed, cancelled, ...")
    cause: str | None = Field(description="The diagnosed failure category, once recovery ran")
    diagnosis: Diagnosis | None = Field(
        None,
        description="Why it failed, diagnosed as it ended: category, the evidence line and its "
        "number, a summary, the recommended action. None: it did not fail, or it ended before "
        "diagnoses were kept",
    )
    evidence: str | None = Field(description="What the monitor saw: a divergence, a lost process")
    first_bad_step: int | None = Field(description="The first step whose metrics diverged")
    started_at: datetime
    ended_at: datetime | None
    duration_s: float | None = Field(description="Run time; for a live attempt, so far")
    start_step: int
    last_step: int | None
    last_loss: float | None
    steps_lost: int | None = Field(
        description="last_step minus the step the next attempt started "
        "from (or the job's resume point when it is queued again): the "
        "work done twice. None: no next attempt, or no step recorded"
    )
    exit_code: int | None
    signal: int | None
    gpus: list[int]
    param_changes: dict[str, ParamChange] = Field(
        description="Parameters that differ from the previous attempt's"
    )
    resumed_from: str | None = Field(description="The checkpoint this attempt resumed from")
    resumed_from_step: int | None = Field(
        description="That checkpoint's step, when the resume "
        "argument names it; else the attempt's start_step"
    )
    resume_note: str = Field(description="How resumed_from was found, or why it is unknown")
    log_path: str | None
    provenance: dict[str, Any] | None = Field(
        None,
        description="What makes it reproducible, read as it started: git commit, branch and "
        "dirty diff (by sha256), interpreter and package list (by sha256), image digest, seed, "
        "argv, named env, data fingerprints, GPUs as the health probe read them, host. None: "
        "started before provenance was kept",
    )
    provenance_changes: list[str] = Field(
        default_factory=list,
        description="What changed against the previous attempt (another commit, packages, "
        "driver, image, ...), and a dirty tree",
    )


class ShowJobResult(BaseModel):
    job_id: int
    name: str
    state: str
    reason: str | None = Field(description="Why it stopped, or for a queued job why it waits")
    owner: str
    priority: int
    group: str | None
    reproduces: int | None = Field(
        None, description="The job whose recorded run this one reproduces (nightshift reproduce)"
    )
    spec_path: str | None
    workspace: str
    checkpoint_dir: str
    params: dict[str, Any]
    max_attempts: int
    resume_from: str | None = Field(description="Where the next attempt would resume from")
    resume_step: int | None
    created_at: datetime
    updated_at: datetime
    good_checkpoints: list[KeptCheckpoint] = Field(
        description=f"nightshift's copies of checkpoints taken while the metrics were finite, in "
        f"<job folder>/{keeper.GOOD_DIR}/, oldest step first"
    )
    steps_lost_total: int = Field(description="The sum of the attempts' steps_lost")
    attempts: list[AttemptDetail]


@skill("show_job", capability="read")
def show_job(ctx: SkillContext, inp: ShowJobInput) -> ShowJobResult:
    """Everything about one job: state, reason, owner, priority, spec path, checkpoint folder and
    the good checkpoints kept, then each attempt with its state, diagnosed cause and diagnosis
    (evidence line, summary, recommended action), start and end,
    duration, first and last step, the steps lost to the next attempt, exit code or signal, GPUs,
    the parameters it changed against the previous attempt and the checkpoint it resumed from."""
    # Imported here: a client of the daemon parses this module's result models, without the
    # engine and the ORM they bring.
    from nightshift.runtime.engine import job_paths
    from nightshift.runtime.spec import ExperimentSpec

    job = ctx.store.job(inp.job_id)
    if job is None:
        raise UnknownJob(f"no job {inp.job_id}; list_jobs shows the jobs")
    try:
        spec: ExperimentSpec | None = ExperimentSpec.model_validate(job.spec)
    except ValidationError:  # a stored spec edited into one that no longer validates: the job
        spec = None  # is shown all the same (the loop fails it, `audit verify` names the row)
    found = job_history.detail(
        job,
        ctx.store.attempts(job.id),
        where=job_paths(ctx.settings, job),
        resume_template=spec.checkpoint.resume_arg if spec is not None and spec.checkpoint else [],
        now=ctx.now,
        hold=ctx.store.hold_reason(job.id) if job.state == "queued" else None,
    )
    for a in found["attempts"]:
        a["diagnosis"] = Diagnosis.stored(a["diagnosis"])
    return ShowJobResult.model_validate(found)
