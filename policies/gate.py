"""The gate around every skill call: kill switch, policy verdict, approval, then the skill, audited.

Skills know nothing of permission; the gate is the only place that decides, and it is thin: the
engine decides, `Approvals` holds the human decisions, `AuditLog` records all of it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog, job_id_of
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.killswitch import pause_info
from nightshift.runtime.errors import ApprovalRejected, Paused, PolicyDenied
from nightshift.runtime.store import Approval, Store, dumps
from nightshift.skills.base import Skill, SkillContext


class Gate:
    def __init__(self, engine: PolicyEngine, audit: AuditLog, approvals: Approvals, store: Store):
        self.engine = engine
        self.audit = audit
        self.approvals = approvals
        self.store = store

    def check(self, principal: str, skill: Skill, args: dict[str, Any], call_id: str | None,
              now: datetime) -> Verdict:
        """The audited verdict for one call; while paused, every non-read call is denied."""
        args = _plain(args)
        paused = pause_info(self.store) if skill.capability != "read" else None
        if paused is not None:
            verdict = Verdict(decision="deny", rule="kill_switch", reasons=[
                (f"paused by {paused['by']} ({paused['reason']}): run `nightshift resume` to let "
                f"{skill.capability} skills run again")])
        else:
            verdict = self.engine.evaluate(principal, skill, args)
        self.audit.append(principal, "policy.verdict", skill=skill.name, call_id=call_id,
                          job_id=job_id_of(args), ts=now, payload={
                              "skill": skill.name, "capability": skill.capability, "args": args,
                              "decision": verdict.decision, "rule": verdict.rule,
                              "reasons": verdict.reasons, "quorum": verdict.quorum,
                              "expires_min": verdict.expires_min})
        return verdict

    def request_approval(self, principal: str, skill: Skill, args: dict[str, Any], call_id: str,
                         verdict: Verdict, now: datetime, thread_id: str | None = None) -> Approval:
        """Open (or find) the approval a `needs_approval` verdict asks for."""
        expires = now + timedelta(minutes=verdict.expires_min) if verdict.expires_min else None
        return self.approvals.request(call_id, skill, _plain(args), principal, verdict.rule,
                                      verdict.quorum, expires, thread_id)

    def run(self, ctx: SkillContext, skill: Skill, args: dict[str, Any],
            verdict: Verdict) -> BaseModel:
        """Run an allowed (or approved) call, auditing its start and result; refuse the rest."""
        args = _plain(args)
        approval = None
        try:
            paused = pause_info(self.store) if skill.capability != "read" else None
            if paused is not None:
                raise Paused(f"paused by {paused['by']} ({paused['reason']}): run "
                             "`nightshift resume` first")
            if verdict.decision == "deny":
                raise PolicyDenied(f"{skill.name}: denied by {verdict.rule}: "
                                   + "; ".join(verdict.reasons))
            if verdict.decision == "needs_approval":
                approval = self._approved(ctx, skill, args)
        except (Paused, PolicyDenied, ApprovalRejected) as exc:
            self.audit.append(ctx.principal, "skill.refused", skill=skill.name, call_id=ctx.call_id,
                              job_id=job_id_of(args), ts=ctx.now, payload={"error": str(exc)})
            raise

        self.audit.append(ctx.principal, "skill.start", skill=skill.name, call_id=ctx.call_id,
                          job_id=job_id_of(args), ts=ctx.now, payload={
                              "args": args, "capability": skill.capability, "rule": verdict.rule,
                              "approval_id": approval.id if approval else None})
        try:
            result = skill(ctx, args)
        except Exception as exc:
            self.audit.append(ctx.principal, "skill.result", skill=skill.name, call_id=ctx.call_id,
                              job_id=job_id_of(args), ts=ctx.now,
                              payload={"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            raise
        self.audit.append(ctx.principal, "skill.result", skill=skill.name, call_id=ctx.call_id,
                          job_id=job_id_of(args), ts=ctx.now,
                          payload={"ok": True, "result": result.model_dump(mode="json")})
        return result

    def _approved(self, ctx: SkillContext, skill: Skill, args: dict[str, Any]) -> Approval:
        if ctx.call_id is None:
            raise PolicyDenied(f"{skill.name} needs an approval, and approvals are per call: "
                               "give the context a call_id")
        found = self.approvals.for_call(ctx.call_id)
        if found is None:
            raise PolicyDenied(f"{skill.name} needs an approval and none was requested for call "
                               f"{ctx.call_id}")
        approval = self.approvals.status(found.id, ctx.now)  # type: ignore[arg-type]
        if approval.state in ("rejected", "expired"):
            raise ApprovalRejected(f"approval {approval.id} for {skill.name} was {approval.state}; "
                                   "nothing ran")
        if approval.state != "approved":
            raise PolicyDenied(f"approval {approval.id} for {skill.name} is still pending "
                               f"({approval.quorum} needed): `nightshift approve {approval.id}`")
        if approval.skill != skill.name or dumps(approval.args) != dumps(args):
            raise PolicyDenied(f"approval {approval.id} was given for {approval.skill} with other "
                               "arguments than this call's; request a new approval")
        return approval


def _plain(args: dict[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(args, BaseModel):
        return args.model_dump(mode="json")
    return dict(args)
