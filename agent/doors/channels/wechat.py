"""WeChat Work (企业微信): approval cards and notices through a self-built app, and the clicks that
come back to its callback URL.

Sending (`WeComChannel`): an approval is a `button_interaction` template card sent to the
approvers with Approve / Reject; a notice is a markdown message to the approvers and, when one
is configured, to a group robot. A template card can be changed only with a `response_code`,
and each code works once: message/send returns one, and every click brings a fresh one (in the
`Decision`'s `posted`). So a pending card is left as sent, and the one update a card gets turns
its buttons into the outcome ("Approved by alice, bob").

Receiving (`WeComCallback`): WeChat Work signs each callback (`msg_signature`: SHA-1 over the
sorted token, timestamp, nonce and ciphertext) and encrypts it (AES-256-CBC, key and IV from
the EncodingAESKey, PKCS#7 to 32 bytes, the plaintext ending with the corp id it was meant
for). The signature and the timestamp are checked before anything is decrypted, the XML is
parsed with defusedxml, and a click becomes a `Decision`; anything else is a `BadCallback`.

The app secret, the access token and the robot's webhook URL (its `key` is a credential) are
never logged nor put in an error: httpx logs every request's URL at INFO, so a filter on its
logger masks those query parameters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from xml.etree.ElementTree import Element, ParseError

import httpx
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as parse_xml

from nightshift.agent.doors.channels.base import (
    ApprovalCard,
    BadCallback,
    ChannelDown,
    ChannelName,
    Decision,
    Notice,
    Posted,
)

log = logging.getLogger(__name__)

API = "https://qyapi.weixin.qq.com/cgi-bin/"

# errcodes after which a fresh access token is worth one more try: 40014 invalid token, 42001
# expired. WeChat Work documents 40001 as an invalid *secret* (what gettoken answers, and that
# is not retried), but WeChat's other APIs use it for an invalid credential: one refresh costs
# one call.
TOKEN_ERRORS = frozenset({40001, 40014, 42001})
RATE_LIMITED = 45009  # "接口调用超过限制"
RATE_LIMIT_WAIT_S = 60.0
TOKEN_MARGIN_S = 300.0  # refresh this long before WeChat says the token expires

# Field limits from WeChat Work's template card documentation, in 字 (see _clip). Most are its
# advice ("建议不超过"): a longer value may be cut or refused, and either way the card would not
# say what we mean.
TITLE_LIMIT = 36  # main_title.title
TITLE_DESC_LIMIT = 44  # main_title.desc
SUBTITLE_LIMIT = 112  # sub_title_text (the documentation has said 160, and 112)
QUOTE_LIMIT = 112  # quote_area.quote_text (no stated limit: kept like the subtitle)
KEYNAME_LIMIT = 5  # horizontal_content_list[].keyname
VALUE_LIMIT = 26  # horizontal_content_list[].value (30 in older pages)
HORIZONTAL_ITEMS = 6
REPLACE_NAME_LIMIT = 20  # button.replace_name (no stated limit; a button is narrow)
APP_MARKDOWN_BYTES = 2048  # message/send markdown.content
ROBOT_MARKDOWN_BYTES = 4096  # webhook/send markdown.content
DUPLICATE_CHECK_S = 4 * 3600  # the longest window message/send's duplicate check allows

MAX_CALLBACK_BYTES = 64 * 1024
# A member's UserID: 1-64 bytes of letters, digits and "_-@." (WeChat Work's rule). Checked for
# approvers (a "|" would add recipients) and for the user a click names.
USER_ID = re.compile(r"[0-9A-Za-z_.@-]{1,64}")
TASK_ID = re.compile(r"[0-9A-Za-z_@-]{1,128}")  # template_card.task_id's charset and length
EVENT_KEY = re.compile(r"(approve|reject):([0-9]{1,18})")
PRINTABLE = re.compile(r"[\x21-\x7e]{1,512}")

_SECRET_QUERY = re.compile(r"(?<=[?&])(access_token|corpsecret|key)=[^&\s\"'#]*")


class WeComChannel:
    """Approval cards and notices through a WeChat Work app (and optionally a group robot).

    `approvers` are the members' UserIDs the cards and notices go to; with none, notices go to
    the robot only and cards cannot be posted. Thread-safe: the access token is fetched under a
    lock and cached until shortly before `expires_in`.
    """

    name: ChannelName = "wechat"

    def __init__(
        self,
        corp_id: str,
        agent_id: int,
        secret: str,
        *,
        approvers: list[str],
        base_url: str = API,
        robot_webhook: str | None = None,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not corp_id:
            raise ValueError("wechat.corp_id is empty")
        if not secret:
            raise ValueError("wechat.secret is empty")
        bad = [a for a in approvers if not isinstance(a, str) or not USER_ID.fullmatch(a)]
        if bad:
            raise ValueError(f"wechat.approvers: not WeChat Work UserIDs: {bad!r}")
        if not approvers and robot_webhook is None:
            raise ValueError("wechat needs approvers, a robot_webhook, or both")
        self.corp_id = corp_id
        self.agent_id = agent_id
        self.approvers = list(approvers)
        self._secret = secret
        self._robot = robot_webhook
        self._robot_key = _webhook_key(robot_webhook) if robot_webhook is not None else None
        self._clock = clock
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._token_until = 0.0
        _mask_secrets_in_httpx_logs()

    def __repr__(self) -> str:
        robot = "yes" if self._robot is not None else "no"
        return (
            f"WeComChannel(corp_id={self.corp_id!r}, agent_id={self.agent_id}, "
            f"approvers={self.approvers!r}, robot={robot})"
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> WeComChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------- Channel

    def post_approval(self, card: ApprovalCard) -> Posted:
        """Send the card to the approvers. Its task id is new on every post (WeChat refuses a
        task id it has seen, so a retried post must not reuse one)."""
        if not self.approvers:
            raise ChannelDown("wechat: no approvers to send the card to (wechat.approvers)")
        task_id = f"nightshift-{card.approval_id}-{secrets.token_hex(8)}"
        data = self._call(
            "message/send",
            {
                "touser": "|".join(self.approvers),
                "msgtype": "template_card",
                "agentid": self.agent_id,
                "template_card": template_card(card, task_id),
            },
        )
        _warn_undelivered(data)
        code = data.get("response_code")
        if not isinstance(code, str) or not code:
            raise ChannelDown(
                "wechat message/send: no response_code in the answer "
                "(an app without a callback URL cannot send a card with buttons)"
            )
        return Posted("wechat", {"response_code": code, "task_id": task_id})

    def update_approval(self, posted: Posted, card: ApprovalCard) -> bool:
        """Once decided, replace the buttons with the outcome, and say the card is done: a
        response code works once, so later states (executing, executed, failed) are not shown.
        Nothing is sent while pending (the code is kept for the outcome)."""
        if not card.decided:
            return True
        code = posted.ref.get("response_code")
        if posted.channel != "wechat" or not code:
            raise ValueError(f"not a WeChat Work card reference: {posted!r}")
        self._call(
            "message/update_template_card",
            {
                "atall": 1,  # every recipient of the card
                "agentid": self.agent_id,
                "response_code": code,
                "button": {"replace_name": outcome(card)},
            },
        )
        return False

    def notify(self, notice: Notice) -> None:
        """A markdown message to the approvers, then to the robot. WeChat's duplicate check
        (on identical content, which ends with the notice's key) keeps a retry after a robot
        failure from showing the approvers the notice twice."""
        if self.approvers:
            self._call(
                "message/send",
                {
                    "touser": "|".join(self.approvers),
                    "msgtype": "markdown",
                    "agentid": self.agent_id,
                    "markdown": {"content": markdown(notice, APP_MARKDOWN_BYTES)},
                    "enable_duplicate_check": 1,
                    "duplicate_check_interval": DUPLICATE_CHECK_S,
                },
            )
        if self._robot is not None:
            body = {
                "msgtype": "markdown",
                "markdown": {"content": markdown(notice, ROBOT_MARKDOWN_BYTES)},
            }
            self._check("webhook/send", self._request("POST", self._robot, "webhook/send", body))

    # ----------------------------------------------------------------------------- the API

    def probe(self) -> str:
        """gettoken with the app's secret: whether the corp id and secret are right."""
        self._access_token()
        robot = ", and a group robot" if self._robot is not None else ""
        return f"app {self.agent_id} of {self.corp_id}: {len(self.approvers)} approver(s){robot}"

    def _call(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to an app API with the access token; on a token error, once more with a new
        one."""
        token = self._access_token()
        data = self._request("POST", api, api, body, params={"access_token": token})
        if _errcode(data) in TOKEN_ERRORS:
            self._forget_token(token)
            token = self._access_token()
            data = self._request("POST", api, api, body, params={"access_token": token})
        self._check(api, data)
        return data

    def _access_token(self) -> str:
        with self._lock:
            if self._token is not None and self._clock() < self._token_until:
                return self._token
            params = {"corpid": self.corp_id, "corpsecret": self._secret}
            data = self._request("GET", "gettoken", "gettoken", None, params=params)
            self._check("gettoken", data)
            token, ttl = data.get("access_token"), data.get("expires_in")
            if not isinstance(token, str) or not token or not isinstance(ttl, int) or ttl <= 0:
                raise ChannelDown("wechat gettoken: no access_token in the answer")
            self._token = token
            self._token_until = self._clock() + max(ttl - TOKEN_MARGIN_S, ttl / 2)
            return token

    def _forget_token(self, token: str) -> None:
        with self._lock:
            if self._token == token:  # not one another thread has fetched since
                self._token = None

    def _request(
        self,
        method: str,
        url: str,
        api: str,
        body: dict[str, Any] | None,
        *,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One HTTP exchange, as a JSON object. Errors name the API only: the URL holds the
        secret, the token or the robot's key (and `from None` keeps httpx's error, which may
        hold the URL, out of the traceback)."""
        try:
            r = self._http.request(method, url, params=params, json=body)
        except httpx.TimeoutException:
            raise ChannelDown(f"wechat {api}: timed out") from None
        except httpx.HTTPError as exc:
            raise ChannelDown(f"wechat {api}: {type(exc).__name__}") from None
        if r.status_code != 200:
            raise ChannelDown(f"wechat {api}: HTTP {r.status_code}", retry_after_s=_retry_after(r))
        try:
            data = r.json()
        except ValueError:
            raise ChannelDown(f"wechat {api}: the answer is not JSON") from None
        if not isinstance(data, dict):
            raise ChannelDown(f"wechat {api}: the answer is not a JSON object")
        return data

    def _check(self, api: str, data: dict[str, Any]) -> None:
        code = _errcode(data)
        if code == 0:
            return
        if code is None:
            raise ChannelDown(f"wechat {api}: the answer has no valid errcode")
        errmsg = self._redact(str(data.get("errmsg", "")))[:200]
        raise ChannelDown(
            f"wechat {api}: errcode {code} {errmsg}".rstrip(),
            retry_after_s=RATE_LIMIT_WAIT_S if code == RATE_LIMITED else None,
        )

    def _redact(self, text: str) -> str:
        """WeChat's errmsg echoes no credential that we know of; this is in case it does."""
        for secret in (self._secret, self._token, self._robot_key, self._robot):
            if secret:
                text = text.replace(secret, "***")
        return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", text)


# ------------------------------------------------------------------------- what the cards say


def template_card(card: ApprovalCard, task_id: str) -> dict[str, Any]:
    """The `button_interaction` card for a pending approval; every value from a user is cut to
    its field's limit and put on one line."""
    quote: dict[str, Any] = {}
    if card.evidence:
        quote = {"quote_area": {"quote_text": _clip(" / ".join(card.evidence), QUOTE_LIMIT)}}
    return {
        "card_type": "button_interaction",
        "main_title": {
            "title": _clip(f"Approval #{card.approval_id}: {card.skill}", TITLE_LIMIT),
            "desc": _clip("nightshift asks before it acts", TITLE_DESC_LIMIT),
        },
        **quote,
        "sub_title_text": _clip(_summary(card), SUBTITLE_LIMIT),
        "horizontal_content_list": _arguments(card.args),
        "task_id": task_id,
        "button_list": [
            {"text": "Approve", "style": 1, "key": f"approve:{card.approval_id}"},
            {"text": "Reject", "style": 2, "key": f"reject:{card.approval_id}"},
        ],
    }


def outcome(card: ApprovalCard) -> str:
    """What the buttons become once decided: the same for approved and for the states after
    it (executing, executed, failed), so a later update would show nothing new."""
    if card.state == "expired":
        return "Expired"
    approve = card.state != "rejected"
    names = list(dict.fromkeys(v.principal for v in card.votes if v.approve == approve))
    verb = "Approved" if approve else "Rejected"
    text = f"{verb} by {', '.join(names)}" if names else verb
    return _clip(text, REPLACE_NAME_LIMIT)


def _summary(card: ApprovalCard) -> str:
    parts = [
        f"requested by {_clip(card.requester, 16)}",
        f"rule {_clip(card.rule, 16)}",
        f"{card.approvals}/{card.quorum} approvals",
    ]
    rejects = len({v.principal for v in card.votes if not v.approve})
    if rejects:
        parts.append(f"{rejects} rejected")
    parts.append(_expiry(card.expires_at))
    return " · ".join(parts)


def _expiry(expires_at: datetime | None) -> str:
    return "no expiry" if expires_at is None else f"expires {expires_at:%Y-%m-%d %H:%M} UTC"


def _arguments(args: dict[str, Any]) -> list[dict[str, str]]:
    """Up to six key arguments (the sixth says how many more there are)."""
    items = list(args.items())
    shown = items if len(items) <= HORIZONTAL_ITEMS else items[: HORIZONTAL_ITEMS - 1]
    out = [
        {"keyname": _clip(str(k), KEYNAME_LIMIT), "value": _clip(_text_of(v), VALUE_LIMIT)}
        for k, v in shown
    ]
    if len(items) > len(shown):
        out.append({"keyname": "…", "value": f"{len(items) - len(shown)} more"})
    return out


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


NOTICE_LABELS: dict[str, tuple[str, str]] = {  # kind: (label, WeChat's font color)
    "job_failed": ("failed", "warning"),
    "job_recovered": ("recovered", "info"),
    "job_finished": ("finished", "info"),
    "job_early_stopped": ("stopped early", "comment"),
    "report": ("report", "info"),
}


def markdown(notice: Notice, limit_bytes: int) -> str:
    """The notice as WeChat Work markdown, within `limit_bytes` of UTF-8: the title, as many
    whole lines as fit, and the notice's key last (which also makes each notice's content
    unique, for message/send's duplicate check)."""
    label, color = NOTICE_LABELS.get(notice.kind, (notice.kind, "comment"))
    head = f'<font color="{color}">{label}</font> **{inert(_clip(notice.title, 200))}**'
    foot = f'<font color="comment">nightshift · {inert(_clip(notice.key, 64))}</font>'
    lines, used = [head], len(head.encode()) + 1 + len(foot.encode())
    more = "…"
    for line in notice.lines:
        text = inert(_clip(line, 400))
        size = len(text.encode()) + 1
        if used + size + len(more.encode()) + 1 > limit_bytes:
            lines.append(more)
            break
        lines.append(text)
        used += size
    lines.append(foot)
    return "\n".join(lines)


# WeChat Work's markdown documents no escape character, so a user's text is made inert instead:
# the characters that open markup (a tag such as <font> or a robot's <@userid> mention, bold,
# inline code, a link, a heading, an entity) become look-alikes that the client shows as text.
_INERT = str.maketrans(
    {"<": "‹", ">": "›", "*": "∗", "`": "ˋ", "[": "［", "]": "］", "#": "＃", "&": "＆"}
)


def inert(text: str) -> str:
    return text.translate(_INERT)


def _clip(text: str, limit: int) -> str:
    """One line (whitespace runs, newlines included, become one space) at most `limit` 字 wide,
    ending in "…" when cut. WeChat Work gives its limits in 字, Chinese characters: a Latin
    letter is counted as half of one, a wide or ambiguous character (CJK, "…") as one."""
    text = " ".join(text.split())
    budget = 2 * limit
    if sum(map(_width, text)) <= budget:
        return text
    budget -= _width("…")
    kept = []
    for ch in text:
        budget -= _width(ch)
        if budget < 0:
            break
        kept.append(ch)
    return "".join(kept) + "…"


def _width(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F", "A") else 1


# ---------------------------------------------------------------------------- the callback


class WeComCallback:
    """Verifies WeChat Work's callbacks to the app's URL: the GET that proves the URL is ours,
    and the POSTed events, of which only a click on a card's button is a `Decision`."""

    def __init__(
        self,
        token: str,
        encoding_aes_key: str,
        corp_id: str,
        *,
        clock: Callable[[], float] = time.time,
        window_s: float = 300,
    ) -> None:
        if not token:
            raise ValueError("wechat.token is empty")
        if not corp_id:
            raise ValueError("wechat.corp_id is empty")
        self._token = token
        self._key = _aes_key(encoding_aes_key)
        self._corp_id = corp_id.encode()
        self._clock = clock
        self._window_s = window_s

    def __repr__(self) -> str:
        return f"WeComCallback(corp_id={self._corp_id.decode()!r}, window_s={self._window_s})"

    def verify_url(self, query: Mapping[str, str]) -> str:
        """The plaintext of `echostr`, which the GET must answer (as the whole body) to prove
        that this server holds the token and the key."""
        try:
            signature, timestamp, nonce = self._signed(query)
            echostr = _param(query, "echostr", status=400)
            self._check_signature(signature, timestamp, nonce, echostr)
            return self._decrypt(echostr).decode("utf-8")
        except BadCallback:
            raise
        except Exception as exc:  # nothing but BadCallback leaves here
            raise BadCallback(f"malformed callback ({type(exc).__name__})", status=400) from None

    def decide(self, query: Mapping[str, str], body: bytes) -> Decision:
        """The click a POSTed event is, once its timestamp, signature, encryption, corp id and
        shape check out."""
        try:
            return self._decide(query, body)
        except BadCallback:
            raise
        except Exception as exc:  # nothing but BadCallback leaves here
            raise BadCallback(f"malformed callback ({type(exc).__name__})", status=400) from None

    def _decide(self, query: Mapping[str, str], body: bytes) -> Decision:
        if not isinstance(body, bytes | bytearray):
            raise BadCallback("the body is not bytes", status=400)
        if len(body) > MAX_CALLBACK_BYTES:
            raise BadCallback("the body is over 64 KiB", status=400)
        signature, timestamp, nonce = self._signed(query)
        encrypted = _field(_xml(bytes(body), "the body"), "Encrypt")
        if not encrypted:
            raise BadCallback("the body has no Encrypt", status=400)
        self._check_signature(signature, timestamp, nonce, encrypted)
        event = _xml(self._decrypt(encrypted), "the message")
        if _field(event, "MsgType") != "event" or _field(event, "Event") != "template_card_event":
            raise BadCallback("not a template card event", status=400)
        card_type = _field(event, "CardType")
        if card_type and card_type != "button_interaction":
            raise BadCallback(f"not a button card ({_clip(card_type, 40)!r})", status=400)
        user, created = _field(event, "FromUserName"), _field(event, "CreateTime")
        task_id, key = _field(event, "TaskId"), _field(event, "EventKey")
        code = _field(event, "ResponseCode")
        if not USER_ID.fullmatch(user):
            raise BadCallback("bad FromUserName", status=400)
        if not re.fullmatch(r"[0-9]{1,12}", created):
            raise BadCallback("bad CreateTime", status=400)
        if not TASK_ID.fullmatch(task_id):
            raise BadCallback("bad TaskId", status=400)
        action = EVENT_KEY.fullmatch(key)
        if action is None:
            raise BadCallback(f"bad EventKey {_clip(key, 40)!r}", status=400)
        if code and not PRINTABLE.fullmatch(code):
            raise BadCallback("bad ResponseCode", status=400)
        return Decision(
            channel="wechat",
            user=user,
            approval_id=int(action.group(2)),
            approve=action.group(1) == "approve",
            replay_keys=(
                f"wechat-sig:{signature}",
                f"wechat-event:{user}:{created}:{task_id}:{key}",
            ),
            posted=Posted("wechat", {"response_code": code, "task_id": task_id}) if code else None,
        )

    def _signed(self, query: Mapping[str, str]) -> tuple[str, str, str]:
        """msg_signature, timestamp and nonce, the timestamp within the window."""
        signature = _param(query, "msg_signature")
        timestamp = _param(query, "timestamp")
        nonce = _param(query, "nonce")
        if not re.fullmatch(r"[0-9]{1,12}", timestamp):
            raise BadCallback("bad timestamp")
        if abs(self._clock() - int(timestamp)) > self._window_s:
            raise BadCallback("stale timestamp")
        if not PRINTABLE.fullmatch(nonce):
            raise BadCallback("bad nonce")
        return signature, timestamp, nonce

    def _check_signature(self, signature: str, timestamp: str, nonce: str, data: str) -> None:
        joined = "".join(sorted((self._token, timestamp, nonce, data)))
        expected = hashlib.sha1(joined.encode("utf-8", "surrogatepass")).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass")):
            raise BadCallback("bad msg_signature")

    def _decrypt(self, encrypted: str) -> bytes:
        """The message inside: random(16) + length(4, big-endian) + message + receive id."""
        try:
            raw = base64.b64decode(encrypted, validate=True)
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise BadCallback("the ciphertext is not base64", status=400) from None
        if not raw or len(raw) % 32:  # PKCS#7 to 32-byte blocks
            raise BadCallback("the ciphertext has a bad length", status=400)
        decryptor = Cipher(algorithms.AES(self._key), modes.CBC(self._key[:16])).decryptor()
        padded = decryptor.update(raw) + decryptor.finalize()
        unpadder = padding.PKCS7(256).unpadder()
        try:
            plain = unpadder.update(padded) + unpadder.finalize()
        except ValueError:
            raise BadCallback("bad padding (not our key, or tampered)", status=400) from None
        size = int.from_bytes(plain[16:20], "big")
        if len(plain) < 20 or size > len(plain) - 20:
            raise BadCallback("bad message length", status=400)
        if not hmac.compare_digest(plain[20 + size :], self._corp_id):
            raise BadCallback("the receive id is not our corp id", status=400)
        return plain[20 : 20 + size]


def _aes_key(encoding_aes_key: str) -> bytes:
    """The AES key: base64 of the 43-character EncodingAESKey with its "=" put back."""
    if not isinstance(encoding_aes_key, str) or not re.fullmatch(
        r"[A-Za-z0-9+/]{43}", encoding_aes_key
    ):
        raise ValueError(
            "wechat.encoding_aes_key must be the 43 letters and digits of the EncodingAESKey "
            "that WeChat Work shows for the app's callback"
        )
    key = base64.b64decode(encoding_aes_key + "=")
    if len(key) != 32:  # cannot happen for 43 base64 characters; kept as the rule itself
        raise ValueError("wechat.encoding_aes_key does not decode to a 32-byte key")
    return key


def _param(query: Mapping[str, str], name: str, *, status: int = 401) -> str:
    value = query.get(name)
    if not isinstance(value, str) or not value:
        raise BadCallback(f"missing {name}", status=status)
    return value


def _xml(data: bytes, what: str) -> Element:
    """A root <xml> element, parsed without DTDs, entities or external references."""
    try:
        root = parse_xml(data, forbid_dtd=True)
    except DefusedXmlException:
        raise BadCallback(f"{what}: XML with a DTD or entities is refused", status=400) from None
    except (ParseError, ValueError, LookupError):
        raise BadCallback(f"{what}: not XML", status=400) from None
    if root.tag != "xml":
        raise BadCallback(f"{what}: the root element is not <xml>", status=400)
    return root


def _field(root: Element, name: str) -> str:
    found = root.find(name)
    return (found.text or "").strip() if found is not None else ""


# ------------------------------------------------------------------------------------ helpers


def _errcode(data: dict[str, Any]) -> int | None:
    code = data.get("errcode", 0)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return float(r.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def _warn_undelivered(data: dict[str, Any]) -> None:
    missed = [str(data[k]) for k in ("invaliduser", "unlicenseduser") if data.get(k)]
    if missed:
        log.warning("wechat: the card did not reach %s", "; ".join(missed))


def _webhook_key(url: str) -> str:
    try:
        parsed = httpx.URL(url)
    except Exception:  # httpx's message may quote the URL, which holds the key
        raise ValueError("wechat.robot_webhook is not a URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError("wechat.robot_webhook must be an http(s) URL")
    return parsed.params.get("key", "")


class _MaskSecretQuery(logging.Filter):
    """httpx logs each request's URL at INFO; ours carry the app secret, the access token or
    the robot's key as query parameters."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", str(a))
                if isinstance(a, str | httpx.URL)
                else a
                for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", record.msg)
        return True


def _mask_secrets_in_httpx_logs() -> None:
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, _MaskSecretQuery) for f in logger.filters):
        logger.addFilter(_MaskSecretQuery())
