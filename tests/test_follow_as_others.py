"""A follow through a shared daemon with real OS users: alice may follow her own job (the
follow's one audited verdict, allow); bob, following alice's job, is refused at once by the
shipped policy's others-job-logs rule, the rule `nightshift logs` obeys, and reads nothing.

Uses test_multi_user's install (root, useradd; skips with the reason otherwise)."""

from __future__ import annotations

import signal
import time

import pytest
from test_multi_user import Install, audit, install, submit

pytestmark = pytest.mark.service
__all__ = ["install"]  # the module's fixture, used here


def test_bob_cannot_follow_alices_job_and_alice_can(install: Install) -> None:
    job_id = submit(install, install.alice, "alices-followed")  # queued: no GPU here
    bob = install.run(install.bob, "logs", str(job_id), "-f")
    assert bob.returncode == 3, (bob.returncode, bob.stdout, bob.stderr)
    assert "others-job-logs" in bob.stderr and "Traceback" not in bob.stderr
    assert bob.stdout == ""

    alice = install.popen(install.alice, "logs", str(job_id), "-f")
    try:
        assert alice.stderr is not None
        said = alice.stderr.readline()
        assert "waiting for its first attempt" in said, said
        alice.send_signal(signal.SIGINT)
        _, rest = alice.communicate(timeout=60)
    finally:
        if alice.poll() is None:
            alice.kill()
    assert alice.returncode == 130, rest

    end = time.monotonic() + 30  # the daemon notices the hang-up, then audits the follow's end
    while True:
        rows = audit(install, job_id=job_id, skill="job_logs")
        actions = [(r["actor"], r["action"]) for r in rows]
        if actions[-1][1] == "logs.follow.end" or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert actions[:2] == [
        (install.bob.name, "policy.verdict"),
        (install.bob.name, "skill.refused"),
    ], actions
    assert actions[2:] == [
        (install.alice.name, "policy.verdict"),
        (install.alice.name, "logs.follow.end"),
    ], actions
