"""Following a job through a shared daemon is one audited decision, not an audited read per
poll: the audit of a follow is its verdict and its end (with how many lines and bytes went out),
the same for a job that prints ten lines as for one that prints two thousand, however long it
runs. The count is taken from outside nightshift, on the store's audit table with sqlite3."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from served_daemon import Daemon, served


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    with served(tmp_path_factory.mktemp("follow-audit")) as d:
        yield d


PROGRAM = """\
import os, signal, sys, time
lines, marker = int(sys.argv[1]), sys.argv[2]
first = not os.path.exists(marker)
open(marker, "a").close()
for i in range(lines // 2):
    print("line", i, "of attempt", 1 if first else 2, flush=True)
    time.sleep(1.5 / (lines // 2))
if first:
    os.kill(os.getpid(), signal.SIGKILL)  # killed: retried
"""


def _submit(daemon: Daemon, tmp_path: Path, lines: int) -> int:
    """A job printing `lines` lines over about three seconds, across two attempts: the first
    is killed half way, the retry prints the other half and succeeds."""
    program = tmp_path / "prints.py"
    program.write_text(PROGRAM)
    r = daemon.run(
        "submit",
        "--json",
        "--retries",
        "2",
        "--name",
        f"prints-{lines}",
        "--",
        sys.executable,
        str(program),
        str(lines),
        str(tmp_path / "began"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    (job_id,) = json.loads(r.stdout)["job_ids"]
    return int(job_id)


def _follow_events(daemon: Daemon, job_id: int) -> list[tuple[str, dict]]:
    """The audit rows a follow of `job_id` left: the job_logs decisions and reads about it."""
    with sqlite3.connect(daemon.home / "nightshift.db") as db:
        rows = db.execute(
            "SELECT action, payload FROM auditevent WHERE skill = 'job_logs' AND job_id = ?",
            (job_id,),
        ).fetchall()
    return [(action, json.loads(payload)) for action, payload in rows]


@pytest.mark.parametrize("lines", [10, 2000])
def test_a_follow_is_two_audit_events_however_much_it_reads(
    daemon: Daemon, tmp_path: Path, lines: int
) -> None:
    """A client of the daemon follows a job across its crash and resume to success (exit 0,
    both headers): the audit holds the follow's verdict and its end, whatever the log's size."""
    job_id = _submit(daemon, tmp_path, lines)
    f = daemon.run("logs", str(job_id), "-f", "-n", "5000", timeout=180)
    assert f.returncode == 0, f.stdout + f.stderr + daemon.log.read_text()[-3000:]
    out = f.stdout.splitlines()
    headers = [x for x in out if x.startswith("── attempt")]
    assert headers == ["── attempt 1 ──", "── attempt 2 (from scratch) ──"], out[:20]
    assert out[-1] == f"line {lines // 2 - 1} of attempt 2", out[-5:]
    assert len([x for x in out if x.startswith("line ")]) == lines, out
    events = _follow_events(daemon, job_id)
    assert [a for a, _ in events] == ["policy.verdict", "logs.follow.end"], events
    end = events[-1][1]
    assert end["ended"] == "succeeded" and end["lines"] == len(out) - 2, (end, len(out))
    assert "of attempt" not in json.dumps(events)  # counts, never the log's lines


def test_a_follow_of_another_persons_job_is_refused_by_the_same_rule_as_its_logs(home) -> None:
    """The follow's one decision is job_logs' own: bob may follow his job (one audit event, the
    verdict, before any read); alice is refused by the shipped others-job-logs rule, audited as a
    refused call, and reads nothing."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.errors import PolicyDenied
    from nightshift.runtime.store.db import Job

    w = Wiring.load()
    with w.store.session() as s:
        s.add(Job(id=20, name="bobs", spec={}, owner="bob"))
    before = len(list(w.audit.events()))
    verdict = w.gate.decide(w.context("bob", "follow-1"), "job_logs", {"job_id": 20})
    assert verdict.decision == "allow"
    with pytest.raises(PolicyDenied, match="others-job-logs"):
        w.gate.decide(w.context("alice", "follow-2"), "job_logs", {"job_id": 20})
    new = [(e.actor, e.action) for e in list(w.audit.events())[before:]]
    assert new == [
        ("bob", "policy.verdict"),
        ("alice", "policy.verdict"),
        ("alice", "skill.refused"),
    ], new
