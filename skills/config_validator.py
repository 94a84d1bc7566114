"""config_validator: a training config checked before it runs: schema, then engineering sense.

The input is nightshift's experiment spec (a mapping or a file) or any training config people
actually write — Hugging Face accelerate, DeepSpeed JSON, axolotl, LitGPT, detectron2 — detected
from its keys and read into a `TrainingView` (nightshift.runtime.training.training_configs). The engineering
checks run on that view: learning rate against the usual range for the optimiser and for fine-tuning
versus training from scratch; memory per GPU against the target GPU, with LoRA, ZeRO sharding and
offload and activation checkpointing counted, and changes that make it fit; a seed; placeholders
nothing fills; paths outside the allowed mounts. An experiment spec keeps its own checks (working
directory and scripts, command placeholders, floating image tags, retries without checkpoints).

Errors make the config invalid; warnings and suggestions are advice. Limits from the policy (allowed
mount roots) are read to advise, never to block: the policy layer enforces them at launch.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator
from sqlmodel import col, select

from nightshift.runtime.errors import SpecError
from nightshift.runtime.gpu.gpu import health_sources
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store.db import GpuSample
from nightshift.runtime.training.training_configs import (
    LEARNING_RATE,
    OPTIMIZER,
    Format,
    LoraView,
    TrainingView,
    as_number,
    detect_format,
    load_training_view,
    lora_trainable_params,
    read_config,
    view_from_spec,
)
from nightshift.runtime.yamlfile import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    check_bounds,
    line_of,
    validate,
)
from nightshift.skills.base import SkillContext, skill

# Usual learning-rate ranges per optimiser family (inclusive); outside is unusual, not wrong.
LR_RANGES: dict[str, tuple[float, float]] = {
    "adam": (1e-5, 1e-2),
    "sgd": (1e-4, 1.0),
    "lion": (1e-6, 1e-3),
    "rmsprop": (1e-5, 1e-2),
    "adagrad": (1e-4, 1e-1),
}
# Narrower ranges when a config says what kind of training it is. Full fine-tuning of pretrained
# weights uses small rates (LLM SFT 1e-5..2e-5, BERT 2e-5..5e-5); LoRA adapters start from zero
# and take larger ones (1e-4..3e-4 typical); Lion wants 3-10× less than AdamW.
LR_RANGES_BY_MODE: dict[str, dict[str, tuple[float, float]]] = {
    "lora": {"adam": (1e-5, 1e-3), "sgd": (1e-4, 1e-1), "lion": (1e-6, 3e-4)},
    "finetune": {"adam": (1e-7, 2e-4), "sgd": (1e-5, 1e-1), "lion": (1e-8, 5e-5)},
    "scratch": {"adam": (1e-5, 1e-2), "sgd": (1e-3, 1.0), "lion": (1e-6, 1e-3)},
}
MODE_TEXT = {
    "lora": "a LoRA fine-tune",
    "finetune": "a full fine-tune of pretrained weights",
    "scratch": "training from scratch",
}
# Optimiser states per parameter (Adam: first and second moment).
OPTIMIZER_STATES: dict[str, int] = {"adam": 2, "lion": 1, "sgd": 1, "rmsprop": 1, "adagrad": 1}

# Floating tags move under the same name: two runs of one spec may not run the same image.
FLOATING_TAGS = {"latest", "nightly", "main", "master", "dev", "edge", "stable", "head"}

SCRIPT_SUFFIXES = (".py", ".sh", ".bash")
PATH_SUFFIXES = ("_dir", "_path", "_file", "_root")
# Formats whose config has a seed (others leave it to the training script).
SEEDED_FORMATS = {"axolotl": "seed", "litgpt": "seed", "detectron2": "SEED"}
# Where each format turns on activation checkpointing.
CHECKPOINTING_HINT = {
    "axolotl": "`gradient_checkpointing: true`",
    "accelerate": "`fsdp_config.fsdp_activation_checkpointing: true` (FSDP) or "
    "`model.gradient_checkpointing_enable()` in the script",
    "deepspeed": "`model.gradient_checkpointing_enable()` in the training script",
    "litgpt": "`activation_checkpointing_policy` of the FSDP strategy in the LitGPT script",
    "nightshift": "a `gradient_checkpointing: true` parameter passed to the script",
}
LORA_SUGGESTION_RANK = 16

GIB = float(1 << 30)
SCHEMA_FIRST = "fix the schema errors first; the engineering checks run on a spec that parses"
NOT_A_FORMAT = (
    "this file is not a recognised training config (accelerate, DeepSpeed, axolotl, LitGPT, "
    "detectron2) either; it was checked as a nightshift experiment spec"
)


class ConfigValidatorInput(BaseModel):
    """A spec as a mapping, or a path to a spec or a training config, and the target GPU memory."""

    spec: dict[str, Any] | None = Field(None, description="The experiment spec as a mapping")
    path: str | None = Field(
        None,
        description="A YAML or JSON file: an experiment spec, or an accelerate, DeepSpeed, "
        "axolotl, LitGPT or detectron2 training config (detected from its keys)",
    )
    format: Format | None = Field(None, description="The file's format, when detection is wrong")
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of the target GPU; default: the smallest healthy GPU recorded",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ConfigValidatorInput:
        if (self.spec is None) == (self.path is None):
            raise ValueError("give exactly one of `spec` (a mapping) or `path` (a spec file)")
        if self.format is not None and self.path is None:
            raise ValueError("`format` applies to `path` only")
        return self


class Finding(BaseModel):
    """One problem, named by its field path (and line, for a file)."""

    field: str | None = None
    message: str
    line: int | None = None
    file: str | None = Field(None, description="Set when the line is in another file (a base)")


class MemoryEstimate(BaseModel):
    """Training memory per GPU: weights + gradients + optimiser states + activations."""

    params_millions: float
    trainable_params_millions: float = Field(description="All of them, or the LoRA adapters")
    precision: str
    optimizer: str
    bytes_per_param: float = Field(
        description="Per trained parameter, before sharding: weights, gradients, optimiser "
        "states and master copy"
    )
    frozen_bytes_per_param: float | None = Field(
        None, description="Per frozen base parameter (LoRA): its precision or quantisation"
    )
    weights_gib: float = Field(description="Weights (and fp32 master copy) on each GPU")
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float | None = Field(
        None, description="None when batch/seq/hidden/layers are unknown; includes logits"
    )
    logits_gib: float | None = Field(None, description="Output logits in fp32 (vocab known)")
    total_gib: float
    host_offload_gib: float = Field(0.0, description="Moved to CPU memory by offload, per GPU")
    micro_batch: int | None = None
    devices: int | None = None
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    activation_checkpointing: bool = False
    target_gpu_memory_gib: float | None = None
    target_source: str | None = Field(None, description="Where the target memory came from")
    assumptions: list[str] = Field(default_factory=list)


class MemoryOption(BaseModel):
    """One change that lowers memory per GPU, and the estimate after it."""

    change: str = Field(
        description="micro_batch, activation_checkpointing, zero_stage, offload_optimizer, "
        "offload_params, lora or combined"
    )
    settings: dict[str, Any] = Field(description="The view fields it sets")
    total_gib: float
    fits: bool | None = Field(None, description="Against the target GPU; None without one")
    global_batch: int | None = Field(None, description="Samples per step after the change")
    text: str


class ConfigValidatorResult(BaseModel):
    """Valid when there are no errors; warnings and suggestions are advice."""

    valid: bool
    errors: list[Finding] = Field(default_factory=list)
    warnings: list[Finding] = Field(default_factory=list)
    suggestions: list[str] = Field(default_factory=list)
    estimate: MemoryEstimate | None = None
    options: list[MemoryOption] = Field(
        default_factory=list, description="Memory-saving changes, each with its estimate"
    )
    view: TrainingView | None = Field(None, description="The config in a common vocabulary")


# ----------------------------------------------------------------------------------- loading
def _validate_spec(
    data: Any, node: Any, path: str | None
) -> tuple[ExperimentSpec | None, list[Finding]]:
    """Validate the schema; every error with its field path, and its line when read from a file."""
    if not isinstance(data, dict):
        return None, [Finding(message=f"{path}: expected a mapping at the top level", line=1)]
    try:
        spec = validate(ExperimentSpec, data, path=path, node=node)
    except SpecError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ValidationError):
            return None, [Finding(field=exc.field, message=str(exc), line=exc.line)]
        findings = []
        for err in cause.errors():
            loc = tuple(
                p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))
            )
            findings.append(
                Finding(
                    field=".".join(str(p) for p in loc) or None,
                    message=err["msg"],
                    line=line_of(node, loc) if node is not None else None,
                )
            )
        return None, findings
    if path is not None:
        spec.base_dir = os.path.dirname(os.path.abspath(path))
    return spec, []


# ------------------------------------------------------------------------------------ helpers
def _param(
    spec: ExperimentSpec, names: tuple[str, ...], knob: str | None = None
) -> tuple[str, Any] | None:
    """The parameter a knob names, else the first parameter with one of the usual names."""
    if knob is not None and knob in spec.parameters:
        return knob, spec.parameters[knob]
    for name in names:
        if name in spec.parameters:
            return name, spec.parameters[name]
    return None


def _optimizer_family(name: str) -> str | None:
    low = name.lower()
    for family in ("adam", "lion", "sgd", "rmsprop", "adagrad"):
        if family in low:
            return family
    return None


def _gib(b: float) -> float:
    return round(b / GIB, 2)


def _where(view: TrainingView, field: str) -> tuple[str | None, int | None, str | None]:
    """(key path, line, other file) of a view field, for a Finding."""
    src = view.sources.get(field)
    if src is None:
        return None, None, None
    other = src.file if src.file and src.file != view.path else None
    return src.key, src.line, other


def _finding(
    view: TrainingView, field: str, message: str, default_key: str | None = None
) -> Finding:
    key, line, other = _where(view, field)
    return Finding(field=key or default_key, message=message, line=line, file=other)


# ------------------------------------------------------------------------------------- checks
def _check_placeholders(
    spec: ExperimentSpec, errors: list[Finding], suggestions: list[str]
) -> None:
    unfilled = spec.unfilled_placeholders() - set(spec.search_space or {})
    if unfilled:
        names = ", ".join("{" + n + "}" for n in sorted(unfilled))
        errors.append(
            Finding(field="command", message=f"placeholders {names} are filled by no parameter")
        )
        for n in sorted(unfilled):
            suggestions.append(
                f"add `{n}` to parameters (or search_space), or remove {{{n}}} from command"
            )


def _check_code(spec: ExperimentSpec, errors: list[Finding]) -> None:
    """Local code only: the working directory and the scripts the command names must exist."""
    if spec.code.git or spec.environment.image:
        return  # the code comes from a repository or lives in the image
    known_base = spec.base_dir is not None or (
        spec.code.path is not None and os.path.isabs(os.path.expanduser(spec.code.path))
    )
    if not known_base:
        return  # a mapping with a relative code path: nothing to resolve it against
    run_dir = spec.run_dir()
    if not run_dir.is_dir():
        errors.append(
            Finding(field="code.path", message=f"working directory {run_dir} does not exist")
        )
        return
    skip_next = False
    for i, item in enumerate(spec.command):
        if skip_next or "{" in item or item.startswith("-"):
            skip_next = item in ("-m", "-c")
            continue
        if item.endswith(SCRIPT_SUFFIXES) and not (run_dir / os.path.expanduser(item)).exists():
            errors.append(
                Finding(
                    field=f"command.{i}",
                    message=f"script {item} not found in {run_dir}; check the name or code.path",
                )
            )


def _check_lr(spec: ExperimentSpec, warnings: list[Finding], suggestions: list[str]) -> None:
    found = _param(spec, LEARNING_RATE, spec.knobs.learning_rate)
    if found is None:
        return
    name, raw = found
    lr = as_number(raw)
    if lr is None:
        if not (isinstance(raw, str) and raw.strip().lower() == "auto"):
            warnings.append(
                Finding(
                    field=f"parameters.{name}", message=f"learning rate {raw!r} is not a number"
                )
            )
        return
    if lr <= 0:
        warnings.append(
            Finding(
                field=f"parameters.{name}",
                message=f"learning rate {lr:g} is not positive: the weights will not move",
            )
        )
        return
    opt = _param(spec, OPTIMIZER)
    family = _optimizer_family(str(opt[1])) if opt else None
    if opt is None or family is None or family not in LR_RANGES:
        return
    lo, hi = LR_RANGES[family]
    if not lo <= lr <= hi:
        side = "high" if lr > hi else "low"
        warnings.append(
            Finding(
                field=f"parameters.{name}",
                message=f"{name}={lr:g} is unusually {side} for {opt[1]} "
                f"(usual range {lo:g}..{hi:g})",
            )
        )
        suggestions.append(
            f"check {name}: {opt[1]} usually trains with {lo:g}..{hi:g}; "
            "tune_lr can propose one from an LR range test"
        )


def _check_image(spec: ExperimentSpec, warnings: list[Finding], suggestions: list[str]) -> None:
    image = spec.environment.image
    if not image:
        return
    if "@sha256:" in image or "@" in image.rsplit("/", 1)[-1]:
        return
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    if tag is None or tag.lower() in FLOATING_TAGS:
        what = "has no tag (means `latest`)" if tag is None else f"uses the floating tag `{tag}`"
        warnings.append(
            Finding(
                field="environment.image",
                message=f"image {image} {what}: a rerun may get a different image",
            )
        )
        suggestions.append(
            f"pin the image by a version tag or a digest (IMAGE@sha256:…); "
            f"`docker inspect --format '{{{{index .RepoDigests 0}}}}' {image}` prints the digest"
        )


def _check_seed(spec: ExperimentSpec, warnings: list[Finding], suggestions: list[str]) -> None:
    if spec.seed is not None or "seed" in spec.parameters or "seed" in (spec.search_space or {}):
        return
    warnings.append(
        Finding(field="seed", message="no seed: reruns and resumed attempts are not reproducible")
    )
    suggestions.append(
        "set `seed:` in the spec, or add a `seed` parameter and pass {seed} to the command"
    )


def _check_checkpoint(spec: ExperimentSpec, warnings: list[Finding]) -> None:
    if spec.checkpoint is None and spec.retries > 0:
        also = " and pausing has nothing to resume from" if spec.pausable else ""
        warnings.append(
            Finding(
                field="checkpoint",
                message=f"retries={spec.retries} but no checkpoint dir: "
                f"every retry starts again from step 0{also}",
            )
        )


def reports_steps(spec: ExperimentSpec) -> bool:
    """Whether the spec's metrics give the monitor steps to learn a run's pace from (the default
    stall rule, runtime/training/stall.py): log regexes, a framework's own metric files, or a
    JSONL file the command is told about ({metrics_file}) or that the spec names itself."""
    m = spec.metrics
    if m.regex or m.source in ("lightning_csv", "hf_trainer_state", "tensorboard"):
        return True
    if m.source == "log" or m.file is None:
        return False
    return "metrics_file" in spec.placeholders() or m.file != "metrics.jsonl"


def _check_stall(spec: ExperimentSpec, warnings: list[Finding], suggestions: list[str]) -> None:
    if spec.stall_min is not None or reports_steps(spec):
        return
    until = (
        f"until timeout_min={spec.timeout_min:g}"
        if spec.timeout_min
        else "until someone cancels it (no timeout_min either)"
    )
    warnings.append(
        Finding(
            field="stall_min",
            message="no stall_min and no metrics that report steps (no metrics.regex, and the "
            "command is not given {metrics_file}): the default stall rule has no pace to judge, "
            f"so a hang would hold its slot {until}",
        )
    )
    suggestions.append(
        "set `stall_min:` (minutes without new output or metrics), or report steps: pass "
        "{metrics_file} to the command and write JSONL lines with a step, or set metrics.regex"
    )


def _check_mounts(ctx: SkillContext, spec: ExperimentSpec, warnings: list[Finding]) -> None:
    roots = ctx.policy_limits.get("allowed_mount_roots")
    if not roots:
        return
    roots = [os.path.normpath(os.path.expanduser(str(r))) for r in roots]
    base = spec.base_dir
    candidates: list[tuple[str, str]] = []
    if spec.code.path:
        candidates.append(("code.path", spec.code.path))
    if spec.checkpoint is not None:
        candidates.append(("checkpoint.dir", spec.checkpoint.dir))
    for k, v in spec.parameters.items():
        if isinstance(v, str) and (k.endswith(PATH_SUFFIXES) or v.startswith(("/", "~"))):
            candidates.append((f"parameters.{k}", v))
    for field, value in candidates:
        p = os.path.expanduser(value)
        if not os.path.isabs(p):
            if base is None:
                continue  # relative to a run dir that is not known for a spec given as a mapping
            p = os.path.join(base, p)
        p = os.path.normpath(p)
        if not any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            warnings.append(
                Finding(
                    field=field,
                    message=f"{p} is outside the allowed mount roots "
                    f"({', '.join(roots)}); the policy will refuse to mount it",
                )
            )


# -------------------------------------------------------------------------------- view checks
def _lr_mode(view: TrainingView) -> str | None:
    if view.lora is not None:
        return "lora"
    return {"pretrained": "finetune", "scratch": "scratch"}.get(view.init or "")


def _check_view_lr(view: TrainingView, warnings: list[Finding], suggestions: list[str]) -> None:
    """The learning rate against the usual range for the optimiser and the kind of training."""
    lr = view.learning_rate
    if lr is None:
        return
    if lr <= 0:
        warnings.append(
            _finding(
                view,
                "learning_rate",
                f"learning rate {lr:g} is not positive: the weights will not move",
            )
        )
        return
    family = _optimizer_family(view.optimizer or "")
    if family is None:
        return
    mode = _lr_mode(view)
    lo, hi = LR_RANGES_BY_MODE.get(mode or "", {}).get(family) or LR_RANGES[family]
    if lo <= lr <= hi:
        return
    side = "high" if lr > hi else "low"
    what = f" in {MODE_TEXT[mode]}" if mode else ""
    key = _where(view, "learning_rate")[0] or "learning rate"
    warnings.append(
        _finding(
            view,
            "learning_rate",
            f"learning rate {lr:g} is unusually {side} for "
            f"{view.optimizer}{what} (usual range {lo:g}..{hi:g})",
        )
    )
    suggestions.append(
        f"check `{key}`: {view.optimizer}{what} usually trains with {lo:g}..{hi:g}; "
        "tune_lr can propose one from an LR range test"
    )


def _check_view_seed(view: TrainingView, warnings: list[Finding], suggestions: list[str]) -> None:
    key = SEEDED_FORMATS.get(view.source_format)
    if key is None or view.seed is not None:
        return
    warnings.append(
        _finding(
            view,
            "seed",
            "no fixed seed: reruns and resumed attempts are not reproducible",
            default_key=key,
        )
    )
    suggestions.append(f"set `{key}:` to a fixed number (e.g. {key}: 42)")


def _check_view_placeholders(view: TrainingView, warnings: list[Finding]) -> None:
    """`${…}` in a config that no loader expands reaches the trainer as literal text."""
    for key, found in view.placeholders.items():
        warnings.append(
            Finding(
                field=key,
                message=f"{', '.join(found)} is filled by nothing: {view.source_format} does not "
                "expand placeholders, so the trainer reads the literal text",
            )
        )


def _check_view_mounts(ctx: SkillContext, view: TrainingView, warnings: list[Finding]) -> None:
    """Absolute and home paths outside the allowed mounts. Relative paths resolve against the
    directory the trainer is launched from, which the config does not say, and are not judged."""
    roots = ctx.policy_limits.get("allowed_mount_roots")
    if not roots:
        return
    roots = [os.path.normpath(os.path.expanduser(str(r))) for r in roots]
    for key, value in view.paths.items():
        p = os.path.expanduser(value)
        if not os.path.isabs(p):
            continue
        p = os.path.normpath(p)
        if not any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            warnings.append(
                Finding(
                    field=key,
                    message=f"{p} is outside the allowed mount roots ({', '.join(roots)}); the "
                    "policy will refuse to mount it",
                )
            )


# ------------------------------------------------------------------------------------- memory
def _precision_bytes(precision: str) -> tuple[float, float, float, float, str | None]:
    """(weight bytes, gradient bytes, bytes per optimiser state, master-copy bytes, assumption)."""
    p = precision.lower().replace("_", "-")
    if "mixed" in p or p in {"amp", "fp16-amp"}:
        return 2, 2, 4, 4, None  # half-precision compute, fp32 master weights and states
    if any(x in p for x in ("bf16", "fp16", "float16", "bfloat16", "half")) or p in {
        "16",
        "16-true",
    }:
        return 2, 2, 2, 0, None
    if any(x in p for x in ("fp32", "float32", "tf32", "full")) or p in {"32", "32-true"}:
        return 4, 4, 4, 0, None
    return 4, 4, 4, 0, f"unknown precision {precision!r}: assumed fp32"


QUANT_BYTES = {"int8": 1.0, "4bit": 0.5}
ZERO_TEXT = {
    1: "shards optimizer states; FSDP has no stage-1 mode",
    2: "shards optimizer states and gradients; FSDP SHARD_GRAD_OP",
    3: "shards optimizer states, gradients and weights; FSDP FULL_SHARD",
}


def estimate_memory(source: ExperimentSpec | TrainingView) -> MemoryEstimate | None:
    """Memory per GPU to train what a spec or a training config describes; None without a
    parameter count.

    Trained parameters cost weights + master copy + gradients + optimiser states (bytes by
    precision and optimiser); with LoRA only the adapters (and modules trained in full) are trained
    and the frozen base costs its precision or quantised size. ZeRO stage 1 divides optimiser
    states and master copy by the GPU count, stage 2 also gradients, stage 3 also weights; offload
    moves optimiser states (and, at stage 3, weights) to CPU memory. Activations, when batch,
    sequence length, hidden size and layers are known: 34·s·b·h bytes per layer at 16 bit
    (Korthikanti et al. 2022, memory-efficient attention), or with activation checkpointing 2·s·b·h
    per layer kept plus one layer recomputed; plus fp32 logits s·b·vocab·4 when the vocabulary is
    known."""
    view = source if isinstance(source, TrainingView) else view_from_spec(source)
    if view.params is None:
        return None
    spec_like = view.source_format == "nightshift"
    assumptions: list[str] = []
    precision = view.precision
    if precision is None:
        src = view.sources.get("precision")
        if src is not None and src.auto:
            precision = "bf16" if view.source_format == "axolotl" else "bf16-mixed"
            assumptions.append(f'precision "auto": assumed {precision}')
        else:
            precision = "fp32"
            assumptions.append(
                "no precision parameter: assumed fp32"
                if spec_like
                else "no precision: assumed fp32"
            )
    w, g, s, master, note = _precision_bytes(precision)
    if note:
        assumptions.append(note)
    optimizer = view.optimizer or "adamw"
    if view.optimizer is None:
        what = "parameter" if spec_like else "in the config"
        assumptions.append(f"no optimizer {what}: assumed AdamW (2 states per parameter)")
    family = _optimizer_family(optimizer)
    states = OPTIMIZER_STATES.get(family or "", 2)
    if family is None and view.optimizer is not None:
        assumptions.append(f"unknown optimizer {optimizer!r}: assumed 2 states per parameter")
    if family == "sgd" and view.momentum == 0:
        states = 0
    if "8bit" in optimizer.lower() or "8-bit" in optimizer.lower():
        s = 1

    n = float(view.params)
    if view.lora is not None:
        trained = view.lora.trainable_params
        if trained is None:
            trained = 0
            assumptions.append(
                "LoRA adapter size unknown (dimensions or targets unknown): adapters not counted"
            )
        frozen = n
        fb = QUANT_BYTES.get(view.quantization or "", 4.0 if master else w)
        assumptions.append(
            f"LoRA: {n / 1e6:,.0f} M frozen base parameters at {fb:g} "
            + ("byte each" if fb == 1 else "bytes each")
            + (f" ({view.quantization})" if view.quantization in QUANT_BYTES else "")
            + f", {trained / 1e6:,.1f} M trained"
        )
    else:
        trained, frozen, fb = n, 0.0, None
    devices = view.devices or 1
    stage = view.zero_stage or 0
    if stage and view.devices is None:
        assumptions.append(f"ZeRO stage {stage} but the GPU count is unknown: no sharding counted")
    params_b = trained * w + frozen * (fb or 0)
    master_b = trained * master
    grads_b = trained * g
    optim_b = trained * s * states
    if stage >= 3:
        params_b /= devices
    if stage >= 2:
        grads_b /= devices
    if stage >= 1:
        master_b /= devices
        optim_b /= devices
    host = 0.0
    if view.offload_optimizer:
        host += master_b + optim_b
        master_b = optim_b = 0.0
        assumptions.append("optimizer states and master weights offloaded to CPU memory")
    if view.offload_params and stage >= 3:
        host += params_b
        params_b = 0.0
        assumptions.append(
            "parameters offloaded to CPU: the layers being computed are fetched and not counted"
        )
    weights = params_b + master_b
    layers_b, logits_b = _activation_bytes(view, w)
    if layers_b is None:
        if view.model_kind == "cnn":
            assumptions.append(
                f"no activation term: it depends on image size and the {view.model or 'network'} "
                "architecture, not on a transformer's batch × sequence × hidden × layers"
            )
        else:
            assumptions.append(
                "no activation term: batch, sequence length, hidden size or layer count unknown"
            )
        activations = None
    else:
        ckpt = " with activation checkpointing" if view.activation_checkpointing else ""
        assumptions.append(
            "activations ≈ 34·seq·batch·hidden·layers bytes at 16 bit, no recomputation, "
            "memory-efficient attention"
            if not ckpt
            else "activations ≈ (2·layers + 34)·seq·batch·hidden bytes at 16 bit"
            f"{ckpt} (layer inputs kept, one layer recomputed)"
        )
        activations = layers_b + (logits_b or 0)
        if logits_b is None:
            assumptions.append("output logits not counted: vocabulary size unknown")
        else:
            assumptions.append("logits ≈ seq·batch·vocab·4 bytes (fp32 for the loss)")
    total = weights + grads_b + optim_b + (activations or 0)
    return MemoryEstimate(
        params_millions=n / 1e6,
        trainable_params_millions=trained / 1e6,
        precision=precision,
        optimizer=optimizer,
        bytes_per_param=w + master + g + s * states,
        frozen_bytes_per_param=fb,
        weights_gib=_gib(weights),
        gradients_gib=_gib(grads_b),
        optimizer_gib=_gib(optim_b),
        activations_gib=_gib(activations) if activations is not None else None,
        logits_gib=_gib(logits_b) if logits_b is not None and layers_b is not None else None,
        total_gib=_gib(total),
        host_offload_gib=_gib(host),
        micro_batch=view.micro_batch,
        devices=view.devices,
        zero_stage=stage,
        offload_optimizer=bool(view.offload_optimizer),
        offload_params=bool(view.offload_params and stage >= 3),
        activation_checkpointing=bool(view.activation_checkpointing),
        assumptions=assumptions,
    )


def _activation_bytes(view: TrainingView, act_bytes: float) -> tuple[float | None, float | None]:
    """(transformer layers, logits) in bytes for the view's micro-batch; None where unknown."""
    mb, seq, hidden, layers = view.micro_batch, view.seq_len, view.hidden, view.layers
    if view.model_kind == "cnn" or mb is None or seq is None or hidden is None or layers is None:
        return None, None
    scale = act_bytes / 2
    if view.activation_checkpointing:
        layer_b = (2 * layers + 34) * seq * mb * hidden * scale
    else:
        layer_b = 34 * seq * mb * hidden * layers * scale
    logits = seq * mb * view.vocab * 4 if view.vocab else None
    return layer_b, logits


def _target_memory(ctx: SkillContext, inp: ConfigValidatorInput) -> tuple[float | None, str | None]:
    if inp.gpu_memory_gib is not None:
        return inp.gpu_memory_gib, "gpu_memory_gib argument"
    latest: dict[tuple[str, str], GpuSample] = {}
    with ctx.store.session() as s:
        mine = col(GpuSample.source).in_(health_sources(ctx.settings))
        for row in s.exec(select(GpuSample).where(mine).order_by(GpuSample.taken_at, GpuSample.id)):
            latest[(row.host, row.uuid or f"index {row.gpu_index}")] = row
    healthy = [
        (r.data.get("memory_total_mib"), r)
        for r in latest.values()
        if r.verdict in ("OK", "WARNING")
        and isinstance((r.data or {}).get("memory_total_mib"), (int, float))
    ]
    if not healthy:
        return None, None
    mib, row = min(healthy, key=lambda x: x[0])
    name = (row.data or {}).get("name") or "GPU"
    return (
        mib / 1024.0,
        f"smallest healthy GPU recorded: {row.host} GPU {row.gpu_index} ({name}, {mib} MiB)",
    )


def _check_memory(
    ctx: SkillContext,
    inp: ConfigValidatorInput,
    view: TrainingView,
    spec: ExperimentSpec | None,
    errors: list[Finding],
    warnings: list[Finding],
    suggestions: list[str],
) -> tuple[MemoryEstimate | None, list[MemoryOption]]:
    est = estimate_memory(view)
    if est is None:
        return None, []
    target, source = _target_memory(ctx, inp)
    est.target_gpu_memory_gib, est.target_source = target, source
    declared = spec.resources.gpu_memory_gb if spec is not None else None
    if declared is not None and est.total_gib > declared:
        warnings.append(
            Finding(
                field="resources.gpu_memory_gb",
                message=f"declares {declared:g} GB but the estimate is {est.total_gib:g} GiB",
            )
        )
    if target is None:
        return est, []
    if spec is not None:
        where = Finding(field="parameters", message="")
    else:
        where = _finding(view, "micro_batch", "")
    if est.total_gib <= target:
        if est.total_gib > 0.9 * target:
            warnings.append(
                where.model_copy(
                    update={
                        "message": f"estimated {est.total_gib:g} GiB of {target:g} GiB: little "
                        "headroom for fragmentation and the CUDA context"
                    }
                )
            )
        return est, []
    errors.append(
        where.model_copy(
            update={
                "message": f"estimated {est.total_gib:g} GiB per GPU exceeds the target GPU's "
                f"{target:g} GiB ({source})"
            }
        )
    )
    options = _fit_options(view, est, target)
    suggestions.extend(o.text for o in options)
    static = est.weights_gib + est.gradients_gib + est.optimizer_gib
    if static > target:
        suggestions.append(
            f"weights, gradients and optimiser states alone need {static:.2f} GiB: use a GPU "
            "with more memory, shard them across GPUs (FSDP / ZeRO), or use 16-bit weights and "
            "an 8-bit optimiser"
        )
    return est, options


def _key_name(view: TrainingView, field: str) -> str | None:
    """How the user's file names a field (`micro_batch_size`, `train.micro_batch_size`)."""
    src = view.sources.get(field)
    if src is None or src.derived:
        return None
    key = src.key
    return key.removeprefix("parameters.") if view.source_format == "nightshift" else key


def _global(view: TrainingView) -> int | None:
    if view.global_batch is not None:
        return view.global_batch
    if view.micro_batch is not None and view.devices is not None:
        return view.micro_batch * (view.grad_accum or 1) * view.devices
    return None


def _option(
    view: TrainingView,
    change: str,
    settings: dict[str, Any],
    target: float,
    text: str,
    update: dict[str, Any] | None = None,
) -> MemoryOption | None:
    """The estimate after applying `settings` (as `update` when they are not plain values)."""
    after = view.model_copy(update=update or settings)
    est = estimate_memory(after)
    if est is None:
        return None
    fits = est.total_gib <= target
    verdict = "fits" if fits else "still over"
    return MemoryOption(
        change=change,
        settings=settings,
        total_gib=est.total_gib,
        fits=fits,
        global_batch=_global(after),
        text=f"{text}: estimated {est.total_gib:g} GiB of {target:g} GiB ({verdict})",
    )


def _fit_options(view: TrainingView, est: MemoryEstimate, target: float) -> list[MemoryOption]:
    """Changes that lower memory per GPU, each with its estimate: a smaller micro-batch with more
    accumulation (same global batch), activation checkpointing, a higher ZeRO stage or offload, and
    LoRA instead of a full fine-tune."""
    out: list[MemoryOption] = []
    static = est.weights_gib + est.gradients_gib + est.optimizer_gib
    mb = view.micro_batch
    if est.activations_gib is not None and mb and mb >= 2 and static < target:
        new_mb, factor = mb, 1
        while new_mb > 1:
            new_mb, factor = max(1, new_mb // 2), factor * 2
            trial = estimate_memory(view.model_copy(update={"micro_batch": new_mb}))
            if trial is not None and trial.total_gib <= target:
                break
        ga = view.grad_accum or 1
        settings = {"micro_batch": new_mb, "grad_accum": ga * factor}
        if view.global_batch is not None:
            settings["global_batch"] = view.global_batch
        option = _option(view, "micro_batch", settings, target, "")
        if option is not None and option.fits:
            mb_key = _key_name(view, "micro_batch") or "micro-batch"
            ga_src = view.sources.get("grad_accum")
            if ga_src is not None and ga_src.derived:
                ga_text = f"gradient accumulation {ga} → {ga * factor} (from `{ga_src.key}`)"
            elif ga_src is not None:
                ga_text = f"`{_key_name(view, 'grad_accum')}` {ga} → {ga * factor}"
            elif view.source_format == "nightshift":
                ga_text = (
                    f"gradient accumulation {ga * factor} "
                    "(add a grad_accum parameter and knobs.grad_accum)"
                )
            else:
                ga_text = f"gradient accumulation {ga * factor}"
            g = _global(view)
            same = f"same global batch {g}" if g is not None else "same effective batch"
            option.text = (
                f"micro-batch `{mb_key}` {mb} → {new_mb} with {ga_text}: {same}, estimated "
                f"{option.total_gib:g} GiB of {target:g} GiB"
            )
            out.append(option)
    if est.activations_gib is not None and not view.activation_checkpointing:
        hint = CHECKPOINTING_HINT.get(view.source_format, "")
        option = _option(
            view,
            "activation_checkpointing",
            {"activation_checkpointing": True},
            target,
            f"activation checkpointing ({hint}) trades compute for activation memory",
        )
        if option is not None:
            out.append(option)
    stage = view.zero_stage or 0
    if view.devices and view.devices > 1 and stage < 3:
        for new_stage in range(stage + 1, 4):
            option = _option(
                view,
                "zero_stage",
                {"zero_stage": new_stage},
                target,
                f"ZeRO stage {new_stage} ({ZERO_TEXT[new_stage]}) across {view.devices} GPUs",
            )
            if option is not None and (option.fits or new_stage == 3):
                out.append(option)
                break
    if not view.offload_optimizer and not (out and out[-1].fits and out[-1].change == "zero_stage"):
        new_stage = max(stage, 2)
        option = _option(
            view,
            "offload_optimizer",
            {"zero_stage": new_stage, "offload_optimizer": True},
            target,
            f"DeepSpeed ZeRO-Offload (stage {new_stage}, `offload_optimizer: {{device: cpu}}`) "
            "keeps optimizer states and master weights in CPU memory",
        )
        if option is not None:
            out.append(option)
    if (
        view.devices
        and view.devices > 1
        and not view.offload_params
        and not any(o.fits for o in out)
    ):
        option = _option(
            view,
            "offload_params",
            {"zero_stage": 3, "offload_optimizer": True, "offload_params": True},
            target,
            "ZeRO stage 3 with optimizer and parameter offload to CPU",
        )
        if option is not None:
            out.append(option)
    lora = _lora_option(view, target)
    if lora is not None:
        out.append(lora)
    if out and not any(o.fits for o in out):
        together: dict[str, Any] = {}
        for o in out:
            if o.change != "lora":
                together.update(o.settings)
        if together:
            combined = _option(view, "combined", together, target, "all of the above together")
            if combined is not None and combined.fits:
                out.append(combined)
    return out


def _lora_option(view: TrainingView, target: float) -> MemoryOption | None:
    """Full fine-tune of a pretrained transformer: LoRA adapters on every linear layer instead."""
    if view.lora is not None or view.init != "pretrained" or view.model_kind != "transformer":
        return None
    lora = LoraView(
        rank=LORA_SUGGESTION_RANK, alpha=2 * LORA_SUGGESTION_RANK, targets=["all-linear"]
    )
    lora.trainable_params = lora_trainable_params(view, lora)
    if lora.trainable_params is None:
        return None
    millions = lora.trainable_params / 1e6
    return _option(
        view,
        "lora",
        {"lora": lora.model_dump()},
        target,
        f"LoRA adapters (r={LORA_SUGGESTION_RANK} on all linear layers, {millions:,.1f} M "
        "trained parameters) instead of fine-tuning every weight",
        update={"lora": lora},
    )


@skill("config_validator", capability="read")
def config_validator(ctx: SkillContext, inp: ConfigValidatorInput) -> ConfigValidatorResult:
    """Validate a training run before it starts. Takes nightshift's experiment spec as a mapping
    (`spec`) or a file (`path`), or a training config people write — Hugging Face accelerate,
    DeepSpeed JSON (with "auto" values), axolotl, LitGPT, detectron2 (with `_BASE_` inheritance) —
    detected from its keys. Returns the config in a common view (model and parameter count,
    optimiser, learning rate, micro-batch, gradient accumulation, global batch, devices,
    epochs/steps, precision, sequence length, LoRA, ZeRO stage and offload), then errors with
    their field path and line, warnings and concrete suggestions: a learning rate outside the usual
    range for the optimiser and for fine-tuning versus from scratch; memory per GPU (weights,
    gradients and optimiser states by precision and optimiser, LoRA, ZeRO and offload counted,
    plus activations) against the target GPU (`gpu_memory_gib`, else the smallest healthy GPU
    recorded), with changes that fit, each with its estimate (smaller micro-batch with more
    accumulation so the global batch stays, activation checkpointing, a higher ZeRO stage or
    offload); no seed; placeholders nothing fills; paths outside the allowed mounts. For an
    experiment spec also: a missing working directory or script, command placeholders no parameter
    fills, a floating image tag, retries without a checkpoint dir. Changes nothing."""
    if inp.spec is not None:
        return _validate_spec_input(ctx, inp, inp.spec, None, None, recognised=True)
    assert inp.path is not None
    try:
        doc = read_config(inp.path)
        check_bounds(doc.data, path=inp.path)
    except SpecError as exc:
        return ConfigValidatorResult(
            valid=False,
            errors=[Finding(field=exc.field, message=str(exc), line=exc.line)],
            suggestions=[SCHEMA_FIRST],
        )
    except (RecursionError, ValueError) as exc:  # json.loads: no bounds of its own
        if isinstance(exc, RecursionError):
            why = f"nested deeper than {MAX_DEPTH} levels (the limit)"
        elif "digits" in str(exc):
            why = f"an integer longer than {MAX_INT_DIGITS} digits (the limit)"
        else:
            why = f"cannot be read: {exc}"
        return ConfigValidatorResult(
            valid=False, errors=[Finding(message=f"{inp.path}: {why}")], suggestions=[SCHEMA_FIRST]
        )
    fmt = inp.format or detect_format(inp.path, doc.data)
    if fmt is None or fmt == "nightshift":
        return _validate_spec_input(ctx, inp, doc.data, doc.node, inp.path, fmt is not None)
    try:
        view = load_training_view(inp.path, fmt)
    except SpecError as exc:
        return ConfigValidatorResult(
            valid=False, errors=[Finding(field=exc.field, message=str(exc), line=exc.line)]
        )
    errors: list[Finding] = []
    warnings: list[Finding] = []
    suggestions: list[str] = []
    for issue in view.issues:
        found = Finding(
            field=issue.key,
            message=issue.message,
            line=issue.line,
            file=issue.file if issue.file != view.path else None,
        )
        (errors if issue.severity == "error" else warnings).append(found)
    _check_view_lr(view, warnings, suggestions)
    _check_view_seed(view, warnings, suggestions)
    _check_view_placeholders(view, warnings)
    _check_view_mounts(ctx, view, warnings)
    estimate, options = _check_memory(ctx, inp, view, None, errors, warnings, suggestions)
    return ConfigValidatorResult(
        valid=not errors,
        errors=errors,
        warnings=warnings,
        suggestions=suggestions,
        estimate=estimate,
        options=options,
        view=view,
    )


def _validate_spec_input(
    ctx: SkillContext,
    inp: ConfigValidatorInput,
    data: Any,
    node: Any,
    path: str | None,
    recognised: bool,
) -> ConfigValidatorResult:
    """An experiment spec: schema, then its own checks, then the checks on its view."""
    spec, errors = _validate_spec(data, node, path)
    if spec is None:
        hints = [SCHEMA_FIRST] + ([] if recognised else [NOT_A_FORMAT])
        return ConfigValidatorResult(valid=False, errors=errors, suggestions=hints)
    view = view_from_spec(spec, path=path, node=node)
    warnings: list[Finding] = []
    suggestions: list[str] = []
    _check_placeholders(spec, errors, suggestions)
    _check_code(spec, errors)
    _check_lr(spec, warnings, suggestions)
    _check_image(spec, warnings, suggestions)
    _check_seed(spec, warnings, suggestions)
    _check_checkpoint(spec, warnings)
    _check_stall(spec, warnings, suggestions)
    _check_mounts(ctx, spec, warnings)
    estimate, options = _check_memory(ctx, inp, view, spec, errors, warnings, suggestions)
    return ConfigValidatorResult(
        valid=not errors,
        errors=errors,
        warnings=warnings,
        suggestions=suggestions,
        estimate=estimate,
        options=options,
        view=view,
    )
