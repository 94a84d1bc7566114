"""The gate: kill switch, verdict, approval and the skill call, each step audited."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from nightshift.policies import killswitch
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.gate import Gate
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import ApprovalRejected, Paused, PolicyDenied, SkillFailed
from nightshift.runtime.store import Store
from nightshift.skills.base import Skill, SkillContext, skill

T0 = datetime(2026, 12, 2, 3, 0)
RAN: list[str] = []


class Args(BaseModel):
    model_config = ConfigDict(extra="allow")
    fail: bool = False


class Done(BaseModel):
    skill: str
    args: dict


def make_skill(name: str, capability: str) -> Skill:
    """A tiny skill built with the real decorator (which registers nothing: the built-ins are an
    explicit table)."""

    def fn(ctx: SkillContext, inp: Args) -> Done:
        """Record that it ran; fail on request (test skill)."""
        if inp.fail:
            raise SkillFailed("asked to fail")
        RAN.append(name)
        return Done(skill=name, args=inp.model_dump(exclude={"fail"}))

    made = skill(name, capability=capability)(fn)  # type: ignore[arg-type]
    return made


READ = make_skill("test_gate_read", "read")
LAUNCH = make_skill("test_gate_launch", "launch")
DESTROY = make_skill("test_gate_destroy", "destroy")


class World:
    def __init__(self, home: Path):
        self.store = Store(f"sqlite:///{home / 'ns.db'}")
        self.audit = AuditLog(self.store, home / "audit.anchor", clock=lambda: T0)
        self.engine = PolicyEngine()
        self.approvals = Approvals(self.store, self.audit, engine=self.engine)
        self.gate = Gate(self.engine, self.audit, self.approvals, self.store)
        self.settings = Settings(home=str(home))

    def ctx(self, principal: str, call_id: str, now: datetime = T0) -> SkillContext:
        return SkillContext(store=self.store, settings=self.settings, now=now, call_id=call_id,
                            principal=principal, policy_limits=self.engine.limits())

    def actions(self) -> list[str]:
        return [e.action for e in self.audit.events()]


@pytest.fixture
def w(home: Path) -> World:
    RAN.clear()
    return World(home)


def test_allowed_call_runs_and_is_audited(w: World) -> None:
    """The normal path: verdict, start and result are recorded with who, what and the rule."""
    args = {"gpus": 1, "job_id": 9}
    v = w.gate.check("agent", LAUNCH, args, "c1", T0)
    assert v.decision == "allow"
    out = w.gate.run(w.ctx("agent", "c1"), LAUNCH, args, v)
    assert out == Done(skill="test_gate_launch", args={"gpus": 1, "job_id": 9})
    events = w.audit.events()
    assert [e.action for e in events] == ["policy.verdict", "skill.start", "skill.result"]
    assert all((e.actor, e.call_id, e.job_id, e.skill) == ("agent", "c1", 9, "test_gate_launch")
               for e in events)
    assert events[0].payload["rule"] == "roles.agent" and events[0].payload["args"] == args
    assert events[2].payload == {"ok": True, "result": out.model_dump(mode="json")}
    assert w.audit.verify().ok


def test_denied_call_never_runs(w: World) -> None:
    """A deny verdict handed to `run` anyway refuses before the skill is touched."""
    v = w.gate.check("agent", LAUNCH, {"gpus": 99}, "c1", T0)
    assert (v.decision, v.rule) == ("deny", "limits.max_gpus_per_job")
    with pytest.raises(PolicyDenied, match="limits.max_gpus_per_job"):
        w.gate.run(w.ctx("agent", "c1"), LAUNCH, {"gpus": 99}, v)
    assert RAN == [] and w.actions() == ["policy.verdict", "skill.refused"]


def test_kill_switch_denies_launch_but_allows_read(w: World, home: Path) -> None:
    """`nightshift pause` stops every action but reads, in every process, until resume."""
    killswitch.pause(w.store, w.audit, "alice", "GPU fire drill")
    other_process = Store(f"sqlite:///{home / 'ns.db'}")
    assert killswitch.is_paused(other_process)
    v = w.gate.check("alice", LAUNCH, {}, "c1", T0)
    assert (v.decision, v.rule) == ("deny", "kill_switch")
    assert "paused by alice (GPU fire drill)" in v.reasons[0]
    assert "`nightshift resume`" in v.reasons[0]
    v = w.gate.check("alice", READ, {}, "c2", T0)
    assert v.decision == "allow"
    w.gate.run(w.ctx("alice", "c2"), READ, {}, v)
    assert RAN == ["test_gate_read"]
    assert killswitch.resume(w.store, w.audit, "bob") is True
    assert not killswitch.is_paused(other_process)
    assert w.gate.check("alice", LAUNCH, {}, "c3", T0).decision == "allow"
    assert "kill_switch.pause" in w.actions() and "kill_switch.resume" in w.actions()
    assert killswitch.resume(w.store, w.audit, "bob") is False


def test_pause_between_check_and_run_stops_the_call(w: World) -> None:
    """A call allowed (or approved) before the switch went on must not run after it."""
    v = w.gate.check("agent", LAUNCH, {}, "c1", T0)
    killswitch.pause(w.store, w.audit, "alice", "stop everything")
    with pytest.raises(Paused, match="paused by alice"):
        w.gate.run(w.ctx("agent", "c1"), LAUNCH, {}, v)
    assert RAN == [] and w.actions()[-1] == "skill.refused"


def test_destroy_runs_only_after_another_principal_approves(w: World) -> None:
    """needs_approval → request → pending refuses → approved by someone else → runs once."""
    args = {"job_id": 4}
    v = w.gate.check("agent", DESTROY, args, "c1", T0)
    assert (v.decision, v.quorum) == ("needs_approval", 1)
    appr = w.gate.request_approval("agent", DESTROY, args, "c1", v, T0, thread_id="t1")
    assert appr.expires_at == T0 + timedelta(minutes=60) and appr.rule == v.rule
    with pytest.raises(PolicyDenied, match="still pending"):
        w.gate.run(w.ctx("agent", "c1"), DESTROY, args, v)
    w.approvals.vote(appr.id, "alice", True, T0 + timedelta(minutes=1))
    with pytest.raises(PolicyDenied, match="other arguments"):
        w.gate.run(w.ctx("agent", "c1"), DESTROY, {"job_id": 5}, v)
    w.gate.run(w.ctx("agent", "c1"), DESTROY, args, v)
    assert RAN == ["test_gate_destroy"]
    start = w.audit.events(action="skill.start")[0]
    assert start.payload["approval_id"] == appr.id


def test_rejected_or_expired_approval_stops_the_call(w: World) -> None:
    """A rejection or an unanswered request ends the call with ApprovalRejected; nothing runs."""
    v = w.gate.check("agent", DESTROY, {}, "c1", T0)
    a = w.gate.request_approval("agent", DESTROY, {}, "c1", v, T0)
    w.approvals.vote(a.id, "alice", False, T0)
    with pytest.raises(ApprovalRejected, match="rejected"):
        w.gate.run(w.ctx("agent", "c1"), DESTROY, {}, v)
    w.gate.request_approval("agent", DESTROY, {}, "c2", v, T0)
    with pytest.raises(ApprovalRejected, match="expired"):
        w.gate.run(w.ctx("agent", "c2", now=T0 + timedelta(hours=2)), DESTROY, {}, v)
    assert RAN == []


def test_skill_failure_is_audited_and_raised(w: World) -> None:
    """A failing skill leaves a result event with the error, then reports the failure."""
    v = w.gate.check("agent", LAUNCH, {"fail": True}, "c1", T0)
    with pytest.raises(SkillFailed):
        w.gate.run(w.ctx("agent", "c1"), LAUNCH, {"fail": True}, v)
    result = w.audit.events(action="skill.result")[0]
    assert result.payload == {"ok": False, "error": "SkillFailed: asked to fail"}
