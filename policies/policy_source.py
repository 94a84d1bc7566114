"""Where the policy in force comes from: the text `apply_policy` stored in the store, else the
policy file of the config.

`LivePolicyEngine` is a PolicyEngine that looks at the stored sha256 before every verdict (one
keyvalue read), so a running daemon judges by an applied policy from its next call on, without
a restart; each switch is audited (`policy.loaded`). A stored text that does not validate, or
does not match its sha256, stops every verdict (an error naming the fix) rather than let a
weaker policy judge.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from sqlmodel import col, select

from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.model import Policy
from nightshift.runtime.errors import ConfigError, SpecError
from nightshift.runtime.store.db import KeyValue, Store
from nightshift.runtime.yamlfile import line_of, parse_yaml, validate
from nightshift.skills.apply_policy import ACTIVE_SHA256, ACTIVE_YAML
from nightshift.skills.base import Claims, Skill

STORED = f"<stored policy: keyvalue {ACTIVE_YAML}>"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def policy_from_text(text: str, where: str) -> Policy:
    """A policy from its YAML text, checked as `load_policy` checks a file: SpecError (a
    BadArguments) naming the field and the line, cross-references included."""
    data, node = parse_yaml(text, where)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", path=where, line=1)
    policy = validate(Policy, data, path=where, node=node)
    for loc, msg in policy.problems():
        raise SpecError(
            msg, path=where, field=".".join(str(p) for p in loc), line=line_of(node, loc)
        )
    return policy


def stored_policy(store: Store) -> tuple[Policy, str] | None:
    """The applied policy and its sha256, or None when none is stored. ConfigError when the
    stored rows are damaged or no longer validate: nothing should be judged by a guess."""
    with store.session() as s:
        rows = s.exec(select(KeyValue).where(col(KeyValue.key).in_((ACTIVE_YAML, ACTIVE_SHA256))))
        found = {row.key: row.value for row in rows}
    sha = found.get(ACTIVE_SHA256)
    if sha is None:
        return None
    text = found.get(ACTIVE_YAML)
    fix = (
        f"until it is fixed no call is judged; delete the keyvalue rows {ACTIVE_YAML} and "
        f"{ACTIVE_SHA256} from the store to judge by policy.file again, then apply the policy "
        "again with `nightshift policy apply FILE`"
    )
    if text is None or text_sha256(text) != sha:
        raise ConfigError(
            f"the stored policy (keyvalue {ACTIVE_YAML}) does not match its sha256 "
            f"(keyvalue {ACTIVE_SHA256}): it was changed outside apply_policy: {fix}"
        )
    try:
        return policy_from_text(text, STORED), sha
    except SpecError as exc:
        raise ConfigError(f"{exc}; this version cannot use the stored policy: {fix}") from None


class LivePolicyEngine(PolicyEngine):
    """Judges by the stored policy when there is one, else by `fallback` (the file's), and
    follows a change of the stored one at the next verdict. Only `evaluate` looks: the other
    questions (roles, who may approve) are answered by the policy of the latest verdict, since
    they are asked inside the approvals' write transactions, where a look could not audit."""

    def __init__(
        self,
        fallback: Policy,
        store: Callable[[], Store],
        audit: Callable[[], AuditLog],
        *,
        look_now: bool = True,
    ):
        self._fallback = fallback
        self._store, self._audit = store, audit
        self._lock = threading.Lock()
        stored = stored_policy(store()) if look_now else None
        first = stored[0] if stored is not None else fallback
        super().__init__(first)
        self.sha256: str | None = stored[1] if stored is not None else None
        # The engine of the policy in force: a verdict runs on one, whatever a switch does.
        self._engine = PolicyEngine(first)

    def refresh(self) -> None:
        """Switch to the stored policy if it changed (or to the file's if it was removed), and
        audit the switch; one keyvalue read when nothing changed."""
        if self._store().get_kv(ACTIVE_SHA256) == self.sha256:
            return
        with self._lock:
            stored = stored_policy(self._store())
            sha = stored[1] if stored is not None else None
            if sha == self.sha256:
                return  # another thread switched meanwhile
            self._audit().append(
                "system",
                "policy.loaded",
                payload={
                    "sha256": sha,
                    "previous_sha256": self.sha256,
                    "source": "store" if stored is not None else "file",
                },
            )
            self._engine = PolicyEngine(stored[0] if stored is not None else self._fallback)
            self.policy, self.sha256 = self._engine.policy, sha

    def evaluate(
        self,
        principal: str,
        skill: Skill[Any, Any],
        args: dict[str, Any] | BaseModel,
        claims: Claims | None = None,
    ) -> Verdict:
        self.refresh()
        return self._engine.evaluate(principal, skill, args, claims)
