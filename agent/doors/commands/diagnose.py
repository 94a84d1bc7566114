"""`nightshift diagnose JOB|LOGFILE`: run diagnose_failure on a job's log or any saved log,
through the policy gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import error, say
from nightshift.agent.doors.shell import call_or_exit
from nightshift.runtime.user_files import regular_file


def print_diagnosis(r: Any) -> None:
    """The verdict for a person: category first, then why, the lines that show it, what to do.
    Each line is whole (soft wrap): a log line stays one line."""
    retry = "yes" if r.retryable else "no"
    signal = f", signal {r.signal}" if r.signal else ""
    say(
        "[bold]{}[/]  confidence {}, retryable {}{}",
        r.category,
        r.confidence,
        retry,
        signal,
        soft_wrap=True,
    )
    say("why: {}", r.reasoning, soft_wrap=True)
    if r.evidence:
        say("evidence:", soft_wrap=True)
        width = len(str(max(e.line_no for e in r.evidence)))
        for e in r.evidence:
            say("  {}: {}", f"{e.line_no:>{width}}", e.text, soft_wrap=True)
    rem = r.remediation
    say("remediation: [bold]{}[/] — {}", rem.action, rem.message, soft_wrap=True)
    if rem.changes:
        changes = ", ".join(f"{k} = {v}" for k, v in rem.changes.items())
        say("  changes: {}", changes, soft_wrap=True)


MONITOR_OUTCOMES = ("stalled", "timeout", "lost", "diverged")  # the loop's own verdicts


def job_arguments(config: str | None, job_id: int, attempt: int | None) -> dict[str, Any]:
    """diagnose_failure's arguments for one attempt of a job (the newest by default), from
    show_job: its log, exit status, parameters and, where the loop stopped it, the loop's
    verdict and what it saw. The daemon reads the log, as the caller may read it."""
    r: Any = call_or_exit(config, "show_job", {"job_id": job_id})
    if not r.attempts:
        error(f"job {job_id} has no attempt yet, so no log to diagnose")
        raise typer.Exit(2)
    att = (
        r.attempts[-1]
        if attempt is None
        else next((a for a in r.attempts if a.number == attempt), None)
    )
    if att is None:
        error(f"job {job_id} has no attempt {attempt}; it has {len(r.attempts)}")
        raise typer.Exit(2)
    if not att.log_path:
        error(f"attempt {att.number} of job {job_id} recorded no log")
        raise typer.Exit(2)
    args: dict[str, Any] = {
        "log_path": att.log_path,
        "exit_code": att.exit_code,
        "signal": att.signal or None,
    }
    if att.outcome in MONITOR_OUTCOMES:
        args["monitor_says"] = att.outcome
        if att.evidence:
            args["monitor_detail"] = att.evidence[:2000]
    return args


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        target: str = typer.Argument(
            ..., metavar="JOB|LOGFILE", help="A job id (its newest attempt), or a saved log"
        ),
        attempt: int | None = typer.Option(
            None, "--attempt", help="For a job: the attempt number (default: the newest)"
        ),
        exit_code: int | None = typer.Option(
            None,
            "--exit-code",
            help="The process's exit code (negative: killed by "
            "that signal; 128+N: signal N, as a shell reports it); for a job, the recorded one",
        ),
        signal: int | None = typer.Option(None, "--signal", help="The signal that ended it"),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
        config: str | None = typer.Option(None, "--config", help="Config file"),
    ) -> None:
        """Say why a run ended, from a job's log or any saved log: category, evidence lines,
        what to do next. A number names a job, unless a file of that name is here."""
        if target.isdigit() and not Path(target).exists():
            args = job_arguments(config, int(target), attempt)
        else:
            if attempt is not None:
                error("--attempt: only for a job id, not a log file")
                raise typer.Exit(2)
            # The skill reads the log's tail (bounded); a FIFO or a device is refused before it
            # opens.
            args = {"log_path": str(regular_file(Path(target), "LOGFILE"))}
        if exit_code is not None:
            args["exit_code"] = exit_code
        if signal is not None:
            args["signal"] = signal
        args.setdefault("exit_code", None)
        args.setdefault("signal", None)
        result = call_or_exit(config, "diagnose_failure", args)
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            print_diagnosis(result)
