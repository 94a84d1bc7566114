"""Pending approvals in the store: requested once per call, decided by votes from any channel.

pending → approved (distinct approving principals other than the requester reach the quorum)
        | rejected (one rejection) | expired (no decision before `expires_at`, marked lazily).
Every request, vote (counted, ignored or refused) and decision is audited.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from nightshift.policies.audit import AuditLog, iso_utc, job_id_of, write_transaction
from nightshift.policies.engine import PolicyEngine
from nightshift.runtime.errors import OperatorError, PolicyDenied
from nightshift.runtime.store import Approval, Store, dumps
from nightshift.skills.base import Skill

_TABLE = Approval.__tablename__


class UnknownApproval(OperatorError):
    """No approval has that id; `nightshift approvals` lists the pending ones."""


def _naive_utc(when: datetime) -> datetime:
    if when.tzinfo is not None:
        return when.astimezone(UTC).replace(tzinfo=None)
    return when


class Approvals:
    """Requests and votes. With an `engine`, principals are compared by their canonical name
    (`slack:U1` mapped to alice is alice) and only roles with `can_approve` may vote."""

    def __init__(self, store: Store, audit: AuditLog, *, engine: PolicyEngine | None = None):
        self.store = store
        self.audit = audit
        self.engine = engine

    def _name(self, principal: str) -> str:
        return self.engine.canonical(principal) if self.engine else principal

    def request(self, call_id: str, skill: Skill | str, args: dict[str, Any], requester: str,
                rule: str, quorum: int, expires_at: datetime | None,
                thread_id: str | None = None) -> Approval:
        """Open an approval for a call; asking again for the same call returns the first one."""
        name = skill if isinstance(skill, str) else skill.name
        existing = self.for_call(call_id)
        if existing is not None:
            return existing
        row = Approval(call_id=call_id, skill=name, args=_plain(args), requester=requester,
                       rule=rule, quorum=max(1, quorum), thread_id=thread_id,
                       created_at=_naive_utc(self.audit.clock()),
                       expires_at=_naive_utc(expires_at) if expires_at else None)
        try:
            with self.store.session() as s:
                s.add(row)
        except IntegrityError:  # another process asked for the same call first
            found = self.for_call(call_id)
            assert found is not None
            return found
        self.audit.append(requester, "approval.request", skill=name, call_id=call_id,
                          job_id=job_id_of(row.args), payload={
                              "approval_id": row.id, "args": row.args, "rule": rule,
                              "quorum": row.quorum, "thread_id": thread_id,
                              "expires_at": iso_utc(row.expires_at) if row.expires_at else None})
        return row

    def vote(self, approval_id: int, principal: str, approve: bool, now: datetime) -> Approval:
        """Record one vote and decide if it settles the approval.

        The requester may withdraw (reject) but never approve its own call: PolicyDenied. A second
        vote from the same principal counts once; a vote on a closed approval changes nothing and
        the returned approval says why (approved, rejected or expired).
        """
        now = _naive_utc(now)
        voter = self._name(principal)
        refused: str | None = None
        counted, note, decided = False, "", False
        with write_transaction(self.store, _TABLE) as s:
            row = s.get(Approval, approval_id)
            if row is None:
                raise UnknownApproval(f"no approval with id {approval_id}; "
                                      "`nightshift approvals` lists the pending ones")
            if _expire(row, now):
                decided = True
            if row.state != "pending":
                note = f"approval is already {row.state}"
            elif approve and voter == self._name(row.requester):
                refused = (f"{principal} requested call {row.call_id} and cannot approve it: the "
                           "requester never counts toward its own quorum; ask another principal")
            elif self.engine is not None and not self.engine.may_approve(principal):
                refused = (f"{principal} (roles: {', '.join(self.engine.roles_of(principal))}) may "
                           "not vote on approvals: give one of its roles can_approve in the policy")
            elif any(v["principal"] == voter and v["approve"] == approve for v in row.votes):
                note = f"{voter} already voted {'approve' if approve else 'reject'}; counted once"
            else:
                counted = True
                row.votes = [*row.votes, {"principal": voter, "as": principal,
                                          "approve": approve, "at": iso_utc(now)}]
                if not approve:
                    row.state = "rejected"
                elif _approvals(row) >= row.quorum:
                    row.state = "approved"
                if row.state != "pending":
                    row.decided_at, decided = now, True
            s.add(row)
        payload = {"approval_id": row.id, "approve": approve, "counted": counted,
                   "approvals": _approvals(row), "quorum": row.quorum, "state": row.state}
        if refused or note:
            payload["reason"] = refused or note
        self.audit.append(principal, "approval.vote_refused" if refused else "approval.vote",
                          skill=row.skill, call_id=row.call_id, job_id=job_id_of(row.args),
                          payload=payload, ts=now)
        if decided:
            self._audit_decision(row, now)
        if refused:
            raise PolicyDenied(refused)
        return row

    def status(self, approval_id: int, now: datetime) -> Approval:
        """The approval as of `now`, marked expired if its time has passed."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            row = s.get(Approval, approval_id)
            if row is None:
                raise UnknownApproval(f"no approval with id {approval_id}; "
                                      "`nightshift approvals` lists the pending ones")
            expired = _expire(row, now)
            s.add(row)
        if expired:
            self._audit_decision(row, now)
        return row

    def pending(self, now: datetime) -> list[Approval]:
        """Approvals still open at `now`, oldest first; overdue ones are marked expired."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            rows = list(s.exec(select(Approval).where(Approval.state == "pending")
                               .order_by(col(Approval.id))))
            expired = [r for r in rows if _expire(r, now)]
            for r in expired:
                s.add(r)
        for r in expired:
            self._audit_decision(r, now)
        return [r for r in rows if r.state == "pending"]

    def for_call(self, call_id: str) -> Approval | None:
        with self.store.session() as s:
            return s.exec(select(Approval).where(Approval.call_id == call_id)).first()

    def _audit_decision(self, row: Approval, now: datetime) -> None:
        self.audit.append("system" if row.state == "expired" else row.votes[-1]["principal"],
                          "approval.decided", skill=row.skill, call_id=row.call_id,
                          job_id=job_id_of(row.args), ts=now, payload={
                              "approval_id": row.id, "state": row.state, "rule": row.rule,
                              "quorum": row.quorum, "votes": row.votes})


def _expire(row: Approval, now: datetime) -> bool:
    if row.state == "pending" and row.expires_at is not None and now >= row.expires_at:
        row.state, row.decided_at = "expired", now
        return True
    return False


def _approvals(row: Approval) -> int:
    return len({v["principal"] for v in row.votes if v["approve"]})


def _plain(args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(dumps(args))
