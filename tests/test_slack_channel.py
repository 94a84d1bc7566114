"""The Slack channel against a fake Slack on loopback, through the real `slack_sdk` clients:
cards, updates and notices as Slack receives them, failures as ChannelDown, and clicks (signed
HTTP and Socket Mode) as Decisions or refusals."""

from __future__ import annotations

import html
import json
import socket
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from fake_slack import (
    FakeSlack,
    block_actions_body,
    block_actions_payload,
    interactive_envelope,
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
from nightshift.agent.doors.channels.slack import (
    MAX_BODY,
    SlackChannel,
    SlackInteractivity,
    SlackSocketMode,
    fit,
)

TOKEN = "xoxb-1234-5678-secretbottoken"
APP_TOKEN = "xapp-1-A0FAKE-secretapptoken"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_733_300_100


def wait_for(cond: Callable[[], object], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.01)


def make_card(**over: Any) -> ApprovalCard:
    fields: dict[str, Any] = dict(
        approval_id=7,
        skill="kill_job",
        args={"job_id": 12, "reason": "stalled for 40 min"},
        requester="planner",
        rule="destructive-needs-two",
        quorum=2,
        votes=(),
        state="pending",
        expires_at=datetime(2026, 12, 2, 3, 15, 42),
        evidence=("job 12 mlp-long: running, no step for 40 min", "GPU 1 at 0% for 38 min"),
    )
    fields.update(over)
    return ApprovalCard(**fields)


def alice_bob() -> tuple[Vote, ...]:
    return (Vote("alice", True, "slack:UA"), Vote("bob", True, "cli"))


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(token=TOKEN, app_token=APP_TOKEN) as fake:
        yield fake


@pytest.fixture
def channel(slack: FakeSlack) -> SlackChannel:
    return SlackChannel(
        TOKEN,
        approvals_channel="C_APPROVALS",
        notify_channel="C_NOTIFY",
        base_url=slack.base_url,
        timeout_s=2,
    )


def by_type(blocks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [b for b in blocks if b["type"] == kind]


def text_objects(node: Any) -> Iterator[dict[str, Any]]:
    """Every text object in a block tree."""
    if isinstance(node, dict):
        if node.get("type") in ("mrkdwn", "plain_text") and "text" in node:
            yield node
        for value in node.values():
            yield from text_objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from text_objects(value)


def all_text(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(t["text"] for t in text_objects(blocks))


# --- the Web API ---------------------------------------------------------------------------


def test_post_approval_sends_a_card_with_approve_and_reject(slack, channel):
    """The card carries what a person needs to decide and the two buttons the callback
    endpoint knows (ids, values, a confirm on Approve)."""
    posted = channel.post_approval(make_card(votes=(Vote("alice", True, "slack:UA"),)))

    assert posted == Posted("slack", {"channel": "C_APPROVALS", "ts": "1733300000.000100"})
    params = slack.last("chat.postMessage")
    assert params["channel"] == "C_APPROVALS"
    assert "Approval 7" in params["text"] and "kill_job" in params["text"]
    blocks = params["blocks"]
    assert by_type(blocks, "header")[0]["text"]["text"] == "Approval 7: kill_job"
    text = all_text(blocks)
    for shown in ("planner", "destructive-needs-two", "*Quorum* 2", "1 of 2 (alice)"):
        assert shown in text
    assert "2026-12-02T03:15Z" in text
    assert '"job_id": 12' in text and "```" in text
    assert "GPU 1 at 0% for 38 min" in all_text(by_type(blocks, "context"))
    (actions,) = by_type(blocks, "actions")
    assert actions["block_id"] == "nightshift_approval_7"
    approve, reject = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["value"]) == (
        "nightshift_approve",
        "primary",
        "7",
    )
    assert (reject["action_id"], reject["style"], reject["value"]) == (
        "nightshift_reject",
        "danger",
        "7",
    )
    assert "confirm" in approve and approve["confirm"]["confirm"]["text"] == "Approve"
    assert params["unfurl_links"] is False and params["link_names"] is False


def test_update_keeps_buttons_while_pending_and_shows_votes(slack, channel):
    posted = channel.post_approval(make_card())
    channel.update_approval(posted, make_card(votes=(Vote("alice", True, "slack:UA"),)))

    params = slack.last("chat.update")
    assert (params["channel"], params["ts"]) == ("C_APPROVALS", posted.ref["ts"])
    assert by_type(params["blocks"], "actions")
    assert "alice approved" in all_text(params["blocks"])
    assert slack.messages[("C_APPROVALS", posted.ref["ts"])]["blocks"] == params["blocks"]


@pytest.mark.parametrize(
    ("state", "votes", "shown"),
    [
        ("approved", alice_bob(), "approved by alice, bob"),
        ("rejected", (Vote("carol", False, "slack:UC"),), "rejected by carol"),
        ("expired", (), "expired"),
        ("executed", alice_bob(), "executed"),
        ("failed", alice_bob(), "failed"),
    ],
)
def test_decided_card_shows_the_outcome_without_buttons(slack, channel, state, votes, shown):
    """Once decided, nobody can click: the buttons go and the outcome takes their place."""
    posted = channel.post_approval(make_card())
    channel.update_approval(posted, make_card(state=state, votes=votes))

    blocks = slack.messages[("C_APPROVALS", posted.ref["ts"])]["blocks"]
    assert not by_type(blocks, "actions")
    assert shown in all_text(blocks)


def test_user_values_cannot_ping_anyone(slack, channel):
    """A job name or argument with `<!channel>` or `<@U1>` arrives escaped, and every mrkdwn
    object is verbatim (no automatic @-mentions or links)."""
    card = make_card(
        skill="<!channel>",
        requester="<@U1> & co",
        rule="<!here>",
        args={"name": "<!channel> <@U2> <#C1> <https://evil.example|click>"},
        evidence=("<!subteam^S1> said so",),
        votes=(Vote("<@U3>", True, "slack:U3"),),
    )
    channel.post_approval(card)
    channel.notify(Notice("event:1", "job_failed", "job <!channel> failed", ("<@U4> look",)))

    assert slack.methods() == ["chat.postMessage", "chat.postMessage"]
    for _, params in slack.calls:
        assert "<" not in params["text"]
        for obj in text_objects(params["blocks"]):
            if obj["type"] == "mrkdwn":
                assert "<" not in obj["text"] and ">" not in obj["text"]
                assert obj["verbatim"] is True
    card_blocks = slack.calls[0][1]["blocks"]
    assert "&lt;!channel&gt; &lt;@U2&gt;" in all_text(card_blocks)
    assert "&lt;@U1&gt; &amp; co" in all_text(card_blocks)


def test_everything_fits_block_kit_limits(slack, channel):
    """Huge arguments, names and reports are cut so Slack accepts the message."""
    card = make_card(
        skill="s" * 500,
        requester="<" * 5000,
        args={"blob": "<&>" * 50_000, "many": list(range(5000))},
        evidence=tuple("e<" * 700 for _ in range(200)),
        votes=tuple(Vote(f"user{i}", True, "cli") for i in range(300)),
    )
    channel.post_approval(card)
    channel.notify(Notice("report:x", "report", "t" * 5000, tuple("l&" * 2000 for _ in range(500))))

    for _, params in slack.calls:
        blocks = params["blocks"]
        assert len(blocks) <= 50
        for block in blocks:
            if block["type"] == "header":
                assert len(block["text"]["text"]) <= 150
            if block["type"] in ("section", "context"):
                for obj in text_objects(block):
                    assert 0 < len(obj["text"]) <= 3000
            for obj in text_objects(block.get("elements", [])):
                if block["type"] == "actions":
                    assert len(obj["text"]) <= 300
        assert len(params["text"]) <= 3000
    args_text = by_type(slack.calls[0][1]["blocks"], "section")[1]["text"]["text"]
    assert args_text.endswith("…```") and "&l…" not in args_text


def test_notify_posts_title_and_lines_to_the_notify_channel(slack, channel):
    channel.notify(
        Notice("event:9", "job_failed", "job 7 mlp-long failed", ("OOM at step 812",), job_id=7)
    )
    params = slack.last("chat.postMessage")
    assert params["channel"] == "C_NOTIFY"
    assert params["text"] == "job 7 mlp-long failed"
    blocks = params["blocks"]
    assert "*job 7 mlp-long failed*" in blocks[0]["text"]["text"]
    assert "OOM at step 812" in blocks[1]["text"]["text"]
    assert "job 7" in all_text(by_type(blocks, "context"))


def test_notify_falls_back_to_the_approvals_channel(slack):
    channel = SlackChannel(TOKEN, approvals_channel="C_APPROVALS", base_url=slack.base_url)
    channel.notify(Notice("report:2026-12-04", "report", "Night report"))
    assert slack.last("chat.postMessage")["channel"] == "C_APPROVALS"


def assert_no_token(e: BaseException, channel: SlackChannel) -> None:
    shown = "".join(traceback.format_exception(e)) + repr(channel) + str(e)
    assert TOKEN not in shown and "secretbottoken" not in shown


def test_slack_down_is_channel_down(slack, channel):
    slack.down = True
    with pytest.raises(ChannelDown) as err:
        channel.post_approval(make_card())
    assert "chat.postMessage" in str(err.value) and "503" in str(err.value)
    assert err.value.retry_after_s is None
    assert_no_token(err.value, channel)


def test_rate_limit_carries_retry_after(slack, channel):
    slack.ratelimit_next(1, retry_after=7)
    with pytest.raises(ChannelDown) as err:
        channel.notify(Notice("event:1", "job_finished", "done"))
    assert err.value.retry_after_s == 7
    assert "ratelimited" in str(err.value) and "429" in str(err.value)
    assert_no_token(err.value, channel)
    channel.notify(Notice("event:1", "job_finished", "done"))  # the next call goes through


def test_api_errors_name_slacks_code(slack, channel):
    posted = channel.post_approval(make_card())
    slack.error_next("channel_not_found")
    with pytest.raises(ChannelDown, match="chat.postMessage.*channel_not_found"):
        channel.post_approval(make_card())
    with pytest.raises(ChannelDown, match="chat.update.*message_not_found"):
        channel.update_approval(
            Posted("slack", {"channel": "C_APPROVALS", "ts": "1.2"}), make_card()
        )
    channel.update_approval(posted, make_card(state="expired"))


def test_wrong_token_is_refused_without_showing_it(slack):
    channel = SlackChannel(
        "xoxb-wrong-secretbottoken", approvals_channel="C1", base_url=slack.base_url
    )
    with pytest.raises(ChannelDown, match="invalid_auth") as err:
        channel.post_approval(make_card())
    assert "secretbottoken" not in "".join(traceback.format_exception(err.value))
    assert "secretbottoken" not in repr(channel)


def test_unreachable_and_silent_servers_are_channel_down():
    """Connection refused and a server that never answers both end within the timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    refused = SlackChannel(
        TOKEN, approvals_channel="C1", base_url=f"http://127.0.0.1:{closed_port}/api/"
    )
    with pytest.raises(ChannelDown, match="chat.postMessage"):
        refused.post_approval(make_card())

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        hanging = SlackChannel(
            TOKEN, approvals_channel="C1", base_url=f"http://127.0.0.1:{port}/api/", timeout_s=0.3
        )
        start = time.monotonic()
        with pytest.raises(ChannelDown) as err:
            hanging.notify(Notice("event:1", "job_finished", "done"))
        assert time.monotonic() - start < 2
        assert_no_token(err.value, hanging)


# --- interactivity (signed HTTP) --------------------------------------------------------------


def interactivity(now: float = NOW, **kw: Any) -> SlackInteractivity:
    return SlackInteractivity(SECRET, clock=lambda: now, **kw)


def signed(payload: dict[str, Any] | None = None, body: bytes | None = None, ts: int = NOW):
    if body is None:
        body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    return sign(SECRET, body, ts), body


def test_a_signed_click_is_a_decision():
    body = block_actions_body("U024BE7LH", 7, True, channel="C9", ts="1733300000.000500")
    headers = sign(SECRET, body, NOW)

    decision = interactivity().decide(headers, body)

    assert decision == Decision(
        channel="slack",
        user="U024BE7LH",
        approval_id=7,
        approve=True,
        replay_keys=(
            "slack-sig:" + headers["X-Slack-Signature"],
            "slack-trigger:13345224609.738474920.8088930838d88f008e0",
        ),
        posted=Posted("slack", {"channel": "C9", "ts": "1733300000.000500"}),
    )
    assert decision.principal == "slack:U024BE7LH"
    lower = {k.lower(): v for k, v in headers.items()}
    assert interactivity(NOW + 299).decide(lower, body).approve is True


def test_reject_click_and_clock_skew_within_the_window():
    body = block_actions_body("U1", 3, False)
    assert interactivity(NOW - 250).decide(sign(SECRET, body, NOW), body).approve is False


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (sign("another-secret", block_actions_body("U1", 7, True), NOW), "signature mismatch"),
        ({**sign(SECRET, b"", NOW), "X-Slack-Signature": "v0=" + "0" * 64}, "signature mismatch"),
        ({**sign(SECRET, b"", NOW), "X-Slack-Signature": "v1=abc"}, "signature mismatch"),
        ({"X-Slack-Request-Timestamp": str(NOW)}, "missing"),
        ({"X-Slack-Signature": "v0=" + "0" * 64}, "missing"),
        ({}, "missing"),
        ({**sign(SECRET, b"", NOW), "X-Slack-Request-Timestamp": "17333e5"}, "non-numeric"),
    ],
)
def test_unsigned_or_forged_clicks_are_refused(headers, reason):
    body = block_actions_body("U1", 7, True)
    with pytest.raises(BadCallback, match=reason) as err:
        interactivity().decide(headers, body)
    assert err.value.status == 401


def test_a_body_changed_after_signing_is_refused():
    headers = sign(SECRET, block_actions_body("U1", 7, False), NOW)
    with pytest.raises(BadCallback, match="signature mismatch"):
        interactivity().decide(headers, block_actions_body("U1", 7, True))


@pytest.mark.parametrize("skew", [301, -301, 10_000_000])
def test_stale_timestamps_are_refused_even_when_signed(skew):
    """A captured request replayed later (or a clock far off) is refused."""
    body = block_actions_body("U1", 7, True)
    with pytest.raises(BadCallback, match="stale timestamp") as err:
        interactivity(NOW + skew).decide(sign(SECRET, body, NOW), body)
    assert err.value.status == 401
    with pytest.raises(BadCallback, match="stale timestamp"):
        interactivity(NOW + 61, window_s=60).decide(sign(SECRET, body, NOW), body)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"type": "view_submission"}, "not block_actions"),
        ({"actions": []}, "no action"),
        ({"user": {"name": "x"}}, "missing user id"),
        ({"user": {"id": "U1\n<@U2>"}}, "user id"),
    ],
)
def test_payloads_that_are_not_our_clicks_are_refused(change, reason):
    payload = {**block_actions_payload("U1", 7, True), **change}
    headers, body = signed(payload)
    with pytest.raises(BadCallback, match=reason) as err:
        interactivity().decide(headers, body)
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("action_id", "value", "reason"),
    [
        ("nightshift_delete", "7", "action_id"),
        ("approve", "7", "action_id"),
        (None, "0", "positive integer"),
        (None, "-7", "positive integer"),
        (None, "7.0", "positive integer"),
        (None, "٧", "positive integer"),
        (None, "", "positive integer"),
        (None, "8", "block_id"),  # the value does not match the card's block
    ],
)
def test_actions_we_never_posted_are_refused(action_id, value, reason):
    body = block_actions_body("U1", 7, True, action_id=action_id, value=value)
    with pytest.raises(BadCallback, match=reason) as err:
        interactivity().decide(sign(SECRET, body, NOW), body)
    assert err.value.status == 400


@pytest.mark.parametrize(
    "body",
    [b'{"type": "block_actions"}', b"payload=%7Bnot-json", b"payload=1&payload=2", b"a=1", b""],
)
def test_bodies_that_are_not_form_payloads_are_refused(body):
    with pytest.raises(BadCallback, match="form-encoded") as err:
        interactivity().decide(sign(SECRET, body, NOW), body)
    assert err.value.status == 400


def test_oversize_bodies_are_refused_before_anything_else():
    body = b"payload=" + b"x" * MAX_BODY
    with pytest.raises(BadCallback, match="too large") as err:
        interactivity().decide(sign(SECRET, body, NOW), body)
    assert err.value.status == 413


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)


def _payload_variants() -> st.SearchStrategy[Any]:
    """Payloads near a real click (one field replaced by anything) and arbitrary JSON."""
    base = block_actions_payload("U1", 7, True)

    def mutate(path_value: tuple[str, Any]) -> dict[str, Any]:
        key, value = path_value
        payload = json.loads(json.dumps(base))
        if key.startswith("action."):
            payload["actions"][0][key[len("action.") :]] = value
        else:
            payload[key] = value
        return payload

    keys = st.sampled_from(
        ["type", "user", "actions", "container", "trigger_id"]
        + ["action.action_id", "action.value", "action.block_id", "action.action_ts"]
    )
    return st.tuples(keys, _json).map(mutate) | _json


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=300),
    headers=st.dictionaries(
        st.sampled_from(["X-Slack-Signature", "x-slack-request-timestamp", "Other"])
        | st.text(max_size=10),
        st.text(max_size=80),
        max_size=4,
    ),
    payload=_payload_variants(),
    ts=st.integers(min_value=NOW - 400, max_value=NOW + 400),
)
def test_decide_only_ever_returns_a_decision_or_refuses(body, headers, payload, ts):
    """Whatever arrives, forged or validly signed around any payload, decide() returns a
    Decision or raises BadCallback: never another exception."""
    inter = interactivity()
    for h, b in [
        (headers, body),
        ({**sign(SECRET, body, ts), **headers}, body),
        signed(payload, ts=ts),
    ]:
        try:
            decision = inter.decide(h, b)
        except BadCallback as e:
            assert e.status in (400, 401, 413) and str(e)
        else:
            assert decision.approval_id > 0 and decision.replay_keys[0].startswith("slack-sig:v0=")


# --- Socket Mode --------------------------------------------------------------------------------


@pytest.fixture
def socket_mode(slack: FakeSlack) -> Iterator[tuple[SlackSocketMode, list, list]]:
    decisions: list[Decision] = []
    refused: list[str] = []
    client = SlackSocketMode(
        APP_TOKEN, on_decision=decisions.append, on_refused=refused.append, base_url=slack.base_url
    )
    client.start()
    try:
        wait_for(slack.socket_connected)
        yield client, decisions, refused
    finally:
        started = time.monotonic()
        client.stop()
        assert time.monotonic() - started < 1.0  # the SDK alone takes 1-3 s
        wait_for(lambda: not slack.socket_connected())
        assert slack.methods().count("apps.connections.open") == 1  # and it did not reconnect


def test_socket_mode_click_is_acked_and_decided(slack, socket_mode):
    """Slack pushes a click over the WebSocket; the client acks the envelope and hands on the
    Decision, keyed by the envelope and the trigger."""
    client, decisions, refused = socket_mode
    assert client.connected and "apps.connections.open" in slack.methods()

    payload = block_actions_payload("U024BE7LH", 7, False, channel="C5", ts="1733300000.000200")
    slack.socket_send(interactive_envelope(payload, envelope_id="57d6a792-4d35"))
    wait_for(lambda: decisions)

    assert decisions == [
        Decision(
            channel="slack",
            user="U024BE7LH",
            approval_id=7,
            approve=False,
            replay_keys=(
                "slack-envelope:57d6a792-4d35",
                "slack-trigger:13345224609.738474920.8088930838d88f008e0",
            ),
            posted=Posted("slack", {"channel": "C5", "ts": "1733300000.000200"}),
        )
    ]
    wait_for(lambda: slack.socket_acks)
    assert slack.socket_acks == [{"envelope_id": "57d6a792-4d35"}]
    assert not refused


def test_socket_mode_malformed_envelopes_are_refused_and_acked(slack, socket_mode):
    """Malformed envelopes go to on_refused (acked, so Slack does not resend them); the
    listener survives them and still decides the next good click."""
    _, decisions, refused = socket_mode
    bad_value = block_actions_payload("U1", 7, True, value="seven")
    slack.socket_send(interactive_envelope(bad_value, envelope_id="e1"))
    slack.socket_send({"envelope_id": "e2", "type": "interactive", "payload": ["x"]})
    slack.socket_send({"envelope_id": "e3", "type": "events_api", "payload": {"event": {}}})
    slack.socket_send({"type": "interactive", "payload": {}})
    slack.socket_send("not json at all")
    slack.socket_send(interactive_envelope(block_actions_payload("U1", 8, True), "e4"))
    wait_for(lambda: decisions and len(refused) >= 5)

    assert [d.approval_id for d in decisions] == [8]
    assert "positive integer" in refused[0]
    assert "JSON object payload" in refused[1]
    assert "events_api" in refused[2]
    assert "envelope_id" in refused[3] and "envelope_id" in refused[4]
    wait_for(lambda: len(slack.socket_acks) == 4)
    assert [a["envelope_id"] for a in slack.socket_acks] == ["e1", "e2", "e3", "e4"]


def test_socket_mode_with_a_bad_app_token_is_channel_down(slack):
    client = SlackSocketMode(
        "xapp-wrong-secretapptoken",
        on_decision=lambda d: None,
        on_refused=lambda r: None,
        base_url=slack.base_url,
    )
    with pytest.raises(ChannelDown, match="apps.connections.open.*invalid_auth") as err:
        client.start()
    assert "secretapptoken" not in "".join(traceback.format_exception(err.value))
    assert not client.connected
    client.stop()


def test_socket_mode_survives_a_failing_callback(slack):
    """A callback that raises is logged; the listener thread keeps deciding."""
    decisions: list[Decision] = []

    def on_decision(decision: Decision) -> None:
        if decision.approval_id == 1:
            raise RuntimeError("the store is locked")
        decisions.append(decision)

    client = SlackSocketMode(
        APP_TOKEN, on_decision=on_decision, on_refused=lambda r: None, base_url=slack.base_url
    )
    client.start()
    try:
        slack.socket_send(interactive_envelope(block_actions_payload("U1", 1, True), "e1"))
        slack.socket_send(interactive_envelope(block_actions_payload("U1", 2, True), "e2"))
        wait_for(lambda: decisions)
        assert [d.approval_id for d in decisions] == [2]
        wait_for(lambda: len(slack.socket_acks) == 2)
    finally:
        client.stop()


@settings(max_examples=200, deadline=None)
@given(text=st.text(), limit=st.integers(min_value=1, max_value=50))
def test_fit_escapes_and_cuts_without_breaking_an_entity(text, limit):
    """What fit() returns is within the limit, has no raw control character, and reads
    back as a prefix of the input."""
    out = fit(text, limit)
    assert len(out) <= limit and "<" not in out and ">" not in out
    shown = out.removesuffix("…") if out != fit(text, 10**6) else out
    assert text.startswith(html.unescape(shown))
