"""The policy file and the engine: grants, limits and approval rules; verdicts name their rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nightshift.policies.engine import PolicyEngine, image_allowed
from nightshift.policies.model import Condition, Policy, load_policy
from nightshift.runtime.errors import SpecError
from nightshift.skills.base import Claims, Launch, Skill, SkillContext, SkillInput, skill


class AnyArgs(SkillInput):
    model_config = ConfigDict(extra="allow")

    def claims(self) -> Claims:
        return Claims()  # limit tests hand the engine their claims directly


def launch(**kw: Any) -> Claims:
    """What one launch would claim: gpus, image, mounts, runtime_min, where."""
    return Claims(launches=[Launch(**{"where": "the call", **kw})])


class Echo(BaseModel):
    args: dict[str, Any]


def make_skill(name: str, capability: str) -> Skill:
    """A tiny skill built with the real decorator (which registers nothing: the built-ins are an
    explicit table)."""

    def fn(ctx: SkillContext, inp: AnyArgs) -> Echo:
        """Echo the arguments back (test skill)."""
        return Echo(args=inp.model_dump())

    made = skill(name, capability=capability)(fn)  # type: ignore[arg-type]
    return made


READ = make_skill("test_policy_read", "read")
LAUNCH = make_skill("test_policy_launch", "launch")
MODIFY = make_skill("test_policy_modify", "modify")
DESTROY = make_skill("test_policy_destroy", "destroy")


@pytest.fixture
def engine(home: Path) -> PolicyEngine:
    return PolicyEngine(load_policy(None))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


MINIMAL = """\
roles:
  operator: {capabilities: [read, launch, modify, destroy], can_approve: true}
  reader: {capabilities: [read]}
principals:
  local_user: {kind: user, roles: [operator]}
"""


# --- the shipped default ------------------------------------------------------------------------


def test_default_policy_ships_as_package_data(engine: PolicyEngine) -> None:
    """`load_policy(None)` must find default.yaml through importlib.resources in any install."""
    pol = engine.policy
    assert {"agent", "system", "local_user"} <= set(pol.principals)
    assert pol.limits.max_gpus_per_job == 8
    assert [r.id for r in pol.approvals] == [
        "others-jobs-need-another-person",
        "destroy-needs-confirmation",
        "gpu-power-limit-needs-a-person",
    ]


def test_default_agent_launches_but_destroy_needs_approval(engine: PolicyEngine) -> None:
    """The planner may start work on its own; anything destructive waits for a second person."""
    v = engine.evaluate("agent", LAUNCH, {"gpus": 1})
    assert (v.decision, v.rule) == ("allow", "roles.agent")
    v = engine.evaluate("agent", DESTROY, {"job_id": 3})
    assert (v.decision, v.rule, v.quorum, v.expires_min) == (
        "needs_approval",
        "destroy-needs-confirmation",
        1,
        60,
    )
    assert "destroy-needs-confirmation" in v.reasons[0]
    assert "role agent may use destroy skills only with approval" in v.reasons[1]


def test_default_local_os_user_may_do_everything_with_approvals(engine: PolicyEngine) -> None:
    """An OS user the policy does not list runs the CLI as `local_user` (local_users: "*")."""
    assert engine.resolve("alice")[0] == "alice"
    assert engine.roles_of("alice") == ["operator"]
    assert engine.evaluate("alice", MODIFY, {}).decision == "allow"
    v = engine.evaluate("alice", DESTROY, {})
    assert (v.decision, v.rule) == ("needs_approval", "destroy-needs-confirmation")


def test_default_unknown_channel_user_only_reads(engine: PolicyEngine) -> None:
    """An unmapped Slack user gets the default role: read, and no vote on approvals."""
    assert engine.evaluate("slack:U999", READ, {}).decision == "allow"
    v = engine.evaluate("slack:U999", LAUNCH, {})
    assert (v.decision, v.rule) == ("deny", "grants")
    assert "slack:U999" in v.reasons[0] and "grant 'launch'" in v.reasons[0]
    assert not engine.may_approve("slack:U999")
    assert engine.may_approve("alice") and not engine.may_approve("agent")


def test_default_system_never_destroys(engine: PolicyEngine) -> None:
    """The loop may place and pause work but holds no destroy grant, with or without approval."""
    assert engine.evaluate("system", MODIFY, {}).decision == "allow"
    assert engine.evaluate("system", DESTROY, {}).rule == "grants"


# --- principals and roles -----------------------------------------------------------------------


def test_channel_and_os_mappings_resolve_to_named_principal(tmp_path: Path) -> None:
    """A Slack, WeChat or OS identity mapped to a principal is that principal (roles and name)."""
    eng = PolicyEngine(
        load_policy(
            write(
                tmp_path,
                MINIMAL
                + """\
  alice: {kind: user, os_user: alice, slack_id: U1, wechat_id: w.alice, roles: [operator]}
local_users: [carol]
""",
            )
        )
    )
    for ident in ("alice", "os:alice", "slack:U1", "wechat:w.alice"):
        assert eng.resolve(ident)[0] == "alice"
        assert eng.evaluate(ident, LAUNCH, {}).decision == "allow"
    assert eng.roles_of("carol") == ["operator"]  # listed in local_users
    assert eng.roles_of("bob") == ["reader"]  # not listed: default role
    assert eng.evaluate("bob", LAUNCH, {}).rule == "grants"


def test_role_skill_globs_and_with_approval(tmp_path: Path) -> None:
    """Roles narrow by skill-name globs; `with_approval` alone yields an approval, not a deny."""
    eng = PolicyEngine(
        load_policy(
            write(
                tmp_path,
                """\
roles:
  bot:
    capabilities: [read, launch]
    with_approval: [destroy]
    approval_quorum: 2
    approval_expires_min: 15
    skills: ["test_policy_*"]
    deny_skills: ["test_policy_modify"]
  reader: {capabilities: [read]}
principals:
  bot: {kind: agent, roles: [bot]}
local_user_principal: null
""",
            )
        )
    )
    assert eng.evaluate("bot", LAUNCH, {}).decision == "allow"
    v = eng.evaluate("bot", DESTROY, {})
    assert (v.decision, v.rule, v.quorum, v.expires_min) == (
        "needs_approval",
        "roles.bot.with_approval",
        2,
        15,
    )
    assert eng.evaluate("bot", MODIFY, {}).rule == "grants"
    other = make_skill("other_launch_for_policy_test", "launch")
    assert eng.evaluate("bot", other, {}).rule == "grants"
    assert eng.roles_of("someone") == ["reader"]  # no local_user_principal: unknown is default


# --- limits -------------------------------------------------------------------------------------


def test_gpu_limit_judges_what_each_launch_claims(engine: PolicyEngine) -> None:
    """Every launch a call claims is held to the limit, and the reason names which one asks."""
    assert engine.evaluate("agent", LAUNCH, {}, launch(gpus=8)).decision == "allow"
    claims = Claims(launches=[Launch(where="items[0]", gpus=2), Launch(where="items[1]", gpus=16)])
    v = engine.evaluate("agent", LAUNCH, {}, claims)
    assert (v.decision, v.rule) == ("deny", "limits.max_gpus_per_job")
    assert v.reasons == [v.reasons[0]] and v.reasons[0].startswith("items[1] asks for 16 GPUs")
    assert "8 or fewer" in v.reasons[0]


def test_image_globs(engine: PolicyEngine) -> None:
    """Images must match an allowed glob; docker.io prefixes and digests normalise."""
    for ok in (
        "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "docker.io/library/python:3.11",
        "pytorch/pytorch@sha256:abc",
    ):
        assert engine.evaluate("agent", LAUNCH, {}, launch(image=ok)).decision == "allow", ok
    v = engine.evaluate("agent", LAUNCH, {}, launch(where="spec", image="evil/miner:latest"))
    assert (v.decision, v.rule) == ("deny", "limits.allowed_images")
    assert "spec: image 'evil/miner:latest'" in v.reasons[0]
    assert "add a pattern" in v.reasons[0]
    assert not image_allowed("pytorch/pytorch-evil:1", ["pytorch/pytorch:*"])


def test_mount_roots_expand_and_block_escapes(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mount roots expand `~` and `$NIGHTSHIFT_HOME`; `..` and symlinks cannot escape them."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "user" / "data").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "user" / "link").symlink_to(tmp_path / "outside")
    eng = PolicyEngine(
        load_policy(
            write(
                tmp_path,
                MINIMAL
                + """\
limits:
  allowed_mount_roots: ["~", "$NIGHTSHIFT_HOME/datasets"]
""",
            )
        )
    )
    allowed = ["~/data", f"{home}/datasets/mnist", str(tmp_path / "user")]
    assert eng.evaluate("alice", LAUNCH, {}, launch(mounts=allowed)).decision == "allow"
    for bad in (f"{tmp_path}/outside", "~/../outside", "~/link", f"{home}/other"):
        v = eng.evaluate("alice", LAUNCH, {}, launch(where="spec", mounts=[bad]))
        assert (v.decision, v.rule) == ("deny", "limits.allowed_mount_roots"), bad
        assert f"spec mounts '{bad}'" in v.reasons[0] and "add its root" in v.reasons[0]
    assert str(tmp_path / "user") in eng.limits()["allowed_mount_roots"]


def test_runtime_limit(engine: PolicyEngine) -> None:
    """A timeout beyond max_runtime_min is denied."""
    assert engine.evaluate("agent", LAUNCH, {}, launch(runtime_min=4320)).decision == "allow"
    v = engine.evaluate("agent", LAUNCH, {}, launch(runtime_min=10_000.5))
    assert (v.decision, v.rule) == ("deny", "limits.max_runtime_min")
    assert "checkpoint and resume" in v.reasons[0]


def test_all_limit_violations_reported_first_one_names_rule(engine: PolicyEngine) -> None:
    """A call breaking several limits hears about all of them at once."""
    v = engine.evaluate("agent", LAUNCH, {}, launch(gpus=64, image="x:1", runtime_min=1e6))
    assert v.rule == "limits.max_gpus_per_job" and len(v.reasons) == 3


def test_read_skills_are_never_blocked_by_limits(engine: PolicyEngine) -> None:
    """A read skill (config_validator) may look at an over-limit spec to advise about it."""
    claims = launch(gpus=64, image="evil:1")
    assert engine.evaluate("slack:U9", READ, {}, claims).decision == "allow"


def test_limits_apply_to_local_users_too(engine: PolicyEngine) -> None:
    """Limits bind every principal, including the operator at the keyboard."""
    assert engine.evaluate("alice", LAUNCH, {}, launch(gpus=9)).rule == "limits.max_gpus_per_job"


# --- approval rules -----------------------------------------------------------------------------

RULES = (
    MINIMAL
    + """\
approvals:
  - id: destroy-any
    capabilities: [destroy]
  - id: destroy-high-priority
    capabilities: [destroy]
    when: ["args.job_priority >= 5"]
    quorum: 2
    expires_min: 120
  - id: big-launch
    skills: ["test_policy_launch"]
    when: ["args.gpus > 4", "args.queue in [prod, shared]"]
    expires_min: null
"""
)


def test_approval_rules_match_conditions_and_largest_quorum_wins(tmp_path: Path) -> None:
    """Argument conditions select rules; when several match, the largest quorum decides."""
    eng = PolicyEngine(load_policy(write(tmp_path, RULES)))
    v = eng.evaluate("alice", DESTROY, {"job_priority": 7})
    assert (v.decision, v.rule, v.quorum, v.expires_min) == (
        "needs_approval",
        "destroy-high-priority",
        2,
        120,
    )
    assert len(v.reasons) == 2
    assert eng.evaluate("alice", DESTROY, {"job_priority": 3}).rule == "destroy-any"
    assert eng.evaluate("alice", DESTROY, {"job_priority": "high"}).rule == "destroy-any"
    assert eng.evaluate("alice", DESTROY, {}).rule == "destroy-any"  # missing arg: no match
    v = eng.evaluate("alice", LAUNCH, {"gpus": 6, "queue": "prod"})
    assert (v.decision, v.rule, v.expires_min) == ("needs_approval", "big-launch", None)
    assert eng.evaluate("alice", LAUNCH, {"gpus": 6, "queue": "dev"}).decision == "allow"
    assert eng.evaluate("alice", LAUNCH, {"gpus": 2, "queue": "prod"}).decision == "allow"


def test_conditions_parse() -> None:
    """The small condition language: dotted paths, six comparisons, in / not in with lists."""
    c = Condition.parse("args.spec.resources.gpus >= 2")
    assert c.path == ("spec", "resources", "gpus") and c.holds({"spec": {"resources": {"gpus": 2}}})
    assert Condition.parse("args.host not in [a, b]").holds({"host": "c"})
    assert Condition.parse("args.name == 'x y'").holds({"name": "x y"})
    for bad in ("job_priority >= 5", "args.x ~ 3", "args.x in 3", "args.x >="):
        with pytest.raises(ValueError):
            Condition.parse(bad)


# --- bad policy files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, field, line",
    [
        (MINIMAL + "limits:\n  max_gpus_per_job: many\n", "limits.max_gpus_per_job", 7),
        (MINIMAL + "  bob: {kind: robot, roles: [reader]}\n", "principals.bob.kind", 6),
        (
            MINIMAL + "  bob:\n    kind: user\n    roles: [reader, admin]\n",
            "principals.bob.roles.1",
            8,
        ),
        (MINIMAL + "approvals:\n  - id: x\n    when: ['priority > 1']\n", "approvals.0.when", 8),
        (
            MINIMAL + "approvals:\n  - id: x\n    capabilities: [delete]\n",
            "approvals.0.capabilities.0",
            8,
        ),
        (MINIMAL + "approvals:\n  - {id: x}\n  - {id: x}\n", "approvals.1.id", 8),
        (MINIMAL + "limitz: {}\n", "limitz", 6),
        (MINIMAL + "default_role: guest\n", "default_role", 6),
    ],
)
def test_bad_policy_names_field_and_line(tmp_path: Path, text: str, field: str, line: int) -> None:
    """An operator's typo must point at the field and the line, not a traceback."""
    with pytest.raises(SpecError) as err:
        load_policy(write(tmp_path, text))
    assert (err.value.field, err.value.line) == (field, line), str(err.value)
    assert f"policy.yaml:{line}" in str(err.value)


def test_bad_policy_yaml_syntax_and_missing_file(tmp_path: Path) -> None:
    """Broken YAML reports its line; a missing file says so."""
    with pytest.raises(SpecError) as err:
        load_policy(write(tmp_path, "roles:\n  a: [\n"))
    assert err.value.line is not None
    with pytest.raises(SpecError, match="file not found"):
        load_policy(tmp_path / "nope.yaml")


def test_engine_rejects_inconsistent_policy_built_in_code() -> None:
    """A Policy built in code gets the same cross-reference check as one loaded from a file."""
    pol = Policy.model_validate(
        {
            "roles": {"reader": {"capabilities": ["read"]}},
            "principals": {"x": {"kind": "user", "roles": ["nope"]}},
            "local_user_principal": None,
        }
    )
    with pytest.raises(SpecError, match="principals.x.roles.0"):
        PolicyEngine(pol)


def test_nightshift_home_expands_at_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$NIGHTSHIFT_HOME is read when a call is checked, so one engine follows the environment."""
    eng = PolicyEngine(
        load_policy(
            write(
                tmp_path,
                MINIMAL
                + """\
limits: {allowed_mount_roots: ["$NIGHTSHIFT_HOME"]}
""",
            )
        )
    )
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(tmp_path / "h1"))
    assert eng.limits()["allowed_mount_roots"] == [os.path.realpath(tmp_path / "h1")]
    assert (
        eng.evaluate("alice", LAUNCH, {}, launch(mounts=[f"{tmp_path}/h1/x"])).decision == "allow"
    )
    assert eng.evaluate("alice", LAUNCH, {}, launch(mounts=[f"{tmp_path}/h2/x"])).decision == "deny"


def test_limits_apply_to_a_spec_given_by_path(tmp_path):
    """submit_job usually names a spec file; its GPUs and image are held to the limits too."""
    from nightshift.policies.engine import PolicyEngine
    from nightshift.skills.registry import get_skill

    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: big\ncommand: [python, t.py]\nresources: {gpus: 64}\n"
        "environment: {image: 'evil/miner:latest'}\n"
    )
    submit = get_skill("submit_job")
    inp = submit.parse({"spec_path": str(spec)})
    verdict = PolicyEngine().evaluate("agent", submit, {"spec_path": str(spec)}, inp.claims())
    assert verdict.decision == "deny"
    assert verdict.rule == "limits.max_gpus_per_job"
    assert any("evil/miner" in r for r in verdict.reasons)
