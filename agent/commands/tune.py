"""`nightshift tune-lr METRICS.jsonl`: run tune_lr on a metrics file, through the policy gate.

The file is the JSONL a run appends (one object per step with `step`, the loss and `lr`, as
examples/train_numpy.py writes it); it is parsed as data into the skill's points. The proposal is
printed, never applied.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from nightshift.agent.commands.diagnose import readable_file, say
from nightshift.agent.console import error
from nightshift.agent.shell import call_or_exit, parse_key_values

MODES = ("auto", "divergence", "plateau", "range_test")


def _num(v: float | None) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.4g}"


def print_proposal(r: Any, skipped: int) -> None:
    """The decision first, then the values, the reasoning and the points it rests on."""
    say(
        f"[bold]{r.decision}[/]  (analysis: {r.analysis}, {r.points_used} points"
        + (f", {skipped} unusable line(s) skipped" if skipped else "")
        + ")"
    )
    if r.new_lr is not None:
        now = "" if r.current_lr is None else f"{_num(r.current_lr)} → "
        say(f"learning rate: {now}[bold]{_num(r.new_lr)}[/]")
    if r.divergence_step is not None:
        resume = (
            "start again from the beginning"
            if r.resume_from_step is None
            else f"resume from the checkpoint of step {r.resume_from_step}"
        )
        say(
            f"divergence: began at step {r.divergence_step}, detected at step "
            f"{r.detected_at_step}; {resume}"
        )
    if r.suggested_lr is not None:
        say(
            f"range test: suggested lr {_num(r.suggested_lr)} (steepest descent at "
            f"{_num(r.steepest_lr)}, minimum at {_num(r.lr_at_min_loss)})"
        )
    say("reasoning:")
    for line in r.reasoning:
        say(f"  - {escape(line)}")
    if r.evidence:
        say("evidence:")
        for e in r.evidence:
            say(
                f"  step {e.step}: loss {_num(e.loss)}, smoothed {_num(e.smoothed)}, "
                f"lr {_num(e.lr)} — {escape(e.note)}"
            )
    if r.changes:
        changes = ", ".join(f"{k} = {v:g}" for k, v in r.changes.items())
        say(f"changes: {escape(changes)}  (apply with resume_job: param_changes)")


def register(app: typer.Typer) -> None:
    @app.command("tune-lr")
    def tune_lr_cmd(
        metrics: Path = typer.Argument(..., help="A metrics JSONL file (step, loss, lr per line)"),
        mode: str = typer.Option("auto", "--mode", help="auto | divergence | plateau | range_test"),
        lr: float | None = typer.Option(
            None, "--lr", help="The current learning rate (default: the last lr in the file)"
        ),
        knob: str | None = typer.Option(
            None, "--knob", help="The spec's learning-rate parameter, to name the proposed change"
        ),
        checkpoint: list[int] = typer.Option(
            [], "--checkpoint", help="A step that has a checkpoint (repeat the option)"
        ),
        loss_name: str = typer.Option("loss", "--metric", help="The loss's key in the file"),
        arg: list[str] = typer.Option(
            [],
            "--arg",
            help="Another tune_lr parameter as "
            "key=value (e.g. window=50, plateau_action=warm_restart)",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
        config: str | None = typer.Option(None, "--config", help="Config file"),
    ) -> None:
        """Propose a learning-rate change from a run's metrics file: divergence, plateau, range test."""
        if mode not in MODES:
            error(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
            raise typer.Exit(2)
        from nightshift.skills.tune_lr import read_metrics_jsonl

        path = readable_file(metrics)
        try:
            points, skipped = read_metrics_jsonl(path, loss_name)
        except OSError as exc:
            error(f"{path}: cannot be read ({exc.strerror or exc})")
            raise typer.Exit(2) from None
        args = parse_key_values(arg)
        args.update(
            {
                "mode": mode,
                "points": points,
                "current_lr": lr,
                "knob": knob,
                "checkpoint_steps": sorted(set(checkpoint)) or None,
            }
        )
        result = call_or_exit(config, "tune_lr", args)
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            print_proposal(result, skipped)
