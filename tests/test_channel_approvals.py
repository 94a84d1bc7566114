"""Approvals where people are: a destructive call the agent asks for is posted to Slack and
WeChat Work (local servers that speak their APIs), decided by clicks that come back signed and
encrypted as the real services send them, and carried out once; every forgery is refused and
audited; a channel that is down loses nothing; one notice per job event."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fake_slack import (
    FakeSlack,
    block_actions_body,
    block_actions_payload,
    interactive_envelope,
    sign,
)
from fake_wecom import FakeWeCom, encrypted_event
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.agent.doors.channels.service import ChannelService
from nightshift.runtime.errors import ApprovalRequired, ConfigError
from nightshift.runtime.store.db import Approval, ChannelMessage, Job

from conftest import REPO, free_port, made_by_hand, nightshift

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
WECOM_TOKEN = "QDG6eK"
AES_KEY = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"  # 43 characters, as WeChat Work issues
CORP = "wx5823bf96d3bd56c7"
# A job that waits for a GPU this machine does not have: it stays queued while the loop ticks.
SPEC = {"name": "two-days-in", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}

POLICY = {
    "version": 1,
    "roles": {
        "operator": {"capabilities": ["read", "launch", "modify", "destroy"], "can_approve": True},
        "agent": {"capabilities": ["read", "launch", "modify"], "with_approval": ["destroy"]},
        "system": {"capabilities": ["read", "launch", "modify"]},
        "reader": {"capabilities": ["read"]},
    },
    "principals": {
        "agent": {"kind": "agent", "roles": ["agent"]},
        "system": {"kind": "system", "roles": ["system"]},
        "local_user": {"kind": "user", "roles": ["operator"]},
        "alice": {
            "kind": "user",
            "slack_id": "UALICE",
            "wechat_id": "alice.w",
            "roles": ["operator"],
        },
        "bob": {"kind": "user", "slack_id": "UBOB", "wechat_id": "bob.w", "roles": ["operator"]},
    },
    "default_role": "reader",
    "approvals": [
        {
            "id": "two-person-destroy",
            "capabilities": ["destroy"],
            "quorum": 2,
            "from_others": True,
            "expires_min": 60,
        }
    ],
}


class Rig:
    """A store, the two fake services, the channel service with its callback endpoint on
    loopback, and a clock the test moves."""

    def __init__(self, home: Path, slack: FakeSlack, wecom: FakeWeCom):
        self.home, self.slack, self.wecom = home, slack, wecom
        self.t = local_now()
        self.said: list[str] = []
        self.w = Wiring.load()
        self.service = ChannelService(self.w, say=self.said.append, clock=self.clock)

    def clock(self) -> datetime:
        return self.t

    @property
    def url(self) -> str:
        assert self.service.server is not None
        return self.service.server.address

    def tick(self) -> int:
        return self.service.outbox.tick()

    def queued_job(self) -> int:
        with self.w.store.session() as s:
            job = Job(name="two-days-in", spec=SPEC, owner="carol", priority=5)
            s.add(job)
            s.flush()
            assert job.id is not None
        made_by_hand(self.w.store)
        return job.id

    def agent_asks_cancel(self, job_id: int) -> int:
        from nightshift.agent.doors.api import Client

        with pytest.raises(ApprovalRequired) as info:
            Client(self.w, principal="agent").call(
                "cancel_job", {"job_id": job_id}, call_id=f"agent/cancel-{job_id}"
            )
        return info.value.approval_id

    def approval(self, approval_id: int) -> Approval:
        return self.w.approvals.get(approval_id)

    def slack_click(
        self, user: str, approval_id: int, approve: bool, *, ts: int | None = None, **kw: Any
    ) -> httpx.Response:
        body = block_actions_body(user, approval_id, approve, **kw)
        headers = sign(SIGNING_SECRET, body, int(time.time()) if ts is None else ts)
        return httpx.post(f"{self.url}/slack/interactivity", content=body, headers=headers)

    def wechat_click(
        self,
        user: str,
        approval_id: int,
        approve: bool,
        *,
        token: str = WECOM_TOKEN,
        corp_id: str = CORP,
    ) -> httpx.Response:
        now = int(time.time())
        query, body = encrypted_event(
            token,
            AES_KEY,
            corp_id,
            user=user,
            approval_id=approval_id,
            approve=approve,
            task_id=self.wecom.last_card()["task_id"],
            response_code=self.wecom.new_response_code(),
            create_time=now,
            timestamp=now,
            nonce=f"n{time.monotonic_ns()}",
        )
        return httpx.post(f"{self.url}/wechat/callback", params=query, content=body)

    def events(self, action: str) -> list[Any]:
        return self.w.audit.events(action=action)


def channel_env(home: Path, slack: FakeSlack, wecom: FakeWeCom, listen: str) -> dict[str, str]:
    """The settings a daemon with both channels pointed at the fakes reads."""
    (home / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    return {
        "NIGHTSHIFT_POLICY__FILE": str(home / "policy.yaml"),
        "SLACK_BOT_TOKEN": slack.token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "NIGHTSHIFT_CHANNELS__SLACK__APPROVALS_CHANNEL": "C1",
        "NIGHTSHIFT_CHANNELS__SLACK__BASE_URL": slack.base_url,
        "NIGHTSHIFT_CHANNELS__WECHAT__CORP_ID": CORP,
        "NIGHTSHIFT_CHANNELS__WECHAT__AGENT_ID": str(wecom.agent_id),
        "NIGHTSHIFT_CHANNELS__WECHAT__BASE_URL": wecom.base_url,
        "WECOM_SECRET": "app-secret",
        "WECOM_TOKEN": WECOM_TOKEN,
        "WECOM_ENCODING_AES_KEY": AES_KEY,
        "NIGHTSHIFT_CHANNELS__LISTEN": listen,
    }


@pytest.fixture
def fakes():
    with FakeSlack() as slack, FakeWeCom(corp_id=CORP, secret="app-secret") as wecom:
        yield slack, wecom


@pytest.fixture
def rig(home, monkeypatch, fakes):
    slack, wecom = fakes
    for k, v in channel_env(home, slack, wecom, "127.0.0.1:0").items():
        monkeypatch.setenv(k, v)
    r = Rig(home, slack, wecom)
    r.service.start(outbox_thread=False)
    try:
        yield r
    finally:
        r.service.stop()


def test_two_people_on_two_channels_approve_and_it_runs_once(rig):
    job_id = rig.queued_job()
    aid = rig.agent_asks_cancel(job_id)
    rig.tick()
    posted = rig.slack.last("chat.postMessage")
    assert posted["channel"] == "C1"
    assert any(b["type"] == "actions" for b in posted["blocks"])
    card = rig.wecom.last_card()
    assert card["card_type"] == "button_interaction"
    assert sorted(rig.wecom.last("message/send")["touser"].split("|")) == ["alice.w", "bob.w"]
    assert rig.events("channel.posted")

    assert rig.slack_click("UALICE", aid, True).status_code == 200
    assert rig.approval(aid).state == "pending" and len(rig.approval(aid).votes) == 1
    rig.tick()  # the card shows alice's vote
    assert "alice" in json.dumps(rig.slack.last("chat.update")["blocks"])

    assert rig.wechat_click("bob.w", aid, True).status_code == 200
    assert rig.approval(aid).state == "approved"
    assert {v["as"] for v in rig.approval(aid).votes} == {"slack:UALICE", "wechat:bob.w"}

    rig.w.loop.carry_out_approved = True
    rig.w.loop.step()
    rig.w.loop.step()
    assert rig.approval(aid).state == "executed"
    with rig.w.store.session() as s:
        assert s.get(Job, job_id).state == "cancelled"
    assert len(rig.w.audit.events(action="skill.start", call_id=f"agent/cancel-{job_id}")) == 1

    rig.tick()
    final = rig.slack.last("chat.update")
    assert not any(b["type"] == "actions" for b in final["blocks"])
    assert "executed" in json.dumps(final).lower()
    assert rig.wecom.last("message/update_template_card")
    assert rig.w.audit.verify().ok


@pytest.mark.parametrize("where", ["slack", "wechat"])
def test_a_rejection_on_either_channel_stops_it(rig, where):
    job_id = rig.queued_job()
    aid = rig.agent_asks_cancel(job_id)
    rig.tick()
    rig.slack_click("UALICE", aid, True)
    if where == "slack":
        rig.slack_click("UBOB", aid, False, trigger_id="t-bob")
    else:
        rig.wechat_click("bob.w", aid, False)
    assert rig.approval(aid).state == "rejected"
    rig.w.loop.carry_out_approved = True
    rig.w.loop.step()
    with rig.w.store.session() as s:
        assert s.get(Job, job_id).state == "queued"
    rig.tick()
    assert "rejected" in json.dumps(rig.slack.last("chat.update")).lower()


def test_expiry_stops_it_and_a_late_click_is_not_counted(rig):
    aid = rig.agent_asks_cancel(rig.queued_job())
    rig.tick()
    rig.t += timedelta(hours=2)
    rig.tick()
    assert rig.approval(aid).state == "expired"
    assert "expired" in json.dumps(rig.slack.last("chat.update")).lower()
    rig.slack_click("UALICE", aid, True)
    row = rig.approval(aid)
    assert row.state == "expired" and row.votes == []
    late = rig.events("approval.vote")[-1]
    assert late.payload["counted"] is False and "expired" in late.payload["reason"]


def test_forgeries_and_replays_are_refused_and_audited(rig):
    aid = rig.agent_asks_cancel(rig.queued_job())
    rig.tick()
    body = block_actions_body("UALICE", aid, True)
    # A forged signature, a stale timestamp, no signature at all.
    forged = sign("not-the-secret", body, int(time.time()))
    assert (
        httpx.post(f"{rig.url}/slack/interactivity", content=body, headers=forged).status_code
        == 401
    )
    stale = rig.slack_click("UALICE", aid, True, ts=int(time.time()) - 600)
    assert stale.status_code == 401
    assert httpx.post(f"{rig.url}/slack/interactivity", content=body).status_code == 401
    # A signed request sent twice counts once.
    headers = sign(SIGNING_SECRET, body, int(time.time()))
    for _ in range(2):
        httpx.post(f"{rig.url}/slack/interactivity", content=body, headers=headers)
    assert len(rig.approval(aid).votes) == 1
    # The same person through the other channel: counted once, the quorum of two still open.
    rig.wechat_click("alice.w", aid, True)
    assert rig.approval(aid).state == "pending" and len(rig.approval(aid).votes) == 1
    # Someone the policy does not know.
    rig.slack_click("UMALLORY", aid, True, trigger_id="t-mallory")
    # WeChat: a forged msg_signature, another corporation's event.
    rig.wechat_click("bob.w", aid, True, token="wrong-token")
    rig.wechat_click("bob.w", aid, True, corp_id="wx-other-corp")
    assert rig.approval(aid).state == "pending" and len(rig.approval(aid).votes) == 1
    reasons = [e.payload["reason"] for e in rig.events("channel.refused")]
    assert any("signature" in r for r in reasons)
    assert any("stale" in r for r in reasons)
    assert any("replayed" in r for r in reasons)
    refused_votes = rig.events("approval.vote_refused")
    assert [e.actor for e in refused_votes] == ["slack:UMALLORY"]
    assert any(
        "already voted" in (e.payload.get("reason") or "") for e in rig.events("approval.vote")
    )
    assert rig.w.audit.verify().ok


def test_a_decided_approval_takes_no_more_votes(rig):
    aid = rig.agent_asks_cancel(rig.queued_job())
    rig.tick()
    rig.slack_click("UALICE", aid, False)
    assert rig.approval(aid).state == "rejected"
    rig.wechat_click("bob.w", aid, True)
    assert rig.approval(aid).state == "rejected"
    assert "already rejected" in rig.events("approval.vote")[-1].payload["reason"]


def test_a_channel_that_is_down_loses_nothing(rig):
    aid = rig.agent_asks_cancel(rig.queued_job())
    rig.slack.down = True
    rig.tick()
    assert rig.wecom.last_card()  # the other channel has it
    with rig.w.store.session() as s:
        row = s.exec(select(ChannelMessage).where(ChannelMessage.channel == "slack")).one()
    assert row.state == "queued" and row.attempts == 1 and row.next_try_at > rig.t
    rig.tick()  # not due yet: no second try
    assert rig.slack.methods().count("chat.postMessage") == 1  # the one that got a 503
    # Still decidable from the CLI meanwhile (a vote by name, as `nightshift approve` casts).
    rig.w.approvals.vote(aid, "alice", True, rig.t)
    rig.slack.down = False
    rig.t += timedelta(seconds=5)
    rig.tick()
    assert rig.slack.methods().count("chat.postMessage") == 2
    assert len(rig.slack.messages) == 1
    assert "alice" in json.dumps(rig.slack.last("chat.postMessage")["blocks"])
    assert len(rig.events("channel.send_failed")) == 1
    assert len(rig.events("channel.recovered")) == 1


def test_one_notice_per_job_event(rig):
    w = rig.w
    job_id = rig.queued_job()
    w.audit.append(
        "system",
        "job.state",
        job_id=job_id,
        payload={
            "job_id": job_id,
            "before": "running",
            "after": "succeeded",
            "attempt": 1,
            "outcome": "succeeded",
            "last_step": 500,
        },
    )
    w.audit.append(
        "system",
        "job.state",
        job_id=job_id,
        payload={
            "job_id": job_id,
            "before": "running",
            "after": "failed",
            "attempt": 2,
            "outcome": "failed",
            "exit_code": 1,
            "reason": "attempt 2 exited with code 1",
        },
    )
    rig.tick()
    rig.tick()
    # The failure waits for its diagnosis (up to channels.failure_notice_wait_s)...
    finished = [p for m, p in rig.slack.calls if m == "chat.postMessage"]
    assert len(finished) == 1 and "finished" in json.dumps(finished[0])
    w.audit.append(
        "system",
        "skill.result",
        skill="diagnose_failure",
        job_id=job_id,
        payload={
            "ok": True,
            "result": {
                "category": "oom",
                "retryable": True,
                "confidence": "high",
                "reasoning": "CUDA out of memory at step 812",
                "remediation": {"action": "reduce_batch", "message": "halve the micro-batch"},
            },
        },
    )
    for _ in range(3):
        rig.tick()
    posts = [json.dumps(p) for m, p in rig.slack.calls if m == "chat.postMessage"]
    assert len(posts) == 2 and "out of memory" in posts[1]
    robot_or_app = [c for c in rig.wecom.calls if c[0].endswith("message/send")]
    assert len(robot_or_app) == 2
    # The recovery that requeued it, and an early stop.
    w.audit.append(
        "system",
        "skill.result",
        skill="retry_job",
        job_id=job_id,
        payload={
            "ok": True,
            "result": {"attempts": 2, "reason_before": "OOM", "resume_from": "ckpt/step-800"},
        },
    )
    w.audit.append(
        "system",
        "job.state",
        job_id=job_id,
        payload={
            "after": "succeeded",
            "outcome": "early_stopped",
            "attempt": 3,
            "reason": "plateau",
        },
    )
    rig.tick()
    rig.tick()
    posts = [json.dumps(p) for m, p in rig.slack.calls if m == "chat.postMessage"]
    assert len(posts) == 4
    assert "requeued" in posts[2] and "ckpt/step-800" in posts[2]
    assert "stopped early" in posts[3] and "plateau" in posts[3]


def test_secrets_must_be_private(home, monkeypatch, tmp_path):
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(yaml.safe_dump({"slack": {"bot_token": "xoxb-1", "signing_secret": "s"}}))
    secrets.chmod(0o640)
    monkeypatch.setenv("NIGHTSHIFT_CHANNELS__SECRETS_FILE", str(secrets))
    monkeypatch.setenv("NIGHTSHIFT_CHANNELS__SLACK__APPROVALS_CHANNEL", "C1")
    with pytest.raises(ConfigError, match="chmod 600"):
        ChannelService(Wiring.load(), say=print)
    secrets.chmod(0o600)
    assert "slack" in ChannelService(Wiring.load(), say=print).built.channels
    # A config file others may read holds no secret.
    monkeypatch.delenv("NIGHTSHIFT_CHANNELS__SECRETS_FILE")
    (home / "config.yaml").write_text("channels: {slack: {bot_token: xoxb-2}}\n")
    (home / "config.yaml").chmod(0o644)
    done = nightshift("daemon", "--max-ticks", "1")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "channels.slack.bot_token is a secret" in done.stderr + done.stdout


def test_the_daemon_posts_serves_callbacks_and_carries_out(home, monkeypatch, fakes):
    """The real daemon process: cards posted, clicks served on its endpoint, the call executed
    once and the cards updated with the outcome."""
    slack, wecom = fakes
    port = free_port()
    for k, v in channel_env(home, slack, wecom, f"127.0.0.1:{port}").items():
        monkeypatch.setenv(k, v)
    r = Rig(home, slack, wecom)  # its service is never started: the daemon's serves
    job_id = r.queued_job()
    aid = r.agent_asks_cancel(job_id)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    end = time.monotonic() + 90

    def until(what) -> None:
        while not what():
            assert time.monotonic() < end and daemon.poll() is None, "timed out"
            time.sleep(0.1)

    try:
        until(lambda: "chat.postMessage" in slack.methods() and wecom.cards())
        r.service.server = type("Addr", (), {"address": f"http://127.0.0.1:{port}"})()
        assert r.slack_click("UALICE", aid, True).status_code == 200
        assert r.wechat_click("bob.w", aid, True).status_code == 200
        until(lambda: r.approval(aid).state == "executed")
        until(
            lambda: any(
                "executed" in json.dumps(p).lower() for m, p in slack.calls if m == "chat.update"
            )
        )
    finally:
        daemon.terminate()
        out, _ = daemon.communicate(timeout=30)
    assert "Traceback" not in out, out
    with r.w.store.session() as s:
        assert s.get(Job, job_id).state == "cancelled"
    assert len(r.w.audit.events(action="skill.start", call_id=f"agent/cancel-{job_id}")) == 1
    assert "message/update_template_card" in wecom.paths()


def test_doctor_checks_each_channels_credentials(rig, fakes):
    """`nightshift doctor` runs auth.test and gettoken, shows neither secret, and fails on a
    wrong one."""
    done = nightshift("doctor", "--json", "--timeout", "2")
    checks = {c["area"]: c for c in json.loads(done.stdout)}
    assert checks["approval channels: slack"]["status"] == "ok"
    assert "/slack/interactivity" in checks["approval channels: slack"]["detail"]
    assert checks["approval channels: wechat"]["status"] == "ok"
    assert "2 approver(s)" in checks["approval channels: wechat"]["detail"]
    assert "auth.test" in rig.slack.methods()
    assert "app-secret" not in done.stdout and rig.slack.token not in done.stdout
    bad = nightshift("doctor", "--json", env={"WECOM_SECRET": "wrong"})
    checks = {c["area"]: c for c in json.loads(bad.stdout)}
    assert checks["approval channels: wechat"]["status"] == "fail" and bad.returncode == 5
    assert "wrong" not in checks["approval channels: wechat"]["detail"]


def test_the_morning_report_is_posted_once_a_day(rig):
    """At channels.report_at (07:00 local by default) the last 24 hours' report is queued once
    that day; the outbox posts it to every channel."""
    local = datetime.now().astimezone().replace(hour=6, minute=59, second=0, microsecond=0)
    rig.t = local.astimezone(UTC).replace(tzinfo=None)
    assert rig.service.morning_report() is False
    rig.t += timedelta(minutes=2)
    assert rig.service.morning_report() is True
    assert rig.service.morning_report() is False
    rig.tick()
    posts = [json.dumps(p) for m, p in rig.slack.calls if m == "chat.postMessage"]
    assert len(posts) == 1 and "nightshift report" in posts[0] and "GPU-hours" in posts[0]
    assert len([b for b in rig.wecom.bodies("message/send") if b["msgtype"] == "markdown"]) == 1
    rig.t += timedelta(days=1)
    assert rig.service.morning_report() is True


def test_socket_mode_clicks_count_once(home, monkeypatch, fakes):
    """A server nobody can reach from outside: clicks arrive over Slack's Socket Mode (the SDK's
    client on a WebSocket to the fake), acked, counted once, and a resent envelope is not."""
    slack, wecom = fakes
    for k, v in channel_env(home, slack, wecom, "127.0.0.1:0").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLACK_SIGNING_SECRET")
    monkeypatch.setenv("SLACK_APP_TOKEN", slack.app_token)
    monkeypatch.setenv("NIGHTSHIFT_CHANNELS__SLACK__SOCKET_MODE", "true")
    r = Rig(home, slack, wecom)
    r.service.start(outbox_thread=False)
    try:
        assert "/slack/interactivity" not in r.service.built.routes
        aid = r.agent_asks_cancel(r.queued_job())
        r.tick()
        envelope = interactive_envelope(block_actions_payload("UALICE", aid, True), "env-1")
        for _ in range(2):  # Slack resends an envelope it thinks was not acked
            slack.socket_send(envelope)
        end = time.monotonic() + 10
        while len(slack.socket_acks) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert [a["envelope_id"] for a in slack.socket_acks] == ["env-1", "env-1"]

        def replay_refused() -> bool:
            return any("replayed" in e.payload["reason"] for e in r.events("channel.refused"))

        while not replay_refused() and time.monotonic() < end:  # handled after the ack
            time.sleep(0.05)
        assert replay_refused()
        assert len(r.approval(aid).votes) == 1
    finally:
        r.service.stop()


def test_the_endpoint_refuses_what_is_not_a_callback(rig):
    """Bounded bodies, known paths only, and an empty or slow client holds only its thread."""
    assert httpx.get(f"{rig.url}/healthz").status_code == 200
    assert httpx.post(f"{rig.url}/anything", content=b"x").status_code == 404
    assert httpx.get(f"{rig.url}/slack/interactivity").status_code == 405
    host, port = rig.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /slack/interactivity HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /wechat/callback HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 411")
    silent = socket.create_connection((host, int(port)))  # sends nothing at all
    try:
        assert httpx.get(f"{rig.url}/healthz", timeout=5).status_code == 200
    finally:
        silent.close()


def test_a_rule_names_its_channels(home, monkeypatch, fakes):
    """`channels: [slack]` on a rule: its requests go to Slack only (the CLI and TUI have every
    request regardless)."""
    slack, wecom = fakes
    for k, v in channel_env(home, slack, wecom, "127.0.0.1:0").items():
        monkeypatch.setenv(k, v)
    policy = json.loads(json.dumps(POLICY))
    policy["approvals"][0]["channels"] = ["slack"]
    (home / "policy.yaml").write_text(yaml.safe_dump(policy))
    r = Rig(home, slack, wecom)
    r.agent_asks_cancel(r.queued_job())
    r.tick()
    assert "chat.postMessage" in slack.methods()
    assert wecom.cards() == []


def test_a_replayed_wechat_event_counts_once(rig):
    aid = rig.agent_asks_cancel(rig.queued_job())
    rig.tick()
    now = int(time.time())
    query, body = encrypted_event(
        WECOM_TOKEN,
        AES_KEY,
        CORP,
        user="bob.w",
        approval_id=aid,
        approve=True,
        task_id=rig.wecom.last_card()["task_id"],
        response_code=rig.wecom.new_response_code(),
        create_time=now,
        timestamp=now,
        nonce="same-nonce",
    )
    for _ in range(2):
        assert (
            httpx.post(f"{rig.url}/wechat/callback", params=query, content=body).status_code == 200
        )
    assert len(rig.approval(aid).votes) == 1
    assert [e.payload["channel"] for e in rig.events("channel.refused")] == ["wechat"]
