"""diagnose_failure's verdict in the short form kept with a failed attempt (runtime's
`Diagnosis`): the loop calls `diagnose_attempt` as each failed attempt ends, offline and without
the policy gate (it only reads a bounded log tail the engine already read), and the agent's own
diagnose_failure call replaces it through `from_result`. The machine's evidence the loop read
as the attempt ended is kept with the attempt (`attempt.machine`); `with_stored_machine` passes it
on to a later diagnose_failure call of the same attempt, so the agent's verdict reads it too."""

from __future__ import annotations

from typing import Any

from sqlmodel import select

from nightshift.runtime.store.db import Attempt, Store
from nightshift.runtime.training.attempt_diagnosis import Diagnosis, FailedRun
from nightshift.skills.diagnose_failure import (
    DiagnoseFailureInput,
    DiagnoseFailureResult,
    EvidenceLine,
    diagnose_failure,
    remember,
)

MAX_DETAIL = 2000  # DiagnoseFailureInput.monitor_detail's limit
MAX_SIGNAL = 64
MAX_LINE = 300

# What a traceback starts with: true, but never the line that says why.
_NOT_A_CAUSE = ("Traceback (most recent call last)",)


def diagnose_attempt(run: FailedRun, store: Store | None = None) -> Diagnosis:
    """Classify a failed attempt from its log tail, exit status and the loop's own verdict; with
    `store`, a person's correction of a log that ended the same way is used (the loop's
    diagnoser: skills/remembered_corrections.py)."""
    sig = run.signal if run.signal is not None and 0 <= run.signal <= MAX_SIGNAL else None
    result = diagnose_failure.fn(
        None,
        DiagnoseFailureInput(
            log_tail=run.log_tail,
            exit_code=run.exit_code,
            signal=sig,
            monitor_says=run.monitor_says,  # type: ignore[arg-type]
            monitor_detail=(run.monitor_detail or "")[:MAX_DETAIL] or None,
            params=run.params or None,
            knobs=run.knobs or None,
            machine=run.machine,
        ),
    )
    if store is not None:
        result = remember(
            store,
            result,
            lambda: run.log_tail,
            params=run.params or None,
            knobs=run.knobs or None,
            attempt_id=run.attempt_id,
        )
    shown = from_result(result, first_line_no=run.first_line_no)
    if shown.evidence is None and run.monitor_detail and not run.monitor_says:
        # Nothing in the log says it, but the loop said why it failed ("could not start: ...").
        shown = shown.model_copy(
            update={"evidence": run.monitor_detail[:MAX_LINE], "line_no": 0, "source": "monitor"}
        )
    if run.log_note:
        shown = shown.model_copy(update={"summary": f"{shown.summary}; {run.log_note}"})
    return shown


def from_result(result: DiagnoseFailureResult, *, first_line_no: int = 1) -> Diagnosis:
    """The stored form of a diagnose_failure result; `first_line_no`: the log's line number of
    the first line the classifier read (its own numbers count from 1)."""
    line = best_evidence(result.evidence)
    line_no = None
    if line is not None:
        line_no = line.line_no + (first_line_no - 1 if line.source == "log" else 0)
    return Diagnosis(
        category=result.category,
        confidence=result.confidence,
        retryable=result.retryable,
        line_no=line_no,
        evidence=None if line is None else line.text,
        source=None if line is None else line.source,
        summary=result.reasoning,
        action=result.remediation.action,
        fix=result.remediation.message,
        changes=dict(result.remediation.changes),
        machine=[m.model_dump() for m in result.machine],
        remembered=result.remembered,
    )


def best_evidence(lines: list[EvidenceLine]) -> EvidenceLine | None:
    """The one line to show: the classifier lists the lines that show the category in log order,
    the monitor's words first; a traceback's header says nothing of the cause, so the first other
    line wins."""
    for e in lines:
        if e.text and not e.text.startswith(_NOT_A_CAUSE):
            return e
    return lines[0] if lines else None


def with_stored_machine(store: Store, args: dict[str, Any]) -> dict[str, Any]:
    """diagnose_failure's `args` with the machine's evidence kept with the attempt whose log they
    name (`attempt.machine`), where they give none: the loop read it once, as the attempt ended
    (the cgroup and the processes are gone by now), and a later diagnosis must not read less.
    `args` itself when they name no stored attempt, or give their own evidence."""
    log_path = args.get("log_path")
    if args.get("machine") is not None or not isinstance(log_path, str) or not log_path:
        return args
    with store.session() as s:
        att = s.exec(select(Attempt).where(Attempt.log_path == log_path)).first()
        machine = att.machine if att is not None else None
    if not isinstance(machine, dict):
        return args
    return {**args, "machine": machine}
