"""A fake Slack on loopback, for tests that drive the real `slack_sdk` clients over real HTTP.

`FakeSlack` answers the few Web API methods nightshift uses (chat.postMessage, chat.update,
auth.test, apps.connections.open) the way Slack does, records every call, and can fail on demand
(down, rate-limited, an API error). For Socket Mode it runs a WebSocket server on 127.0.0.1 that
greets a client with `hello`, pushes the envelopes a test gives it and records the client's acks.

The helpers below build what Slack would send to the interactivity endpoint: a form-encoded
`block_actions` payload (`block_actions_body`) and its v0 signature headers (`sign`, written
with hmac/hashlib, independently of the SDK whose verifier is under test).

    with FakeSlack(token="xoxb-test") as slack:
        channel = SlackChannel("xoxb-test", approvals_channel="C1", base_url=slack.base_url)
        posted = channel.post_approval(card)
        assert slack.last("chat.postMessage")["channel"] == "C1"
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.sync.server import Server, ServerConnection, serve

APPROVE = "nightshift_approve"
REJECT = "nightshift_reject"

_FIRST_TS_US = 1_733_300_000_000_100  # "1733300000.000100", in microseconds


def _ts(n: int) -> str:
    """The n-th message ts (from 0): increasing, in Slack's "seconds.micros" form."""
    us = _FIRST_TS_US + 100 * n
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


class FakeSlack:
    """Slack's Web API (and a Socket Mode WebSocket server) on 127.0.0.1, in daemon threads.

    `calls` lists every request that arrived, refused or not, as (method, params) with the
    JSON or form body decoded; `messages` maps (channel, ts) to the message as last posted or
    updated. Switches: `down = True` answers 503 to everything; `ratelimit_next(n)` answers 429
    with Retry-After to the next n calls; `error_next(code)` answers ok=false with that error.
    """

    def __init__(self, token: str = "xoxb-test", *, app_token: str = "xapp-test") -> None:
        self.token = token
        self.app_token = app_token
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.socket_acks: list[dict[str, Any]] = []
        self.down = False
        self._lock = threading.Lock()
        self._ts = itertools.count()
        self._ratelimited = 0
        self._retry_after = 1
        self._errors: list[str] = []
        self._ws: Server | None = None
        self._ws_thread: threading.Thread | None = None
        self._ws_conns: list[ServerConnection] = []
        self._tickets = itertools.count(1)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._http_thread.start()

    @property
    def base_url(self) -> str:
        """What to give a `WebClient` (or a channel) as `base_url`."""
        return f"http://127.0.0.1:{self._http.server_address[1]}/api/"

    # --- failure switches -------------------------------------------------------------------

    def ratelimit_next(self, n: int = 1, retry_after: int = 1) -> None:
        """Answer the next `n` calls with HTTP 429 and `Retry-After: retry_after`."""
        with self._lock:
            self._ratelimited = n
            self._retry_after = retry_after

    def error_next(self, error: str, n: int = 1) -> None:
        """Answer the next `n` calls with HTTP 200 and {"ok": false, "error": error}."""
        with self._lock:
            self._errors.extend([error] * n)

    # --- what arrived -------------------------------------------------------------------------

    def methods(self) -> list[str]:
        """The methods called so far, in order."""
        with self._lock:
            return [m for m, _ in self.calls]

    def last(self, method: str) -> dict[str, Any]:
        """The params of the latest call of `method` (AssertionError when there was none)."""
        with self._lock:
            for m, params in reversed(self.calls):
                if m == method:
                    return params
        raise AssertionError(f"{method} was never called (calls: {self.methods()})")

    # --- Socket Mode -------------------------------------------------------------------------

    def socket_url(self) -> str:
        """A fresh Socket Mode URL (what apps.connections.open returns), starting the
        WebSocket server on first use."""
        with self._lock:
            if self._ws is None:
                self._ws = serve(self._ws_session, "127.0.0.1", 0)
                self._ws_thread = threading.Thread(target=self._ws.serve_forever, daemon=True)
                self._ws_thread.start()
            port = self._ws.socket.getsockname()[1]
            return f"ws://127.0.0.1:{port}/link/?ticket={next(self._tickets)}&app_id=A0FAKE"

    def socket_connected(self) -> bool:
        """Whether a Socket Mode client is connected now."""
        with self._lock:
            return bool(self._ws_conns)

    def socket_send(self, envelope: dict[str, Any] | str, timeout: float = 5.0) -> None:
        """Push an envelope (a dict, sent as JSON, or raw text) to the connected client,
        waiting up to `timeout` seconds for one to connect."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                conn = self._ws_conns[-1] if self._ws_conns else None
            if conn is not None:
                conn.send(envelope if isinstance(envelope, str) else json.dumps(envelope))
                return
            if time.monotonic() > end:
                raise AssertionError("no Socket Mode client connected")
            time.sleep(0.02)

    def _ws_session(self, conn: ServerConnection) -> None:
        hello = {
            "type": "hello",
            "num_connections": 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 18060},
            "connection_info": {"app_id": "A0FAKE"},
        }
        conn.send(json.dumps(hello))
        with self._lock:
            self._ws_conns.append(conn)
        try:
            for message in conn:
                try:
                    ack = json.loads(message)
                except ValueError:
                    ack = {"raw": message}
                with self._lock:
                    self.socket_acks.append(ack)
        except Exception:  # the client went away mid-frame: that ends the session
            pass
        finally:
            with self._lock:
                self._ws_conns.remove(conn)

    # --- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop both servers and close their connections."""
        self._http.shutdown()
        self._http.server_close()
        if self._ws is not None:
            self._ws.shutdown()
        if self._ws_thread is not None:
            self._ws_thread.join(timeout=5)
        self._http_thread.join(timeout=5)

    def __enter__(self) -> FakeSlack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the Web API ----------------------------------------------------------------------------

    def _answer(self, method: str, token: str | None, params: dict[str, Any]) -> _Answer:
        with self._lock:
            self.calls.append((method, params))
            if self.down:
                return 503, {}, b"<html><body>503 Service Unavailable</body></html>"
            if self._ratelimited > 0:
                self._ratelimited -= 1
                body = {"ok": False, "error": "ratelimited"}
                return 429, {"Retry-After": str(self._retry_after)}, json.dumps(body).encode()
            if self._errors:
                return _ok_false(self._errors.pop(0))
        wanted = self.app_token if method == "apps.connections.open" else self.token
        if token is None:
            return _ok_false("not_authed")
        if not hmac.compare_digest(token.encode(), wanted.encode()):
            return _ok_false("invalid_auth")
        handler = self._methods().get(method)
        if handler is None:
            return _ok_false("unknown_method")
        return 200, {}, json.dumps(handler(params)).encode()

    def _methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "auth.test": lambda _p: {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "nightshift",
                "team_id": "T0FAKE",
                "user_id": "U0BOT",
                "bot_id": "B0BOT",
            },
            "apps.connections.open": lambda _p: {"ok": True, "url": self.socket_url()},
        }

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not params.get("text") and not params.get("blocks"):
            return {"ok": False, "error": "no_text"}
        ts = _ts(next(self._ts))
        message = {
            "type": "message",
            "user": "U0BOT",
            "bot_id": "B0BOT",
            "ts": ts,
            "text": params.get("text", ""),
            "blocks": _blocks(params.get("blocks")),
        }
        with self._lock:
            self.messages[(channel, ts)] = message
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        key = (params.get("channel", ""), params.get("ts", ""))
        with self._lock:
            message = self.messages.get(key)
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            message = {
                **message,
                "text": params.get("text", ""),
                "blocks": _blocks(params.get("blocks")),
                "edited": {"user": "U0BOT", "ts": _ts(next(self._ts))},
            }
            self.messages[key] = message
        return {
            "ok": True,
            "channel": key[0],
            "ts": key[1],
            "text": message["text"],
            "message": message,
        }


_Answer = tuple[int, dict[str, str], bytes]


def _ok_false(error: str) -> _Answer:
    return 200, {}, json.dumps({"ok": False, "error": error}).encode()


def _blocks(raw: Any) -> list[Any]:
    """Blocks as sent: a list in a JSON body, a JSON string in a form body."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    return raw if isinstance(raw, list) else []


def _handler(slack: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            params = _params(self.headers.get("Content-Type", ""), raw, self.path)
            token: str | None = None
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer "):
                token = auth[len("Bearer ") :]
            elif isinstance(params.get("token"), str):
                token = params.pop("token")
            path = urllib.parse.urlsplit(self.path).path
            if not path.startswith("/api/"):
                self._send(404, {}, b"not found")
                return
            status, headers, body = slack._answer(path[len("/api/") :], token, params)
            self._send(status, headers, body)

        do_GET = do_POST  # noqa: N815 (Slack accepts GET for most methods)

        def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            is_json = body.startswith(b"{")
            self.send_header("Content-Type", "application/json" if is_json else "text/html")
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: pytest shows what matters

    return Handler


def _params(content_type: str, raw: bytes, path: str) -> dict[str, Any]:
    """A request's parameters: the JSON object, or the form fields (and the query string)."""
    params: dict[str, Any] = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))
    if content_type.startswith("application/json"):
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict):
            params.update(body)
    else:
        params.update(urllib.parse.parse_qsl(raw.decode("utf-8", "replace")))
    return params


# --- what Slack sends the app -------------------------------------------------------------------


def sign(signing_secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers Slack sends with a request: its v0 signature
    (`v0=` + hex HMAC-SHA256 of `v0:<timestamp>:<body>`), the timestamp and the content type."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    digest = hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Signature": f"v0={digest}",
        "X-Slack-Request-Timestamp": str(timestamp),
        "Content-Type": "application/x-www-form-urlencoded",
    }


def block_actions_payload(
    user_id: str,
    approval_id: int,
    approve: bool,
    *,
    channel: str = "C1",
    ts: str = "1733300000.000100",
    trigger_id: str = "13345224609.738474920.8088930838d88f008e0",
    action_ts: str = "1733300042.123456",
    action_id: str | None = None,
    value: str | None = None,
) -> dict[str, Any]:
    """A `block_actions` payload as Slack sends it when someone clicks Approve or Reject on a
    card (`action_id` and `value` override what the click would carry, to forge odd ones)."""
    action_id = action_id or (APPROVE if approve else REJECT)
    return {
        "type": "block_actions",
        "user": {"id": user_id, "username": "someone", "name": "someone", "team_id": "T0FAKE"},
        "api_app_id": "A0FAKE",
        "token": "legacy-verification-token",
        "container": {
            "type": "message",
            "message_ts": ts,
            "channel_id": channel,
            "is_ephemeral": False,
        },
        "trigger_id": trigger_id,
        "team": {"id": "T0FAKE", "domain": "fake"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": "approvals"},
        "message": {"type": "message", "ts": ts, "bot_id": "B0BOT", "text": "Approval"},
        "state": {"values": {}},
        "response_url": "https://hooks.slack.com/actions/T0FAKE/1/fake",
        "actions": [
            {
                "action_id": action_id,
                "block_id": f"nightshift_approval_{approval_id}",
                "text": {"type": "plain_text", "text": "Approve" if approve else "Reject"},
                "value": str(approval_id) if value is None else value,
                "style": "primary" if approve else "danger",
                "type": "button",
                "action_ts": action_ts,
            }
        ],
    }


def block_actions_body(
    user_id: str,
    approval_id: int,
    approve: bool,
    *,
    channel: str = "C1",
    ts: str = "1733300000.000100",
    trigger_id: str = "13345224609.738474920.8088930838d88f008e0",
    action_id: str | None = None,
    value: str | None = None,
) -> bytes:
    """The body Slack POSTs to the interactivity URL for a click: `payload=<json>`,
    form-encoded (see `block_actions_payload`)."""
    payload = block_actions_payload(
        user_id,
        approval_id,
        approve,
        channel=channel,
        ts=ts,
        trigger_id=trigger_id,
        action_id=action_id,
        value=value,
    )
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def interactive_envelope(payload: dict[str, Any], envelope_id: str = "env-1") -> dict[str, Any]:
    """A Socket Mode envelope that carries an interactivity payload (what `socket_send` takes)."""
    return {
        "envelope_id": envelope_id,
        "payload": payload,
        "type": "interactive",
        "accepts_response_payload": False,
    }
