"""`nightshift diagnose JOB|LOGFILE`: run diagnose_failure on a job's log or any saved log,
through the policy gate."""

from __future__ import annotations

import json
import typing
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


def second_opinion(config: str | None, log_path: str, result: Any) -> tuple[Any, dict[int, str]]:
    """A model's opinion on a verdict the rules gave as unknown or low confidence, where a model
    endpoint is configured (agent/brain/second_opinion.py), and the text of the lines it cites;
    (None, {}) when none is asked. The log's end is read here, with the caller's own rights."""
    from nightshift.runtime.config import load_settings

    settings = load_settings(config)
    if not (settings.llm.base_url and settings.llm.model):
        return None, {}
    from nightshift.agent.brain import second_opinion as so
    from nightshift.runtime.errors import ConfigError
    from nightshift.runtime.training.attempt_diagnosis import SecondOpinion

    if not so.wanted(result.category, result.confidence):
        return None, {}
    try:
        ep = so.configured(settings)
    except ConfigError as exc:
        return SecondOpinion(model=settings.llm.model, accepted=False, note=str(exc)), {}
    if ep is None:
        return None, {}
    numbered, why = so.read_window(log_path)
    if not numbered:
        note = why or "the log is empty: nothing to show the model"
        return SecondOpinion(model=ep.model, accepted=False, note=note), {}
    verdict = {
        "category": result.category,
        "confidence": result.confidence,
        "reasoning": result.reasoning,
    }
    op = so.ask(ep, numbered, verdict)
    return op, so.quotes(op, numbered)


def correct(
    config: str | None,
    job_id: int,
    attempt: int | None,
    category: str,
    note: str | None,
    as_json: bool,
) -> None:
    """`--correct CATEGORY`: record the right category through the gate (correct_diagnosis)."""
    from nightshift.skills.diagnose_failure import Category

    choices = typing.get_args(Category)
    if category not in choices:
        error(f"--correct {category!r}: not a category; one of: {', '.join(choices)}")
        raise typer.Exit(2)
    args: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "category": category}
    if note:
        args["note"] = note
    r: Any = call_or_exit(config, "correct_diagnosis", args)
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    said = f"the rules said {r.rules_said}" if r.rules_said else "the rules said nothing"
    say(
        "recorded: job {} attempt {} is [bold]{}[/] ({}){}, by {} at {}",
        r.job_id,
        r.attempt,
        r.category,
        said,
        f"; replaces {r.replaced}" if r.replaced else "",
        r.corrected_by,
        f"{r.corrected_at:%Y-%m-%d %H:%M} UTC",
        soft_wrap=True,
    )
    say("kept the log's last {} lines{}", r.excerpt_lines, f" ({r.log_note})" if r.log_note else "")


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
        correct_as: str | None = typer.Option(
            None,
            "--correct",
            metavar="CATEGORY",
            help="For a job: record the right category of the attempt (with the end of its "
            "log), for `nightshift eval diagnosis --local`",
        ),
        note: str | None = typer.Option(None, "--note", help="With --correct: why, briefly"),
        no_opinion: bool = typer.Option(
            False,
            "--no-second-opinion",
            help="Do not ask the configured model about an unknown or low-confidence verdict",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
        config: str | None = typer.Option(None, "--config", help="Config file"),
    ) -> None:
        """Say why a run ended, from a job's log or any saved log: category, evidence lines,
        what to do next. A number names a job, unless a file of that name is here. Where a model
        endpoint is configured, an unknown or low-confidence verdict gets the model's second
        opinion, shown as the model's. `--correct CATEGORY` records the right answer instead."""
        is_job = target.isdigit() and not Path(target).exists()
        if correct_as is not None:
            if not is_job:
                error("--correct: only for a job id, not a log file")
                raise typer.Exit(2)
            if exit_code is not None or signal is not None:
                error("--correct: the attempt's recorded exit status is kept; no --exit-code")
                raise typer.Exit(2)
            correct(config, int(target), attempt, correct_as, note, as_json)
            return
        if note is not None:
            error("--note: only with --correct")
            raise typer.Exit(2)
        if is_job:
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
        result: Any = call_or_exit(config, "diagnose_failure", args)
        op, quotes = (None, {}) if no_opinion else second_opinion(config, args["log_path"], result)
        if as_json:
            if op is None:
                print(result.model_dump_json(indent=2))
            else:
                data = json.loads(result.model_dump_json())
                data["second_opinion"] = op.model_dump(mode="json")
                print(json.dumps(data, indent=2, ensure_ascii=False))
            return
        print_diagnosis(result)
        if op is not None:
            from nightshift.agent.doors.job_views import print_second_opinion

            print_second_opinion(op, quotes=quotes)
