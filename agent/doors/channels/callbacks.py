"""Clicks coming back: the daemon's HTTP endpoint for Slack's interactivity requests and WeChat
Work's callbacks, and the desk that turns a verified click into a vote.

The channel modules verify (signature, timestamp window, decryption) before anything is parsed
and hand over a `Decision`; the desk then refuses a replay (a signature or event id seen before,
kept in `channel_receipt`), and votes as `<channel>:<user id>`, which the policy maps to a
principal: an unknown user's click is refused by `Approvals.vote` (no role that may approve),
one person counts once across channels (votes count canonical names), a vote after expiry or on
a decided approval changes nothing. Every refusal is audited (`channel.refused`, or Approvals'
`approval.vote_refused` / `approval.vote` with its reason).

The server is the standard library's threading HTTP server: one thread per request, a bounded
body read within a deadline, no tracebacks to the client or the terminal.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy.exc import IntegrityError

from nightshift.agent.doors.channels.base import BadCallback, Decision
from nightshift.agent.doors.channels.outbox import Outbox
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.runtime.errors import PolicyDenied, UnknownApproval
from nightshift.runtime.store.db import Approval, ChannelReceipt, Store

MAX_BODY = 64 * 1024
READ_TIMEOUT_S = 10.0


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
    ):
        self.store, self.audit, self.approvals = store, audit, approvals
        self.outbox, self.clock = outbox, clock

    def decide(self, d: Decision) -> Approval:
        """Count a verified click once, or raise Refused (audited)."""
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
            ) from None
        try:
            row = self.approvals.vote(d.approval_id, d.principal, d.approve, now)
        except PolicyDenied as exc:  # audited by Approvals as approval.vote_refused
            raise Refused(str(exc)) from None
        except UnknownApproval as exc:
            raise self.refuse(d.channel, str(exc), user=d.user, approval_id=d.approval_id) from None
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
    ) -> Refused:
        self.audit.append(
            f"{channel}:{user}" if user else "system",
            "channel.refused",
            payload={
                "channel": channel,
                "reason": reason,
                "user": user,
                "approval_id": approval_id,
                "peer": peer,
            },
        )
        return Refused(reason)


Route = Callable[[str, dict[str, str], dict[str, str], bytes], tuple[int, str]]


class CallbackServer:
    """POST /slack/interactivity, GET and POST /wechat/callback, GET /healthz on host:port."""

    def __init__(self, listen: str, routes: dict[str, Route], say: Callable[[str], None]):
        host, _, port = listen.rpartition(":")
        self.routes, self.say = routes, say
        self.httpd = ThreadingHTTPServer((host.strip("[]"), int(port)), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="channel-callbacks", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler(server: CallbackServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "nightshift"
        sys_version = ""
        timeout = READ_TIMEOUT_S

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/healthz":
                return self._answer(200, "ok")
            route = server.routes.get(url.path)
            if route is None:
                return self._answer(404, "not found")
            body = b""
            if method == "POST":
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    return self._answer(411, "a Content-Length is required")
                if length < 0 or length > MAX_BODY:
                    return self._answer(413, "too large")
                try:
                    body = self.rfile.read(length)
                except OSError:
                    return
            query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                status, text = route(method, query, headers, body)
            except Exception as exc:  # a bug must not take the endpoint down or leak a trace
                server.say(f"callback {url.path} failed: {type(exc).__name__}: {exc}")
                status, text = 500, "error"
            self._answer(status, text)

        def _answer(self, status: int, text: str) -> None:
            data = text.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are audited where they matter; the terminal stays quiet

    return Handler


def _route(channel: str, desk: Desk, verify: Callable[..., Decision | str]) -> Route:
    """A callback: `verify(method, query, headers, body)` checks it (BadCallback: refused and
    audited, the HTTP answer says only that) and gives a Decision to count, or the text a URL
    check must echo. A verified click gets an empty 200 whether or not it counted (the audit says
    why): the channels retry anything else."""

    def route(method: str, query: dict[str, str], headers: dict[str, str], body: bytes):
        try:
            verified = verify(method, query, headers, body)
        except BadCallback as exc:
            desk.refuse(channel, str(exc), peer=headers.get("x-forwarded-for"))
            return exc.status, "refused"
        if isinstance(verified, str):
            return 200, verified
        try:
            desk.decide(verified)
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
