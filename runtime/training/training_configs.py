"""Training configs as people write them, read into one common view.

Hugging Face accelerate launch configs (with a nested or referenced DeepSpeed config), DeepSpeed
JSON, axolotl, LitGPT, detectron2 (with `_BASE_` inheritance) and nightshift's own experiment spec
all say the same things in different words: which model, which optimiser and learning rate, how
many samples per GPU and per step, for how long, in which precision, on how many devices, sharded
how. `load_training_view` maps any of them onto a `TrainingView`.

Nothing is guessed. A value a file leaves to the launcher (`"auto"`) stays unknown and is listed in
`auto_fields`; a framework default is used only where the framework documents it, and is marked as
such in `sources`; a model that the table below does not know, and whose dimensions the config does
not give, has an unknown parameter count.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field

from nightshift.runtime.errors import SpecError
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.yamlfile import line_of, read_text, read_yaml, validate

Format = Literal["nightshift", "accelerate", "deepspeed", "axolotl", "litgpt", "detectron2"]
FORMATS: tuple[str, ...] = get_args(Format)

# ------------------------------------------------------------------------ experiment-spec names
# Parameter names people use for the same thing in an experiment spec (first match wins).
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
HEADS = ("n_head", "n_heads", "num_heads", "num_attention_heads")
VOCAB = ("vocab_size", "padded_vocab_size", "n_vocab")
MODEL_NAME = ("model", "model_name", "base_model", "model_name_or_path", "pretrained_model")
EPOCHS = ("epochs", "num_epochs", "num_train_epochs", "max_epochs")
MAX_STEPS = ("max_steps", "max_iters", "max_iter", "train_steps", "total_steps", "steps")
LORA_RANK = ("lora_r", "lora_rank")
LORA_ALPHA = ("lora_alpha",)
ZERO_STAGE = ("zero_stage",)
ACT_CKPT = ("gradient_checkpointing", "activation_checkpointing")

# Keys whose string values are local paths (for the mount check), whatever their value looks like.
PATH_KEY_SUFFIXES = ("_dir", "_path", "_file", "_root")
PATH_KEYS = {"path", "dir", "weights"}
NOT_PATH_KEYS = {"class_path", "_base_"}  # a Python import path; detectron2 inheritance


# ------------------------------------------------------------------------------ known models
@dataclass(frozen=True)
class KnownModel:
    """A row of the model table: published parameter count and architecture dimensions."""

    name: str
    params: int
    kind: Literal["transformer", "cnn"]
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    mlp_gated: bool | None = None


# Transformer counts are the sum of the weight shapes in each model's published config.json
# (embeddings, attention, MLP, norms; Llama/Mistral untie the output head, GPT-2 ties it);
# tests/test_training_configs.py recomputes every one from its dimensions.
_LLAMA3_8B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
_LLAMA3_70B = dict(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, vocab=128256)
MODEL_TABLE: tuple[KnownModel, ...] = (
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    KnownModel("Llama-3-8B", 8_030_261_248, "transformer", mlp_gated=True, **_LLAMA3_8B),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (same shapes as 3-8B)
    KnownModel("Llama-3.1-8B", 8_030_261_248, "transformer", mlp_gated=True, **_LLAMA3_8B),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    KnownModel("Llama-3-70B", 70_553_706_496, "transformer", mlp_gated=True, **_LLAMA3_70B),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    KnownModel("Llama-3.1-70B", 70_553_706_496, "transformer", mlp_gated=True, **_LLAMA3_70B),
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    KnownModel(
        "Llama-2-7B",
        6_738_415_616,
        "transformer",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=32,
        intermediate=11008,
        vocab=32000,
        mlp_gated=True,
    ),
    # https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
    KnownModel(
        "Llama-2-13B",
        13_015_864_320,
        "transformer",
        hidden=5120,
        layers=40,
        heads=40,
        kv_heads=40,
        intermediate=13824,
        vocab=32000,
        mlp_gated=True,
    ),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    KnownModel(
        "Mistral-7B-v0.1",
        7_241_732_096,
        "transformer",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=32000,
        mlp_gated=True,
    ),
    # https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json (vocab 32768)
    KnownModel(
        "Mistral-7B-v0.3",
        7_248_023_552,
        "transformer",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=32768,
        mlp_gated=True,
    ),
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json
    KnownModel(
        "gpt2",
        124_439_808,
        "transformer",
        hidden=768,
        layers=12,
        heads=12,
        kv_heads=12,
        intermediate=3072,
        vocab=50257,
        mlp_gated=False,
    ),
    # https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json
    KnownModel(
        "gpt2-medium",
        354_823_168,
        "transformer",
        hidden=1024,
        layers=24,
        heads=16,
        kv_heads=16,
        intermediate=4096,
        vocab=50257,
        mlp_gated=False,
    ),
    # https://huggingface.co/openai-community/gpt2-large/blob/main/config.json
    KnownModel(
        "gpt2-large",
        774_030_080,
        "transformer",
        hidden=1280,
        layers=36,
        heads=20,
        kv_heads=20,
        intermediate=5120,
        vocab=50257,
        mlp_gated=False,
    ),
    # https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json
    KnownModel(
        "gpt2-xl",
        1_557_611_200,
        "transformer",
        hidden=1600,
        layers=48,
        heads=25,
        kv_heads=25,
        intermediate=6400,
        vocab=50257,
        mlp_gated=False,
    ),
    # torchvision.models.resnet50, IMAGENET1K_V1 weights: num_params 25,557,032
    # https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet50.html
    KnownModel("ResNet-50", 25_557_032, "cnn"),
    # torchvision.models.resnet101, IMAGENET1K_V1 weights: num_params 44,549,160
    # https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet101.html
    KnownModel("ResNet-101", 44_549_160, "cnn"),
    # torchvision.models.vit_b_16: num_params 86,567,656 (hidden 768, 12 layers, 12 heads, MLP 3072)
    # https://pytorch.org/vision/stable/models/generated/torchvision.models.vit_b_16.html
    KnownModel(
        "ViT-B/16",
        86_567_656,
        "transformer",
        hidden=768,
        layers=12,
        heads=12,
        kv_heads=12,
        intermediate=3072,
        mlp_gated=False,
    ),
    # torchvision.models.vit_l_16: num_params 304,326,632 (hidden 1024, 24 layers, 16 heads)
    # https://pytorch.org/vision/stable/models/generated/torchvision.models.vit_l_16.html
    KnownModel(
        "ViT-L/16",
        304_326_632,
        "transformer",
        hidden=1024,
        layers=24,
        heads=16,
        kv_heads=16,
        intermediate=4096,
        mlp_gated=False,
    ),
)

# Other spellings of the same checkpoints (after normalisation, see `_name_keys`).
_ALIASES = {
    "mistral-7b": "mistral-7b-v0.1",
    "mistral-7b-v0.2": "mistral-7b-v0.1",  # v0.2 changes rope/sliding window, not the shapes
    "gpt2-small": "gpt2",
    "gpt-2": "gpt2",
    "resnet50": "resnet-50",
    "r-50": "resnet-50",
    "r50": "resnet-50",
    "resnet101": "resnet-101",
    "r-101": "resnet-101",
    "r101": "resnet-101",
    "vit-b-16": "vit-b/16",
    "vit-base-patch16-224": "vit-b/16",
    "vit-l-16": "vit-l/16",
    "vit-large-patch16-224": "vit-l/16",
}
_BY_KEY = {m.name.lower(): m for m in MODEL_TABLE}


def _name_keys(name: str) -> list[str]:
    """Normalised spellings of a name: case, org prefix, `Meta-`, `-hf`, `-chat`, `-instruct`."""
    raw = name.strip().strip("/").lower()
    out: list[str] = []
    for cand in (raw, raw.rsplit("/", 1)[-1]):
        c = cand.replace("_", "-")
        c = re.sub(r"^meta-", "", c)
        c = re.sub(r"^llama(\d)", r"llama-\1", c)
        c = c.replace("-instruct", "").replace("-chat", "")
        c = re.sub(r"-(hf|base)$", "", c)
        for key in (c, _ALIASES.get(c, "")):
            if key and key not in out:
                out.append(key)
    return out


def lookup_model(name: str | None) -> KnownModel | None:
    """The table row for a model name (`meta-llama/Meta-Llama-3-8B`, `NousResearch/Meta-Llama-3-8B`,
    `checkpoints/meta-llama/Meta-Llama-3.1-8B`, `gpt2-medium`…), or None: unknown is not a guess."""
    if not name:
        return None
    for key in _name_keys(name):
        if key in _BY_KEY:
            return _BY_KEY[key]
    return None


def params_from_dimensions(
    hidden: int,
    layers: int,
    vocab: int,
    *,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    mlp_gated: bool | None = None,
) -> int:
    """Parameter count of a decoder from its dimensions. Gated MLP (Llama style): attention
    2h² + 2h·kv_dim, MLP 3·h·I, two norms per layer, untied embedding and head. Otherwise GPT style:
    12h² + 13h per layer (biases and norms included) and tied embeddings."""
    h = hidden
    if mlp_gated and intermediate:
        kv_dim = h * kv_heads // heads if heads and kv_heads else h
        per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * intermediate + 2 * h
        return layers * per_layer + 2 * vocab * h + h
    return layers * (12 * h * h + 13 * h) + vocab * h + 2 * h


# ------------------------------------------------------------------------------------- models
class FieldSource(BaseModel):
    """Where a view field's value came from."""

    key: str = Field(description="Key path in the file, dotted (`optimizer.init_args.lr`)")
    file: str | None = Field(
        None, description="The file that holds it (a `_BASE_` or a referenced file)"
    )
    line: int | None = Field(None, description="1-based line of the key")
    default: bool = Field(False, description="Not in the file: the framework's documented default")
    derived: bool = Field(False, description="Computed from other fields (e.g. accumulation)")
    auto: bool = Field(False, description='The file says "auto": the launcher fills it in')


class ConfigIssue(BaseModel):
    """A value that could not be read as what its key means, or that contradicts another."""

    severity: Literal["error", "warning"]
    key: str | None = None
    message: str
    file: str | None = None
    line: int | None = None


class LoraView(BaseModel):
    """LoRA adapters: rank, scale, target modules and, when the dimensions are known, their size."""

    rank: int | None = None
    alpha: float | None = None
    dropout: float | None = None
    targets: list[str] = Field(
        default_factory=list,
        description="q, k, v, o, gate, up, down, mlp, qkv, lm_head, or all-linear",
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="Modules trained in full beside the adapters"
    )
    trainable_params: int | None = Field(
        None, description="Adapter parameters plus modules trained in full; None when unknown"
    )


class TrainingView(BaseModel):
    """What a training config says, in one vocabulary, whatever format it was written in."""

    source_format: Format
    path: str | None = None
    model: str | None = Field(None, description="Model name or description, as the config gives it")
    params: int | None = Field(None, description="Parameter count")
    params_source: Literal["declared", "table", "dimensions", "unknown"] = "unknown"
    model_kind: Literal["transformer", "cnn"] | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    mlp_gated: bool | None = None
    seq_len: int | None = None
    optimizer: str | None = None
    learning_rate: float | None = None
    micro_batch: int | None = Field(None, description="Samples per GPU per forward pass")
    grad_accum: int | None = Field(None, description="Micro-batches per optimiser step")
    global_batch: int | None = Field(None, description="Samples per optimiser step, all GPUs")
    devices: int | None = Field(None, description="Data-parallel processes (GPUs)")
    epochs: float | None = None
    max_steps: int | None = None
    precision: str | None = Field(
        None,
        description="fp32, fp16, bf16 (pure), fp16-mixed, bf16-mixed, fp8-mixed, or as written",
    )
    quantization: str | None = Field(None, description="Frozen base weights: int8 or 4bit")
    lora: LoraView | None = None
    zero_stage: int | None = Field(None, description="ZeRO stage (FSDP sharding mapped onto it)")
    offload_optimizer: bool | None = None
    offload_params: bool | None = None
    activation_checkpointing: bool | None = None
    momentum: float | None = Field(None, description="SGD momentum (0: no optimiser state)")
    seed: int | None = None
    init: Literal["pretrained", "scratch"] | None = Field(
        None, description="Fine-tuning pretrained weights, or training from scratch"
    )
    init_from: str | None = None
    auto_fields: list[str] = Field(
        default_factory=list, description='Key paths whose value is "auto" (unknown until launch)'
    )
    sources: dict[str, FieldSource] = Field(default_factory=dict)
    paths: dict[str, str] = Field(
        default_factory=dict, description="Key path → local path the config names"
    )
    placeholders: dict[str, list[str]] = Field(
        default_factory=dict, description="Key path → ${…} placeholders that nothing expands"
    )
    files: list[str] = Field(default_factory=list, description="Every file read, main file first")
    notes: list[str] = Field(default_factory=list)
    issues: list[ConfigIssue] = Field(default_factory=list)


# -------------------------------------------------------------------------------- file reading
@dataclass
class ConfigDoc:
    """One parsed config file: its path, its mapping and its YAML node tree (for line numbers)."""

    path: str
    data: dict[str, Any]
    node: yaml.Node | None


def read_config(path: str | Path) -> ConfigDoc:
    """A YAML or JSON mapping with its node tree (for lines). JSON is read as JSON (`1e9` is a
    number there, a string in YAML 1.1)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("file not found; check the path", path=str(p))
    if p.suffix.lower() == ".json":
        text = read_text(p)  # bounded, and as the socket's caller where there is one
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON: {exc.msg}", path=str(p), line=exc.lineno) from exc
        try:
            node = yaml.compose(text)
        except yaml.YAMLError:
            node = None
    else:
        data, node, _ = read_yaml(p)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", path=str(p), line=1)
    return ConfigDoc(str(p), data, node)


def _locate(ref: str, relative_to: str) -> tuple[Path | None, str | None]:
    """A file a config names, resolved against the naming file's folder. When it is not there, a
    flattened copy beside the naming file (`<repo>__<name>`, the layout of shared fixture folders)
    is accepted and said so."""
    base = Path(relative_to).parent
    target = (base / os.path.expanduser(ref)).resolve()
    if target.is_file():
        return target, None
    name = Path(ref).name
    flat = sorted(p for p in base.glob(f"*__{name}") if p.is_file())
    if len(flat) != 1:
        return None, None
    found = flat[0]
    return found, f"{ref} is not at {target}; read the flattened copy {found.name} beside it"


def _tuple(v: Any) -> Any:
    """yacs writes tuples as `(60000, 80000)`; YAML reads that as a string."""
    if isinstance(v, str) and v.strip().startswith(("(", "[")):
        try:
            return ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            return v
    return v


def as_number(v: Any) -> float | None:
    """YAML reads `3e-4` as a string; accept numbers written either way, reject bools."""
    if isinstance(v, bool):
        return None
    try:
        out = float(v)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _is_auto(v: Any) -> bool:
    return isinstance(v, str) and v.strip().lower() == "auto"


def _truthy(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("false", "no", "off", "0", "none", ""):
        return False
    if isinstance(v, (int, float)):
        return bool(v)
    return None


_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # org/name on the Hugging Face Hub


def _looks_local(key: str, value: str) -> bool:
    """A local path: absolute, home- or dot-relative, or the value of a path-named key that is not
    a URL, a Hub id or a variable."""
    v, k = value.strip(), key.lower()
    if not v or "://" in v or v.startswith("$") or k in NOT_PATH_KEYS:
        return False
    if v.startswith(("/", "~", "./", "../")):
        return True
    return (k.endswith(PATH_KEY_SUFFIXES) or k in PATH_KEYS) and not _HUB_ID.match(v)


def _walk(data: Any, prefix: tuple[str, ...] = ()):
    """(key path, value) of every leaf."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, (*prefix, str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, (*prefix, str(i)))
    else:
        yield prefix, data


# ------------------------------------------------------------------------------------- builder
class _Builder:
    """Reads fields out of an ordered list of documents (first wins, as an override does) and
    records where each value came from."""

    def __init__(self, fmt: Format, docs: list[ConfigDoc]):
        self.fmt = fmt
        self.docs = docs
        self.v: dict[str, Any] = {}
        self.sources: dict[str, FieldSource] = {}
        self.notes: list[str] = []
        self.issues: list[ConfigIssue] = []

    @property
    def main(self) -> ConfigDoc:
        return self.docs[0]

    def raw(self, key: str, docs: list[ConfigDoc] | None = None) -> tuple[Any, ConfigDoc | None]:
        parts = key.split(".")
        for doc in docs or self.docs:
            cur: Any = doc.data
            for p in parts:
                if not isinstance(cur, dict) or p not in cur:
                    break
                cur = cur[p]
            else:
                if cur is not None:
                    return cur, doc
        return None, None

    def where(self, key: str, doc: ConfigDoc | None) -> FieldSource:
        if doc is None:
            return FieldSource(key=key, default=True)
        line = line_of(doc.node, tuple(key.split("."))) if doc.node is not None else None
        return FieldSource(key=key, file=doc.path, line=line)

    def issue(
        self, severity: str, key: str | None, message: str, doc: ConfigDoc | None = None
    ) -> None:
        src = self.where(key, doc or self.main) if key else None
        self.issues.append(
            ConfigIssue(
                severity=severity,  # type: ignore[arg-type]
                key=key,
                message=message,
                file=src.file if src else self.main.path,
                line=src.line if src else None,
            )
        )

    def set(self, field: str, value: Any, source: FieldSource) -> None:
        self.v[field] = value
        self.sources[field] = source

    def take(
        self,
        field: str,
        keys: str | tuple[str, ...],
        kind: str,
        default: Any = None,
        docs: list[ConfigDoc] | None = None,
    ) -> Any:
        """Set `field` from the first of `keys` present; "auto" leaves it unknown; a value of the
        wrong kind is an issue; absent, the documented `default` (if any) is used and marked."""
        for key in (keys,) if isinstance(keys, str) else keys:
            value, doc = self.raw(key, docs)
            if doc is None:
                continue
            src = self.where(key, doc)
            if _is_auto(value):
                self.sources[field] = src.model_copy(update={"auto": True})
                return None
            out = self._convert(value, kind)
            if out is None:
                self.issue("error", key, f"{value!r} is not {_KIND_TEXT[kind]}", doc)
                return None
            self.set(field, out, src)
            return out
        if default is not None:
            first = keys if isinstance(keys, str) else keys[0]
            self.set(field, default, FieldSource(key=first, default=True))
        return default

    @staticmethod
    def _convert(value: Any, kind: str) -> Any:
        if kind == "str":
            return str(value) if isinstance(value, (str, int, float)) else None
        if kind == "bool":
            return _truthy(value)
        n = as_number(value)
        if n is None:
            return None
        if kind == "int":
            return int(n) if n == int(n) else None
        return n

    def derive(self, field: str, value: Any, key: str) -> None:
        self.set(field, value, FieldSource(key=key, derived=True))

    def view(self) -> TrainingView:
        auto: list[str] = []
        paths: dict[str, str] = {}
        placeholders: dict[str, list[str]] = {}
        for i, doc in enumerate(self.docs):
            tag = "" if i == 0 else f"{Path(doc.path).name}:"
            for keys, value in _walk(doc.data):
                key = ".".join(keys)
                if _is_auto(value):
                    auto.append(tag + key)
                if not isinstance(value, str):
                    continue
                found = _PLACEHOLDER.findall(value)
                if found:
                    placeholders[tag + key] = found
                if _looks_local(keys[-1] if keys else "", value):
                    paths[tag + key] = value
        return TrainingView(
            source_format=self.fmt,
            path=self.main.path,
            sources=self.sources,
            auto_fields=auto,
            paths=paths,
            placeholders=placeholders,
            files=[d.path for d in self.docs],
            notes=self.notes,
            issues=self.issues,
            **self.v,
        )


_KIND_TEXT = {"int": "a whole number", "float": "a number", "str": "a name", "bool": "true/false"}


# ------------------------------------------------------------------------------------ detection
_AXOLOTL_KEYS = {
    "micro_batch_size",
    "sequence_len",
    "adapter",
    "datasets",
    "num_epochs",
    "gradient_accumulation_steps",
    "load_in_8bit",
    "load_in_4bit",
}
_ACCELERATE_KEYS = {
    "distributed_type",
    "compute_environment",
    "deepspeed_config",
    "fsdp_config",
    "num_machines",
    "machine_rank",
    "main_training_function",
}
_DEEPSPEED_KEYS = {
    "zero_optimization",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "zero_allow_untested_optimizer",
}
_LITGPT_TOP = {"checkpoint_dir", "model_name", "model_config", "initial_checkpoint_dir"}
_SPEC_KEYS = {"command", "parameters", "search_space", "knobs", "resources", "environment", "code"}


def detect_format(path: str | Path | None, data: Any) -> Format | None:
    """Which kind of config a parsed file is, from its keys; None when it is none of them."""
    if not isinstance(data, dict):
        return None
    keys = {str(k) for k in data}
    upper = {k for k in keys if k.isupper() or k == "_BASE_"}
    if "_BASE_" in keys or (
        upper & {"MODEL", "SOLVER", "DATASETS", "INPUT"} and len(upper) * 2 > len(keys)
    ):
        return "detectron2"
    if keys & _DEEPSPEED_KEYS:
        return "deepspeed"
    if "base_model" in keys and keys & _AXOLOTL_KEYS:
        return "axolotl"
    if keys & _LITGPT_TOP and (isinstance(data.get("train"), dict) or "lora_r" in keys):
        return "litgpt"
    if keys & _ACCELERATE_KEYS or {"num_processes", "mixed_precision"} <= keys:
        return "accelerate"
    if "command" in keys or ("name" in keys and keys & _SPEC_KEYS):
        return "nightshift"
    if (
        path is not None
        and str(path).lower().endswith(".json")
        and isinstance(data.get("optimizer"), dict)
        and ("fp16" in keys or "bf16" in keys)
    ):
        return "deepspeed"
    return None


# -------------------------------------------------------------------------------------- formats
_ACCELERATE_PRECISION = {
    "no": "fp32",
    "fp16": "fp16-mixed",
    "bf16": "bf16-mixed",
    "fp8": "fp8-mixed",
}
_LITGPT_PRECISION = {
    "32-true": "fp32",
    "32": "fp32",
    "16-mixed": "fp16-mixed",
    "16-true": "fp16",
    "16": "fp16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bf16-true": "bf16",
    "bf16": "bf16-mixed",
    "transformer-engine": "fp8-mixed",
}
_FSDP_STAGE = {
    "full_shard": 3,
    "1": 3,
    "shard_grad_op": 2,
    "2": 2,
    "no_shard": 0,
    "3": 0,
    "hybrid_shard": 3,
    "4": 3,
    "_hybrid_shard_zero2": 2,
    "5": 2,
}


def _deepspeed(b: _Builder, docs: list[ConfigDoc], *, batch: bool = True) -> None:
    """DeepSpeed JSON: batch triple (train_batch_size = micro × accumulation × world size), the
    optimiser, fp16/bf16, ZeRO stage and offload."""
    if batch:
        b.take("micro_batch", "train_micro_batch_size_per_gpu", "int", docs=docs)
        b.take("grad_accum", "gradient_accumulation_steps", "int", docs=docs)
        b.take("global_batch", "train_batch_size", "int", docs=docs)
        b.take("optimizer", "optimizer.type", "str", docs=docs)
        b.take("learning_rate", "optimizer.params.lr", "float", docs=docs)
    if "precision" not in b.v and "precision" not in b.sources:
        for block, name in (("fp16", "fp16-mixed"), ("bf16", "bf16-mixed"), ("amp", "fp16-mixed")):
            enabled, doc = b.raw(f"{block}.enabled", docs)
            if doc is None:
                continue
            if _is_auto(enabled):
                b.sources["precision"] = b.where(f"{block}.enabled", doc).model_copy(
                    update={"auto": True}
                )
                break
            if _truthy(enabled):
                b.set("precision", name, b.where(f"{block}.enabled", doc))
                break
        else:
            if "precision" not in b.sources:
                b.set("precision", "fp32", FieldSource(key="fp16.enabled", default=True))
    stage = b.take("zero_stage", "zero_optimization.stage", "int", default=0, docs=docs)
    for field, key in (
        ("offload_optimizer", "zero_optimization.offload_optimizer.device"),
        ("offload_params", "zero_optimization.offload_param.device"),
    ):
        device, doc = b.raw(key, docs)
        if doc is not None and not _is_auto(device):
            b.set(field, str(device).lower() in ("cpu", "nvme"), b.where(key, doc))
        elif doc is None:
            legacy, ldoc = b.raw("zero_optimization.cpu_offload", docs)
            if field == "offload_optimizer" and ldoc is not None:
                b.set(field, bool(_truthy(legacy)), b.where("zero_optimization.cpu_offload", ldoc))
            else:
                b.set(field, False, FieldSource(key=key, default=True))
    if b.v.get("offload_params") and (stage or 0) < 3:
        b.issue(
            "warning",
            "zero_optimization.offload_param",
            f"parameter offload works only with ZeRO stage 3, not stage {stage}",
        )
    _, act_doc = b.raw("activation_checkpointing", docs)
    if act_doc is not None:
        b.notes.append(
            "the DeepSpeed activation_checkpointing section configures checkpointing that the "
            "model code must call; it is not counted as on"
        )


def _check_batch_triple(b: _Builder, key_of: dict[str, str]) -> None:
    """global = micro × accumulation × devices: fill the one unknown, report a contradiction."""
    g, m, a, d = (b.v.get(k) for k in ("global_batch", "micro_batch", "grad_accum", "devices"))
    gk, mk, ak = key_of["global_batch"], key_of["micro_batch"], key_of["grad_accum"]
    if g is not None and m is not None and a is not None:
        if d is not None and g != m * a * d:
            b.issue(
                "error",
                gk,
                f"{gk} {g} ≠ {mk} {m} × {ak} {a} × {d} GPUs = {m * a * d}; DeepSpeed refuses "
                "to start",
            )
        elif d is None and m * a and g % (m * a):
            b.issue(
                "error",
                gk,
                f"{gk} {g} is not a multiple of {mk} {m} × {ak} {a}: no GPU count makes it "
                "whole; DeepSpeed refuses to start",
            )
        elif d is None and m * a:
            b.derive("devices", g // (m * a), f"{gk} ÷ (micro × accumulation)")
    elif d is not None and m is not None and a is not None:
        b.derive("global_batch", m * a * d, f"{mk} × {ak} × devices")
    elif d is not None and g is not None and m is not None and m * d and g % (m * d) == 0:
        b.derive("grad_accum", g // (m * d), f"{gk} ÷ (micro × devices)")
    elif d is not None and g is not None and a is not None and a * d and g % (a * d) == 0:
        b.derive("micro_batch", g // (a * d), f"{gk} ÷ (accumulation × devices)")


_DS_KEYS = {
    "global_batch": "train_batch_size",
    "micro_batch": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
}


def _load_deepspeed(b: _Builder) -> None:
    _deepspeed(b, b.docs)
    _check_batch_triple(b, _DS_KEYS)
    b.notes.append("a DeepSpeed config names no model: the training script loads it")


def _referenced(b: _Builder, ref: str, key: str, doc: ConfigDoc, who: str) -> ConfigDoc | None:
    """Read a file a config points to (a DeepSpeed JSON); a missing one is a warning, since the
    launcher resolves it against its own working directory."""
    found, note = _locate(ref, doc.path)
    if found is None:
        b.issue(
            "warning",
            key,
            f"{ref} not found next to {Path(doc.path).name}; {who} resolves it against the "
            "directory it is launched from, so its settings are unknown here",
            doc,
        )
        return None
    if note:
        b.notes.append(note)
    try:
        ref_doc = read_config(found)
    except SpecError as exc:
        b.issue("error", key, str(exc), doc)
        return None
    b.docs.append(ref_doc)
    return ref_doc


def _load_accelerate(b: _Builder) -> None:
    main = b.main
    b.take("devices", "num_processes", "int")
    mixed, mdoc = b.raw("mixed_precision")
    dist = str(b.raw("distributed_type")[0] or "").upper()
    if mdoc is not None:
        mapped = _ACCELERATE_PRECISION.get(str(mixed).lower())
        if mapped is None:
            b.issue(
                "error", "mixed_precision", f"{mixed!r} is not one of no, fp16, bf16, fp8", mdoc
            )
        else:
            b.set("precision", mapped, b.where("mixed_precision", mdoc))
    if dist == "DEEPSPEED" or isinstance(main.data.get("deepspeed_config"), dict):
        ref, rdoc = b.raw("deepspeed_config.deepspeed_config_file")
        ds_doc = None
        if rdoc is not None:
            ds_doc = _referenced(
                b, str(ref), "deepspeed_config.deepspeed_config_file", rdoc, "accelerate launch"
            )
        if ds_doc is not None:
            _deepspeed(b, [ds_doc])
            _check_batch_triple(b, _DS_KEYS)
        else:
            b.take("grad_accum", "deepspeed_config.gradient_accumulation_steps", "int", docs=[main])
            if rdoc is None:
                b.take("zero_stage", "deepspeed_config.zero_stage", "int", docs=[main])
                for field, key in (
                    ("offload_optimizer", "deepspeed_config.offload_optimizer_device"),
                    ("offload_params", "deepspeed_config.offload_param_device"),
                ):
                    device, ddoc = b.raw(key, [main])
                    if ddoc is not None:
                        b.set(field, str(device).lower() in ("cpu", "nvme"), b.where(key, ddoc))
    if dist == "FSDP" or isinstance(main.data.get("fsdp_config"), dict):
        strategy, sdoc = b.raw("fsdp_config.fsdp_sharding_strategy")
        reshard, rdoc2 = b.raw("fsdp_config.fsdp_reshard_after_forward")
        if sdoc is not None:
            stage = _FSDP_STAGE.get(str(strategy).lower())
            if stage is not None:
                b.set("zero_stage", stage, b.where("fsdp_config.fsdp_sharding_strategy", sdoc))
                b.notes.append(f"FSDP {strategy} shards like ZeRO stage {stage}")
        elif rdoc2 is not None:
            stage = 3 if _truthy(reshard) else 2
            b.set("zero_stage", stage, b.where("fsdp_config.fsdp_reshard_after_forward", rdoc2))
            b.notes.append(f"FSDP2 reshard_after_forward={reshard}: shards like ZeRO stage {stage}")
        off, odoc = b.raw("fsdp_config.fsdp_offload_params")
        if odoc is not None:
            on = bool(_truthy(off))
            src = b.where("fsdp_config.fsdp_offload_params", odoc)
            b.set("offload_params", on, src)
            b.set("offload_optimizer", on, src)
        b.take("activation_checkpointing", "fsdp_config.fsdp_activation_checkpointing", "bool")
    b.notes.append(
        "an accelerate launch config sets devices, precision and sharding; the model, optimiser, "
        "learning rate and batch live in the training script"
    )


# PEFT module names (Llama, GPT-2, GPT-NeoX) → the view's adapter targets.
_LORA_MODULES = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "c_attn": "qkv",
    "query_key_value": "qkv",
    "lm_head": "lm_head",
    "all-linear": "all-linear",
}


def _lora_targets_axolotl(b: _Builder) -> list[str]:
    if _truthy(b.raw("lora_target_linear")[0]):
        return ["all-linear"]
    mods, _ = b.raw("lora_target_modules")
    if isinstance(mods, str):
        mods = [mods]
    return [_LORA_MODULES.get(str(m), str(m)) for m in (mods or [])]


def _load_axolotl(b: _Builder) -> None:
    model = b.take("model", "base_model", "str")
    if model:
        b.set("init", "pretrained", b.sources["model"])
        b.v["init_from"] = model
    if _truthy(b.raw("load_in_4bit")[0]) or str(b.raw("adapter")[0]).lower() == "qlora":
        b.set("quantization", "4bit", b.where(*_first(b, ("load_in_4bit", "adapter"))))
    elif _truthy(b.raw("load_in_8bit")[0]):
        b.set("quantization", "int8", b.where(*_first(b, ("load_in_8bit",))))
    adapter, adoc = b.raw("adapter")
    if adoc is not None and str(adapter).lower() in ("lora", "qlora"):
        lora = LoraView(
            rank=b.take("_lora_r", "lora_r", "int"),
            alpha=b.take("_lora_alpha", "lora_alpha", "float"),
            dropout=b.take("_lora_dropout", "lora_dropout", "float"),
            targets=_lora_targets_axolotl(b),
            modules_to_save=[str(m) for m in (b.raw("lora_modules_to_save")[0] or [])],
        )
        b.set("lora", lora, b.where("adapter", adoc))
    b.take("seq_len", "sequence_len", "int")
    micro = b.take("micro_batch", "micro_batch_size", "int")
    accum = b.take("grad_accum", "gradient_accumulation_steps", "int")
    if accum is None and "grad_accum" not in b.sources:
        total, tdoc = b.raw("batch_size")
        if tdoc is not None and micro and as_number(total):
            b.derive(
                "grad_accum", int(as_number(total) or 0) // micro, "batch_size ÷ micro_batch_size"
            )
        else:
            b.set("grad_accum", 1, FieldSource(key="gradient_accumulation_steps", default=True))
    b.take("epochs", "num_epochs", "float")
    b.take("max_steps", "max_steps", "int")
    b.take("learning_rate", "learning_rate", "float")
    b.take("optimizer", "optimizer", "str")
    # axolotl loads the weights in bf16/fp16 when asked (torch_dtype), so training is 16 bit
    # throughout; "auto" picks bf16 where the GPU supports it.
    for key, name in (
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
    ):
        value, doc = b.raw(key)
        if doc is None:
            continue
        if _is_auto(value):
            b.sources["precision"] = b.where(key, doc).model_copy(update={"auto": True})
            break
        if _truthy(value):
            b.set("precision", name, b.where(key, doc))
            break
    else:
        if "precision" not in b.sources:
            b.set("precision", "fp32", FieldSource(key="bf16", default=True))
    ckpt, cdoc = b.raw("gradient_checkpointing")
    if cdoc is not None:
        b.set(
            "activation_checkpointing",
            _truthy(ckpt) is not False,
            b.where("gradient_checkpointing", cdoc),
        )
    b.take("seed", "seed", "int", default=42)  # Hugging Face TrainingArguments' default seed
    ds, ddoc = b.raw("deepspeed")
    if ddoc is not None and isinstance(ds, str):
        ds_doc = _referenced(b, ds, "deepspeed", ddoc, "axolotl")
        if ds_doc is not None:
            _deepspeed(b, [ds_doc], batch=False)
    if isinstance(b.raw("fsdp")[0], list) or b.raw("fsdp_config")[1] is not None:
        b.notes.append("axolotl FSDP settings are not mapped; sharding is not counted")
    b.notes.append(
        "axolotl leaves the GPU count to the launcher: global batch = micro_batch_size × "
        "gradient_accumulation_steps × GPUs"
    )


def _first(b: _Builder, keys: tuple[str, ...]) -> tuple[str, ConfigDoc | None]:
    for k in keys:
        _, doc = b.raw(k)
        if doc is not None:
            return k, doc
    return keys[0], None


def _load_litgpt(b: _Builder) -> None:
    name, ndoc = b.raw("model_name")
    ckpt, cdoc = b.raw("checkpoint_dir")
    init_ckpt, idoc = b.raw("initial_checkpoint_dir")
    if cdoc is not None:  # finetune/*.yaml: the base model is the checkpoint being fine-tuned
        model = re.sub(r"^(\./)?checkpoints/", "", str(ckpt))
        b.set("model", model, b.where("checkpoint_dir", cdoc))
        b.set("init", "pretrained", b.where("checkpoint_dir", cdoc))
        b.v["init_from"] = str(ckpt)
    elif ndoc is not None:  # pretrain.yaml
        b.set("model", str(name), b.where("model_name", ndoc))
        if idoc is not None:
            b.set("init", "pretrained", b.where("initial_checkpoint_dir", idoc))
            b.v["init_from"] = str(init_ckpt)
        else:
            b.set("init", "scratch", FieldSource(key="initial_checkpoint_dir", default=True))
    for field, keys in (
        ("hidden", "model_config.n_embd"),
        ("layers", "model_config.n_layer"),
        ("heads", "model_config.n_head"),
        ("kv_heads", "model_config.n_query_groups"),
        ("intermediate", "model_config.intermediate_size"),
        ("vocab", ("model_config.padded_vocab_size", "model_config.vocab_size")),
    ):
        b.take(field, keys, "int")
    mlp, mdoc = b.raw("model_config.mlp_class_name")
    if mdoc is not None:
        b.set(
            "mlp_gated",
            str(mlp) in ("LLaMAMLP", "GemmaMLP", "LLaMAMoE"),
            b.where("model_config.mlp_class_name", mdoc),
        )
    prec, pdoc = b.raw("precision")
    if pdoc is not None:
        mapped = _LITGPT_PRECISION.get(str(prec).lower())
        if mapped is None:
            b.issue(
                "error",
                "precision",
                f"{prec!r} is not a Lightning precision (bf16-true, "
                "bf16-mixed, 16-mixed, 32-true…)",
                pdoc,
            )
        else:
            b.set("precision", mapped, b.where("precision", pdoc))
    quant, qdoc = b.raw("quantize")
    if qdoc is not None:
        q = str(quant).lower()
        b.set("quantization", "int8" if "int8" in q else "4bit", b.where("quantize", qdoc))
    dev, ddoc = b.raw("devices")
    nodes = b.take("_nodes", "num_nodes", "int", default=1) or 1
    if ddoc is None:
        b.set("devices", nodes, FieldSource(key="devices", default=True))
    elif _is_auto(dev) or as_number(dev) == -1:
        b.sources["devices"] = b.where("devices", ddoc).model_copy(update={"auto": True})
        b.notes.append(f"devices {dev!r}: every GPU the machine has, known only at launch")
    elif (n := as_number(dev)) is not None and n == int(n) and n > 0:
        b.set("devices", int(n) * nodes, b.where("devices", ddoc))
    else:
        b.issue("error", "devices", f"{dev!r} is not a GPU count", ddoc)
    if any(k.startswith("lora_") for k in b.main.data):
        flags = {
            "q": ("lora_query", True),
            "k": ("lora_key", False),
            "v": ("lora_value", True),
            "o": ("lora_projection", False),
            "mlp": ("lora_mlp", False),
            "lm_head": ("lora_head", False),
        }
        targets = []
        for target, (key, default) in flags.items():
            value, doc = b.raw(key)
            if _truthy(value) if doc is not None else default:
                targets.append(target)
        lora = LoraView(
            rank=b.take("_lora_r", "lora_r", "int", default=8),
            alpha=b.take("_lora_alpha", "lora_alpha", "float", default=16),
            dropout=b.take("_lora_dropout", "lora_dropout", "float", default=0.05),
            targets=targets,
        )
        b.set("lora", lora, b.where(*_first(b, ("lora_r", "lora_alpha"))))
    b.take("global_batch", "train.global_batch_size", "int")
    b.take("micro_batch", "train.micro_batch_size", "int")
    b.take("epochs", "train.epochs", "float")
    b.take("max_steps", "train.max_steps", "int")
    b.take("seq_len", "train.max_seq_length", "int")
    g, m, d = b.v.get("global_batch"), b.v.get("micro_batch"), b.v.get("devices")
    if None not in (g, m, d) and m and d:
        if g % (m * d):
            b.issue(
                "warning",
                "train.global_batch_size",
                f"global_batch_size {g} is not a multiple of micro_batch_size {m} × {d} "
                f"devices; LitGPT rounds the accumulation down to {g // d // m}",
            )
        b.derive(
            "grad_accum",
            max(1, g // d // m),
            "train.global_batch_size ÷ devices ÷ micro_batch_size",
        )
    opt, odoc = b.raw("optimizer")
    if isinstance(opt, dict):
        b.take("optimizer", "optimizer.class_path", "str")
        b.take("learning_rate", ("optimizer.init_args.lr", "train.learning_rate"), "float")
    elif odoc is not None:
        b.take("optimizer", "optimizer", "str")
        b.take("learning_rate", "train.learning_rate", "float")
    else:
        b.set("optimizer", "AdamW", FieldSource(key="optimizer", default=True))
        b.take("learning_rate", "train.learning_rate", "float")
    b.take("seed", "seed", "int", default=1337)  # LitGPT's documented default


def _load_detectron2(b: _Builder) -> None:
    seen = {str(Path(b.main.path).resolve())}
    doc = b.main
    while True:
        ref = doc.data.get("_BASE_")
        if ref is None:
            break
        found, note = _locate(str(ref), doc.path)
        if found is None:
            raise SpecError(
                f"_BASE_ {ref} not found (resolved against {Path(doc.path).parent})",
                path=doc.path,
                field="_BASE_",
                line=line_of(doc.node, ("_BASE_",)),
            )
        if str(found.resolve()) in seen:
            raise SpecError(f"_BASE_ {ref} includes itself", path=doc.path, field="_BASE_")
        seen.add(str(found.resolve()))
        if note:
            b.notes.append(note)
        doc = read_config(found)
        b.docs.append(doc)
    b.take("learning_rate", "SOLVER.BASE_LR", "float", default=0.001)
    b.take("global_batch", "SOLVER.IMS_PER_BATCH", "int", default=16)
    b.take("max_steps", "SOLVER.MAX_ITER", "int", default=40000)
    b.set("grad_accum", 1, FieldSource(key="SOLVER", default=True))
    b.set("optimizer", "SGD", FieldSource(key="SOLVER.MOMENTUM", default=True))
    b.take("momentum", "SOLVER.MOMENTUM", "float", default=0.9)
    b.notes.append("detectron2's default trainer builds SGD with SOLVER.MOMENTUM")
    amp, adoc = b.raw("SOLVER.AMP.ENABLED")
    if adoc is not None and _truthy(amp):
        b.set("precision", "fp16-mixed", b.where("SOLVER.AMP.ENABLED", adoc))
    else:
        b.set(
            "precision",
            "fp32",
            b.where("SOLVER.AMP.ENABLED", adoc)
            if adoc
            else FieldSource(key="SOLVER.AMP.ENABLED", default=True),
        )
    seed = b.take("seed", "SEED", "int", default=-1)
    if seed is not None and seed < 0:
        b.v["seed"] = None
        b.notes.append(f"SEED {seed}: detectron2 draws a random seed for every run")
    arch, _ = b.raw("MODEL.META_ARCHITECTURE")
    backbone, _ = b.raw("MODEL.BACKBONE.NAME")
    depth = b.take("_depth", "MODEL.RESNETS.DEPTH", "int", default=50)
    arch = str(arch or "GeneralizedRCNN")
    backbone = str(backbone or "build_resnet_backbone")
    b.v["model_kind"] = "cnn"
    if "resnet" in backbone.lower():
        desc = f"ResNet-{depth}" + (" FPN" if "fpn" in backbone.lower() else "")
        b.set(
            "model",
            f"{arch} ({desc} backbone)",
            b.where("MODEL.RESNETS.DEPTH", b.raw("MODEL.RESNETS.DEPTH")[1]),
        )
        known = lookup_model(f"resnet-{depth}")
        if known is not None:
            b.v["params"] = known.params
            b.v["params_source"] = "table"
            b.sources["params"] = FieldSource(key=f"model table: {known.name}", derived=True)
            b.notes.append(
                f"parameter count is the ResNet-{depth} backbone's (torchvision, with its ImageNet "
                "classifier); FPN, RPN and ROI heads are not counted"
            )
    else:
        b.set("model", f"{arch} ({backbone})", FieldSource(key="MODEL.BACKBONE.NAME"))
    weights, wdoc = b.raw("MODEL.WEIGHTS")
    if wdoc is not None and str(weights).strip():
        b.set("init", "pretrained", b.where("MODEL.WEIGHTS", wdoc))
        b.v["init_from"] = str(weights)
    else:
        b.set("init", "scratch", FieldSource(key="MODEL.WEIGHTS", default=True))
    steps, sdoc = b.raw("SOLVER.STEPS")
    steps = _tuple(steps)
    max_iter = b.v.get("max_steps")
    if sdoc is not None and isinstance(steps, (tuple, list)) and max_iter:
        late = [s for s in steps if isinstance(s, (int, float)) and s >= max_iter]
        if late:
            b.issue(
                "warning",
                "SOLVER.STEPS",
                f"LR decay at {late} never happens: MAX_ITER is {max_iter}",
                sdoc,
            )
    ref_world = b.take("_ref_world", "SOLVER.REFERENCE_WORLD_SIZE", "int")
    if ref_world:
        b.notes.append(
            f"REFERENCE_WORLD_SIZE {ref_world}: detectron2 rescales the batch and LR "
            "to the GPUs it is launched on"
        )
    b.notes.append(
        "IMS_PER_BATCH is the batch across all GPUs; detectron2 takes the GPU count from "
        "--num-gpus at launch, so the per-GPU batch is IMS_PER_BATCH ÷ GPUs"
    )


def _load_spec_view(b: _Builder) -> TrainingView:
    spec = validate(ExperimentSpec, b.main.data, path=b.main.path, node=b.main.node)
    spec.base_dir = str(Path(b.main.path).resolve().parent)
    return view_from_spec(spec, path=b.main.path, node=b.main.node)


_LOADERS = {
    "accelerate": _load_accelerate,
    "deepspeed": _load_deepspeed,
    "axolotl": _load_axolotl,
    "litgpt": _load_litgpt,
    "detectron2": _load_detectron2,
}


def _finish(b: _Builder) -> TrainingView:
    """Fill the model's dimensions and parameter count from the table or the config's dimensions;
    size the LoRA adapters; drop the builder's scratch fields."""
    for k in [k for k in b.v if k.startswith("_")]:
        b.v.pop(k)
        b.sources.pop(k, None)
    view = b.view()
    return complete_view(view)


def complete_view(view: TrainingView) -> TrainingView:
    """Dimensions from the model table where the config does not give them, the parameter count
    (declared > table > dimensions > unknown), and the LoRA adapters' size."""
    known = lookup_model(view.model) if view.model else None
    if known is not None and view.params_source != "table":
        for field in (
            "hidden",
            "layers",
            "heads",
            "kv_heads",
            "intermediate",
            "vocab",
            "mlp_gated",
        ):
            if getattr(view, field) is None and getattr(known, field) is not None:
                setattr(view, field, getattr(known, field))
                view.sources[field] = FieldSource(key=f"model table: {known.name}", derived=True)
        if view.model_kind is None:
            view.model_kind = known.kind
        if view.params is None:
            view.params, view.params_source = known.params, "table"
            view.sources["params"] = FieldSource(key=f"model table: {known.name}", derived=True)
    if view.params is None and view.hidden and view.layers and view.vocab:
        view.params = params_from_dimensions(
            view.hidden,
            view.layers,
            view.vocab,
            heads=view.heads,
            kv_heads=view.kv_heads,
            intermediate=view.intermediate,
            mlp_gated=view.mlp_gated,
        )
        view.params_source = "dimensions"
        view.sources["params"] = FieldSource(key="hidden, layers, vocab", derived=True)
        if view.model_kind is None:
            view.model_kind = "transformer"
    if view.params is None and view.model:
        view.notes.append(
            f"model {view.model!r} is not in the model table and the config gives "
            "no dimensions: parameter count unknown"
        )
    if view.lora is not None and view.lora.trainable_params is None:
        view.lora.trainable_params = lora_trainable_params(view, view.lora)
    return view


def lora_trainable_params(view: TrainingView, lora: LoraView) -> int | None:
    """Adapter parameters, r × (in + out) per adapted matrix per layer, plus modules trained in full
    (`embed_tokens`, `lm_head`: vocab × hidden each). None when a dimension or target is unknown."""
    h, n_layers, r = view.hidden, view.layers, lora.rank
    if not h or not n_layers or not r:
        return None
    kv_dim = h * view.kv_heads // view.heads if view.heads and view.kv_heads else h
    inter = view.intermediate or 4 * h
    shapes: dict[str, tuple[int, int]] = {
        "q": (h, h),
        "k": (h, kv_dim),
        "v": (h, kv_dim),
        "o": (h, h),
        "qkv": (h, h + 2 * kv_dim),
    }
    if view.mlp_gated:
        mlp = {"gate": (h, inter), "up": (h, inter), "down": (inter, h)}
    else:
        mlp = {"fc": (h, inter), "proj": (inter, h)}
    shapes.update(mlp)
    per_layer_targets: list[str] = []
    total = 0
    for t in lora.targets:
        if t == "all-linear":
            per_layer_targets += ["q", "k", "v", "o", *mlp]
        elif t == "mlp":
            per_layer_targets += list(mlp)
        elif t == "lm_head":
            if not view.vocab:
                return None
            total += r * (h + view.vocab)
        elif t in shapes:
            per_layer_targets.append(t)
        else:
            return None
    total += n_layers * sum(
        r * (i + o) for i, o in (shapes[t] for t in dict.fromkeys(per_layer_targets))
    )
    for module in lora.modules_to_save:
        if module in ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out") and view.vocab:
            total += view.vocab * h
        else:
            return None
    return total


# ------------------------------------------------------------------------------ experiment spec
def _param(
    spec: ExperimentSpec, names: tuple[str, ...], knob: str | None = None
) -> tuple[str, Any] | None:
    if knob is not None and knob in spec.parameters:
        return knob, spec.parameters[knob]
    for name in names:
        if name in spec.parameters:
            return name, spec.parameters[name]
    return None


def view_from_spec(
    spec: ExperimentSpec, *, path: str | None = None, node: yaml.Node | None = None
) -> TrainingView:
    """A view of an experiment spec's parameters, found by the knobs and the usual names."""
    sources: dict[str, FieldSource] = {}
    v: dict[str, Any] = {}

    def put(field: str, names: tuple[str, ...], kind: str, knob: str | None = None) -> Any:
        found = _param(spec, names, knob)
        if found is None:
            return None
        name, raw = found
        value = _Builder._convert(raw, kind)
        if value is None:
            return None
        v[field] = value
        line = line_of(node, ("parameters", name)) if node is not None else None
        sources[field] = FieldSource(key=f"parameters.{name}", file=path, line=line)
        return value

    put("model", MODEL_NAME, "str")
    put("optimizer", OPTIMIZER, "str")
    put("precision", PRECISION, "str")
    put("learning_rate", LEARNING_RATE, "float", spec.knobs.learning_rate)
    put("micro_batch", MICRO_BATCH, "int", spec.knobs.micro_batch)
    put("grad_accum", GRAD_ACCUM, "int", spec.knobs.grad_accum)
    put("seq_len", SEQ_LEN, "int")
    put("hidden", HIDDEN, "int")
    put("layers", LAYERS, "int")
    put("heads", HEADS, "int")
    put("vocab", VOCAB, "int")
    put("epochs", EPOCHS, "float")
    put("max_steps", MAX_STEPS, "int")
    put("zero_stage", ZERO_STAGE, "int")
    put("activation_checkpointing", ACT_CKPT, "bool")
    put("momentum", ("momentum",), "float")
    for names, scale in ((PARAMS_MILLIONS, 1e6), (PARAMS_BILLIONS, 1e9), (PARAMS_COUNT, 1.0)):
        found = _param(spec, names)
        if found is not None and (n := as_number(found[1])) is not None and n > 0:
            v["params"], v["params_source"] = int(round(n * scale)), "declared"
            sources["params"] = FieldSource(key=f"parameters.{found[0]}", file=path)
            break
    notes: list[str] = []
    rank = _param(spec, LORA_RANK)
    if rank is not None and (r := as_number(rank[1])):
        alpha = _param(spec, LORA_ALPHA)
        given = _param(spec, ("lora_target_modules", "lora_targets"))
        if given is not None:
            modules = [given[1]] if isinstance(given[1], str) else list(given[1] or [])
            targets = [_LORA_MODULES.get(str(m), str(m)) for m in modules]
        else:
            targets = ["q", "v"]
            notes.append("no lora_target_modules parameter: PEFT's default for Llama, q and v")
        v["lora"] = LoraView(
            rank=int(r), alpha=as_number(alpha[1]) if alpha else None, targets=targets
        )
        sources["lora"] = FieldSource(key=f"parameters.{rank[0]}", file=path)
    if spec.resources.gpus > 0:
        v["devices"] = spec.resources.gpus
        sources["devices"] = FieldSource(key="resources.gpus", file=path)
    seed = (
        spec.seed
        if spec.seed is not None
        else _Builder._convert(spec.parameters.get("seed"), "int")
    )
    if seed is not None:
        v["seed"] = seed
        key = "seed" if spec.seed is not None else "parameters.seed"
        line = line_of(node, tuple(key.split("."))) if node is not None else None
        sources["seed"] = FieldSource(key=key, file=path, line=line)
    m, a, d = v.get("micro_batch"), v.get("grad_accum"), v.get("devices")
    if m is not None and d is not None:
        v["global_batch"] = m * (a or 1) * d
        sources["global_batch"] = FieldSource(
            key="micro × accumulation × resources.gpus", derived=True
        )
    view = TrainingView(
        source_format="nightshift",
        path=path,
        sources=sources,
        files=[path] if path else [],
        notes=notes,
        **v,
    )
    return complete_view(view)


# ---------------------------------------------------------------------------------------- entry
def load_training_view(path: str | Path, format: Format | None = None) -> TrainingView:
    """Read a training config of any supported format (detected from its keys unless `format` is
    given) into a TrainingView. Raises SpecError when the file cannot be read, is not a known
    format, or (an experiment spec) fails its schema."""
    doc = read_config(path)
    fmt = format or detect_format(path, doc.data)
    if fmt is None:
        raise SpecError(
            "not a recognised training config (accelerate, DeepSpeed, axolotl, LitGPT, "
            "detectron2) nor a nightshift experiment spec",
            path=str(path),
        )
    b = _Builder(fmt, [doc])
    if fmt == "nightshift":
        return _load_spec_view(b)
    _LOADERS[fmt](b)
    return _finish(b)
