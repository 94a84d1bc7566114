"""Digests of the job and attempt rows as the lifecycle left them, bound into the audit events
of each transition: `audit verify` recomputes them from the rows and names any row edited,
inserted, flipped or deleted behind nightshift's back, and the engine refuses to launch a job
whose content no longer matches the digest its last event recorded.

A job's *content* is what decides what runs and as whom (spec, parameters, owner, resume point,
…); its *row* digest adds the state and the reason. Fields that change without a transition —
the hold reason of the last tick, progress counters, metric cursors — are left out."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nightshift.runtime.store.db import Attempt, Job, dumps

JOB_CONTENT = (
    "name",
    "spec",
    "spec_path",
    "params",
    "priority",
    "owner",
    "resume_from",
    "resume_step",
    "max_attempts",
    "group",
    "submitted_by_call",
)
ATTEMPT_FIELDS = (
    "job_id",
    "number",
    "key",
    "state",
    "executor",
    "node",
    "host",
    "handle",
    "argv",
    "params",
    "gpus",
    "start_step",
    "exit_code",
    "signal",
    "outcome",
    "cause",
    "energy_kwh",
    "ended_at",
)


def _digest(values: Any) -> str:
    return hashlib.sha256(dumps(values).encode("utf-8")).hexdigest()


def _values(row: Job | Attempt | Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        v = row.get(f) if isinstance(row, Mapping) else getattr(row, f)
        out[f] = v.isoformat(sep=" ") if isinstance(v, datetime) else v
    return out


def job_content(job: Job | Mapping[str, Any]) -> str:
    """What the job runs, with which parameters, as whom, from where."""
    return _digest(_values(job, JOB_CONTENT))


def job_row(job: Job | Mapping[str, Any]) -> dict[str, str]:
    """The job's binding in an event: its content digest and the digest of content + state +
    reason (the state as a string, so a flipped state reads plainly)."""
    content = job_content(job)
    state = job.get("state") if isinstance(job, Mapping) else job.state
    reason = job.get("reason") if isinstance(job, Mapping) else job.reason
    return {
        "content": content,
        "state": str(state),
        "row": _digest({"content": content, "state": state, "reason": reason}),
    }


def attempt_row(att: Attempt | Mapping[str, Any]) -> str:
    return _digest(_values(att, ATTEMPT_FIELDS))
