"""The gate: `Gate.call` validates, decides on typed claims, audits, and runs or parks the call
under an approval that is spent once, on exactly the call (and file contents) it was given for."""

from __future__ import annotations

import grp
import os
import pwd
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from sqlmodel import select

from nightshift.policies import killswitch
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.gate import Gate
from nightshift.policies.model import Policy, load_policy
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import (
    ApprovalRejected,
    ApprovalRequired,
    BadArguments,
    Paused,
    PolicyDenied,
    SkillFailed,
    UnknownJob,
)
from nightshift.runtime.store.db import Approval, Job, Store
from nightshift.skills.base import Claims, Launch, Skill, SkillContext, SkillInput, skill

from conftest import empty_store, made_by_hand

T0 = datetime(2026, 12, 2, 3, 0)
RAN: list[str] = []


class Args(SkillInput):
    gpus: int = 0
    job_id: int | None = None
    fail: bool = False

    def claims(self) -> Claims:
        return Claims(
            launches=[Launch(where="args", gpus=self.gpus)],
            jobs=[self.job_id] if self.job_id is not None else [],
        )


class Odd(SkillInput):
    accelerators: int

    def claims(self) -> Claims:
        return Claims(launches=[Launch(where="accelerators", gpus=self.accelerators)])


class Plain(BaseModel):
    gpus: int = 0


class Done(BaseModel):
    skill: str
    args: dict


def make_skill(name: str, capability: str) -> Skill:
    """A tiny skill built with the real decorator (which registers nothing)."""

    def fn(ctx: SkillContext, inp: Args) -> Done:
        """Record that it ran; fail on request (test skill)."""
        if inp.fail:
            raise SkillFailed("asked to fail")
        RAN.append(name)
        return Done(skill=name, args=inp.model_dump(exclude={"fail"}))

    return skill(name, capability=capability)(fn)  # type: ignore[arg-type]


READ = make_skill("test_gate_read", "read")
LAUNCH = make_skill("test_gate_launch", "launch")
DESTROY = make_skill("test_gate_destroy", "destroy")


class World:
    def __init__(self, home: Path, policy: Policy | None = None):
        self.store = Store(f"sqlite:///{home / 'ns.db'}")
        self.audit = AuditLog(self.store, home / "audit.anchor", clock=lambda: T0)
        self.engine = PolicyEngine(policy)
        self.approvals = Approvals(self.store, self.audit, engine=self.engine)
        self.gate = Gate(self.engine, self.audit, self.approvals, self.store)
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

    def call(
        self, principal: str, sk: Skill, args: dict, call_id: str = "c1", now: datetime = T0, **kw
    ):
        return self.gate.call(self.ctx(principal, call_id, now), sk, args, **kw)

    def actions(self) -> list[str]:
        return [e.action for e in self.audit.events()]


@pytest.fixture
def w(home: Path) -> World:
    """A world whose store holds jobs 1-9, for the calls that name one."""
    RAN.clear()
    empty_store(home / "ns.db")  # the World opens it, already at HEAD
    world = World(home)
    with world.store.session() as s:
        for i in range(1, 10):
            s.add(Job(id=i, name=f"job-{i}", spec={}, owner="alice"))
    made_by_hand(world.store)
    return world


def test_a_call_on_a_job_that_does_not_exist_is_a_bad_argument_never_an_approval(w: World):
    """cancel of job 99: the caller is told there is no such job; nothing is asked of a human."""
    with pytest.raises(UnknownJob, match="no job 99"):
        w.call("agent", DESTROY, {"job_id": 99}, "c1")
    assert RAN == [] and w.actions() == ["skill.bad_arguments"]
    with w.store.session() as s:
        assert s.exec(select(Approval)).all() == []


def test_allowed_call_runs_and_is_audited(w: World) -> None:
    """The normal path: verdict (with the claims), start and result, with who, what and rule."""
    out = w.call("agent", LAUNCH, {"gpus": 1, "job_id": 9})
    assert out == Done(skill="test_gate_launch", args={"gpus": 1, "job_id": 9})
    events = w.audit.events()
    assert [e.action for e in events] == ["policy.verdict", "skill.start", "skill.result"]
    assert all(
        (e.actor, e.call_id, e.job_id, e.skill) == ("agent", "c1", 9, "test_gate_launch")
        for e in events
    )
    verdict = events[0].payload
    assert verdict["rule"] == "roles.agent"
    assert verdict["args"] == {"gpus": 1, "job_id": 9, "fail": False}  # canonical: defaults in
    assert verdict["claims"]["launches"][0]["gpus"] == 1
    assert events[2].payload == {"ok": True, "result": out.model_dump(mode="json")}
    assert w.audit.verify().ok


def test_bad_arguments_are_refused_before_any_verdict(w: World) -> None:
    with pytest.raises(BadArguments, match="gpus"):
        w.call("agent", LAUNCH, {"gpus": "many"})
    with pytest.raises(BadArguments, match="unknown argument"):
        w.call("agent", LAUNCH, {"gpu_count": 99})
    assert RAN == [] and w.actions() == ["skill.bad_arguments", "skill.bad_arguments"]


def test_limits_judge_the_claims_not_argument_names(w: World) -> None:
    """A skill whose field is called `accelerators` still claims GPUs: the limit applies."""

    def odd(ctx: SkillContext, inp: Odd) -> Done:
        """Launches on many accelerators (test skill)."""
        RAN.append("odd")
        return Done(skill="odd", args={})

    odd_skill = skill("test_odd", capability="launch")(odd)  # type: ignore[arg-type]
    with pytest.raises(PolicyDenied, match="accelerators asks for 99 GPUs"):
        w.call("agent", odd_skill, {"accelerators": 99})
    assert RAN == [] and w.actions() == ["policy.verdict", "skill.refused"]


def test_a_non_read_skill_must_declare_its_claims() -> None:
    def fn(ctx: SkillContext, inp: Plain) -> Done:
        """Would launch without saying what it claims (test skill)."""
        return Done(skill="x", args={})

    with pytest.raises(TypeError, match="must derive from SkillInput and define claims"):
        skill("test_unclaimed", capability="launch")(fn)  # type: ignore[arg-type]
    assert skill("test_plain_read", capability="read")(fn).capability == "read"  # type: ignore[arg-type]


def test_kill_switch_denies_launch_but_allows_read(w: World, home: Path) -> None:
    """`nightshift pause` stops every action but reads, in every process, until resume."""
    killswitch.pause(w.store, w.audit, "alice", "GPU fire drill")
    assert killswitch.is_paused(Store(f"sqlite:///{home / 'ns.db'}"))
    with pytest.raises(Paused, match=r"paused by alice \(GPU fire drill\).*nightshift resume"):
        w.call("alice", LAUNCH, {}, "c1")
    w.call("alice", READ, {}, "c2")
    assert RAN == ["test_gate_read"]
    assert killswitch.resume(w.store, w.audit, "bob") is True
    w.call("alice", LAUNCH, {}, "c3")
    assert RAN == ["test_gate_read", "test_gate_launch"]


def test_destroy_waits_for_another_principal_then_runs_once(w: World) -> None:
    """The agent's destroy: ApprovalRequired → pending → approved by alice → the same call id
    runs it once; calling again returns the recorded result without running it again."""
    with w.store.session() as s:
        s.merge(Job(id=4, name="victim", spec={}, owner="bob", priority=7))
    made_by_hand(w.store)
    with pytest.raises(ApprovalRequired) as info:
        w.call("agent", DESTROY, {"job_id": 4}, "c1")
    aid = info.value.approval_id
    appr = w.approvals.get(aid)
    assert (appr.state, appr.requested_via, appr.expires_at) == (
        "pending",
        "api",
        T0 + timedelta(minutes=60),
    )
    claims = w.audit.events(action="policy.verdict")[0].payload["claims"]
    assert (claims["job_owners"], claims["max_job_priority"]) == (["bob"], 7)
    with pytest.raises(ApprovalRequired):  # still pending: asking again asks nobody new
        w.call("agent", DESTROY, {"job_id": 4}, "c1")
    assert len(w.approvals.pending(T0)) == 1
    with pytest.raises(PolicyDenied, match="cannot approve"):
        w.approvals.vote(aid, "agent", True, T0)
    w.approvals.vote(aid, "alice", True, T0 + timedelta(minutes=1))
    with pytest.raises(PolicyDenied, match="other arguments"):
        w.call("agent", DESTROY, {"job_id": 5}, "c1")
    first = w.call("agent", DESTROY, {"job_id": 4}, "c1")
    again = w.call("agent", DESTROY, {"job_id": 4}, "c1")
    assert RAN == ["test_gate_destroy"] and first == again
    row = w.approvals.get(aid)
    assert row.state == "executed" and row.result == first.model_dump(mode="json")
    starts = w.audit.events(action="skill.start")
    assert len(starts) == 1 and starts[0].payload["approval_id"] == aid
    assert "approval.claimed" in w.actions() and "approval.executed" in w.actions()


def test_rejected_or_expired_approval_stops_the_call(w: World) -> None:
    with pytest.raises(ApprovalRequired) as info:
        w.call("agent", DESTROY, {}, "c1")
    w.approvals.vote(info.value.approval_id, "alice", False, T0)
    with pytest.raises(ApprovalRejected, match="rejected"):
        w.call("agent", DESTROY, {}, "c1")
    with pytest.raises(ApprovalRequired):
        w.call("agent", DESTROY, {}, "c2")
    with pytest.raises(ApprovalRejected, match="expired"):
        w.call("agent", DESTROY, {}, "c2", now=T0 + timedelta(hours=2))
    assert RAN == []


def test_a_person_at_a_terminal_confirms_their_own_destroy(w: World) -> None:
    """The card's human confirmation: the full request is shown, y runs it, audited as such."""
    asked: list[dict] = []

    def yes(req: dict) -> bool:
        asked.append(req)
        return True

    w.call("alice", DESTROY, {"job_id": 3}, "c1", via="terminal", confirm=yes)
    assert RAN == ["test_gate_destroy"]
    assert asked[0]["skill"] == "test_gate_destroy" and asked[0]["args"]["job_id"] == 3
    assert "approval.confirmed" in w.actions()
    with pytest.raises(ApprovalRejected):
        w.call("alice", DESTROY, {"job_id": 3}, "c2", via="terminal", confirm=lambda r: False)
    assert RAN == ["test_gate_destroy"]
    # The same person from a script (no terminal to answer at) needs someone else.
    with pytest.raises(ApprovalRequired):
        w.call("alice", DESTROY, {"job_id": 3}, "c3", via="api", confirm=None)


def test_the_agent_never_confirms_for_itself(w: World) -> None:
    with pytest.raises(ApprovalRequired):
        w.call("agent", DESTROY, {}, "c1", via="terminal", confirm=lambda r: True)
    assert RAN == []


def test_two_person_rule_needs_others_even_at_a_terminal(home: Path) -> None:
    data = yaml.safe_load(
        Path(load_policy.__code__.co_filename).with_name("default.yaml").read_text()
    )
    data["approvals"].append(
        {
            "id": "two-person",
            "capabilities": ["destroy"],
            "when": ["claims.max_job_priority >= 5"],
            "quorum": 2,
            "from_others": True,
        }
    )
    RAN.clear()
    w = World(home, Policy.model_validate(data))
    with w.store.session() as s:
        s.add(Job(id=1, name="low", spec={}, priority=1))
        s.add(Job(id=2, name="high", spec={}, priority=9))
    made_by_hand(w.store)
    w.call("alice", DESTROY, {"job_id": 1}, "c1", via="terminal", confirm=lambda r: True)
    with pytest.raises(ApprovalRequired) as info:
        w.call("alice", DESTROY, {"job_id": 2}, "c2", via="terminal", confirm=lambda r: True)
    assert info.value.quorum == 2 and info.value.rule == "two-person"
    for voter in ("bob", "carol"):
        w.approvals.vote(info.value.approval_id, voter, True, T0)
    w.call("alice", DESTROY, {"job_id": 2}, "c2", via="terminal")
    assert RAN == ["test_gate_destroy", "test_gate_destroy"]


def test_an_approval_is_not_spent_on_a_changed_spec_file(w: World, tmp_path: Path) -> None:
    """The file a call names is read and hashed once; editing it after the request voids the
    approval (what was approved is not what would run)."""
    from nightshift.skills.builtin import builtin

    spec = tmp_path / "spec.yaml"
    spec.write_text("name: s\ncommand: [python, train.py]\n")
    policy = yaml.safe_load(
        Path(load_policy.__code__.co_filename).with_name("default.yaml").read_text()
    )
    policy["approvals"].append({"id": "launch-ok", "capabilities": ["launch"], "quorum": 1})
    w2 = World(tmp_path / "h", Policy.model_validate(policy))
    submit = builtin("submit_job")
    with pytest.raises(ApprovalRequired) as info:
        w2.call("agent", submit, {"spec_path": str(spec)}, "c1")
    row = w2.approvals.get(info.value.approval_id)
    assert list(row.files) == [str(spec.resolve())]
    w2.approvals.vote(row.id, "alice", True, T0)
    spec.write_text("name: s\ncommand: [python, evil.py]\n")
    with pytest.raises(PolicyDenied, match="changed since it was requested"):
        w2.call("agent", submit, {"spec_path": str(spec)}, "c1")
    spec.write_text("name: s\ncommand: [python, train.py]\n")
    assert w2.call("agent", submit, {"spec_path": str(spec)}, "c1").job_id == 1


def test_skill_failure_is_audited_and_raised(w: World) -> None:
    with pytest.raises(SkillFailed):
        w.call("agent", LAUNCH, {"fail": True})
    result = w.audit.events(action="skill.result")[0]
    assert result.payload == {"ok": False, "error": "SkillFailed: asked to fail"}


MODIFY = make_skill("test_gate_modify", "modify")


def test_another_persons_job_needs_someone_else_even_at_a_terminal(w: World) -> None:
    """Why: under the shipped rules any person cancelled anyone's job by confirming it at their
    own terminal. Another person's job now needs a vote from its owner or an admin (not the
    requester, not a bystander); the owner's own call is theirs to confirm, and a hold of one's
    own job runs at once."""
    with w.store.session() as s:
        s.add(Job(id=20, name="bobs", spec={}, owner="bob"))
        s.add(Job(id=21, name="the-agents", spec={}, owner="agent"))
    made_by_hand(w.store)
    asked: list[dict] = []

    def yes(req: dict) -> bool:
        asked.append(req)
        return True

    with pytest.raises(ApprovalRequired) as info:
        w.call("alice", DESTROY, {"job_id": 20}, "c1", via="terminal", confirm=yes)
    assert asked == [] and RAN == []  # never offered to alice to confirm
    row = w.approvals.get(info.value.approval_id)
    assert row.rule == "others-jobs-need-another-person"
    assert row.approvers == ["bob", "role:admin"]
    with pytest.raises(PolicyDenied):  # the requester's own vote never counts
        w.approvals.vote(row.id, "alice", True, T0)
    with pytest.raises(PolicyDenied, match="for bob or admins to decide"):  # nor a bystander's
        w.approvals.vote(row.id, "carol", True, T0)
    with pytest.raises(PolicyDenied):
        w.approvals.vote(row.id, "carol", False, T0)
    assert w.approvals.get(row.id).state == "pending"
    w.approvals.vote(row.id, "bob", True, T0)
    w.call("alice", DESTROY, {"job_id": 20}, "c1", via="terminal", confirm=yes)
    assert RAN == ["test_gate_destroy"]
    # A hold (modify) on bob's job asks too; on alice's own it runs at once.
    with pytest.raises(ApprovalRequired):
        w.call("alice", MODIFY, {"job_id": 20}, "c2")
    w.call("alice", MODIFY, {"job_id": 3}, "c3")
    # Her own job: confirmed by herself, as before; the agent's jobs are nobody's.
    w.call("alice", DESTROY, {"job_id": 3}, "c4", via="terminal", confirm=yes)
    w.call("alice", DESTROY, {"job_id": 21}, "c5", via="terminal", confirm=yes)
    assert RAN == ["test_gate_destroy", "test_gate_modify"] + ["test_gate_destroy"] * 2
    # The agent and the loop are judged by their own roles: the loop's hold of bob's job runs.
    w.call("system", MODIFY, {"job_id": 20}, "c6")
    assert RAN[-1] == "test_gate_modify"


def test_another_persons_logs_are_for_its_owner_the_admins_and_a_group() -> None:
    """Why: alice read bob's logs (`nightshift logs 1`). The logs and metrics of another person's
    job are denied by the shipped policy's others-job-logs, unless the reader is an admin or
    (where the policy names one) in a team's OS group."""
    from nightshift.skills.registry import get_skill

    shipped = load_policy(None)
    bobs = Claims(jobs=[20], job_owners=["bob"])
    engine = PolicyEngine(shipped)
    for name in ("job_logs", "tune_lr"):
        v = engine.evaluate("alice", get_skill(name), {"job_id": 20}, bobs)
        assert (v.decision, v.rule) == ("deny", "others-job-logs"), name
        assert engine.evaluate("bob", get_skill(name), {"job_id": 20}, bobs).decision == "allow"
    # The agent's reads (the daemon's recoveries) and jobs nobody owns are not affected.
    assert engine.evaluate("agent", get_skill("job_logs"), {"job_id": 20}, bobs).decision == "allow"
    agents = Claims(jobs=[21], job_owners=["agent"])
    assert engine.evaluate("alice", get_skill("job_logs"), {"job_id": 21}, agents).decision == (
        "allow"
    )
    data = shipped.model_dump(mode="json", exclude_none=True)
    data["principals"]["sam"] = {"kind": "user", "os_user": "sam", "roles": ["admin"]}
    data["denials"][0]["unless_os_groups"] = [grp.getgrgid(os.getgid()).gr_name]
    engine = PolicyEngine(Policy.model_validate(data))
    assert engine.evaluate("sam", get_skill("job_logs"), {"job_id": 20}, bobs).decision == "allow"
    # An admin also decides another person's hold or cancel; a bystander does not.
    assert engine.may_decide("sam", ["bob", "role:admin"])
    assert not engine.may_decide("carol", ["bob", "role:admin"])
    me = pwd.getpwuid(os.getuid()).pw_name  # in the group named above
    assert engine.evaluate(me, get_skill("job_logs"), {"job_id": 20}, bobs).decision == "allow"


def test_a_person_the_policy_does_not_list_neither_reads_others_logs_nor_loses_their_own() -> None:
    """Why: with local_users [alice, bob], carol (an OS user the policy does not list, a reader)
    read alice's log on the dashboard: an unlisted person counted as nobody, so alice's job was
    not "another person's" to her — and her own jobs were nobody's to alice."""
    from nightshift.skills.registry import get_skill

    data = load_policy(None).model_dump(mode="json", exclude_none=True)
    data["local_users"] = ["alice", "bob"]
    engine = PolicyEngine(Policy.model_validate(data))
    logs = get_skill("job_logs")
    alices = Claims(jobs=[1], job_owners=["alice"])
    carols = Claims(jobs=[2], job_owners=["carol"])
    v = engine.evaluate("carol", logs, {"job_id": 1}, alices)
    assert (v.decision, v.rule) == ("deny", "others-job-logs")
    assert engine.evaluate("carol", logs, {"job_id": 2}, carols).decision == "allow"
    v = engine.evaluate("alice", logs, {"job_id": 2}, carols)
    assert (v.decision, v.rule) == ("deny", "others-job-logs")
    # an unmapped chat user is someone too; the agent and the loop still are not
    assert engine.evaluate("slack:U999", logs, {"job_id": 1}, alices).decision == "deny"
    assert engine.evaluate("agent", logs, {"job_id": 2}, carols).decision == "allow"
