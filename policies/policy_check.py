"""Trying a policy on recorded history, before it decides anything.

Every call the gate judged left a `policy.verdict` audit event: who asked, which skill (and its
capability), the canonical arguments, what they claimed (GPUs, images, the jobs touched, their
owners and highest priority) and the outcome. `check_policy` judges each of those calls again
with a candidate policy and reports, call by call, where the outcome would differ (allow ->
needs_approval, deny -> allow, quorum 1 -> 2: plain ASCII, as JSON and chat cards show it), with totals. It only reads: a person trying a
policy, and the approvers of `apply_policy`, see what it does before it does anything.

The kill switch's refusals (rule `kill_switch`) are not the policy's: they are counted, not
replayed. A different deciding rule with the same decision and quorum is not a change.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func
from sqlmodel import col, select

from nightshift.policies.audit import iso_utc
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.model import Policy
from nightshift.policies.policy_source import policy_from_text
from nightshift.runtime.store.db import AuditEvent, Store
from nightshift.skills.apply_policy import ApplyCheck, ApplyReview
from nightshift.skills.base import Capability, Claims, Skill, SkillContext, SkillInput

Decision = Literal["allow", "deny", "needs_approval"]
VERDICT = "policy.verdict"
KILL_SWITCH = "kill_switch"
ARGS_SHOWN = 80  # characters of a call's arguments in the report


class Window(BaseModel):
    """Which recorded calls to replay."""

    since: datetime | None = Field(None, description="Recorded at or after this time (UTC)")
    after_event: int | None = Field(None, description="Audit event ids above this")
    through_event: int | None = Field(None, description="Audit event ids up to this")
    exclude_call: str | None = Field(None, description="A call id whose verdicts are skipped")


class RecordedCall(BaseModel):
    """One judged call, as its `policy.verdict` event recorded it."""

    event_id: int
    ts: str
    principal: str
    skill: str
    capability: Capability
    call_id: str | None = None
    job_id: int | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    claims: Claims = Field(default_factory=Claims)
    decision: Decision
    rule: str
    quorum: int = 0


class Outcome(BaseModel):
    decision: Decision
    rule: str
    quorum: int = Field(0, description="Approvals needed (needs_approval)")


class ReplayedCall(BaseModel):
    """One call judged again: what was recorded, what the candidate says, and the change."""

    event_id: int
    ts: str
    principal: str
    skill: str
    job_id: int | None
    args: str = Field(description="The arguments, shortened")
    before: Outcome
    after: Outcome
    change: str | None = Field(
        description="`allow -> needs_approval`, `quorum 1 -> 2`, ...; None: the same outcome"
    )


class CheckTotals(BaseModel):
    replayed: int = 0
    unchanged: int = 0
    changed: int = 0
    by_change: dict[str, int] = Field(
        default_factory=dict, description="Changed calls per change, most frequent first"
    )
    kill_switch: int = Field(0, description="Kill-switch refusals: not the policy's, not replayed")
    unreadable: int = Field(0, description="Verdict events this version cannot read back")


class CheckReport(BaseModel):
    since: datetime | None
    through_event: int = Field(description="The newest audit event id the replay covers")
    totals: CheckTotals
    calls: list[ReplayedCall] = Field(description="Every replayed call, oldest first")

    def changes(self) -> list[ReplayedCall]:
        return [c for c in self.calls if c.change is not None]

    def summary(self) -> str:
        """One line, e.g. `replayed 120 calls: 3 allow -> needs_approval, 1 deny -> allow`."""
        t = self.totals
        changes = ", ".join(f"{n} {label}" for label, n in t.by_change.items()) or "no change"
        text = f"replayed {t.replayed} call{'' if t.replayed == 1 else 's'}: {changes}"
        if t.kill_switch:
            text += f" ({t.kill_switch} kill-switch refusals not replayed)"
        return text


def read_calls(store: Store, window: Window) -> tuple[list[RecordedCall], int, CheckTotals]:
    """The recorded verdicts in the window, the newest audit event id it covers, and the
    totals of what was skipped (kill switch, unreadable). Reads only, in one transaction."""
    skipped = CheckTotals()
    q = select(AuditEvent).where(AuditEvent.action == VERDICT)
    if window.since is not None:
        q = q.where(col(AuditEvent.ts) >= iso_utc(window.since))
    if window.after_event is not None:
        q = q.where(col(AuditEvent.id) > window.after_event)
    if window.exclude_call is not None:
        q = q.where(col(AuditEvent.call_id).is_distinct_from(window.exclude_call))
    with store.session() as s:
        newest = s.exec(select(func.max(AuditEvent.id))).one() or 0
        through = newest if window.through_event is None else min(newest, window.through_event)
        rows = list(s.exec(q.where(col(AuditEvent.id) <= through).order_by(col(AuditEvent.id))))
    calls = []
    for row in rows:
        p = row.payload or {}
        if p.get("rule") == KILL_SWITCH:
            skipped.kill_switch += 1
            continue
        try:
            calls.append(
                RecordedCall(
                    event_id=row.id,
                    ts=row.ts,
                    principal=row.actor,
                    skill=p.get("skill") or row.skill,
                    capability=p.get("capability"),
                    call_id=row.call_id,
                    job_id=row.job_id,
                    args=p.get("args") or {},
                    claims=p.get("claims") or {},
                    decision=p.get("decision"),
                    rule=p.get("rule"),
                    quorum=p.get("quorum") or 0,
                )
            )
        except ValidationError:
            skipped.unreadable += 1
    return calls, through, skipped


def replay(calls: list[RecordedCall], candidate: Policy) -> list[ReplayedCall]:
    """Each call judged by the candidate. Pure: the recorded skill name and capability are
    judged (a skill since renamed or uninstalled is judged as it was)."""
    engine = PolicyEngine(candidate)
    out = []
    for call in calls:
        verdict = engine.evaluate(
            call.principal, _recorded_skill(call.skill, call.capability), call.args, call.claims
        )
        before = Outcome(decision=call.decision, rule=call.rule, quorum=call.quorum)
        after = Outcome(decision=verdict.decision, rule=verdict.rule, quorum=verdict.quorum)
        out.append(
            ReplayedCall(
                event_id=call.event_id,
                ts=call.ts,
                principal=call.principal,
                skill=call.skill,
                job_id=call.job_id,
                args=args_summary(call.args),
                before=before,
                after=after,
                change=change_of(before, after),
            )
        )
    return out


def check_policy(store: Store, candidate: Policy, window: Window | None = None) -> CheckReport:
    """The recorded calls in the window judged again by `candidate`; nothing is written."""
    window = window or Window()
    calls, through, totals = read_calls(store, window)
    replayed = replay(calls, candidate)
    counts = Counter(c.change for c in replayed if c.change is not None)
    totals.replayed = len(replayed)
    totals.changed = sum(counts.values())
    totals.unchanged = totals.replayed - totals.changed
    totals.by_change = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return CheckReport(since=window.since, through_event=through, totals=totals, calls=replayed)


def review(store: Store, check: ApplyCheck) -> ApplyReview:
    """apply_policy's check when it runs: the summary of the window its approvers saw, and the
    calls recorded after it (this call's own aside) that the policy would also change."""
    candidate = policy_from_text(check.text, check.path)
    seen = check_policy(
        store,
        candidate,
        Window(since=check.since, through_event=check.through_event, exclude_call=check.call_id),
    )
    later = check_policy(
        store,
        candidate,
        Window(since=check.since, after_event=check.through_event, exclude_call=check.call_id),
    )
    return ApplyReview(
        summary=seen.summary(),
        later_calls=later.totals.replayed,
        later_changes=[describe(c) for c in later.changes()],
    )


def change_of(before: Outcome, after: Outcome) -> str | None:
    if before.decision != after.decision:
        return f"{before.decision} -> {after.decision}"
    if after.decision == "needs_approval" and before.quorum != after.quorum:
        return f"quorum {before.quorum} -> {after.quorum}"
    return None


def describe(call: ReplayedCall) -> str:
    """One changed call in a sentence: `event 57: alice submit_job allow -> needs_approval`."""
    return f"event {call.event_id}: {call.principal} {call.skill} {call.change}"


def args_summary(args: dict[str, Any]) -> str:
    """`job_id=3, reason=oom`: scalars as they are, a mapping or list by its size, shortened."""
    parts = []
    for key, value in args.items():
        if value is None or value == {} or value == []:
            continue
        if isinstance(value, dict):
            shown = f"{{{len(value)} keys}}"
        elif isinstance(value, list):
            shown = f"[{len(value)} items]"
        else:
            shown = str(value)
        parts.append(f"{key}={shown}")
    text = ", ".join(parts)
    return text if len(text) <= ARGS_SHOWN else text[: ARGS_SHOWN - 1] + "…"


def _recorded_skill(name: str, capability: Capability) -> Skill[SkillInput, BaseModel]:
    """A stand-in with the recorded name and capability: all the policy judges of a skill."""
    return Skill(name, "a recorded call", capability, SkillInput, BaseModel, _not_run)


def _not_run(ctx: SkillContext, inp: SkillInput) -> BaseModel:
    raise AssertionError("a replayed call is judged, never run")
