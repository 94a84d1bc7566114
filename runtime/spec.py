"""The experiment spec: what a researcher declares about a run, validated before anything starts."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nightshift.runtime.errors import SpecError
from nightshift.runtime.yamlfile import load_model_text

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Filled by nightshift itself, never by a parameter.
BUILTIN_PLACEHOLDERS = {"python", "checkpoint_dir", "metrics_file", "run_dir", "checkpoint", "step"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CodeSpec(_Strict):
    path: str | None = Field(
        None, description="Working directory of the run (relative to the spec file)"
    )
    git: str | None = None
    commit: str | None = None


class Mount(_Strict):
    source: str = Field(
        description="Host folder (checked against the policy's allowed mount roots)"
    )
    target: str = Field(description="Absolute path inside the container")
    read_only: bool = True


class EnvironmentSpec(_Strict):
    image: str | None = Field(None, description="Container image, pinned by tag or digest")
    python: str | None = Field(
        None, description="Interpreter for {python}; default: the one running nightshift"
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables")
    mounts: list[Mount] = Field(default_factory=list, description="Data folders for container runs")
    network_mode: str | None = Field(
        None, description="Container network; default: executor.network_mode"
    )


class Resources(_Strict):
    gpus: int = Field(0, ge=0, description="GPUs the run needs; 0 runs on the CPU")
    gpu_memory_gb: float | None = Field(None, gt=0)
    host_memory_gb: float | None = Field(None, gt=0)
    expected_duration_min: float | None = Field(None, gt=0)
    power_w: float | None = Field(
        None, gt=0, description="Declared draw, for energy where no meter exists"
    )
    share_gpu: bool = False
    gpu_memory_cap_gb: float | None = Field(None, gt=0)


class CheckpointSpec(_Strict):
    dir: str = Field(
        description="Folder the run writes checkpoints into, or a framework's run "
        "root above them (relative to the run dir); searched a few levels deep"
    )
    resume_arg: list[str] = Field(
        default_factory=lambda: ["--resume", "{checkpoint}"],
        description="argv appended on resume; {checkpoint} is the path",
    )
    every_steps: int | None = Field(None, gt=0)
    steps_per_epoch: int | None = Field(
        None,
        gt=0,
        description="For checkpoints that record only an epoch: step = epoch x steps_per_epoch",
    )
    keep_good: int = Field(
        1,
        ge=0,
        le=100,
        description="Confirmed generations of nightshift's "
        "own copies of checkpoints taken while the metrics were finite (in the "
        "job's folder, so a diverged or torn overwrite is never the only copy; "
        "newer unconfirmed copies are kept too); 0: keep none",
    )


class DivergenceSpec(_Strict):
    """Stop a run while it runs once its metrics diverge (tune_lr's rules), before it overwrites
    good checkpoints with bad weights."""

    enabled: bool = True
    window: int = Field(20, ge=1, le=10_000, description="Points averaged to smooth metrics.name")
    k: float = Field(
        4.0,
        gt=1,
        allow_inf_nan=False,
        description="Diverged when the smoothed metric exceeds k x its running "
        "minimum (mode min only); any non-finite value diverges at once",
    )
    also: list[str] = Field(
        default_factory=lambda: ["grad_norm"],
        description="Other metrics whose non-finite value means divergence",
    )


MetricSource = Literal["auto", "jsonl", "log", "lightning_csv", "hf_trainer_state", "tensorboard"]


class MetricSpec(_Strict):
    source: MetricSource = Field(
        "auto",
        description="Where metrics come from. auto: the JSONL file if it appears, the "
        "regexes over the log if given, and Lightning metrics.csv, Hugging Face "
        "trainer_state.json and TensorBoard event files found in the job's folder",
    )
    file: str | None = Field(
        "metrics.jsonl",
        description="The JSONL file ({metrics_file}); for "
        "the other file sources, the file or folder to read (relative to "
        "the job's folder)",
    )
    name: str = Field(
        "loss",
        description="The metric watched for progress, early stopping, divergence and reports",
    )
    mode: Literal["min", "max"] = "min"
    regex: str | list[str] | None = Field(
        None,
        description="Regexes over the run's stdout/stderr: groups step and value (value is "
        "metrics.name), or step and any named metrics, e.g. "
        "'iter (?P<step>\\d+): loss (?P<loss>\\S+)'; several for train and eval lines",
    )
    progress: Literal["either", "metrics", "output"] = Field(
        "either",
        description="What counts as progress for stall_min: a new metric point, new "
        "log output, or either",
    )
    divergence: DivergenceSpec = DivergenceSpec()

    @field_validator("regex")
    @classmethod
    def _regexes_compile(cls, v: str | list[str] | None) -> str | list[str] | None:
        for i, pattern in enumerate([v] if isinstance(v, str) else v or []):
            where = "" if isinstance(v, str) else f"[{i}]"
            try:
                rx = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"regex{where} does not compile: {exc}") from None
            groups = set(rx.groupindex)
            if "step" not in groups or len(groups) < 2:
                raise ValueError(
                    f"regex{where} needs a named group 'step' and at least one "
                    "more: 'value' (for metrics.name) or a metric's name, e.g. "
                    "(?P<step>\\d+) ... (?P<loss>\\S+)"
                )
        return v

    def regexes(self) -> list[str]:
        return [self.regex] if isinstance(self.regex, str) else list(self.regex or [])


class EarlyStopSpec(_Strict):
    patience: int = Field(5, ge=1, description="Evaluations of metrics.name without improvement")
    min_delta: float = Field(0.0, ge=0)
    median_rule: bool = Field(
        False,
        description="Also stop a trial worse than the median of its "
        "sibling trials (same sweep) at the same step",
    )
    min_siblings: int = Field(3, ge=1)
    grace_steps: int = Field(0, ge=0, description="No early stop before this step")


class Knobs(_Strict):
    """Which parameters recovery may change, so it never has to guess."""

    learning_rate: str | None = None
    micro_batch: str | None = None
    grad_accum: str | None = None


class ExperimentSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    code: CodeSpec = CodeSpec()
    environment: EnvironmentSpec = EnvironmentSpec()
    command: list[str] = Field(min_length=1, description="argv template with {param} placeholders")
    parameters: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, Any] | None = None
    resources: Resources = Resources()
    checkpoint: CheckpointSpec | None = None
    metrics: MetricSpec = MetricSpec()
    early_stopping: EarlyStopSpec | None = None
    priority: int = 0
    cost_class: Literal["urgent", "cost_sensitive"] = "urgent"
    retries: int = Field(2, ge=0, le=100)
    retry_wait_s: float | None = Field(
        None,
        ge=0,
        description="Wait before the first retry "
        "(then doubling, as the config's retry section says); "
        "default: retry.base_s, 30 s",
    )
    timeout_min: float | None = Field(None, gt=0)
    stall_min: float | None = Field(None, gt=0)
    depends_on: list[str] = Field(default_factory=list)
    deadline: str | None = None
    pausable: bool = True
    seed: int | None = None
    knobs: Knobs = Knobs()

    # Where the spec was loaded from; relative paths resolve against it. Not part of the user's file.
    base_dir: str | None = Field(None, exclude=True)

    @field_validator("command")
    @classmethod
    def _argv_not_shell(cls, v: list[str]) -> list[str]:
        if len(v) == 1 and " " in v[0].strip():
            raise ValueError(
                "command is an argv list, not a shell string: split it into items, "
                "e.g. ['python', 'train.py', '--lr', '{lr}']"
            )
        return v

    @model_validator(mode="after")
    def _knobs_name_parameters(self) -> ExperimentSpec:
        for knob, param in self.knobs.model_dump().items():
            if param is not None and param not in self.parameters:
                raise ValueError(
                    f"knobs.{knob} names parameter '{param}', which is not in parameters"
                )
        return self

    def grid(self) -> list[dict[str, Any]]:
        """One parameter set per trial: the cartesian product of the list-valued search_space
        entries over the defaults in parameters (no search space: one trial, the defaults)."""
        axes = {k: v for k, v in (self.search_space or {}).items() if isinstance(v, list) and v}
        trials = [dict(self.parameters)]
        for name, values in axes.items():
            trials = [{**t, name: v} for t in trials for v in values]
        return trials

    def placeholders(self) -> set[str]:
        names: set[str] = set()
        for item in self.command:
            names |= {n for _, n, _, _ in string.Formatter().parse(item) if n}
        return names

    def unfilled_placeholders(self, params: dict[str, Any] | None = None) -> set[str]:
        return self.placeholders() - set(params or self.parameters) - BUILTIN_PLACEHOLDERS

    def run_dir(self) -> Path:
        base = Path(self.base_dir or ".")
        return (base / self.code.path).resolve() if self.code.path else base.resolve()

    def render(self, params: dict[str, Any], builtins: dict[str, str]) -> list[str]:
        """Fill the argv template; every item stays one argv element (no shell, no splitting)."""
        values = {**{k: _fmt(v) for k, v in params.items()}, **builtins}
        missing = self.placeholders() - set(values)
        if missing:
            raise SpecError(
                f"placeholders {sorted(missing)} are filled by no parameter; add them to "
                "parameters",
                field="command",
            )
        return [PLACEHOLDER.sub(lambda m: values[m.group(1)], item) for item in self.command]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def load_spec(path: str | Path) -> ExperimentSpec:
    return load_spec_text(path)[0]


def load_spec_text(path: str | Path) -> tuple[ExperimentSpec, str]:
    """The spec and the file's text, read once."""
    spec, text = load_model_text(ExperimentSpec, path)
    spec.base_dir = str(Path(path).resolve().parent)
    return spec, text
