"""The gate: the only way any caller (CLI, library, agent graph, daemon) runs a skill.

`Gate.call(ctx, skill, args)` validates the arguments with the skill's input model, reads the
files they name once (hashing them), evaluates the policy on what the call claims, records the
audit, and either runs the skill or raises `ApprovalRequired`. Calling again with the same call id
resumes that call: the gate checks that the approval was given for this skill, these canonical
arguments and these file contents, that the signed votes in the audit reach its quorum (the
approval row alone is not trusted), claims it (approved → executing, one process wins), runs it and
records the result on the approval, so an approved call runs exactly once whoever resumes it.
Nothing hands the gate a verdict; skills know nothing of permission.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel
from sqlmodel import col, select

from nightshift.policies.approvals import Approvals, claimer_id
from nightshift.policies.audit import AuditLog, job_id_of
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.killswitch import pause_info
from nightshift.runtime.errors import (
    ApprovalRejected,
    ApprovalRequired,
    BadArguments,
    Paused,
    PolicyDenied,
    SkillFailed,
    UnknownJob,
)
from nightshift.runtime.store.db import Approval, AuditEvent, Job, Store, dumps
from nightshift.runtime.yamlfile import MAX_DEPTH, bounds_problem
from nightshift.skills.base import Claims, Skill, SkillContext, SkillInput
from nightshift.skills.registry import get_skill

# How a call reached the gate: a person at a terminal may confirm their own request there.
Via = Literal["terminal", "api", "agent", "system", "chat"]
# The doors where the requester is a person who can answer now (a shell, the chat TUI).
PERSON_HERE: tuple[Via, ...] = ("terminal", "chat")
# confirm(request) -> True (yes) / False (no); given only where a person can answer now.
Confirm = Callable[[dict[str, Any]], bool]
# Arguments carry a spec (or a list of them) a few levels down: a file's spec at MAX_DEPTH fits.
ARGS_MAX_DEPTH = MAX_DEPTH + 4


class Gate:
    def __init__(self, engine: PolicyEngine, audit: AuditLog, approvals: Approvals, store: Store):
        self.engine = engine
        self.audit = audit
        self.approvals = approvals
        self.store = store

    def call(
        self,
        ctx: SkillContext,
        skill: Skill | str,
        args: dict[str, Any] | BaseModel,
        *,
        via: Via = "api",
        thread_id: str | None = None,
        confirm: Confirm | None = None,
        on_verdict: Callable[[Verdict], None] | None = None,
    ) -> BaseModel:
        """Run one call if the policy allows it (or its approval holds); raise otherwise.

        BadArguments: the input model refused the arguments. Refused (PolicyDenied, Paused,
        ApprovalRejected): nothing ran. ApprovalRequired: parked under an approval id; call again
        with the same `ctx.call_id` once it is decided. SkillFailed (or the skill's own error):
        it ran and failed; the audit and the approval record the failure.
        """
        if ctx.call_id is None:
            ctx.call_id = f"gate-{uuid.uuid4().hex}"
        skill = get_skill(skill) if isinstance(skill, str) else skill
        inp, canonical, files, claims = self._resolve(ctx, skill, args)
        verdict, event = self._verdict(ctx, skill, canonical, claims)
        if on_verdict is not None:
            on_verdict(verdict)
        if verdict.decision == "deny":
            exc_type = Paused if verdict.rule == "kill_switch" else PolicyDenied
            self._refuse(
                ctx,
                skill,
                canonical,
                exc_type(f"{skill.name}: denied by {verdict.rule}: " + "; ".join(verdict.reasons)),
                before=[event],
            )
        approval = None
        if verdict.decision == "allow":  # the verdict and the start in one transaction
            return self._run(ctx, skill, inp, canonical, verdict, None, before=[event])
        if verdict.decision == "needs_approval":
            self.audit.append_many([event])
            approval = self._approval(
                ctx, skill, canonical, files, verdict, via, thread_id, confirm
            )
            if approval.state == "executed":  # carried out already (by us before, or the loop)
                return skill.output_model.model_validate(approval.result)
            if approval.state == "failed":
                raise SkillFailed(
                    f"{skill.name} (approval {approval.id}) ran and failed: {approval.error}"
                )
        return self._run(ctx, skill, inp, canonical, verdict, approval)

    def resume(self, approval_id: int, context: Callable[[str, str], SkillContext]) -> BaseModel:
        """Carry out a decided approval whose requester is gone (the daemon, `run --resume`):
        the same checks as the first call, as the requester, under the same call id."""
        row = self.approvals.get(approval_id)
        ctx = context(row.requester, row.call_id)
        return self.call(
            ctx,
            row.skill,
            row.args,
            via="system" if row.requested_via == "system" else "api",
            thread_id=row.thread_id,
        )

    # The steps -----------------------------------------------------------------------------------

    def _resolve(
        self, ctx: SkillContext, skill: Skill, args: dict[str, Any] | BaseModel
    ) -> tuple[BaseModel, dict[str, Any], dict[str, str], Claims]:
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
                self.audit.append(
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
                self._claim_jobs(claims)
        except BadArguments as exc:
            raw = args.model_dump(mode="json") if isinstance(args, BaseModel) else dict(args)
            self.audit.append(
                ctx.principal,
                "skill.bad_arguments",
                skill=skill.name,
                call_id=ctx.call_id,
                job_id=job_id_of(raw),
                ts=ctx.now,
                payload={"args": raw, "error": str(exc)},
            )
            raise
        return inp, inp.model_dump(mode="json"), files, claims

    def _claim_jobs(self, claims: Claims) -> None:
        """The owners and highest priority of the jobs a call touches; a job that does not exist
        is a bad argument (the caller retries), never a call to approve."""
        with self.store.session() as s:
            rows = s.exec(
                select(Job.id, Job.owner, Job.priority).where(col(Job.id).in_(claims.jobs))
            ).all()
        missing = sorted(set(claims.jobs) - {job_id for job_id, _, _ in rows})
        if missing:
            raise UnknownJob(
                f"no job {', '.join(map(str, missing))}; `nightshift jobs` lists the jobs"
            )
        claims.job_owners = sorted({owner for _, owner, _ in rows})
        claims.max_job_priority = max((p for _, _, p in rows), default=None)

    def _verdict(
        self, ctx: SkillContext, skill: Skill, canonical: dict[str, Any], claims: Claims
    ) -> tuple[Verdict, dict[str, Any]]:
        """The verdict and its audit event (appended by the caller with what follows it)."""
        paused = pause_info(self.store) if skill.capability != "read" else None
        if paused is not None:
            verdict = Verdict(
                decision="deny",
                rule="kill_switch",
                reasons=[
                    f"paused by {paused['by']} ({paused['reason']}): run `nightshift resume` to let "
                    f"{skill.capability} skills run again"
                ],
            )
        else:
            verdict = self.engine.evaluate(ctx.principal, skill, canonical, claims)
        return verdict, _event(
            ctx,
            skill,
            canonical,
            "policy.verdict",
            {
                "skill": skill.name,
                "capability": skill.capability,
                "args": canonical,
                "claims": claims.model_dump(mode="json"),
                "decision": verdict.decision,
                "rule": verdict.rule,
                "reasons": verdict.reasons,
                "quorum": verdict.quorum,
                "expires_min": verdict.expires_min,
            },
        )

    def _refuse(
        self,
        ctx: SkillContext,
        skill: Skill,
        canonical: dict[str, Any],
        exc: Exception,
        before: list[dict[str, Any]] | None = None,
    ) -> None:
        self.audit.append_many(
            [*(before or []), _event(ctx, skill, canonical, "skill.refused", {"error": str(exc)})]
        )
        raise exc

    def _approval(
        self,
        ctx: SkillContext,
        skill: Skill,
        canonical: dict[str, Any],
        files: dict[str, str],
        verdict: Verdict,
        via: Via,
        thread_id: str | None,
        confirm: Confirm | None,
    ) -> Approval:
        """The call's approval, opened on first sight, checked against the call on every later
        one; returns it approved (claimed by this process), executed or failed, else raises."""
        assert ctx.call_id is not None
        row = self.approvals.for_call(ctx.call_id)
        if row is None:
            expires = (
                ctx.now + timedelta(minutes=verdict.expires_min) if verdict.expires_min else None
            )
            row = self.approvals.request(
                ctx.call_id,
                skill,
                canonical,
                ctx.principal,
                verdict.rule,
                verdict.quorum,
                expires,
                thread_id,
                files=files,
                via=via,
            )
        else:
            self._matches(ctx, skill, canonical, files, row)
        row = self.approvals.status(row.id, ctx.now)  # type: ignore[arg-type]
        if (
            row.state == "pending"
            and confirm is not None
            and via in PERSON_HERE
            and not verdict.from_others
            and self.engine.canonical(ctx.principal) == self.engine.canonical(row.requester)
        ):
            yes = confirm(
                {
                    "approval_id": row.id,
                    "call_id": row.call_id,
                    "skill": row.skill,
                    "args": row.args,
                    "files": row.files,
                    "rule": row.rule,
                    "reasons": verdict.reasons,
                }
            )
            row = self.approvals.confirm(row.id, ctx.principal, yes, ctx.now)  # type: ignore[arg-type]
        if row.state == "pending":
            who = (
                "principals other than the requester"
                if verdict.from_others or confirm is None
                else "a confirmation"
            )
            raise ApprovalRequired(
                f"{skill.name} needs approval {row.id} ({row.quorum} from {who}; rule "
                f"{row.rule}): `nightshift approvals approve {row.id}` from another principal's "
                f"shell, or `nightshift approvals show {row.id}`",
                approval_id=row.id,  # type: ignore[arg-type]
                call_id=row.call_id,
                skill=row.skill,
                quorum=row.quorum,
                rule=row.rule,
            )
        if row.state in ("rejected", "expired"):
            self._refuse(
                ctx,
                skill,
                canonical,
                ApprovalRejected(
                    f"approval {row.id} for {skill.name} was {row.state}; nothing ran"
                ),
            )
        if row.state in ("approved", "executing"):
            why = self.approvals.unsupported(row)
            if why is not None:
                self.approvals.refuse_unsupported(row, why, ctx.now)
                self._refuse(
                    ctx,
                    skill,
                    canonical,
                    PolicyDenied(
                        f"approval {row.id} for {skill.name} is {row.state} in the store, but {why}: "
                        "the row was changed outside nightshift, so nothing ran and the approval "
                        "is now rejected. Run `nightshift audit verify`, and request the call again"
                    ),
                )
            row = self._claim(row, ctx)
        return row

    def _matches(
        self,
        ctx: SkillContext,
        skill: Skill,
        canonical: dict[str, Any],
        files: dict[str, str],
        row: Approval,
    ) -> None:
        """An approval is spent only on the call it was given for."""
        why = None
        if row.skill != skill.name:
            why = f"it was given for {row.skill}, not {skill.name}"
        elif dumps(row.args) != dumps(canonical):
            why = "it was given for other arguments"
        else:
            changed = [p for p in set(row.files) | set(files) if row.files.get(p) != files.get(p)]
            if changed:
                why = (
                    f"{', '.join(sorted(changed))} changed since it was requested (approved "
                    "content is not the content that would run)"
                )
        if why:
            self._refuse(
                ctx,
                skill,
                canonical,
                PolicyDenied(
                    f"approval {row.id} does not cover this call: {why}; request a new approval "
                    "(a new call)"
                ),
            )

    def _claim(self, row: Approval, ctx: SkillContext) -> Approval:
        """approved → executing for this process; if another live process is carrying it out,
        wait for its result (it is never run twice)."""
        me = claimer_id()
        while True:
            claimed = self.approvals.claim(row.id, me, ctx.now)  # type: ignore[arg-type]
            if claimed.state == "executing" and claimed.claimed_by == me:
                return claimed
            if claimed.state in ("executed", "failed"):
                return claimed
            time.sleep(0.1)  # another live process holds it; its result lands on the row

    def _run(
        self,
        ctx: SkillContext,
        skill: Skill,
        inp: BaseModel,
        canonical: dict[str, Any],
        verdict: Verdict,
        approval: Approval | None,
        before: list[dict[str, Any]] | None = None,
    ) -> BaseModel:
        """Run an allowed (or approved and claimed) call, auditing its start and result: one
        transaction before the side effect, one after. A read, or a skill whose only effects are
        rows in the store, has no side effect to record first: one transaction holds its rows
        and its events."""
        if approval is None and (skill.store_only or skill.capability == "read"):
            return self._run_at_once(ctx, skill, inp, canonical, verdict, before or [])
        self.audit.append_many([*(before or []), _start(ctx, skill, canonical, verdict, approval)])
        try:
            result = skill.fn(ctx, inp)
        except Exception as exc:
            failed = _failed(ctx, skill, canonical, exc)
            self.audit.append_many([failed])
            if approval is not None:
                self.approvals.finish(
                    approval.id,
                    ok=False,
                    result=None,
                    error=failed["payload"]["error"],  # type: ignore[arg-type]
                    now=ctx.now,
                )
            raise
        done = _done(ctx, skill, canonical, result)
        self.audit.append_many([done])
        if approval is not None:
            self.approvals.finish(
                approval.id,
                ok=True,
                result=done["payload"]["result"],
                error=None,  # type: ignore[arg-type]
                now=ctx.now,
            )
        return result

    def _run_at_once(
        self,
        ctx: SkillContext,
        skill: Skill,
        inp: BaseModel,
        canonical: dict[str, Any],
        verdict: Verdict,
        before: list[dict[str, Any]],
    ) -> BaseModel:
        start = _start(ctx, skill, canonical, verdict, None)
        if not skill.store_only:  # a read runs on its own sessions, holding no lock meanwhile
            try:
                result = skill.fn(ctx, inp)
            except Exception as exc:
                self.audit.append_many([*before, start, _failed(ctx, skill, canonical, exc)])
                raise
            self.audit.append_many([*before, start, _done(ctx, skill, canonical, result)])
            return result
        # The skill's first session begins the transaction, under the write lock.
        first = self.audit.prepare([*before, start])
        with self.store.call_transaction(AuditEvent.__tablename__) as tx:
            try:
                result = skill.fn(ctx, inp)
            except Exception as exc:
                tx.rollback()  # nothing it wrote stays; the audit says so
                failed = _failed(ctx, skill, canonical, exc)
                failed["payload"]["rolled_back"] = True
                self.audit.append_many([*before, start, failed])
                raise
            self.audit.append_in(
                tx, first, self.audit.prepare([_done(ctx, skill, canonical, result)])
            )
            tx.commit()
        return result


def _start(
    ctx: SkillContext,
    skill: Skill,
    canonical: dict[str, Any],
    verdict: Verdict,
    approval: Approval | None,
) -> dict[str, Any]:
    payload = {
        "args": canonical,
        "capability": skill.capability,
        "rule": verdict.rule,
        "approval_id": approval.id if approval else None,
    }
    return _event(ctx, skill, canonical, "skill.start", payload)


def _failed(
    ctx: SkillContext, skill: Skill, canonical: dict[str, Any], exc: Exception
) -> dict[str, Any]:
    error = f"{type(exc).__name__}: {exc}"
    return _event(ctx, skill, canonical, "skill.result", {"ok": False, "error": error})


def _done(
    ctx: SkillContext, skill: Skill, canonical: dict[str, Any], result: BaseModel
) -> dict[str, Any]:
    out = result.model_dump(mode="json")
    return _event(ctx, skill, canonical, "skill.result", {"ok": True, "result": out})


def _event(
    ctx: SkillContext, skill: Skill, canonical: dict[str, Any], action: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "actor": ctx.principal,
        "action": action,
        "skill": skill.name,
        "call_id": ctx.call_id,
        "job_id": job_id_of(canonical),
        "ts": ctx.now,
        "payload": payload,
    }
