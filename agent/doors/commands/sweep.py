"""`nightshift sweep SPEC.yaml`: start an Optuna search over the spec's `search` space.

The command validates the spec, creates the study and records the sweep, then returns; the
daemon's loop asks for the trials, runs each as a job and tells the study how it ended
(runtime/scheduling/sweeps.py). `nightshift report --sweep NAME` shows where it stands.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import say
from nightshift.runtime.errors import BadArguments
from nightshift.runtime.user_files import regular_file


def sweep(
    spec: Path = typer.Argument(..., help="Experiment spec (YAML) with a search: section"),
    trials: int | None = typer.Option(None, "--trials", help="Trials at most"),
    gpu_hours: float | None = typer.Option(None, "--gpu-hours", help="GPU-hours at most"),
    until: str | None = typer.Option(None, "--until", help="No new trial after HH:MM (local)"),
    deadline: str | None = typer.Option(
        None, "--deadline", help="No new trial after this ISO date-time (naive: local)"
    ),
    parallel: int | None = typer.Option(None, "--parallel", help="Trials at once at most"),
    seed: int | None = typer.Option(None, "--seed", help="Seeds the sampler"),
    name: str | None = typer.Option(None, "--name", help="Sweep name (default: spec name + time)"),
    lr_range_test: Path | None = typer.Option(
        None,
        "--lr-range-test",
        help="Metrics JSONL of an LR range test: tune_lr's suggestion seeds the lr prior",
    ),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Start a sweep (Optuna: TPE after a random start, median pruning) and return at once."""
    from nightshift.agent.doors.commands.queue import checked_spec

    if lr_range_test is not None:  # refused before anything is called or queued
        regular_file(lr_range_test, "--lr-range-test")
    client, parsed = checked_spec(spec, config)
    args: dict[str, Any] = {
        k: v
        for k, v in {
            "spec_path": str(spec.resolve()),
            "name": name,
            "trials": trials,
            "gpu_hours": gpu_hours,
            "until": until,
            "deadline": deadline,
            "max_parallel": parallel,
            "seed": seed,
        }.items()
        if v is not None
    }
    if lr_range_test is not None:
        args["lr_prior"] = _suggested_lr(client, parsed, lr_range_test)
    r: Any = client.call("start_sweep", args)
    if as_json:
        print(json.dumps({"sweep": r.name, "budget": r.budget}))
        return
    b = r.budget
    bounds = [
        f"{b['trials']} trials" if b.get("trials") else None,
        f"{b['gpu_hours']:g} GPU-hours" if b.get("gpu_hours") else None,
        f"until {datetime.fromisoformat(b['deadline']):%Y-%m-%d %H:%M} UTC"
        if b.get("deadline")
        else None,
    ]
    say(
        "sweep [bold]{}[/]: {}{}, pruner {}, {}, at most {} at once, seed {}, {}imising {}.\n"
        "The daemon runs its trials (`nightshift daemon`); "
        "`nightshift report --sweep {}` shows the best so far.",
        r.name,
        r.sampler,
        f" after {r.startup_trials} random trials" if r.sampler == "tpe" else "",
        r.pruner,
        " · ".join(x for x in bounds if x),
        b["max_parallel"],
        b["seed"],
        r.mode,
        r.metric,
        r.name,
    )


def _suggested_lr(client: Any, spec: Any, metrics: Path) -> float:
    """tune_lr's range test on a metrics file (through the gate, as `nightshift tune-lr --mode
    range_test`): the learning rate that seeds the sweep's prior."""
    from nightshift.skills.tune_lr import read_metrics_jsonl

    # A FIFO or a device is refused before it is opened; the file is read within a limit.
    points, _ = read_metrics_jsonl(metrics, spec.metrics.name, "--lr-range-test")
    r: Any = client.call("tune_lr", {"mode": "range_test", "points": points})
    if r.suggested_lr is None:
        raise BadArguments(
            f"--lr-range-test {metrics}: tune_lr found no suggestion in it ("
            + "; ".join(r.reasoning[:2])
            + ")"
        )
    say("lr prior from the range test: suggested lr {}", f"{r.suggested_lr:.4g}")
    return float(r.suggested_lr)


def sweep_stop(
    name: str = typer.Argument(..., help="The sweep"),
    reason: str = typer.Option("", "--reason", help="Why; recorded on the sweep"),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """No new trials for a sweep; those queued or running finish, then it ends with its best."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client
    from nightshift.agent.doors.remote import remote_of

    w = Wiring.load(config)
    client: Any = remote_of(w) or Client(w)
    r: Any = client.call("stop_sweep", {"name": name, "reason": reason})
    if as_json:
        print(json.dumps({"sweep": r.name, "before": r.before, "after": r.after}))
        return
    if r.before != "running":
        say("sweep {} had already ended ({})", r.name, r.before)
        return
    say(
        "sweep {}: no new trials; {} queued or running will finish, then "
        "`nightshift report --sweep {}` shows the best",
        r.name,
        r.trials_left,
        r.name,
    )


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command("sweep-stop")(sweep_stop)
