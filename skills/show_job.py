"""show_job: one job in full, as `sacct` shows a Slurm user — the job, then every attempt with
its cause, steps, the steps the next attempt lost, the parameters it changed and the checkpoint it
resumed from (`nightshift show JOB`)."""

from __future__ import annotations

import re
import string
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from nightshift.runtime.errors import UnknownJob
from nightshift.runtime.training import keeper
from nightshift.runtime.training.attempt_diagnosis import Diagnosis
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

if TYPE_CHECKING:
    from nightshift.runtime.store.db import Attempt

ENDED = ("exited", "lost", "stopped")


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


class ShowJobResult(BaseModel):
    job_id: int
    name: str
    state: str
    reason: str | None = Field(description="Why it stopped, or for a queued job why it waits")
    owner: str
    priority: int
    group: str | None
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
    atts = ctx.store.attempts(job.id)
    paths = job_paths(ctx.settings, job)
    spec = ExperimentSpec.model_validate(job.spec)
    template = spec.checkpoint.resume_arg if spec.checkpoint else []
    details: list[AttemptDetail] = []
    for i, a in enumerate(atts):
        if i + 1 < len(atts):
            next_start: int | None = atts[i + 1].start_step
        else:  # the job is waiting for its next attempt: it will start from the resume point
            next_start = (job.resume_step or 0) if job.state == "queued" else None
        lost = (
            None if next_start is None or a.last_step is None else max(0, a.last_step - next_start)
        )
        ckpt, ckpt_step, note = resume_point(a, template)
        details.append(
            AttemptDetail(
                number=a.number,
                state=a.state,
                outcome=a.outcome,
                cause=a.cause,
                diagnosis=Diagnosis.stored(a.diagnosis),
                evidence=a.evidence,
                first_bad_step=a.first_bad_step,
                started_at=a.started_at,
                ended_at=a.ended_at,
                duration_s=_duration(a, ctx.now),
                start_step=a.start_step,
                last_step=a.last_step,
                last_loss=a.last_loss,
                steps_lost=lost,
                exit_code=a.exit_code,
                signal=a.signal,
                gpus=list(a.gpus),
                param_changes=_changes(atts[i - 1].params if i else None, a.params),
                resumed_from=ckpt,
                resumed_from_step=ckpt_step,
                resume_note=note,
                log_path=a.log_path,
            )
        )
    return ShowJobResult(
        job_id=job.id,
        name=job.name,
        state=job.state,
        reason=job.hold_reason if job.state == "queued" and job.hold_reason else job.reason,
        owner=job.owner,
        priority=job.priority,
        group=job.group,
        spec_path=job.spec_path,
        workspace=str(paths["workspace"]),
        checkpoint_dir=str(paths["checkpoint_dir"]),
        params=dict(job.params),
        max_attempts=job.max_attempts,
        resume_from=job.resume_from,
        resume_step=job.resume_step,
        created_at=job.created_at,
        updated_at=job.updated_at,
        good_checkpoints=[KeptCheckpoint(**k) for k in keeper.kept(paths["workspace"])],
        steps_lost_total=sum(d.steps_lost or 0 for d in details),
        attempts=details,
    )


def resume_point(att: Attempt, template: list[str]) -> tuple[str | None, int | None, str]:
    """The checkpoint an attempt resumed from, read back from its argv.

    The loop renders an attempt's argv as the spec's command plus, when the job had a resume point,
    the spec's `checkpoint.resume_arg` filled in; so the argv's last len(resume_arg) items, matched
    against that template, give the `{checkpoint}` (and `{step}`) it was started with. This is
    what the process was really told, which the job row no longer says once a later resume changed
    it. Returns (checkpoint, step, how it was found)."""
    if not att.argv:
        return None, None, "unknown: the attempt's command was not recorded"
    found = _match_tail(att.argv, template)
    if found is None:
        if att.start_step:
            return (
                None,
                att.start_step,
                (
                    f"started at step {att.start_step}; its argv names no "
                    "checkpoint (the spec's resume argument is not in it)"
                ),
            )
        return None, None, "from scratch"
    ckpt, step = found
    if step is None and att.start_step:
        step = att.start_step
    if ckpt is None:
        return None, step, "resumed; the resume argument names no checkpoint path"
    return ckpt, step, "from the resume argument in its argv"


def _match_tail(argv: list[str], template: list[str]) -> tuple[str | None, int | None] | None:
    if not template or len(argv) < len(template):
        return None
    ckpt: str | None = None
    step: int | None = None
    for arg, item in zip(argv[-len(template) :], template, strict=True):
        m = _template_regex(item).fullmatch(arg)
        if m is None:
            return None
        groups = m.groupdict()
        ckpt = groups.get("checkpoint") or ckpt
        if groups.get("step") is not None:
            step = int(groups["step"])
    return ckpt, step


def _template_regex(item: str) -> re.Pattern[str]:
    """`--resume={checkpoint}` → a regex capturing the checkpoint; other placeholders match anything."""
    out, seen = [], set()
    for literal, name, _spec, _conv in string.Formatter().parse(item):
        out.append(re.escape(literal))
        if name is None:
            continue
        if name in ("checkpoint", "step") and name not in seen:
            seen.add(name)
            out.append(r"(?P<step>-?\d+)" if name == "step" else r"(?P<checkpoint>.+?)")
        else:
            out.append(r".*?")
    return re.compile("".join(out), re.DOTALL)


def _duration(att: Attempt, now: datetime) -> float | None:
    if att.ended_at is not None:
        return max(0.0, (att.ended_at - att.started_at).total_seconds())
    if att.state in ENDED:
        return None
    return max(0.0, (now - att.started_at).total_seconds())


def _changes(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, ParamChange]:
    if before is None:
        return {}
    return {
        k: ParamChange(before=before.get(k), after=after.get(k))
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }
