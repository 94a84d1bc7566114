"""apply_policy: make a policy file the one the gate judges by, in every process on this store.

The call names the file (hashed when the gate reads it, so an approval covers that content) and
carries what the policy would change on the recorded calls (policies/policy_check.py), so the
approvers see it among the arguments. When it runs, that summary is computed again: a call whose
summary is not what the history gives, or whose policy would also change calls recorded since it
was asked for, is refused and applies nothing. Its only effect is two keyvalue rows (the text and
its sha256), which policies/policy_source.py follows.

Checking a policy text is the policy layer's work, which a skill may not import: that layer lends
its reviewer (`lend_review`) where the policy is wired (agent/brain/wiring.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr, field_validator

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store.db import KeyValue, Store
from nightshift.runtime.yamlfile import read_text
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

# The keyvalue rows of the applied policy; both are written in one transaction.
ACTIVE_YAML = "policy.active_yaml"
ACTIVE_SHA256 = "policy.active_sha256"


class ApplyCheck(BaseModel):
    """What the reviewer is asked: this policy text, on the calls recorded since `since`."""

    text: str
    path: str = Field(description="Where the text came from, for error messages")
    since: datetime | None = None
    through_event: int = Field(description="The summary covers audit events up to this id")
    call_id: str | None = Field(None, description="This call: its own events are not replayed")


class ApplyReview(BaseModel):
    """The reviewer's answer. Raises BadArguments (naming the field) for an invalid policy."""

    summary: str = Field(description="The replay summary of the events up to through_event")
    later_calls: int = Field(description="Calls recorded after through_event, replayed too")
    later_changes: list[str] = Field(
        default_factory=list, description="Those of them whose outcome the policy would change"
    )


Review = Callable[[Store, ApplyCheck], ApplyReview]
_review: Review | None = None


def lend_review(review: Review) -> None:
    """The policy layer's reviewer (policies/policy_check.py `review`)."""
    global _review
    _review = review


class ApplyPolicyInput(SkillInput):
    policy_path: str = Field(max_length=4096, description="The new policy file (YAML)")
    since: datetime | None = Field(
        None, description="The summary replays calls recorded since then (UTC); None: all"
    )
    through_event: int = Field(
        ge=0, description="The newest audit event the summary covers (`nightshift policy apply`)"
    )
    summary: str = Field(
        max_length=2000,
        description="What the policy would change on the recorded calls, as "
        "`nightshift policy check` computes it; checked again when the call runs",
    )

    # The file as read once: what the approval covers is what is stored.
    _loaded: tuple[str, str, str] | None = PrivateAttr(None)

    @field_validator("policy_path")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("policy_path contains a NUL byte")
        return v

    def loaded(self) -> tuple[str, str, str]:
        """(resolved path, text, sha256), read once per call."""
        if self._loaded is None:
            path = str(Path(self.policy_path).expanduser().resolve())
            text = read_text(path)
            self._loaded = (path, text, hashlib.sha256(text.encode()).hexdigest())
        return self._loaded

    def files(self) -> dict[str, str]:
        path, _, digest = self.loaded()
        return {path: digest}

    def claims(self) -> Claims:
        return Claims()  # it starts, changes and ends no job


class ApplyPolicyResult(BaseModel):
    path: str
    sha256: str = Field(description="sha256 of the policy text now in force")
    previous_sha256: str | None = Field(
        description="The applied policy it replaced; None: the policy file of the config"
    )
    summary: str
    later_calls: int = Field(description="Calls recorded after the summary; none would change")


@skill("apply_policy", capability="destroy", store_only=True)
def apply_policy(ctx: SkillContext, inp: ApplyPolicyInput) -> ApplyPolicyResult:
    """Make a new policy file the one every gated call is judged by (the daemon's too, at its
    next call), replacing the current one. Use `nightshift policy check FILE` first and pass
    its summary; the call is refused when the recorded calls no longer give that summary."""
    if _review is None:
        raise SkillFailed(
            "apply_policy: no policy reviewer in this process (the policy layer lends it where "
            "the policy is wired); call it through `nightshift policy apply FILE`"
        )
    path, text, digest = inp.loaded()
    got = _review(
        ctx.store,
        ApplyCheck(
            text=text,
            path=path,
            since=inp.since,
            through_event=inp.through_event,
            call_id=ctx.call_id,
        ),
    )
    again = f"nothing was applied: run `nightshift policy apply {path}` again"
    if got.summary != inp.summary:
        raise SkillFailed(
            f"apply_policy: the approvers saw {inp.summary!r}, but the recorded calls now give "
            f"{got.summary!r}; {again}"
        )
    if got.later_changes:
        shown = "; ".join(got.later_changes[:3]) + ("; …" if len(got.later_changes) > 3 else "")
        raise SkillFailed(
            f"apply_policy: {len(got.later_changes)} call(s) recorded since the request would "
            f"also change under this policy, which the approvers did not see ({shown}); {again}"
        )
    with ctx.store.session() as s:
        before = s.get(KeyValue, ACTIVE_SHA256)
        previous = before.value if before is not None else None
        s.merge(KeyValue(key=ACTIVE_YAML, value=text))
        s.merge(KeyValue(key=ACTIVE_SHA256, value=digest))
    return ApplyPolicyResult(
        path=path,
        sha256=digest,
        previous_sha256=previous,
        summary=inp.summary,
        later_calls=got.later_calls,
    )
