"""The one job lifecycle: the states a job and an attempt can be in, what may follow what, and the
guarded transitions that are the only code writing a state, a reason or an attempt's end.

Engine, skills, loop and snapshot all move jobs through these functions (a test fails if any
other module assigns them), so every path records the same things: an attempt that ends — by
exit, loss, a limit, a pause or a cancel — gets its exit status, outcome and energy here, and a
job leaves `running` only by the table below. Each function works inside the caller's session,
so a transition commits with whatever else the caller writes, or not at all.

Each transition's audit event is written in the same transaction as the rows it moved, and binds
a digest of each row as the transition left it: the functions below note their events on the
session (runtime/store/transition_events.py says how they are chained in).

Who moved a job matters for what happens next (SkyPilot's `sky/jobs/state.py` has the shape):

- `paused` is the loop's doing — a cheap window closed, or placement preempted the job for
  another. Recovery requeues it from its newest checkpoint, and it costs no retry.
- `held` is a person's doing (`nightshift hold`, `pause_job`). Recovery never touches it; only
  `release_job` (or a cancel) moves it on, and it costs no retry either.
- `failed` is the run's doing; recovery decides, and each failed attempt counts against
  `max_attempts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlmodel import Session, col, select, update

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store import job_holds
from nightshift.runtime.store.db import Attempt, Job, is_unreadable
from nightshift.runtime.store.transition_events import note


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"  # stopped at a checkpoint by the loop; recovery requeues it
    HELD = "held"  # stopped or kept back by a person; waits for release_job
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptState(StrEnum):
    STARTING = "starting"  # claimed and recorded; the launch may not have happened yet
    RUNNING = "running"
    EXITED = "exited"  # the program ended by itself
    LOST = "lost"  # nothing can say how it ended (the machine rebooted, the pod vanished)
    STOPPED = "stopped"  # we stopped it (a limit, a pause, a hold, a cancel)


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    DIVERGED = "diverged"
    TIMEOUT = "timeout"
    STALLED = "stalled"
    EARLY_STOPPED = "early_stopped"
    PAUSED = "paused"  # the cheap window closed
    PREEMPTED = "preempted"  # placement made room for another job
    HELD = "held"  # a person paused it
    CANCELLED = "cancelled"


ACTIVE = (JobState.QUEUED, JobState.RUNNING)
ENDED_ATTEMPT = (AttemptState.EXITED, AttemptState.LOST, AttemptState.STOPPED)
# What may follow what. Every write of Job.state goes through `move_job` and this table.
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset(
        {JobState.RUNNING, JobState.HELD, JobState.CANCELLED, JobState.FAILED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.PAUSED,
            JobState.HELD,
            JobState.CANCELLED,
        }
    ),
    JobState.PAUSED: frozenset({JobState.QUEUED, JobState.HELD, JobState.CANCELLED}),
    JobState.HELD: frozenset({JobState.QUEUED, JobState.PAUSED, JobState.CANCELLED}),
    JobState.FAILED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
# How a running job stands after an attempt ended with each outcome.
JOB_AFTER: dict[Outcome, JobState] = {
    Outcome.SUCCEEDED: JobState.SUCCEEDED,
    Outcome.EARLY_STOPPED: JobState.SUCCEEDED,
    Outcome.PAUSED: JobState.PAUSED,
    Outcome.PREEMPTED: JobState.PAUSED,
    Outcome.HELD: JobState.HELD,
    Outcome.CANCELLED: JobState.CANCELLED,
}
# An attempt that ended with one of these was the run's failure: it counts against max_attempts.
# The others were stopped on purpose (or finished) and cost no retry.
FAILED_OUTCOMES = frozenset(
    {Outcome.FAILED, Outcome.LOST, Outcome.DIVERGED, Outcome.TIMEOUT, Outcome.STALLED}
)
# The outcome of an attempt that ends after a person or the loop already moved its job on (its
# process was being stopped when the exit was seen): the move says why, not the exit code.
_OUTCOME_OF_MOVED = {
    JobState.HELD: Outcome.HELD,
    JobState.PAUSED: Outcome.PREEMPTED,
    JobState.CANCELLED: Outcome.CANCELLED,
}


class IllegalTransition(SkillFailed):
    """A job was asked to move where its state does not lead (cancelled jobs stay cancelled)."""


@dataclass(frozen=True)
class Transition:
    """One job's move, as the audit records it (`job.state`)."""

    job_id: int
    before: str
    after: str
    reason: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def event(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
            **self.extra,
        }


def can_move(before: str, after: JobState) -> bool:
    try:
        return after in JOB_TRANSITIONS[JobState(before)]
    except ValueError:
        return False


# The reason a job is queued with when someone asked for its retry (retry_job): it starts without
# the backoff the loop's own retries wait, since the person has usually just fixed the cause.
RETRY_ASKED = "retry asked by "


def retry_was_asked(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(RETRY_ASKED)


def move_job(
    s: Session,
    job: Job,
    after: JobState,
    now: datetime,
    *,
    reason: str | None = None,
    by: str = "system",
    attempts: tuple[Attempt, ...] = (),
    **extra: Any,
) -> Transition:
    """Move `job` to `after` (guarded by JOB_TRANSITIONS), recording why; IllegalTransition
    otherwise. Leaving the queue clears the hold reason; entering it clears the old reason."""
    before = job.state
    if not can_move(before, after):
        raise IllegalTransition(
            f"job {job.id} is {before}; it cannot become {after.value}"
            + (
                f" (from {before} it can become "
                f"{', '.join(sorted(s.value for s in JOB_TRANSITIONS[JobState(before)]))})"
                if before in JobState.__members__.values() and JOB_TRANSITIONS[JobState(before)]
                else ""
            )
        )
    job.state = after.value
    job.reason = reason
    job.updated_at = now
    s.add(job)
    assert job.id is not None
    job_holds.clear(s, job.id)
    moved = Transition(job.id, before, after.value, reason, dict(extra))
    note(s, "job.state", moved.event(), by=by, job_id=job.id, jobs=(job,), attempts=attempts)
    return moved


def claim(s: Session, job_id: int, now: datetime) -> Job | None:
    """queued → running as the transaction's first statement (a conditional update, so it takes
    SQLite's write lock before anything is read): of two loops placing the same job one claims
    it, the other gets None. On PostgreSQL a row another daemon is claiming is skipped."""
    if s.connection().dialect.name == "postgresql":
        free = s.exec(
            select(Job.id)
            .where(col(Job.id) == job_id, col(Job.state) == JobState.QUEUED.value)
            .with_for_update(skip_locked=True)
        ).first()
        if free is None:
            return None
    claimed = s.exec(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.state) == JobState.QUEUED.value)
        .values(state=JobState.RUNNING.value, updated_at=now, reason=None)
    )
    if claimed.rowcount != 1:
        return None
    job_holds.clear(s, job_id)
    return s.get(Job, job_id, populate_existing=True)  # as the update left it


def started(s: Session, job: Job, att: Attempt, *, gpus: list[int], argv: list[str]) -> Transition:
    """The claim's event, once its attempt is recorded (the claim itself is the transaction's
    first statement): queued → running with attempt N, bound to both rows."""
    assert job.id is not None
    moved = Transition(
        job.id,
        JobState.QUEUED.value,
        JobState.RUNNING.value,
        None,
        {"attempt": att.number, "gpus": gpus, "argv": argv},
    )
    note(s, "job.state", moved.event(), job_id=job.id, jobs=(job,), attempts=(att,))
    return moved


def fail_queued(s: Session, job_id: int, reason: str, now: datetime) -> bool:
    """queued → failed for a job that cannot run (its stored spec cannot be loaded); a job that
    left the queue meanwhile is left alone. True when it moved."""
    moved = s.exec(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.state) == JobState.QUEUED.value)
        .values(state=JobState.FAILED.value, reason=reason, updated_at=now)
    )
    if moved.rowcount != 1:
        return False
    job_holds.clear(s, job_id)
    job = s.get(Job, job_id, populate_existing=True)
    assert job is not None
    # a stored spec or parameters that are not JSON (a hand edit) cannot be read: the event binds
    # no digest of the row, and `audit verify` names it
    readable = not (is_unreadable(job.spec) or is_unreadable(job.params))
    event = Transition(job_id, JobState.QUEUED.value, JobState.FAILED.value, reason).event()
    note(s, "job.state", event, job_id=job_id, jobs=(job,) if readable else ())
    return True


def attempt_running(s: Session, att: Attempt, handle: dict[str, Any], executor: str) -> None:
    """starting → running, with the executor's handle that lets a new process re-attach."""
    att.handle, att.state, att.executor = handle, AttemptState.RUNNING.value, executor
    s.add(att)
    note(
        s,
        "attempt.running",
        {"job_id": att.job_id, "attempt": att.number, "executor": executor},
        job_id=att.job_id,
        attempts=(att,),
    )


def attempt_energy(
    power_w: float | None, start: datetime, end: datetime
) -> tuple[float | None, str]:
    """kWh of one attempt from the spec's declared draw; None where nothing measures or declares
    it (a GPU's own energy counter, where one exists, is read by the health check samples)."""
    if power_w is None:
        return None, "none"
    hours = max(0.0, (end - start).total_seconds()) / 3600
    return power_w * hours / 1000, "declared_power"


@dataclass(frozen=True)
class Ended:
    """How a run ended, as the executor (or the stop) reported it."""

    state: AttemptState
    exit_code: int | None = None
    signal: int | None = None
    detail: str | None = None

    @classmethod
    def of(cls, status: Any, *, stopped: bool = False) -> Ended:
        """From an executor's RunStatus: `stopped` when we stopped the run (a pause, a hold, a
        cancel); else exited or lost as the executor saw it (a run still `running` after a
        stop counts as stopped)."""
        if stopped or status.state not in ("exited", "lost"):
            state = AttemptState.STOPPED
        else:
            state = AttemptState(status.state)
        return cls(state, status.exit_code, status.signal, status.detail)


def end_attempt(
    s: Session,
    att: Attempt,
    how: Ended,
    now: datetime,
    *,
    outcome: Outcome | None = None,
    reason: str | None = None,
    by: str = "system",
    mono: tuple[float, str] | None = None,
    diagnosis: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
) -> Transition | None:
    """Record the end of `att` once — exit status, outcome, energy — and move its job on if it
    was still running. None (nothing written) when the attempt had already ended. `mono`: the
    monotonic clock and boot id now, kept when the attempt started on this boot (retry backoff
    counts from it). `diagnosis`: why it failed (runtime/training/attempt_diagnosis.py), kept
    when the outcome is one of the run's failures; the caller computed it before this write;
    `machine`: what the machine said as it ended (MachineEvidence's dump), kept with it likewise.

    With no `outcome`, a clean exit 0 succeeded, a lost run is `lost`, anything else failed; a
    job that a person or the loop had already moved (held, paused, cancelled) gives the outcome
    its move meant, whatever the exit code of the stopped process."""
    if att.state in ENDED_ATTEMPT:
        return None
    outcome = Outcome(outcome) if outcome is not None else None  # a plain string names one too
    job = s.get(Job, att.job_id)
    assert job is not None
    ok = how.state is AttemptState.EXITED and how.exit_code == 0 and outcome is None
    if outcome is None:
        moved = _OUTCOME_OF_MOVED.get(JobState(job.state)) if job.state in _MOVED else None
        if moved is not None:
            outcome = moved
        elif how.state is AttemptState.LOST:
            outcome = Outcome.LOST
        else:
            outcome = Outcome.SUCCEEDED if ok else Outcome.FAILED
    if how.state is AttemptState.LOST and how.detail:
        att.evidence = how.detail
    att.outcome = outcome.value
    att.state = how.state.value
    att.exit_code, att.signal, att.ended_at = how.exit_code, how.signal, now
    att.ended_mono = mono[0] if mono is not None and mono[1] == att.boot_id else None
    att.energy_kwh, att.energy_source = attempt_energy(_power_w(job.spec), att.started_at, now)
    if diagnosis is not None and outcome in FAILED_OUTCOMES:
        att.diagnosis = diagnosis
    if machine is not None and outcome in FAILED_OUTCOMES:
        att.machine = machine
    s.add(att)
    if job.state != JobState.RUNNING.value:
        payload = {"job_id": job.id, "attempt": att.number, "outcome": outcome.value}
        note(s, "attempt.ended", payload, by=by, job_id=job.id, attempts=(att,))
        return None
    why = reason or how.detail
    if why is None and outcome is Outcome.FAILED:
        why = f"attempt {att.number} exited with code {how.exit_code}" + (
            f" (signal {how.signal})" if how.signal else ""
        )
    return move_job(
        s,
        job,
        JOB_AFTER.get(outcome, JobState.FAILED),
        now,
        reason=why,
        by=by,
        attempts=(att,),
        attempt=att.number,
        outcome=outcome.value,
        exit_code=how.exit_code,
        signal=how.signal,
        last_step=att.last_step,
    )


_MOVED = {s.value for s in _OUTCOME_OF_MOVED}


def _power_w(spec: dict[str, Any]) -> float | None:
    resources = spec.get("resources") if isinstance(spec, dict) else None
    value = resources.get("power_w") if isinstance(resources, dict) else None
    return float(value) if isinstance(value, int | float) else None


def record_cause(
    s: Session, log_path: str, category: str | None, diagnosis: dict[str, Any] | None = None
) -> None:
    """The diagnosed failure category, on the attempt whose log was read (for reports), with the
    diagnosis it came from: it replaces the one the loop stored as the attempt ended, so what
    `nightshift why` shows is what recovery acted on. Never by one that read less: a stored
    diagnosis built with the machine's evidence is kept against one built without it (a caller
    that did not pass the attempt's `machine` on), and a model's second opinion stays with it."""
    att = s.exec(select(Attempt).where(Attempt.log_path == log_path)).first()
    if att is None:
        return
    kept = att.diagnosis if isinstance(att.diagnosis, dict) else {}
    if diagnosis is not None and kept.get("machine") and not diagnosis.get("machine"):
        diagnosis = None
    if diagnosis is not None and kept.get("second_opinion") and not diagnosis.get("second_opinion"):
        diagnosis = {**diagnosis, "second_opinion": kept["second_opinion"]}
    if diagnosis is not None and att.outcome in FAILED_OUTCOMES and att.diagnosis != diagnosis:
        att.diagnosis = diagnosis
        s.add(att)
    if att.cause != category:
        att.cause = category
        s.add(att)
        payload = {"job_id": att.job_id, "attempt": att.number, "cause": category}
        note(s, "attempt.cause", payload, job_id=att.job_id, attempts=(att,))


def attach_opinion(s: Session, attempt_id: int, opinion: dict[str, Any]) -> bool | None:
    """A model's second opinion, come after the attempt's diagnosis was stored, kept beside it
    (agent/brain/second_opinion.py). None while the attempt has not ended yet (the loop records
    the end after it asked: try again); False when it ended with no diagnosis to keep it in."""
    att = s.get(Attempt, attempt_id)
    if att is None:
        return False
    if att.state not in ENDED_ATTEMPT:
        return None
    if not isinstance(att.diagnosis, dict) or att.outcome not in FAILED_OUTCOMES:
        return False
    att.diagnosis = {**att.diagnosis, "second_opinion": opinion}
    s.add(att)
    return True


def failures(outcomes: list[str | None]) -> int:
    """Attempts that count against max_attempts: the run's failures, not pauses or holds."""
    return sum(1 for o in outcomes if o in FAILED_OUTCOMES)


def submitted(s: Session, rows: list[dict[str, Any]], *, by: str) -> None:
    """New jobs (their column values, with ids), each bound by a `job.submitted` event."""
    for row in rows:
        payload = {"job_id": row["id"], "name": row["name"], "state": row["state"]}
        note(s, "job.submitted", payload, by=by, job_id=row["id"], jobs=(row,))
