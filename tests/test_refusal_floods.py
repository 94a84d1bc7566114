"""Refusals cannot fill the disk (issue 27): a flood of refused requests on the daemon's socket or
on the callback endpoint grows the audit by a bounded number of events, the aggregate events
carry the true count, the chain still verifies, and others (and the flooder, once its rate
allows) are still served.

The socket's "other user" is this test process too: `peer_of` is wrapped so that a client
whose socket is bound to a marked abstract address is reported as another uid (a second real
account needs root and useradd: tests/test_multi_user.py). The callback endpoint's other
remote address is 127.0.0.2, which is loopback as well."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fake_slack import block_actions_body, sign
from sqlmodel import func, select

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.agent.doors import api_server
from nightshift.agent.doors.api_server import ApiServer, Peer
from nightshift.agent.doors.channels.callbacks import CallbackServer, Desk, slack_route
from nightshift.agent.doors.channels.slack import SlackInteractivity
from nightshift.policies.refusal_tally import OVERFLOW, RateLimits, RefusalTally
from nightshift.runtime.config import (
    ApiSettings,
    ChannelsSettings,
    ExecutorSettings,
    GpuSettings,
    Settings,
)
from nightshift.runtime.store.db import AuditEvent

OTHER = "\0nightshift-test-other-user"  # a client bound here is "another user"
OTHER_UID = 54321
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def events_in(w: Wiring) -> int:
    with w.store.session() as s:
        return int(s.exec(select(func.count()).select_from(AuditEvent)).one())


def refused_total(w: Wiring, action: str, after_id: int, source: str) -> tuple[int, int, list]:
    """(events written in full, events in all, aggregates) for one source since `after_id`."""
    full = [
        e
        for e in w.audit.events(action=action, after_id=after_id)
        if (e.payload or {}).get("source", source) == source
    ]
    aggs = [
        e
        for e in w.audit.events(action=f"{action}_aggregate", after_id=after_id)
        if e.payload["source"] == source
    ]
    return len(full), len(full) + len(aggs), aggs


def minutes_open(w: Wiring, action: str, after_id: int, source: str) -> int:
    """The wall-clock minutes in which the tally can have counted `source`'s refusals: from the
    minute of 5 s before its first event (an event is stamped as it is written, after the tally
    read its clock) to the minute of its last. The bound is per minute whether or not a minute
    overflowed: one that did not has no aggregate to count it by."""
    stamps = [
        datetime.fromisoformat(e.ts)
        for a in (action, f"{action}_aggregate")
        for e in w.audit.events(action=a, after_id=after_id)
        if (e.payload or {}).get("source", source) == source
    ]
    first = (min(stamps) - timedelta(seconds=5)).replace(second=0, microsecond=0)
    last = max(stamps).replace(second=0, microsecond=0)
    return int((last - first) / timedelta(minutes=1)) + 1


# The tally and the buckets, with the clock passed in -----------------------------------------


def test_the_tally_writes_a_few_in_full_and_one_aggregate_per_source_and_minute() -> None:
    t0 = datetime(2026, 12, 5, 10, 0, 5)
    tally = RefusalTally(in_full=2, max_sources=2)
    verdicts = [
        tally.note("uid:1", "bad_request", f"junk {i}", t0 + timedelta(seconds=i)) for i in range(5)
    ]
    assert [v.in_full for v in verdicts] == [True, True, False, False, False]
    assert tally.note("uid:2", "too_large", "big", t0).in_full  # its own budget
    assert tally.note("uid:2", "too_large", "big", t0).in_full
    # A third source: the overflow bucket, counted only.
    assert not tally.note("uid:3", "bad_request", "x" * 500, t0).in_full
    assert tally.flush(t0 + timedelta(seconds=30)) == []  # the minute is still open
    closed = tally.note("uid:1", "rate_limited", "slow down", t0 + timedelta(minutes=1)).closed
    by_source = {a.source: a.payload for a in closed}
    assert set(by_source) == {"uid:1", OVERFLOW}  # uid:2's two were all written in full
    one = by_source["uid:1"]
    assert (one["count"], one["in_full"], one["counted_only"]) == (5, 2, 3)
    assert one["kinds"] == {"bad_request": 5}
    assert one["reasons"] == ["junk 2", "junk 3", "junk 4"]
    assert one["first_at"].startswith("2026-12-05T10:00:05") and one["minute"].endswith(
        "00.000000Z"
    )
    over = by_source[OVERFLOW]
    assert over["count"] == 1 and over["sources_sample"] == ["uid:3"]
    assert len(over["reasons"][0]) == 200
    # A refusal stamped before the open minute counts in it; shutdown closes it.
    assert tally.note("uid:1", "rate_limited", "late", t0).in_full  # 2nd of the new minute
    assert not tally.note("uid:1", "rate_limited", "late", t0).in_full
    (last,) = tally.flush(None)
    assert last.payload["count"] == 3 and last.payload["kinds"] == {"rate_limited": 3}
    assert tally.flush(None) == []


def test_rate_limits_allow_a_burst_then_the_rate_and_forget_full_buckets() -> None:
    rates = RateLimits(rate=10.0, burst=3, max_keys=2)
    assert [rates.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rates.take("a", 0.0) == pytest.approx(0.1)
    assert rates.take("a", 0.05) == pytest.approx(0.05)  # nothing spent by a refusal
    assert rates.take("a", 0.1) == 0.0
    assert rates.take("b", 0.1) == 0.0
    rates.take("c", 0.25)  # a third key: "b", full again by now, is forgotten ("a" is not)
    assert set(rates._buckets) == {"a", "c"}


# The daemon's socket -----------------------------------------------------------------------------


@pytest.fixture
def server(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    real = api_server.peer_of

    def peer_of(conn: socket.socket) -> Peer:
        peer = real(conn)
        if conn.getpeername() in (OTHER, OTHER.encode()):  # abstract names come back as bytes
            return Peer(peer.pid, OTHER_UID, peer.gid, "other-user")
        return peer

    monkeypatch.setattr(api_server, "peer_of", peer_of)
    run = Path(tempfile.mkdtemp(prefix="ns-flood-", dir="/tmp"))
    w = Wiring(
        Settings(
            home=str(home),
            gpu=GpuSettings(probe="none"),
            api=ApiSettings(socket=str(run / "api.sock"), max_request_bytes=1024),
            # The test process connects as the daemon's own uid: jobs run as the daemon's.
            executor=ExecutorSettings(run_as="daemon"),
        ),
        server=True,
    )
    api = ApiServer(w)
    assert api.start()
    yield api
    api.stop()
    shutil.rmtree(run)


def connect(path: Path, bind: str | None = None) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if bind is not None:
        s.bind(bind)
    s.settimeout(10)
    s.connect(str(path))
    return s


def ask(path: Path, message: dict[str, Any], bind: str | None = None) -> dict[str, Any]:
    with connect(path, bind) as s:
        s.sendall(json.dumps(message).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


JUNK = [
    b"this is not json",
    b'{"op": "whoami", "principal": "bob"}',
    b'{"op": "format_disk"}',
    b"[1, 2]",
]


def test_a_socket_flood_adds_a_bounded_number_of_events(server: ApiServer) -> None:
    w = server.w
    before, head = events_in(w), w.audit.head()
    after_id = head.id if head and head.id else 0
    sent, errors, kinds = 3000, 0, {"rate": 0, "junk": 0}
    started = time.monotonic()
    with connect(server.path) as s:
        lines = b"".join(JUNK[i % len(JUNK)] + b"\n" for i in range(sent))
        writer = threading.Thread(target=s.sendall, args=(lines,), daemon=True)
        writer.start()
        replies = s.makefile("rb")
        for i in range(sent):
            reply = json.loads(replies.readline())
            assert reply["kind"] == "error", reply
            errors += 1
            message = reply["error"]["message"]
            if message.startswith("rate limited:"):
                assert reply["error"]["type"] == "Refused" and "; retry in 0." in message
                kinds["rate"] += 1
            else:
                kinds["junk"] += 1
            if i == sent // 2:  # another user, mid-flood: served at once
                t = time.monotonic()
                other = ask(server.path, {"op": "whoami"}, bind=OTHER)
                assert other["kind"] == "result", other
                assert other["result"]["uid"] == OTHER_UID
                assert time.monotonic() - t < 1.0
        writer.join(10)
    # Oversized lines (past api.max_request_bytes, 1024 here) end their connection each.
    for _ in range(5):
        with connect(server.path) as s:
            s.sendall(b'{"op": "whoami", "pad": "' + b"x" * 4096 + b'"}\n')
            reply = json.loads(s.makefile("rb").readline())
            assert "longer than 1024 bytes" in reply["error"]["message"]
            errors += 1
    flood_s = time.monotonic() - started
    assert flood_s < 15
    assert kinds["rate"] > 2000 and kinds["junk"] >= 100  # the burst, then the rate
    # The flooder's next request: refused while its bucket is empty, with when to retry, then
    # served once it has refilled.
    reply = ask(server.path, {"op": "whoami"})
    if reply["kind"] == "error":
        message = reply["error"]["message"]
        assert reply["error"]["type"] == "Refused" and message.startswith("rate limited:")
        errors += 1
        time.sleep(float(message.rsplit("retry in ", 1)[1].split(" s")[0]) + 0.05)
        reply = ask(server.path, {"op": "whoami"})
    assert reply["kind"] == "result", reply

    server.refusals.flush(final=True)
    me = f"uid:{os.geteuid()}"
    in_full, refusal_events, aggs = refused_total(w, "api.refused", after_id, me)
    assert {e.actor for e in aggs} == {api_server.os_user_name(os.geteuid())}
    # The true count: what was written in full plus what the aggregates counted only.
    assert in_full + sum(a.payload["counted_only"] for a in aggs) == errors
    assert 1 <= len(aggs) <= 2  # one, or two if the flood crossed a minute's end
    minutes = minutes_open(w, "api.refused", after_id, me)
    assert minutes <= 3
    assert in_full <= 10 * minutes and refusal_events <= 11 * minutes
    added = events_in(w) - before
    assert added == refusal_events + 2  # and the two whoami reads (api.read)
    kinds_seen: dict[str, int] = {}
    for a in aggs:
        for k, n in a.payload["kinds"].items():
            kinds_seen[k] = kinds_seen.get(k, 0) + n
        assert 1 <= len(a.payload["reasons"]) <= 3
        assert a.payload["uid"] == os.geteuid()
    assert {"bad_request", "rate_limited", "too_large"} <= set(kinds_seen)
    assert w.audit.verify().ok


# The callback endpoint ---------------------------------------------------------------------------


@pytest.fixture
def endpoint(home: Path) -> Iterator[tuple[CallbackServer, Wiring]]:
    w = Wiring(Settings(home=str(home), gpu=GpuSettings(probe="none")), server=True)
    desk = Desk(w.store, w.audit, w.approvals, None, local_now)
    said: list[str] = []
    srv = CallbackServer(
        "127.0.0.1:0",
        {"/slack/interactivity": slack_route(SlackInteractivity(SECRET), desk)},
        said.append,
        limits=ChannelsSettings(),
        refusals=desk.refusals,
    )
    srv.start()
    try:
        yield srv, w
    finally:
        srv.stop()
    assert said == []


def post(port: int, body: bytes, headers: dict[str, str], source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("POST", "/slack/interactivity", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_flood_of_forged_callbacks_adds_a_bounded_number_of_events(endpoint) -> None:
    srv, w = endpoint
    port = int(srv.address.rsplit(":", 1)[1])
    before, head = events_in(w), w.audit.head()
    after_id = head.id if head and head.id else 0
    body = block_actions_body("UALICE", 1, True)
    forged = sign("not-the-secret", body, int(time.time()))
    sent, per_thread = 2000, 250
    statuses: list[int] = []
    lock = threading.Lock()

    def flood() -> None:
        got = [post(port, body, forged) for _ in range(per_thread)]
        with lock:
            statuses.extend(got)

    started = time.monotonic()
    threads = [threading.Thread(target=flood) for _ in range(sent // per_thread)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    # Another address during the flood: not limited, its forgery refused (and audited) itself.
    assert post(port, body, forged, source="127.0.0.2") == 401
    for t in threads:
        t.join(60)
    flood_s = time.monotonic() - started
    assert len(statuses) == sent and set(statuses) <= {401, 429}, set(statuses)
    assert statuses.count(429) > 1000 and statuses.count(401) >= 100
    # Once its rate allows, the flooder's next request is looked at again (401, not 429),
    # and a validly signed click is taken in (200; no such approval: refused, tallied).
    time.sleep(0.2)
    assert post(port, body, forged) == 401
    signed = sign(SECRET, body, int(time.time()))
    assert post(port, body, signed) == 200
    srv.flush_refusals(final=True)

    in_full, refusal_events, aggs = refused_total(w, "channel.refused", after_id, "127.0.0.1")
    assert in_full + sum(a.payload["counted_only"] for a in aggs) == sent + 2
    assert 1 <= len(aggs) <= 2  # one, or two if the flood crossed a minute's end
    minutes = minutes_open(w, "channel.refused", after_id, "127.0.0.1")
    assert minutes <= 3 and refusal_events <= 11 * minutes
    other_full, other_all, _ = refused_total(w, "channel.refused", after_id, "127.0.0.2")
    assert (other_full, other_all) == (1, 1)
    assert events_in(w) - before == refusal_events + other_all
    kinds: dict[str, int] = {}
    for a in aggs:
        assert a.actor == "system" and a.payload["peer"] == "127.0.0.1"
        for k, n in a.payload["kinds"].items():
            kinds[k] = kinds.get(k, 0) + n
    assert {"slack.bad_callback", "rate_limited"} <= set(kinds)
    assert any("signature mismatch" in r for a in aggs for r in a.payload["reasons"])
    assert w.audit.verify().ok
    assert flood_s < 20


def test_the_endpoint_caps_each_addresss_open_connections(home: Path) -> None:
    """Past `callback_max_connections_per_peer` a connection is answered 503 and closed at
    once; another address still gets in."""
    srv = CallbackServer(
        "127.0.0.1:0",
        {},
        lambda message: None,
        limits=ChannelsSettings(callback_max_connections_per_peer=2),
    )
    srv.start()
    port = int(srv.address.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        time.sleep(0.2)  # accepted, each holding its thread
        with socket.create_connection(("127.0.0.1", port)) as third:
            third.settimeout(5)
            assert third.recv(100).startswith(b"HTTP/1.0 503")
        conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=5, source_address=("127.0.0.2", 0)
        )
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        for s in held:
            s.close()
        srv.stop()
