"""`nightshift diagnose LOGFILE`: run diagnose_failure on any saved log, through the policy gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import say
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


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        logfile: Path = typer.Argument(..., help="A saved log (stdout + stderr)"),
        exit_code: int | None = typer.Option(
            None,
            "--exit-code",
            help="The process's exit code (negative: killed by "
            "that signal; 128+N: signal N, as a shell reports it)",
        ),
        signal: int | None = typer.Option(None, "--signal", help="The signal that ended it"),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
        config: str | None = typer.Option(None, "--config", help="Config file"),
    ) -> None:
        """Say why a run ended, from its saved log: category, evidence lines, what to do next."""
        # The skill reads the log's tail (bounded); a FIFO or a device is refused before it opens.
        path = regular_file(logfile, "LOGFILE")
        result = call_or_exit(
            config,
            "diagnose_failure",
            {"log_path": str(path), "exit_code": exit_code, "signal": signal},
        )
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            print_diagnosis(result)
