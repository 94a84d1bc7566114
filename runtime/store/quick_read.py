"""The rows the everyday reads show (`jobs`, `status`, `show`, `logs`), read from a SQLite store
with the standard library alone.

Why a second reader: importing SQLAlchemy and SQLModel (the `Store`, runtime/store/db.py) takes
half a second to a second on a small machine, far more than the query, and `nightshift jobs`
and the others should answer as `squeue` does. This reads only, in one read-only connection, and only a store
whose schema is at HEAD; anything else (another database, an older or newer schema, a missing
file, a read that fails) is None, and the command takes the full path, which opens the `Store`
(migrating, reporting a missing store) as every other command does. tests/test_fast_answers.py
holds its answers to the full path's on a store that real runs filled.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nightshift.runtime.store import kill_switch_row
from nightshift.runtime.store.migrations import HEAD

# A waiting job's whole reason: its `job_hold` row, then the clause its loop keeps once for the
# reasons that end with it (runtime/store/job_holds.py)
_HOLD_REASON = (
    "job_hold.reason || COALESCE((SELECT hold_tail.text FROM hold_tail"
    " WHERE hold_tail.key = job_hold.tail), '')"
)

JOB_STATES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")


class JobRow:
    """One job as `nightshift jobs` needs it (the ORM's Job has these attributes too)."""

    __slots__ = (
        "attempts",
        "cost_class",
        "diagnosis",
        "group",
        "hold_reason",
        "id",
        "last_loss",
        "last_step",
        "name",
        "priority",
        "reason",
        "state",
    )

    def __init__(self, row: tuple[Any, ...]):
        (
            self.id,
            self.name,
            self.state,
            self.priority,
            self.cost_class,
            self.group,
            self.reason,
            self.hold_reason,
        ) = row
        self.attempts = 0
        # the newest attempt's stored diagnosis (as its JSON decodes), last step and loss
        self.diagnosis: Any = None
        self.last_step: int | None = None
        self.last_loss: float | None = None


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store URL, as Store opens it; None for any other store."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url[len("sqlite:///") :])
    if not path.name or str(path) == ":memory:":
        return None
    return path.resolve()


@contextlib.contextmanager
def _reading(url: str, busy_timeout_s: float) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection to a SQLite store at schema HEAD; None when this store is not one
    this reader may read (see the module). A read that fails inside is the caller's None too."""
    path = sqlite_file(url)
    if path is None or not path.exists():
        yield None
        return
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s)
    except sqlite3.Error:
        yield None
        return
    try:
        heads = {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}
    except sqlite3.Error:
        heads = set()
    try:
        yield conn if heads == {HEAD} else None
    finally:
        conn.close()


def status_rows(
    url: str, states: list[str], busy_timeout_s: float
) -> tuple[list[JobRow], str | None] | None:
    """Every job (only `states`, when given) by id, with its attempt count and newest attempt's
    diagnosis, step and loss, and the kill switch's row (None: not paused), read in one
    transaction; None when this store is not one this reader may read (see the module)."""
    with _reading(url, busy_timeout_s) as conn:
        if conn is None:
            return None
        try:
            conn.execute("BEGIN")
            where = f" WHERE job.state IN ({', '.join('?' * len(states))})" if states else ""
            jobs = [
                JobRow(r)
                for r in conn.execute(
                    "SELECT job.id, job.name, job.state, job.priority, "
                    "json_extract(job.spec, '$.cost_class'), job.\"group\", job.reason, "
                    f"{_HOLD_REASON} FROM job LEFT JOIN job_hold ON job_hold.job_id = job.id"
                    f"{where} ORDER BY job.id",
                    states,
                )
            ]
            by_id = {j.id: j for j in jobs}
            newest: dict[int, Any] = {}
            for job_id, diagnosis, last_step, last_loss in conn.execute(
                "SELECT job_id, diagnosis, last_step, last_loss FROM attempt ORDER BY number"
            ):
                j = by_id.get(job_id)
                if j is not None:
                    j.attempts += 1
                    j.last_step, j.last_loss = last_step, last_loss
                    newest[job_id] = diagnosis
            switch = conn.execute(
                "SELECT value FROM keyvalue WHERE key = ?", (kill_switch_row.KEY,)
            ).fetchone()
            conn.execute("COMMIT")
        except sqlite3.Error:
            return None
    for job_id, raw in newest.items():
        by_id[job_id].diagnosis = json.loads(raw) if isinstance(raw, str) else raw
    return jobs, None if switch is None else switch[0]


# The columns the ORM reads as JSON and as datetimes (runtime/store/db.py; a test holds these to
# its models): decoded here as SQLAlchemy decodes them.
UNREADABLE = "_unreadable_json"  # the key of what a JSON column reads as when its text is not JSON
JSON_COLUMNS = {
    "job": ("spec", "params"),
    "attempt": (
        "handle",
        "argv",
        "params",
        "gpus",
        "metrics_cursor",
        "diagnosis",
        "machine",
        "provenance",
    ),
}
TIME_COLUMNS = {
    "job": ("created_at", "updated_at"),
    "attempt": ("last_progress_at", "started_at", "ended_at"),
}


class Row(SimpleNamespace):
    """One row as the ORM's model gives it: its columns as attributes, JSON decoded, datetimes
    parsed."""


def unreadable_value(text: Any) -> dict[str, str]:
    """What a JSON column whose stored text is not JSON reads as: `{UNREADABLE: <its start>}`."""
    return {UNREADABLE: str(text)[:200]}


def is_unreadable(value: Any) -> bool:
    """Whether a JSON column's value is what broken stored text reads as."""
    return isinstance(value, dict) and UNREADABLE in value


def stored_json(text: str) -> Any:
    """A JSON column's stored text decoded; text a raw edit broke as `unreadable_value`
    (db.StoredJSON reads it the same way), so one tampered row does not stop a listing."""
    try:
        return json.loads(text)
    except ValueError:
        return unreadable_value(text)


def _row(table: str, cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Row:
    row = dict(zip((d[0] for d in cursor.description), values, strict=True))
    for name in JSON_COLUMNS[table]:
        if isinstance(row.get(name), str):
            row[name] = stored_json(row[name])
    for name in TIME_COLUMNS[table]:
        if isinstance(row.get(name), str):
            row[name] = datetime.fromisoformat(row[name])
    return Row(**row)


def job_with_attempts(
    url: str, job_id: int, busy_timeout_s: float
) -> tuple[Row | None, list[Row]] | None:
    """One job's row, with the last tick's `hold_reason` (None: no such job), and its attempts'
    rows by number, read in one transaction; None when this store is not one this reader may
    read."""
    with _reading(url, busy_timeout_s) as conn:
        if conn is None:
            return None
        try:
            conn.execute("BEGIN")
            cur = conn.execute(
                f"SELECT job.*, {_HOLD_REASON} AS hold_reason FROM job"
                " LEFT JOIN job_hold ON job_hold.job_id = job.id WHERE job.id = ?",
                (job_id,),
            )
            found = cur.fetchone()
            job = None if found is None else _row("job", cur, found)
            cur = conn.execute("SELECT * FROM attempt WHERE job_id = ? ORDER BY number", (job_id,))
            attempts = [_row("attempt", cur, r) for r in cur.fetchall()]
            conn.execute("COMMIT")
        except (sqlite3.Error, ValueError):
            return None
    return job, attempts
