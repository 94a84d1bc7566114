"""An approved call held by another process: the gate waits for its result up to a deadline,
then says where the result will land (CallInProgress) instead of waiting forever; a claim by a
process on another host whose lease ran out is taken over, and the call runs once."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from nightshift.agent.doors.wire import error_info, to_exception
from nightshift.policies.approvals import CLAIM_LEASE_S, Approvals, claimer_id
from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.gate import Gate
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import CallInProgress
from nightshift.runtime.store.db import Store
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

from conftest import empty_store

T0 = datetime(2026, 12, 2, 3, 0)
RAN: list[str] = []
HERE_ALIVE = claimer_id().split("#")[0] + "#1"  # another thread of this (live) process
ELSEWHERE = "otherhost:1:1.000#1"  # a process on another host: nobody here can see it


class Note(SkillInput):
    note: str = ""

    def claims(self) -> Claims:
        return Claims()


class Noted(BaseModel):
    note: str


def _destroy(ctx: SkillContext, inp: Note) -> Noted:
    """Record that it ran (test skill)."""
    RAN.append(inp.note)
    return Noted(note=inp.note)


DESTROY = skill("test_flow_destroy", capability="destroy")(_destroy)  # type: ignore[arg-type]


class World:
    def __init__(self, home: Path, deadline_s: float):
        self.store = Store(f"sqlite:///{home / 'ns.db'}")
        self.audit = AuditLog(self.store, home / "audit.anchor", clock=lambda: T0)
        self.engine = PolicyEngine(None)
        self.approvals = Approvals(self.store, self.audit, engine=self.engine)
        self.gate = Gate(
            self.engine, self.audit, self.approvals, self.store, claim_deadline_s=deadline_s
        )
        self.settings = Settings(home=str(home))

    def ctx(self, principal: str, call_id: str, now: datetime = T0) -> SkillContext:
        return SkillContext(
            store=self.store,
            settings=self.settings,
            now=now,
            call_id=call_id,
            principal=principal,
            policy_limits=self.engine.limits(),
        )

    def approved(self, call_id: str) -> int:
        """The agent's destroy, parked, then approved by alice: its approval id."""
        from nightshift.runtime.errors import ApprovalRequired

        with pytest.raises(ApprovalRequired) as info:
            self.gate.call(self.ctx("agent", call_id), DESTROY, {"note": call_id})
        self.approvals.vote(info.value.approval_id, "alice", True, T0)
        return info.value.approval_id

    def resume_in_thread(self, aid: int, join_s: float = 10.0) -> tuple[object, float]:
        """Resume the approval in a daemon thread, joined with a timeout (no plugin needed): a
        call that never returns fails the test instead of hanging it. (outcome, seconds)."""
        out: list[object] = []

        def go() -> None:
            try:
                out.append(self.gate.resume(aid, self.ctx))
            except Exception as exc:
                out.append(exc)

        began = time.monotonic()
        worker = threading.Thread(target=go, daemon=True)
        worker.start()
        worker.join(join_s)
        assert not worker.is_alive(), f"the resumed call was still waiting after {join_s} s"
        return out[0], time.monotonic() - began


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test skill by name, as `Gate.resume` (the daemon's way) looks it up."""
    from nightshift.skills import builtin

    monkeypatch.setitem(builtin.BUILTINS, DESTROY.name, DESTROY)
    RAN.clear()


@pytest.fixture
def w(home: Path) -> World:
    empty_store(home / "ns.db")  # the World opens it, already at HEAD
    return World(home, deadline_s=0.3)


@pytest.mark.parametrize(
    ("claimer", "claimed_at"),
    [
        (HERE_ALIVE, T0),
        (HERE_ALIVE, T0 - timedelta(hours=1)),  # seen alive here: kept however long it runs
        (ELSEWHERE, T0 - timedelta(seconds=CLAIM_LEASE_S - 60)),  # its lease still holds
    ],
    ids=["here-fresh", "here-old", "elsewhere-fresh"],
)
def test_a_call_held_by_a_live_claimer_gives_up_at_its_deadline(
    w: World, claimer: str, claimed_at: datetime
) -> None:
    aid = w.approved("held-1")
    assert w.approvals.claim(aid, claimer, claimed_at).claimed_by == claimer
    assert w.approvals.orphaned(T0) == []
    outcome, took = w.resume_in_thread(aid)
    assert isinstance(outcome, CallInProgress), outcome
    assert 0.3 <= took < 5
    assert (outcome.approval_id, outcome.call_id, outcome.skill) == (
        aid,
        "held-1",
        "test_flow_destroy",
    )
    assert f"approval {aid} for test_flow_destroy is being carried out by {claimer}" in str(outcome)
    assert "nightshift approvals show" in str(outcome) and "call id held-1" in str(outcome)
    row = w.approvals.get(aid)
    assert RAN == [] and (row.state, row.claimed_by) == ("executing", claimer)
    # Once the claimer records its result, calling again answers from it: nothing runs twice.
    w.approvals.finish(aid, ok=True, result={"note": "theirs"}, error=None, now=T0)
    outcome, _ = w.resume_in_thread(aid)
    assert outcome == Noted(note="theirs") and RAN == []


def test_a_result_that_lands_while_waiting_is_the_answer(home: Path) -> None:
    w = World(home, deadline_s=10.0)
    aid = w.approved("held-2")
    w.approvals.claim(aid, ELSEWHERE, T0)
    timer = threading.Timer(
        0.3,
        lambda: w.approvals.finish(aid, ok=True, result={"note": "theirs"}, error=None, now=T0),
    )
    timer.start()
    try:
        outcome, took = w.resume_in_thread(aid)
    finally:
        timer.join()
    assert outcome == Noted(note="theirs") and RAN == [] and took < 5


def test_a_claim_whose_lease_ran_out_on_another_host_is_taken_over_once(w: World) -> None:
    aid = w.approved("stale-1")
    stale_at = T0 - timedelta(seconds=CLAIM_LEASE_S + 1)
    w.approvals.claim(aid, ELSEWHERE, stale_at)
    assert [r.id for r in w.approvals.orphaned(T0)] == [aid]
    outcome, _ = w.resume_in_thread(aid)
    assert outcome == Noted(note="stale-1") and RAN == ["stale-1"]
    row = w.approvals.get(aid)
    assert row.state == "executed" and row.claimed_by != ELSEWHERE
    claimed = w.audit.events(action="approval.claimed", call_id="stale-1")
    assert [e.payload["taken_from"] for e in claimed] == [None, ELSEWHERE]
    assert len(w.audit.events(action="skill.start", call_id="stale-1")) == 1
    outcome, _ = w.resume_in_thread(aid)  # again: the recorded result, not a second run
    assert outcome == Noted(note="stale-1") and RAN == ["stale-1"]
    assert w.approvals.orphaned(T0) == []


def test_a_lease_that_runs_out_while_waiting_is_taken_over(home: Path) -> None:
    """The lease is judged as of the call's `now` plus the time it has waited."""
    w = World(home, deadline_s=10.0)
    aid = w.approved("stale-2")
    w.approvals.claim(aid, ELSEWHERE, T0 - timedelta(seconds=CLAIM_LEASE_S - 0.2))
    assert w.approvals.orphaned(T0) == []
    outcome, took = w.resume_in_thread(aid)
    assert outcome == Noted(note="stale-2") and RAN == ["stale-2"] and 0.2 <= took < 5


def test_the_lease_is_judged_on_the_time_passed_in(w: World) -> None:
    aid = w.approved("lease-1")
    w.approvals.claim(aid, ELSEWHERE, T0)
    assert w.approvals.claim(
        aid, "me:1:1#1", T0 + timedelta(seconds=59), lease_s=60
    ).claimed_by == (ELSEWHERE)
    assert [r.id for r in w.approvals.orphaned(T0 + timedelta(seconds=60), lease_s=60)] == [aid]
    taken = w.approvals.claim(aid, "me:1:1#1", T0 + timedelta(seconds=60), lease_s=60)
    assert (taken.claimed_by, taken.claimed_at) == ("me:1:1#1", T0 + timedelta(seconds=60))


def test_call_in_progress_crosses_the_socket_as_itself() -> None:
    exc = CallInProgress("held elsewhere", approval_id=7, call_id="c7", skill="cancel_job")
    back = to_exception(error_info(exc))
    assert isinstance(back, CallInProgress) and str(back) == "held elsewhere"
    assert (back.approval_id, back.call_id, back.skill, back.exit_code) == (
        7,
        "c7",
        "cancel_job",
        4,
    )
