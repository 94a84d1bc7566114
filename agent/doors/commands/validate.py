"""`nightshift validate FILE`: config_validator on any training config, through the policy gate.

FILE is a nightshift experiment spec or a config people write for other tools — Hugging Face
accelerate, DeepSpeed JSON, axolotl, LitGPT, detectron2 — detected from its keys. Prints the config
in one vocabulary, the memory estimate, then errors, warnings and suggestions. Exit 0 when valid
(warnings allowed), 2 when invalid.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from nightshift.agent.doors.console import console, say, styled, table
from nightshift.agent.doors.shell import call_or_exit
from nightshift.runtime.user_files import regular_file

if TYPE_CHECKING:
    from nightshift.runtime.training.training_configs import TrainingView
    from nightshift.skills.config_validator import ConfigValidatorResult

SKILL = "config_validator"
# runtime.training_configs.FORMATS, written out so that `--help` need not import the readers
# (a test keeps the two the same).
FORMAT_NAMES = "nightshift, accelerate, deepspeed, axolotl, litgpt, detectron2"


def _num(v: float | int | None) -> str | None:
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1:
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _params(view: TrainingView) -> str:
    if view.params is None:
        return "unknown"
    n = view.params
    size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
    return f"{size} ({view.params_source})"


def _lora(view: TrainingView) -> str | None:
    lora = view.lora
    if lora is None:
        return None
    parts = [
        f"r={lora.rank}",
        f"alpha={_num(lora.alpha)}",
        "on " + (", ".join(lora.targets) or "?"),
    ]
    if lora.modules_to_save:
        parts.append("full: " + ", ".join(lora.modules_to_save))
    if lora.trainable_params is not None:
        parts.append(f"{lora.trainable_params / 1e6:,.1f} M trained")
    return " ".join(parts)


def _onoff(v: bool | None) -> str | None:
    return None if v is None else ("on" if v else "off")


def _from(view: TrainingView, field: str) -> str:
    src = view.sources.get(field)
    if src is None:
        return ""
    where = src.key
    if src.file and src.file != view.path:
        where += f" ({Path(src.file).name}"
        where += f":{src.line})" if src.line else ")"
    elif src.line:
        where += f" (line {src.line})"
    if src.auto:
        where += ' = "auto"'
    elif src.default:
        where += " (default)"
    elif src.derived:
        where += " (derived)"
    return where


def _view_rows(view: TrainingView) -> list[list[Any]]:
    rows: list[tuple[str, str, Any]] = [
        ("model", "model", view.model),
        ("parameters", "params", _params(view)),
        (
            "hidden / layers / heads / vocab",
            "hidden",
            " / ".join(
                str(x) if x is not None else "?"
                for x in (view.hidden, view.layers, view.heads, view.vocab)
            )
            if view.hidden or view.layers
            else None,
        ),
        ("init", "init", f"{view.init} ({view.init_from})" if view.init_from else view.init),
        ("optimizer", "optimizer", view.optimizer),
        ("learning rate", "learning_rate", _num(view.learning_rate)),
        ("micro-batch", "micro_batch", _num(view.micro_batch)),
        ("gradient accumulation", "grad_accum", _num(view.grad_accum)),
        ("global batch", "global_batch", _num(view.global_batch)),
        ("devices", "devices", _num(view.devices)),
        ("epochs", "epochs", _num(view.epochs)),
        ("max steps", "max_steps", _num(view.max_steps)),
        ("sequence length", "seq_len", _num(view.seq_len)),
        ("precision", "precision", view.precision),
        ("quantization", "quantization", view.quantization),
        ("LoRA", "lora", _lora(view)),
        ("ZeRO stage", "zero_stage", _num(view.zero_stage)),
        (
            "offload optimizer / params",
            "offload_optimizer",
            None
            if view.offload_optimizer is None and view.offload_params is None
            else f"{_onoff(view.offload_optimizer) or '?'} / {_onoff(view.offload_params) or '?'}",
        ),
        (
            "activation checkpointing",
            "activation_checkpointing",
            _onoff(view.activation_checkpointing),
        ),
        ("seed", "seed", _num(view.seed)),
    ]
    out = []
    for label, field, value in rows:
        src = view.sources.get(field)
        if value is None and not (src is not None and src.auto):
            continue
        shown = "auto" if value is None else value
        out.append([label, shown, _from(view, field)])
    return out


def print_result(path: Path, r: ConfigValidatorResult) -> None:
    """The view, the estimate, then what is wrong and what to do."""
    view = r.view
    if view is not None:
        title = f"{path.name} · {view.source_format}"
        console.print(table(title, ["field", "value", "from"], _view_rows(view)))
        if view.auto_fields:
            say(
                '[dim]"auto" (filled at launch, unknown here):[/] {}',
                ", ".join(view.auto_fields),
                soft_wrap=True,
            )
        for note in view.notes:
            say("[dim]note:[/] {}", note, soft_wrap=True)
    est = r.estimate
    if est is not None:
        act = "?" if est.activations_gib is None else f"{est.activations_gib:g}"
        target = (
            f" of {est.target_gpu_memory_gib:g} GiB ({est.target_source})"
            if est.target_gpu_memory_gib is not None
            else " (no target GPU known: pass --gpu-memory)"
        )
        offload = f"; {est.host_offload_gib:g} GiB offloaded to CPU" if est.host_offload_gib else ""
        say(
            "[bold]memory per GPU[/] ≈ {} GiB{}: weights {} + gradients {} + optimizer {} "
            "+ activations {} GiB{}",
            f"{est.total_gib:g}",
            target,
            f"{est.weights_gib:g}",
            f"{est.gradients_gib:g}",
            f"{est.optimizer_gib:g}",
            act,
            offload,
            soft_wrap=True,
        )
        for a in est.assumptions:
            say("  [dim]{}[/]", a, soft_wrap=True)
    elif view is not None:
        console.print("[bold]memory per GPU[/]: unknown (parameter count unknown)")
    for f in r.errors:
        say("[bold red]error[/] {}{}", _where(f), f.message, soft_wrap=True)
    for f in r.warnings:
        say("[yellow]warning[/] {}{}", _where(f), f.message, soft_wrap=True)
    for s in r.suggestions:
        say("[cyan]suggestion[/] {}", s, soft_wrap=True)
    verdict = styled("[bold green]valid[/]") if r.valid else styled("[bold red]invalid[/]")
    say("{}: {} error(s), {} warning(s)", verdict, len(r.errors), len(r.warnings))


def _where(f: Any) -> str:
    where = f.field or ""
    if f.file:
        where += f" ({Path(f.file).name}" + (f":{f.line})" if f.line else ")")
    elif f.line:
        where += f" (line {f.line})"
    return f"{where}: " if where else ""


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(
        file: Path = typer.Argument(
            ...,
            help="Experiment spec, or an accelerate/DeepSpeed/axolotl/LitGPT/detectron2 config",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
        gpu_memory: float | None = typer.Option(
            None,
            "--gpu-memory",
            min=0.1,
            help="Target GPU memory in GiB (default: the smallest healthy GPU recorded)",
        ),
        fmt: str | None = typer.Option(
            None, "--format", help=f"Skip detection: one of {FORMAT_NAMES}"
        ),
        config: str | None = typer.Option(None, "--config", help="Config file"),
    ) -> None:
        """Check a training config before it runs: the numbers it implies, memory per GPU, and
        what to change."""
        # Refused before the skill opens it: a FIFO, a device, a folder, or a file over the limit
        # the YAML reader keeps (config_validator reads a JSON config whole).
        from nightshift.runtime.yamlfile import MAX_FILE_BYTES

        path = file.expanduser()
        regular_file(path, "FILE", MAX_FILE_BYTES, "a training config is a page of YAML or JSON")
        args: dict[str, Any] = {"path": str(path.resolve())}
        if gpu_memory is not None:
            args["gpu_memory_gib"] = gpu_memory
        if fmt is not None:
            args["format"] = fmt
        result = call_or_exit(config, SKILL, args)
        result = cast("ConfigValidatorResult", result)
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            print_result(path, result)
        raise typer.Exit(0 if result.valid else 2)
