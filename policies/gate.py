"""The gate: the only way any caller (CLI, library, agent graph, daemon) runs a skill.

`Gate.call(ctx, skill, args)` validates the arguments with the skill's input model, reads the
files they name once (hashing them: call_request.py), evaluates the policy on what the call
claims, records the audit, and either runs the skill (skill_run.py) or raises `ApprovalRequired`.
Calling again with the same call id resumes that call: its approval must cover this skill, these
canonical arguments and these file contents, and the signed votes in the audit must reach its
quorum (the approval row alone is not trusted); then it is claimed (approved → executing, one
process wins: approval_flow.py), run, and its result recorded on the approval, so an approved call
runs exactly once whoever resumes it. Nothing hands the gate a verdict; skills know nothing of
permission.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nightshift.policies.approval_flow import (
    CLAIM_DEADLINE_S,
    PERSON_HERE,
    Confirm,
    Via,
    obtain_approval,
)
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.call_request import ARGS_MAX_DEPTH, CallRequest, resolve
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.killswitch import pause_info
from nightshift.policies.skill_run import Event, event, refuse, run
from nightshift.runtime.errors import Paused, PolicyDenied, SkillFailed
from nightshift.runtime.store.db import Store
from nightshift.skills.base import Skill, SkillContext
from nightshift.skills.registry import get_skill

__all__ = ["ARGS_MAX_DEPTH", "PERSON_HERE", "Confirm", "Gate", "Via"]


class Gate:
    def __init__(
        self,
        engine: PolicyEngine,
        audit: AuditLog,
        approvals: Approvals,
        store: Store,
        *,
        claim_deadline_s: float = CLAIM_DEADLINE_S,
    ):
        self.engine = engine
        self.audit = audit
        self.approvals = approvals
        self.store = store
        # How long a call waits while another process carries out its approval.
        self.claim_deadline_s = claim_deadline_s

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
        with the same `ctx.call_id` once it is decided. CallInProgress: another process is
        carrying out its approval; call again later. SkillFailed (or the skill's own error):
        it ran and failed; the audit and the approval record the failure.
        """
        if ctx.call_id is None:
            ctx.call_id = f"gate-{uuid.uuid4().hex}"
        skill = get_skill(skill) if isinstance(skill, str) else skill
        request = resolve(self.audit, self.store, ctx, skill, args)
        verdict, verdict_event = self._verdict(ctx, request)
        if on_verdict is not None:
            on_verdict(verdict)
        if verdict.decision == "deny":
            exc_type = Paused if verdict.rule == "kill_switch" else PolicyDenied
            reasons = "; ".join(verdict.reasons)
            exc = exc_type(f"{skill.name}: denied by {verdict.rule}: {reasons}")
            refuse(self.audit, ctx, request, exc, before=[verdict_event])
        if verdict.decision == "allow":  # the verdict and the start in one transaction
            return run(
                self.audit, self.approvals, self.store, ctx, request, verdict, None, [verdict_event]
            )
        self.audit.append_many([verdict_event])
        approval = obtain_approval(
            self.approvals,
            self.engine,
            ctx,
            request,
            verdict,
            via=via,
            thread_id=thread_id,
            confirm=confirm,
            deadline_s=self.claim_deadline_s,
        )
        if approval.state == "executed":  # carried out already (by us before, or the loop)
            return skill.output_model.model_validate(approval.result)
        if approval.state == "failed":
            raise SkillFailed(
                f"{skill.name} (approval {approval.id}) ran and failed: {approval.error}"
            )
        return run(self.audit, self.approvals, self.store, ctx, request, verdict, approval)

    def decide(self, ctx: SkillContext, skill: Skill | str, args: dict[str, Any]) -> Verdict:
        """Judge a read that goes on after the decision (a job's follow: agent/doors/follow.py)
        once, auditing the verdict as one event; the caller then reads with the skill itself.
        Only what the policy allows at once goes on: a denial, or a verdict that asks for an
        approval, is refused and audited as a call's would be."""
        if ctx.call_id is None:
            ctx.call_id = f"gate-{uuid.uuid4().hex}"
        skill = get_skill(skill) if isinstance(skill, str) else skill
        request = resolve(self.audit, self.store, ctx, skill, args)
        verdict, verdict_event = self._verdict(ctx, request)
        if verdict.decision != "allow":
            exc_type = Paused if verdict.rule == "kill_switch" else PolicyDenied
            reasons = "; ".join(verdict.reasons)
            if verdict.decision != "deny":
                reasons = (
                    f"needs an approval, and a follow reads only what is allowed at once. {reasons}"
                )
            exc = exc_type(f"{skill.name}: denied by {verdict.rule}: {reasons}")
            refuse(self.audit, ctx, request, exc, before=[verdict_event])
        self.audit.append_many([verdict_event])
        return verdict

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

    def _verdict(self, ctx: SkillContext, request: CallRequest) -> tuple[Verdict, Event]:
        """The verdict and its audit event (appended by the caller with what follows it): the
        kill switch stops every skill but reads; else the policy judges what the call claims."""
        skill = request.skill
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
            verdict = self.engine.evaluate(ctx.principal, skill, request.canonical, request.claims)
        return verdict, event(
            ctx,
            request,
            "policy.verdict",
            {
                "skill": skill.name,
                "capability": skill.capability,
                "args": request.canonical,
                "claims": request.claims.model_dump(mode="json"),
                "decision": verdict.decision,
                "rule": verdict.rule,
                "reasons": verdict.reasons,
                "quorum": verdict.quorum,
                "expires_min": verdict.expires_min,
            },
        )
