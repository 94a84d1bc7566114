"""Slack: approval cards and notices through the Web API; clicks come back either to the
interactivity endpoint (a signed HTTP POST, `SlackInteractivity`) or over Socket Mode (an
authenticated WebSocket the daemon opens, `SlackSocketMode`), and both become the same
`Decision` through one payload parser.

Everything a user typed (a job name, arguments, evidence) is escaped before it reaches mrkdwn
and every mrkdwn object is `verbatim`, so nothing in a card can ping a channel or a person;
every text is cut to Block Kit's limits, so a long argument cannot make Slack refuse a card.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from http.client import HTTPException
from typing import Any, TypeGuard

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.client import BaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from .base import (
    ApprovalCard,
    BadCallback,
    ChannelDown,
    ChannelName,
    Decision,
    Notice,
    Posted,
)

log = logging.getLogger(__name__)

APPROVE_ACTION = "nightshift_approve"
REJECT_ACTION = "nightshift_reject"
BLOCK_PREFIX = "nightshift_approval_"
MAX_BODY = 64 * 1024  # an interactivity payload for one click is a few KiB

# Block Kit's limits (characters), with a margin where Slack may count UTF-16 units.
SECTION_MAX = 2_900  # section text: 3,000
HEADER_MAX = 150  # header plain_text
BUTTON_MAX = 75
MAX_BLOCKS = 50
ARGS_MAX = 2_500  # the arguments' code block, escaped
FALLBACK_MAX = 300  # the notification text under the blocks
VALUE_MAX = 200  # one user value inside a sentence (skill, requester, rule, a name)

_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_SLACK_ID = re.compile(r"[A-Za-z0-9._-]{1,128}", re.ASCII)  # user, channel, ts, trigger ids
_OUTCOMES = {
    "approved": ":white_check_mark: *Approved*",
    "rejected": ":x: *Rejected*",
    "expired": ":hourglass: *Expired*",
    "executing": ":gear: *Executing*",
    "executed": ":white_check_mark: *Executed*",
    "failed": ":warning: *Failed*",
}
# No previews of links in a job's name, no @-names turned into mentions in the fallback text.
_POST_OPTIONS: dict[str, Any] = {
    "unfurl_links": False,
    "unfurl_media": False,
    "link_names": False,
    "parse": "none",
}
_NOTICE_ICONS = {
    "job_failed": ":red_circle:",
    "job_recovered": ":large_green_circle:",
    "job_finished": ":white_check_mark:",
    "job_early_stopped": ":octagonal_sign:",
    "report": ":sunrise:",
}


# --- text -----------------------------------------------------------------------------------


def fit(text: str, limit: int) -> str:
    """`text` with Slack's three control characters as entities (so `<!channel>` shows, and
    pings no one), cut to `limit` characters (ending "…" when cut), never inside an entity."""
    out: list[str] = []
    size = 0
    for ch in text:
        piece = _ESCAPES.get(ch, ch)
        if size + len(piece) > limit:
            while size + 1 > limit:  # room for the ellipsis
                size -= len(out.pop())
            return "".join(out) + "…"
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _cut(text: str, limit: int) -> str:
    """Plain text cut to `limit` (plain_text has no markup, so nothing to escape)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn(text: str) -> dict[str, Any]:
    # verbatim: Slack leaves plain words alone (no automatic @channel, #channel or links).
    return {"type": "mrkdwn", "text": text or " ", "verbatim": True}


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": _cut(text, limit) or " ", "emoji": True}


def _names(names: Iterable[str]) -> str:
    unique = list(dict.fromkeys(names))
    shown = ", ".join(fit(n, 60) for n in unique[:20])
    return shown + (f" and {len(unique) - 20} more" if len(unique) > 20 else "")


# --- cards and notices -------------------------------------------------------------------------


def approval_blocks(card: ApprovalCard) -> list[dict[str, Any]]:
    """The card: what is asked, by whom, under which rule, the arguments, the evidence, and
    Approve / Reject while it is pending (the outcome instead, once decided)."""
    expires = f"{card.expires_at:%Y-%m-%dT%H:%MZ}" if card.expires_at else "never"
    summary = (
        f"*Skill* `{fit(card.skill, VALUE_MAX)}` requested by *{fit(card.requester, VALUE_MAX)}*\n"
        f"*Rule* {fit(card.rule, VALUE_MAX)} · *Quorum* {card.quorum} · "
        f"*Approvals* {card.approvals} of {card.quorum}"
        + (f" ({_names(v.principal for v in card.votes if v.approve)})" if card.approvals else "")
        + f"\n*Expires* {expires} (UTC)"
    )
    try:
        args = json.dumps(card.args, indent=2, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # a circular or oddly keyed value: show it as Python does
        args = repr(card.args)
    args = args.replace("`", "`\u200b")  # a ``` in a value cannot close the code block
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": _plain(f"Approval {card.approval_id}: {card.skill}", HEADER_MAX),
        },
        {"type": "section", "text": _mrkdwn(summary)},
        {"type": "section", "text": _mrkdwn(f"*Arguments*\n```{fit(args, ARGS_MAX)}```")},
    ]
    if card.evidence:
        evidence = _chunks([fit(line, 500) for line in card.evidence], 2_000)
        more = "\n… (more evidence cut)" if len(evidence) > 1 else ""
        blocks.append({"type": "context", "elements": [_mrkdwn(evidence[0] + more)]})
    blocks.append({"type": "section", "text": _mrkdwn(_status(card))})
    if not card.decided:
        blocks.append(_buttons(card))
    return blocks


def _status(card: ApprovalCard) -> str:
    approvers = _names(v.principal for v in card.votes if v.approve)
    rejecters = _names(v.principal for v in card.votes if not v.approve)
    if not card.decided:
        votes = "; ".join(
            [f"{approvers} approved"] * bool(approvers)
            + [f"{rejecters} rejected"] * bool(rejecters)
        )
        missing = max(card.quorum - card.approvals, 0)
        return f"*Pending*: {missing} more approval(s) needed · votes so far: {votes or 'none'}"
    head = _OUTCOMES.get(card.state, f"*{card.state}*")
    if card.state == "rejected":
        return f"{head}: rejected by {rejecters or 'policy'}"
    if card.state == "approved":
        return f"{head}: approved by {approvers or 'policy'}"
    if card.state == "expired":
        return f"{head}: expired with {card.approvals} of {card.quorum} approvals"
    return f"{head}: {card.state}" + (f" (approved by {approvers})" if approvers else "")


def _buttons(card: ApprovalCard) -> dict[str, Any]:
    value = str(card.approval_id)
    confirm = {
        "title": _plain("Approve this action?", 100),
        "text": _plain(f"Approve {card.skill} (approval {card.approval_id})?", 300),
        "confirm": _plain("Approve", 30),
        "deny": _plain("Cancel", 30),
    }
    return {
        "type": "actions",
        "block_id": f"{BLOCK_PREFIX}{card.approval_id}",
        "elements": [
            {
                "type": "button",
                "action_id": APPROVE_ACTION,
                "text": _plain("Approve", BUTTON_MAX),
                "style": "primary",
                "value": value,
                "confirm": confirm,
            },
            {
                "type": "button",
                "action_id": REJECT_ACTION,
                "text": _plain("Reject", BUTTON_MAX),
                "style": "danger",
                "value": value,
            },
        ],
    }


def _approval_text(card: ApprovalCard) -> str:
    return fit(
        f"Approval {card.approval_id}: {card.skill} requested by {card.requester} ({card.state})",
        FALLBACK_MAX,
    )


def notice_blocks(notice: Notice) -> list[dict[str, Any]]:
    """The title as a section, the lines in sections of up to Block Kit's size (a long
    report spans several), the job in a context line."""
    icon = _NOTICE_ICONS.get(notice.kind, ":information_source:")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": _mrkdwn(f"{icon} *{fit(notice.title, 500)}*")}
    ]
    sections = _chunks([fit(line, SECTION_MAX) for line in notice.lines], SECTION_MAX)
    room = MAX_BLOCKS - 3  # the title, a "cut" line, the job
    blocks += [{"type": "section", "text": _mrkdwn(text)} for text in sections[:room]]
    if len(sections) > room:
        blocks.append({"type": "context", "elements": [_mrkdwn("(cut: too long for Slack)")]})
    if notice.job_id is not None:
        blocks.append({"type": "context", "elements": [_mrkdwn(f"job {notice.job_id}")]})
    return blocks


def _chunks(lines: list[str], limit: int) -> list[str]:
    """Lines (each at most `limit` long) joined into as few texts of at most `limit` as
    their order allows."""
    out: list[str] = []
    for line in lines:
        if out and len(out[-1]) + 1 + len(line) <= limit:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


# --- the Web API ---------------------------------------------------------------------------


class SlackChannel:
    """Approval cards and notices on Slack through the Web API (a bot token, `chat:write`).

    Each method is one HTTP call with the SDK's own retries turned off: the outbox retries,
    with backoff, when a method raises ChannelDown, so no call blocks longer than `timeout_s`.
    """

    name: ChannelName = "slack"

    def __init__(
        self,
        bot_token: str,
        *,
        approvals_channel: str,
        notify_channel: str | None = None,
        base_url: str = "https://slack.com/api/",
        timeout_s: float = 10.0,
    ) -> None:
        if not bot_token.strip():
            raise ValueError("the Slack bot token is empty")
        self.approvals_channel = approvals_channel
        self.notify_channel = notify_channel or approvals_channel
        self._token = bot_token.strip()  # only to take it out of error text; never shown
        self._client = WebClient(
            token=self._token,
            base_url=base_url,
            timeout=timeout_s,  # type: ignore[arg-type]  # urllib takes a float; the hint says int
            retry_handlers=[],
        )

    def __repr__(self) -> str:
        return (
            f"SlackChannel(approvals_channel={self.approvals_channel!r}, "
            f"notify_channel={self.notify_channel!r})"
        )

    def post_approval(self, card: ApprovalCard) -> Posted:
        resp = self._call(
            "chat.postMessage",
            self._client.chat_postMessage,
            channel=self.approvals_channel,
            text=_approval_text(card),
            blocks=approval_blocks(card),
            **_POST_OPTIONS,
        )
        channel, ts = resp.get("channel"), resp.get("ts")
        if not isinstance(channel, str) or not isinstance(ts, str):
            raise ChannelDown("slack chat.postMessage answered without a channel and ts")
        return Posted("slack", {"channel": channel, "ts": ts})

    def update_approval(self, posted: Posted, card: ApprovalCard) -> bool:
        channel, ts = posted.ref.get("channel"), posted.ref.get("ts")
        if posted.channel != "slack" or not channel or not ts:
            raise ValueError(f"not a Slack message: {posted!r}")
        self._call(
            "chat.update",
            self._client.chat_update,
            channel=channel,
            ts=ts,
            text=_approval_text(card),
            blocks=approval_blocks(card),
            link_names=False,
            parse="none",
        )
        return True  # a message can be updated as often as needed

    def notify(self, notice: Notice) -> None:
        self._call(
            "chat.postMessage",
            self._client.chat_postMessage,
            channel=self.notify_channel,
            text=fit(notice.title, FALLBACK_MAX),
            blocks=notice_blocks(notice),
            **_POST_OPTIONS,
        )

    def probe(self) -> str:
        """auth.test: the workspace and the bot the token belongs to."""
        r = self._call("auth.test", self._client.auth_test)
        return f"bot {r.get('user')} in workspace {r.get('team')}"

    def _call(self, method: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One Web API call; every failure becomes ChannelDown naming the method and Slack's
        error code. The SDK's own exception is dropped (`from None`): it holds the request,
        Authorization header included."""
        try:
            return fn(**kwargs)
        except SlackApiError as e:
            status, code, retry_after = _api_error(e)
            message = f"slack {method} failed: HTTP {status}, error {code}"
        except (SlackClientError, OSError, HTTPException, ValueError) as e:
            message, retry_after = f"slack {method} failed: {type(e).__name__}: {e}", None
        raise ChannelDown(self._redact(message)[:500], retry_after_s=retry_after) from None

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "[token]")


def _api_error(e: SlackApiError) -> tuple[int, str, float | None]:
    """HTTP status, Slack's error code (or what stands for it) and a 429's Retry-After."""
    resp = e.response
    status = int(getattr(resp, "status_code", 0) or 0)
    data = getattr(resp, "data", None)
    code = data.get("error") if isinstance(data, dict) else None
    if not isinstance(code, str) or not re.fullmatch(r"[a-z0-9_.]{1,64}", code):
        code = "unexpected_response"  # e.g. an HTML page from a proxy: not worth repeating
    retry_after = None
    headers = getattr(resp, "headers", None) or {}
    for key, value in dict(headers).items():
        if str(key).lower() == "retry-after":
            raw = value[0] if isinstance(value, list) and value else value
            try:
                retry_after = max(float(raw), 0.0)
            except (TypeError, ValueError):
                pass
    if status == 429 and retry_after is None:
        retry_after = 1.0
    return status, code, retry_after


# --- clicks ---------------------------------------------------------------------------------


def decision_from_payload(payload: Any, *, replay_key: str) -> Decision:
    """A `block_actions` payload (already authenticated) as a Decision, or BadCallback (400)
    saying what is wrong with it. Shared by the HTTP endpoint and Socket Mode; `replay_key`
    names the request (its signature, or its envelope), the click's trigger id is the other."""

    def bad(reason: str) -> BadCallback:
        return BadCallback(reason, status=400)

    if not isinstance(payload, dict):
        raise bad("payload is not a JSON object")
    if payload.get("type") != "block_actions":
        raise bad("payload type is not block_actions")
    actions = payload.get("actions")
    if not isinstance(actions, list) or not actions:
        raise bad("payload has no action")
    if len(actions) != 1 or not isinstance(actions[0], dict):
        raise bad("payload does not have exactly one action")
    action = actions[0]
    action_id = action.get("action_id")
    if action_id not in (APPROVE_ACTION, REJECT_ACTION):
        raise bad("action_id is not one of nightshift's")
    value = action.get("value")
    if not isinstance(value, str) or not re.fullmatch(r"[1-9][0-9]{0,17}", value, re.ASCII):
        raise bad("action value is not a positive integer")
    approval_id = int(value)
    block_id = action.get("block_id")
    if block_id is not None and block_id != f"{BLOCK_PREFIX}{approval_id}":
        raise bad("action block_id does not match its value")
    user = payload.get("user")
    user_id = user.get("id") if isinstance(user, dict) else None
    if not isinstance(user_id, str) or not user_id:
        raise bad("missing user id")
    if not _is_id(user_id):
        raise bad("user id is not a Slack id")
    trigger = payload.get("trigger_id") or action.get("action_ts")
    keys = (replay_key,) + ((f"slack-trigger:{trigger}",) if _is_id(trigger) else ())
    container = payload.get("container")
    posted = None
    if isinstance(container, dict):
        channel, ts = container.get("channel_id"), container.get("message_ts")
        if _is_id(channel) and _is_id(ts):
            posted = Posted("slack", {"channel": channel, "ts": ts})
    return Decision(
        channel="slack",
        user=user_id,
        approval_id=approval_id,
        approve=action_id == APPROVE_ACTION,
        replay_keys=keys,
        posted=posted,
    )


def _is_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _SLACK_ID.fullmatch(value) is not None


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class SlackInteractivity:
    """The interactivity endpoint's check: a click is a Decision only when its v0 signature
    (the signing secret over the timestamp and the raw body) verifies and its timestamp is
    within `window_s` of now; nothing of the body is parsed before that."""

    def __init__(
        self,
        signing_secret: str,
        *,
        clock: Callable[[], float] = time.time,
        window_s: float = 300,
    ) -> None:
        if not 0 < window_s <= 300:  # the SDK's verifier holds to 5 minutes whatever we say
            raise ValueError("window_s must be in (0, 300]")
        self._clock = clock
        self._window_s = window_s
        self._verifier = SignatureVerifier(signing_secret, clock=_Clock(clock))

    def __repr__(self) -> str:
        return f"SlackInteractivity(window_s={self._window_s})"

    def decide(self, headers: Mapping[str, str], body: bytes) -> Decision:
        if len(body) > MAX_BODY:
            raise BadCallback("body too large", status=413)
        lower = {str(k).lower(): v for k, v in headers.items()}
        signature = lower.get("x-slack-signature")
        timestamp = lower.get("x-slack-request-timestamp")
        if not (
            isinstance(signature, str) and signature and isinstance(timestamp, str) and timestamp
        ):
            raise BadCallback("missing X-Slack-Signature or X-Slack-Request-Timestamp header")
        if not re.fullmatch(r"[0-9]{1,12}", timestamp, re.ASCII):
            raise BadCallback("non-numeric timestamp")
        if abs(self._clock() - int(timestamp)) > self._window_s:
            raise BadCallback("stale timestamp")
        if not re.fullmatch(r"v0=[0-9a-f]{64}", signature, re.ASCII):
            raise BadCallback("signature mismatch (not a v0 signature)")
        try:
            body.decode("utf-8")  # the SDK decodes before it hashes
        except UnicodeDecodeError:
            raise BadCallback("signature mismatch (body is not UTF-8)") from None
        if not self._verifier.is_valid(body, timestamp, signature):
            raise BadCallback("signature mismatch")
        return decision_from_payload(_form_payload(body), replay_key=f"slack-sig:{signature}")


def _form_payload(body: bytes) -> Any:
    """The JSON in a form-encoded `payload=<json>` body, as Slack posts interactions."""
    malformed = BadCallback("body is not form-encoded payload=<json>", status=400)
    try:
        fields = urllib.parse.parse_qs(
            body.decode("utf-8"), strict_parsing=True, keep_blank_values=True, max_num_fields=4
        )
    except ValueError:
        raise malformed from None
    values = fields.get("payload")
    if set(fields) != {"payload"} or values is None or len(values) != 1:
        raise malformed
    try:
        return json.loads(values[0])
    except (ValueError, RecursionError):
        raise malformed from None


# --- Socket Mode ---------------------------------------------------------------------------


class SlackSocketMode:
    """Clicks over Socket Mode: the daemon opens a WebSocket to Slack (no public endpoint).

    Built on the SDK's built-in client (`slack_sdk.socket_mode.builtin`): it asks
    apps.connections.open for a URL with the app-level token, connects, answers pings and
    reconnects on its own once started. It picks TLS by port, not by scheme (443: TLS; any
    other port: plain TCP), which is why it also talks to a `ws://127.0.0.1:PORT` test server.

    Requests carry no signature: the authenticated WebSocket is the proof. Every envelope is
    acked at once (Slack resends what is not acked within 3 s); an `interactive` one with a
    block_actions payload goes to `on_decision`, anything else to `on_refused` with the reason.
    Both are called from the SDK's one worker thread, one envelope at a time; nothing they
    raise escapes into it.
    """

    def __init__(
        self,
        app_token: str,
        *,
        on_decision: Callable[[Decision], None],
        on_refused: Callable[[str], None],
        base_url: str = "https://slack.com/api/",
    ) -> None:
        if not app_token.strip():
            raise ValueError("the Slack app token is empty")
        self._app_token = app_token.strip()
        self._on_decision = on_decision
        self._on_refused = on_refused
        self._base_url = base_url
        self._client: SocketModeClient | None = None

    def __repr__(self) -> str:
        return f"SlackSocketMode(connected={self.connected})"

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected()

    def start(self) -> None:
        """Connect. Raises ChannelDown when apps.connections.open fails (a bad token, Slack
        down): then nothing runs, and the caller starts again later. Once this returns, the
        SDK reconnects by itself."""
        if self._client is not None:
            return
        client = SocketModeClient(
            app_token=self._app_token,
            web_client=WebClient(base_url=self._base_url, timeout=10),
            concurrency=1,
            logger=log,
        )
        client.message_listeners.append(self._on_message)
        try:
            client.connect()
        except SlackApiError as e:
            _close(client)
            status, code, retry_after = _api_error(e)
            message = f"slack apps.connections.open failed: HTTP {status}, error {code}"
            raise ChannelDown(message, retry_after_s=retry_after) from None
        except (SlackClientError, OSError, HTTPException, ValueError) as e:
            _close(client)
            text = f"{type(e).__name__}: {e}".replace(self._app_token, "[token]")
            raise ChannelDown(f"slack apps.connections.open failed: {text}"[:500]) from None
        self._client = client

    def stop(self) -> None:
        """Disconnect and stop the SDK's threads (at once: see `_close`)."""
        client, self._client = self._client, None
        if client is not None:
            _close(client)

    def _on_message(
        self, client: BaseSocketModeClient, message: dict[str, Any], raw: str | None
    ) -> None:
        try:
            self._handle(client, message)
        except Exception:  # a callback of ours failed: log it, keep the listener alive
            log.exception("slack socket mode: handling an envelope failed")

    def _handle(self, client: BaseSocketModeClient, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in ("hello", "disconnect"):  # the connection's own (the SDK reconnects)
            return
        envelope_id = message.get("envelope_id")
        if not isinstance(envelope_id, str) or not envelope_id:
            self._on_refused(f"socket mode message without an envelope_id (type {kind!r:.40})")
            return
        client.send_socket_mode_response(SocketModeResponse(envelope_id=envelope_id))
        try:
            request = SocketModeRequest.from_dict(message)
        except ValueError:
            request = None
        if request is None or not isinstance(message.get("payload"), dict):
            self._on_refused("socket mode envelope without a JSON object payload")
            return
        if request.type != "interactive":
            self._on_refused(f"socket mode envelope of type {request.type!r:.40} ignored")
            return
        try:
            decision = decision_from_payload(
                request.payload, replay_key=f"slack-envelope:{envelope_id}"
            )
        except BadCallback as e:
            self._on_refused(str(e))
            return
        self._on_decision(decision)


def _close(client: SocketModeClient) -> None:
    """The SDK's close(), without its waits: close() sits out the reader's 3-second receive
    timeout and the queue's 1-second poll. Shutting the socket down and queueing an empty
    message (which the SDK skips) wake both now; reconnecting is off before either."""
    client.auto_reconnect_enabled = False
    client.current_session_state.terminated = True
    client.closed = True
    session = client.current_session
    sock = session.sock if session is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    client.message_queue.put(None)
    client.close()
