"""The policy decision: may this principal make this call with these arguments, now or after
approval?

`PolicyEngine.evaluate` is pure: a principal, a skill and its arguments in, a `Verdict` out. The
order is grants (may this principal use this skill at all?), then limits on the arguments of
every non-read call, then approval rules. Nothing here runs a skill or writes anything.
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from nightshift.policies.model import Limits, Policy, Principal, expand_path, load_policy
from nightshift.runtime.errors import SpecError
from nightshift.skills.base import Skill


class Verdict(BaseModel):
    """The policy's answer for one call, naming the rule that decided it."""

    decision: Literal["allow", "deny", "needs_approval"]
    rule: str = Field(description="Id of the rule that decided: roles.<role>, limits.<key>, "
                                  "an approval rule's id, grants, or kill_switch")
    reasons: list[str] = Field(default_factory=list, description="Why, and for a deny, the fix")
    quorum: int = Field(default=0,
                        description="Approvals needed from other principals (needs_approval)")
    expires_min: float | None = Field(default=None,
                                      description="Minutes an approval request stays open")

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


class PolicyEngine:
    """Evaluates calls against one `Policy` (the shipped default when none is given)."""

    def __init__(self, policy: Policy | None = None):
        self.policy = policy if policy is not None else load_policy(None)
        for loc, msg in self.policy.problems():
            raise SpecError(msg, path="<policy>", field=".".join(str(p) for p in loc))

    # Principals ---------------------------------------------------------------------------------

    def resolve(self, principal: str) -> tuple[str, Principal | None]:
        """The canonical name of whoever `principal` is, and its policy entry (None: unknown).

        Listed names match directly; `slack:<id>` and `wechat:<id>` match a mapping; a bare or
        `os:` name matches an `os_user`, then `local_users`. A local user keeps its own name, so two
        people mapped to the same principal stay two voters.
        """
        pol = self.policy
        if principal in pol.principals:
            return principal, pol.principals[principal]
        kind, sep, ident = principal.partition(":")
        if sep and kind in ("slack", "wechat"):
            attr = f"{kind}_id"
            for name, p in pol.principals.items():
                if getattr(p, attr) == ident:
                    return name, p
            return principal, None
        user = ident if sep and kind == "os" else principal
        for name, p in pol.principals.items():
            if p.os_user == user:
                return name, p
        if pol.local_user_principal and (pol.local_users == "*" or user in pol.local_users):
            return user, pol.principals[pol.local_user_principal]
        return principal, None

    def canonical(self, principal: str) -> str:
        """The name votes and audits should count: `slack:U1` mapped to alice is `alice`."""
        return self.resolve(principal)[0]

    def roles_of(self, principal: str) -> list[str]:
        p = self.resolve(principal)[1]
        return list(p.roles) if p is not None else [self.policy.default_role]

    def may_approve(self, principal: str) -> bool:
        """Whether `principal` holds a role that may vote on other principals' approvals."""
        return any(self.policy.roles[r].can_approve for r in self.roles_of(principal))

    def limits(self) -> dict[str, Any]:
        """The limits with mount roots expanded: what a read skill may show to advise."""
        out = self.policy.limits.model_dump()
        roots = self.policy.limits.mount_roots()
        out["allowed_mount_roots"] = [str(r) for r in roots] if roots is not None else None
        return out

    # The decision -------------------------------------------------------------------------------

    def evaluate(self, principal: str, skill: Skill, args: dict[str, Any] | BaseModel) -> Verdict:
        if isinstance(args, BaseModel):
            args = args.model_dump(mode="json")
        cap = skill.capability
        roles = self.roles_of(principal)

        allowed_by: str | None = None
        approval_by: tuple[str, int, float | None] | None = None
        for name in roles:
            role = self.policy.roles[name]
            covered = (any(fnmatchcase(skill.name, g) for g in role.skills)
                       and not any(fnmatchcase(skill.name, g) for g in role.deny_skills))
            if covered and cap in role.capabilities:
                allowed_by = name
                break
            if covered and cap in role.with_approval and approval_by is None:
                approval_by = (name, role.approval_quorum, role.approval_expires_min)
        if allowed_by is None and approval_by is None:
            return Verdict(decision="deny", rule="grants", reasons=[
                (f"principal '{principal}' (roles: {', '.join(roles)}) may not use {cap} skills "
                f"such as '{skill.name}': grant '{cap}' to one of its roles in the policy file, "
                "or ask someone who holds it")])

        if cap != "read":
            violations = check_limits(self.policy.limits, args)
            if violations:
                return Verdict(decision="deny", rule=violations[0][0],
                               reasons=[reason for _, reason in violations])

        # Approval: every matching rule, then a role that allows only with approval. The largest
        # quorum decides; on a tie the first (a named rule before a role's default).
        candidates: list[tuple[str, int, float | None, str]] = []
        for rule in self.policy.approvals:
            if rule.skills and not any(fnmatchcase(skill.name, g) for g in rule.skills):
                continue
            if rule.capabilities and cap not in rule.capabilities:
                continue
            if not all(c.holds(args) for c in rule.conditions):
                continue
            why = f"approval rule {rule.id} matches ({cap} skill '{skill.name}'"
            why += f"; {' and '.join(rule.when)})" if rule.when else ")"
            candidates.append((rule.id, rule.quorum, rule.expires_min, why))
        if allowed_by is None and approval_by is not None:
            name, quorum, expires = approval_by
            candidates.append((f"roles.{name}.with_approval", quorum, expires,
                               f"role {name} may use {cap} skills only with approval"))
        if candidates:
            decider = max(candidates, key=lambda c: c[1])
            return Verdict(decision="needs_approval", rule=decider[0],
                           reasons=[c[3] for c in candidates], quorum=decider[1],
                           expires_min=decider[2])
        return Verdict(decision="allow", rule=f"roles.{allowed_by}",
                       reasons=[f"role {allowed_by} allows {cap} skills such as '{skill.name}'"])


# Limits -----------------------------------------------------------------------------------------


def _spec_file(args: dict[str, Any]) -> dict[str, Any]:
    """A spec named by `spec_path` is checked like an inline one (the file is read as data)."""
    path = args.get("spec_path")
    if not isinstance(path, str):
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}  # the skill itself reports an unreadable spec, with its field and line
    return loaded if isinstance(loaded, dict) else {}


def check_limits(limits: Limits, args: dict[str, Any]) -> list[tuple[str, str]]:
    """Every limit the arguments break, for a call and for each of a batch call's `items`."""
    found = _check_one(limits, args)
    for i, item in enumerate(args.get("items") or []):
        if isinstance(item, dict):
            found += [(rule, f"items[{i}]: {why}") for rule, why in _check_one(limits, item)]
    return found


def _check_one(limits: Limits, args: dict[str, Any]) -> list[tuple[str, str]]:
    """Every limit the arguments break: (rule id, reason naming the argument, limit and fix).

    Looks at top-level `gpus` (a count or a list of ids), `gpu_ids`, `image`, `mounts` (strings
    `src:dst[:mode]` or mappings with `source`/`src`/`host_path`), `volumes` (a mapping keyed by
    host path), `timeout_min`, `max_runtime_min`, and an experiment `spec` mapping
    (`resources.gpus`, `environment.image`, `timeout_min`).
    """
    spec: dict[str, Any] = args["spec"] if isinstance(args.get("spec"), dict) else _spec_file(args)
    out: list[tuple[str, str]] = []

    if limits.max_gpus_per_job is not None:
        for where, n in _gpu_counts(args, spec):
            if n > limits.max_gpus_per_job:
                out.append(("limits.max_gpus_per_job",
                            (f"{where} asks for {n} GPUs; limits.max_gpus_per_job is "
                            f"{limits.max_gpus_per_job}: ask for {limits.max_gpus_per_job} or "
                            "fewer, or raise the limit in the policy file")))

    if limits.allowed_images is not None:
        images = [("image", args.get("image")),
                  ("spec.environment.image", _dig(spec, "environment", "image"))]
        for where, image in images:
            if isinstance(image, str) and image and not image_allowed(image, limits.allowed_images):
                out.append(("limits.allowed_images",
                            (f"{where} '{image}' matches none of limits.allowed_images "
                            f"({', '.join(limits.allowed_images) or 'empty'}): use an allowed "
                            "image, or add a pattern for it to the policy file")))

    roots = limits.mount_roots()
    if roots is not None:
        spec_mounts = [(f"spec.environment.{w}", src) for w, src in
                       _mount_sources({"mounts": _dig(spec, "environment", "mounts") or []})]
        for where, source in _mount_sources(args) + spec_mounts:
            path = expand_path(source)
            if not any(path == root or path.is_relative_to(root) for root in roots):
                out.append(("limits.allowed_mount_roots",
                            (f"{where} mounts '{source}' ({path}), outside "
                             "limits.allowed_mount_roots "
                             f"({', '.join(map(str, roots)) or 'empty'}): mount a folder under "
                             "one of them, or add its root to the policy file")))

    if limits.max_runtime_min is not None:
        runtimes = [("timeout_min", args.get("timeout_min")),
                    ("max_runtime_min", args.get("max_runtime_min")),
                    ("spec.timeout_min", spec.get("timeout_min"))]
        for where, minutes in runtimes:
            if _is_number(minutes) and minutes > limits.max_runtime_min:
                out.append(("limits.max_runtime_min",
                            (f"{where} is {minutes:g} min; limits.max_runtime_min is "
                            f"{limits.max_runtime_min:g}: shorten it (checkpoint and resume), "
                            "or raise the limit in the policy file")))
    return out


def image_allowed(image: str, patterns: list[str]) -> bool:
    """Glob match; `docker.io/` and `docker.io/library/` are optional, a digest counts as a tag."""
    names = {image}
    short = image.removeprefix("docker.io/")
    names |= {short, short.removeprefix("library/")}
    names |= {n.replace("@", ":", 1) for n in list(names)}
    return any(fnmatchcase(n, p) for n in names for p in patterns)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _dig(d: dict[str, Any], *keys: str) -> Any:
    cur: Any = d
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


def _gpu_counts(args: dict[str, Any], spec: dict[str, Any]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for where, v in (("gpus", args.get("gpus")), ("gpu_ids", args.get("gpu_ids")),
                     ("spec.resources.gpus", _dig(spec, "resources", "gpus"))):
        if isinstance(v, (list, tuple)):
            found.append((where, len(v)))
        elif isinstance(v, int) and not isinstance(v, bool):
            found.append((where, v))
    return found


def _mount_sources(args: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    mounts = args.get("mounts")
    if isinstance(mounts, (list, tuple)):
        for i, m in enumerate(mounts):
            source: Any = None
            if isinstance(m, str):
                source = m.split(":", 1)[0]
            elif isinstance(m, dict):
                source = next((m[k] for k in ("source", "src", "host_path") if m.get(k)), None)
            if isinstance(source, (str, os.PathLike)) and str(source):
                found.append((f"mounts[{i}]", str(source)))
    volumes = args.get("volumes")
    if isinstance(volumes, dict):
        found += [(f"volumes[{k!r}]", str(k)) for k in volumes if isinstance(k, (str, Path))]
    return found
