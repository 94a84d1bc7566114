"""Why each queued job waits, as of the loop's last tick, in a table of its own (`job_hold`).

Kept on the job row, each change of a reason rewrote the whole row, spec included: at 100,000
queued jobs about 89,000 changes a tick took 1.05-1.50 s against 0.17-0.29 s on a narrow table
(docs/benchmarks.md). Those changes were nearly all one clause: the reservation's ("… outside
GPUs 0,3, reserved for job 7 from 03:14, and it would run past that"), which moves as running
jobs end and ends most reasons of a deep queue; the rest were mostly who holds the CPU slots,
which ends every waiting CPU job's. Such clauses are kept once per loop (`hold_tail`); a reason
that ends with one is stored without it and points there, so a tick rewrites only the reasons
that changed in their own words (hundreds of rows, not tens of thousands). Readers get each
reason whole from `of` (runtime/store/quick_read.py joins the two in SQL). A hold is the loop's
note, not the job's content: the row digests leave it out, and every transition of the job's
lifecycle removes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import Integer, String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Session, col, delete, select

from nightshift.runtime.store.db import HoldTail, JobHold

# Only a job still queued gets a reason: one claimed or cancelled since the tick's snapshot does not.
_UPSERT = text(
    "INSERT INTO job_hold (job_id, reason, tail) SELECT :job, :why, :tail FROM job"
    " WHERE job.id = :job AND job.state = 'queued'"
    " ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, tail = excluded.tail"
)
# PostgreSQL: the same as one statement over three arrays (psycopg's executemany of the above
# took 1.49-1.58 s for 99,463 reasons, this 0.91-0.97 s)
_UPSERT_ARRAYS = text(
    "INSERT INTO job_hold (job_id, reason, tail) SELECT t.job, t.why, t.tail"
    " FROM unnest(:jobs, :whys, :tails) AS t(job, why, tail)"
    " JOIN job ON job.id = t.job AND job.state = 'queued'"
    " ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, tail = excluded.tail"
).bindparams(
    bindparam("jobs", type_=ARRAY(Integer)),
    bindparam("whys", type_=ARRAY(String)),
    bindparam("tails", type_=ARRAY(String)),
)
_DROP = text("DELETE FROM job_hold WHERE job_id = :job")
_SET_TAIL = text(
    "INSERT INTO hold_tail (key, text) VALUES (:key, :text)"
    " ON CONFLICT (key) DO UPDATE SET text = excluded.text"
)


def record(
    s: Session,
    pending: Iterable[int],
    holds: Mapping[int, str],
    *,
    tails: Mapping[str, str] | None = None,
    loop: str = "",
) -> None:
    """Keep each pending job's reason (`holds`; a pending job absent from it waits for nothing),
    writing only what changed since the last tick, as one statement over the changed rows.
    `tails`: clauses that many reasons end with, by name (`Decision.shared_tails`), each kept
    once under `loop/name` (`loop`: the node; several loops may share a store); a reason that
    ends with one is stored without it, pointing at it."""
    conn = s.connection()
    ending = []  # (the clause, its key), each kept in `hold_tail` as this tick has it
    for name, tail in (tails or {}).items():
        if not tail:
            continue
        key = f"{loop}/{name}"
        if conn.execute(select(HoldTail.text).where(HoldTail.key == key)).scalar() != tail:
            conn.execute(_SET_TAIL, {"key": key, "text": tail})
        ending.append((tail, key))
    stored = {
        job_id: (why, key)
        for job_id, why, key in s.exec(select(JobHold.job_id, JobHold.reason, JobHold.tail))
    }
    changed, cleared = [], []
    for job_id in pending:
        why = holds.get(job_id)
        if why is None:
            if job_id in stored:
                cleared.append({"job": job_id})
            continue
        row: tuple[str, str | None] = (why, None)
        for tail, key in ending:
            if why.endswith(tail):
                row = (why[: len(why) - len(tail)], key)
                break
        if stored.get(job_id) != row:
            changed.append({"job": job_id, "why": row[0], "tail": row[1]})
    if changed and conn.dialect.name == "postgresql":
        conn.execute(
            _UPSERT_ARRAYS,
            {
                "jobs": [c["job"] for c in changed],
                "whys": [c["why"] for c in changed],
                "tails": [c["tail"] for c in changed],
            },
        )
    elif changed:
        conn.execute(_UPSERT, changed)
    if cleared:
        conn.execute(_DROP, cleared)


def clear(s: Session, job_id: int) -> None:
    """Forget a job's reason: it left the queue (or came back to it, and waits anew)."""
    s.exec(delete(JobHold).where(col(JobHold.job_id) == job_id))  # type: ignore[call-overload]


def of(s: Session, job_ids: Iterable[int] | None = None) -> dict[int, str]:
    """The reasons the last tick gave these jobs (None: every job), whole; a job with none is
    absent."""
    q = select(JobHold.job_id, JobHold.reason, JobHold.tail)
    if job_ids is not None:
        ids = list(job_ids)
        if not ids:
            return {}
        q = q.where(col(JobHold.job_id).in_(ids))
    rows = s.exec(q).all()
    keys = {key for _, _, key in rows if key is not None}
    tails = (
        dict(s.exec(select(HoldTail.key, HoldTail.text).where(col(HoldTail.key).in_(keys))).all())
        if keys
        else {}
    )
    return {job_id: why if key is None else why + tails.get(key, "") for job_id, why, key in rows}
