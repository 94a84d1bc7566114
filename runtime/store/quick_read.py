"""The rows `nightshift jobs` lists, read from a SQLite store with the standard library alone.

Why a second reader: importing SQLAlchemy and SQLModel (the `Store`, runtime/store/db.py) takes
half a second to a second on a small machine, far more than the query, and `nightshift jobs`
should answer as `squeue` does. This reads only, in one read-only connection, and only a store
whose schema is at HEAD; anything else (another database, an older or newer schema, a missing
file, a read that fails) is None, and the command takes the full path, which opens the `Store`
(migrating, reporting a missing store) as every other command does. tests/test_fast_answers.py
holds its answers to the full path's on a store that real runs filled.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

from nightshift.runtime.store.migrations import HEAD

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
        self.diagnosis: Any = None  # the newest attempt's stored diagnosis, as its JSON decodes


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store URL, as Store opens it; None for any other store."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url[len("sqlite:///") :])
    if not path.name or str(path) == ":memory:":
        return None
    return path.resolve()


def job_rows(url: str, states: list[str], busy_timeout_s: float) -> list[JobRow] | None:
    """Every job (only `states`, when given) by id, with its attempt count and newest attempt's
    diagnosis; None when this store is not one this reader may read (see the module)."""
    path = sqlite_file(url)
    if path is None or not path.exists():
        return None
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s)
    except sqlite3.Error:
        return None
    try:
        if {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")} != {HEAD}:
            return None
        where = f" WHERE state IN ({', '.join('?' * len(states))})" if states else ""
        jobs = [
            JobRow(r)
            for r in conn.execute(
                "SELECT id, name, state, priority, json_extract(spec, '$.cost_class'), "
                f'"group", reason, hold_reason FROM job{where} ORDER BY id',
                states,
            )
        ]
        by_id = {j.id: j for j in jobs}
        newest: dict[int, Any] = {}
        for job_id, diagnosis in conn.execute(
            "SELECT job_id, diagnosis FROM attempt ORDER BY number"
        ):
            j = by_id.get(job_id)
            if j is not None:
                j.attempts += 1
                newest[job_id] = diagnosis
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    for job_id, raw in newest.items():
        by_id[job_id].diagnosis = json.loads(raw) if isinstance(raw, str) else raw
    return jobs
