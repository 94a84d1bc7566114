"""What a person at a shell goes through for one skill call: the gate, and — when a rule asks —
an approval prompt at the terminal (or a wait for a decision from another shell or channel)."""

from __future__ import annotations

import json
import select
import sys
import time
import uuid
from typing import Any

import typer
import yaml
from pydantic import BaseModel

from nightshift.agent.api import Client
from nightshift.agent.console import console
from nightshift.agent.wiring import Wiring, local_now
from nightshift.runtime.errors import NightshiftError, PolicyDenied, SpecError


def wait_for_approval(w: Wiring, req: dict[str, Any]) -> str:
    """Ask at the terminal when there is one; otherwise (cron, CI) wait for a decision from any
    channel until the approval is decided or expires. Returns approved | rejected | expired."""
    aid = req["approval_id"]
    console.print(f"[bold yellow]approval {aid} needed[/]: {req['skill']} {json.dumps(req['args'])} "
                  f"(rule {req['rule']}, quorum {req['quorum']})\n"
                  f"  decide from any shell: [bold]nightshift approve {aid}[/] / "
                  f"[bold]nightshift reject {aid}[/]")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        console.print(f"  approve as {w.user}? [y/N] ", end="")
    while True:
        state = w.approvals.status(aid, local_now()).state
        if state != "pending":
            console.print(f"  approval {aid}: {state}")
            return state
        if interactive and select.select([sys.stdin], [], [], 1.0)[0]:
            answer = sys.stdin.readline().strip().lower()
            try:
                w.approvals.vote(aid, w.user, answer in ("y", "yes"), local_now())
            except PolicyDenied as exc:
                console.print(f"  [red]{exc}[/] — waiting for another approver")
                interactive = False
        else:
            time.sleep(1.0)


def call_as_user(w: Wiring, name: str, args: dict[str, Any]) -> BaseModel:
    """One skill call from the shell, as the local user, through the gate; waits for an approval
    at the terminal (or from another shell) when the policy asks for one."""
    return Client(w).call(name, args, call_id=f"cli-{uuid.uuid4().hex[:12]}",
                          wait=lambda req: wait_for_approval(w, req))


def call_or_exit(config: str | None, name: str, args: dict[str, Any]) -> BaseModel:
    """call_as_user for a command: a NightshiftError becomes one error line and its exit code."""
    from nightshift.agent.console import error

    try:
        return call_as_user(Wiring.load(config), name, args)
    except NightshiftError as exc:
        error(str(exc))
        raise typer.Exit(exc.exit_code) from None


def parse_key_values(items: list[str], option: str = "--arg") -> dict[str, Any]:
    """`k=v` items with YAML values (`lr=1e-3` is a float, `gpus=[0,1]` a list)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{option} {item!r}: expected key=value")
        out[key] = yaml.safe_load(value) if value else ""
    return out
