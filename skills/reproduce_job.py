"""reproduce_job: queue a new job from an attempt's recorded provenance (`nightshift reproduce
JOB`): its commit checked out into a worktree of its own with the recorded dirty diff applied, its
image pinned by digest, the same interpreter, argv template, parameters, seed and environment."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from nightshift.runtime.errors import NotReproducible, SkillFailed, UnknownJob
from nightshift.runtime.store.db import Attempt, Job, KeyValue
from nightshift.skills.base import Claims, HostPath, Launch, SkillContext, SkillInput, skill

DONE_KEY = "reproduce_job:{call_id}"


class ReproduceJobInput(SkillInput):
    job_id: int = Field(description="The job whose run to reproduce")
    attempt: int | None = Field(
        None, ge=1, description="Its attempt to reproduce; default: the newest with provenance"
    )
    strict: bool = Field(
        False,
        description="Refuse, instead of warning, when today's package list or data fingerprint "
        "differ from the recorded ones",
    )
    worktree: str | None = Field(
        None,
        max_length=4096,
        description="Where to check the recorded commit out (a new folder); default: "
        "<runs_dir>/reproduce/job-<J>-attempt-<N>-<call>",
    )

    def claims(self) -> Claims:
        """The job it reads, and the folder its reproduction runs in (checked against the
        policy's mount roots when named)."""
        paths = [HostPath(field="worktree", path=self.worktree)] if self.worktree else []
        return Claims(jobs=[self.job_id], launches=[Launch(where="reproduce", paths=paths)])


class ReproduceJobResult(BaseModel):
    job_id: int = Field(description="The new job, queued")
    name: str
    source_job_id: int
    source_attempt: int
    commit: str | None = Field(description="The commit checked out; None: the code was not in git")
    worktree: str | None = Field(description="Where it was checked out")
    code_path: str = Field(description="The new job's code folder")
    diff_applied: str | None = Field(description="The sha256 of the recorded diff applied, if any")
    image: str | None = Field(description="The image, pinned by digest where one was recorded")
    python: str | None = Field(description="The interpreter the new job runs with")
    params: dict[str, Any]
    seed: int | None
    warnings: list[str] = Field(
        description="What may keep the reproduction from matching: other packages or data than "
        "recorded, untracked files that were not kept, values that could not be pinned"
    )
    already_done: bool = False


@skill("reproduce_job", capability="launch")
def reproduce_job(ctx: SkillContext, inp: ReproduceJobInput) -> ReproduceJobResult:
    """Queue a new job that reruns one attempt of a job as it was recorded when it started: the
    recorded git commit checked out into a worktree of its own (`git worktree add --detach`) with
    the recorded uncommitted diff applied, the container image pinned to its recorded digest, the
    same interpreter, command, parameters, seed and environment. Warns when the interpreter's
    package list or the data's fingerprint today differ from the recorded ones; strict=true
    refuses then. The new job is the caller's, queued like any submission; the same call id never
    queues twice."""
    from nightshift.runtime.training import provenance

    key = DONE_KEY.format(call_id=ctx.call_id) if ctx.call_id else None
    if key:
        with ctx.store.session() as s:
            done = s.get(KeyValue, key)
            if done is not None:
                return ReproduceJobResult.model_validate_json(done.value).model_copy(
                    update={"already_done": True}
                )
    job = ctx.store.job(inp.job_id)
    if job is None:
        raise UnknownJob(f"no job {inp.job_id}; list_jobs shows the jobs")
    att = _attempt(ctx.store.attempts(inp.job_id), inp)
    rec: dict[str, Any] = att.provenance or {}
    blobs = provenance.blobs_of(ctx.settings.home_path)

    warnings = _drift(rec, blobs, ctx.settings.home_path, ctx.settings.loop.provenance_budget_s)
    if warnings and inp.strict:
        raise NotReproducible(
            f"job {job.id} attempt {att.number} cannot be reproduced strictly: "
            + "; ".join(warnings)
            + " (without --strict it is queued with these warnings)"
        )

    git = rec.get("git") or {}
    commit, worktree, code_path, diff_applied = None, None, str(rec.get("code_dir") or ""), None
    if git.get("commit"):
        commit = git["commit"]
        tag = hashlib.sha256((ctx.call_id or str(ctx.now)).encode()).hexdigest()[:8]
        wt = Path(
            inp.worktree
            or ctx.settings.runs_dir / "reproduce" / f"job-{job.id}-attempt-{att.number}-{tag}"
        ).absolute()
        diff_applied = _checkout(git, wt, blobs)
        worktree = str(wt)
        code_path = str(wt / git["subdir"]) if git.get("subdir") not in (None, ".") else str(wt)
        if git.get("untracked_count"):
            warnings.append(
                f"{git['untracked_count']} untracked file(s) were in the tree and are not in the "
                f"worktree: {', '.join((git.get('untracked') or [])[:10])}"
            )
    else:
        warnings.append(
            f"the code was not recorded in git ({git.get('note', 'no commit')}): the new job runs "
            f"the folder as it is now, {code_path}"
        )

    spec, image, python = _spec(job, rec, code_path, warnings)
    where = {
        "commit": commit,
        "worktree": worktree,
        "code_path": code_path,
        "diff_applied": diff_applied,
        "image": image,
        "python": python,
    }
    return _queue(ctx, key, job, att, spec, rec, warnings, where)


def _attempt(attempts: list[Attempt], inp: ReproduceJobInput) -> Attempt:
    if inp.attempt is not None:
        found = [a for a in attempts if a.number == inp.attempt]
        if not found:
            raise SkillFailed(f"job {inp.job_id} has no attempt {inp.attempt}")
        if found[0].provenance is None:
            raise SkillFailed(
                f"job {inp.job_id} attempt {inp.attempt} has no recorded provenance (it started "
                "before nightshift kept it): there is nothing to reproduce it from"
            )
        return found[0]
    kept = [a for a in attempts if a.provenance is not None]
    if not kept:
        raise SkillFailed(
            f"job {inp.job_id} has no attempt with recorded provenance: it has not started, or "
            "its attempts started before nightshift kept it"
        )
    return kept[-1]


def _drift(rec: dict[str, Any], blobs: Any, home: Path, budget_s: float) -> list[str]:
    """Today's package list of the recorded interpreter and today's data fingerprints, against
    the recorded ones."""
    from nightshift.runtime.training import provenance

    budget = provenance.Budget(budget_s)
    now: dict[str, Any] = {}
    py = rec.get("python") or {}
    if py.get("interpreter"):
        now["python"] = provenance.python_info(
            py["interpreter"], budget, blobs, provenance.pythons_cache(home)
        )
    refs = [
        {"path": d.get("resolved") or d.get("path"), "hash": bool(d.get("sha256"))}
        for d in rec.get("data") or []
    ]
    measured = provenance.data_info(refs, Path(str(rec.get("code_dir") or ".")), budget)
    # compared under the recorded names
    now["data"] = [
        {**m, "path": d.get("path")} for m, d in zip(measured, rec.get("data") or [], strict=True)
    ]
    warnings = provenance.drift(rec, now, blobs)
    note = (now.get("python") or {}).get("note")
    if note:
        warnings.append(f"today's package list: {note}")
    return warnings


def _checkout(git: dict[str, Any], wt: Path, blobs: Any) -> str | None:
    """`git worktree add --detach WT COMMIT` in the recorded repository, then the recorded diff
    applied with `git apply`. A worktree already there at that commit (this call, repeated after
    a crash) is kept as it is. Returns the sha256 of the diff applied."""
    from nightshift.runtime.training import provenance

    budget = provenance.Budget(120.0)
    repo, commit = git.get("repo"), git["commit"]
    if wt.exists():
        head = provenance.run(["git", "-C", str(wt), "rev-parse", "HEAD"], budget)
        if head.ok and head.out.strip() == commit:
            return git.get("diff_sha256")
        raise SkillFailed(f"{wt} already exists and is not a checkout of {commit[:12]}")
    if not repo or not Path(repo).is_dir():
        raise SkillFailed(
            f"the recorded repository {repo} is gone: clone it and check out {commit} by hand"
        )
    wt.parent.mkdir(parents=True, exist_ok=True)
    added = provenance.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(wt), commit], budget
    )
    if not added.ok:
        raise SkillFailed(f"could not check out {commit[:12]} into {wt}: {added.note}")
    sha = git.get("diff_sha256")
    if not sha:
        return None
    if blobs.get(sha) is None:
        raise SkillFailed(
            f"the recorded diff {sha[:12]} is missing from {blobs.root}: the worktree at {wt} "
            "holds the clean commit only"
        )
    applied = provenance.run(
        ["git", "-C", str(wt), "apply", "--whitespace=nowarn", str(blobs.path(sha))], budget
    )
    if not applied.ok:
        raise SkillFailed(f"the recorded diff {sha[:12]} does not apply in {wt}: {applied.note}")
    return str(sha)


def _spec(
    job: Job, rec: dict[str, Any], code_path: str, warnings: list[str]
) -> tuple[dict[str, Any], str | None, str | None]:
    """The new job's spec: the recorded job's, run from the worktree, its image pinned, its
    interpreter the recorded one, its parameters and seed those the attempt ran with."""
    spec = dict(job.spec)
    spec["code"] = {**(spec.get("code") or {}), "path": code_path}
    env = dict(spec.get("environment") or {})
    image = (rec.get("image") or {}) if env.get("image") else {}
    if env.get("image"):
        pinned = image.get("pinned") or (
            image.get("digest") if str(image.get("digest", "")).startswith("sha256:") else None
        )
        if pinned:
            env["image"] = pinned
        else:
            warnings.append(f"the image {env['image']} has no recorded digest: it is run by tag")
    py = rec.get("python") or {}
    if py.get("interpreter") and not env.get("image"):
        env["python"] = py["interpreter"]
    env["env"] = dict(rec.get("env") or env.get("env") or {})
    spec["environment"] = env
    params = dict(rec.get("params") or job.params)
    spec["parameters"] = params
    spec.pop("search_space", None)
    if rec.get("seed_from") == "spec":
        spec["seed"] = rec.get("seed")
    # when it ran is not part of what it was: no dependencies, deadline or start time again
    for k in ("depends_on", "deadline", "begin", "search", "sweep"):
        spec.pop(k, None)
    return spec, env.get("image"), env.get("python")


def _queue(
    ctx: SkillContext,
    key: str | None,
    job: Job,
    att: Attempt,
    spec: dict[str, Any],
    rec: dict[str, Any],
    warnings: list[str],
    where: dict[str, Any],
) -> ReproduceJobResult:
    from nightshift.skills.submit_job import SubmitJobInput, build_job, insert_jobs, job_row

    sub = SubmitJobInput(spec=spec, priority=job.priority)
    new, parsed = build_job(ctx, sub, ctx.call_id)
    row = {**job_row(new), "reproduces": job.id}
    result = ReproduceJobResult(
        job_id=0,
        name=parsed.name,
        source_job_id=job.id or 0,
        source_attempt=att.number,
        **where,
        params=dict(new.params),
        seed=rec.get("seed"),
        warnings=warnings,
    )
    with ctx.store.write_session() as s:
        new_id = insert_jobs(s, [row], by=ctx.principal)[0]
        result = result.model_copy(update={"job_id": new_id})
        if key:
            s.add(KeyValue(key=key, value=result.model_dump_json()))
    return result
