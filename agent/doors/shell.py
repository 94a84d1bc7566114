"""What a person at a shell goes through for one skill call: the gate, and — when a rule asks —
a y/N confirmation of the full request at the terminal (or `--yes`), or a wait for other
principals' votes (agent/doors/prompts.py) — a script's call is parked at once instead, unless
`--wait`; and the `k=v` arguments a command line gives."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from nightshift.runtime.errors import BadArguments, NightshiftError, SpecError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from nightshift.agent.brain.wiring import Wiring


def call_as_user(
    w: Wiring,
    name: str,
    args: dict[str, Any],
    *,
    wait: bool = False,
    yes: bool = False,
    as_json: bool = False,
) -> BaseModel:
    """One skill call from the shell, as the local user, through the gate (the daemon's, in a
    shared install). Where the policy lets the requester confirm, a terminal asks y/N (`yes`:
    confirmed without asking). A call left to other principals waits for them at a terminal or
    with `wait`; without either (a script: nobody would ever answer) it is ApprovalRequired at
    once, naming the approval (exit 4; with `as_json`, an object on stdout too)."""
    from nightshift.agent.doors.console import console, err_console
    from nightshift.agent.doors.prompts import at_terminal, confirmer, parked, wait_for_decision
    from nightshift.agent.doors.remote import remote_of

    try:
        remote = remote_of(w)
        if remote is not None:  # a JSON line to the daemon: no policy stack, no store here
            return remote.call_as_user(name, args, yes=yes, wait=wait, as_json=as_json)
        from nightshift.agent.doors.api import Client

        block = wait or at_terminal()
        out = err_console if as_json else console  # with --json, stdout is the result's
        return Client(w, via="terminal").call(
            name,
            args,
            call_id=f"cli-{uuid.uuid4().hex[:12]}",
            confirm=confirmer(yes),
            wait=(lambda exc: wait_for_decision(w, exc.approval_id, out)) if block else None,
        )
    except NightshiftError as exc:
        if exc.exit_code == 4 and getattr(exc, "approval_id", None) is not None:
            raise parked(exc, yes=yes, as_json=as_json) from None  # left waiting: say how
        raise


def call_or_exit(
    config: str | None,
    name: str,
    args: dict[str, Any],
    *,
    wait: bool = False,
    yes: bool = False,
    as_json: bool = False,
) -> BaseModel:
    """call_as_user for a command that has only its config path (errors reach the CLI's one
    handler)."""
    from nightshift.agent.brain.wiring import Wiring

    return call_as_user(Wiring.load(config), name, args, wait=wait, yes=yes, as_json=as_json)


def parse_key_values(items: list[str], option: str = "--arg") -> dict[str, Any]:
    """`k=v` items with YAML values (`lr=1e-3` is a float, `gpus=[0,1]` a list), parsed by the
    bounded loader user files go through (no aliases, bounded depth); a value that is not valid
    YAML is BadArguments naming the option and the key, never a parser traceback."""
    from nightshift.runtime.yamlfile import parse_yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadArguments(f"{option} {item!r}: expected key=value")
        where = f"{option} {key}"
        try:
            out[key] = parse_yaml(value, where)[0] if value else ""
        except (SpecError, ValueError, OverflowError) as exc:  # ValueError: a date like 2024-13-45
            shown = item if len(item) <= 80 else item[:79] + "…"
            raise BadArguments(
                f"{option} {shown!r}: the value is not YAML ({_why(exc, where)}); quote it "
                f"to pass it as text ({option} {key}='\"...\"') or write valid YAML"
            ) from None
    return out


def _why(exc: Exception, where: str) -> str:
    """The parser's reason on one line, without the `WHERE:LINE: ` SpecError puts first."""
    text = str(exc)
    line = exc.line if isinstance(exc, SpecError) else None
    prefix = where + (f":{line}" if line is not None else "") + ": "
    text = text.removeprefix(prefix).removeprefix("not valid YAML: ")
    return " ".join(text.split())
