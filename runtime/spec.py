"""The experiment spec: what a researcher declares about a run, validated before anything starts."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nightshift.runtime.errors import SpecError
from nightshift.runtime.yamlfile import load_model

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Filled by nightshift itself, never by a parameter.
BUILTIN_PLACEHOLDERS = {"python", "checkpoint_dir", "metrics_file", "run_dir", "checkpoint", "step"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CodeSpec(_Strict):
    path: str | None = Field(None, description="Working directory of the run (relative to the spec file)")
    git: str | None = None
    commit: str | None = None


class Mount(_Strict):
    source: str = Field(description="Host folder (checked against the policy's allowed mount roots)")
    target: str = Field(description="Absolute path inside the container")
    read_only: bool = True


class EnvironmentSpec(_Strict):
    image: str | None = Field(None, description="Container image, pinned by tag or digest")
    python: str | None = Field(None, description="Interpreter for {python}; default: the one running nightshift")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables")
    mounts: list[Mount] = Field(default_factory=list, description="Data folders for container runs")
    network_mode: str | None = Field(None, description="Container network; default: executor.network_mode")


class Resources(_Strict):
    gpus: int = Field(0, ge=0, description="GPUs the run needs; 0 runs on the CPU")
    gpu_memory_gb: float | None = Field(None, gt=0)
    host_memory_gb: float | None = Field(None, gt=0)
    expected_duration_min: float | None = Field(None, gt=0)
    power_w: float | None = Field(None, gt=0, description="Declared draw, for energy where no meter exists")
    share_gpu: bool = False
    gpu_memory_cap_gb: float | None = Field(None, gt=0)


class CheckpointSpec(_Strict):
    dir: str = Field(description="Folder the run writes checkpoints into (relative to the run dir)")
    resume_arg: list[str] = Field(default_factory=lambda: ["--resume", "{checkpoint}"],
                                  description="argv appended on resume; {checkpoint} is the path")
    every_steps: int | None = Field(None, gt=0)


class MetricSpec(_Strict):
    file: str | None = Field("metrics.jsonl", description="JSONL file the run appends metrics to")
    name: str = "loss"
    mode: Literal["min", "max"] = "min"
    regex: str | None = Field(None, description="Alternatively, a regex on the log with groups step and value")


class EarlyStopSpec(_Strict):
    patience: int = Field(5, ge=1, description="Evaluations of metrics.name without improvement")
    min_delta: float = Field(0.0, ge=0)
    median_rule: bool = Field(False, description="Also stop a trial worse than the median of its "
                                                  "sibling trials (same sweep) at the same step")
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
            raise ValueError("command is an argv list, not a shell string: split it into items, "
                             "e.g. ['python', 'train.py', '--lr', '{lr}']")
        return v

    @model_validator(mode="after")
    def _knobs_name_parameters(self) -> ExperimentSpec:
        for knob, param in self.knobs.model_dump().items():
            if param is not None and param not in self.parameters:
                raise ValueError(f"knobs.{knob} names parameter '{param}', which is not in parameters")
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
            raise SpecError(f"placeholders {sorted(missing)} are filled by no parameter; add them to "
                            "parameters", field="command")
        return [PLACEHOLDER.sub(lambda m: values[m.group(1)], item) for item in self.command]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def load_spec(path: str | Path) -> ExperimentSpec:
    spec = load_model(ExperimentSpec, path)
    spec.base_dir = str(Path(path).resolve().parent)
    return spec
