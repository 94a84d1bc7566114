"""`nightshift chat`: the Textual TUI (chat, live GPUs and jobs, approvals), or one message with
`--once TEXT` for scripts. Textual is imported only when the TUI starts."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from nightshift.agent.doors.console import error

if TYPE_CHECKING:
    from pydantic import BaseModel

    from nightshift.agent.brain.wiring import Wiring


def chat(
    once: str | None = typer.Option(
        None, "--once", metavar="TEXT", help="Send one message, print what comes back, exit"
    ),
    as_json: bool = typer.Option(False, "--json", help="With --once: the events as JSON lines"),
    no_model: bool = typer.Option(
        False, "--no-model", help="Direct commands only, even where a model endpoint is set"
    ),
    config: str | None = typer.Option(
        None, "--config", help="Config file (default $NIGHTSHIFT_HOME/config.yaml)"
    ),
) -> None:
    """Talk to nightshift: direct commands (`help` lists them) or, with a model endpoint, free
    text. Shows GPUs, jobs, logs and approvals live; destructive actions ask first.

    Exit codes with --once: 0 done, 1 failed, 2 bad input (or free text without a model),
    3 refused, 4 waits for an approval, 5 the operator must fix something."""
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load(config)
    w.refuse_if_served()
    if once is not None:
        raise typer.Exit(_once(w, once, as_json, use_model=not no_model))
    try:
        import textual  # noqa: F401
    except ImportError:
        error("nightshift chat needs Textual: pip install 'nightshift[tui]'")
        raise typer.Exit(5) from None
    from nightshift.agent.doors.tui import ChatApp

    ChatApp(w, use_model=not no_model).run()


def _once(w: Wiring, text: str, as_json: bool, *, use_model: bool) -> int:
    """One message, its events printed as they come (plain lines, or JSON lines); the exit code
    says who acts next."""
    from nightshift.agent.doors.chat import (
        EXIT_CODES,
        Answer,
        ApprovalNeeded,
        ChatSession,
        render_event,
    )
    from nightshift.agent.doors.prompts import terminal_confirm

    outcome: list[str] = []  # the last answer's outcome, or "waiting" after an approval

    def emit(event: BaseModel) -> None:
        if isinstance(event, Answer):
            outcome.append(event.outcome)
        elif isinstance(event, ApprovalNeeded):
            outcome.append("waiting")
        if as_json:
            print(event.model_dump_json(), flush=True)
            return
        line = render_event(event)
        if line is not None:
            print(line, flush=True)

    interactive = sys.stdin is not None and sys.stdin.isatty() and not as_json
    session = ChatSession(
        w, emit=emit, confirm=terminal_confirm if interactive else None, use_model=use_model
    )
    # No background loop: a model's goal that watches a job ticks the loop itself (for this
    # chat's jobs only); a direct `submit` only queues, as `nightshift submit` does.
    session.start_loop(background=False)
    session.send(text)
    return EXIT_CODES[outcome[-1]] if outcome else 0


def register(app: typer.Typer) -> None:
    app.command()(chat)
