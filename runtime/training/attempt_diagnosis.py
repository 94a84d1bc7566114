"""The diagnosis kept with a failed attempt, and the bounded, link-safe read of its log behind it.

The loop records why an attempt failed as the attempt ends, so `nightshift jobs`, `show` and
`why` can say it at a glance, without reading the log again — and a client of a shared daemon,
who may not be able to read the job's folder at all, gets it through the read skills.

The classifier is the diagnose_failure skill's (skills/attempt_diagnosis.py adapts it); runtime
imports nothing above it, so the wiring hands the engine a `Diagnoser` and the engine gives it
what it knows of the run as a `FailedRun`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from nightshift.runtime.training import diagnosis_view, job_files
from nightshift.runtime.training.diagnosis_view import BRIEF_CHARS
from nightshift.runtime.training.machine_evidence import MachineEvidence

TAIL_BYTES = 1024 * 1024  # the end of the log that is classified
COUNT_BYTES = 64 * 1024 * 1024  # up to this much before the tail is counted, for line numbers
COUNT_CHUNK = 1024 * 1024


class SecondOpinion(BaseModel):
    """A model's reading of a log the rules could not place (or placed with low confidence):
    labelled as the model's, kept beside the rules' verdict and never merged into it. An answer
    that names no known category or cites lines outside what it was shown is kept as dropped
    (`accepted` false, `category` None) with the reason in `note`."""

    model: str = Field(description="The model that answered (llm.model)")
    accepted: bool = Field(description="Whether the answer passed the checks")
    category: str | None = Field(None, description="The model's category; None when dropped")
    lines: list[int] = Field(
        default_factory=list, description="The log's line numbers the model cites"
    )
    note: str = Field("", description="The model's one-line reason, or why it was dropped")


class Remembered(BaseModel):
    """A person's correction of an earlier attempt whose log ended the same way (its last error
    line, numbers and paths aside) and which the rules had read as they read this one: the
    category is theirs, and the rules' reading is kept beside it."""

    rules_category: str = Field(description="What the rules said of this attempt")
    job_id: int = Field(description="The corrected attempt's job")
    attempt: int = Field(description="The corrected attempt's number")
    corrected_by: str
    ending: str = Field(description="The line both logs end with, as compared")


class Diagnosis(BaseModel):
    """Why an attempt failed, in the words a person reads first: what kind of failure, the one
    log line that shows it (and where), and what to do about it."""

    category: str = Field(description="cuda_oom, import_or_env, crashed, ... (diagnose_failure)")
    confidence: str = Field(description="high | medium | low")
    retryable: bool = Field(description="Whether a retry (with the fix's changes) can help")
    line_no: int | None = Field(
        None,
        description="The evidence's 1-based line number in the attempt's log (in the kernel "
        "log for source kernel_log; 0 for the monitor's own words); None: no line shows it",
    )
    evidence: str | None = Field(None, description="The line that shows it, control codes removed")
    source: str | None = Field(
        None,
        description="log | kernel_log | monitor | exit_status | cgroup | disk | gpu_xid | metrics",
    )
    summary: str = Field(description="One line: why, and how the process ended")
    action: str = Field(description="resume | resume_smaller_batch | resume_lower_lr | ... | stop")
    fix: str = Field(description="The recommended action, in words")
    changes: dict[str, Any] = Field(
        default_factory=dict, description="New parameter values the fix proposes, by name"
    )
    machine: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What the machine said as the attempt ended, each {source, text, line_no}: "
        "source exit_status | cgroup | kernel_log | disk | gpu_xid | metrics",
    )
    remembered: Remembered | None = Field(
        None,
        description="Where the category is a person's: their correction of an earlier attempt "
        "whose log ended the same way (the rules' own reading is kept in it)",
    )
    second_opinion: SecondOpinion | None = Field(
        None,
        description="A model's reading, where one is configured and the rules said unknown or "
        "low confidence: the model's, not the rules' (the category above stays the rules')",
    )

    @classmethod
    def stored(cls, raw: Any) -> Diagnosis | None:
        """The diagnosis an attempt row holds; None for none (attempts before 0012) or a row
        that does not parse (it is shown as no diagnosis rather than breaking a listing)."""
        if not isinstance(raw, dict):
            return None
        try:
            return cls.model_validate(raw)
        except ValidationError:
            return None

    def where(self) -> str:
        """Where the evidence is: `line 12`, `kernel log line 3`, `monitor`, or ""."""
        return diagnosis_view.where(self.evidence, self.line_no, self.source)

    def brief(self, width: int = BRIEF_CHARS) -> str:
        """The "why" of `nightshift jobs`: `category: evidence`, cut to `width`."""
        return diagnosis_view.brief(self.category, self.evidence, self.summary, width)


@dataclass(frozen=True)
class FailedRun:
    """What is known of an attempt that ended failed, for the classifier."""

    log_tail: str
    first_line_no: int = 1  # the log's line number of the tail's first line
    log_note: str | None = None  # why the log could not be read, or how much of it was
    exit_code: int | None = None
    signal: int | None = None
    # stalled | timeout | lost | diverged: the loop's own verdict, which the classifier takes
    monitor_says: str | None = None
    monitor_detail: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, str] = field(default_factory=dict)
    # What the daemon read from the machine as it ended (runtime/training/machine_evidence.py)
    machine: MachineEvidence | None = None
    # The attempt's row id, where the loop diagnoses a stored attempt (a later opinion is
    # attached to its diagnosis); None for a log diagnosed on its own.
    attempt_id: int | None = None


Diagnoser = Callable[[FailedRun], Diagnosis]


def read_log_tail(job_folder: Path, log_path: str | None) -> tuple[str, int, str | None]:
    """The end of an attempt's log as text, the line number of its first line, and a note when
    it could not be read. Bounded (TAIL_BYTES, and lines before it counted up to COUNT_BYTES) and
    opened through job_files: the folder may be the submitter's, with links planted in it."""
    if not log_path:
        return "", 1, "the attempt has no log"
    try:
        with job_files.open_file(job_folder, log_path) as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - TAIL_BYTES)
            newlines: int | None = 0
            if start > COUNT_BYTES:
                newlines = None
            else:
                while newlines is not None and f.tell() < start:
                    chunk = f.read(min(COUNT_CHUNK, start - f.tell()))
                    if not chunk:
                        break
                    newlines += chunk.count(b"\n")
            f.seek(start)
            data = f.read(TAIL_BYTES)
    except (OSError, job_files.JobFileRefused) as exc:
        return "", 1, f"the log was not read ({exc})"
    lines = data.decode("utf-8", errors="replace")
    if start == 0:
        return lines, 1, None
    # The tail's first line is partial: drop it.
    rest = lines.split("\n", 1)[1] if "\n" in lines else ""
    if newlines is None:
        return rest, 1, f"read the last {TAIL_BYTES} bytes; line numbers count from there"
    return rest, newlines + 2, None
