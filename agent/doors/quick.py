"""What the everyday reads (`jobs`, `status`, `show JOB`, `logs JOB`) answer from, fast where
they can: one's own SQLite store read without pydantic, SQLAlchemy or the policy stack, in the
time `squeue` takes.

Why they may skip the gate there: in the single-user embedded mode the store is the caller's own
file, which they can read with `sqlite3` anyway; the audit records decisions and actions, and a
read of one's own store is neither (`jobs` has always read so). In a shared install the store is
the daemon's: every read goes to its socket and through its gate, audited there, as before.

Each fast answer is the full path's computation on the same rows: the settings a full load gave
for the same inputs (runtime/read_settings.py), the rows as the ORM reads them
(runtime/store/quick_read.py), the history show_job computes (runtime/training/job_history.py),
the log lines job_logs reads (job_files.last_lines). Where only the full path can answer — another
database or schema, a row only the models can read, `NIGHTSHIFT_FULL_READ_PATH` set — `show` and
`log_lines` say None and the command calls its skill; `rows_and_switch` takes the ORM itself.
tests/test_fast_answers.py holds the outputs equal.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nightshift.agent.doors import job_views
from nightshift.agent.doors.console import FULL_PATH_ENV
from nightshift.runtime import read_settings
from nightshift.runtime.read_settings import ReadSettings
from nightshift.runtime.store import kill_switch_row, quick_read
from nightshift.runtime.training import job_files, job_history
from nightshift.runtime.training.diagnosis_view import DiagnosisView, NotPlain

LOG_TAIL_BYTES = 256 * 1024  # as job_logs reads it


def settings(config: str | None) -> ReadSettings:
    """The read settings: kept from a full load of the same inputs, else a full load (which
    raises the ConfigError every command raises for a bad config), kept for next time."""

    def full_load() -> ReadSettings:
        from nightshift.runtime.config import load_settings

        return ReadSettings.of(load_settings(config))

    return read_settings.read(config, full_load)


def local(config: str | None) -> ReadSettings | None:
    """The read settings when this command may answer from the store itself: the embedded
    mode, the fast path not turned off; else None."""
    if os.environ.get(FULL_PATH_ENV):
        return None
    s = settings(config)
    return None if s.served_at is not None else s


def status_rows(
    config: str | None, states: list[str]
) -> tuple[list[quick_read.JobRow], dict[str, Any] | None] | None:
    """The rows of `nightshift jobs` from one's own store, each newest diagnosis read, and the
    kill switch's {by, reason, at} while paused (None: take the full path)."""
    s = local(config)
    if s is None:
        return None
    found = quick_read.status_rows(s.store_url, states, s.busy_timeout_s)
    if found is None:
        return None
    rows, switch = found
    try:
        for j in rows:
            j.diagnosis = DiagnosisView.stored(j.diagnosis)
    except NotPlain:
        return None
    return rows, kill_switch_row.pause_info(switch)


def show(config: str | None, job_id: int) -> Any | None:
    """show_job's result for one's own job, with its attributes (None: take the full path, which
    also says that there is no such job)."""
    found = _own_job(config, job_id)
    if found is None:
        return None
    s, job, attempts = found
    try:
        ckpt_dir, metrics_file, template = _spec_paths(job.spec)
        for a in attempts:
            a.diagnosis = DiagnosisView.stored(a.diagnosis)
    except NotPlain:
        return None
    detail = job_history.detail(
        job,
        attempts,
        where=job_history.paths(Path(s.runs_dir), job.id, ckpt_dir, metrics_file),
        resume_template=template,
        now=datetime.now(UTC).replace(tzinfo=None),
        hold=job.hold_reason,
    )
    return _attributes(detail)


def log_lines(
    config: str | None, job_id: int, attempt: int | None, tail: int
) -> tuple[list[str], str | None] | None:
    """job_logs' lines and log path for one's own job (None: take the full path, which also
    says what is wrong with the arguments)."""
    found = _own_job(config, job_id)
    if found is None:
        return None
    s, job, attempts = found
    if attempt is not None:
        attempts = [a for a in attempts if a.number == attempt]
        if not attempts:
            return None
    if not attempts:
        return [], None
    att = attempts[-1]
    lines: list[str] = []
    if att.log_path and Path(att.log_path).exists():
        lines, _end = job_files.last_lines(
            job_history.job_folder(Path(s.runs_dir), job.id),
            Path(att.log_path),
            tail,
            ended=att.ended_at is not None,
            max_bytes=LOG_TAIL_BYTES,
        )
    return lines, att.log_path


def _own_job(config: str | None, job_id: int) -> tuple[ReadSettings, Any, list[Any]] | None:
    """The read settings, one's own job's row and its attempts' rows (None: take the full path,
    which also says when there is no such job)."""
    s = local(config)
    if s is None:
        return None
    found = quick_read.job_with_attempts(s.store_url, job_id, s.busy_timeout_s)
    if found is None or found[0] is None:
        return None
    return s, found[0], found[1]


def _spec_paths(spec: Any) -> tuple[str | None, str | None, list[str]]:
    """The checkpoint folder, metrics file and resume template of a stored spec (the spec model's
    dump: every field present); NotPlain when only the model can read it."""
    try:
        ckpt = spec["checkpoint"]
        metrics = spec["metrics"]["file"]
        if ckpt is None:
            return None, metrics, []
        folder, template = ckpt["dir"], ckpt["resume_arg"]
    except (KeyError, TypeError):
        raise NotPlain("not a full spec") from None
    if not isinstance(folder, str) or not isinstance(template, list):
        raise NotPlain("not a full spec")
    if metrics is not None and not isinstance(metrics, str):
        raise NotPlain("not a full spec")
    return folder, metrics, template


def _attributes(detail: dict[str, Any]) -> SimpleNamespace:
    """show_job's result read as its model is read: the job, its attempts, their parameter
    changes and the kept checkpoints as objects with attributes; parameters stay a mapping."""
    attempts = [
        SimpleNamespace(
            **{
                **a,
                "param_changes": {k: SimpleNamespace(**c) for k, c in a["param_changes"].items()},
            }
        )
        for a in detail["attempts"]
    ]
    kept = [SimpleNamespace(**k) for k in detail["good_checkpoints"]]
    return SimpleNamespace(**{**detail, "attempts": attempts, "good_checkpoints": kept})


# ------------------------------------------------------------------ the rows of `jobs` and `status`
def rows_and_switch(
    config: str | None, states: list[str], *, switch: bool = True
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The rows of `nightshift jobs` (only `states`, when given) and the kill switch's {by,
    reason, at} (None: not paused): from the daemon in a shared install (through its gate), else
    from one's own store — without the ORM where it can, through it where it must (another
    database, an older schema: it migrates). `switch=False`: the daemon is not asked for it."""
    served_at = settings(config).served_at
    if served_at is not None:
        from nightshift.agent.doors.remote import Remote

        paused = Remote(served_at).whoami()["paused"] if switch else None
        return _remote_rows(served_at, states), paused
    found = status_rows(config, states)
    if found is not None:
        return [job_views.job_row(j, j.attempts, j.diagnosis, j) for j in found[0]], found[1]
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.policies.killswitch import pause_info
    from nightshift.runtime.training.attempt_diagnosis import Diagnosis

    w = Wiring.load(config)
    rows = [
        job_views.job_row(j, j.attempts, Diagnosis.stored(j.diagnosis), j)
        for j in _orm_rows(w, states)
    ]
    return rows, pause_info(w.store)


def _orm_rows(w: Any, state: list[str]) -> list[Any]:
    """The same rows through the Store (any database; migrates an older store first)."""
    from types import SimpleNamespace

    from sqlmodel import select

    from nightshift.runtime.store import job_holds
    from nightshift.runtime.store.db import Attempt, Job

    with w.store.session() as s:
        q = select(Job).order_by(Job.id)
        if state:
            q = q.where(Job.state.in_(state))
        rows = list(s.exec(q))
        holds = job_holds.of(s)
        counts: dict[int, int] = {}
        newest: dict[int, Any] = {}  # each job's newest attempt's diagnosis, step and loss
        for job_id, *last in s.exec(
            select(
                Attempt.job_id, Attempt.diagnosis, Attempt.last_step, Attempt.last_loss
            ).order_by(Attempt.number)
        ):
            counts[job_id] = counts.get(job_id, 0) + 1
            newest[job_id] = last
    none = (None, None, None)
    return [
        SimpleNamespace(
            id=j.id,
            name=j.name,
            state=j.state,
            priority=j.priority,
            cost_class=j.spec.get("cost_class"),
            group=j.group,
            reason=j.reason,
            hold_reason=holds.get(j.id),  # type: ignore[arg-type]
            attempts=counts.get(j.id, 0),  # type: ignore[arg-type]
            diagnosis=newest.get(j.id, none)[0],
            last_step=newest.get(j.id, none)[1],
            last_loss=newest.get(j.id, none)[2],
        )
        for j in rows
    ]


def _remote_rows(served_at: Path, state: list[str]) -> list[dict[str, Any]]:
    """The same rows from the daemon, through list_jobs (a read through its gate)."""
    from nightshift.agent.doors.remote import Remote

    r: Any = Remote(served_at).call(
        "list_jobs", {"states": state or None, "limit": 10_000}, via="terminal"
    )
    return [
        job_views.job_row(
            j,
            len(j.attempts),
            j.attempts[-1].diagnosis if j.attempts else None,
            j.attempts[-1] if j.attempts else None,
        )
        for j in sorted(r.jobs, key=lambda j: j.id)
    ]
