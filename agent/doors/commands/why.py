"""`nightshift why JOB`: why a job failed, at a glance — the diagnosis the loop kept with its
newest failed attempt (category, the evidence line and its number, a summary, the fix). Read
through show_job, so a client of a shared daemon gets it over the socket without reading the
job's folder."""

from __future__ import annotations

from typing import Any

import typer

from nightshift.agent.doors.console import error, say
from nightshift.agent.doors.job_views import print_attempt_diagnosis
from nightshift.agent.doors.shell import call_or_exit

FAILED = ("failed", "lost", "diverged", "timeout", "stalled")


def why(
    job_id: int = typer.Argument(..., help="The job"),
    attempt: int | None = typer.Option(
        None, "--attempt", help="Attempt number; default: the newest that failed"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON"),
    config: str | None = typer.Option(None, "--config", help="Config file"),
) -> None:
    """Why a job failed: the category, the log line that shows it (with its line number), a
    summary and the recommended fix, as diagnosed when the attempt ended."""
    r: Any = call_or_exit(config, "show_job", {"job_id": job_id})
    picked = _pick(r.attempts, attempt)
    if picked is None:
        if attempt is not None:
            error(f"job {job_id} has no attempt {attempt}; it has {len(r.attempts)}")
            raise typer.Exit(2)
        if as_json:
            print("null")
            return
        say(
            "job {} is {}: {}",
            job_id,
            r.state,
            "no attempt yet" if not r.attempts else "no attempt of it failed",
        )
        return
    d = picked.diagnosis
    if as_json:
        print(d.model_dump_json(indent=2) if d is not None else "null")
        return
    say(
        "[bold]job {}[/] {}: {} — attempt {} of {} {}",
        job_id,
        r.name,
        r.state,
        picked.number,
        len(r.attempts),
        _how(picked),
    )
    if picked.outcome not in FAILED:
        say("  it did not fail: nothing to diagnose")
        return
    if d is None:
        # It failed before the loop kept diagnoses (a store from before 0012).
        say(
            "  no diagnosis was kept for it: `nightshift diagnose {}` reads its log now",
            job_id,
        )
        return
    print_attempt_diagnosis(picked.number, d, log_path=picked.log_path)
    if r.state == "failed" and d.retryable:
        say("  `nightshift retry {}` runs it once more", job_id)


def _pick(attempts: list[Any], number: int | None) -> Any:
    if number is not None:
        return next((a for a in attempts if a.number == number), None)
    failed = [a for a in attempts if a.outcome in FAILED]
    return failed[-1] if failed else None


def _how(a: Any) -> str:
    how = a.outcome or a.state
    if a.signal:
        return f"{how} (signal {a.signal})"
    if a.exit_code not in (None, 0):
        return f"{how} (exit {a.exit_code})"
    return how


def register(app: typer.Typer) -> None:
    app.command()(why)
