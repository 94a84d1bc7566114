"""What a person at a shell goes through for one skill call: the gate, and — when a rule asks —
a y/N confirmation of the full request at the terminal, or a wait for other principals' votes."""

from __future__ import annotations

import json
import select
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from nightshift.agent.console import console, say
from nightshift.runtime.errors import BadArguments, SpecError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from nightshift.agent.wiring import Wiring
    from nightshift.runtime.store.db import Approval


def terminal_confirm(request: dict[str, Any]) -> bool:
    """Show the whole request and ask y/N; anything but y/yes (or end of input) is no."""
    say("[bold yellow]{}[/] needs confirmation (rule {}):", request["skill"], request["rule"])
    console.print_json(json.dumps(request["args"]))
    for path, digest in (request.get("files") or {}).items():
        say("  file {} (sha256 {}…)", path, digest[:16])
    for reason in request.get("reasons") or []:
        say("  [dim]{}[/]", reason)
    say("  run it? (approval {}) \\[y/N] ", request["approval_id"], end="")
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def announce_wait(row: Approval) -> None:
    """What a waiting shell says first: the call, its rule and how others decide it."""
    say(
        "[bold yellow]approval {} needed[/]: {} {} (rule {}, {} from others)\n"
        "  decide from another principal's shell: [bold]nightshift approvals approve {}[/] / "
        "[bold]nightshift approvals reject {}[/]",
        row.id,
        row.skill,
        json.dumps(row.args),
        row.rule,
        row.quorum,
        row.id,
        row.id,
    )


def say_expiry(row: Approval, last_said: float) -> float:
    """Once a minute while waiting, how long the approval has left; returns when it last said."""
    from nightshift.agent.wiring import local_now

    if row.expires_at is None or time.monotonic() - last_said < 60:
        return last_said
    left = (row.expires_at - local_now()).total_seconds()
    say("  [dim]waiting; it expires in {} min[/]", f"{max(0, left) / 60:.0f}")
    return time.monotonic()


def wait_for_decision(w: Wiring, approval_id: int) -> str:
    """Wait until other principals decide (or the approval expires), saying what it waits for
    and for how long. At a terminal whose user is not the requester (a goal's agent-planned
    call), that user is asked to vote here too. Returns approved | rejected | expired; Ctrl-C
    leaves it pending: once approved, the daemon carries it out."""
    from nightshift.agent.wiring import local_now

    row = w.approvals.status(approval_id, local_now())
    announce_wait(row)
    ask = (
        sys.stdin is not None
        and sys.stdin.isatty()
        and w.policy.canonical(w.user) != w.policy.canonical(row.requester)
        and w.policy.may_approve(w.user)
    )
    if ask:
        say("  approve as {}? \\[y/N] ", w.user, end="")
    last_said = time.monotonic()
    while row.state == "pending":
        last_said = say_expiry(row, last_said)
        if ask and select.select([sys.stdin], [], [], 1.0)[0]:
            answer = sys.stdin.readline().strip().lower()
            w.approvals.vote(approval_id, w.user, answer in ("y", "yes"), local_now())
            ask = False
        else:
            time.sleep(1.0)
        row = w.approvals.status(approval_id, local_now())
    say("  approval {}: {}", approval_id, row.state)
    return row.state


def call_as_user(w: Wiring, name: str, args: dict[str, Any]) -> BaseModel:
    """One skill call from the shell, as the local user, through the gate (the daemon's, in a
    shared install). Where the policy lets the requester confirm, a terminal asks y/N;
    otherwise it waits for other principals."""
    from nightshift.agent.api import Client

    if w.remote is not None:
        return w.remote.call_as_user(name, args)

    interactive = sys.stdin is not None and sys.stdin.isatty()
    return Client(w, via="terminal").call(
        name,
        args,
        call_id=f"cli-{uuid.uuid4().hex[:12]}",
        confirm=terminal_confirm if interactive else None,
        wait=lambda exc: wait_for_decision(w, exc.approval_id),
    )


def call_or_exit(config: str | None, name: str, args: dict[str, Any]) -> BaseModel:
    """call_as_user for a command that has only its config path (errors reach the CLI's one
    handler)."""
    from nightshift.agent.wiring import Wiring

    return call_as_user(Wiring.load(config), name, args)


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
