"""What a person at a terminal is asked and told while a call waits on a decision: the y/N
confirmation of a full request, and the wait for other principals' votes (locally, or on the
daemon's socket)."""

from __future__ import annotations

import json
import select
import sys
import time
from typing import TYPE_CHECKING, Any

from nightshift.agent.doors.console import console, say

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring
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
    from nightshift.agent.brain.wiring import local_now

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
    from nightshift.agent.brain.wiring import local_now

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
