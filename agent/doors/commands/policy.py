"""`nightshift policy check NEW.yaml` and `nightshift policy apply NEW.yaml`: try a policy on the
calls recorded in the audit (what would change, call by call; nothing is written), then make it
the one in force through the gate, as an approved call whose approvers see that change.

Both open the store: in a shared install they are commands of the daemon's user."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from nightshift.agent.doors.console import console, err_console, say, styled, table
from nightshift.runtime.errors import BadArguments

if TYPE_CHECKING:
    from rich.console import Console

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.policies.policy_check import CheckReport, Outcome

ConfigOpt = typer.Option(None, "--config", help="Config file")
FileArg = typer.Argument(..., help="The new policy file (YAML)")
SinceOpt = typer.Option(
    None, "--since", help="Only calls recorded within this span: 30m, 12h, 7d, 2w (default: all)"
)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str, option: str = "--since") -> timedelta:
    """`7d`, `12h`, `30m`, `90s`, `2w`: a span back from now."""
    m = _AGE.match(text)
    if m is None:
        raise BadArguments(
            f"{option} {text!r}: expected a number and a unit (s, m, h, d or w), e.g. 7d or 12h"
        )
    try:
        return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    except OverflowError:
        raise BadArguments(
            f"{option} {text!r}: too long a span; give at most a few years"
        ) from None


def _since(since: str | None) -> datetime | None:
    from nightshift.agent.brain.wiring import local_now

    if since is None:
        return None
    age = parse_age(since)
    try:
        return local_now() - age
    except OverflowError:
        raise BadArguments(f"--since {since!r}: before year 1; give a shorter span") from None


def _checked(w: Wiring, policy_file: Path, since: str | None) -> tuple[Path, CheckReport]:
    """The candidate read and validated (errors name the field and line), and its replay."""
    from nightshift.policies.policy_check import Window, check_policy
    from nightshift.policies.policy_source import policy_from_text
    from nightshift.runtime.yamlfile import read_text

    w.refuse_if_served()
    path = policy_file.expanduser().resolve()
    candidate = policy_from_text(read_text(path), str(path))
    return path, check_policy(w.store, candidate, Window(since=_since(since)))


def _outcome(o: Outcome) -> str:
    quorum = f" (quorum {o.quorum})" if o.decision == "needs_approval" else ""
    return f"{o.decision}{quorum}\n{o.rule}"


def _show(report: CheckReport, show_all: bool, out: Console) -> None:
    calls = report.calls if show_all else report.changes()
    if calls:
        out.print(
            table(
                "calls" if show_all else "changed calls",
                ["event", "time (UTC)", "principal", "skill", "args", "before", "after", "change"],
                [
                    [
                        c.event_id,
                        c.ts[5:16].replace("T", " "),
                        c.principal,
                        c.skill,
                        c.args or "-",
                        _outcome(c.before),
                        _outcome(c.after),
                        c.change or "same",
                    ]
                    for c in calls
                ],
            )
        )
    t = report.totals
    window = f"since {report.since:%Y-%m-%d %H:%M} UTC" if report.since else "all recorded"
    out.print(
        styled(
            "[bold]{}[/] ({}, audit events up to {}); {} unchanged",
            report.summary(),
            window,
            report.through_event,
            t.unchanged,
        )
    )
    if t.unreadable:
        out.print(styled("[yellow]{} verdict events could not be read back[/]", t.unreadable))


def _as_json(report: CheckReport, show_all: bool) -> dict[str, Any]:
    data = report.model_dump(mode="json")
    if not show_all:
        data["calls"] = [c.model_dump(mode="json") for c in report.changes()]
    data["summary"] = report.summary()
    return data


def check(
    policy_file: Path = FileArg,
    since: str | None = SinceOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
    show_all: bool = typer.Option(False, "--all", help="List the unchanged calls too"),
    config: str | None = ConfigOpt,
) -> None:
    """Replay the calls recorded in the audit through a new policy and show, call by call, what
    would change (allow -> needs_approval, deny -> allow, a different quorum). Writes nothing."""
    from nightshift.agent.brain.wiring import Wiring

    _, report = _checked(Wiring.load(config), policy_file, since)
    if as_json:
        print(json.dumps(_as_json(report, show_all), indent=2, ensure_ascii=False))
        return
    _show(report, show_all, console)


def apply(
    policy_file: Path = FileArg,
    since: str | None = SinceOpt,
    wait: bool = typer.Option(
        False, "--wait", help="Without a terminal, wait for the approval (else exit 4 at once)"
    ),
    yes: bool = typer.Option(
        False, "--yes", help="Confirm your own call without asking, where the policy lets you"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    config: str | None = ConfigOpt,
) -> None:
    """Make a new policy the one in force, for the daemon too (at its next call): one gated
    call (apply_policy, a destroy: it needs approval under the shipped policy) whose arguments
    carry what it would change on the recorded calls, checked again when it runs."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.shell import call_as_user

    w = Wiring.load(config)
    path, report = _checked(w, policy_file, since)
    _show(report, False, err_console if as_json else console)
    args = {
        "policy_path": str(path),
        "since": report.since.isoformat() if report.since else None,
        "through_event": report.through_event,
        "summary": report.summary(),
    }
    result: Any = call_as_user(w, "apply_policy", args, wait=wait, yes=yes, as_json=as_json)
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    say(
        "[green]applied[/] {} (sha256 {}): the gate judges by it from the next call",
        path,
        result.sha256,
    )


def register(app: typer.Typer) -> None:
    group = typer.Typer(no_args_is_help=True, help="Try a policy on recorded calls; apply it.")
    group.command("check")(check)
    group.command("apply")(apply)
    app.add_typer(group, name="policy")
