"""`nightshift power show|set|restore`: each GPU's power limit with the power model's estimate at
it, and a recorded, reversible change of one GPU's limit — both through the policy gate
(show_power_limits, set_power_limit; the shipped policy asks a person to confirm a change)."""

from __future__ import annotations

from typing import Any

import typer

from nightshift.agent.doors.console import console, say, table
from nightshift.agent.doors.shell import call_or_exit

ConfigOpt = typer.Option(
    None, "--config", help="Config file (default $NIGHTSHIFT_HOME/config.yaml)"
)
JsonOpt = typer.Option(False, "--json", help="Print the result model as JSON")
YesOpt = typer.Option(
    False, "--yes", "-y", help="Confirm without asking (where the policy lets you)"
)
WaitOpt = typer.Option(False, "--wait", help="Wait for an approval others must give")


def _w(v: float | None) -> str:
    return "" if v is None else f"{v:g} W"


def show(
    gpu: list[int] = typer.Option([], "--gpu", help="Only this GPU index (repeatable)"),
    as_json: bool = JsonOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Each GPU's power limit (current, default, allowed range), the earlier limit nightshift
    recorded when it changed one (what `power restore` puts back) and the power model's estimate
    of training speed and board power at the current limit."""
    result: Any = call_or_exit(config, "show_power_limits", {"gpus": gpu}, as_json=as_json)
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    if result.error:
        say("[yellow]power limits unavailable here[/]: {}", result.error)
    rows = []
    for g in result.gpus:
        est = g.estimate
        estimate = (
            f"{est.throughput:.0%} speed, {est.busy_watts:.0f} W busy"
            + ("" if est.measured else " (borrowed curve)")
            if est is not None
            else (g.error or "no model for this GPU")
        )
        recorded = (
            f"{_w(g.recorded_previous_w)} (set by {g.set_by} at {g.set_at:%Y-%m-%d %H:%M}"
            + (f": {g.reason}" if g.reason else "")
            + ")"
            if g.recorded_previous_w is not None and g.set_at is not None
            else ""
        )
        allowed = f"{g.min_w:g}-{g.max_w:g} W" if g.min_w is not None and g.max_w else ""
        rows.append(
            [g.gpu, g.name or "", _w(g.current_w), _w(g.default_w), allowed, recorded, estimate]
        )
    console.print(
        table(
            "GPU power limits",
            ["gpu", "name", "limit", "default", "allowed", "restore puts back", "model at limit"],
            rows,
        )
    )


def set_limit(
    gpu: int = typer.Argument(..., help="GPU index, as nvidia-smi numbers it"),
    watts: float = typer.Argument(..., help="New power limit in watts"),
    reason: str = typer.Option("", "--reason", help="Why; recorded with the change"),
    yes: bool = YesOpt,
    wait: bool = WaitOpt,
    as_json: bool = JsonOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Set one GPU's power limit; the limit it had before is recorded (`power restore` puts it
    back). Needs root on the GPU's machine; the shipped policy asks you to confirm."""
    _check_range(config, gpu, watts)
    args = {"gpu": gpu, "watts": watts, "reason": reason}
    _report(
        call_or_exit(config, "set_power_limit", args, yes=yes, wait=wait, as_json=as_json), as_json
    )


def _check_range(config: str | None, gpu: int, watts: float) -> None:
    """Refuse a value outside the GPU's range before anyone is asked to confirm it (the skill
    checks again when it runs)."""
    from nightshift.runtime.gpu.power_limit import PowerLimits
    from nightshift.skills.set_power_limit import check_range

    shown: Any = call_or_exit(config, "show_power_limits", {"gpus": [gpu]})
    g = shown.gpus[0] if shown.gpus else None
    if g is None or None in (g.uuid, g.name, g.current_w, g.default_w, g.min_w, g.max_w):
        return  # unreadable here: the skill says why when it runs
    check_range(watts, PowerLimits.model_validate(g.model_dump() | {"index": gpu}))


def restore(
    gpu: int = typer.Argument(..., help="GPU index, as nvidia-smi numbers it"),
    reason: str = typer.Option("", "--reason", help="Why; recorded with the change"),
    yes: bool = YesOpt,
    wait: bool = WaitOpt,
    as_json: bool = JsonOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Put back the power limit GPU had before nightshift first changed it (as recorded)."""
    args = {"gpu": gpu, "restore": True, "reason": reason}
    _report(
        call_or_exit(config, "set_power_limit", args, yes=yes, wait=wait, as_json=as_json), as_json
    )


def _report(result: Any, as_json: bool) -> None:
    r = result  # a SetPowerLimitResult
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    what = "restored" if r.restored else "set"
    say(
        "GPU {} ({}): power limit {} {} → [bold]{}[/]{}",
        r.gpu,
        r.name,
        what,
        _w(r.before_w),
        _w(r.after_w),
        ""
        if r.recorded_previous_w is None
        else f"; `nightshift power restore {r.gpu}` puts back {_w(r.recorded_previous_w)}",
    )


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        no_args_is_help=True,
        help="GPU power limits: show them with the power model's estimate; set or restore one.",
    )
    group.command("show")(show)
    group.command("set")(set_limit)
    group.command("restore")(restore)
    app.add_typer(group, name="power")
