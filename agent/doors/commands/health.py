"""`nightshift health`: gpu_health_check through the policy gate, printed as a table, with a
monitoring-style exit code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.text import Text

from nightshift.agent.doors.console import console, error, say, styled, table
from nightshift.agent.doors.shell import call_as_user
from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.user_files import regular_file

if TYPE_CHECKING:
    from nightshift.runtime.gpu.gpu import GpuReading
    from nightshift.skills.gpu_health import GpuVerdict, HealthCheckResult

# The Nagios plugin convention, which monitoring systems read: 0 OK, 1 WARNING, 2 CRITICAL,
# 3 UNKNOWN. A machine without GPUs is fine (0); a check that could not run at all is UNKNOWN.
EXIT_CODES: dict[str, int] = {"OK": 0, "NO_GPUS": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}
EXIT_CHECK_FAILED = 3

COLOURS = {
    "OK": "green",
    "NO_GPUS": "green",
    "WARNING": "yellow",
    "CRITICAL": "red",
    "UNKNOWN": "magenta",
}

HELP = (
    "Check this machine's GPUs, or a saved nvidia-smi output or kernel log, and give each a "
    "verdict.\n\n"
    "--from FILE reads `nvidia-smi -q`, the default `nvidia-smi` table, or `nvidia-smi "
    "--query-gpu=... --format=csv` (with its header line), such as a colleague's paste from a "
    "ticket, and judges it with the same rules. nvidia-smi's own error messages ('Unable to "
    "determine the device handle for GPU ...: GPU is lost', 'No devices were found', 'Failed to "
    "initialize NVML: ...') are verdicts too, and a kernel log (`journalctl -k`, `dmesg`) is "
    "read for `NVRM: Xid` lines, judged by NVIDIA's XID catalogue per GPU (PCI bus id). A paste "
    "is not recorded, since it may be another machine's, unless --record is given; a check of "
    "this machine is recorded unless --no-record is given. A quarantined GPU returns to "
    "placement after health.recover_after_checks healthy checks in a row.\n\n"
    "Exit code, as monitoring plugins use it: 0 OK (or no GPUs), 1 WARNING, 2 CRITICAL, "
    "3 UNKNOWN (a GPU could not be judged, or the check itself could not run: an unreadable "
    "file, a refused call)."
)


def health(
    as_json: bool = typer.Option(False, "--json", help="Print the result model as JSON"),
    from_file: Path | None = typer.Option(
        None,
        "--from",
        metavar="FILE",
        help="Judge a saved nvidia-smi output instead of this machine",
    ),
    record: bool | None = typer.Option(
        None,
        "--record/--no-record",
        help="Record the verdicts for placement (default: yes here, no for --from)",
    ),
    gpu: list[int] = typer.Option([], "--gpu", help="Check only this GPU index (repeatable)"),
    config: str | None = typer.Option(
        None, "--config", help="Config file (default $NIGHTSHIFT_HOME/config.yaml)"
    ),
) -> None:
    try:
        result = _check(from_file, record, gpu, config)
    except NightshiftError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_CHECK_FAILED) from exc
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        _show(result)
    raise typer.Exit(EXIT_CODES[result.overall])


def _check(
    from_file: Path | None, record: bool | None, gpus: list[int], config: str | None
) -> HealthCheckResult:
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.skills.registry import get_skill

    w = Wiring.load(config)
    skill = get_skill("gpu_health_check")
    args: dict[str, Any] = {}
    if from_file is not None:  # a FIFO or a device is refused before the skill opens it
        args["from_file"] = str(regular_file(from_file, "--from"))
    if record is not None:
        args["record"] = record
    if gpus:
        args["gpus"] = gpus
    return cast("HealthCheckResult", call_as_user(w, skill.name, args))


def _coloured(verdict: str) -> Text:
    return Text(verdict, style=f"bold {COLOURS.get(verdict, 'white')}")


def _value(r: GpuReading | None, name: str, unit: str = "") -> str:
    """The value with its unit, or why there is none: 'n/a' (the card lacks it), 'ERR' (the read
    failed), blank (not reported)."""
    if r is None:
        return ""
    value = getattr(r, name)
    if value is not None:
        return f"{value:g}{unit}"
    return {"unsupported": "n/a", "unreadable": "ERR"}.get(r.status(name), "")


def _pair(r: GpuReading | None, a: str, b: str, unit: str) -> str:
    left, right = _value(r, a), _value(r, b)
    return f"{left or '?'} / {right or '?'} {unit}" if left or right else ""


def _row(v: GpuVerdict) -> list[Any]:
    r = v.reading
    reasons = Text("; ").join(Text(x.message, style=COLOURS[x.severity]) for x in v.reasons)
    actions = list(dict.fromkeys(x.action for x in v.reasons if x.action))
    for action in actions:
        reasons.append_text(styled("\n[dim]do: {}[/]", action))
    if v.not_supported:
        if reasons:
            reasons.append("\n")
        reasons.append_text(styled("[dim]not supported: {}[/]", ", ".join(v.not_supported)))
    return [
        (str(v.index) if v.index is not None else v.pci_bus_id or "?")
        if v.host is None
        else f"{v.host} {v.index}",
        v.name or v.uuid or "",
        _coloured(v.verdict),
        _value(r, "temperature_c", " °C"),
        _pair(r, "memory_used_mib", "memory_total_mib", "MiB"),
        _value(r, "utilization_pct", " %"),
        _pair(r, "power_w", "power_limit_w", "W"),
        reasons or "—",
    ]


def _show(result: HealthCheckResult) -> None:
    if result.gpus:
        console.print(
            table(
                f"GPU health via {result.backend}",
                [
                    "GPU",
                    "name",
                    "verdict",
                    "temp",
                    "memory used/total",
                    "util",
                    "power/limit",
                    "reasons",
                ],
                [_row(v) for v in result.gpus],
            )
        )
    lines = result.message.splitlines()
    head = lines[0] if lines else ""
    say("overall: {} — {}", _coloured(result.overall), head)
    # The per-GPU summaries are in the table; the rest of the message is context worth a line.
    summaries = {v.summary for v in result.gpus}
    for line in lines[1:]:
        if line not in summaries:
            say("[dim]{}[/]", line)
    say("[dim]recorded {} sample(s)[/]", result.recorded)


def register(app: typer.Typer) -> None:
    app.command("health", help=HELP)(health)
