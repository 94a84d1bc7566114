"""`nightshift tune-lr METRICS.jsonl`: run tune_lr on a metrics file, through the policy gate.

The file is the JSONL a run appends (one object per step with `step`, the loss and `lr`, as
examples/train_numpy.py writes it); it is parsed as data into the skill's points. The proposal is
printed, never applied.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import say
from nightshift.agent.doors.shell import call_or_exit, parse_key_values
from nightshift.runtime.errors import BadArguments

MODES = ("auto", "divergence", "plateau", "range_test")


def _num(v: float | None) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.4g}"


def print_proposal(r: Any, skipped: int) -> None:
    """The decision first, then the values, the reasoning and the points it rests on (each line
    whole: soft wrap)."""
    line = partial(say, soft_wrap=True)
    line(
        "[bold]{}[/]  (analysis: {}, {} points{})",
        r.decision,
        r.analysis,
        r.points_used,
        f", {skipped} unusable line(s) skipped" if skipped else "",
    )
    if r.new_lr is not None:
        now = "" if r.current_lr is None else f"{_num(r.current_lr)} → "
        line("learning rate: {}[bold]{}[/]", now, _num(r.new_lr))
    if r.divergence_step is not None:
        resume = (
            "start again from the beginning"
            if r.resume_from_step is None
            else f"resume from the checkpoint of step {r.resume_from_step}"
        )
        line(
            "divergence: began at step {}, detected at step {}; {}",
            r.divergence_step,
            r.detected_at_step,
            resume,
        )
    if r.suggested_lr is not None:
        line(
            "range test: suggested lr {} (steepest descent at {}, minimum at {})",
            _num(r.suggested_lr),
            _num(r.steepest_lr),
            _num(r.lr_at_min_loss),
        )
    line("reasoning:")
    for reason in r.reasoning:
        line("  - {}", reason)
    if r.evidence:
        line("evidence:")
        for e in r.evidence:
            line(
                "  step {}: loss {}, smoothed {}, lr {} — {}",
                e.step,
                _num(e.loss),
                _num(e.smoothed),
                _num(e.lr),
                e.note,
            )
    if r.changes:
        changes = ", ".join(f"{k} = {v:g}" for k, v in r.changes.items())
        line("changes: {}  (apply with resume_job: param_changes)", changes)


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
            raise BadArguments(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
        from nightshift.skills.tune_lr import read_metrics_jsonl

        # A FIFO or a device is refused before it is opened; the file is read within a limit.
        points, skipped = read_metrics_jsonl(metrics, loss_name, "METRICS")
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
