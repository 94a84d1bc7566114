"""Approvals as people live with them, through the real CLI: the requester confirms at a terminal,
others vote from their own shells, and an approved call is carried out exactly once — also when
the shell that asked was killed, and when several processes resume it at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.runtime.store.db import Approval, Job

from conftest import REPO, nightshift

# A job that waits for a GPU this machine does not have: it stays queued while the daemon ticks.
SPEC = {"name": "waits-for-gpu", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}


def queued_job(home) -> int:
    w = Wiring.load()
    with w.store.session() as s:
        # The caller's own job: another person's would need someone else's vote.
        job = Job(name="waits-for-gpu", spec=SPEC, owner=w.user, priority=1)
        s.add(job)
        s.flush()
        return job.id  # type: ignore[return-value]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nightshift.agent.doors.cli", *args]


def wait_for(predicate, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("timed out")


def approvals(w: Wiring) -> list[Approval]:
    with w.store.session() as s:
        from sqlmodel import select

        return list(s.exec(select(Approval).order_by(Approval.id)))


def starts(w: Wiring, call_id: str) -> int:
    return len(w.audit.events(action="skill.start", call_id=call_id))


def agent_cancel_approved(w: Wiring, job_id: int, call_id: str) -> int:
    """The agent asks to cancel `job_id` (parked for approval) and alice approves; the id."""
    from nightshift.agent.doors.api import Client
    from nightshift.runtime.errors import ApprovalRequired

    with pytest.raises(ApprovalRequired) as info:
        Client(w, principal="agent").call("cancel_job", {"job_id": job_id}, call_id=call_id)
    w.approvals.vote(info.value.approval_id, "alice", True, w.context("alice").now)
    return info.value.approval_id


def test_requester_killed_after_asking_the_daemon_carries_the_call_out_once(home):
    """`nightshift skill cancel_job --wait` from a script waits for another principal; kill -9 it, let
    bob approve, and the daemon cancels the job — once, as the requester, audited."""
    job_id = queued_job(home)
    env = {**os.environ, "COLUMNS": "200"}
    asker = subprocess.Popen(
        cli("skill", "cancel_job", "--arg", f"job_id={job_id}", "--wait"),
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    w = Wiring.load()
    try:
        row = wait_for(lambda: next(iter(approvals(w)), None))
        assert row.state == "pending" and row.skill == "cancel_job"
        asker.send_signal(signal.SIGKILL)
        asker.wait(10)
    finally:
        if asker.poll() is None:
            asker.kill()
    # The requester cannot approve its own call from another shell, nor pose as someone else
    # there (who asks is the kernel's OS user, not a setting).
    r = nightshift("approvals", "approve", str(row.id))
    assert r.returncode == 3 and "requester never counts" in r.stderr, r.stderr
    r = nightshift("approvals", "approve", str(row.id), env={"NIGHTSHIFT_POLICY__PRINCIPAL": "bob"})
    assert r.returncode == 5 and "policy.principal is no longer a setting" in r.stderr, r.stderr
    assert w.approvals.get(row.id).state == "pending"
    # Bob, another person: his vote as the kernel would name his uid (tests/test_multi_user.py
    # has him vote from his own OS account, through the daemon's socket).
    assert w.approvals.vote(row.id, "bob", True, local_now()).state == "approved"
    assert w.store.job(job_id).state == "queued"  # nobody has carried it out yet

    for _ in range(2):  # a second daemon finds nothing left to do
        r = nightshift("daemon", "--max-ticks", "2", env={"NIGHTSHIFT_GPU__PROBE": "none"})
        assert r.returncode == 0, r.stderr
    assert w.store.job(job_id).state == "cancelled"
    done = w.approvals.get(row.id)
    assert done.state == "executed" and done.result["after"] == "cancelled"
    assert starts(w, row.call_id) == 1
    start = w.audit.events(action="skill.start", call_id=row.call_id)[0]
    assert start.actor == row.requester and start.payload["approval_id"] == row.id

    shown = nightshift("approvals", "show", str(row.id), "--json")
    assert json.loads(shown.stdout)["state"] == "executed"
    listed = nightshift("approvals", "list", "--all")
    assert "executed" in listed.stdout and "cancel_job" in listed.stdout


def test_processes_resuming_one_approved_call_run_it_once(home):
    """Four processes call the same approved call id at once: one claims and runs it, the others
    return its recorded result."""
    job_id = queued_job(home)
    w = Wiring.load()
    aid = agent_cancel_approved(w, job_id, "race-1")
    code = (
        "import json, sys; from nightshift.agent.doors.api import Client; "
        f"r = Client(principal='agent').call('cancel_job', {{'job_id': {job_id}}}, "
        "call_id='race-1'); print(json.dumps(r.model_dump()))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    results = [json.loads(o) for o, _ in outs]
    assert all(r == results[0] for r in results) and results[0]["after"] == "cancelled"
    assert starts(w, "race-1") == 1
    assert w.approvals.get(aid).state == "executed"


def test_a_claim_left_by_a_killed_process_is_taken_over(home):
    """A process killed after claiming an approved call (mid-run) leaves it `executing`; the
    loop sees the claimer is dead and finishes the call (idempotent on the call id)."""
    from nightshift.policies.approvals import claimer_id

    job_id = queued_job(home)
    w = Wiring.load()
    aid = agent_cancel_approved(w, job_id, "dead-1")
    now = w.context("alice").now
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host, _, _ = claimer_id().split(":")
    dead = f"{host}:{gone.pid}:1.000"
    assert w.approvals.claim(aid, dead, now).claimed_by == dead
    assert [r.id for r in w.approvals.orphaned(now)] == [aid]
    w.loop.carry_out_approved = True
    w.loop._carry_out_orphans()
    row = w.approvals.get(aid)
    assert row.state == "executed" and w.store.job(job_id).state == "cancelled"
    claimed = w.audit.events(action="approval.claimed", call_id="dead-1")
    assert [e.payload["taken_from"] for e in claimed] == [None, dead]


def test_a_person_at_a_terminal_confirms_a_cancel_with_y(home):
    """At a terminal, `nightshift cancel N` shows the request and asks y/N: y cancels it there."""
    job_id = queued_job(home)
    master, slave = os.openpty()
    proc = subprocess.Popen(
        cli("cancel", str(job_id)),
        cwd=REPO,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    os.close(slave)
    w = Wiring.load()
    try:
        wait_for(lambda: next(iter(approvals(w)), None))
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert "[y/N]" in out and '"job_id": ' in out
    assert w.store.job(job_id).state == "cancelled"
    row = approvals(w)[0]
    assert row.state == "executed" and row.requested_via == "terminal"
    assert row.votes[0]["confirmation"] is True
    assert w.audit.events(action="approval.confirmed")


def test_a_terminal_no_leaves_the_job_alone(home):
    job_id = queued_job(home)
    master, slave = os.openpty()
    proc = subprocess.Popen(
        cli("cancel", str(job_id)),
        cwd=REPO,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    w = Wiring.load()
    try:
        wait_for(lambda: next(iter(approvals(w)), None))
        os.write(master, b"\n")  # Enter alone is the default: no
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 3 and "rejected" in err, (out, err)
    assert w.store.job(job_id).state == "queued"
