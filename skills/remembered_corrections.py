"""A person's correction, used the next time a log ends the same way.

`nightshift diagnose JOB --correct CATEGORY` keeps the right answer with the end of the attempt's
log (skills/correct_diagnosis.py). When a later attempt fails with a log that ends the same way —
its last error line, numbers, paths and quoted values aside — and the rules read it as they read
the corrected one, the diagnosis the loop keeps is the person's category, saying whose and which
attempt, with the rules' reading beside it (`remembered`): diagnose_failure's own answer (what the
recover playbook acts on) and the loop's diagnoser alike (diagnose_failure.py `remember`). `eval diagnosis --local` measures the
rules alone (`remember=False`).

Whose word counts: the job's owner's for their own jobs (for a log that is no job's, the
asker's), and the operator's — the account that runs the loop — for every job; so nobody else can
change how another user's job is recovered by correcting a failure of their own. Only a specific ending
carries a judgement from one run to another (a bare `Killed` says too little: ENDING_MIN_WORDS),
a correction that agreed with the rules teaches nothing, and the newest correction wins.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import func
from sqlalchemy import select as select_columns
from sqlmodel import col, select

from nightshift.runtime.store.db import Attempt, DiagnosisCorrection, Job, Store
from nightshift.runtime.training import pasted_log

ENDING_MIN_WORDS = 3
SCAN_LINES = 40  # the ending is looked for among the log's last this many written lines
RECENT = 500  # the corrections compared, newest first
MAX_ENDING = 300
MAX_LINE = 2000  # of a line, what is read
TAIL_CHARS = 16_000  # of a log, what is read for its ending

# A line that says something went wrong, in the words tools use (not a traceback's frame)
_ERRORISH = re.compile(
    r"\b(?:\w*error|\w*exception|fail(?:ed|ure|s)?|fatal|abort(?:ed)?|killed|terminated"
    r"|cannot|can't|unable|not found|no such|denied|timed? ?out|invalid|refused|mismatch"
    r"|out of memory|segmentation fault|core dumped)\b",
    re.IGNORECASE,
)
_FRAME = re.compile(r'^(?:File "|at [\w$.<>]+\(|Traceback \(most recent call last\)|[\^~]+$)')
_HEX = re.compile(r"\b0x[0-9a-f]+\b")
_PATH = re.compile(r"(?:[a-z]:)?(?:[\\/][\w.~@+-]+)+[\\/]?")
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|‘[^’\n]*’|`[^`\n]*`")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_SPACE = re.compile(r"\s+")


def ending(text: str) -> str | None:
    """The log's last line that says something went wrong, as compared: lower case, hex values,
    paths, quoted values and numbers replaced, spaces collapsed; None when there is none, or it
    is too short to say which failure it is."""
    # (the end alone, each line cut short: an excerpt may hold 4,000 lines, and a line a megabyte;
    # a correction's is cut to the same TAIL_CHARS in the database)
    tail = text[-TAIL_CHARS:].splitlines()[-SCAN_LINES * 4 :]
    written = [s for s in (pasted_log.primary(line[:MAX_LINE]).strip() for line in tail) if s]
    for line in reversed(written[-SCAN_LINES:]):
        if _FRAME.match(line) or not _ERRORISH.search(line):
            continue
        said = line.lower()
        for pattern, mark in ((_HEX, "0x#"), (_QUOTED, "'…'"), (_PATH, "/…"), (_NUMBER, "#")):
            said = pattern.sub(mark, said)
        said = _SPACE.sub(" ", said).strip()[:MAX_ENDING]
        return said if len(said.split()) >= ENDING_MIN_WORDS else None
    return None


def owner_of(
    store: Store, *, attempt_id: int | None = None, log_path: str | None = None
) -> str | None:
    """Whose job the attempt (by its row id, or its log's path) is; None when it is no job's."""
    if attempt_id is None and log_path is None:
        return None
    where = Attempt.id == attempt_id if attempt_id is not None else Attempt.log_path == log_path
    with store.session() as s:
        return s.exec(
            select(Job.owner).join(Attempt, Attempt.job_id == Job.id).where(where)
        ).first()


def operator() -> str:
    """The account this process runs as (the daemon's, or a person's running their own loop):
    the user database's name, not the environment's."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid-{os.getuid()}"


def _tail_of_excerpt(dialect: str) -> Any:
    """The excerpt's last TAIL_CHARS characters, cut in the database: a correction keeps up to
    256 KiB of log, and only its end is compared."""
    excerpt = col(DiagnosisCorrection.log_excerpt)
    if dialect == "postgresql":
        return func.right(excerpt, TAIL_CHARS)
    return func.substr(excerpt, -TAIL_CHARS)  # SQLite: a negative start counts from the end


def _candidates(store: Store, category: str, trusted: tuple[str, ...]) -> list[Any]:
    """The newest corrections one of `trusted` gave where the rules had said `category` and the
    person another (each row: category, job_id, attempt_id, attempt_number, corrected_by,
    log_path, and the excerpt's tail)."""
    with store.session() as s:
        c = DiagnosisCorrection
        return list(
            s.execute(
                select_columns(
                    c.category,
                    c.job_id,
                    c.attempt_id,
                    c.attempt_number,
                    c.corrected_by,
                    c.log_path,
                    _tail_of_excerpt(s.connection().dialect.name).label("tail"),
                )
                .where(
                    col(c.corrected_by).in_(trusted),
                    c.rules_category == category,
                    c.category != category,
                )
                .order_by(col(c.corrected_at).desc(), col(c.id).desc())
                .limit(RECENT)
            ).all()
        )


# A correction's ending, by its tail's length and (per-process, randomised) hash: each is read
# once per process, and none is held.
_ENDINGS: dict[tuple[int, int], str | None] = {}


def _ending_of(tail: str) -> str | None:
    key = (len(tail), hash(tail))
    if key not in _ENDINGS:
        if len(_ENDINGS) >= RECENT * 4:
            _ENDINGS.clear()
        _ENDINGS[key] = ending(tail)
    return _ENDINGS[key]


def find(
    store: Store,
    category: str,
    text: Callable[[], str],
    *,
    attempt_id: int | None = None,
    log_path: str | None = None,
    asker: str | None = None,
) -> tuple[Any, str] | None:
    """The correction that applies to a failure the rules read as `category` (its row: category,
    job_id, attempt_number, corrected_by) and the ending both logs share, or None: the newest one
    the job's owner (for a log that is no job's, `asker`) or the operator gave of a log that
    ended as this one (`text`, read only when a correction could apply), where the rules had read
    `category`; never the attempt's own (by its row id or its log's path)."""
    whose = owner_of(store, attempt_id=attempt_id, log_path=log_path) or asker
    trusted = tuple(dict.fromkeys(w for w in (whose, operator()) if w))
    rows = _candidates(store, category, trusted)
    said = ending(text()) if rows else None
    if said is None:
        return None
    for row in rows:
        own = row.attempt_id == attempt_id or (log_path is not None and row.log_path == log_path)
        if not own and _ending_of(row.tail or "") == said:
            return row, said
    return None
