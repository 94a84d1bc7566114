"""Why each queued job waits, as of the loop's last tick, in a table of its own (`job_hold`).

Most reasons name a reservation and its time, which move, so most change every tick. Kept on
the job row, each change rewrote the whole row, spec included: at 100,000 queued jobs about
89,000 changes a tick took 1.05-1.50 s against 0.17-0.29 s on a narrow table (docs/benchmarks.md).
A hold is the loop's note, not the job's content: the row digests leave it out, and every
transition of the job's lifecycle removes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import Integer, String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Session, col, delete, select

from nightshift.runtime.store.db import JobHold

# Only a job still queued gets a reason: one claimed or cancelled since the tick's snapshot does not.
_UPSERT = text(
    "INSERT INTO job_hold (job_id, reason) SELECT :job, :why FROM job"
    " WHERE job.id = :job AND job.state = 'queued'"
    " ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason"
)
# PostgreSQL: the same as one statement over two arrays (psycopg's executemany of the above took
# 1.49-1.58 s for 99,463 reasons, this 0.91-0.97 s)
_UPSERT_ARRAYS = text(
    "INSERT INTO job_hold (job_id, reason) SELECT t.job, t.why FROM unnest(:jobs, :whys)"
    " AS t(job, why) JOIN job ON job.id = t.job AND job.state = 'queued'"
    " ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason"
).bindparams(bindparam("jobs", type_=ARRAY(Integer)), bindparam("whys", type_=ARRAY(String)))
_DROP = text("DELETE FROM job_hold WHERE job_id = :job")


def record(s: Session, pending: Iterable[int], holds: Mapping[int, str]) -> None:
    """Keep each pending job's reason (`holds`; a pending job absent from it waits for nothing),
    writing only what changed since the last tick, as one statement over the changed rows."""
    stored = dict(s.exec(select(JobHold.job_id, JobHold.reason)).all())
    changed, cleared = [], []
    for job_id in pending:
        why = holds.get(job_id)
        if why is None:
            if job_id in stored:
                cleared.append({"job": job_id})
        elif stored.get(job_id) != why:
            changed.append({"job": job_id, "why": why})
    conn = s.connection()
    if changed and conn.dialect.name == "postgresql":
        conn.execute(
            _UPSERT_ARRAYS,
            {"jobs": [c["job"] for c in changed], "whys": [c["why"] for c in changed]},
        )
    elif changed:
        conn.execute(_UPSERT, changed)
    if cleared:
        conn.execute(_DROP, cleared)


def clear(s: Session, job_id: int) -> None:
    """Forget a job's reason: it left the queue (or came back to it, and waits anew)."""
    s.exec(delete(JobHold).where(col(JobHold.job_id) == job_id))  # type: ignore[call-overload]


def of(s: Session, job_ids: Iterable[int] | None = None) -> dict[int, str]:
    """The reasons the last tick gave these jobs (None: every job); a job with none is absent."""
    q = select(JobHold.job_id, JobHold.reason)
    if job_ids is not None:
        ids = list(job_ids)
        if not ids:
            return {}
        q = q.where(col(JobHold.job_id).in_(ids))
    return dict(s.exec(q).all())
