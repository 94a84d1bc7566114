"""A call the policy parks for approval, from its first sight to the claim that lets it run.

The first call opens its approval; every later one with the same call id is checked against it:
an approval is spent only on the skill, canonical arguments and file contents it was given for.
A person at a terminal confirms their own request where the verdict lets them. The signed votes
in the audit must reach the quorum (the approval row alone is not trusted). Then the call is
claimed (approved → executing, one process wins). While another live process holds the claim,
its result is waited for up to a deadline, then `CallInProgress` says where the result will land:
nothing loops forever, and an approved call runs exactly once whoever resumes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from nightshift.policies.approvals import CLAIM_LEASE_S, Approvals, claimer_id
from nightshift.policies.audit import iso_utc
from nightshift.policies.call_request import CallRequest
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.skill_run import refuse
from nightshift.runtime.errors import (
    ApprovalRejected,
    ApprovalRequired,
    CallInProgress,
    PolicyDenied,
)
from nightshift.runtime.store.db import Approval, dumps
from nightshift.skills.base import SkillContext

# How a call reached the gate: a person at a terminal may confirm their own request there.
Via = Literal["terminal", "api", "agent", "system", "chat", "web"]
# The doors where the requester is a person who can answer now (a shell, the chat TUI, the web
# dashboard's confirmation page).
PERSON_HERE: tuple[Via, ...] = ("terminal", "chat", "web")
# confirm(request) -> True (yes) / False (no); given only where a person can answer now.
Confirm = Callable[[dict[str, Any]], bool]
# How long a call waits for another process carrying out its approval before CallInProgress.
CLAIM_DEADLINE_S = 30.0
# The waits between looks at a claim held elsewhere: from the first, doubling, up to the last.
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 1.0


def obtain_approval(
    approvals: Approvals,
    engine: PolicyEngine,
    ctx: SkillContext,
    request: CallRequest,
    verdict: Verdict,
    *,
    via: Via,
    thread_id: str | None,
    confirm: Confirm | None,
    deadline_s: float = CLAIM_DEADLINE_S,
    lease_s: float = CLAIM_LEASE_S,
) -> Approval:
    """The call's approval as of `ctx.now`: claimed by this process (`executing`, run it), or
    carried out already (`executed` or `failed`, its result recorded). Else it raises:
    ApprovalRequired (pending), ApprovalRejected (rejected or expired), PolicyDenied (it does not
    cover this call, or its signed audit does not carry it), CallInProgress (another live
    process still held the claim after `deadline_s`; claims past `lease_s` are taken over)."""
    assert ctx.call_id is not None
    row = approvals.for_call(ctx.call_id)
    if row is None:
        expires = ctx.now + timedelta(minutes=verdict.expires_min) if verdict.expires_min else None
        row = approvals.request(
            ctx.call_id,
            request.skill,
            request.canonical,
            ctx.principal,
            verdict.rule,
            verdict.quorum,
            expires,
            thread_id,
            files=request.files,
            via=via,
            approvers=verdict.approvers,
        )
    else:
        _matches(approvals, ctx, request, row)
    row = approvals.status(row.id, ctx.now)  # type: ignore[arg-type]
    if (
        row.state == "pending"
        and confirm is not None
        and via in PERSON_HERE
        and not verdict.from_others
        and engine.canonical(ctx.principal) == engine.canonical(row.requester)
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
        row = approvals.confirm(row.id, ctx.principal, yes, ctx.now)  # type: ignore[arg-type]
    if row.state == "pending":
        who = (
            "principals other than the requester"
            if verdict.from_others or confirm is None
            else "a confirmation"
        )
        raise ApprovalRequired(
            f"{request.skill.name} needs approval {row.id} ({row.quorum} from {who}; rule "
            f"{row.rule}): `nightshift approvals approve {row.id}` from another principal's "
            f"shell, or `nightshift approvals show {row.id}`",
            approval_id=row.id,  # type: ignore[arg-type]
            call_id=row.call_id,
            skill=row.skill,
            quorum=row.quorum,
            rule=row.rule,
        )
    if row.state in ("approved", "executing"):
        why = approvals.unsupported(row)
        if why is not None:
            approvals.refuse_unsupported(row, why, ctx.now)
            refuse(
                approvals.audit,
                ctx,
                request,
                PolicyDenied(
                    f"approval {row.id} for {request.skill.name} is {row.state} in the store, but {why}: "
                    "the row was changed outside nightshift, so nothing ran and the approval "
                    "is now rejected. Run `nightshift audit verify`, and request the call again"
                ),
            )
        row = _claimed(approvals, ctx, row, deadline_s, lease_s)
    if row.state in ("rejected", "expired"):  # also when rejected while another held it
        refuse(
            approvals.audit,
            ctx,
            request,
            ApprovalRejected(
                f"approval {row.id} for {request.skill.name} was {row.state}; nothing ran"
            ),
        )
    return row


def _matches(approvals: Approvals, ctx: SkillContext, request: CallRequest, row: Approval) -> None:
    """An approval is spent only on the call it was given for."""
    why = None
    if row.skill != request.skill.name:
        why = f"it was given for {row.skill}, not {request.skill.name}"
    elif dumps(row.args) != dumps(request.canonical):
        why = "it was given for other arguments"
    else:
        files = request.files
        changed = [p for p in set(row.files) | set(files) if row.files.get(p) != files.get(p)]
        if changed:
            why = (
                f"{', '.join(sorted(changed))} changed since it was requested (approved "
                "content is not the content that would run)"
            )
    if why:
        refuse(
            approvals.audit,
            ctx,
            request,
            PolicyDenied(
                f"approval {row.id} does not cover this call: {why}; request a new approval "
                "(a new call)"
            ),
        )


def _claimed(
    approvals: Approvals, ctx: SkillContext, row: Approval, deadline_s: float, lease_s: float
) -> Approval:
    """approved → executing for this process. If another live process is carrying it out, its
    result lands on the row: look again, waiting longer each time, until it does or `deadline_s`
    has passed (then CallInProgress). The clock for the lease is `ctx.now` plus the time waited,
    so a lease that runs out meanwhile is taken over."""
    me = claimer_id()
    began, pause = time.monotonic(), _POLL_FIRST_S
    while True:
        waited = time.monotonic() - began
        now = ctx.now + timedelta(seconds=waited)
        row = approvals.claim(row.id, me, now, lease_s=lease_s)  # type: ignore[arg-type]
        if row.state != "executing" or row.claimed_by == me:
            return row  # ours to run, carried out already, or no longer approved
        left = deadline_s - waited
        if left <= 0:
            since = iso_utc(row.claimed_at) if row.claimed_at else "an unknown time"
            raise CallInProgress(
                f"approval {row.id} for {row.skill} is being carried out by {row.claimed_by} "
                f"since {since}; its result lands on the approval: `nightshift approvals show "
                f"{row.id}`, or call again with call id {row.call_id}",
                approval_id=row.id,  # type: ignore[arg-type]
                call_id=row.call_id,
                skill=row.skill,
            )
        time.sleep(min(pause, left))
        pause = min(pause * 2, _POLL_MAX_S)
