"""A person's correction, used the next time a log ends the same way.

`nightshift diagnose JOB --correct CATEGORY` keeps the right answer with the end of the attempt's
log (skills/correct_diagnosis.py). When a later attempt fails with a log that ends the same way —
its last error line, numbers, paths and quoted values aside — and the rules read it as they read
the corrected one, the diagnosis the loop keeps is the person's category, saying whose and which
attempt, with the rules' reading beside it (`remembered`): diagnose_failure's own answer (what the
recover playbook acts on) and the loop's diagnoser alike. `eval diagnosis --local` measures the
rules alone (`remember=False`). Only a specific ending carries a judgement from one
run to another (a bare `Killed` says too little: ENDING_MIN_WORDS), a correction that agreed with
the rules teaches nothing, and the newest correction of an ending wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlmodel import col, select

from nightshift.runtime.store.db import DiagnosisCorrection, Store
from nightshift.runtime.training import pasted_log
from nightshift.runtime.training.attempt_diagnosis import Remembered
from nightshift.skills.diagnose_failure import DiagnoseFailureResult, remediation_for

ENDING_MIN_WORDS = 3
SCAN_LINES = 40  # the ending is looked for among the log's last this many written lines
RECENT = 500  # the corrections compared, newest first
MAX_ENDING = 300

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
    written = [s for s in (pasted_log.primary(line).strip() for line in text.splitlines()) if s]
    for line in reversed(written[-SCAN_LINES:]):
        if _FRAME.match(line) or not _ERRORISH.search(line):
            continue
        said = line.lower()
        for pattern, mark in ((_HEX, "0x#"), (_QUOTED, "'…'"), (_PATH, "/…"), (_NUMBER, "#")):
            said = pattern.sub(mark, said)
        said = _SPACE.sub(" ", said).strip()[:MAX_ENDING]
        return said if len(said.split()) >= ENDING_MIN_WORDS else None
    return None


def recall(
    store: Store,
    said: str,
    rules_category: str,
    *,
    attempt_id: int | None = None,
    log_path: str | None = None,
) -> DiagnosisCorrection | None:
    """The newest correction of a log that ended as `said`, where the rules had said
    `rules_category` and the person another category; never the attempt's own (by its row id or
    its log's path)."""
    with store.session() as s:
        rows = s.exec(
            select(DiagnosisCorrection)
            .where(
                DiagnosisCorrection.rules_category == rules_category,
                DiagnosisCorrection.category != rules_category,
            )
            .order_by(
                col(DiagnosisCorrection.corrected_at).desc(), col(DiagnosisCorrection.id).desc()
            )
            .limit(RECENT)
        ).all()
    for row in rows:
        own = row.attempt_id == attempt_id or (log_path is not None and row.log_path == log_path)
        if not own and ending(row.log_excerpt) == said:
            return row
    return None


def remember(
    store: Store,
    result: DiagnoseFailureResult,
    text: Callable[[], str],
    *,
    params: dict[str, Any] | None = None,
    knobs: dict[str, str] | None = None,
    attempt_id: int | None = None,
    log_path: str | None = None,
) -> DiagnoseFailureResult:
    """`result`, or the person's category where they corrected a log that ended as this one
    (`text`, read only when some correction could apply) and the rules had read it as they read
    this one: its remediation made concrete, the rules' reading kept in `remembered`."""
    with store.session() as s:
        any_row = s.exec(
            select(DiagnosisCorrection.id)
            .where(
                DiagnosisCorrection.rules_category == result.category,
                DiagnosisCorrection.category != result.category,
            )
            .limit(1)
        ).first()
    said = ending(text()) if any_row is not None else None
    row = (
        recall(store, said, result.category, attempt_id=attempt_id, log_path=log_path)
        if said is not None
        else None
    )
    if row is None:
        return result
    retryable, fix = remediation_for(row.category, params, knobs)
    return result.model_copy(
        update={
            "category": row.category,
            "confidence": "medium",
            "retryable": retryable,
            "remediation": fix,
            "reasoning": (
                f"{row.corrected_by} corrected job {row.job_id} attempt {row.attempt_number}, "
                f"whose log ended the same way, to {row.category}; the rules read "
                f"{result.category}: {result.reasoning}"
            ),
            "remembered": Remembered(
                rules_category=result.category,
                job_id=row.job_id,
                attempt=row.attempt_number,
                corrected_by=row.corrected_by,
                ending=said,
            ),
        }
    )
