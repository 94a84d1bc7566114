"""When a follow ends: a failed job is final only while nothing moved it since. A reader that
got the job's row (failed) just before its recovery requeued it and finished must not read the
recovery's end as giving up — CI once ended `logs -f` with "failed after 1 attempt(s)" on a job
that went on to succeed."""

from __future__ import annotations

from datetime import datetime

from nightshift.agent.brain.wiring import Wiring
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Job
from nightshift.runtime.store.lifecycle import JobState
from nightshift.skills.job_logs import _final

NOW = datetime(2026, 12, 8, 1, 0)


def _failed_job(w: Wiring) -> Job:
    with w.store.session() as s:
        job = Job(name="crashes", spec={}, owner="bob", state="running", max_attempts=3)
        s.add(job)
        s.flush()
        lifecycle.move_job(s, job, JobState.FAILED, NOW, reason="killed")
        s.commit()
        s.refresh(job)
        s.expunge(job)
    return job


def _recovery_finished(w: Wiring, job_id: int) -> None:
    w.audit.append("agent", "goal.finish", payload={"goal": f"recover-job-{job_id}"})


def _final_now(w: Wiring, job: Job) -> bool:
    with w.store.session() as s:
        return _final(s, job, [])


def test_a_failed_row_read_before_its_requeue_is_not_final(home) -> None:
    w = Wiring.load()
    stale = _failed_job(w)  # the follow's read of the row
    with w.store.session() as s:  # the recovery requeues the job, then its goal finishes
        job = s.get(Job, stale.id)
        assert job is not None
        lifecycle.move_job(s, job, JobState.QUEUED, NOW, reason="retry")
        s.commit()
    _recovery_finished(w, stale.id)
    assert stale.state == "failed"
    assert not _final_now(w, stale)


def test_a_recovery_that_left_the_job_failed_ends_the_follow(home) -> None:
    w = Wiring.load()
    job = _failed_job(w)
    assert not _final_now(w, job)  # recovery may still requeue it
    _recovery_finished(w, job.id + 1)  # another job's recovery says nothing about this one
    assert not _final_now(w, job)
    _recovery_finished(w, job.id)
    assert _final_now(w, job)
