"""The rows against the chain: each transition's event binds digests of the job and attempt rows
as it left them (runtime/store/lifecycle.py, runtime/store/row_digest.py); `audit verify` keeps the newest
binding of every row while it walks the chain, then recomputes the rows' digests and names each
row that was edited, inserted or deleted behind nightshift's back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, select

from nightshift.runtime.store import row_digest
from nightshift.runtime.store.db import Attempt, Job, KeyValue
from nightshift.runtime.store.quick_read import JSON_COLUMNS, is_unreadable
from nightshift.runtime.store.transition_events import (
    JOB_BINDING,
    ROWS_AFTER_ATTEMPT,
    ROWS_AFTER_JOB,
)

SHOWN = 10  # rows named per kind of finding; the count says how many more


class RowBindings:
    """The newest digest the chain binds to each job and attempt row."""

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[int, dict[str, Any]]] = {}
        self.attempts: dict[int, tuple[int, str]] = {}

    def observe(self, event_id: int, action: str, payload: dict[str, Any]) -> None:
        rows = payload.get("rows")
        if not isinstance(rows, dict):
            return
        jobs = rows.get("jobs")
        if action in JOB_BINDING and isinstance(jobs, dict):
            for key, binding in jobs.items():
                if key.isdigit() and isinstance(binding, dict):
                    self.jobs[int(key)] = (event_id, binding)
        attempts = rows.get("attempts")
        if isinstance(attempts, dict):
            for key, digest in attempts.items():
                if key.isdigit() and isinstance(digest, str):
                    self.attempts[int(key)] = (event_id, digest)

    def problems(self, conn: Connection) -> list[str]:
        """What the rows (read on `conn`, in the chain's snapshot) say that no event bound."""
        after_job, after_attempt = _boundaries(conn)
        found: dict[str, list[str]] = {}

        def add(kind: str, text: str) -> None:
            found.setdefault(kind, []).append(text)

        seen_jobs: set[int] = set()
        for job, unreadable in _rows(conn, Job.__table__):  # type: ignore[attr-defined]
            job_id = job["id"]
            seen_jobs.add(job_id)
            bound = self.jobs.get(job_id)
            if unreadable:
                add("edited", f"job {job_id}: its stored {unreadable} is not valid JSON")
                continue
            if bound is None:
                if job_id > after_job:
                    add("inserted", f"job {job_id} (no event submitted it)")
                continue
            event_id, binding = bound
            now = row_digest.job_row(job)
            if now["content"] != binding.get("content"):
                add(
                    "edited",
                    f"job {job_id}: its spec, parameters, owner or resume point differ from "
                    f"event {event_id}",
                )
            elif now["row"] != binding.get("row"):
                was = binding.get("state")
                add(
                    "edited",
                    f"job {job_id}: "
                    + (
                        f"its state is {job['state']}, event {event_id} left it {was}"
                        if was != job["state"]
                        else f"its reason differs from event {event_id}"
                    ),
                )
        for job_id, (event_id, _) in self.jobs.items():
            if job_id not in seen_jobs:
                add("deleted", f"job {job_id} (last bound by event {event_id})")
        seen_attempts: set[int] = set()
        table = Attempt.__table__  # type: ignore[attr-defined]
        for att, unreadable in _rows(conn, table):
            att_id = att["id"]
            seen_attempts.add(att_id)
            bound_att = self.attempts.get(att_id)
            where = f"attempt {att_id} (job {att['job_id']} #{att['number']})"
            if unreadable:
                add("edited", f"{where}: its stored {unreadable} is not valid JSON")
                continue
            if bound_att is None:
                if att_id > after_attempt:
                    add("inserted", f"{where} (no event recorded it)")
                continue
            if row_digest.attempt_row(att) != bound_att[1]:
                add(
                    "edited",
                    f"{where}: its state, outcome, exit, handle or argv differ from event "
                    f"{bound_att[0]} (now {att['state']}/{att['outcome']})",
                )
        for att_id, (event_id, _) in self.attempts.items():
            if att_id not in seen_attempts:
                add("deleted", f"attempt {att_id} (last bound by event {event_id})")
        out = []
        for kind in ("edited", "inserted", "deleted"):
            items = found.get(kind, [])
            if items:
                more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
                out.append(f"{kind}: " + "; ".join(items[:SHOWN]) + more)
        return out


def _rows(conn: Connection, table: Any) -> Iterator[tuple[dict[str, Any], str | None]]:
    """Each row of `table` as a mapping, with the name of a JSON column whose stored text is not
    JSON (None: all read). The columns' type (db.StoredJSON) reads such text as an unreadable
    value instead of raising, so the walk goes past a row a raw edit broke."""
    json_cols = JSON_COLUMNS[table.name]
    for row in conn.execute(select(table)).mappings():
        bad = [n for n in json_cols if is_unreadable(row[n])]
        yield dict(row), bad[0] if bad else None


def _boundaries(conn: Connection) -> tuple[int, int]:
    """The newest job and attempt ids made before rows were audited (0: none)."""
    kv = KeyValue.__table__  # type: ignore[attr-defined]
    values: dict[str, str] = dict(
        conn.execute(
            select(kv.c.key, kv.c.value).where(kv.c.key.in_((ROWS_AFTER_JOB, ROWS_AFTER_ATTEMPT)))
        ).all()
    )

    def number(key: str) -> int:
        v = values.get(key)
        return int(v) if isinstance(v, str) and v.isdigit() else 0

    return number(ROWS_AFTER_JOB), number(ROWS_AFTER_ATTEMPT)
