"""config_validator: an experiment spec checked before it runs — schema first, then engineering sense.

Errors make the spec invalid; warnings and suggestions are advice. Limits from the policy (allowed
mount roots) are read to advise, never to block: the policy layer enforces them at launch.
"""

from __future__ import annotations

import math
import os
from typing import Any

from nightshift.runtime.errors import SpecError
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import GpuSample
from nightshift.runtime.yamlfile import line_of, read_yaml, validate
from nightshift.skills.base import SkillContext, skill
from pydantic import BaseModel, Field, ValidationError, model_validator
from sqlmodel import select

# Usual learning-rate ranges per optimiser family (inclusive); outside is unusual, not wrong.
LR_RANGES: dict[str, tuple[float, float]] = {
    "adam": (1e-5, 1e-2),
    "sgd": (1e-4, 1.0),
    "lion": (1e-6, 1e-3),
    "rmsprop": (1e-5, 1e-2),
    "adagrad": (1e-4, 1e-1),
}
# Optimiser states per parameter (Adam: first and second moment).
OPTIMIZER_STATES: dict[str, int] = {"adam": 2, "lion": 1, "sgd": 1, "rmsprop": 1, "adagrad": 1}

# Floating tags move under the same name: two runs of one spec may not run the same image.
FLOATING_TAGS = {"latest", "nightly", "main", "master", "dev", "edge", "stable", "head"}

# Parameter names people use for the same thing (first match wins).
PARAMS_MILLIONS = ("params_millions", "n_params_millions", "model_params_millions", "params_m")
PARAMS_BILLIONS = ("params_billions", "n_params_billions", "params_b")
PARAMS_COUNT = ("n_params", "num_params", "param_count", "num_parameters")
PRECISION = ("precision", "dtype", "mixed_precision", "torch_dtype")
OPTIMIZER = ("optimizer", "optim", "optimizer_name")
LEARNING_RATE = ("lr", "learning_rate", "base_lr")
MICRO_BATCH = ("micro_batch_size", "batch_size", "per_device_train_batch_size", "micro_batch", "bs")
GRAD_ACCUM = (
    "grad_accum",
    "gradient_accumulation_steps",
    "grad_accum_steps",
    "accumulate_grad_batches",
)
SEQ_LEN = (
    "seq_len",
    "seq_length",
    "sequence_len",
    "max_seq_length",
    "block_size",
    "context_length",
)
HIDDEN = ("hidden_size", "d_model", "n_embd", "hidden_dim", "dim")
LAYERS = ("n_layer", "n_layers", "num_layers", "num_hidden_layers", "layers")
SCRIPT_SUFFIXES = (".py", ".sh", ".bash")
PATH_SUFFIXES = ("_dir", "_path", "_file", "_root")

GIB = float(1 << 30)
SCHEMA_FIRST = "fix the schema errors first; the engineering checks run on a spec that parses"


class ConfigValidatorInput(BaseModel):
    """A spec as a mapping or a path to a YAML/JSON spec file, and optionally the target GPU memory."""

    spec: dict[str, Any] | None = Field(None, description="The experiment spec as a mapping")
    path: str | None = Field(None, description="A YAML or JSON experiment spec file")
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of the target GPU; default: the smallest healthy GPU recorded",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ConfigValidatorInput:
        if (self.spec is None) == (self.path is None):
            raise ValueError("give exactly one of `spec` (a mapping) or `path` (a spec file)")
        return self


class Finding(BaseModel):
    """One problem, named by its field path (and line, for a file)."""

    field: str | None = None
    message: str
    line: int | None = None


class MemoryEstimate(BaseModel):
    """Training memory per GPU: weights + gradients + optimiser states + activations."""

    params_millions: float
    precision: str
    optimizer: str
    bytes_per_param: float = Field(
        description="Weights, gradients, optimiser states and master copy"
    )
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float | None = Field(
        None, description="None when batch/seq/hidden/layers are unknown"
    )
    total_gib: float
    target_gpu_memory_gib: float | None = None
    target_source: str | None = Field(None, description="Where the target memory came from")
    assumptions: list[str] = Field(default_factory=list)


class ConfigValidatorResult(BaseModel):
    """Valid when there are no errors; warnings and suggestions are advice."""

    valid: bool
    errors: list[Finding] = Field(default_factory=list)
    warnings: list[Finding] = Field(default_factory=list)
    suggestions: list[str] = Field(default_factory=list)
    estimate: MemoryEstimate | None = None


# ----------------------------------------------------------------------------------- loading
def _load(inp: ConfigValidatorInput) -> tuple[ExperimentSpec | None, list[Finding]]:
    """Validate the schema; every error with its field path, and its line when read from a file."""
    if inp.path is not None:
        try:
            data, node, _ = read_yaml(inp.path)
        except SpecError as exc:
            return None, [Finding(field=exc.field, message=str(exc), line=exc.line)]
        if not isinstance(data, dict):
            return None, [
                Finding(message=f"{inp.path}: expected a mapping at the top level", line=1)
            ]
        path: str | None = inp.path
    else:
        data, node, path = inp.spec, None, None
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


def _number(v: Any) -> float | None:
    """YAML reads `3e-4` as a string; accept numbers written either way, reject bools."""
    if isinstance(v, bool):
        return None
    try:
        out = float(v)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _optimizer_family(name: str) -> str | None:
    low = name.lower()
    for family in ("adam", "lion", "sgd", "rmsprop", "adagrad"):
        if family in low:
            return family
    return None


def _gib(b: float) -> float:
    return round(b / GIB, 2)


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
    lr = _number(raw)
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
    if family is None or family not in LR_RANGES:
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


def _params_millions(spec: ExperimentSpec) -> float | None:
    for names, scale in ((PARAMS_MILLIONS, 1.0), (PARAMS_BILLIONS, 1e3), (PARAMS_COUNT, 1e-6)):
        found = _param(spec, names)
        if found is not None and (n := _number(found[1])) is not None and n > 0:
            return n * scale
    return None


def estimate_memory(spec: ExperimentSpec) -> MemoryEstimate | None:
    """Parameters × bytes × (weights + grads + optimiser states), plus activations when the batch,
    sequence length, hidden size and layer count are known. None without a parameter count."""
    millions = _params_millions(spec)
    if millions is None:
        return None
    assumptions: list[str] = []
    prec = _param(spec, PRECISION)
    precision = str(prec[1]) if prec else "fp32"
    if prec is None:
        assumptions.append("no precision parameter: assumed fp32")
    w, g, s, master, note = _precision_bytes(precision)
    if note:
        assumptions.append(note)
    opt = _param(spec, OPTIMIZER)
    optimizer = str(opt[1]) if opt else "adamw"
    if opt is None:
        assumptions.append("no optimizer parameter: assumed AdamW (2 states per parameter)")
    family = _optimizer_family(optimizer)
    states = OPTIMIZER_STATES.get(family or "", 2)
    if family is None and opt is not None:
        assumptions.append(f"unknown optimizer {optimizer!r}: assumed 2 states per parameter")
    if family == "sgd":
        momentum = _param(spec, ("momentum",))
        if momentum is not None and _number(momentum[1]) == 0:
            states = 0
    if "8bit" in optimizer.lower() or "8-bit" in optimizer.lower():
        s = 1
    n = millions * 1e6
    weights, grads, optim = n * (w + master), n * g, n * s * states
    activations = _activation_bytes(spec, w)
    if activations is None:
        assumptions.append(
            "no activation term: batch, sequence length, hidden size or layer count unknown"
        )
    else:
        assumptions.append(
            "activations ≈ 34·seq·batch·hidden·layers bytes at 16 bit, no recomputation, "
            "memory-efficient attention"
        )
    total = weights + grads + optim + (activations or 0)
    return MemoryEstimate(
        params_millions=millions,
        precision=precision,
        optimizer=optimizer,
        bytes_per_param=w + master + g + s * states,
        weights_gib=_gib(weights),
        gradients_gib=_gib(grads),
        optimizer_gib=_gib(optim),
        activations_gib=_gib(activations) if activations is not None else None,
        total_gib=_gib(total),
        assumptions=assumptions,
    )


def _activation_bytes(
    spec: ExperimentSpec, act_bytes: float, micro_batch: float | None = None
) -> float | None:
    """Korthikanti et al. (2022): about 34·s·b·h bytes per transformer layer with 16-bit activations."""
    mb = micro_batch
    if mb is None:
        found = _param(spec, MICRO_BATCH, spec.knobs.micro_batch)
        mb = _number(found[1]) if found else None
    dims = [_param(spec, names) for names in (SEQ_LEN, HIDDEN, LAYERS)]
    values = [_number(d[1]) if d else None for d in dims]
    if mb is None or any(v is None for v in values):
        return None
    seq, hidden, layers = values  # type: ignore[misc]
    return 34 * seq * mb * hidden * layers * (act_bytes / 2)


def _target_memory(ctx: SkillContext, inp: ConfigValidatorInput) -> tuple[float | None, str | None]:
    if inp.gpu_memory_gib is not None:
        return inp.gpu_memory_gib, "gpu_memory_gib argument"
    latest: dict[tuple[str, str], GpuSample] = {}
    with ctx.store.session() as s:
        for row in s.exec(select(GpuSample).order_by(GpuSample.taken_at, GpuSample.id)):
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
    spec: ExperimentSpec,
    errors: list[Finding],
    warnings: list[Finding],
    suggestions: list[str],
) -> MemoryEstimate | None:
    est = estimate_memory(spec)
    if est is None:
        return None
    target, source = _target_memory(ctx, inp)
    est.target_gpu_memory_gib, est.target_source = target, source
    declared = spec.resources.gpu_memory_gb
    if declared is not None and est.total_gib > declared:
        warnings.append(
            Finding(
                field="resources.gpu_memory_gb",
                message=f"declares {declared:g} GB but the estimate is {est.total_gib:g} GiB",
            )
        )
    if target is None:
        return est
    if est.total_gib <= target:
        if est.total_gib > 0.9 * target:
            warnings.append(
                Finding(
                    field="parameters",
                    message=f"estimated {est.total_gib:g} GiB of "
                    f"{target:g} GiB: little headroom for fragmentation and the CUDA context",
                )
            )
        return est
    errors.append(
        Finding(
            field="parameters",
            message=f"estimated {est.total_gib:g} GiB per GPU exceeds the "
            f"target GPU's {target:g} GiB ({source})",
        )
    )
    suggestions.extend(_fit_suggestions(spec, est, target))
    return est


def _fit_suggestions(spec: ExperimentSpec, est: MemoryEstimate, target: float) -> list[str]:
    """Halve the micro-batch (doubling gradient accumulation, same effective batch) until it fits."""
    static = est.weights_gib + est.gradients_gib + est.optimizer_gib
    mb_found = _param(spec, MICRO_BATCH, spec.knobs.micro_batch)
    mb = _number(mb_found[1]) if mb_found else None
    if est.activations_gib is not None and mb_found and mb and mb >= 2 and static < target:
        w, _g, _s, _m, _ = _precision_bytes(est.precision)
        new_mb, factor = int(mb), 1
        while new_mb > 1:
            new_mb, factor = max(1, new_mb // 2), factor * 2
            act = _activation_bytes(spec, w, micro_batch=new_mb) or 0
            if static + act / GIB <= target:
                break
        new_total = round(static + (_activation_bytes(spec, w, micro_batch=new_mb) or 0) / GIB, 2)
        if new_total <= target:
            ga_found = _param(spec, GRAD_ACCUM, spec.knobs.grad_accum)
            ga = int(_number(ga_found[1]) or 1) if ga_found else 1
            ga_text = (
                f"`{ga_found[0]}` {ga} → {ga * factor}"
                if ga_found
                else f"gradient accumulation {ga * factor} (add a grad_accum parameter and knobs.grad_accum)"
            )
            return [
                (
                    f"micro-batch `{mb_found[0]}` {int(mb)} → {new_mb} with {ga_text}: same effective "
                    f"batch, estimated {new_total:g} GiB of {target:g} GiB"
                )
            ]
    out = [
        (
            f"weights, gradients and optimiser states alone need {static:.2f} GiB: use a GPU with "
            "more memory, shard them across GPUs (FSDP / ZeRO), or use 16-bit weights and an 8-bit "
            "optimiser"
        )
    ]
    if est.activations_gib is not None:
        out.append("activation checkpointing trades compute for activation memory")
    return out


@skill("config_validator", capability="read")
def config_validator(ctx: SkillContext, inp: ConfigValidatorInput) -> ConfigValidatorResult:
    """Validate an experiment spec before it runs, given as a mapping (`spec`) or a YAML/JSON file
    (`path`). Reports schema errors with their field path (and line), then engineering checks: a
    missing working directory or training script, command placeholders that no parameter fills, a
    learning rate outside the usual range for the optimiser, a floating image tag, a missing seed,
    retries without a checkpoint dir, paths outside the allowed mount roots, and an estimate of GPU
    memory (parameters × bytes × (weights + gradients + optimiser states) + activations) against the
    target GPU (`gpu_memory_gib`, else the smallest healthy GPU recorded). Returns errors (the spec is
    invalid), warnings and concrete suggestions, such as a smaller micro-batch with more gradient
    accumulation. Changes nothing."""
    spec, errors = _load(inp)
    if spec is None:
        return ConfigValidatorResult(valid=False, errors=errors, suggestions=[SCHEMA_FIRST])
    warnings: list[Finding] = []
    suggestions: list[str] = []
    _check_placeholders(spec, errors, suggestions)
    _check_code(spec, errors)
    _check_lr(spec, warnings, suggestions)
    _check_image(spec, warnings, suggestions)
    _check_seed(spec, warnings, suggestions)
    _check_checkpoint(spec, warnings)
    _check_mounts(ctx, spec, warnings)
    estimate = _check_memory(ctx, inp, spec, errors, warnings, suggestions)
    return ConfigValidatorResult(
        valid=not errors,
        errors=errors,
        warnings=warnings,
        suggestions=suggestions,
        estimate=estimate,
    )
