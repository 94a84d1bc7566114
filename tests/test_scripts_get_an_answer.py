"""Scripts get an answer (issue 27): with no terminal nobody can type y or wait for a vote, so a
call that needs an approval exits 4 at once naming it (--json: an object), `--yes` confirms one's
own call where the policy lets the requester, and `--wait` blocks until others decide. The real
CLI in subprocesses with stdin from /dev/null, as cron or a CI job runs it; each has a timeout,
so a command that blocks fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.runtime.store.db import Approval, Job

from conftest import REPO, nightshift

# A job that waits for a GPU this machine does not have: it stays queued.
SPEC = {"name": "waits-for-gpu", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}
# Far less than the approval's hour: a command that blocks fails here.
AT_ONCE_S = 30


def queued_job() -> int:
    w = Wiring.load()
    with w.store.session() as s:
        job = Job(name="waits-for-gpu", spec=SPEC, owner=w.user, priority=1)
        s.add(job)
        s.flush()
        return job.id  # type: ignore[return-value]


def script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a script runs it: no terminal on stdin."""
    return nightshift(*args, env=env, stdin=subprocess.DEVNULL, timeout=AT_ONCE_S)


def approvals(w: Wiring) -> list[Approval]:
    from sqlmodel import select

    with w.store.session() as s:
        return list(s.exec(select(Approval).order_by(Approval.id)))


def wait_for(predicate, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def two_person(home: Path, tmp_path: Path, monkeypatch) -> Path:
    """The shipped policy with its destroy rule made a two-person rule (`from_others: true`)."""
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    (rule,) = [r for r in policy["approvals"] if r["id"] == "destroy-needs-confirmation"]
    rule["from_others"] = True
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    monkeypatch.setenv("NIGHTSHIFT_POLICY__FILE", str(path))
    return path


def test_a_script_cancel_exits_4_at_once_naming_the_approval(home):
    job_id = queued_job()
    r = script("cancel", str(job_id))
    assert r.returncode == 4, (r.stdout, r.stderr)
    w = Wiring.load()
    (row,) = approvals(w)
    assert row.state == "pending" and row.skill == "cancel_job" and row.votes == []
    assert r.stderr.count("error:") == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    said = " ".join(r.stderr.split())
    assert f"approval {row.id} needed for cancel_job" in said
    assert f"nightshift approvals approve {row.id}" in said
    assert "--wait" in said and "--yes" in said and "Traceback" not in said
    assert w.store.job(job_id).state == "queued"

    # --json: an object a script parses, naming the approval (the error line stays on stderr).
    r = script("cancel", str(job_id), "--json")
    assert r.returncode == 4, (r.stdout, r.stderr)
    got = json.loads(r.stdout)
    second = approvals(w)[-1]
    assert got == {
        "approval_id": second.id,
        "state": "pending",
        "skill": "cancel_job",
        "call_id": second.call_id,
        "rule": "destroy-needs-confirmation",
        "quorum": 1,
    }
    assert w.store.job(job_id).state == "queued"


def test_cancel_yes_confirms_ones_own_cancel_as_the_requester(home):
    job_id = queued_job()
    r = script("cancel", str(job_id), "--yes")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"job {job_id}: queued → cancelled" in r.stdout
    assert "confirmed with --yes" in r.stderr
    w = Wiring.load()
    assert w.store.job(job_id).state == "cancelled"
    (row,) = approvals(w)
    assert row.state == "executed" and row.requested_via == "terminal"
    assert row.requester == w.user
    assert [(v["principal"], v["approve"], v["confirmation"]) for v in row.votes] == [
        (row.requester, True, True)
    ]
    (confirmed,) = w.audit.events(action="approval.confirmed", call_id=row.call_id)
    assert confirmed.actor == w.user and confirmed.payload["approval_id"] == row.id
    (start,) = w.audit.events(action="skill.start", call_id=row.call_id)
    assert start.actor == w.user

    # `skill NAME --yes --json`: the same, with the result alone on stdout.
    other = queued_job()
    r = script("skill", "cancel_job", "--arg", f"job_id={other}", "--yes", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["after"] == "cancelled"
    assert w.store.job(other).state == "cancelled"


def test_yes_cannot_stand_in_for_other_principals(home, two_person):
    job_id = queued_job()
    for argv in (
        ["cancel", str(job_id), "--yes"],
        ["skill", "cancel_job", "--arg", f"job_id={job_id}", "--yes"],
    ):
        r = script(*argv)
        assert r.returncode == 4, (r.stdout, r.stderr)
        assert "which --yes cannot give" in " ".join(r.stderr.split()), r.stderr
    w = Wiring.load()
    assert w.store.job(job_id).state == "queued"
    rows = approvals(w)
    assert [(a.state, a.votes) for a in rows] == [("pending", []), ("pending", [])]
    assert not w.audit.events(action="approval.confirmed")


def test_wait_blocks_until_another_principal_decides(home, two_person):
    job_id = queued_job()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "cancel", str(job_id), "--wait"],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    w = Wiring.load()
    try:
        row = wait_for(lambda: next(iter(approvals(w)), None))
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()  # still waiting for a vote
        assert w.store.job(job_id).state == "queued"
        # Bob, another person (as the kernel would name his uid) votes yes.
        assert w.approvals.vote(row.id, "bob", True, local_now()).state == "approved"
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert f"approval {row.id} needed" in out and f"job {job_id}: queued → cancelled" in out
    assert w.store.job(job_id).state == "cancelled"
    done = w.approvals.get(row.id)
    assert done.state == "executed" and [v["principal"] for v in done.votes] == ["bob"]


def test_wait_with_json_keeps_stdout_for_the_answer(home):
    """`skill --wait --json`: what the wait says goes to stderr; a rejection is exit 3."""
    job_id = queued_job()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nightshift.agent.doors.cli",
            "skill",
            "cancel_job",
            "--arg",
            f"job_id={job_id}",
            "--wait",
            "--json",
        ],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    w = Wiring.load()
    try:
        row = wait_for(lambda: next(iter(approvals(w)), None))
        assert w.approvals.vote(row.id, "bob", False, local_now()).state == "rejected"
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (out, err)
    assert out == "" and f"approval {row.id} needed" in err and "rejected" in err
    assert w.store.job(job_id).state == "queued"


# The same through a shared install's daemon -------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[dict[str, str]]:
    """`nightshift daemon` serving its socket; the environment of a CLI that is its client."""
    from test_socket_api import _base_env, cli, short_dir, wait_for_socket

    root = tmp_path_factory.mktemp("served")
    run = short_dir()
    sock, log = run / "api.sock", root / "daemon.log"
    env = _base_env(root / "home", sock)
    # Its jobs never start here (no GPU), but a daemon that serves others keeps runs out of its home.
    env["NIGHTSHIFT_EXECUTOR__RUNS_DIR"] = str(root / "runs")
    with open(log, "w") as out:
        proc = subprocess.Popen(cli("daemon"), cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        wait_for_socket(sock, proc, log)
        yield {**env, "NIGHTSHIFT_API__MODE": "client"}
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(run, ignore_errors=True)


def test_through_the_daemon_a_script_gets_exit_4_or_confirms_with_yes(served, tmp_path):
    from test_socket_api import ME, queued_spec

    def client(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "nightshift.agent.doors.cli", *args],
            cwd=REPO,
            env=served,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=AT_ONCE_S,
        )

    r = client("submit", str(queued_spec(tmp_path, "script-through-socket")), "--json")
    assert r.returncode == 0, r.stderr
    (job_id,) = json.loads(r.stdout)["job_ids"]

    r = client("cancel", str(job_id), "--json")
    assert r.returncode == 4, (r.stdout, r.stderr)
    parked = json.loads(r.stdout)
    assert parked["state"] == "pending" and parked["skill"] == "cancel_job"
    assert f"approval {parked['approval_id']} needed for cancel_job" in " ".join(r.stderr.split())
    shown = json.loads(client("show", str(job_id), "--json").stdout)
    assert shown["state"] == "queued"

    r = client("cancel", str(job_id), "--yes")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"job {job_id}: queued → cancelled" in r.stdout
    every = json.loads(client("approvals", "list", "--all", "--json").stdout)
    mine = [a for a in every if a["args"].get("job_id") == job_id]
    assert [a["state"] for a in mine] == ["pending", "executed"]
    assert [(v["principal"], v["confirmation"]) for v in mine[1]["votes"]] == [(ME, True)]
