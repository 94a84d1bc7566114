"""The policy file: who may use which skills, within which limits, and which calls need approval.

A policy is YAML validated by pydantic; `load_policy(None)` reads the shipped `default.yaml`.
Errors name the field and the line (`SpecError`), cross-references included (a principal naming
a role that does not exist).
"""

from __future__ import annotations

import functools
import operator
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from nightshift.runtime.config import nightshift_home
from nightshift.runtime.errors import SpecError
from nightshift.runtime.yamlfile import line_of, read_yaml, validate
from nightshift.skills.base import Capability

DEFAULT_POLICY = "default.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Role(_Strict):
    """What the holders of a role may do. A skill is covered when its name matches `skills` and
    none of `deny_skills`; it is then allowed when its capability is in `capabilities`, and allowed
    only after approval when it is in `with_approval`."""

    capabilities: list[Capability] = Field(
        default_factory=list, description="Capabilities allowed outright"
    )
    with_approval: list[Capability] = Field(
        default_factory=list, description="Capabilities allowed only after approval"
    )
    skills: list[str] = Field(default_factory=lambda: ["*"], description="Skill-name globs covered")
    deny_skills: list[str] = Field(
        default_factory=list, description="Skill-name globs never allowed"
    )
    can_approve: bool = Field(
        default=False, description="Holders may vote on other principals' approvals"
    )
    approval_quorum: int = Field(default=1, ge=1, description="Quorum when `with_approval` applies")
    approval_expires_min: float | None = Field(
        default=60.0, gt=0, description="Expiry when `with_approval` applies"
    )


class Principal(_Strict):
    """Who asks: a named user, the planner (`agent`), the loop (`system`) or a channel."""

    kind: Literal["user", "agent", "system", "channel"]
    os_user: str | None = Field(
        default=None, description="Local OS login that maps to this principal"
    )
    slack_id: str | None = Field(default=None, description="Slack user id; arrives as `slack:<id>`")
    wechat_id: str | None = Field(
        default=None, description="WeChat Work user id; arrives as `wechat:<id>`"
    )
    roles: list[str] = Field(default_factory=list)


class Limits(_Strict):
    """Limits on the arguments of every non-read call. `None` means no limit."""

    max_gpus_per_job: int | None = Field(default=None, ge=0)
    allowed_images: list[str] | None = Field(
        default=None, description="Image globs; None allows any image"
    )
    allowed_mount_roots: list[str] | None = Field(
        default=None,
        description="Host folders that every path a run touches must lie under (symlinks "
        "resolved), for every executor: mounts, code folder, checkpoint folder, metrics and log "
        "files; `~`, `$NIGHTSHIFT_HOME` and `$NIGHTSHIFT_EXAMPLES` (the shipped examples) expand",
    )
    max_runtime_min: float | None = Field(default=None, gt=0)

    def mount_roots(self) -> list[Path] | None:
        """The allowed roots, expanded for the current environment. Resolving them costs a
        realpath per root and was a fifth of a submission's time, so an expansion is reused
        for the same environment for ROOTS_TTL_S (a root re-pointed by a symlink is seen then)."""
        if self.allowed_mount_roots is None:
            return None
        key = (
            tuple(self.allowed_mount_roots),
            tuple(os.environ.get(v) for v in _root_variables(tuple(self.allowed_mount_roots))),
        )
        now = time.monotonic()
        hit = _roots_cache.get(key)
        if hit is None or now - hit[0] > ROOTS_TTL_S:
            hit = (now, [expand_path(r) for r in self.allowed_mount_roots])
            _roots_cache.clear()  # one environment at a time is the common case
            _roots_cache[key] = hit
        return list(hit[1])


ROOTS_TTL_S = 5.0
_roots_cache: dict[tuple[Any, ...], tuple[float, list[Path]]] = {}


@functools.cache
def _root_variables(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The environment variables an expansion of these roots reads (HOME for `~`): a change to
    any other variable cannot change it."""
    names = {"HOME", "NIGHTSHIFT_HOME"}
    for root in roots:
        names.update(a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", root))
    return tuple(sorted(names))


def expand_path(raw: str) -> Path:
    """Expand `$NIGHTSHIFT_HOME` (its default when unset), `$NIGHTSHIFT_EXAMPLES` (the examples
    installed with nightshift, so that the quickstart runs wherever it is installed), other
    variables and `~`; resolve."""
    text = raw.replace("${NIGHTSHIFT_HOME}", "$NIGHTSHIFT_HOME")
    text = text.replace("$NIGHTSHIFT_HOME", str(nightshift_home()))
    text = text.replace("${NIGHTSHIFT_EXAMPLES}", "$NIGHTSHIFT_EXAMPLES")
    text = text.replace("$NIGHTSHIFT_EXAMPLES", str(examples_dir()))
    return Path(os.path.realpath(os.path.expanduser(os.path.expandvars(text))))


@functools.cache
def examples_dir() -> Path:
    """The folder of the examples that ship with nightshift (`nightshift.examples`)."""
    return Path(str(resources.files("nightshift.examples")))


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}
_COND = re.compile(
    r"^\s*(args|claims)((?:\.[A-Za-z_]\w*)+)\s*(?:(==|!=|>=|<=|>|<)|\s(not\s+in|in)\s)\s*(\S.*?)\s*$"
)
_MISSING = object()


@dataclass(frozen=True)
class Condition:
    """`args.<path> <op> <YAML literal>` or `claims.<path> …`, e.g. `args.reason == oom` or
    `claims.max_job_priority >= 5` (the claims are the gate's: GPUs, images, mounts, the jobs a
    call touches, their owners and highest priority)."""

    root: str
    path: tuple[str, ...]
    op: str
    value: Any
    text: str

    @classmethod
    def parse(cls, text: str) -> Condition:
        m = _COND.match(text)
        if not m:
            raise ValueError(
                f"condition {text!r} is not `args.<name> <op> <value>` (or "
                "`claims.<name> …`) with op one of ==, !=, >=, <=, >, <, in, not in "
                "(e.g. `claims.max_job_priority >= 5`)"
            )
        root, path, raw = m.group(1), m.group(2), m.group(5)
        op = m.group(3) or " ".join(m.group(4).split())
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"condition {text!r}: value {raw!r} is not a YAML literal") from exc
        if op in ("in", "not in") and not isinstance(value, list):
            raise ValueError(f"condition {text!r}: `{op}` needs a list, e.g. [a, b]")
        return cls(root, tuple(path.strip(".").split(".")), op, value, text)

    def holds(self, args: dict[str, Any], claims: dict[str, Any] | None = None) -> bool:
        """True when the value exists and compares; a missing or incomparable one is False."""
        cur: Any = args if self.root == "args" else (claims or {})
        for part in self.path:
            cur = cur.get(part, _MISSING) if isinstance(cur, dict) else _MISSING
            if cur is _MISSING:
                return False
        try:
            return bool(_OPS[self.op](cur, self.value))
        except TypeError:
            return False


class _CallRule(_Strict):
    """What approval and deny rules match a call by: its skill, its capability and conditions
    on its arguments and claims (all given criteria must hold)."""

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    skills: list[str] = Field(
        default_factory=list, description="Skill-name globs; empty: any skill"
    )
    capabilities: list[Capability] = Field(
        default_factory=list, description="Empty: any capability"
    )
    when: list[str] = Field(default_factory=list, description="Argument conditions; all must hold")

    _conditions: list[Condition] = PrivateAttr(default_factory=list)

    @field_validator("when")
    @classmethod
    def _conditions_parse(cls, v: list[str]) -> list[str]:
        for text in v:
            Condition.parse(text)
        return v

    def model_post_init(self, _context: Any) -> None:
        self._conditions = [Condition.parse(t) for t in self.when]

    def matches(
        self, skill_name: str, capability: str, args: dict[str, Any], claims: dict[str, Any]
    ) -> bool:
        if self.skills and not any(fnmatchcase(skill_name, g) for g in self.skills):
            return False
        if self.capabilities and capability not in self.capabilities:
            return False
        return all(c.holds(args, claims) for c in self._conditions)


class ApprovalRule(_CallRule):
    """A call matching every given criterion needs `quorum` approvals. A person at a terminal may
    confirm their own request unless `from_others` (the two-person rule); the agent's and the
    loop's calls always need other principals."""

    quorum: int = Field(default=1, ge=1)
    expires_min: float | None = Field(default=60.0, gt=0)
    from_others: bool = Field(
        default=False,
        description="Only principals other than the "
        "requester count, even for a person confirming at a terminal",
    )
    approvers: list[str] = Field(
        default_factory=list,
        description="Who may vote: `owners` (the people who own the jobs the call touches) and "
        "role names; empty: anyone whose role can_approve",
    )
    channels: list[Literal["slack", "wechat"]] | None = Field(
        default=None,
        description="Where the request is posted besides the CLI and the TUI (which always "
        "have it); None: every configured channel, []: none",
    )


class DenyRule(_CallRule):
    """A call matching every given criterion is refused, unless its principal holds one of
    `unless_roles` or its OS account is in one of `unless_os_groups` (e.g. another person's job
    logs: for its owner, the admins and a team's group)."""

    unless_roles: list[str] = Field(default_factory=list, description="Roles the rule spares")
    unless_os_groups: list[str] = Field(
        default_factory=list, description="OS groups whose members the rule spares"
    )
    reason: str = Field("", description="Said to the caller, with the fix")


class WaiverRule(_CallRule):
    """A call by one of `principals` matching every given criterion needs none of the approvals
    that the rules named in `waives` would ask for (e.g. the scheduler's own power cap within a
    range, which the same rule asks a person to confirm for anyone else). It never lifts a
    denial, a limit or a missing grant, and it never speaks for people: a person's call still
    asks them."""

    principals: list[str] = Field(
        min_length=1,
        description="Who it spares, by the policy's principal names; only the agent's or the "
        "loop's (`system`) principals may be named",
    )
    waives: list[str] = Field(
        min_length=1,
        description="Ids of the approval rules it waives; an id no rule has waives nothing (a "
        "policy that drops the rule needs no waiver for it)",
    )
    reason: str = Field("", description="Why no person is asked; shown in the verdict")


class Policy(_Strict):
    """The whole policy file."""

    version: Literal[1] = 1
    roles: dict[str, Role]
    principals: dict[str, Principal] = Field(default_factory=dict)
    local_users: Literal["*"] | list[str] = Field(
        default="*",
        description="OS users (bare names) that map to `local_user_principal`; '*' for any",
    )
    local_user_principal: str | None = "local_user"
    default_role: str = Field(
        default="reader", description="Role of a principal the policy does not know"
    )
    limits: Limits = Limits()
    approvals: list[ApprovalRule] = Field(default_factory=list)
    denials: list[DenyRule] = Field(
        default_factory=list, description="Calls refused whatever the roles grant"
    )
    waivers: list[WaiverRule] = Field(
        default_factory=list,
        description="Calls by the agent or the loop that need no approval although an approval "
        "rule matches them",
    )

    def problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-reference errors pydantic cannot see: (field location, message)."""
        found: list[tuple[tuple[str | int, ...], str]] = []
        known = ", ".join(sorted(self.roles)) or "none"

        def unknown_role(loc: tuple[str | int, ...], role: str) -> None:
            found.append((loc, f"unknown role '{role}'; define it under roles (known: {known})"))

        for name, p in self.principals.items():
            for i, role in enumerate(p.roles):
                if role not in self.roles:
                    unknown_role(("principals", name, "roles", i), role)
        if self.default_role not in self.roles:
            unknown_role(("default_role",), self.default_role)
        local = self.local_user_principal
        if local is not None and local not in self.principals:
            msg = (
                f"unknown principal '{local}'; define it under principals, or set "
                "local_user_principal: null"
            )
            found.append((("local_user_principal",), msg))
        for i, rule in enumerate(self.approvals):
            for j, who in enumerate(rule.approvers):
                if who != "owners" and who not in self.roles:
                    unknown_role(("approvals", i, "approvers", j), who)
        for i, deny in enumerate(self.denials):
            for j, role in enumerate(deny.unless_roles):
                if role not in self.roles:
                    unknown_role(("denials", i, "unless_roles", j), role)
        for i, waiver in enumerate(self.waivers):
            for j, name in enumerate(waiver.principals):
                entry = self.principals.get(name)
                if entry is None or entry.kind not in ("agent", "system"):
                    found.append(
                        (
                            ("waivers", i, "principals", j),
                            f"'{name}' is not an agent or system principal listed under "
                            "principals: a waiver spares the agent or the loop, never a person",
                        )
                    )
        seen: set[str] = set()
        for i, rule in enumerate(self.approvals):
            if rule.id in seen:
                found.append((("approvals", i, "id"), f"duplicate rule id '{rule.id}'"))
            seen.add(rule.id)
        return found


def load_policy(path: str | Path | None = None) -> Policy:
    """Load and check a policy file; None loads the shipped default. Raises SpecError."""
    if path is None:
        ref = resources.files("nightshift.policies").joinpath(DEFAULT_POLICY)
        with resources.as_file(ref) as real:
            return _load(real)
    return _load(Path(path).expanduser())


def _load(path: Path) -> Policy:
    data, node, _ = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", path=str(path), line=1)
    policy = validate(Policy, data, path=str(path), node=node)
    for loc, msg in policy.problems():
        raise SpecError(
            msg, path=str(path), field=".".join(str(p) for p in loc), line=line_of(node, loc)
        )
    return policy
