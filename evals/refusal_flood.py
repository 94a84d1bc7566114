"""Refusal floods (issue 27): what a flood of refused requests adds to the audit, with every
refusal audited one by one (as before) and with the per-source tally and rate limits.

    python -m nightshift.evals.refusal_flood                      # 3,000 lines, 2,000 POSTs
    python -m nightshift.evals.refusal_flood --lines 300 --posts 200

Two floods from one source, each against a fresh home: `--lines` junk request lines on the
daemon's Unix socket (the API server in this process; not JSON, a `principal` field, an unknown
op, a JSON array, in turn, pipelined on one connection), and `--posts` forged Slack
interactivity callbacks (a wrong signing secret) on the callback endpoint, from 8 client
threads. "Before" is the same code with the tally and the rate limits set out of reach
(`refusals_in_full_per_minute`, `burst` and the rate at 10⁹), which is what every refusal
audited one by one was. Reported per flood: refused requests sent (each answered with a refusal,
counted by the client) and how many of them for the rate, audit events added, bytes the store grew by (its SQLite file, after a
checkpoint), seconds from the first request to the last answer, and whether `audit verify`
passes afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightshift.evals.output import write_csv

OFF = 10**9  # a limit no flood here reaches
JUNK = [
    b"this is not json",
    b'{"op": "whoami", "principal": "bob"}',
    b'{"op": "format_disk"}',
    b"[1, 2]",
]
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
THREADS = 8


def _store_bytes(home: Path) -> int:
    """The SQLite store's size with its write-ahead log folded in."""
    db = home / "nightshift.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db.stat().st_size + sum(
        p.stat().st_size
        for p in (home / "nightshift.db-wal", home / "nightshift.db-shm")
        if p.exists()
    )


def _events(w: Any) -> int:
    from sqlmodel import func, select

    from nightshift.runtime.store.db import AuditEvent

    with w.store.session() as s:
        return int(s.exec(select(func.count()).select_from(AuditEvent)).one())


def _measure(
    home: Path, w: Any, flood: Callable[[], tuple[int, int]], flush: Callable[[], None]
) -> dict[str, Any]:
    events, size = _events(w), _store_bytes(home)
    start = time.monotonic()
    refused, limited = flood()
    seconds = time.monotonic() - start
    flush()
    return {
        "refused_sent": refused,
        "of_them_rate_limited": limited,
        "audit_events_added": _events(w) - events,
        "store_bytes_added": _store_bytes(home) - size,
        "seconds": round(seconds, 2),
        "audit_verify": "ok" if w.audit.verify().ok else "FAILED",
    }


def socket_flood(lines: int, tallied: bool) -> dict[str, Any]:
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api_server import ApiServer
    from nightshift.runtime.config import ApiSettings, GpuSettings, Settings

    home = Path(tempfile.mkdtemp(prefix="ns-flood-home-"))
    run = Path(tempfile.mkdtemp(prefix="ns-flood-", dir="/tmp"))  # a short socket path
    limits = {} if tallied else {"requests_per_s": OFF, "burst": OFF}
    api = ApiSettings(
        socket=str(run / "api.sock"),
        refusals_in_full_per_minute=10 if tallied else OFF,
        **limits,
    )
    w = Wiring(Settings(home=str(home), gpu=GpuSettings(probe="none"), api=api), server=True)
    server = ApiServer(w)
    assert server.start()
    w.audit.append("system", "eval.start")  # the key and the first anchor, outside the timing

    def flood() -> tuple[int, int]:
        refused = limited = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(str(server.path))
            data = b"".join(JUNK[i % len(JUNK)] + b"\n" for i in range(lines))
            writer = threading.Thread(target=s.sendall, args=(data,), daemon=True)
            writer.start()
            replies = s.makefile("rb")
            for _ in range(lines):
                reply = json.loads(replies.readline())
                refused += reply["kind"] == "error"
                limited += reply.get("error", {}).get("message", "").startswith("rate limited")
            writer.join(60)
        return refused, limited

    try:
        return {
            "flood": "socket",
            **_measure(home, w, flood, lambda: server.refusals.flush(final=True)),
        }
    finally:
        server.stop()
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def _forged() -> tuple[bytes, dict[str, str]]:
    payload = {"type": "block_actions", "user": {"id": "UALICE"}, "actions": []}
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    digest = hmac.new(b"not-the-secret", f"v0:{ts}:".encode() + body, hashlib.sha256)
    return body, {
        "X-Slack-Signature": f"v0={digest.hexdigest()}",
        "X-Slack-Request-Timestamp": ts,
        "Content-Type": "application/x-www-form-urlencoded",
    }


def callback_flood(posts: int, tallied: bool) -> dict[str, Any]:
    from nightshift.agent.brain.wiring import Wiring, local_now
    from nightshift.agent.doors.channels.callbacks import CallbackServer, Desk, slack_route
    from nightshift.agent.doors.channels.slack import SlackInteractivity
    from nightshift.runtime.config import ChannelsSettings, GpuSettings, Settings

    home = Path(tempfile.mkdtemp(prefix="ns-flood-home-"))
    w = Wiring(Settings(home=str(home), gpu=GpuSettings(probe="none")), server=True)
    w.audit.append("system", "eval.start")
    limits = (
        ChannelsSettings()
        if tallied
        else ChannelsSettings(
            callback_requests_per_s=OFF, callback_burst=OFF, refusals_in_full_per_minute=OFF
        )
    )
    desk = Desk(
        w.store,
        w.audit,
        w.approvals,
        None,
        local_now,
        in_full_per_minute=limits.refusals_in_full_per_minute,
    )
    said: list[str] = []
    server = CallbackServer(
        "127.0.0.1:0",
        {"/slack/interactivity": slack_route(SlackInteractivity(SECRET), desk)},
        said.append,
        limits=limits,
        refusals=desk.refusals,
    )
    server.start()
    port = int(server.address.rsplit(":", 1)[1])
    body, headers = _forged()

    def flood() -> tuple[int, int]:
        statuses: list[int] = []
        lock = threading.Lock()

        def client(n: int) -> None:
            got = []
            for _ in range(n):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("POST", "/slack/interactivity", body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    got.append(response.status)
                finally:
                    conn.close()
            with lock:
                statuses.extend(got)

        share = [posts // THREADS + (i < posts % THREADS) for i in range(THREADS)]
        threads = [threading.Thread(target=client, args=(n,)) for n in share]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(s in (401, 429) for s in statuses), statuses.count(429)

    try:
        row = _measure(home, w, flood, lambda: server.flush_refusals(final=True))
        return {"flood": "callbacks", **row}
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nightshift.evals.refusal_flood", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--lines", type=int, default=3000, help="junk socket lines (default 3,000)")
    ap.add_argument("--posts", type=int, default=2000, help="forged callbacks (default 2,000)")
    ap.add_argument("--out", default="evals/out", help="folder for the CSV (default evals/out)")
    args = ap.parse_args(argv)
    rows = []
    for tallied in (False, True):
        mode = "after (tally, rate limits)" if tallied else "before (one event each)"
        rows.append({"mode": mode, **socket_flood(args.lines, tallied)})
        rows.append({"mode": mode, **callback_flood(args.posts, tallied)})
    rows.sort(key=lambda r: (r["flood"] != "socket", r["mode"].startswith("after")))
    header = list(rows[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        cells = [f"{v:,}" if isinstance(v, int) else str(v) for v in r.values()]
        print("| " + " | ".join(cells) + " |")
    write_csv(Path(args.out) / "refusal_flood.csv", rows)
    return 0 if all(r["audit_verify"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
