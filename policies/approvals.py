"""Approvals in the store: requested once per call, decided by votes from any channel, carried
out once.

pending → approved (distinct approving principals other than the requester reach the quorum, or
                    the requester confirms at a terminal where the rule lets them)
        | rejected (one rejection) | expired (no decision before `expires_at`, marked lazily)
approved → executing (claimed by one live process) → executed | failed (the result is kept);
an `executing` claim whose process died, or whose lease ran out on another host, is taken over.
Every request, vote (counted, ignored or refused), decision and execution is audited, and the
audit's signed events are what an approval stands on: `unsupported` says whether the signed
request and votes in the chain reach the quorum, and the gate runs nothing they do not (a row set
to `approved` in the database by hand stays unexecuted).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import psutil
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from nightshift.policies.audit import AuditLog, iso_utc, job_id_of, write_transaction
from nightshift.policies.engine import PolicyEngine
from nightshift.runtime.errors import PolicyDenied, UnknownApproval
from nightshift.runtime.store.db import Approval, AuditEvent, Store, dumps
from nightshift.skills.base import Skill

_TABLE = Approval.__tablename__


_UNKNOWN = "no approval with id {id}; `nightshift approvals list` shows the pending ones"
# How long a claim by a process on another host holds: past it, that host is taken to have died
# with the call half done, and the call is taken over.
CLAIM_LEASE_S = 600.0


@cache
def _process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.3f}"


def claimer_id() -> str:
    """host:pid:start time of this process (a pid alone may be reused after a crash), #thread:
    who carries out an approved call. The daemon's loop and the requests it serves are threads of
    one process, each its own claimer, so two of them never both run one call."""
    return f"{_process_id()}#{threading.get_ident()}"


def claimer_alive(claimer: str | None) -> bool:
    """Whether the process that claimed a call still lives (on another host: assumed so)."""
    if not claimer:
        return False
    host, _, rest = claimer.split("#")[0].partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname():
        return True
    try:
        return f"{psutil.Process(int(pid)).create_time():.3f}" == started
    except (psutil.Error, ValueError):
        return False


def claim_stale(
    claimer: str | None, claimed_at: datetime | None, now: datetime, lease_s: float
) -> bool:
    """Whether an `executing` claim may be taken over as of `now`: its process died (on this
    host, where that can be seen), or its lease ran out (`lease_s` after `claimed_at`: a process
    on another host cannot be seen from here, and may have died with the host). A claimer seen
    alive here keeps its claim however long it runs: taking over would run the call twice."""
    if not claimer or not claimer_alive(claimer):
        return True
    if claimer.partition(":")[0] == socket.gethostname():
        return False
    return claimed_at is None or _naive_utc(now) - claimed_at >= timedelta(seconds=lease_s)


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

    def request(
        self,
        call_id: str,
        skill: Skill | str,
        args: dict[str, Any],
        requester: str,
        rule: str,
        quorum: int,
        expires_at: datetime | None,
        thread_id: str | None = None,
        *,
        files: dict[str, str] | None = None,
        via: str = "api",
        approvers: list[str] | None = None,
    ) -> Approval:
        """Open an approval for a call; asking again for the same call returns the first one.
        `approvers`: who may vote (the verdict's), recorded on the row and in the signed request."""
        name = skill if isinstance(skill, str) else skill.name
        existing = self.for_call(call_id)
        if existing is not None:
            return existing
        row = Approval(
            call_id=call_id,
            skill=name,
            args=_plain(args),
            requester=requester,
            rule=rule,
            quorum=max(1, quorum),
            thread_id=thread_id,
            files=dict(files or {}),
            requested_via=via,
            approvers=list(approvers or []),
            created_at=_naive_utc(self.audit.clock()),
            expires_at=_naive_utc(expires_at) if expires_at else None,
        )
        try:
            with self.store.session() as s:
                s.add(row)
        except IntegrityError:  # another process asked for the same call first
            found = self.for_call(call_id)
            assert found is not None
            return found
        self.audit.append(
            requester,
            "approval.request",
            skill=name,
            call_id=call_id,
            job_id=job_id_of(row.args),
            payload={
                "approval_id": row.id,
                "args": row.args,
                "rule": rule,
                "quorum": row.quorum,
                "thread_id": thread_id,
                "files": row.files,
                "via": via,
                "approvers": row.approvers,
                "expires_at": iso_utc(row.expires_at) if row.expires_at else None,
            },
        )
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
                raise UnknownApproval(_UNKNOWN.format(id=approval_id))
            if _expire(row, now):
                decided = True
            if row.state != "pending":
                note = f"approval is already {row.state}"
            elif approve and voter == self._name(row.requester):
                refused = (
                    f"{principal} requested call {row.call_id} and cannot approve it: the "
                    "requester never counts toward its own quorum; ask another principal"
                )
            elif self.engine is not None and not self.engine.may_approve(principal):
                refused = (
                    f"{principal} (roles: {', '.join(self.engine.roles_of(principal))}) may "
                    "not vote on approvals: give one of its roles can_approve in the policy"
                )
            elif (
                self.engine is not None
                and not self.engine.may_decide(principal, row.approvers)
                and (
                    approve or voter != self._name(row.requester)
                )  # a withdrawal is the requester's
            ):
                refused = (
                    f"approval {row.id} is for {_who(row.approvers)} to decide, not {principal} "
                    f"(rule {row.rule}); ask one of them"
                )
            elif any(v["principal"] == voter and v["approve"] == approve for v in row.votes):
                note = f"{voter} already voted {'approve' if approve else 'reject'}; counted once"
            else:
                counted = True
                row.votes = [
                    *row.votes,
                    {"principal": voter, "as": principal, "approve": approve, "at": iso_utc(now)},
                ]
                if not approve:
                    row.state = "rejected"
                elif _approvals(row) >= row.quorum:
                    row.state = "approved"
                if row.state != "pending":
                    row.decided_at, decided = now, True
            s.add(row)
        payload = {
            "approval_id": row.id,
            "voter": voter,
            "approve": approve,
            "counted": counted,
            "approvals": _approvals(row),
            "quorum": row.quorum,
            "state": row.state,
        }
        if refused or note:
            payload["reason"] = refused or note
        self.audit.append(
            principal,
            "approval.vote_refused" if refused else "approval.vote",
            skill=row.skill,
            call_id=row.call_id,
            job_id=job_id_of(row.args),
            payload=payload,
            ts=now,
        )
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
                raise UnknownApproval(_UNKNOWN.format(id=approval_id))
            expired = _expire(row, now)
            s.add(row)
        if expired:
            self._audit_decision(row, now)
        return row

    def confirm(self, approval_id: int, principal: str, yes: bool, now: datetime) -> Approval:
        """The requester's own answer at a terminal, where the verdict lets them confirm (the
        gate decides that): yes approves, no rejects. Audited as a confirmation."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            row = s.get(Approval, approval_id)
            if row is None:
                raise UnknownApproval(_UNKNOWN.format(id=approval_id))
            _expire(row, now)
            if row.state == "pending":
                row.votes = [
                    *row.votes,
                    {
                        "principal": self._name(principal),
                        "as": principal,
                        "approve": yes,
                        "at": iso_utc(now),
                        "confirmation": True,
                    },
                ]
                row.state, row.decided_at = ("approved" if yes else "rejected"), now
                s.add(row)
                decided = True
            else:
                decided = False
        if decided:
            self.audit.append(
                principal,
                "approval.confirmed" if yes else "approval.declined",
                skill=row.skill,
                call_id=row.call_id,
                job_id=job_id_of(row.args),
                ts=now,
                payload={
                    "approval_id": row.id,
                    "voter": self._name(principal),
                    "state": row.state,
                    "rule": row.rule,
                    "args": row.args,
                },
            )
            self._audit_decision(row, now)
        return row

    def unsupported(self, row: Approval) -> str | None:
        """None when the signed audit events of this approval carry it out: its signed request
        names this skill, these arguments and files, and its signed votes from principals other
        than the requester reach the request's quorum (or the requester confirmed at a terminal),
        with no signed rejection. Else why not. The row itself counts for nothing here: whoever
        can write the database can set it to `approved`, but cannot sign votes."""
        mine = [
            (e, signed)
            for e, signed in self.audit.authentic_events(row.call_id)
            if e.payload.get("approval_id") == row.id
        ]
        request = next(((e, s) for e, s in mine if e.action == "approval.request"), None)
        if request is None:
            return "the audit holds no approval.request event for it"
        req, req_signed = request
        if req_signed:
            asked = (
                req.skill,
                dumps(req.payload.get("args")),
                dumps(req.payload.get("files") or {}),
            )
            if asked != (row.skill, dumps(row.args), dumps(row.files)):
                return "its skill, arguments or files are not those of its signed request"
            quorum = req.payload.get("quorum")
            if not isinstance(quorum, int) or quorum < 1:
                return "its signed request names no quorum"
        else:  # requested before signing: its quorum is the row's, its votes must be signed
            quorum = row.quorum
        requester = self._name(req.actor)
        signed: list[AuditEvent] = [e for e, s in mine if s]
        for e in signed:
            if e.action == "approval.declined" or (
                e.action == "approval.vote"
                and e.payload.get("counted")
                and not e.payload["approve"]
            ):
                return f"{e.actor} rejected it (signed event {e.id})"
        if any(
            e.action == "approval.confirmed" and self._name(e.actor) == requester for e in signed
        ):
            return None
        approvers = list(req.payload.get("approvers") or []) if req_signed else row.approvers
        if req_signed and approvers != list(row.approvers or []):
            return "its approvers are not those of its signed request"
        voters = {
            self._name(e.actor)
            for e in signed
            if e.action == "approval.vote"
            and e.payload.get("counted")
            and e.payload.get("approve")
            and (self.engine is None or self.engine.may_decide(e.actor, approvers))
        } - {requester}
        if len(voters) >= quorum:
            return None
        return (
            f"its signed votes in the audit reach {len(voters)} of the {quorum} approvals it needs"
        )

    def refuse_unsupported(self, row: Approval, why: str, now: datetime) -> Approval:
        """An approval the signed votes do not carry: rejected (nothing runs, the loop stops
        retrying it), with why, audited."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            fresh = s.get(Approval, row.id)
            if fresh is None:
                raise UnknownApproval(_UNKNOWN.format(id=row.id))
            before = fresh.state
            fresh.state, fresh.error, fresh.decided_at = "rejected", why, now
            s.add(fresh)
        self.audit.append(
            "system",
            "approval.unsupported",
            skill=fresh.skill,
            call_id=fresh.call_id,
            job_id=job_id_of(fresh.args),
            ts=now,
            payload={"approval_id": fresh.id, "state_found": before, "reason": why},
        )
        return fresh

    def claim(
        self, approval_id: int, claimer: str, now: datetime, *, lease_s: float = CLAIM_LEASE_S
    ) -> Approval:
        """approved → executing for `claimer`, atomically: of many processes resuming one call,
        one wins; an `executing` row whose claim is stale as of `now` (`claim_stale`) is taken
        over (skills are idempotent on the call id, so finishing a half-done call does not do it
        twice). Returns the row as it now stands; the caller runs the call only if it holds the
        claim."""
        now = _naive_utc(now)
        taken_from = None
        with write_transaction(self.store, _TABLE) as s:
            row = s.get(Approval, approval_id)
            if row is None:
                raise UnknownApproval(_UNKNOWN.format(id=approval_id))
            takeover = (
                row.state == "executing"
                and row.claimed_by != claimer
                and claim_stale(row.claimed_by, row.claimed_at, now, lease_s)
            )
            if row.state == "approved" or takeover:
                taken_from = row.claimed_by if takeover else None
                row.state, row.claimed_by, row.claimed_at = "executing", claimer, now
                s.add(row)
            else:
                return row
        self.audit.append(
            "system",
            "approval.claimed",
            skill=row.skill,
            call_id=row.call_id,
            job_id=job_id_of(row.args),
            ts=now,
            payload={"approval_id": row.id, "by": claimer, "taken_from": taken_from},
        )
        return row

    def finish(
        self,
        approval_id: int,
        *,
        ok: bool,
        result: dict[str, Any] | None,
        error: str | None,
        now: datetime,
    ) -> Approval:
        """executing → executed (with the result) or failed (with the error)."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            row = s.get(Approval, approval_id)
            if row is None:
                raise UnknownApproval(_UNKNOWN.format(id=approval_id))
            row.state = "executed" if ok else "failed"
            row.result, row.error, row.executed_at = result, error, now
            s.add(row)
        self.audit.append(
            "system",
            f"approval.{row.state}",
            skill=row.skill,
            call_id=row.call_id,
            job_id=job_id_of(row.args),
            ts=now,
            payload={"approval_id": row.id, "by": row.claimed_by, "error": error},
        )
        return row

    def orphaned(self, now: datetime, *, lease_s: float = CLAIM_LEASE_S) -> list[Approval]:
        """Approved calls nobody is carrying out: not claimed yet, or claimed by a process that
        died or whose lease ran out (`claim_stale`, as `claim` judges it). The loop carries these
        out (their requester may be gone)."""
        now = _naive_utc(now)
        with self.store.session() as s:
            rows = list(
                s.exec(
                    select(Approval)
                    .where(col(Approval.state).in_(("approved", "executing")))
                    .order_by(col(Approval.id))
                )
            )
        return [
            r
            for r in rows
            if r.state == "approved" or claim_stale(r.claimed_by, r.claimed_at, now, lease_s)
        ]

    def get(self, approval_id: int) -> Approval:
        with self.store.session() as s:
            row = s.get(Approval, approval_id)
        if row is None:
            raise UnknownApproval(_UNKNOWN.format(id=approval_id))
        return row

    def pending(self, now: datetime) -> list[Approval]:
        """Approvals still open at `now`, oldest first; overdue ones are marked expired."""
        now = _naive_utc(now)
        with write_transaction(self.store, _TABLE) as s:
            rows = list(
                s.exec(
                    select(Approval).where(Approval.state == "pending").order_by(col(Approval.id))
                )
            )
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
        self.audit.append(
            "system" if row.state == "expired" else row.votes[-1]["principal"],
            "approval.decided",
            skill=row.skill,
            call_id=row.call_id,
            job_id=job_id_of(row.args),
            ts=now,
            payload={
                "approval_id": row.id,
                "state": row.state,
                "rule": row.rule,
                "quorum": row.quorum,
                "votes": row.votes,
            },
        )


def _who(approvers: list[str]) -> str:
    """`['bob', 'role:admin']` as people say it: bob or an admin."""
    names = [a.removeprefix("role:") + "s" if a.startswith("role:") else a for a in approvers]
    return " or ".join(names) if names else "anyone who may approve"


def _expire(row: Approval, now: datetime) -> bool:
    if row.state == "pending" and row.expires_at is not None and now >= row.expires_at:
        row.state, row.decided_at = "expired", now
        return True
    return False


def _approvals(row: Approval) -> int:
    return len({v["principal"] for v in row.votes if v["approve"]})


def _plain(args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(dumps(args))
