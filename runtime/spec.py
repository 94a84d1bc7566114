"""The experiment spec: what a researcher declares about a run, validated before anything starts."""

from __future__ import annotations

import math
import posixpath
import re
import string
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nightshift.runtime.errors import SpecError
from nightshift.runtime.user_regex import PatternError, compile_pattern
from nightshift.runtime.yamlfile import check_bounds, load_model_text

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Filled by nightshift itself in the command, never by a parameter.
COMMAND_BUILTINS = {"python", "checkpoint_dir", "metrics_file", "run_dir"}
# resume_arg sees the command's builtins and the checkpoint chosen to resume from.
RESUME_PLACEHOLDERS = COMMAND_BUILTINS | {"checkpoint", "step"}
BUILTIN_PLACEHOLDERS = RESUME_PLACEHOLDERS

# Ranges at submit, so that a stored job can never overflow a column, a timer or a sum later.
MAX_PRIORITY = 1_000_000  # aging adds about one a hour; a million outranks any real queue
MAX_MINUTES = 525_600.0  # a year: durations, timeouts and stall limits
MAX_GPUS = 4096
MAX_CPUS = 100_000.0  # cores a run may be limited to
MAX_MEMORY_GB = 1_000_000.0  # a petabyte: GPU and host memory
MAX_POWER_W = 1_000_000.0  # a megawatt
MAX_STEPS = 10**15
MAX_SEED = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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


class DataSpec(_Strict):
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="A data file or folder the run reads (relative to the code folder); its "
        "size and mtime fingerprint is recorded with each attempt",
    )
    hash: bool = Field(
        False, description="Also record a sha256 of its contents (reads every byte at launch)"
    )


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
    gpus: int = Field(0, ge=0, le=MAX_GPUS, description="GPUs the run needs; 0 runs on the CPU")
    gpu_memory_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GB)
    host_memory_gb: float | None = Field(
        None,
        gt=0,
        le=MAX_MEMORY_GB,
        description="Host memory the run may use: a kernel limit (its cgroup, its container)",
    )
    cpus: float | None = Field(
        None, gt=0, le=MAX_CPUS, description="CPU cores the run may use; default: no limit"
    )
    expected_duration_min: float | None = Field(None, gt=0, le=MAX_MINUTES)
    power_w: float | None = Field(
        None, gt=0, le=MAX_POWER_W, description="Declared draw, for energy where no meter exists"
    )
    share_gpu: bool = False
    gpu_memory_cap_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GB)
    span_hosts: bool = Field(
        False,
        description="May run across hosts, one worker per host (an executor that can: ray), "
        "when no one host has its GPUs free; a job wider than every host always does",
    )


class CheckpointSpec(_Strict):
    dir: str = Field(
        description="Folder the run writes checkpoints into, or a framework's run "
        "root above them (relative to the run dir); searched a few levels deep"
    )
    resume_arg: list[str] = Field(
        default_factory=lambda: ["--resume", "{checkpoint}"],
        description="argv appended on resume; {checkpoint} is the path",
    )
    every_steps: int | None = Field(None, gt=0, le=MAX_STEPS)
    steps_per_epoch: int | None = Field(
        None,
        gt=0,
        le=MAX_STEPS,
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

    @field_validator("dir")
    @classmethod
    def _dir_inside(cls, v: str) -> str:
        return _inside_job_folder(v, "checkpoint.dir")

    @field_validator("resume_arg")
    @classmethod
    def _resume_template(cls, v: list[str]) -> list[str]:
        for i, item in enumerate(v):
            unknown = template_names(item, f"resume_arg[{i}]") - RESUME_PLACEHOLDERS
            if unknown:
                raise ValueError(
                    f"resume_arg[{i}] names {{{sorted(unknown)[0]}}}; resume_arg may use only "
                    f"{', '.join('{' + n + '}' for n in sorted(RESUME_PLACEHOLDERS))}"
                )
        return v


class DivergenceSpec(_Strict):
    """Stop a run while it runs once its metrics diverge (tune_lr's rules), before it overwrites
    good checkpoints with bad weights."""

    enabled: bool = True
    window: int = Field(20, ge=1, le=10_000, description="Points averaged to smooth metrics.name")
    k: float = Field(
        4.0,
        gt=1,
        le=1e6,
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
        description="Regexes over the run's stdout/stderr (RE2 syntax: no backreferences or "
        "lookarounds): groups step and value (value is metrics.name), or step and any named "
        "metrics, e.g. 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'; several for train and eval "
        "lines",
    )
    progress: Literal["either", "metrics", "output"] = Field(
        "either",
        description="What counts as progress for stall_min: a new metric point, new "
        "log output, or either",
    )
    divergence: DivergenceSpec = DivergenceSpec()

    @field_validator("file")
    @classmethod
    def _file_inside(cls, v: str | None) -> str | None:
        return v if v is None else _inside_job_folder(v, "metrics.file")

    @field_validator("regex")
    @classmethod
    def _regexes_compile(cls, v: str | list[str] | None) -> str | list[str] | None:
        for i, pattern in enumerate([v] if isinstance(v, str) else v or []):
            where = "" if isinstance(v, str) else f"[{i}]"
            try:
                rx = compile_pattern(pattern)
            except PatternError as exc:
                raise ValueError(f"regex{where} {exc}") from None
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
    patience: int = Field(
        5, ge=1, le=MAX_STEPS, description="Evaluations of metrics.name without improvement"
    )
    min_delta: float = Field(0.0, ge=0)
    median_rule: bool = Field(
        False,
        description="Also stop a trial worse than the median of its "
        "sibling trials (same sweep) at the same step",
    )
    min_siblings: int = Field(3, ge=1, le=100_000)
    grace_steps: int = Field(0, ge=0, le=MAX_STEPS, description="No early stop before this step")


SearchType = Literal["log_uniform", "uniform", "int", "categorical"]
Choice = str | int | float | bool
SWEEP_MAX_TRIALS = 100_000
HH_MM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


class SearchParam(_Strict):
    """One dimension of a sweep's search space (Optuna's distributions), and when it applies."""

    type: SearchType = Field(
        description="log_uniform and uniform: a float in [low, high]; int: an integer in [low, "
        "high] (step, log); categorical: one of choices"
    )
    low: float | None = Field(None, description="Lower bound (log_uniform: > 0)")
    high: float | None = Field(None, description="Upper bound, included")
    step: float | None = Field(None, gt=0, description="uniform and int: the grid step")
    log: bool = Field(False, description="int: sample on a log scale")
    choices: list[Choice] | None = Field(None, description="categorical: the values")
    when: dict[str, Choice | list[Choice]] | None = Field(
        None,
        description="Sample this parameter only when each named categorical parameter (listed "
        "before it) has this value, or one of these values; else it keeps its value from "
        "parameters (Optuna's conditional search spaces)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SearchParam:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs choices: [a, b, ...]")
            if self.low is not None or self.high is not None or self.step is not None:
                raise ValueError("a categorical parameter takes choices, not low/high/step")
            return self
        if self.choices is not None:
            raise ValueError(f"type {self.type} takes low and high, not choices")
        if self.low is None or self.high is None:
            raise ValueError(f"type {self.type} needs both low and high")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.type == "log_uniform" and self.low <= 0:
            raise ValueError(f"log_uniform needs low > 0 (got {self.low:g}): use uniform instead")
        if self.type == "log_uniform" and self.step is not None:
            raise ValueError("log_uniform takes no step")
        if self.type == "int":
            if self.low != int(self.low) or self.high != int(self.high):
                raise ValueError("int needs whole low and high, e.g. low: 1, high: 8")
            if self.step is not None and self.step != int(self.step):
                raise ValueError("int needs a whole step")
            if self.log and self.low < 1:
                raise ValueError("int with log: true needs low >= 1")
            if self.log and self.step not in (None, 1):
                raise ValueError("int with log: true takes no step")
        elif self.log:
            raise ValueError("log: true is for int; use type log_uniform for floats")
        return self


class SweepSpec(_Strict):
    """How `nightshift sweep` searches: the budget, the sampler and the pruner (Optuna's)."""

    trials: int | None = Field(None, ge=1, le=SWEEP_MAX_TRIALS, description="Trials to run at most")
    gpu_hours: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="Stop asking for trials once the trials used this much: GPU-hours, "
        "counting a CPU-only trial's hours as one slot",
    )
    until: str | None = Field(
        None, description="Local time HH:MM (next occurrence): no new trial after it"
    )
    deadline: datetime | None = Field(
        None, description="ISO date-time (naive: local time): no new trial after it"
    )
    metric: str | None = Field(
        None, description="The objective's metric; default metrics.name (e.g. val_loss)"
    )
    mode: Literal["min", "max"] | None = Field(None, description="Default metrics.mode")
    sampler: Literal["tpe", "random"] = "tpe"
    startup_trials: int = Field(
        10, ge=0, le=SWEEP_MAX_TRIALS, description="TPE: random trials before TPE takes over"
    )
    pruner: Literal["median", "successive_halving", "none"] = "median"
    prune_startup_trials: int = Field(
        5, ge=0, le=SWEEP_MAX_TRIALS, description="median: no pruning before this many trials end"
    )
    prune_warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="median: no pruning of a trial before this step"
    )
    min_resource: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="successive_halving: steps of the first rung"
    )
    reduction_factor: int = Field(3, ge=2, le=100, description="successive_halving")
    max_parallel: int = Field(
        2, ge=1, le=10_000, description="Trials queued or running at once (the share caps it too)"
    )
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="Seeds the sampler; default: the spec's seed, else 0"
    )
    enqueue: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Trials to run first, e.g. the learning rate tune_lr's range test suggests",
    )

    @field_validator("until")
    @classmethod
    def _hh_mm(cls, v: str | None) -> str | None:
        if v is not None and not HH_MM.match(v):
            raise ValueError(f"until {v!r} is not a time of day: write HH:MM, e.g. '07:00'")
        return v


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
    search: dict[str, SearchParam] | None = Field(
        None, description="A sweep's search space (`nightshift sweep`), sampled by Optuna"
    )
    sweep: SweepSpec | None = Field(None, description="A sweep's budget, sampler and pruner")
    resources: Resources = Resources()
    checkpoint: CheckpointSpec | None = None
    metrics: MetricSpec = MetricSpec()
    early_stopping: EarlyStopSpec | None = None
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    cost_class: Literal["urgent", "cost_sensitive"] = "urgent"
    retries: int = Field(2, ge=0, le=100)
    retry_wait_s: float | None = Field(
        None,
        ge=0,
        le=MAX_MINUTES * 60,
        description="Wait before the first retry "
        "(then doubling, as the config's retry section says); "
        "default: retry.base_s, 30 s",
    )
    timeout_min: float | None = Field(None, gt=0, le=MAX_MINUTES)
    stall_min: float | None = Field(None, gt=0, le=MAX_MINUTES)
    depends_on: list[str] = Field(
        default_factory=list, description="Names of jobs that must succeed before this one starts"
    )
    deadline: str | None = Field(
        None,
        max_length=40,
        description="When it must be done: 'HH:MM' (the next such local time after it is "
        "submitted) or an ISO date-time (naive: local). A cost_sensitive job waits for cheap "
        "hours only while its expected duration still fits before it",
    )
    begin: str | None = Field(
        None,
        max_length=40,
        description="Not before: 'HH:MM' (the next such local time after it is submitted) or an "
        "ISO date-time (naive: local); the job waits queued until then (Slurm's --begin)",
    )
    pausable: bool = True
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    data: list[DataSpec] = Field(
        default_factory=list,
        max_length=64,
        description="Data the run reads, fingerprinted in each attempt's provenance",
    )
    knobs: Knobs = Knobs()

    # Where the spec was loaded from; relative paths resolve against it. Not part of the user's file.
    base_dir: str | None = Field(None, exclude=True)

    @field_validator("deadline", "begin")
    @classmethod
    def _a_time(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or HH_MM.match(v.strip()):
            return v
        try:
            datetime.fromisoformat(v.strip())
        except ValueError:
            raise ValueError(
                f"{info.field_name} {v!r} is not a time: write HH:MM (e.g. '07:00', the next one "
                "after submission) or an ISO date-time (e.g. '2026-12-05T07:00')"
            ) from None
        return v

    @field_validator("command")
    @classmethod
    def _argv_not_shell(cls, v: list[str]) -> list[str]:
        if len(v) == 1 and " " in v[0].strip():
            raise ValueError(
                "command is an argv list, not a shell string: split it into items, "
                "e.g. ['python', 'train.py', '--lr', '{lr}']"
            )
        for i, item in enumerate(v):
            template_names(item, f"command[{i}]")
        return v

    @field_validator("parameters", "search_space")
    @classmethod
    def _finite(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        check_finite(v)
        return v

    @model_validator(mode="after")
    def _not_own_dependency(self) -> ExperimentSpec:
        if self.name in self.depends_on:
            raise ValueError(
                f"depends_on names '{self.name}', this spec itself: the job would wait for "
                "itself forever; remove it"
            )
        return self

    @model_validator(mode="after")
    def _knobs_name_parameters(self) -> ExperimentSpec:
        for knob, param in self.knobs.model_dump().items():
            if param is not None and param not in self.parameters and param not in self.searched():
                raise ValueError(
                    f"knobs.{knob} names parameter '{param}', which is not in parameters"
                )
        return self

    @model_validator(mode="after")
    def _search_consistent(self) -> ExperimentSpec:
        if self.sweep is not None and not self.search:
            raise ValueError(
                "sweep needs a search space: add search: {lr: {type: log_uniform, low: 1e-4, "
                "high: 1e-1}}"
            )
        if not self.search:
            return self
        grid = [k for k, v in (self.search_space or {}).items() if isinstance(v, list)]
        if grid:
            raise ValueError(
                f"search_space lists ({', '.join(grid)}) make a grid for `nightshift submit`, "
                "search is sampled by `nightshift sweep`: use one of them"
            )
        seen: dict[str, SearchParam] = {}
        for name, p in self.search.items():
            if not PLACEHOLDER.fullmatch("{" + name + "}"):
                raise ValueError(f"search.{name}: not a parameter name (letters, digits, _)")
            for other, value in (p.when or {}).items():
                parent = seen.get(other)
                if parent is None or parent.type != "categorical":
                    raise ValueError(
                        f"search.{name}.when names '{other}', which is not a categorical "
                        "parameter listed before it in search"
                    )
                values = value if isinstance(value, list) else [value]
                bad = [v for v in values if v not in (parent.choices or [])]
                if bad:
                    raise ValueError(
                        f"search.{name}.when: {bad[0]!r} is not one of search.{other}.choices "
                        f"{parent.choices}"
                    )
            if p.when and name not in self.parameters:
                raise ValueError(
                    f"search.{name} is conditional (when): give it a value in parameters for "
                    "the trials where it is not sampled"
                )
            seen[name] = p
        return self

    def searched(self) -> set[str]:
        """The parameters a sweep samples."""
        return set(self.search or {})

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
        for i, item in enumerate(self.command):
            names |= template_names(item, f"command[{i}]")
        return names

    def unfilled_placeholders(self, params: dict[str, Any] | None = None) -> set[str]:
        return (
            self.placeholders()
            - set(params or self.parameters)
            - self.searched()
            - BUILTIN_PLACEHOLDERS
        )

    def check_filled(self, params: dict[str, Any], *, path: str | None = None) -> None:
        """Refuse at submit a command whose placeholders these parameters and the builtins leave
        unfilled (the run would fail to start, on every try)."""
        missing = self.placeholders() - set(params) - COMMAND_BUILTINS
        if missing:
            raise SpecError(
                f"placeholders {sorted(missing)} are filled by no parameter: add them to "
                f"parameters, or use only the builtins {sorted(COMMAND_BUILTINS)} "
                "({checkpoint} and {step} belong in checkpoint.resume_arg); a literal brace "
                "is written {{ or }}",
                path=path,
                field="command",
            )

    def host_paths(self) -> list[tuple[str, str]]:
        """(field, path) of the host paths a run of this spec reads or writes outside its job
        folder: the code folder where the spec names one (code.path, or the spec file's folder;
        a mapping without code.path runs where the loop runs, the operator's choice), and an
        absolute checkpoint folder or metrics file. Relative ones stay inside the job's folder
        (their validators refuse `..`)."""
        out = []
        if self.code.path or self.base_dir:
            out.append(("code.path", str(self.run_dir())))
        if self.checkpoint and Path(self.checkpoint.dir).is_absolute():
            out.append(("checkpoint.dir", self.checkpoint.dir))
        if self.metrics.file and Path(self.metrics.file).is_absolute():
            out.append(("metrics.file", self.metrics.file))
        return out

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
        return [fill(item, values) for item in self.command]


def template_names(item: str, where: str) -> set[str]:
    """The placeholder names of one argv template item, which must be `{name}` fields only
    (ValueError otherwise, naming `where`): a literal brace is written `{{` or `}}`."""
    try:
        parts = list(string.Formatter().parse(item))
    except ValueError as exc:
        raise ValueError(
            f"{where} {item!r} is not a valid template ({exc}): a literal brace is written "
            "{{ or }}"
        ) from None
    names = set()
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not PLACEHOLDER.fullmatch("{" + name + "}") or spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(
                f"{where} {item!r}: {{{shown}}} is not a placeholder (a parameter's name, such "
                "as {lr}); a literal brace is written {{ or }}"
            )
        names.add(name)
    return names


def fill(item: str, values: dict[str, str]) -> str:
    """One argv item with its `{name}` fields filled and `{{`/`}}` made single braces."""
    return "".join(
        literal + (values[name] if name is not None else "")
        for literal, name, _, _ in string.Formatter().parse(item)
    )


def check_finite(value: Any, where: str = "") -> None:
    """ValueError naming the first NaN or infinite number in nested parameters."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{at or 'value'} is {v}: numbers must be finite")
        if isinstance(v, dict):
            stack.extend((x, f"{at}.{k}" if at else str(k)) for k, x in v.items())
        elif isinstance(v, list | tuple):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))


def _inside_job_folder(v: str, field: str) -> str:
    """A relative path means inside the job's folder; `..` out of it is refused (an absolute
    path is checked against the policy's allowed roots instead)."""
    if "\x00" in v:
        raise ValueError(f"{field} contains a NUL byte")
    if not Path(v).is_absolute() and posixpath.normpath(v).split("/")[0] == "..":
        raise ValueError(
            f"{field} {v!r} leaves the job's folder through '..': a relative path lies "
            "inside it; give an absolute path for a folder elsewhere (the policy's "
            "allowed roots apply)"
        )
    return v


def stored_spec(spec: dict[str, Any], params: dict[str, Any]) -> ExperimentSpec:
    """A stored job's spec and parameters validated again before the loop uses them (a store
    written by an older version, or edited by hand, must fail that job, not the loop).
    Raises SpecError naming the field."""
    try:
        parsed = ExperimentSpec.model_validate(spec)
        check_bounds(params, path="<stored job>", field="params")
        check_finite(params, "params")
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise SpecError(err["msg"], path="<stored job>", field=field) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise SpecError(str(exc) or type(exc).__name__, path="<stored job>") from None
    parsed.check_filled(params, path="<stored job>")
    return parsed


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
