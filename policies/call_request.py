"""A call as the gate judges it: the arguments parsed with the skill's input model, their
canonical form, the files they name (read once, hashed) and what they claim, with the owners and
highest priority of the jobs they touch. Arguments that do not resolve are audited and refused
here, before any verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from sqlmodel import col, select

from nightshift.policies.audit import AuditLog, job_id_of
from nightshift.runtime.errors import BadArguments, UnknownJob
from nightshift.runtime.store.db import Job, Store
from nightshift.runtime.yamlfile import MAX_DEPTH, bounds_problem
from nightshift.skills.base import Claims, Skill, SkillContext, SkillInput

# Arguments carry a spec (or a list of them) a few levels down: a file's spec at MAX_DEPTH fits.
ARGS_MAX_DEPTH = MAX_DEPTH + 4


@dataclass(frozen=True)
class CallRequest:
    """One resolved call: what the policy judges, the approval covers and the skill runs on."""

    skill: Skill
    input: BaseModel
    canonical: dict[str, Any]
    files: dict[str, str]
    claims: Claims


def resolve(
    audit: AuditLog,
    store: Store,
    ctx: SkillContext,
    skill: Skill,
    args: dict[str, Any] | BaseModel,
) -> CallRequest:
    """The parsed input, its canonical arguments, the files it names and what it claims.
    Arguments out of bounds (nested too deep, a huge integer or string) are refused before
    anything walks them, and audited without them: the audit would not survive them."""
    if not isinstance(args, BaseModel):
        found = bounds_problem(args, max_depth=ARGS_MAX_DEPTH)
        if found is not None:
            where, problem = found
            exc = BadArguments(
                f"{skill.name}: invalid arguments: {where or '(arguments)'}: {problem}"
            )
            audit.append(
                ctx.principal,
                "skill.bad_arguments",
                skill=skill.name,
                call_id=ctx.call_id,
                ts=ctx.now,
                payload={"args": None, "field": where, "error": str(exc)},
            )
            raise exc
    try:
        inp = skill.parse(
            args.model_dump(mode="json")
            if isinstance(args, BaseModel) and not isinstance(args, skill.input_model)
            else args
        )
        if isinstance(inp, SkillInput):
            files, claims = inp.files(), inp.claims()
        else:
            files, claims = {}, Claims()
        if claims.jobs:
            _claim_jobs(store, claims)
    except BadArguments as exc:
        raw = args.model_dump(mode="json") if isinstance(args, BaseModel) else dict(args)
        audit.append(
            ctx.principal,
            "skill.bad_arguments",
            skill=skill.name,
            call_id=ctx.call_id,
            job_id=job_id_of(raw),
            ts=ctx.now,
            payload={"args": raw, "error": str(exc)},
        )
        raise
    return CallRequest(skill, inp, inp.model_dump(mode="json"), files, claims)


def _claim_jobs(store: Store, claims: Claims) -> None:
    """The owners and highest priority of the jobs a call touches; a job that does not exist
    is a bad argument (the caller retries), never a call to approve."""
    with store.session() as s:
        rows = s.exec(
            select(Job.id, Job.owner, Job.priority).where(col(Job.id).in_(claims.jobs))
        ).all()
    missing = sorted(set(claims.jobs) - {job_id for job_id, _, _ in rows})
    if missing:
        raise UnknownJob(f"no job {', '.join(map(str, missing))}; `nightshift jobs` lists the jobs")
    claims.job_owners = sorted({owner for _, owner, _ in rows})
    claims.max_job_priority = max((p for _, _, p in rows), default=None)
