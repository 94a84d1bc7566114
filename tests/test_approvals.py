"""Approvals: quorum from people other than the requester, one rejection stops, expiry, audit."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from nightshift.policies.approvals import Approvals, UnknownApproval
from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.model import load_policy
from nightshift.runtime.errors import PolicyDenied

from conftest import empty_store

T0 = datetime(2026, 12, 2, 3, 0)
LATER = T0 + timedelta(minutes=5)


@pytest.fixture
def audit(tmp_path: Path) -> AuditLog:
    return AuditLog(empty_store(tmp_path / "ns.db"), tmp_path / "audit.anchor", clock=lambda: T0)


@pytest.fixture
def approvals(audit: AuditLog) -> Approvals:
    return Approvals(audit.store, audit)


def ask(
    approvals: Approvals,
    quorum: int = 1,
    call_id: str = "call-1",
    expires: datetime | None = T0 + timedelta(minutes=60),
):
    return approvals.request(
        call_id, "cancel_job", {"job_id": 4}, "agent", "destroy-rule", quorum, expires, "thread-1"
    )


def test_request_is_idempotent_on_call_id(approvals: Approvals, audit: AuditLog) -> None:
    """A graph node re-run after a crash asks again; it must get the same approval, not a second."""
    a = ask(approvals)
    b = ask(approvals, quorum=3)
    assert a.id == b.id and b.quorum == 1 and b.state == "pending"
    assert (a.thread_id, a.created_at) == ("thread-1", T0)
    assert [e.action for e in audit.events()] == ["approval.request"]
    assert audit.events()[0].job_id == 4


def test_quorum_two_needs_two_distinct_other_principals(approvals: Approvals) -> None:
    """The two-person rule: one approver is not enough, two different ones are."""
    a = ask(approvals, quorum=2)
    a = approvals.vote(a.id, "alice", True, LATER)
    assert a.state == "pending"
    a = approvals.vote(a.id, "bob", True, LATER)
    assert a.state == "approved" and a.decided_at == LATER
    assert [v["principal"] for v in a.votes] == ["alice", "bob"]


def test_requester_cannot_approve_own_call(approvals: Approvals, audit: AuditLog) -> None:
    """The requester never counts toward its own quorum; the refusal says why and is audited."""
    a = ask(approvals)
    with pytest.raises(PolicyDenied, match="requested call call-1 and cannot approve it"):
        approvals.vote(a.id, "agent", True, LATER)
    assert approvals.status(a.id, LATER).state == "pending"
    refused = audit.events(action="approval.vote_refused")
    assert refused and refused[0].actor == "agent" and not refused[0].payload["counted"]


def test_requester_may_withdraw_by_rejecting(approvals: Approvals) -> None:
    """Rejecting one's own request is a withdrawal, not a self-approval: it stops the call."""
    a = ask(approvals)
    assert approvals.vote(a.id, "agent", False, LATER).state == "rejected"


def test_duplicate_vote_counts_once(approvals: Approvals, audit: AuditLog) -> None:
    """Clicking approve twice (or in two channels) is one vote."""
    a = ask(approvals, quorum=2)
    approvals.vote(a.id, "alice", True, LATER)
    a = approvals.vote(a.id, "alice", True, LATER)
    assert a.state == "pending" and len(a.votes) == 1
    votes = audit.events(action="approval.vote")
    assert [v.payload["counted"] for v in votes] == [True, False]
    assert "counted once" in votes[1].payload["reason"]


def test_one_rejection_rejects(approvals: Approvals, audit: AuditLog) -> None:
    """Any rejection stops the call, even after approvals were collected."""
    a = ask(approvals, quorum=2)
    approvals.vote(a.id, "alice", True, LATER)
    a = approvals.vote(a.id, "bob", False, LATER)
    assert a.state == "rejected" and a.decided_at == LATER
    a = approvals.vote(a.id, "carol", True, LATER)
    assert a.state == "rejected"  # a late vote changes nothing
    decided = audit.events(action="approval.decided")
    assert [(e.actor, e.payload["state"]) for e in decided] == [("bob", "rejected")]


def test_expiry_is_marked_lazily(approvals: Approvals, audit: AuditLog) -> None:
    """Nobody answered in time: status, pending and late votes all see `expired`."""
    a = ask(approvals, call_id="c1")
    b = ask(approvals, call_id="c2", expires=T0 + timedelta(hours=3))
    c = ask(approvals, call_id="c3", expires=None)
    assert approvals.status(a.id, T0 + timedelta(minutes=59)).state == "pending"
    late = T0 + timedelta(minutes=61)
    assert [p.id for p in approvals.pending(late)] == [b.id, c.id]
    assert approvals.status(a.id, late).state == "expired"
    assert approvals.vote(a.id, "alice", True, late).state == "expired"
    assert approvals.vote(b.id, "alice", True, T0 + timedelta(hours=4)).state == "expired"
    decided = audit.events(action="approval.decided")
    assert [(e.call_id, e.actor, e.payload["state"]) for e in decided] == [
        ("c1", "system", "expired"),
        ("c2", "system", "expired"),
    ]
    assert audit.verify().ok


def test_unknown_approval(approvals: Approvals) -> None:
    """A mistyped id gets a clear operator error, not a crash."""
    with pytest.raises(UnknownApproval, match="no approval with id 42"):
        approvals.vote(42, "alice", True, LATER)
    with pytest.raises(UnknownApproval):
        approvals.status(42, LATER)


def test_with_engine_identities_are_canonical_and_voters_need_can_approve(
    tmp_path: Path, audit: AuditLog, home: Path
) -> None:
    """Through the policy, alice on Slack is still alice (no self-approval via another channel),
    and principals without `can_approve` (the agent, unknown users) cannot vote."""
    (tmp_path / "p.yaml").write_text("""\
roles:
  operator: {capabilities: [read, launch, modify, destroy], can_approve: true}
  agent: {capabilities: [read, launch, modify]}
  reader: {capabilities: [read]}
principals:
  agent: {kind: agent, roles: [agent]}
  alice: {kind: user, os_user: alice, slack_id: U1, roles: [operator]}
  local_user: {kind: user, roles: [operator]}
""")
    engine = PolicyEngine(load_policy(tmp_path / "p.yaml"))
    approvals = Approvals(audit.store, audit, engine=engine)
    a = approvals.request("c1", "cancel_job", {}, "alice", "r", 1, None)
    with pytest.raises(PolicyDenied, match="cannot approve"):
        approvals.vote(a.id, "slack:U1", True, LATER)
    b = approvals.request("c2", "cancel_job", {}, "agent", "r", 2, None)
    c = approvals.request("c3", "cancel_job", {}, "alice", "r", 1, None)
    for outsider in ("slack:U404", "agent"):
        with pytest.raises(PolicyDenied, match="can_approve"):
            approvals.vote(c.id, outsider, True, LATER)
    approvals.vote(b.id, "slack:U1", True, LATER)
    b = approvals.vote(b.id, "alice", True, LATER)  # the same person again
    assert b.state == "pending" and len(b.votes) == 1
    b = approvals.vote(b.id, "dave", True, LATER)  # a local OS user: operator
    assert b.state == "approved"
    assert [v["as"] for v in b.votes] == ["slack:U1", "dave"]


def test_every_step_is_audited_and_chain_verifies(approvals: Approvals, audit: AuditLog) -> None:
    """Request, votes and the decision all land in the audit log, in order."""
    a = ask(approvals, quorum=1)
    approvals.vote(a.id, "alice", True, LATER)
    assert [(e.action, e.actor) for e in audit.events()] == [
        ("approval.request", "agent"),
        ("approval.vote", "alice"),
        ("approval.decided", "alice"),
    ]
    assert all(e.call_id == "call-1" and e.skill == "cancel_job" for e in audit.events())
    assert audit.verify().ok
