"""reproduce_job: queue a new job from an attempt's recorded provenance (`nightshift reproduce
JOB`): its commit checked out into a worktree of its own with the recorded dirty diff applied, its
image pinned by digest, the same interpreter, argv template, parameters, seed and environment.

In a shared install (jobs run as their submitters) the new job is the caller's and runs as the
caller's OS account, so everything reproduce does for it is done with that account's rights, never
the daemon's: git (the recorded repository is read, the worktree added and the diff applied as
them: their repository raises no "dubious ownership", and one they cannot read is refused by name)
and today's package list and data fingerprints (what they can read, as at capture). The default
worktree folder is made in the runs folder and handed to them, as their job's folder is."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from nightshift.runtime.errors import NotReproducible, SkillFailed, UnknownJob
from nightshift.runtime.store.db import Attempt, Job, KeyValue
from nightshift.skills.base import Claims, HostPath, Launch, SkillContext, SkillInput, skill

if TYPE_CHECKING:
    from nightshift.runtime.executors.submitter import RunAs

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
        "<runs_dir>/reproduce/job-<J>-attempt-<N>-<call> (in a shared install, made for the "
        "caller and theirs; a folder named here is made by git with the caller's own rights)",
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
    queues twice. Where jobs run as their submitters, the git work and the reads are the caller's
    own (a repository they cannot read is refused, never read with the daemon's rights)."""
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
    caller = _caller(ctx)

    warnings = _drift(
        rec, blobs, ctx.settings.home_path, ctx.settings.loop.provenance_budget_s, caller
    )
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
        diff_applied = _checkout(git, wt, blobs, caller, hand_over=not inp.worktree)
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


def _caller(ctx: SkillContext) -> RunAs | None:
    """Whose rights the reproduction reads and checks out with: in a shared install the account
    the new job will run as — the caller's, as the engine maps a job's owner to an account
    (`account_of`; a principal that is no OS account, or root, is refused as it would be at
    launch) — so that what it reads is what they may read and what it makes is theirs. None
    elsewhere: the daemon's own rights, which are the one user's."""
    if not ctx.settings.jobs_run_as_submitter:
        return None
    from nightshift.runtime.executors.submitter import account_of

    return account_of(ctx.principal)


def _hand_over(wt: Path, caller: RunAs) -> None:
    """The default worktree folder, made by the daemon in its runs folder (which only it writes)
    and given to the caller, 0700, as their job's own folder is: the new job runs there as them
    and may write there. git then fills it as them (an empty folder is a valid target). A folder
    the caller names is never made or handed over by the daemon: git makes it with their rights."""
    from nightshift.runtime.executors.submitter import hand_over

    if not hand_over(wt, caller):
        raise SkillFailed(f"{wt} is in the way and is not a folder; remove it and retry")


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


def _drift(
    rec: dict[str, Any], blobs: Any, home: Path, budget_s: float, caller: RunAs | None = None
) -> list[str]:
    """Today's package list of the recorded interpreter and today's data fingerprints, against
    the recorded ones; read as `caller` where there is one (what they cannot read is a note)."""
    from nightshift.runtime.training import provenance

    budget = provenance.Budget(budget_s)
    now: dict[str, Any] = {}
    py = rec.get("python") or {}
    if py.get("interpreter"):
        now["python"] = provenance.python_info(
            py["interpreter"], budget, blobs, provenance.pythons_cache(home), caller
        )
    refs = [
        {"path": d.get("resolved") or d.get("path"), "hash": bool(d.get("sha256"))}
        for d in rec.get("data") or []
    ]
    base = Path(str(rec.get("code_dir") or "."))
    measured = (
        provenance.data_info_as(refs, base, budget, caller)
        if caller is not None
        else provenance.data_info(refs, base, budget)
    )
    # compared under the recorded names
    now["data"] = [
        {**m, "path": d.get("path")} for m, d in zip(measured, rec.get("data") or [], strict=True)
    ]
    warnings = provenance.drift(rec, now, blobs)
    note = (now.get("python") or {}).get("note")
    if note:
        warnings.append(f"today's package list: {note}")
    return warnings


def _checkout(
    git: dict[str, Any], wt: Path, blobs: Any, caller: RunAs | None, *, hand_over: bool
) -> str | None:
    """`git worktree add --detach WT COMMIT` in the recorded repository, then the recorded diff
    applied with `git apply`, each run as `caller` where there is one (`hand_over`: WT is the
    default folder, made for them first). A worktree already there at that commit (this call,
    repeated after a crash) is kept as it is. Returns the sha256 of the diff applied."""
    from nightshift.runtime.training import provenance

    budget = provenance.Budget(120.0)
    repo, commit = git.get("repo"), git["commit"]

    def run(argv: list[str], stdin: bytes | None = None) -> provenance.Ran:
        return provenance.run(argv, budget, as_user=caller, stdin=stdin)

    if caller is None:
        if wt.exists():
            head = run(["git", "-C", str(wt), "rev-parse", "HEAD"])
            if head.ok and head.out.strip() == commit:
                return git.get("diff_sha256")
            raise SkillFailed(f"{wt} already exists and is not a checkout of {commit[:12]}")
        if not repo or not Path(repo).is_dir():
            raise SkillFailed(
                f"the recorded repository {repo} is gone: clone it and check out {commit} by hand"
            )
        wt.parent.mkdir(parents=True, exist_ok=True)
    else:
        # what is at WT, and the repository, as the caller sees them (git makes what is missing)
        head = run(["git", "-C", str(wt), "rev-parse", "--show-toplevel", "HEAD"])
        if head.ok and head.out.splitlines() == [str(wt.resolve()), commit]:
            return git.get("diff_sha256")
        _readable_repository(repo, commit, caller, run)
        if hand_over:
            _hand_over(wt, caller)
    added = run(["git", "-C", str(repo), "worktree", "add", "--detach", str(wt), commit])
    if not added.ok:
        raise SkillFailed(f"could not check out {commit[:12]} into {wt}: {added.note}")
    sha = git.get("diff_sha256")
    if not sha:
        return None
    diff = blobs.get(sha)
    if diff is None:
        raise SkillFailed(
            f"the recorded diff {sha[:12]} is missing from {blobs.root}: the worktree at {wt} "
            "holds the clean commit only"
        )
    # fed on stdin: the kept diff is in the daemon's home, which the caller may not open
    applied = run(["git", "-C", str(wt), "apply", "--whitespace=nowarn", "-"], stdin=diff)
    if not applied.ok:
        raise SkillFailed(f"the recorded diff {sha[:12]} does not apply in {wt}: {applied.note}")
    return str(sha)


def _readable_repository(repo: str | None, commit: str, caller: RunAs, run: Any) -> None:
    """Refuse, naming it, a recorded repository the caller cannot use with their own rights: one
    they may not read, one git will not work in as them because another account owns it
    ("dubious ownership": their git would run that account's repository config), or one gone."""
    if not repo:
        raise SkillFailed(f"no repository was recorded: check out {commit} by hand")
    from nightshift.runtime.training import provenance

    seen = run(["git", "-C", repo, "cat-file", "-e", f"{commit}^{{commit}}"])
    if seen.ok:
        return
    if provenance.denied(seen):
        raise SkillFailed(
            f"the recorded repository {repo} is not readable by {caller.name}, who would own "
            "the new job: it is reproduced only from what the caller may read; ask its owner "
            "to reproduce it, or for read access"
        )
    if "dubious ownership" in seen.err:
        raise SkillFailed(
            f"git refuses the recorded repository {repo} as {caller.name}: it belongs to "
            "another account (dubious ownership), and its checkout would run that account's "
            "repository config as you; ask its owner to reproduce it, or clone it yourself"
        )
    raise SkillFailed(
        f"the recorded repository {repo} has no commit {commit[:12]} that {caller.name} can "
        f"read ({seen.note}): clone it and check out {commit} by hand"
    )


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
