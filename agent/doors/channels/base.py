"""One interface for every channel: what is sent (a card, a notice), what comes back (a
decision), and the one error a channel raises when it cannot be reached.

Channels do not touch the store: the outbox (agent/doors/channels/outbox.py) decides what to send and
when, retries with backoff, and keeps each message's reference for later updates; the callback
server (agent/doors/channels/callbacks.py) turns a verified `Decision` into a vote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

ChannelName = Literal["slack", "wechat"]
ApprovalState = Literal[
    "pending", "approved", "rejected", "expired", "executing", "executed", "failed"
]


@dataclass(frozen=True)
class Vote:
    principal: str  # the canonical name the vote counted for ("alice")
    approve: bool
    via: str  # "slack:U024BE7LH", "wechat:alice.w", "alice" (CLI), ...


@dataclass(frozen=True)
class ApprovalCard:
    """Everything a person needs to decide, as the card shows it. `version` changes whenever
    anything shown changes, so an update is sent only when there is something new."""

    approval_id: int
    skill: str
    args: dict[str, Any]
    requester: str
    rule: str
    quorum: int
    votes: tuple[Vote, ...]
    state: ApprovalState
    expires_at: datetime | None  # UTC, naive
    evidence: tuple[str, ...] = ()  # short lines: the job, its state, why it is asked

    @property
    def approvals(self) -> int:
        return len({v.principal for v in self.votes if v.approve})

    @property
    def decided(self) -> bool:
        return self.state != "pending"

    @property
    def version(self) -> str:
        return f"{self.state}:{len(self.votes)}"


NoticeKind = Literal[
    "job_failed", "job_recovered", "job_finished", "job_early_stopped", "report", "idle_gpu"
]


@dataclass(frozen=True)
class Notice:
    """A notification: one per job event (`key` is unique per event), or the morning report."""

    key: str  # "event:123", "report:2026-12-04"
    kind: NoticeKind
    title: str  # one line: "job 7 mlp-long failed (attempt 2, OOM)"
    lines: tuple[str, ...] = ()  # the diagnosis, the next step, figures
    job_id: int | None = None


@dataclass(frozen=True)
class Posted:
    """Where a card went, so it can be updated: Slack's channel id and message ts; WeChat
    Work's response_code of the template card (and the task id that ties clicks to it)."""

    channel: ChannelName
    ref: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """A verified click: the channel checked the signature, the timestamp window and the
    payload's shape before building one. `replay_keys` are what must never be seen twice (the
    request's signature, the channel's event id); `user` is the channel's own user id, which the
    policy maps to a principal as `<channel>:<user>`."""

    channel: ChannelName
    user: str
    approval_id: int
    approve: bool
    replay_keys: tuple[str, ...]
    posted: Posted | None = None  # the card that was clicked, when the payload names it

    @property
    def principal(self) -> str:
        return f"{self.channel}:{self.user}"


class ChannelDown(Exception):
    """The channel could not be reached or refused the message (HTTP error, an API error such
    as `ratelimited` or errcode -1, a timeout). The outbox keeps the message and retries;
    `retry_after_s` is the server's hint (Slack's Retry-After) when it gave one."""

    def __init__(self, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadCallback(Exception):
    """A callback that is not a decision: forged or missing signature, stale timestamp, a body
    that does not parse, an action this server never posted. The message says which, for the
    audit; the HTTP answer says only that it was refused."""

    def __init__(self, reason: str, *, status: int = 401):
        super().__init__(reason)
        self.status = status


class Channel(Protocol):
    """What the outbox drives. Every method raises ChannelDown when the channel cannot be
    reached; none blocks longer than its HTTP timeout."""

    name: ChannelName

    def post_approval(self, card: ApprovalCard) -> Posted:
        """Send a new card with Approve / Reject (while pending)."""
        ...

    def update_approval(self, posted: Posted, card: ApprovalCard) -> bool:
        """Show the card's new state (votes so far, or the outcome without buttons). False when
        this card cannot be updated again (WeChat Work's response code is spent): the outbox then
        stops showing it later states."""
        ...

    def notify(self, notice: Notice) -> None:
        """Post a notification."""
        ...

    def probe(self) -> str:
        """Check the credentials without posting anything (`nightshift doctor`): one line on
        who the app is, or ChannelDown."""
        ...
