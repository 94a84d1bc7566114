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

The server is the standard library's threading HTTP server: one thread per request, a bounded
body read within a deadline, no tracebacks to the client or the terminal. Each remote address
has a cap on its open connections (503 past it; `channels.callback_max_connections_per_peer`,
and `callback_max_connections` in all) and a token bucket on its requests (429 with
Retry-After past it; `channels.callback_requests_per_s`, `callback_burst`). Behind a reverse
proxy every request comes from the proxy's address: the limits are then the endpoint's.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy.exc import IntegrityError

from nightshift.agent.doors.channels.base import BadCallback, Decision
from nightshift.agent.doors.channels.outbox import Outbox
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.refusal_tally import RateLimits, RefusalLog
from nightshift.runtime.config import ChannelsSettings
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


# method, query, headers, body, the remote address → status, text
Route = Callable[[str, dict[str, str], dict[str, str], bytes, str], tuple[int, str]]


class CallbackServer:
    """POST /slack/interactivity, GET and POST /wechat/callback, GET /healthz on host:port.
    `refusals` (the desk's) tallies requests refused for their rate and writes closed minutes'
    aggregates twice a second and at `stop`."""

    def __init__(
        self,
        listen: str,
        routes: dict[str, Route],
        say: Callable[[str], None],
        *,
        limits: ChannelsSettings | None = None,
        refusals: RefusalLog | None = None,
    ):
        host, _, port = listen.rpartition(":")
        self.routes, self.say, self.refusals = routes, say, refusals
        self.limits = limits or ChannelsSettings()
        self.rates = RateLimits(self.limits.callback_requests_per_s, self.limits.callback_burst)
        self.httpd = _Server((host.strip("[]"), int(port)), _handler(self), self)
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
        self.flush_refusals(final=True)

    def flush_refusals(self, *, final: bool = False) -> None:
        if self.refusals is None:
            return
        try:
            self.refusals.flush(final=final)
        except Exception as exc:  # the store busy or gone: said, the endpoint goes on
            self.say(f"could not audit channel.refused_aggregate: {type(exc).__name__}: {exc}")

    def rate_limited(self, path: str, address: str, forwarded: str | None) -> float:
        """0 when the address is within its rate; else the seconds to wait (the refusal is
        tallied)."""
        wait = self.rates.take(address, time.monotonic())
        if wait <= 0 or self.refusals is None:
            return wait
        channel = path.strip("/").split("/")[0] or "callback"
        why = (
            f"rate limited: more than {self.limits.callback_burst} requests at once or "
            f"{self.limits.callback_requests_per_s:g} a second from {address} "
            "(channels.callback_burst, channels.callback_requests_per_s)"
        )
        try:
            self.refusals.refused(
                address,
                "rate_limited",
                why,
                actor="system",
                payload={
                    "channel": channel,
                    "reason": why,
                    "user": None,
                    "approval_id": None,
                    "peer": forwarded,
                    "source": address,
                },
                about={"peer": address},
            )
        except Exception as exc:
            self.say(f"could not audit channel.refused: {type(exc).__name__}: {exc}")
        return wait


class _Server(ThreadingHTTPServer):
    """The threading server with a cap on open connections, per remote address and in all:
    past it a connection is answered 503 and closed before a thread is started for it; and the
    refusal tally's closed minutes written from its loop."""

    def __init__(self, address: tuple[str, int], handler: Any, owner: CallbackServer):
        self.owner = owner
        self._open: Counter[str] = Counter()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        peer = str(client_address[0])
        limits = self.owner.limits
        with self._open_lock:
            full = (
                self._open[peer] >= limits.callback_max_connections_per_peer
                or self._open.total() >= limits.callback_max_connections
            )
            if not full:
                self._open[peer] += 1
        if full:
            _busy(request)
        return not full

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(client_address)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(client_address)

    def _release(self, client_address: Any) -> None:
        peer = str(client_address[0])
        with self._open_lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def service_actions(self) -> None:
        super().service_actions()
        self.owner.flush_refusals()


def _busy(request: socket.socket) -> None:
    """Say 503 on a connection refused for the cap, without reading it or waiting on it."""
    try:
        request.settimeout(0.5)
        request.sendall(
            b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )
    except OSError:
        pass


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
            address = str(self.client_address[0])
            wait = server.rate_limited(url.path, address, self.headers.get("X-Forwarded-For"))
            if wait > 0:
                return self._answer(429, "rate limited", retry_after=wait)
            query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                status, text = route(method, query, headers, body, address)
            except Exception as exc:  # a bug must not take the endpoint down or leak a trace
                server.say(f"callback {url.path} failed: {type(exc).__name__}: {exc}")
                status, text = 500, "error"
            self._answer(status, text)

        def _answer(self, status: int, text: str, retry_after: float | None = None) -> None:
            data = text.encode()
            try:
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", str(max(1, math.ceil(retry_after))))
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
