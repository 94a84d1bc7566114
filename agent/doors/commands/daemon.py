"""`nightshift daemon`: run the scheduler/monitor loop in the foreground, and serve the API."""

from __future__ import annotations

import signal

import typer

from nightshift.agent.doors.console import console, say


def daemon(
    config: str | None = typer.Option(None, "--config"),
    max_ticks: int | None = typer.Option(None, "--max-ticks", hidden=True),
) -> None:
    """Place, start, watch and recover jobs until stopped (SIGTERM or Ctrl-C), and serve the API
    on a Unix socket (api.socket), where who asks is the peer's uid. Runs keep going while it is
    down; the next daemon re-attaches to them. See README for a systemd unit and a shared install."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.daemon import (
        Daemon,
    )  # LangGraph: imported by the commands that use it

    w = Wiring.load(config, server=True)
    d = Daemon(
        w,
        on_progress=lambda kind, data: (
            kind == "recover"
            and say("recovering job {} (thread {})", data["job_id"], data["thread"])
        ),
        serve_api=w.settings.api.serve,
        config=config,
        say=lambda message: console.print(message, markup=False, highlight=False),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: d.stop_event.set())
    from importlib.metadata import version

    # The store, socket, executor and policy follow, one line each (agent/doors/daemon_log.py).
    say("nightshift daemon {} as OS user {} (Ctrl-C to stop)", version("nightshift"), w.user)
    d.run(max_ticks=max_ticks)
    console.print("daemon stopped; runs continue and are re-attached at the next start")


def register(app: typer.Typer) -> None:
    app.command()(daemon)
