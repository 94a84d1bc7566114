"""The policy decision: may this principal make this call with these arguments, now or after
approval?

`PolicyEngine.evaluate` is pure: a principal, a skill and its arguments in, a `Verdict` out. The
order is grants (may this principal use this skill at all?), then limits on what every non-read
call claims (its input model says: GPUs, images, mounts and every other host path a run touches,
runtime), then approval rules. Nothing here runs a skill or writes anything.
"""

from __future__ import annotations

import grp
import os
import pwd
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nightshift.policies.model import (
    DenyRule,
    Limits,
    Policy,
    Principal,
    WaiverRule,
    expand_path,
    load_policy,
)
from nightshift.runtime.errors import SpecError
from nightshift.skills.base import Claims, Skill


class Verdict(BaseModel):
    """The policy's answer for one call, naming the rule that decided it."""

    decision: Literal["allow", "deny", "needs_approval"]
    rule: str = Field(
        description="Id of the rule that decided: roles.<role>, limits.<key>, "
        "an approval rule's id, grants, or kill_switch"
    )
    reasons: list[str] = Field(default_factory=list, description="Why, and for a deny, the fix")
    quorum: int = Field(
        default=0, description="Approvals needed from other principals (needs_approval)"
    )
    expires_min: float | None = Field(
        default=None, description="Minutes an approval request stays open"
    )
    from_others: bool = Field(
        default=False,
        description="needs_approval: only principals other "
        "than the requester count; else a person at a terminal may confirm",
    )

    approvers: list[str] = Field(
        default_factory=list,
        description="needs_approval: who may vote — people by name and `role:<name>`; empty: "
        "anyone whose role can_approve",
    )

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


def in_os_groups(user: str, groups: list[str]) -> bool:
    """Whether the OS account `user` belongs to one of `groups` (primary or supplementary)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return False
    mine = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    for name in groups:
        try:
            if grp.getgrnam(name).gr_gid in mine:
                return True
        except KeyError:
            continue
    return False


# Owners that are no one: a job made before owners were recorded (the store's default).
NOBODY = ("", "unknown")


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

    def _denies(
        self,
        deny: DenyRule,
        principal: str,
        roles: list[str],
        skill: Skill,
        args: dict[str, Any],
        claims: dict[str, Any],
    ) -> bool:
        if not deny.matches(skill.name, skill.capability, args, claims):
            return False
        if any(r in deny.unless_roles for r in roles):
            return False
        return not (deny.unless_os_groups and in_os_groups(principal, deny.unless_os_groups))

    def _approvers(self, names: list[str], owners: list[str]) -> list[str]:
        """A rule's `approvers` as people and roles: `owners` becomes the canonical names of
        the people who own the jobs, a role name `role:<name>`."""
        out: list[str] = []
        for name in names:
            if name == "owners":
                out += sorted(
                    {self.canonical(o) for o in owners if o not in NOBODY and self.is_person(o)}
                )
            else:
                out.append(f"role:{name}")
        return out

    def may_decide(self, principal: str, approvers: list[str]) -> bool:
        """Whether `principal` is among an approval's approvers (any, when none are named)."""
        if not approvers:
            return True
        roles = {f"role:{r}" for r in self.roles_of(principal)}
        return self.canonical(principal) in approvers or bool(roles & set(approvers))

    def is_person(self, principal: str) -> bool:
        """A person (a user principal, a local user, or someone the policy does not list: an
        OS user outside local_users, an unmapped chat user), not the agent, the loop or a
        channel. An unlisted person's jobs are still theirs, and others' are not theirs."""
        p = self.resolve(principal)[1]
        return p.kind == "user" if p is not None else principal not in NOBODY

    def others_jobs(self, principal: str, owners: list[str]) -> bool:
        """Whether a person's call touches a job another person owns (`claims.others_jobs` in
        conditions). Jobs the agent or the loop own are nobody's; the agent's and the loop's own
        calls are judged by their roles and rules, not by this."""
        if not self.is_person(principal):
            return False
        me = self.canonical(principal)
        return any(
            o not in NOBODY and self.is_person(o) and self.canonical(o) != me for o in owners
        )

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

    def evaluate(
        self,
        principal: str,
        skill: Skill,
        args: dict[str, Any] | BaseModel,
        claims: Claims | None = None,
    ) -> Verdict:
        """The verdict for one call; `claims` (from the input model) are what limits judge."""
        if isinstance(args, BaseModel):
            args = args.model_dump(mode="json")
        claims = claims if claims is not None else Claims()
        claims_data = claims.model_dump(mode="json")
        claims_data["others_jobs"] = self.others_jobs(principal, claims.job_owners)
        cap = skill.capability
        roles = self.roles_of(principal)

        allowed_by: str | None = None
        approval_by: tuple[str, int, float | None] | None = None
        for name in roles:
            role = self.policy.roles[name]
            covered = any(fnmatchcase(skill.name, g) for g in role.skills) and not any(
                fnmatchcase(skill.name, g) for g in role.deny_skills
            )
            if covered and cap in role.capabilities:
                allowed_by = name
                break
            if covered and cap in role.with_approval and approval_by is None:
                approval_by = (name, role.approval_quorum, role.approval_expires_min)
        if allowed_by is None and approval_by is None:
            return Verdict(
                decision="deny",
                rule="grants",
                reasons=[
                    (
                        f"principal '{principal}' (roles: {', '.join(roles)}) may not use {cap} skills "
                        f"such as '{skill.name}': grant '{cap}' to one of its roles in the policy file, "
                        "or ask someone who holds it"
                    )
                ],
            )

        for deny in self.policy.denials:
            if self._denies(deny, principal, roles, skill, args, claims_data):
                return Verdict(
                    decision="deny",
                    rule=deny.id,
                    reasons=[deny.reason or f"denied by rule {deny.id}"],
                )

        if cap != "read":
            violations = check_limits(self.policy.limits, claims)
            if violations:
                return Verdict(
                    decision="deny",
                    rule=violations[0][0],
                    reasons=[reason for _, reason in violations],
                )

        # Approval: every matching rule, then a role that allows only with approval. The largest
        # quorum decides; on a tie the first (a named rule before a role's default).
        candidates: list[tuple[str, int, float | None, str, bool, list[str]]] = []
        waived, waiver = self._waived(principal, skill, args, claims_data)
        lifted: list[str] = []  # the approval rules that matched and the waiver lifts
        for rule in self.policy.approvals:
            if not rule.matches(skill.name, cap, args, claims_data):
                continue
            if rule.id in waived:
                lifted.append(rule.id)
                continue
            why = f"approval rule {rule.id} matches ({cap} skill '{skill.name}'"
            why += f"; {' and '.join(rule.when)})" if rule.when else ")"
            who = self._approvers(rule.approvers, claims.job_owners)
            candidates.append((rule.id, rule.quorum, rule.expires_min, why, rule.from_others, who))
        if allowed_by is None and approval_by is not None:
            name, quorum, expires = approval_by
            candidates.append(
                (
                    f"roles.{name}.with_approval",
                    quorum,
                    expires,
                    f"role {name} may use {cap} skills only with approval",
                    True,
                    [],
                )
            )
        if candidates:
            decider = max(candidates, key=lambda c: c[1])
            entry = self.resolve(principal)[1]
            machine = entry is not None and entry.kind in ("agent", "system")
            return Verdict(
                decision="needs_approval",
                rule=decider[0],
                reasons=[c[3] for c in candidates],
                quorum=decider[1],
                expires_min=decider[2],
                from_others=machine or any(c[4] for c in candidates),
                approvers=decider[5],
            )
        if waiver is not None and lifted:
            return Verdict(
                decision="allow",
                rule=waiver.id,
                reasons=[
                    f"role {allowed_by} allows {cap} skills such as '{skill.name}'",
                    f"waiver {waiver.id} spares {principal} approval rule(s) {', '.join(lifted)}"
                    + (f": {waiver.reason}" if waiver.reason else ""),
                ],
            )
        return Verdict(
            decision="allow",
            rule=f"roles.{allowed_by}",
            reasons=[f"role {allowed_by} allows {cap} skills such as '{skill.name}'"],
        )

    def _waived(
        self, principal: str, skill: Skill, args: dict[str, Any], claims: dict[str, Any]
    ) -> tuple[set[str], WaiverRule | None]:
        """The approval rules the first matching waiver lifts for this principal's call (none
        for a person: waivers name only agent and system principals), and that waiver."""
        entry = self.resolve(principal)[1]
        if entry is None or entry.kind not in ("agent", "system"):
            return set(), None
        name = self.canonical(principal)
        for waiver in self.policy.waivers:
            if name in waiver.principals and waiver.matches(
                skill.name, skill.capability, args, claims
            ):
                return set(waiver.waives), waiver
        return set(), None


# Limits -----------------------------------------------------------------------------------------


def check_limits(limits: Limits, claims: Claims) -> list[tuple[str, str]]:
    """Every limit the claims break: (rule id, reason naming what asks, the limit and the fix)."""
    out: list[tuple[str, str]] = []
    roots = limits.mount_roots()
    for launch in claims.launches:
        where = launch.where or "the call"
        if limits.max_gpus_per_job is not None and launch.gpus > limits.max_gpus_per_job:
            out.append(
                (
                    "limits.max_gpus_per_job",
                    f"{where} asks for {launch.gpus} GPUs; limits.max_gpus_per_job is "
                    f"{limits.max_gpus_per_job}: ask for {limits.max_gpus_per_job} or fewer, "
                    "or raise the limit in the policy file",
                )
            )
        image = launch.image
        if (
            limits.allowed_images is not None
            and image
            and not image_allowed(image, limits.allowed_images)
        ):
            out.append(
                (
                    "limits.allowed_images",
                    f"{where}: image '{image}' matches none of limits.allowed_images "
                    f"({', '.join(limits.allowed_images) or 'empty'}): use an allowed image, "
                    "or add a pattern for it to the policy file",
                )
            )
        shown = ", ".join(map(str, roots or [])) or "empty"
        for source in launch.mounts if roots is not None else []:
            path = expand_path(source)
            if not under_roots(path, roots or []):
                out.append(
                    (
                        "limits.allowed_mount_roots",
                        f"{where} mounts '{source}' ({path}), outside "
                        f"limits.allowed_mount_roots ({shown})"
                        ": mount a folder under one of them, or add its root to the policy file",
                    )
                )
        for host in launch.paths if roots is not None else []:
            # The run uses the path as written (no ~ or $VAR), so only symlinks are resolved.
            path = Path(os.path.realpath(host.path))
            if not under_roots(path, roots or []):
                out.append(
                    (
                        "limits.allowed_mount_roots",
                        f"{where}: {host.field} '{host.path}' ({path}) lies outside "
                        f"limits.allowed_mount_roots ({shown}): use a folder under one of "
                        "them, or add its root to the policy file",
                    )
                )
        minutes = launch.runtime_min
        if (
            limits.max_runtime_min is not None
            and minutes is not None
            and minutes > limits.max_runtime_min
        ):
            out.append(
                (
                    "limits.max_runtime_min",
                    f"{where}: timeout_min is {minutes:g} min; limits.max_runtime_min is "
                    f"{limits.max_runtime_min:g}: shorten it (checkpoint and resume), or raise "
                    "the limit in the policy file",
                )
            )
    return out


def under_roots(path: Path, roots: list[Path]) -> bool:
    """Whether a resolved path is one of the roots or lies under one."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def image_allowed(image: str, patterns: list[str]) -> bool:
    """Glob match; `docker.io/` and `docker.io/library/` are optional, a digest counts as a tag."""
    names = {image}
    short = image.removeprefix("docker.io/")
    names |= {short, short.removeprefix("library/")}
    names |= {n.replace("@", ":", 1) for n in list(names)}
    return any(fnmatchcase(n, p) for n in names for p in patterns)
