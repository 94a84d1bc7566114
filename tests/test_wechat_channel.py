"""The WeChat Work channel over real HTTP against a fake WeChat Work on loopback, and its callback
verification against events that wechatpy (an independent implementation) encrypts and signs."""

from __future__ import annotations

import base64
import logging
import re
import threading
import traceback
from dataclasses import replace
from datetime import datetime
from xml.sax.saxutils import escape

import pytest
from fake_wecom import (
    FakeWeCom,
    echo_query,
    encrypt,
    encrypted_body,
    encrypted_event,
    event_xml,
    new_aes_key,
    sign,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightshift.agent.doors.channels.base import (
    ApprovalCard,
    BadCallback,
    ChannelDown,
    Decision,
    Notice,
    Posted,
    Vote,
)
from nightshift.agent.doors.channels.wechat import WeComCallback, WeComChannel, outcome

ALICE = Vote("alice", True, "wechat:alice")
BOB = Vote("bob", True, "slack:U2")
CAROL_NO = Vote("carol", False, "wechat:carol")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def card(**changes) -> ApprovalCard:
    base = ApprovalCard(
        approval_id=7,
        skill="kill_job",
        args={"job_id": 12, "signal": "TERM"},
        requester="dave",
        rule="destructive",
        quorum=2,
        votes=(),
        state="pending",
        expires_at=datetime(2026, 12, 2, 3, 30),
        evidence=("job 12 mlp-long: running, owner dave, priority 1",),
    )
    return replace(base, **changes)


def notice(**changes) -> Notice:
    base = Notice(
        key="event:9",
        kind="job_failed",
        title="job 12 mlp-long failed: OOM",
        lines=("attempt 2, outcome oom", "next: halve the batch size"),
        job_id=12,
    )
    return replace(base, **changes)


@pytest.fixture
def wecom():
    with FakeWeCom() as fake:
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_channel(wecom: FakeWeCom, clock: Clock | None = None, **kw) -> WeComChannel:
    secret = kw.pop("secret", wecom.secret)
    args = {
        "approvers": ["alice", "bob.w"],
        "base_url": wecom.base_url,
        "robot_webhook": wecom.robot_webhook,
        "timeout_s": 5.0,
        "clock": clock or Clock(),
        **kw,
    }
    return WeComChannel(wecom.corp_id, wecom.agent_id, secret, **args)


@pytest.fixture
def channel(wecom, clock):
    with make_channel(wecom, clock) as ch:
        yield ch


def width(text: str) -> int:
    """Width in half-字 (a Latin letter 1, a CJK character 2), as the channel counts."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WFA" else 1 for c in text)


# --------------------------------------------------------------------------------- posting


def test_a_card_is_a_button_card_sent_to_the_approvers(channel, wecom):
    """What an approver sees: the approval, who asked, the rule, the votes, the expiry, the key
    arguments and two buttons that name the approval."""
    posted = channel.post_approval(card())
    body = wecom.last("message/send")
    assert (body["touser"], body["msgtype"], body["agentid"]) == (
        "alice|bob.w",
        "template_card",
        wecom.agent_id,
    )
    tc = body["template_card"]
    assert tc["card_type"] == "button_interaction"
    assert tc["main_title"]["title"] == "Approval #7: kill_job"
    for part in ("dave", "destructive", "0/2 approvals", "expires 2026-12-02 03:30 UTC"):
        assert part in tc["sub_title_text"]
    assert tc["horizontal_content_list"] == [
        {"keyname": "job_id", "value": "12"},
        {"keyname": "signal", "value": "TERM"},
    ]
    assert "job 12 mlp-long: running" in tc["quote_area"]["quote_text"]
    assert [(b["key"], b["text"]) for b in tc["button_list"]] == [
        ("approve:7", "Approve"),
        ("reject:7", "Reject"),
    ]
    assert posted == Posted(
        "wechat",
        {"response_code": posted.ref["response_code"], "task_id": tc["task_id"]},
    )
    assert wecom.last_card() == tc


def test_task_ids_are_new_on_every_post_and_in_wechats_charset(channel, wecom):
    """WeChat refuses a task id it has seen: a post retried (or a store started afresh) must
    not reuse one, and each must be 1-128 of [0-9a-zA-Z_-@]."""
    first = channel.post_approval(card())
    again = channel.post_approval(card())
    huge = channel.post_approval(card(approval_id=10**17))
    ids = [p.ref["task_id"] for p in (first, again, huge)]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"[0-9A-Za-z_@-]{1,128}", t) for t in ids)
    assert first.ref["response_code"] != again.ref["response_code"]


def test_values_from_users_are_cut_to_wechats_limits(channel, wecom):
    """Long or multi-line values (Latin or CJK) fit each field, on one line, and a card with
    many arguments shows five and a count; WeChat would otherwise cut them, or refuse the card
    and leave the approval unseen."""
    many = {f"argument_{i}": "v" * 100 + "\nsecond line" for i in range(20)}
    long = card(
        skill="删除任务" * 30,
        requester="r" * 300 + "\n# heading",
        rule="x" * 200,
        args=many,
        evidence=("e" * 500, "更多" * 200),
    )
    channel.post_approval(long)
    tc = wecom.last("message/send")["template_card"]
    assert width(tc["main_title"]["title"]) <= 2 * 36
    assert width(tc["sub_title_text"]) <= 2 * 112
    assert width(tc["quote_area"]["quote_text"]) <= 2 * 112
    items = tc["horizontal_content_list"]
    assert len(items) == 6 and items[-1] == {"keyname": "…", "value": "15 more"}
    assert all(width(i["keyname"]) <= 10 and width(i["value"]) <= 52 for i in items)
    texts = [tc["main_title"]["title"], tc["sub_title_text"], *(i["value"] for i in items)]
    assert not any("\n" in t for t in texts)
    assert "2/2" not in tc["sub_title_text"] and "0/2 approvals" in tc["sub_title_text"]


# -------------------------------------------------------------------------------- updating


def test_a_pending_card_is_not_updated_and_a_decided_one_is_once(channel, wecom):
    """A response code works once: a vote that leaves the card pending changes nothing (the
    card can still be updated), the decision replaces the buttons using the code and says the
    card is done, so the outbox shows no later state (executed)."""
    posted = channel.post_approval(card())
    assert channel.update_approval(posted, card(votes=(ALICE,))) is True
    assert "message/update_template_card" not in wecom.paths()

    approved = card(state="approved", votes=(ALICE, BOB))
    assert channel.update_approval(posted, approved) is False
    body = wecom.last("message/update_template_card")
    assert body == {
        "atall": 1,
        "agentid": wecom.agent_id,
        "response_code": posted.ref["response_code"],
        "button": {"replace_name": "Approved by alice, bob"},
    }
    assert wecom.replaced(posted.ref["task_id"]) == "Approved by alice, bob"


def test_a_used_code_is_refused_and_a_clicks_fresh_code_works(channel, wecom):
    """The fake refuses a code used before, as WeChat does (here a second process that does not
    know it was used); the code a click brings updates the card."""
    posted = channel.post_approval(card())
    decided = card(state="rejected", votes=(CAROL_NO,))
    channel.update_approval(posted, decided)
    with make_channel(wecom) as other:
        with pytest.raises(ChannelDown, match="update_template_card: errcode 40058"):
            other.update_approval(posted, decided)
        fresh = Posted("wechat", {**posted.ref, "response_code": wecom.new_response_code()})
        other.update_approval(fresh, decided)
    assert wecom.replaced(posted.ref["task_id"]) == "Rejected by carol"


def test_a_failed_update_can_be_retried_with_the_same_code(channel, wecom):
    """A code is only counted as used once WeChat took the update."""
    posted = channel.post_approval(card())
    wecom.errcode_next(-1, "system busy")
    with pytest.raises(ChannelDown, match="errcode -1"):
        channel.update_approval(posted, card(state="expired"))
    channel.update_approval(posted, card(state="expired"))
    assert wecom.replaced(posted.ref["task_id"]) == "Expired"


@pytest.mark.parametrize(
    ("state", "votes", "text"),
    [
        ("approved", (ALICE, BOB), "Approved by alice, bob"),
        ("executing", (ALICE, BOB, ALICE), "Approved by alice, bob"),
        ("executed", (ALICE, CAROL_NO, BOB), "Approved by alice, bob"),
        ("failed", (ALICE,), "Approved by alice"),
        ("approved", (), "Approved"),
        ("rejected", (ALICE, CAROL_NO), "Rejected by carol"),
        ("expired", (ALICE,), "Expired"),
        ("approved", tuple(Vote(f"person{i}", True, "x") for i in range(9)), None),
    ],
)
def test_the_outcome_on_the_buttons(state, votes, text):
    """Approved and the states after it read the same, so no later update has news to show;
    a long list of names is cut to fit a button."""
    got = outcome(card(state=state, votes=votes))
    if text is None:
        assert got.startswith("Approved by person0, ") and got.endswith("…")
        assert width(got) <= 40
    else:
        assert got == text


# ------------------------------------------------------------------------------- notifying


def test_a_notice_goes_to_the_approvers_and_the_robot(channel, wecom):
    channel.notify(notice())
    app = wecom.last("message/send")
    assert (app["touser"], app["msgtype"], app["agentid"]) == (
        "alice|bob.w",
        "markdown",
        wecom.agent_id,
    )
    assert app["enable_duplicate_check"] == 1
    content = app["markdown"]["content"]
    lines = content.splitlines()
    assert "**job 12 mlp-long failed: OOM**" in lines[0] and 'color="warning"' in lines[0]
    assert lines[1:3] == ["attempt 2, outcome oom", "next: halve the batch size"]
    assert "event:9" in lines[-1]
    robot = wecom.last("webhook/send")
    assert robot == {"msgtype": "markdown", "markdown": {"content": content}}


def test_markup_in_a_notice_is_made_inert(channel, wecom):
    """Text from jobs and users cannot mention people (<@all>), add links, bold or tags, nor
    start a line of its own: WeChat's markdown has no escape, so those characters become
    look-alikes."""
    evil = '<@all> **bold** [x](http://evil.example) `code` <font color="info">&lt;'
    channel.notify(notice(title=evil + "\n# heading", lines=("> quote " + evil,)))
    content = wecom.last("webhook/send")["markdown"]["content"]
    lines = content.splitlines()
    assert len(lines) == 3  # the title, the line, the key
    head = '<font color="warning">failed</font> **'
    assert lines[0].startswith(head) and lines[0].endswith("**")
    user_parts = lines[0][len(head) : -2] + "\n" + lines[1]
    for markup in ("<", ">", "**", "[x]", "`", "&lt;", "# heading"):
        assert markup not in user_parts
    assert "‹@all›" in user_parts and "＃ heading" in lines[0]


def test_a_long_notice_is_cut_to_whole_lines_within_each_limit(channel, wecom):
    """An app message takes 2048 bytes of markdown, a robot's 4096 (the fake refuses more)."""
    channel.notify(notice(lines=tuple(f"line {i} " + "数据" * 300 for i in range(100))))
    app = wecom.last("message/send")["markdown"]["content"]
    robot = wecom.last("webhook/send")["markdown"]["content"]
    assert len(app.encode()) <= 2048 < len(robot.encode()) <= 4096
    for content in (app, robot):
        lines = content.splitlines()
        assert lines[-2] == "…" and "event:9" in lines[-1]
        assert all(x.startswith("line ") and x.endswith("…") for x in lines[1:-2])


def test_without_approvers_notices_go_to_the_robot_only(wecom):
    """A robot needs no access token; a card needs someone to send it to."""
    with make_channel(wecom, approvers=[]) as robot_only:
        robot_only.notify(notice())
        assert wecom.paths() == ["webhook/send"]
        with pytest.raises(ChannelDown, match="no approvers"):
            robot_only.post_approval(card())


def test_a_notice_retried_after_the_robot_failed_reaches_the_approvers_once(channel, wecom):
    """The outbox retries the whole notice; WeChat's duplicate check (on content that ends with
    the notice's key) drops the second app message, and a rate limit asks for a minute."""
    wecom.errcode_next(45009, "api freq out of limit", path="webhook/send")
    with pytest.raises(ChannelDown, match="webhook/send: errcode 45009") as exc:
        channel.notify(notice())
    assert exc.value.retry_after_s == 60
    channel.notify(notice())
    app = [m for m in wecom.delivered if m.get("msgtype") == "markdown" and "robot" not in m]
    robot = [m for m in wecom.delivered if "robot" in m]
    assert (len(app), len(robot)) == (1, 1)
    assert len(wecom.bodies("message/send")) == 2


# ------------------------------------------------------------------------- the access token


def test_the_token_is_fetched_once_for_many_calls(channel, wecom):
    posted = channel.post_approval(card())
    channel.notify(notice())
    channel.update_approval(posted, card(state="expired"))
    assert wecom.tokens_issued == 1 and wecom.paths().count("gettoken") == 1


def test_the_token_is_fetched_again_before_it_expires(channel, wecom, clock):
    channel.notify(notice())
    clock.t += 7200 - 300 - 1
    channel.notify(notice(key="event:10"))
    assert wecom.tokens_issued == 1
    clock.t += 2
    channel.notify(notice(key="event:11"))
    assert wecom.tokens_issued == 2


def test_an_expired_token_is_refreshed_once_and_the_call_retried(channel, wecom):
    channel.notify(notice())
    wecom.expire_token()
    channel.notify(notice(key="event:10"))
    assert wecom.tokens_issued == 2
    assert wecom.paths()[-4:] == ["message/send", "gettoken", "message/send", "webhook/send"]


def test_a_token_error_after_the_refresh_is_channel_down(channel, wecom):
    """One refresh, not a loop."""
    wecom.errcode_next(42001)
    wecom.errcode_next(40014)
    with pytest.raises(ChannelDown, match="message/send: errcode 40014"):
        channel.post_approval(card())
    assert wecom.tokens_issued == 2


def test_a_wrong_secret_is_channel_down_without_retrying(wecom):
    with make_channel(wecom, secret="not-the-secret") as wrong:
        with pytest.raises(ChannelDown, match="gettoken: errcode 40001") as exc:
            wrong.notify(notice())
    assert "not-the-secret" not in str(exc.value)
    assert wecom.paths() == ["gettoken"]


def test_threads_share_one_token(channel, wecom):
    errors: list[Exception] = []

    def send(i: int) -> None:
        try:
            channel.notify(notice(key=f"event:{i}"))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and wecom.tokens_issued == 1
    assert len(wecom.bodies("webhook/send")) == 8


# ---------------------------------------------------------------------------------- failures


def test_a_down_wechat_is_channel_down(channel, wecom):
    posted = channel.post_approval(card())
    wecom.down = True
    for call in (
        lambda: channel.post_approval(card()),
        lambda: channel.notify(notice()),
        lambda: channel.update_approval(posted, card(state="expired")),
    ):
        with pytest.raises(ChannelDown, match="HTTP 503"):
            call()


def test_an_api_error_names_the_api_and_the_errcode(channel, wecom):
    wecom.errcode_next(-1, "system busy")
    with pytest.raises(ChannelDown, match=r"^wechat message/send: errcode -1 system busy$") as e:
        channel.post_approval(card())
    assert e.value.retry_after_s is None
    wecom.errcode_next(45009, "api freq out of limit")
    with pytest.raises(ChannelDown, match="errcode 45009") as e:
        channel.post_approval(card())
    assert e.value.retry_after_s == 60


def test_an_unreachable_or_slow_wechat_is_channel_down(wecom):
    gone = FakeWeCom()
    gone.stop()
    with make_channel(gone) as ch, pytest.raises(ChannelDown, match="gettoken: ConnectError"):
        ch.notify(notice())
    with make_channel(wecom, timeout_s=0.2) as ch:
        ch.notify(notice())
        wecom.delay_s = 0.6
        with pytest.raises(ChannelDown, match="message/send: timed out"):
            ch.post_approval(card())


def test_the_secret_the_token_and_the_webhook_key_never_show(wecom, caplog):
    """Not in an error (even when WeChat's errmsg echoes them), a traceback, the channel's repr
    nor a log line: httpx logs each URL at INFO, and ours carry them in the query."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with make_channel(wecom) as ch:
        seen.append(repr(ch))
        ch.notify(notice())
        token = next(q["access_token"] for p, q, _ in wecom.calls if p == "message/send")
        wecom.errcode_next(-1, f"echo {token} {wecom.secret} key={wecom.robot_key}")
        wecom.errcode_next(-1, f"robot {wecom.robot_webhook}", path="webhook/send")
        for call in (lambda: ch.post_approval(card()), lambda: ch.notify(notice())):
            with pytest.raises(ChannelDown) as exc:
                call()
            seen.append("".join(traceback.format_exception(exc.value)))
        wecom.down = True
        with pytest.raises(ChannelDown) as exc:
            ch.notify(notice())
        seen.append("".join(traceback.format_exception(exc.value)))
    seen.append(caplog.text)
    assert "HTTP Request: POST" in caplog.text  # httpx did log: the filter masked it
    for text in seen:
        for secret in (token, wecom.secret, wecom.robot_key):
            assert secret not in text


def test_settings_are_checked_at_construction(wecom):
    with pytest.raises(ValueError, match="wechat.approvers"):
        make_channel(wecom, approvers=["alice|everyone"])
    with pytest.raises(ValueError, match="approvers, a robot_webhook"):
        make_channel(wecom, approvers=[], robot_webhook=None)
    with pytest.raises(ValueError, match="wechat.robot_webhook") as exc:
        make_channel(wecom, robot_webhook="ftp://example/send?key=SECRETKEY")
    assert "SECRETKEY" not in str(exc.value)


# ---------------------------------------------------------------------------- the callback

TOKEN = "QDG6eK"
AES_KEY = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
CORP = "wx5823bf96d3bd56c7"
NOW = 1_780_000_000
TASK = "nightshift-7-0123456789abcdef"
CALLBACK = WeComCallback(TOKEN, AES_KEY, CORP, clock=lambda: NOW)


def click(**changes) -> tuple[dict[str, str], bytes]:
    args = {
        "user": "alice",
        "approval_id": 7,
        "approve": True,
        "task_id": TASK,
        "response_code": "rc-fresh-1",
        "timestamp": NOW,
        "nonce": "1372623149",
        **changes,
    }
    return encrypted_event(TOKEN, AES_KEY, CORP, **args)


def refused(query, body=None) -> BadCallback:
    with pytest.raises(BadCallback) as exc:
        if body is None:
            CALLBACK.verify_url(query)
        else:
            CALLBACK.decide(query, body)
    return exc.value


def resigned(query: dict[str, str], ciphertext: str) -> tuple[dict[str, str], bytes]:
    """The same request with another Encrypt, signed as WeChat would sign it."""
    body = f"<xml><ToUserName>{CORP}</ToUserName><Encrypt>{escape(ciphertext)}</Encrypt></xml>"
    signature = sign(TOKEN, query["timestamp"], query["nonce"], ciphertext)
    return {**query, "msg_signature": signature}, body.encode()


def ciphertext_of(body: bytes) -> bytes:
    match = re.search(rb"<!\[CDATA\[([A-Za-z0-9+/=]+)\]\]></Encrypt>", body)
    assert match is not None
    return base64.b64decode(match.group(1))


def test_the_url_verification_echoes_the_decrypted_echostr():
    query = echo_query(TOKEN, AES_KEY, CORP, echo="1616140317555161061", timestamp=NOW)
    assert CALLBACK.verify_url(query) == "1616140317555161061"


def test_a_url_verification_that_is_forged_stale_or_for_another_corp_is_refused():
    query = echo_query(TOKEN, AES_KEY, CORP, echo="42", timestamp=NOW)
    assert (
        refused({**query, "msg_signature": sign("other", NOW, query["nonce"], "x")}).status == 401
    )
    stale = echo_query(TOKEN, AES_KEY, CORP, echo="42", timestamp=NOW - 301)
    assert str(refused(stale)) == "stale timestamp"
    other = echo_query(TOKEN, AES_KEY, "wwsomeoneelse", echo="42", timestamp=NOW)
    assert (str(refused(other)), refused(other).status) == (
        "the receive id is not our corp id",
        400,
    )
    assert refused({k: v for k, v in query.items() if k != "echostr"}).status == 400


def test_a_click_is_a_decision():
    query, body = click()
    assert CALLBACK.decide(query, body) == Decision(
        channel="wechat",
        user="alice",
        approval_id=7,
        approve=True,
        replay_keys=(
            f"wechat-sig:{query['msg_signature']}",
            f"wechat-event:alice:{NOW}:{TASK}:approve:7",
        ),
        posted=Posted("wechat", {"response_code": "rc-fresh-1", "task_id": TASK}),
    )
    reject = CALLBACK.decide(*click(user="carol.w", approve=False, approval_id=123))
    assert (reject.user, reject.approval_id, reject.approve) == ("carol.w", 123, False)
    assert reject.principal == "wechat:carol.w"


def test_a_click_sent_twice_keeps_its_event_key():
    """WeChat retries a callback it got no answer to, with a new nonce and timestamp: the
    signature differs, the event's own key does not."""
    first = CALLBACK.decide(*click(create_time=NOW - 5))
    again = CALLBACK.decide(*click(create_time=NOW - 5, timestamp=NOW + 3, nonce="99"))
    assert first.replay_keys[0] != again.replay_keys[0]
    assert first.replay_keys[1] == again.replay_keys[1]


def test_the_clicks_response_code_updates_the_card(channel, wecom):
    """End to end: post, click (WeChat gives the click a fresh code), decide, update with it."""
    posted = channel.post_approval(card())
    channel.update_approval(posted, card(state="approved", votes=(ALICE, BOB)))  # uses it
    task_id = posted.ref["task_id"]
    query, body = click(
        task_id=task_id, response_code=wecom.new_response_code(task_id), approve=False
    )
    decision = CALLBACK.decide(query, body)
    assert decision.posted is not None
    channel.update_approval(decision.posted, card(state="rejected", votes=(CAROL_NO,)))
    assert wecom.replaced(task_id) == "Rejected by carol"


def test_a_forged_or_missing_signature_is_refused_before_decrypting():
    query, body = click()
    flip = {c: "1" if c == "0" else "0" for c in "0123456789abcdef"}  # the last digit, changed
    for forged in (
        {**query, "msg_signature": sign("not-our-token", NOW, query["nonce"], "x")},
        {**query, "msg_signature": query["msg_signature"][:-1] + flip[query["msg_signature"][-1]]},
        {**query, "msg_signature": query["msg_signature"].upper() + "é"},
        {**query, "nonce": "1372623150"},
    ):
        error = refused(forged, body)
        assert (str(error), error.status) == ("bad msg_signature", 401)
    for name in ("msg_signature", "timestamp", "nonce"):
        error = refused({k: v for k, v in query.items() if k != name}, body)
        assert (str(error), error.status) == (f"missing {name}", 401)


@pytest.mark.parametrize("offset", [-301, 301, -10_000_000])
def test_a_stale_timestamp_is_refused(offset):
    error = refused(*click(timestamp=NOW + offset))
    assert (str(error), error.status) == ("stale timestamp", 401)


def test_a_timestamp_inside_the_window_is_fine_and_a_non_number_is_not():
    assert CALLBACK.decide(*click(timestamp=NOW - 299)).approve
    query, body = click()
    assert str(refused({**query, "timestamp": "17e8"}, body)) == "bad timestamp"


def test_an_event_for_another_corp_is_refused():
    error = refused(*click(receive_id="wwsomeoneelse"))
    assert (str(error), error.status) == ("the receive id is not our corp id", 400)


def test_a_tampered_ciphertext_is_refused():
    """CBC has no integrity of its own; a signed but altered ciphertext must still fail: here
    the last padding byte (flipping the block before it) and the length field."""
    query, body = click()
    raw = bytearray(ciphertext_of(body))
    raw[-17] ^= 0xFF  # padding byte p becomes p ^ 0xFF > 32
    error = refused(*resigned(query, base64.b64encode(bytes(raw)).decode()))
    assert (str(error), error.status) == ("bad padding (not our key, or tampered)", 400)
    raw = bytearray(ciphertext_of(body))
    raw[0] ^= 0x80  # the length's first byte, in the second plaintext block
    assert str(refused(*resigned(query, base64.b64encode(bytes(raw)).decode()))) == (
        "bad message length"
    )
    for broken, reason in (
        ("not base64!", "the ciphertext is not base64"),
        (base64.b64encode(b"x" * 48).decode(), "the ciphertext has a bad length"),
    ):
        assert str(refused(*resigned(query, broken))) == reason


def test_an_event_encrypted_with_another_key_is_refused():
    error = refused(*encrypted_event(TOKEN, new_aes_key(), CORP, **_click_args()))
    assert error.status == 400


def _click_args() -> dict:
    return {
        "user": "alice",
        "approval_id": 7,
        "approve": True,
        "task_id": TASK,
        "response_code": "rc",
        "timestamp": NOW,
        "nonce": "5",
    }


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE xml [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<xml><Encrypt>&lol4;</Encrypt></xml>"""

EXTERNAL = b"""<?xml version="1.0"?>
<!DOCTYPE xml [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<xml><Encrypt>&x;</Encrypt></xml>"""


def test_a_body_that_is_not_xml_or_too_big_is_refused():
    query, _ = click()
    for body, reason in (
        (b"not xml at all", "the body: not XML"),
        (b"", "the body: not XML"),
        (b"<html><Encrypt>x</Encrypt></html>", "the body: the root element is not <xml>"),
        (b"<xml><ToUserName>x</ToUserName></xml>", "the body has no Encrypt"),
        (b"<xml>" + b" " * (64 * 1024) + b"</xml>", "the body is over 64 KiB"),
    ):
        error = refused(query, body)
        assert (str(error), error.status) == (reason, 400)


@pytest.mark.parametrize("body", [BILLION_LAUGHS, EXTERNAL])
def test_xml_with_a_dtd_or_entities_is_refused(body):
    query, _ = click()
    error = refused(query, body)
    assert (str(error), error.status) == ("the body: XML with a DTD or entities is refused", 400)


def test_an_encrypted_message_with_a_dtd_is_refused():
    query, body = encrypted_body(
        TOKEN, AES_KEY, CORP, BILLION_LAUGHS.decode(), timestamp=NOW, nonce="7"
    )
    assert str(refused(query, body)) == "the message: XML with a DTD or entities is refused"


@pytest.mark.parametrize(
    "changes",
    [{"msg_type": "text"}, {"event": "click"}, {"event": "template_card_menu_event"}],
)
def test_other_events_are_refused(changes):
    error = refused(*click(**changes))
    assert (str(error), error.status) == ("not a template card event", 400)


def test_a_click_on_another_kind_of_card_is_refused():
    plaintext = event_xml(
        CORP,
        user="alice",
        event_key="approve:7",
        task_id=TASK,
        response_code="rc",
        create_time=NOW,
        card_type="vote_interaction",
    )
    query, body = encrypted_body(TOKEN, AES_KEY, CORP, plaintext, timestamp=NOW, nonce="8")
    assert str(refused(query, body)).startswith("not a button card")


@pytest.mark.parametrize(
    "key",
    ["approve:abc", "delete:7", "approve:", "approve:7:extra", "approve:-1", "", "Approve:7"],
)
def test_a_bad_event_key_is_refused(key):
    error = refused(*click(event_key=key))
    assert str(error).startswith("bad EventKey") and error.status == 400


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"user": "alice bob"}, "bad FromUserName"),
        ({"user": ""}, "bad FromUserName"),
        ({"create_time": "yesterday"}, "bad CreateTime"),
        ({"task_id": "task id with spaces"}, "bad TaskId"),
        ({"response_code": "code with spaces"}, "bad ResponseCode"),
    ],
)
def test_bad_event_fields_are_refused(changes, reason):
    assert str(refused(*click(**changes))) == reason


def test_a_click_without_a_response_code_still_counts():
    assert CALLBACK.decide(*click(response_code="")).posted is None


@pytest.mark.parametrize(
    "key",
    ["", "short", AES_KEY + "A", AES_KEY[:-1] + "!", AES_KEY[:-1] + "=", 43 * "é"],
)
def test_a_bad_encoding_aes_key_is_a_setting_error(key):
    with pytest.raises(ValueError, match="wechat.encoding_aes_key") as exc:
        WeComCallback(TOKEN, key, CORP)
    if key:
        assert key not in str(exc.value)


# -------------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
names = st.sampled_from(["msg_signature", "timestamp", "nonce", "echostr", "other"])
texts = st.text(max_size=80)


def decision_or_bad_callback(query, body) -> None:
    try:
        got = CALLBACK.decide(query, body)
    except BadCallback as exc:
        assert exc.status in (400, 401)
    else:
        assert isinstance(got, Decision)


@FUZZ
@given(query=st.dictionaries(names, texts), body=st.binary(max_size=400))
def test_fuzz_any_request_is_a_decision_or_bad_callback(query, body):
    decision_or_bad_callback(query, body)
    try:
        CALLBACK.verify_url(query)
    except BadCallback as exc:
        assert exc.status in (400, 401)


blocks = st.integers(1, 8).flatmap(lambda n: st.binary(min_size=32 * n, max_size=32 * n))


@FUZZ
@given(
    ciphertext=st.one_of(
        texts,
        st.one_of(st.binary(max_size=200), blocks).map(lambda b: base64.b64encode(b).decode()),
    )
)
def test_fuzz_signed_ciphertexts(ciphertext):
    """Past the signature, any ciphertext: the decryption's checks."""
    query = {"timestamp": str(NOW), "nonce": "123"}
    decision_or_bad_callback(*resigned(query, ciphertext))


@FUZZ
@given(
    plaintext=st.one_of(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300),
        st.builds(
            lambda user, key, task, code, created: event_xml(
                CORP,
                user=user,
                event_key=key,
                task_id=task,
                response_code=code,
                create_time=created,
            ),
            st.one_of(st.just("alice"), st.text(alphabet="abc.@-_ |<", max_size=10)),
            st.one_of(st.sampled_from(["approve:1", "reject:99"]), texts.map(escape)),
            st.one_of(st.just(TASK), st.text(alphabet="ab-_@ ", max_size=10)),
            st.text(alphabet="xyz ]", max_size=10),
            st.one_of(st.just(NOW), texts.map(escape)),
        ),
    ),
    receive_id=st.one_of(st.just(CORP), st.sampled_from(["", "other"])),
)
def test_fuzz_encrypted_messages(plaintext, receive_id):
    """Past the decryption, any message (and receive id): the event's checks."""
    query, body = encrypted_body(TOKEN, AES_KEY, receive_id, plaintext, timestamp=NOW, nonce="9")
    decision_or_bad_callback(query, body)


def test_encrypt_helper_agrees_with_hashlib():
    """The helpers' two implementations of the signature (wechatpy's and hashlib's) agree."""
    ciphertext, signature = encrypt(TOKEN, AES_KEY, CORP, "<xml/>", timestamp=NOW, nonce="1")
    assert signature == sign(TOKEN, NOW, "1", ciphertext)
