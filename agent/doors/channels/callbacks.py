"""Clicks coming back: the daemon's HTTP endpoint for Slack's interactivity requests and WeChat
Work's callbacks, and the desk that turns a verified click into a vote.

The channel modules verify (signature, timestamp window, decryption) before anything is parsed
and hand over a `Decision`; the desk then refuses a replay (a signature or event id seen before,
kept in `channel_receipt`), and votes as `<channel>:<user id>`, which the policy maps to a
principal: an unknown user's click is refused by `Approvals.vote` (no role that may approve),
one person counts once across channels (votes count canonical names), a vote after expiry or on
a decided approval changes nothing. Every refusal is audited (`channel.refused`, or Approvals'
`approval.vote_refused` / `approval.vote` with its reason); those that come over HTTP, forged or
replayed or past the rate, are so only for the first `channels.refusals_in_full_per_minute` of
each remote address's minute, the rest counted into one `channel.refused_aggregate` event for
that minute (policies/refusal_tally.py), so a flood of forgeries cannot fill the disk.

The routes are served by the daemon's one HTTP application (agent/doors/web/server.py:
Starlette under uvicorn): a bounded body read within a deadline, no tracebacks to the client or
the terminal, a cap on each remote address's open connections (503 past it) and a token bucket
on its requests (429 with Retry-After past it). Behind a reverse proxy every request comes from
the proxy's address: the limits are then the endpoint's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError

from nightshift.agent.doors.channels.base import BadCallback, Decision
from nightshift.agent.doors.channels.outbox import Outbox
from nightshift.agent.doors.web.server import Route, WebServer
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.refusal_tally import RefusalLog
from nightshift.runtime.errors import PolicyDenied, UnknownApproval
from nightshift.runtime.store.db import Approval, ChannelReceipt, Store


class Refused(Exception):
    """A click that is not counted; the message says why (for the audit and the clicker)."""


class Desk:
    def __init__(
        self,
        store: Store,
        audit: AuditLog,
        approvals: Approvals,
        outbox: Outbox | None,
        clock: Callable[[], datetime],
        *,
        in_full_per_minute: int = 10,
    ):
        self.store, self.audit, self.approvals = store, audit, approvals
        self.outbox, self.clock = outbox, clock
        self.refusals = RefusalLog(
            audit,
            clock,
            action="channel.refused",
            aggregate="channel.refused_aggregate",
            in_full=in_full_per_minute,
        )

    def decide(self, d: Decision, *, source: str | None = None) -> Approval:
        """Count a verified click once, or raise Refused (audited; tallied by `source`, the
        remote address, when it came over HTTP)."""
        now = self.clock()
        try:
            with self.store.session() as s:
                for key in d.replay_keys:
                    s.add(ChannelReceipt(key=key, channel=d.channel, received_at=now))
        except IntegrityError:
            raise self.refuse(
                d.channel,
                "replayed request: its signature or event id was seen before",
                user=d.user,
                approval_id=d.approval_id,
                source=source,
                kind="replayed",
            ) from None
        try:
            row = self.approvals.vote(d.approval_id, d.principal, d.approve, now)
        except PolicyDenied as exc:  # audited by Approvals as approval.vote_refused
            raise Refused(str(exc)) from None
        except UnknownApproval as exc:
            raise self.refuse(
                d.channel,
                str(exc),
                user=d.user,
                approval_id=d.approval_id,
                source=source,
                kind="unknown_approval",
            ) from None
        if self.outbox is not None:
            self.outbox.touched(d.approval_id, d.posted)
        return row

    def refuse(
        self,
        channel: str,
        reason: str,
        *,
        user: str | None = None,
        approval_id: int | None = None,
        peer: str | None = None,
        source: str | None = None,
        kind: str = "bad_callback",
    ) -> Refused:
        """Audit a refusal: in full, or through the tally when it came from `source` (a remote
        address), where `kind` names it in the minute's aggregate as `<channel>.<kind>`."""
        actor = f"{channel}:{user}" if user else "system"
        payload: dict[str, Any] = {
            "channel": channel,
            "reason": reason,
            "user": user,
            "approval_id": approval_id,
            "peer": peer,
        }
        if source is None:
            self.audit.append(actor, "channel.refused", payload=payload)
        else:
            self.refusals.refused(
                source,
                f"{channel}.{kind}",
                reason,
                actor=actor,
                payload={**payload, "source": source},
                about={"peer": source},
                aggregate_actor="system",
            )
        return Refused(reason)


# The endpoint that serves the routes is the daemon's one HTTP application (agent/doors/web).
CallbackServer = WebServer


def _route(channel: str, desk: Desk, verify: Callable[..., Decision | str]) -> Route:
    """A callback: `verify(method, query, headers, body)` checks it (BadCallback: refused and
    audited, the HTTP answer says only that) and gives a Decision to count, or the text a URL
    check must echo. A verified click gets an empty 200 whether or not it counted (the audit says
    why): the channels retry anything else."""

    def route(
        method: str, query: dict[str, str], headers: dict[str, str], body: bytes, address: str
    ) -> tuple[int, str]:
        try:
            verified = verify(method, query, headers, body)
        except BadCallback as exc:
            desk.refuse(channel, str(exc), peer=headers.get("x-forwarded-for"), source=address)
            return exc.status, "refused"
        if isinstance(verified, str):
            return 200, verified
        try:
            desk.decide(verified, source=address)
        except Refused:
            pass
        return 200, ""

    return route


def slack_route(interactivity: Any, desk: Desk) -> Route:
    """Slack's interactivity requests (POST), verified by SlackInteractivity.decide."""

    def verify(method: str, query: dict[str, str], headers: dict[str, str], body: bytes):
        if method != "POST":
            raise BadCallback("only POST carries a click", status=405)
        return interactivity.decide(headers, body)

    return _route("slack", desk, verify)


def wechat_route(callback: Any, desk: Desk) -> Route:
    """WeChat Work's callback: GET verifies the URL (the decrypted echostr is echoed), POST
    carries an encrypted event."""

    def verify(method: str, query: dict[str, str], headers: dict[str, str], body: bytes):
        return callback.verify_url(query) if method == "GET" else callback.decide(query, body)

    return _route("wechat", desk, verify)
