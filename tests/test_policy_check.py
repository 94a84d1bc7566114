"""Trying a policy on recorded history: real gated calls under the shipped policy, replayed
through a stricter and a looser candidate, call by call, without writing anything; and applying
one as an approved call whose approvers see that diff, which every process follows at its next
call."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlmodel import col, select

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.agent.doors.commands.policy import parse_age
from nightshift.policies import killswitch
from nightshift.policies.model import Policy, load_policy
from nightshift.policies.policy_check import Window, check_policy
from nightshift.policies.policy_source import policy_from_text, text_sha256
from nightshift.runtime.errors import (
    ApprovalRequired,
    BadArguments,
    ConfigError,
    Paused,
    PolicyDenied,
    SkillFailed,
    SpecError,
)
from nightshift.runtime.store.db import Approval
from nightshift.skills.apply_policy import ACTIVE_SHA256, ACTIVE_YAML

from conftest import empty_store, nightshift

# A job that waits for a GPU: it stays queued (no loop runs here).
SPEC = {"name": "waits-for-gpu", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}
STRANGER = "slack:U999"  # no mapping in the shipped policy: the reader role
STRICT_SUMMARY = "replayed 7 calls: 2 allow -> needs_approval, 2 quorum 1 -> 2"


def shipped() -> dict[str, Any]:
    return yaml.safe_load(
        resources.files("nightshift.policies").joinpath("default.yaml").read_text()
    )


def strict_yaml() -> str:
    """Submitting needs an approval; destroying needs two."""
    data = shipped()
    (rule,) = [r for r in data["approvals"] if r["id"] == "destroy-needs-confirmation"]
    rule["quorum"] = 2
    data["approvals"].append({"id": "submit-needs-approval", "skills": ["submit_job"]})
    return yaml.safe_dump(data)


def loose_yaml() -> str:
    """No confirmation of a destroy (the agent's role still asks for one); readers may launch."""
    data = shipped()
    data["approvals"] = []
    data["roles"]["reader"]["capabilities"] = ["read", "launch"]
    return yaml.safe_dump(data)


def policy(text: str) -> Policy:
    return policy_from_text(text, "candidate.yaml")


class History:
    """Seven gated calls under the shipped policy, made through the wiring's gate."""

    def __init__(self, w: Wiring):
        self.w = w
        self.me = w.user
        self.n = 0

    def call(self, principal: str, skill: str, args: dict[str, Any], call_id: str | None = None):
        self.n += 1
        ctx = self.w.context(principal, call_id or f"test-{self.n}")
        return self.w.gate.call(ctx, skill, args)

    def record(self) -> None:
        first = self.call(self.me, "submit_job", {"spec": SPEC})  # allow, roles.operator
        second = self.call("agent", "submit_job", {"spec": SPEC})  # allow, roles.agent
        self.call("system", "pause_job", {"job_id": second.job_id})  # allow, roles.system
        with pytest.raises(ApprovalRequired):  # destroy-needs-confirmation, quorum 1
            self.call(self.me, "cancel_job", {"job_id": first.job_id})
        with pytest.raises(ApprovalRequired):  # the same rule decides for the agent
            self.call("agent", "cancel_job", {"job_id": second.job_id})
        with pytest.raises(PolicyDenied):  # grants: a reader may not launch
            self.call(STRANGER, "submit_job", {"spec": SPEC})
        self.call("agent", "list_jobs", {})  # allow, a read


@pytest.fixture
def w(home: Path) -> Wiring:
    empty_store(home / "nightshift.db")  # Wiring opens it, already at HEAD
    return Wiring.load()


@pytest.fixture
def history(w: Wiring) -> History:
    h = History(w)
    h.record()
    return h


def store_state(home: Path) -> tuple[int, list[tuple[str, str]], int]:
    """Everything a check could write: audit rows, keyvalue rows, approvals."""
    with sqlite3.connect(home / "nightshift.db") as db:
        events = db.execute("SELECT count(*) FROM auditevent").fetchone()[0]
        kv = db.execute("SELECT key, value FROM keyvalue ORDER BY key").fetchall()
        approvals = db.execute("SELECT count(*) FROM approval").fetchone()[0]
    return events, kv, approvals


def changes(report) -> list[tuple[str, str, str, str, str]]:
    return [(c.principal, c.skill, c.before.rule, c.after.rule, c.change) for c in report.changes()]


# ------------------------------------------------------------------------------ the replay
def test_a_stricter_policy_shows_each_call_it_would_hold_back(history: History, home: Path):
    """Submits would need an approval, cancels a quorum of two; the rest is the same: a deny
    stays a deny, the system's pause and the agent's read stay allowed."""
    before = store_state(home)
    report = check_policy(history.w.store, policy(strict_yaml()))
    me = history.me
    assert changes(report) == [
        (me, "submit_job", "roles.operator", "submit-needs-approval", "allow -> needs_approval"),
        ("agent", "submit_job", "roles.agent", "submit-needs-approval", "allow -> needs_approval"),
        (
            me,
            "cancel_job",
            "destroy-needs-confirmation",
            "destroy-needs-confirmation",
            "quorum 1 -> 2",
        ),
        (
            "agent",
            "cancel_job",
            "destroy-needs-confirmation",
            "destroy-needs-confirmation",
            "quorum 1 -> 2",
        ),
    ]
    t = report.totals
    assert (t.replayed, t.unchanged, t.changed) == (7, 3, 4)
    assert t.by_change == {"allow -> needs_approval": 2, "quorum 1 -> 2": 2}
    assert report.summary() == STRICT_SUMMARY
    assert [c.change for c in report.calls] == [
        "allow -> needs_approval",
        "allow -> needs_approval",
        None,
        "quorum 1 -> 2",
        "quorum 1 -> 2",
        None,
        None,
    ]
    cancel = report.changes()[2]
    assert cancel.job_id is not None and cancel.args == f"job_id={cancel.job_id}, reason=cancelled"
    assert report.changes()[0].args == "spec={3 keys}"  # nested values by their size
    assert store_state(home) == before  # read only


def test_a_looser_policy_shows_each_call_it_would_let_through(history: History, home: Path):
    """Without the confirmation rule the operator's cancel runs at once; the agent's still needs
    approval (its role's own with_approval: another rule, the same outcome, so no change); the
    stranger's submit, denied, would run."""
    before = store_state(home)
    report = check_policy(history.w.store, policy(loose_yaml()))
    assert changes(report) == [
        (
            history.me,
            "cancel_job",
            "destroy-needs-confirmation",
            "roles.operator",
            "needs_approval -> allow",
        ),
        (STRANGER, "submit_job", "grants", "roles.reader", "deny -> allow"),
    ]
    agent_cancel = report.calls[4]
    assert (agent_cancel.principal, agent_cancel.change) == ("agent", None)
    assert agent_cancel.after.rule == "roles.agent.with_approval"
    assert report.summary() == "replayed 7 calls: 1 deny -> allow, 1 needs_approval -> allow"
    assert store_state(home) == before


def test_the_shipped_policy_changes_nothing_and_the_window_limits_the_replay(history: History):
    store = history.w.store
    report = check_policy(store, load_policy(None))
    assert report.summary() == "replayed 7 calls: no change"
    future = check_policy(store, load_policy(None), Window(since=local_now() + timedelta(hours=1)))
    assert future.totals.replayed == 0 and future.through_event == report.through_event
    upto = check_policy(store, load_policy(None), Window(through_event=report.calls[1].event_id))
    assert upto.totals.replayed == 2 and upto.through_event == report.calls[1].event_id


def test_kill_switch_refusals_are_counted_not_replayed(history: History):
    w = history.w
    killswitch.pause(w.store, w.audit, "ops", "maintenance")
    with pytest.raises(Paused):
        history.call(history.me, "submit_job", {"spec": SPEC})
    killswitch.resume(w.store, w.audit, "ops")
    report = check_policy(w.store, policy(strict_yaml()))
    assert report.totals.kill_switch == 1 and report.totals.replayed == 7
    assert report.summary() == STRICT_SUMMARY + " (1 kill-switch refusals not replayed)"


def test_an_invalid_candidate_names_the_field():
    with pytest.raises(SpecError, match="field 'roles.a.capabilities.0'") as info:
        policy_from_text("version: 1\nroles: {a: {capabilities: [fly]}}\n", "new.yaml")
    assert isinstance(info.value, BadArguments) and info.value.line == 2
    data = shipped()
    data["principals"]["agent"]["roles"] = ["robot"]
    with pytest.raises(SpecError, match="principals.agent.roles.0.*unknown role 'robot'"):
        policy_from_text(yaml.safe_dump(data), "new.yaml")


def test_ages():
    assert parse_age("7d") == timedelta(days=7) and parse_age("90s") == timedelta(seconds=90)
    assert parse_age("1.5h") == timedelta(minutes=90) and parse_age("2w") == timedelta(days=14)
    for bad in ("7", "d", "7y", "-1d", ""):
        with pytest.raises(BadArguments, match="--since"):
            parse_age(bad)


# ------------------------------------------------------------------------------ the CLI
def test_the_cli_prints_the_changed_calls_and_writes_nothing(
    history: History, home: Path, tmp_path
):
    strict = tmp_path / "strict.yaml"
    strict.write_text(strict_yaml())
    before = store_state(home)
    res = nightshift("policy", "check", str(strict))
    assert res.returncode == 0, res.stderr
    assert STRICT_SUMMARY in res.stdout and "3 unchanged" in res.stdout
    assert res.stdout.count("allow -> needs_approval") == 3  # two rows and the summary
    assert "submit-needs-approval" in res.stdout and "pause_job" not in res.stdout
    res = nightshift("policy", "check", str(strict), "--json", "--since", "1h")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["summary"] == STRICT_SUMMARY and data["totals"]["replayed"] == 7
    assert [c["change"] for c in data["calls"]] == ["allow -> needs_approval"] * 2 + [
        "quorum 1 -> 2"
    ] * 2
    res = nightshift("policy", "check", str(strict), "--all", "--json")
    assert len(json.loads(res.stdout)["calls"]) == 7
    assert store_state(home) == before

    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nroles: {a: {capabilities: [fly]}}\n")
    res = nightshift("policy", "check", str(bad))
    assert res.returncode == 2 and "field 'roles.a.capabilities.0'" in res.stderr
    res = nightshift("policy", "check", str(strict), env={"NIGHTSHIFT_API__MODE": "client"})
    assert res.returncode == 5 and "opens the store" in res.stderr


# ------------------------------------------------------------------------------ applying
def apply_args(w: Wiring, path: Path, text: str) -> dict[str, Any]:
    """What `nightshift policy apply` computes before its call."""
    report = check_policy(w.store, policy(text))
    return {
        "policy_path": str(path),
        "since": None,
        "through_event": report.through_event,
        "summary": report.summary(),
    }


def stored(w: Wiring) -> tuple[str | None, str | None]:
    return w.store.get_kv(ACTIVE_SHA256), w.store.get_kv(ACTIVE_YAML)


def test_apply_needs_approval_then_every_process_judges_by_the_new_policy(
    history: History, tmp_path: Path
):
    w, me = history.w, history.me
    daemon = Wiring.load()  # another process, already judging by the shipped policy
    daemon.gate.call(daemon.context("agent", "daemon-1"), "list_jobs", {})
    path = tmp_path / "strict.yaml"
    path.write_text(strict_yaml())
    args = apply_args(w, path, strict_yaml())
    with pytest.raises(ApprovalRequired) as info:  # a destroy: destroy-needs-confirmation
        history.call(me, "apply_policy", args, "apply-1")
    row = w.approvals.get(info.value.approval_id)
    with_daemon = STRICT_SUMMARY.replace("7 calls", "8 calls")  # its list_jobs too
    assert row.args["summary"] == with_daemon and row.rule == "destroy-needs-confirmation"
    assert row.files == {str(path.resolve()): text_sha256(strict_yaml())}
    history.call("agent", "list_jobs", {})  # recorded since: the new policy would not change it
    w.approvals.vote(row.id, "alice", True, local_now())
    result = history.call(me, "apply_policy", args, "apply-1")
    assert result.sha256 == text_sha256(strict_yaml()) and result.previous_sha256 is None
    assert result.later_calls == 1
    assert stored(w) == (result.sha256, strict_yaml())

    with pytest.raises(ApprovalRequired) as held:  # this process: the next call
        history.call(me, "submit_job", {"spec": SPEC})
    assert w.approvals.get(held.value.approval_id).rule == "submit-needs-approval"
    with pytest.raises(ApprovalRequired):  # the daemon, without a restart
        daemon.gate.call(daemon.context("agent", "daemon-2"), "submit_job", {"spec": SPEC})
    loaded = w.audit.events(action="policy.loaded")
    assert [e.payload for e in loaded] == [
        {"sha256": result.sha256, "previous_sha256": None, "source": "store"}
    ] * 2
    fresh = Wiring.load()  # a process started now judges by it from the start, silently
    assert fresh.policy.policy.approvals[-1].id == "submit-needs-approval"
    assert w.audit.events(action="policy.loaded") == loaded
    assert [r.skill for r in w.audit.events(action="skill.result", skill="apply_policy")] == [
        "apply_policy"
    ]


def test_apply_is_refused_when_the_history_changed_or_the_summary_is_not_true(
    history: History, tmp_path: Path
):
    w, me = history.w, history.me
    path = tmp_path / "strict.yaml"
    path.write_text(strict_yaml())
    args = apply_args(w, path, strict_yaml())
    with pytest.raises(ApprovalRequired) as info:
        history.call(me, "apply_policy", args, "apply-1")
    history.call(me, "submit_job", {"spec": SPEC})  # allowed now; held back under the new one
    w.approvals.vote(info.value.approval_id, "alice", True, local_now())
    with pytest.raises(SkillFailed, match="1 call\\(s\\) recorded since the request would also"):
        history.call(me, "apply_policy", args, "apply-1")
    assert stored(w) == (None, None)
    assert w.approvals.get(info.value.approval_id).state == "failed"

    forged = {**apply_args(w, path, strict_yaml()), "summary": "replayed 8 calls: no change"}
    with pytest.raises(ApprovalRequired) as info:
        history.call(me, "apply_policy", forged, "apply-2")
    w.approvals.vote(info.value.approval_id, "alice", True, local_now())
    with pytest.raises(SkillFailed, match="the approvers saw 'replayed 8 calls: no change'"):
        history.call(me, "apply_policy", forged, "apply-2")
    assert stored(w) == (None, None)
    history.call(me, "submit_job", {"spec": SPEC})  # still the shipped policy


def test_the_cli_asks_for_approval_and_the_approval_shows_the_diff(
    history: History, home: Path, tmp_path: Path
):
    path = tmp_path / "strict.yaml"
    path.write_text(strict_yaml())
    res = nightshift("policy", "apply", str(path))
    assert res.returncode == 4, res.stderr  # no terminal: parked for approval at once
    assert STRICT_SUMMARY in res.stdout
    with history.w.store.session() as s:
        (row,) = s.exec(select(Approval).where(col(Approval.skill) == "apply_policy")).all()
    shown = nightshift("approvals", "show", str(row.id))
    assert shown.returncode == 0 and STRICT_SUMMARY in shown.stdout
    assert stored(history.w) == (None, None)


def test_a_damaged_stored_policy_stops_every_verdict_until_it_is_removed(w: Wiring):
    """Rows written outside apply_policy (a text that is not its sha256's) judge nothing; once
    they are removed the file's policy judges again, and each switch is audited."""
    history = History(w)
    history.call("agent", "list_jobs", {})
    w.store.set_kv(ACTIVE_YAML, loose_yaml())
    w.store.set_kv(ACTIVE_SHA256, text_sha256(strict_yaml()))
    with pytest.raises(ConfigError, match="does not match its sha256.*delete the keyvalue rows"):
        history.call("agent", "list_jobs", {})
    w.store.set_kv(ACTIVE_SHA256, text_sha256(loose_yaml()))
    history.call(STRANGER, "submit_job", {"spec": SPEC})  # readers may launch under it
    w.store.set_kv(ACTIVE_SHA256, None)
    w.store.set_kv(ACTIVE_YAML, None)
    with pytest.raises(PolicyDenied):
        history.call(STRANGER, "submit_job", {"spec": SPEC})
    assert [e.payload["source"] for e in w.audit.events(action="policy.loaded")] == [
        "store",
        "file",
    ]
