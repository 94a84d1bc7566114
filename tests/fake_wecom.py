"""A fake WeChat Work (企业微信) API on loopback, and what WeChat Work sends to an app's callback
URL, for tests that drive the real channel over real HTTP.

`FakeWeCom` answers the APIs nightshift uses the way WeChat Work documents them: gettoken (an
access token that expires, and is refused once expired), message/send (a template card gets a
single-use `response_code`; a task id may be used once), message/update_template_card (a code
works once) and a group robot's webhook/send. It records every request and can fail on demand.

The helpers below build the callbacks: `encrypted_event` (a click on a card's button, POSTed as
WeChat Work does: the query's msg_signature, timestamp and nonce, and an XML body with the
encrypted event) and `echo_query` (the GET that verifies the URL). They encrypt and sign with
wechatpy's `WeChatCrypto`, an implementation of the protocol independent of nightshift's;
`sign` recomputes a signature with hashlib, to re-sign a tampered ciphertext.

    with FakeWeCom() as wecom:
        channel = WeComChannel(wecom.corp_id, wecom.agent_id, wecom.secret,
                               approvers=["alice"], base_url=wecom.base_url)
        posted = channel.post_approval(card)
        assert wecom.last("message/send")["template_card"]["task_id"] == posted.ref["task_id"]
        query, body = encrypted_event(TOKEN, AES_KEY, wecom.corp_id, user="alice",
                                      approval_id=7, approve=True,
                                      task_id=posted.ref["task_id"],
                                      response_code=wecom.new_response_code())

The error codes are WeChat Work's where it documents one (40001 invalid secret, 40013 invalid
corp id, 40014 invalid token, 41001 no token, 42001 expired token, 40056 invalid agent id,
47001 bad JSON, 93000 invalid robot key); a refused task id or response code gets 40058
("invalid parameter"), the fake's choice: WeChat Work does not say which code it answers.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.etree import ElementTree

from wechatpy.enterprise.crypto import WeChatCrypto

TASK_ID = re.compile(r"[0-9A-Za-z_@-]{1,128}")
INTERACTIVE = ("button_interaction", "vote_interaction", "multiple_interaction")
INVALID_PARAMETER = 40058

Call = tuple[str, dict[str, str], Any]  # (path under /cgi-bin/, query, JSON body or None)


class FakeWeCom:
    """WeChat Work's API on 127.0.0.1, served from a daemon thread.

    `calls` lists every request that arrived, refused or not, as (path, query, body) with the
    path under /cgi-bin/ ("message/send"); `delivered` the messages that reached someone (a
    duplicate within message/send's duplicate check is not delivered again); `cards()` the
    template cards sent, `replaced(task_id)` what a card's buttons were replaced with;
    `tokens_issued` counts gettoken successes. Switches: `down = True` answers 503 to everything; `delay_s` sleeps before each
    answer; `expire_token()` makes the tokens issued so far answer 42001; `errcode_next(code)`
    answers the next call with that errcode.
    """

    def __init__(
        self,
        corp_id: str = "wwfake0123456789",
        secret: str = "fake-app-secret-0123456789",
        *,
        agent_id: int = 1000002,
        robot_key: str = "fake-robot-key-0123",
        token_ttl_s: int = 7200,
    ) -> None:
        self.corp_id, self.secret, self.agent_id = corp_id, secret, agent_id
        self.robot_key = robot_key
        self.token_ttl_s = token_ttl_s
        self.calls: list[Call] = []
        self.delivered: list[dict[str, Any]] = []
        self._cards: dict[str, dict[str, Any]] = {}  # task id: touser, card, replace_name
        self.tokens_issued = 0
        self.down = False
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._tokens: dict[str, bool] = {}  # token: still valid
        self._codes: dict[str, str] = {}  # response code: its card's task id
        self._used_codes: set[str] = set()
        self._errors: list[tuple[str | None, int, str]] = []
        self._sent_at: dict[tuple[str, str, str], float] = {}  # for the duplicate check
        self._ids = itertools.count(1)
        self._http = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """What to give the channel as `base_url`."""
        return f"http://127.0.0.1:{self._http.server_address[1]}/cgi-bin/"

    @property
    def robot_webhook(self) -> str:
        """The group robot's webhook URL (with its key)."""
        return f"{self.base_url}webhook/send?key={self.robot_key}"

    # --- failure switches -------------------------------------------------------------------

    def expire_token(self) -> None:
        """Every token issued so far answers 42001 (access_token expired) from now on."""
        with self._lock:
            self._tokens = dict.fromkeys(self._tokens, False)

    def errcode_next(self, code: int, errmsg: str = "", *, path: str | None = None) -> None:
        """Answer the next call to `path` (by default any but gettoken) with HTTP 200 and
        {"errcode": code}; queued calls are answered in order."""
        with self._lock:
            self._errors.append((path, code, errmsg or f"fake error {code}"))

    # --- what WeChat Work does for a click ------------------------------------------------------

    def new_response_code(self, task_id: str | None = None) -> str:
        """The fresh response code a click on the card `task_id` (by default the latest card)
        brings in its callback, usable once for message/update_template_card."""
        with self._lock:
            if task_id is None and self._cards:
                task_id = list(self._cards)[-1]
            if task_id is None or task_id not in self._cards:
                raise AssertionError(f"no card was sent with task id {task_id!r}")
            return self._new_code(task_id)

    # --- what arrived -----------------------------------------------------------------------

    def cards(self) -> list[dict[str, Any]]:
        """The template cards sent (message/send's `template_card`), in order."""
        with self._lock:
            return [c["card"] for c in self._cards.values()]

    def last_card(self) -> dict[str, Any]:
        """The latest template card sent (AssertionError when there was none)."""
        cards = self.cards()
        if not cards:
            raise AssertionError(f"no template card was sent (calls: {self.paths()})")
        return cards[-1]

    def replaced(self, task_id: str) -> str | None:
        """What the card's buttons were replaced with by message/update_template_card."""
        with self._lock:
            return self._cards[task_id].get("replace_name")

    def paths(self) -> list[str]:
        with self._lock:
            return [p for p, _, _ in self.calls]

    def bodies(self, path: str) -> list[Any]:
        """The bodies of every call to `path`, in order."""
        with self._lock:
            return [b for p, _, b in self.calls if p == path]

    def last(self, path: str) -> Any:
        """The body of the latest call to `path` (AssertionError when there was none)."""
        found = self.bodies(path)
        if not found:
            raise AssertionError(f"{path} was never called (calls: {self.paths()})")
        return found[-1]

    # --- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> FakeWeCom:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the API ----------------------------------------------------------------------------

    def _answer(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any] | bytes]:
        with self._lock:
            self.calls.append((path, query, body))
            delay, down = self.delay_s, self.down
        if delay:
            time.sleep(delay)
        if down:
            return 503, b"<html><body>503 Service Unavailable</body></html>"
        with self._lock:
            for i, (only, code, errmsg) in enumerate(self._errors):
                if only == path or (only is None and path != "gettoken"):
                    del self._errors[i]
                    return 200, {"errcode": code, "errmsg": errmsg}
        if path == "gettoken" and method == "GET":
            return 200, self._gettoken(query)
        if path == "webhook/send" and method == "POST":
            return 200, self._webhook(query, body)
        routes = {
            "message/send": self._send,
            "message/update_template_card": self._update_card,
        }
        route = routes.get(path)
        if route is None or method != "POST":
            return 404, b"not found"
        refused = self._token_error(query.get("access_token"))
        if refused is not None:
            return 200, refused
        if not isinstance(body, dict):
            return 200, {"errcode": 47001, "errmsg": "data format error"}
        if body.get("agentid") != self.agent_id:
            return 200, {"errcode": 40056, "errmsg": "invalid agentid"}
        return 200, route(body)

    def _gettoken(self, query: dict[str, str]) -> dict[str, Any]:
        if query.get("corpid") != self.corp_id:
            return {"errcode": 40013, "errmsg": "invalid corpid"}
        if query.get("corpsecret") != self.secret:
            return {"errcode": 40001, "errmsg": "invalid secret"}
        token = f"fake-token-{secrets.token_hex(12)}"
        with self._lock:
            self._tokens[token] = True
            self.tokens_issued += 1
        return {
            "errcode": 0,
            "errmsg": "ok",
            "access_token": token,
            "expires_in": self.token_ttl_s,
        }

    def _token_error(self, token: str | None) -> dict[str, Any] | None:
        with self._lock:
            valid = self._tokens.get(token) if token else None
        if not token:
            return {"errcode": 41001, "errmsg": "access_token missing"}
        if valid is None:
            return {"errcode": 40014, "errmsg": "invalid access_token"}
        if not valid:
            return {"errcode": 42001, "errmsg": "access_token expired"}
        return None

    def _send(self, body: dict[str, Any]) -> dict[str, Any]:
        touser = body.get("touser")
        if not isinstance(touser, str) or not touser:
            return _invalid("touser is empty")
        msgtype = body.get("msgtype")
        answer: dict[str, Any] = {"errcode": 0, "errmsg": "ok", "invaliduser": ""}
        if msgtype == "markdown":
            content = (body.get("markdown") or {}).get("content")
            if not isinstance(content, str) or not content:
                return _invalid("markdown.content is empty")
            if len(content.encode()) > 2048:
                return _invalid("markdown.content is over 2048 bytes")
            self._deliver(body, touser, content)
        elif msgtype == "template_card":
            card = body.get("template_card")
            if not isinstance(card, dict):
                return _invalid("template_card is missing")
            refused = self._check_card(card)
            if refused is not None:
                return refused
            if card.get("card_type") in INTERACTIVE:
                with self._lock:
                    self._cards[card["task_id"]] = {"touser": touser, "card": card}
                    answer["response_code"] = self._new_code(card["task_id"])
            self._deliver(body, touser, json.dumps(card, sort_keys=True))
        else:
            return {"errcode": 40008, "errmsg": "invalid message type"}
        answer["msgid"] = f"fake-msg-{next(self._ids)}"
        return answer

    def _check_card(self, card: dict[str, Any]) -> dict[str, Any] | None:
        if card.get("card_type") not in INTERACTIVE:
            return None
        task_id = card.get("task_id")
        if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
            return _invalid("task_id must be 1-128 of [0-9a-zA-Z_-@]")
        with self._lock:
            if task_id in self._cards:
                return _invalid("task_id was used before")
        buttons = card.get("button_list") or []
        keys = [b.get("key", "") for b in buttons if isinstance(b, dict)]
        if card.get("card_type") == "button_interaction" and not 1 <= len(buttons) <= 6:
            return _invalid("button_list must have 1 to 6 buttons")
        if len(set(keys)) != len(keys) or any(len(k.encode()) > 1024 for k in keys):
            return _invalid("button keys must be unique and at most 1024 bytes")
        if len(card.get("horizontal_content_list") or []) > 6:
            return _invalid("horizontal_content_list has more than 6 items")
        return None

    def _update_card(self, body: dict[str, Any]) -> dict[str, Any]:
        code = body.get("response_code")
        with self._lock:
            if not isinstance(code, str) or code not in self._codes or code in self._used_codes:
                return _invalid("invalid response_code (unknown, or already used)")
            self._used_codes.add(code)
            card = self._cards[self._codes[code]]
            button = body.get("button")
            if isinstance(button, dict):
                card["replace_name"] = button.get("replace_name")
            else:
                card["card"] = body.get("template_card")
        return {"errcode": 0, "errmsg": "ok"}

    def _webhook(self, query: dict[str, str], body: Any) -> dict[str, Any]:
        if query.get("key") != self.robot_key:
            return {"errcode": 93000, "errmsg": "invalid webhook url"}
        if not isinstance(body, dict):
            return {"errcode": 47001, "errmsg": "data format error"}
        msgtype = body.get("msgtype")
        limit = {"markdown": 4096, "text": 2048}.get(str(msgtype))
        content = (body.get(str(msgtype)) or {}).get("content") if limit else None
        if limit is None or not isinstance(content, str) or not content:
            return {"errcode": 40008, "errmsg": "invalid message type"}
        if len(content.encode()) > limit:
            return _invalid(f"content is over {limit} bytes")
        with self._lock:
            self.delivered.append({"robot": True, **body})
        return {"errcode": 0, "errmsg": "ok"}

    def _deliver(self, body: dict[str, Any], touser: str, content: str) -> None:
        """Record a delivered message, unless the duplicate check it asked for drops it."""
        key = (touser, str(body.get("msgtype")), content)
        now = time.monotonic()
        with self._lock:
            window = body.get("duplicate_check_interval") or 1800
            last = self._sent_at.get(key)
            if body.get("enable_duplicate_check") == 1 and last is not None and now - last < window:
                return
            self._sent_at[key] = now
            self.delivered.append(body)

    def _new_code(self, task_id: str) -> str:
        """(Under the lock.)"""
        code = f"fake-rc-{next(self._ids)}-{secrets.token_urlsafe(12)}"
        self._codes[code] = task_id
        return code


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up waiting (a timeout test): nothing to report
        super().handle_error(request, client_address)


def _invalid(why: str) -> dict[str, Any]:
    return {"errcode": INVALID_PARAMETER, "errmsg": f"invalid parameter (fake: {why})"}


def _handler(wecom: FakeWeCom) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def _serve(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            if not url.path.startswith("/cgi-bin/"):
                self._send(404, b"not found")
                return
            self._send(*wecom._answer(method, url.path[len("/cgi-bin/") :], query, body))

        def _send(self, status: int, answer: dict[str, Any] | bytes) -> None:
            body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            kind = "text/html" if isinstance(answer, bytes) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: pytest shows what matters

    return Handler


# --- what WeChat Work sends to the app's callback URL ----------------------------------------


def new_aes_key() -> str:
    """A random EncodingAESKey: 43 base64 characters (32 bytes without the trailing "=")."""
    return base64.b64encode(os.urandom(32)).decode()[:43]


def sign(token: str, timestamp: str | int, nonce: str, encrypted: str) -> str:
    """msg_signature: SHA-1 hex of the token, timestamp, nonce and ciphertext, sorted and
    concatenated."""
    parts = sorted((token, str(timestamp), nonce, encrypted))
    return hashlib.sha1("".join(parts).encode()).hexdigest()


def encrypt(
    token: str, aes_key: str, receive_id: str, plaintext: str, *, timestamp: str | int, nonce: str
) -> tuple[str, str]:
    """(ciphertext, msg_signature) for `plaintext` meant for `receive_id` (the corp id), from
    wechatpy."""
    reply = WeChatCrypto(token, aes_key, receive_id).encrypt_message(
        plaintext, nonce, str(timestamp)
    )
    root = ElementTree.fromstring(reply)
    return root.findtext("Encrypt") or "", root.findtext("MsgSignature") or ""


def encrypted_body(
    token: str,
    aes_key: str,
    receive_id: str,
    plaintext: str,
    *,
    timestamp: str | int | None = None,
    nonce: str | None = None,
    agent_id: int = 1000002,
) -> tuple[dict[str, str], bytes]:
    """A callback POST carrying any `plaintext`: (query, body) as WeChat Work sends them,
    `timestamp` now and `nonce` random unless given."""
    timestamp = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or str(secrets.randbelow(10**10))
    ciphertext, signature = encrypt(
        token, aes_key, receive_id, plaintext, timestamp=timestamp, nonce=nonce
    )
    body = (
        f"<xml><ToUserName><![CDATA[{receive_id}]]></ToUserName>"
        f"<AgentID><![CDATA[{agent_id}]]></AgentID>"
        f"<Encrypt><![CDATA[{ciphertext}]]></Encrypt></xml>"
    )
    query = {"msg_signature": signature, "timestamp": timestamp, "nonce": nonce}
    return query, body.encode()


def event_xml(
    corp_id: str,
    *,
    user: str,
    event_key: str,
    task_id: str,
    response_code: str,
    create_time: str | int,
    agent_id: int = 1000002,
    msg_type: str = "event",
    event: str = "template_card_event",
    card_type: str = "button_interaction",
) -> str:
    """The plaintext of a template card event, as WeChat Work documents it."""
    return (
        "<xml>"
        f"<ToUserName><![CDATA[{corp_id}]]></ToUserName>"
        f"<FromUserName><![CDATA[{user}]]></FromUserName>"
        f"<CreateTime>{create_time}</CreateTime>"
        f"<MsgType><![CDATA[{msg_type}]]></MsgType>"
        f"<Event><![CDATA[{event}]]></Event>"
        f"<EventKey><![CDATA[{event_key}]]></EventKey>"
        f"<TaskId><![CDATA[{task_id}]]></TaskId>"
        f"<CardType><![CDATA[{card_type}]]></CardType>"
        f"<ResponseCode><![CDATA[{response_code}]]></ResponseCode>"
        f"<AgentID>{agent_id}</AgentID>"
        "</xml>"
    )


def encrypted_event(
    token: str,
    aes_key: str,
    corp_id: str,
    *,
    user: str,
    approval_id: int,
    approve: bool,
    task_id: str,
    response_code: str,
    create_time: str | int | None = None,
    timestamp: str | int | None = None,
    nonce: str | None = None,
    event_key: str | None = None,
    receive_id: str | None = None,
    agent_id: int = 1000002,
    msg_type: str = "event",
    event: str = "template_card_event",
) -> tuple[dict[str, str], bytes]:
    """A click on Approve or Reject, as WeChat Work POSTs it: (query, body). `create_time`
    defaults to `timestamp`, which defaults to now. To forge odd ones: `event_key` replaces
    "approve:<id>" / "reject:<id>", `receive_id` the corp id the plaintext ends with,
    `msg_type` and `event` the event's type."""
    timestamp = str(int(time.time()) if timestamp is None else timestamp)
    if event_key is None:
        event_key = f"{'approve' if approve else 'reject'}:{approval_id}"
    plaintext = event_xml(
        corp_id,
        user=user,
        event_key=event_key,
        task_id=task_id,
        response_code=response_code,
        create_time=timestamp if create_time is None else create_time,
        agent_id=agent_id,
        msg_type=msg_type,
        event=event,
    )
    return encrypted_body(
        token,
        aes_key,
        corp_id if receive_id is None else receive_id,
        plaintext,
        timestamp=timestamp,
        nonce=nonce,
        agent_id=agent_id,
    )


def echo_query(
    token: str,
    aes_key: str,
    corp_id: str,
    *,
    echo: str,
    timestamp: str | int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The query of the GET that verifies the callback URL: `echo` encrypted as `echostr`,
    which the server must decrypt and answer."""
    timestamp = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or str(secrets.randbelow(10**10))
    echostr, signature = encrypt(token, aes_key, corp_id, echo, timestamp=timestamp, nonce=nonce)
    return {"msg_signature": signature, "timestamp": timestamp, "nonce": nonce, "echostr": echostr}
