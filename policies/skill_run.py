"""Running a resolved call, and the audit events that record it: its start and result (or why it
was refused), with who asked, what, under which rule and approval. The start is recorded before
the side effect and the result after it, so the audit says whether a call may have taken effect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import BaseModel

from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog, job_id_of
from nightshift.policies.call_request import CallRequest
from nightshift.policies.engine import Verdict
from nightshift.runtime.store.db import Approval, AuditEvent, Store
from nightshift.skills.base import SkillContext

Event = dict[str, Any]


def run(
    audit: AuditLog,
    approvals: Approvals,
    store: Store,
    ctx: SkillContext,
    request: CallRequest,
    verdict: Verdict,
    approval: Approval | None,
    before: Sequence[Event] = (),
) -> BaseModel:
    """Run an allowed (or approved and claimed) call, auditing its start and result: one
    transaction before the side effect, one after. A read, or a skill whose only effects are
    rows in the store, has no side effect to record first: one transaction holds its rows
    and its events."""
    skill = request.skill
    if approval is None and (skill.store_only or skill.capability == "read"):
        return _run_at_once(audit, store, ctx, request, verdict, before)
    audit.append_many([*before, _start(ctx, request, verdict, approval)])
    try:
        result = skill.fn(ctx, request.input)
    except Exception as exc:
        failed = _failed(ctx, request, exc)
        audit.append_many([failed])
        if approval is not None:
            approvals.finish(
                approval.id,  # type: ignore[arg-type]
                ok=False,
                result=None,
                error=failed["payload"]["error"],
                now=ctx.now,
            )
        raise
    done = _done(ctx, request, result)
    audit.append_many([done])
    if approval is not None:
        approvals.finish(
            approval.id,  # type: ignore[arg-type]
            ok=True,
            result=done["payload"]["result"],
            error=None,
            now=ctx.now,
        )
    return result


def refuse(
    audit: AuditLog,
    ctx: SkillContext,
    request: CallRequest,
    exc: Exception,
    before: Sequence[Event] = (),
) -> NoReturn:
    """Record that nothing ran, and why (after `before`, in one transaction); raise `exc`."""
    audit.append_many([*before, event(ctx, request, "skill.refused", {"error": str(exc)})])
    raise exc


def event(ctx: SkillContext, request: CallRequest, action: str, payload: Event) -> Event:
    """One audit event of this call, for `AuditLog.append_many`."""
    return {
        "actor": ctx.principal,
        "action": action,
        "skill": request.skill.name,
        "call_id": ctx.call_id,
        "job_id": job_id_of(request.canonical),
        "ts": ctx.now,
        "payload": payload,
    }


def _run_at_once(
    audit: AuditLog,
    store: Store,
    ctx: SkillContext,
    request: CallRequest,
    verdict: Verdict,
    before: Sequence[Event],
) -> BaseModel:
    skill = request.skill
    start = _start(ctx, request, verdict, None)
    if not skill.store_only:  # a read runs on its own sessions, holding no lock meanwhile
        try:
            result = skill.fn(ctx, request.input)
        except Exception as exc:
            audit.append_many([*before, start, _failed(ctx, request, exc)])
            raise
        audit.append_many([*before, start, _done(ctx, request, result)])
        return result
    # The skill's first session begins the transaction, under the write lock.
    first = audit.prepare([*before, start])
    with store.call_transaction(AuditEvent.__tablename__) as tx:
        try:
            result = skill.fn(ctx, request.input)
        except Exception as exc:
            tx.rollback()  # nothing it wrote stays; the audit says so
            failed = _failed(ctx, request, exc)
            failed["payload"]["rolled_back"] = True
            audit.append_many([*before, start, failed])
            raise
        audit.append_in(tx, first, audit.prepare([_done(ctx, request, result)]))
        tx.commit()
    return result


def _start(
    ctx: SkillContext, request: CallRequest, verdict: Verdict, approval: Approval | None
) -> Event:
    payload = {
        "args": request.canonical,
        "capability": request.skill.capability,
        "rule": verdict.rule,
        "approval_id": approval.id if approval else None,
    }
    return event(ctx, request, "skill.start", payload)


def _failed(ctx: SkillContext, request: CallRequest, exc: Exception) -> Event:
    error = f"{type(exc).__name__}: {exc}"
    return event(ctx, request, "skill.result", {"ok": False, "error": error})


def _done(ctx: SkillContext, request: CallRequest, result: BaseModel) -> Event:
    out = result.model_dump(mode="json")
    return event(ctx, request, "skill.result", {"ok": True, "result": out})
