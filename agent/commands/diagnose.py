"""`nightshift diagnose LOGFILE`: run diagnose_failure on any saved log, through the policy gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from nightshift.agent.console import console, error
from nightshift.agent.shell import call_or_exit


def say(text: str) -> None:
    """One line to the terminal, never wrapped (a log line stays whole)."""
    console.print(text, soft_wrap=True)


def readable_file(path: Path) -> Path:
    """The path, resolved, if it is a file this process can read; else print why and exit 2."""
    full = path.expanduser()
    if not full.exists():
        error(f"{full}: no such file")
        raise typer.Exit(2)
    if full.is_dir():
        error(f"{full}: is a folder, not a file")
        raise typer.Exit(2)
    try:
        with open(full, "rb") as f:
            f.read(1)
    except OSError as exc:
        error(f"{full}: cannot be read ({exc.strerror or exc})")
        raise typer.Exit(2) from None
    return full.resolve()


def print_diagnosis(r: Any) -> None:
    """The verdict for a person: category first, then why, the lines that show it, what to do."""
    retry = "yes" if r.retryable else "no"
    say(
        f"[bold]{r.category}[/]  confidence {r.confidence}, retryable {retry}"
        + (f", signal {r.signal}" if r.signal else "")
    )
    say(f"why: {escape(r.reasoning)}")
    if r.evidence:
        say("evidence:")
        width = len(str(max(e.line_no for e in r.evidence)))
        for e in r.evidence:
            say(f"  {e.line_no:>{width}}: {escape(e.text)}")
    rem = r.remediation
    say(f"remediation: [bold]{rem.action}[/] — {escape(rem.message)}")
    if rem.changes:
        changes = ", ".join(f"{k} = {v}" for k, v in rem.changes.items())
        say(f"  changes: {escape(changes)}")


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
        path = readable_file(logfile)
        result = call_or_exit(
            config,
            "diagnose_failure",
            {"log_path": str(path), "exit_code": exit_code, "signal": signal},
        )
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            print_diagnosis(result)
