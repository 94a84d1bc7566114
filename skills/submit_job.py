"""submit_job: queue an experiment; the loop starts it when placement allows."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from sqlalchemy import bindparam, insert
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from nightshift.runtime.errors import SkillFailed, SpecError
from nightshift.runtime.executors.submitter import outside_job_folder
from nightshift.runtime.spec import MAX_PRIORITY, ExperimentSpec, check_finite, load_spec_text
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Job
from nightshift.runtime.yamlfile import check_bounds, validate
from nightshift.skills.base import Claims, HostPath, Launch, SkillContext, SkillInput, skill

# States in which a job still waits for, or may yet satisfy, a dependency.
WAITING = ("queued", "running", "paused", "held")


class SubmitJobInput(SkillInput):
    model_config = ConfigDict(allow_inf_nan=False)

    spec_path: str | None = Field(
        None, max_length=4096, description="Path to an experiment spec YAML file"
    )
    spec: dict[str, Any] | None = Field(None, description="The experiment spec as a mapping")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Overrides for spec.parameters"
    )
    priority: int | None = Field(
        None, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Overrides spec.priority"
    )
    cost_class: Literal["urgent", "cost_sensitive"] | None = Field(
        None,
        description="Overrides spec.cost_class: urgent runs now, cost_sensitive waits for cheap hours",
    )
    group: str | None = Field(None, description="Sweep id shared by the trials of one submission")

    # The spec as read once (a file's bytes, hashed): what the gate checks is what runs.
    _loaded: tuple[ExperimentSpec, str | None, str | None] | None = PrivateAttr(None)

    @field_validator("spec_path")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("spec_path contains a NUL byte")
        return v

    @field_validator("params")
    @classmethod
    def _params_bounded(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_bounds(v, field="params")
        check_finite(v, "params")
        return v

    @model_validator(mode="after")
    def _one_spec(self) -> SubmitJobInput:
        if (self.spec_path is None) == (self.spec is None):
            raise ValueError("give exactly one of spec_path or spec")
        return self

    def loaded(self) -> tuple[ExperimentSpec, str | None]:
        """The validated spec and its resolved path. Read only: the gate checked this object
        (copy it to change it, as `model_copy(update=...)` does)."""
        spec, path, _ = self._load_once()
        return spec, path

    def _load_once(self) -> tuple[ExperimentSpec, str | None, str | None]:
        """Read and validate once per call: the file is hashed, checked and run as one."""
        if self._loaded is None:
            self._loaded = _load(self.spec_path, self.spec)
        return self._loaded

    def files(self) -> dict[str, str]:
        _, path, digest = self._load_once()
        return {path: digest} if path and digest else {}

    def claims(self) -> Claims:
        spec, path, _ = self._load_once()  # read only: no copy
        return Claims(launches=[spec_launch(spec, path or "spec")])


def spec_launch(spec: ExperimentSpec, where: str) -> Launch:
    """What one job of this spec asks of the machine."""
    return Launch(
        where=where,
        gpus=spec.resources.gpus,
        image=spec.environment.image,
        mounts=[m.source for m in spec.environment.mounts],
        paths=[HostPath(field=f, path=p) for f, p in spec.host_paths()],
        runtime_min=spec.timeout_min,
    )


class SubmitJobResult(BaseModel):
    job_id: int
    name: str
    state: str
    params: dict[str, Any]
    gpus: int = Field(0, description="GPUs the job asks for (spec.resources.gpus)")
    already_submitted: bool = Field(
        False, description="True when this call id had already queued it"
    )


def _load(
    spec_path: str | None, spec: dict[str, Any] | None
) -> tuple[ExperimentSpec, str | None, str | None]:
    if spec_path:
        path = str(Path(spec_path).resolve())
        parsed, text = load_spec_text(path)
        return parsed, path, hashlib.sha256(text.encode()).hexdigest()
    return validate(ExperimentSpec, spec, path="spec"), None, None


def build_job(
    ctx: SkillContext, inp: SubmitJobInput, call_key: str | None, checked: set[str] | None = None
) -> tuple[Job, ExperimentSpec]:
    """A validated, not yet stored Job for one submission (shared by submit_job and submit_jobs;
    `checked` remembers folders already found writable within one batch)."""
    spec, path = inp.loaded()
    unknown = (
        set(inp.params) - set(spec.parameters) - set(spec.search_space or {}) - spec.searched()
    )
    if unknown:
        raise SkillFailed(
            f"params {sorted(unknown)} are not parameters of spec '{spec.name}' "
            f"(known: {sorted(spec.parameters)})"
        )
    params = {**spec.parameters, **inp.params}
    spec.check_filled(params, path=path)
    if inp.cost_class is not None:
        spec = spec.model_copy(update={"cost_class": inp.cost_class})
    if ctx.settings.jobs_run_as_submitter:
        _check_inside_job_folder(spec, path)
    _check_writable(spec, path, ctx.settings.runs_dir, checked)
    job = Job(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        spec_path=path,
        params=params,
        priority=spec.priority if inp.priority is None else inp.priority,
        owner=ctx.principal,
        max_attempts=spec.retries + 1,
        submitted_by_call=call_key,
        group=inp.group,
        created_at=ctx.now,
        updated_at=ctx.now,
    )
    return job, spec


def job_result(job: Job, spec: ExperimentSpec, already: bool = False) -> SubmitJobResult:
    return SubmitJobResult(
        job_id=job.id,
        name=job.name,
        state=job.state,
        params=job.params,
        gpus=spec.resources.gpus,
        already_submitted=already,
    )


@skill("submit_job", capability="launch", store_only=True)
def submit_job(ctx: SkillContext, inp: SubmitJobInput) -> SubmitJobResult:
    """Queue an experiment from a spec (file or mapping) with optional parameter overrides and
    priority. Returns at once with the job id; the scheduler starts it when a slot is free. The same
    call id never queues twice."""
    job, spec = build_job(ctx, inp, ctx.call_id)
    row = job_row(job)
    with ctx.store.session() as s:
        if ctx.call_id:
            existing = s.connection().execute(_BY_CALL, {"key": ctx.call_id}).scalar()
            if existing is not None:
                return job_result(s.get_one(Job, existing), spec, already=True)
        check_no_cycle(s, [spec])
        job.id = insert_jobs(s, [row], by=ctx.principal)[0]
        return job_result(job, spec)


# Core statements for the rows a submission writes under the store's write lock: the ORM's unit
# of work costs more than the insert, and every submitter waits while the lock is held.
_JOBS = Job.__table__  # type: ignore[attr-defined]
_INSERT_JOBS = insert(_JOBS).returning(_JOBS.c.id, sort_by_parameter_order=True)
_BY_CALL = sa_select(_JOBS.c.id).where(_JOBS.c.submitted_by_call == bindparam("key"))
_JOB_COLUMNS = [c.name for c in _JOBS.columns if c.name != "id"]


def job_row(job: Job) -> dict[str, Any]:
    """A new job's column values, made before the write lock is taken."""
    return {c: getattr(job, c) for c in _JOB_COLUMNS}


def insert_jobs(s: Session, rows: list[dict[str, Any]], *, by: str) -> list[int]:
    """Insert new jobs in one statement on the session's transaction, each bound by its
    `job.submitted` audit event in the same transaction; their ids, in order."""
    ids = list(s.connection().execute(_INSERT_JOBS, rows).scalars().all())
    lifecycle.submitted(s, [{**r, "id": i} for r, i in zip(rows, ids, strict=True)], by=by)
    return ids


def check_no_cycle(s: Session, specs: list[ExperimentSpec]) -> None:
    """Refuse new jobs whose depends_on closes a cycle with each other or with waiting jobs (by
    name; a name that has succeeded satisfies its dependants): every job in it would wait
    forever."""
    if not any(spec.depends_on for spec in specs):
        return
    done = set(s.exec(select(Job.name).where(Job.state == "succeeded").distinct()))
    edges: dict[str, set[str]] = {}
    for name, stored in s.exec(select(Job.name, Job.spec).where(col(Job.state).in_(WAITING))):
        deps = stored.get("depends_on") if isinstance(stored, dict) else None
        edges.setdefault(name, set()).update(d for d in deps or () if isinstance(d, str))
    for spec in specs:
        edges.setdefault(spec.name, set()).update(spec.depends_on)
    for spec in specs:
        cycle = _cycle_from(spec.name, edges, done)
        if cycle:
            raise SpecError(
                f"depends_on closes a cycle ({' -> '.join(cycle)}): each job would wait for "
                "the other forever; remove one of these dependencies",
                path=spec.name,
                field="depends_on",
            )


def _cycle_from(start: str, edges: dict[str, set[str]], done: set[str]) -> list[str] | None:
    """A path start -> ... -> start through unsatisfied dependencies, or None (iterative DFS)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        name, trail = stack.pop()
        for dep in sorted(edges.get(name, ())):
            if dep in done:
                continue
            if dep == start:
                return [*trail, start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, [*trail, dep]))
    return None


def _check_inside_job_folder(spec: ExperimentSpec, spec_path: str | None) -> None:
    """A shared install reads a job's metrics and checkpoints in its own folder only."""
    named = (
        ("checkpoint.dir", spec.checkpoint.dir if spec.checkpoint else None),
        ("metrics.file", spec.metrics.file),
    )
    for field, value in named:
        if value is not None and Path(value).is_absolute():
            raise SpecError(outside_job_folder(field, value), path=spec_path, field=field)


def _check_writable(
    spec: ExperimentSpec, spec_path: str | None, runs_dir: Path, checked: set[str] | None = None
) -> None:
    """Refuse at submit, not at 3 a.m.: the run must be able to write its checkpoints. Nothing is
    created here (the policy checked the folder; the run creates it): a folder that does not
    exist yet must have a writable nearest existing parent."""
    target, field = runs_dir, "executor.runs_dir (config)"
    if spec.checkpoint and Path(spec.checkpoint.dir).is_absolute():
        target, field = Path(spec.checkpoint.dir), "checkpoint.dir"
    if checked is not None:
        if str(target) in checked:
            return
        checked.add(str(target))
    try:
        existing = next(p for p in (target, *target.parents) if p.exists())
        if not existing.is_dir():
            raise NotADirectoryError(20, "a file is in the way", str(existing))
        if existing == target:
            with tempfile.TemporaryFile(dir=target):
                pass
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, f"{existing} is not writable", str(existing))
    except OSError as exc:
        raise SpecError(
            f"{target} cannot be written ({exc.strerror or exc}); point it at a folder you own",
            path=spec_path,
            field=field,
        ) from exc
