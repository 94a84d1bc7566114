"""What a person at a terminal is asked and told while a call waits on a decision: the y/N
confirmation of a full request, and the wait for other principals' votes (locally, or on the
daemon's socket). Without a terminal nobody can answer: a call that needs a decision is parked
and said in one line (exit 4), unless `--yes` confirms it or `--wait` waits."""

from __future__ import annotations

import json
import select
import sys
import time
from typing import TYPE_CHECKING, Any

from nightshift.agent.doors.console import console, err_console, say, styled
from nightshift.runtime.errors import ApprovalRequired, NightshiftError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import Approval


def at_terminal() -> bool:
    """Whether a person can answer here: stdin is a terminal (a script's, a cron job's or a
    pipe's is not, and nobody would ever answer it)."""
    return sys.stdin is not None and sys.stdin.isatty()


def confirmer(yes: bool) -> Callable[[dict[str, Any]], bool] | None:
    """How the requester answers a confirmation the gate asks of them: `--yes` answers yes
    anywhere, a terminal asks y/N, and without either nobody is asked."""
    if yes:
        return yes_confirm
    return terminal_confirm if at_terminal() else None


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


def yes_confirm(request: dict[str, Any]) -> bool:
    """`--yes`: the requester's confirmation, given in advance. Says what it confirmed (on
    stderr, so --json output stays JSON); the gate records it as the requester's own."""
    err_console.print(
        styled(
            "[bold yellow]{}[/] {} confirmed with --yes (approval {}, rule {})",
            request["skill"],
            json.dumps(request["args"]),
            request["approval_id"],
            request["rule"],
        ),
        soft_wrap=True,
    )
    return True


def parked(exc: NightshiftError, *, yes: bool, as_json: bool) -> NightshiftError:
    """The error a script gets for a call left waiting (exit 4): one line naming the approval
    and how it is decided; with --json, an object naming it on stdout too."""
    if not isinstance(exc, ApprovalRequired):  # CallInProgress: another process carries it out
        if as_json:
            _print_json(exc, "executing", {})
        return exc
    if as_json:
        _print_json(exc, "pending", {"rule": exc.rule, "quorum": exc.quorum})
    aid = exc.approval_id
    if yes:  # the gate asks the requester only where the rule lets them confirm
        why, then = " Its rule needs other principals' votes, which --yes cannot give.", ""
    else:
        why, then = "", "--yes to confirm your own call where the rule lets you, or with "
    return ApprovalRequired(
        f"approval {aid} needed for {exc.skill} (rule {exc.rule}, quorum {exc.quorum}); "
        f"nothing ran.{why} Decide it with `nightshift approvals approve {aid}` from another "
        f"principal's shell (a running daemon then carries it out), or call again with {then}"
        "--wait to wait for the decision",
        approval_id=aid,
        call_id=exc.call_id,
        skill=exc.skill,
        quorum=exc.quorum,
        rule=exc.rule,
    )


def _print_json(exc: NightshiftError, state: str, more: dict[str, Any]) -> None:
    out = {
        "approval_id": getattr(exc, "approval_id", None),
        "state": state,
        "skill": getattr(exc, "skill", None),
        "call_id": getattr(exc, "call_id", None),
        **more,
    }
    print(json.dumps(out, indent=2), flush=True)


def announce_wait(row: Approval, out: Console = console) -> None:
    """What a waiting shell says first: the call, its rule and how others decide it."""
    out.print(
        styled(
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
    )


def say_expiry(row: Approval, last_said: float, out: Console = console) -> float:
    """Once a minute while waiting, how long the approval has left; returns when it last said."""
    from nightshift.agent.brain.wiring import local_now

    if row.expires_at is None or time.monotonic() - last_said < 60:
        return last_said
    left = (row.expires_at - local_now()).total_seconds()
    out.print(styled("  [dim]waiting; it expires in {} min[/]", f"{max(0, left) / 60:.0f}"))
    return time.monotonic()


def wait_for_decision(w: Wiring, approval_id: int, out: Console = console) -> str:
    """Wait until other principals decide (or the approval expires), saying what it waits for
    and for how long. At a terminal whose user is not the requester (a goal's agent-planned
    call), that user is asked to vote here too. Returns approved | rejected | expired; Ctrl-C
    leaves it pending: once approved, the daemon carries it out. `out`: where it says so
    (stderr, where stdout is a command's --json)."""
    from nightshift.agent.brain.wiring import local_now

    row = w.approvals.status(approval_id, local_now())
    announce_wait(row, out)
    ask = (
        at_terminal()
        and w.policy.canonical(w.user) != w.policy.canonical(row.requester)
        and w.policy.may_approve(w.user)
    )
    if ask:
        out.print(styled("  approve as {}? \\[y/N] ", w.user), end="")
    last_said = time.monotonic()
    while row.state == "pending":
        last_said = say_expiry(row, last_said, out)
        if ask and select.select([sys.stdin], [], [], 1.0)[0]:
            answer = sys.stdin.readline().strip().lower()
            w.approvals.vote(approval_id, w.user, answer in ("y", "yes"), local_now())
            ask = False
        else:
            time.sleep(1.0)
        row = w.approvals.status(approval_id, local_now())
    out.print(styled("  approval {}: {}", approval_id, row.state))
    return row.state
