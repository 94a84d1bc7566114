"""correct_diagnosis: a person's right answer for why an attempt failed, kept with the end of its
log, so the rules can be measured on the operator's own history (`nightshift eval diagnosis
--local`). `nightshift diagnose JOB --correct CATEGORY [--attempt N]`.

It writes one row of the store (runtime/store/db.py `DiagnosisCorrection`), with the call's audit
in one transaction: the category, who gave it (the principal the gate names: the OS user, or the
daemon socket's peer) and when, what the rules said then, and the attempt's log as the loop reads
it — the end of it, bounded (EXCERPT_BYTES, EXCERPT_LINES), opened without following a link the
job planted — with its exit status and the loop's own verdict, so the rules can be run on it
again. The attempt's own diagnosis (the rules') is left as it is.
"""

from __future__ import annotations

import typing
from datetime import datetime

from pydantic import BaseModel, Field
from sqlmodel import select

from nightshift.runtime.errors import BadArguments, UnknownJob
from nightshift.runtime.store.db import Attempt, DiagnosisCorrection, Job
from nightshift.runtime.training import job_history
from nightshift.runtime.training.attempt_diagnosis import read_log_tail
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill
from nightshift.skills.diagnose_failure import Category

CATEGORIES: tuple[str, ...] = typing.get_args(Category)
EXCERPT_BYTES = 256 * 1024
EXCERPT_LINES = 4000
MONITOR_OUTCOMES = ("stalled", "timeout", "lost", "diverged")  # the loop's own verdicts


class CorrectDiagnosisInput(SkillInput):
    job_id: int = Field(description="The job")
    attempt: int | None = Field(None, ge=1, description="The attempt number (default: the newest)")
    category: Category = Field(description="The right category (diagnose_failure's)")
    note: str | None = Field(None, max_length=500, description="Why, in a few words")

    def claims(self) -> Claims:
        """The job it records on: a policy may judge by its owner (claims.others_jobs), as it
        does for a log read, since the log's end is copied."""
        return Claims(jobs=[self.job_id])


class CorrectDiagnosisResult(BaseModel):
    job_id: int
    attempt: int
    category: str = Field(description="The category recorded")
    rules_said: str | None = Field(description="The rules' category for the attempt, if any")
    replaced: str | None = Field(None, description="The earlier correction's category, if any")
    corrected_by: str
    corrected_at: datetime
    excerpt_lines: int = Field(description="How many of the log's last lines were kept")
    log_note: str | None = Field(None, description="Why the log was not read, or how much was")


@skill("correct_diagnosis", capability="modify", store_only=True)
def correct_diagnosis(ctx: SkillContext, inp: CorrectDiagnosisInput) -> CorrectDiagnosisResult:
    """Record the right failure category for a job's attempt (the newest by default), as a person
    says it, with the end of the attempt's log, its exit status and what the rules said, so the
    rules can be measured on this history. A newer correction of the same attempt replaces the
    older one. The attempt's own diagnosis is not changed."""
    with ctx.store.session() as s:
        job = s.get(Job, inp.job_id)
        if job is None:
            raise UnknownJob(f"no job {inp.job_id}; `nightshift jobs` lists the jobs")
        atts = list(
            s.exec(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)).all()
        )
        if not atts:
            raise BadArguments(f"job {job.id} has no attempt yet, so nothing to correct")
        att = (
            atts[-1]
            if inp.attempt is None
            else next((a for a in atts if a.number == inp.attempt), None)
        )
        if att is None or att.id is None:
            raise BadArguments(f"job {job.id} has no attempt {inp.attempt}; it has {len(atts)}")
        excerpt, first_line_no, log_note = _excerpt(ctx, job.id, att.log_path)
        rules = att.diagnosis if isinstance(att.diagnosis, dict) else {}
        row = s.exec(
            select(DiagnosisCorrection).where(DiagnosisCorrection.attempt_id == att.id)
        ).first()
        replaced = row.category if row is not None else None
        if row is None:
            row = DiagnosisCorrection(
                job_id=job.id,
                attempt_id=att.id,
                attempt_number=att.number,
                category=inp.category,
                corrected_by=ctx.principal,
            )
        row.category = inp.category
        row.rules_category = rules.get("category")
        row.rules_confidence = rules.get("confidence")
        row.note = inp.note
        row.corrected_by = ctx.principal
        row.corrected_at = ctx.now
        row.log_path = att.log_path
        row.log_excerpt = excerpt
        row.first_line_no = first_line_no
        row.log_note = log_note
        row.exit_code = att.exit_code
        row.signal = att.signal
        says = att.outcome if att.outcome in MONITOR_OUTCOMES else None
        row.monitor_says = says
        row.monitor_detail = ((att.evidence or "")[:2000] or None) if says else None
        s.add(row)
        return CorrectDiagnosisResult(
            job_id=job.id,
            attempt=att.number,
            category=inp.category,
            rules_said=row.rules_category,
            replaced=replaced,
            corrected_by=ctx.principal,
            corrected_at=ctx.now,
            excerpt_lines=excerpt.count("\n")
            + (1 if excerpt and not excerpt.endswith("\n") else 0),
            log_note=log_note,
        )


def _excerpt(ctx: SkillContext, job_id: int, log_path: str | None) -> tuple[str, int, str | None]:
    """The end of the attempt's log, bounded, its first line's number, and a note."""
    folder = job_history.job_folder(ctx.settings.runs_dir, job_id)
    text, first, note = read_log_tail(folder, log_path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keep = len(lines)
    size = 0
    for i in range(len(lines) - 1, -1, -1):
        size += len(lines[i].encode("utf-8", errors="replace")) + 1
        if size > EXCERPT_BYTES or len(lines) - i > EXCERPT_LINES:
            break
        keep = i
    if keep > 0:
        note = (note + "; " if note else "") + f"kept the last {len(lines) - keep} lines"
    kept = lines[keep:]
    return "\n".join(kept) + ("\n" if kept else ""), first + keep, note
