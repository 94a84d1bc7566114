"""`nightshift sweep SPEC.yaml`: start an Optuna search over the spec's `search` space.

The command validates the spec, creates the study and records the sweep, then returns; the
daemon's loop asks for the trials, runs each as a job and tells the study how it ended
(runtime/sweeps.py). `nightshift report --sweep NAME` shows where it stands.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from nightshift.agent.console import console, error
from nightshift.runtime.errors import BadArguments


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
    from nightshift.agent.api import Client
    from nightshift.agent.wiring import Wiring, local_now
    from nightshift.runtime.spec import SweepSpec, load_spec
    from nightshift.runtime.sweeps import create_sweep, local_zone

    w = Wiring.load(config)
    if w.remote is not None:
        from nightshift.agent.remote import not_served

        raise not_served(w.remote)
    parsed = load_spec(spec)
    check: Any = Client(w).call("config_validator", {"path": str(spec.resolve())})
    if not check.valid:
        for e in check.errors:
            error(f"{spec}: field '{e.field}': {e.message}")
        raise typer.Exit(2)
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "trials": trials,
            "gpu_hours": gpu_hours,
            "until": until,
            "deadline": deadline,
            "max_parallel": parallel,
            "seed": seed,
        }.items()
        if v is not None
    }
    base = (parsed.sweep or SweepSpec()).model_dump()
    try:
        effective = SweepSpec.model_validate({**base, **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        flag = {"max_parallel": "parallel", "gpu_hours": "gpu-hours"}.get(field, field)
        raise BadArguments(f"--{flag}: {err['msg']}") from None
    parsed = parsed.model_copy(update={"sweep": effective})
    if lr_range_test is not None:
        parsed = _seed_lr(w, parsed, lr_range_test)
    now = local_now()
    sweep_name = name or f"{parsed.name}-{now:%Y%m%d-%H%M%S}"
    row = create_sweep(
        w.store,
        parsed,
        spec_path=str(spec.resolve()),
        owner=w.user,
        name=sweep_name,
        now=now,
        tz=local_zone(w.settings.scheduler.display_tz),
    )
    w.audit.append(
        w.user,
        "sweep.start",
        payload={"sweep": row.name, "spec_path": row.spec_path, "budget": row.budget},
    )
    if as_json:
        print(json.dumps({"sweep": row.name, "budget": row.budget}))
        return
    b = row.budget
    bounds = [
        f"{b['trials']} trials" if b.get("trials") else None,
        f"{b['gpu_hours']:g} GPU-hours" if b.get("gpu_hours") else None,
        f"until {datetime.fromisoformat(b['deadline']):%Y-%m-%d %H:%M} UTC"
        if b.get("deadline")
        else None,
    ]
    console.print(
        f"sweep [bold]{row.name}[/]: {effective.sampler}"
        + (f" after {effective.startup_trials} random trials" if effective.sampler == "tpe" else "")
        + f", pruner {effective.pruner}, {' · '.join(x for x in bounds if x)}, at most "
        f"{b['max_parallel']} at once, seed {b['seed']}.\n"
        "The daemon runs its trials (`nightshift daemon`); "
        f"`nightshift report --sweep {row.name}` shows the best so far."
    )


def _seed_lr(w: Any, spec: Any, metrics: Path) -> Any:
    """tune_lr's range test (through the gate, as `nightshift tune-lr --mode range_test`) turned
    into the sweep's learning-rate prior."""
    from nightshift.agent.api import Client
    from nightshift.agent.commands.diagnose import readable_file
    from nightshift.runtime.sweeps import seed_lr_prior
    from nightshift.skills.tune_lr import read_metrics_jsonl

    try:
        points, _ = read_metrics_jsonl(readable_file(metrics), spec.metrics.name)
    except OSError as exc:
        raise BadArguments(f"--lr-range-test {metrics}: {exc.strerror or exc}") from None
    r: Any = Client(w).call("tune_lr", {"mode": "range_test", "points": points})
    if r.suggested_lr is None:
        raise BadArguments(
            f"--lr-range-test {metrics}: tune_lr found no suggestion in it ("
            + "; ".join(r.reasoning[:2])
            + ")"
        )
    console.print(f"lr prior from the range test: suggested lr {r.suggested_lr:.4g}")
    return seed_lr_prior(spec, r.suggested_lr)


def register(app: typer.Typer) -> None:
    app.command()(sweep)
