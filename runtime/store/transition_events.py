"""The audit events of the lifecycle's transitions, written in the transaction of the rows they
moved: the lifecycle notes each event on its session, and a hook chains them in (through
`Store.recorder`, the audit log) just before the session commits, with digests of the rows as
they will be committed (runtime/store/row_digest.py). A rollback drops them with the rows.

The same bindings let the engine refuse to launch a job whose content no longer matches what its
newest event recorded, or that no event submitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlmodel import Session, col, select

from nightshift.runtime.store import row_digest
from nightshift.runtime.store.db import STORE_INFO, Attempt, AuditEvent, Job, KeyValue

_NOTES = "nightshift.audit_notes"
_AFTER = "nightshift.audit_after_commit"
# Events that bind a job row (the others bind attempts only).
JOB_BINDING = ("job.submitted", "job.state")
# Jobs and attempts up to these ids were made before rows were audited (migration 0009).
ROWS_AFTER_JOB, ROWS_AFTER_ATTEMPT = "audit.rows_after_job", "audit.rows_after_attempt"


@dataclass
class _Note:
    action: str
    actor: str
    job_id: int | None
    payload: dict[str, Any]
    jobs: tuple[Job | dict[str, Any], ...]
    attempts: tuple[Attempt, ...]


def note(
    s: Session,
    action: str,
    payload: dict[str, Any],
    *,
    by: str = "system",
    job_id: int | None = None,
    jobs: tuple[Job | dict[str, Any], ...] = (),
    attempts: tuple[Attempt, ...] = (),
) -> None:
    """Queue an audit event on the session; it is chained in, with the digests of `jobs` and
    `attempts` as they are then, just before the session commits (and dropped on rollback)."""
    s.info.setdefault(_NOTES, []).append(_Note(action, by, job_id, payload, jobs, attempts))


@event.listens_for(Session, "before_commit")
def _write_notes(s: Session) -> None:
    notes: list[_Note] = s.info.pop(_NOTES, [])
    store = s.info.get(STORE_INFO)
    recorder = getattr(store, "recorder", None)
    if not notes or recorder is None:
        return
    s.flush()  # ids for new rows, and the rows as they will commit
    events = []
    for n in notes:
        rows: dict[str, Any] = {}
        if n.jobs:
            rows["jobs"] = {str(_id(j)): row_digest.job_row(j) for j in n.jobs}
        if n.attempts:
            rows["attempts"] = {str(a.id): row_digest.attempt_row(a) for a in n.attempts}
        events.append(
            {
                "actor": n.actor,
                "action": n.action,
                "job_id": n.job_id,
                "payload": {**n.payload, "rows": rows},
            }
        )
    s.info[_AFTER] = recorder.record_in(s.connection(), events)


@event.listens_for(Session, "after_commit")
def _after_notes(s: Session) -> None:
    after = s.info.pop(_AFTER, None)
    if after is not None:
        after()


@event.listens_for(Session, "after_soft_rollback")
def _drop_notes(s: Session, previous_transaction: Any) -> None:
    s.info.pop(_NOTES, None)
    s.info.pop(_AFTER, None)


def _id(job: Job | dict[str, Any]) -> int:
    return int(job["id"] if isinstance(job, dict) else job.id)  # type: ignore[arg-type]


def unaudited_content(s: Session, job: Job) -> str | None:
    """Why `job` must not be launched — its content differs from what its newest event bound,
    or it has no event though it was made after rows were audited (written into the store
    directly) — or None. Without an audit log on the store nothing is checked."""
    store = s.info.get(STORE_INFO)
    recorder = getattr(store, "recorder", None)
    if recorder is None or job.id is None:
        return None
    bound = s.exec(
        select(AuditEvent)
        .where(AuditEvent.job_id == job.id, col(AuditEvent.action).in_(JOB_BINDING))
        .order_by(col(AuditEvent.id).desc())
        .limit(1)
    ).first()
    binding = None
    if bound is not None and isinstance(bound.payload, dict):
        binding = ((bound.payload.get("rows") or {}).get("jobs") or {}).get(str(job.id))
    if binding is None or bound is None:
        legacy = s.get(KeyValue, ROWS_AFTER_JOB)
        if legacy is not None and legacy.value.isdigit() and job.id <= int(legacy.value):
            return None  # made before rows were audited: nothing to compare with
        return (
            f"job {job.id} has no audit event that submitted it: it was written into the store "
            "directly, not submitted through nightshift"
        )
    if not recorder.authentic(bound):
        return (
            f"the audit event {bound.id} that binds job {job.id} is not authentic (its hash or "
            "signature does not match): it was forged"
        )
    if binding.get("content") != row_digest.job_content(job):
        return (
            f"job {job.id}'s spec, parameters or owner in the store differ from what audit event "
            f"{bound.id} recorded when it was last changed through nightshift: the row was "
            "edited behind nightshift's back"
        )
    return None
