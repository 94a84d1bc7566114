"""Goal files: what a researcher (or cron) asks nightshift to do.

Two shapes:

    name: nightly                       name: housekeeping
    goal: train                         steps:
    spec: ../specs/quickstart.yaml        - id: submit
    params: {lr: 0.01}                      skill: submit_job
                                            args: {spec_path: ../specs/quickstart.yaml}
                                          - watch: ${submit.job_id}
                                          - skill: cancel_job
                                            args: {job_id: ${submit.job_id}}

`goal:` names a built-in playbook (train, recover, health); `steps:` are explicit skill calls run in
order, where `${ID.FIELD}` stands for a field of an earlier step's result. `goal: chat` with
`text:` is free text (what a researcher typed) that only a model planner can read: a goal file
uses the model only when it says `planner: llm`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nightshift.runtime.errors import SpecError
from nightshift.runtime.spec import MAX_PRIORITY, ExperimentSpec, check_finite, load_spec
from nightshift.runtime.yamlfile import line_of, read_yaml, validate

MAX_JOB_ID = 2**63 - 1  # what the store's integer column holds


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    id: str | None = Field(None, description="Name later steps use in ${ID.FIELD}")
    skill: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    watch: int | str | None = Field(
        None, description="Wait until this job is no longer queued or running"
    )

    @field_validator("watch")
    @classmethod
    def _job_id_fits(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and not 1 <= v <= MAX_JOB_ID:
            raise ValueError(f"watch: job ids run from 1 to {MAX_JOB_ID}")
        return v

    @field_validator("args")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_finite(v, "args")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        if (self.skill is None) == (self.watch is None):
            raise ValueError("a step has exactly one of 'skill' or 'watch'")
        return self


PATH_ARGS = ("spec_path", "path", "checkpoint_dir", "log_path", "from_file", "cwd")


def _anchor_paths(goal: Goal) -> None:
    """Relative paths in step arguments mean relative to the goal file, as `spec:` does."""
    for step in goal.steps or []:
        for key in PATH_ARGS:
            value = step.args.get(key)
            if isinstance(value, str) and value and not value.startswith(("$", "/", "~")):
                step.args[key] = str((Path(goal.base_dir) / value).resolve())


class Goal(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = Field("goal", pattern=r"^[A-Za-z0-9_.-]+$")
    goal: Literal["train", "recover", "health", "chat"] | None = None
    planner: Literal["deterministic", "llm"] = Field(
        "deterministic", description="Who plans: the playbooks, or the model (needs an endpoint)"
    )
    text: str | None = Field(
        None, max_length=20_000, description="goal: chat - what the user asked, in their words"
    )
    spec: str | dict[str, Any] | None = Field(
        None, description="Spec path (relative to the goal file) or mapping"
    )
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = Field(None, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    job_id: int | None = Field(None, ge=1, le=MAX_JOB_ID, description="For goal: recover")
    watch: bool = Field(
        True,
        description="recover: after requeueing, wait for the job to end "
        "(a goal run does; the daemon, which watches anyway, does not)",
    )
    steps: list[Step] | None = None
    base_dir: str = "."

    @field_validator("params", "spec")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        check_finite(v)
        return v

    @model_validator(mode="after")
    def _shape(self) -> Goal:
        if (self.goal is None) == (self.steps is None):
            raise ValueError("a goal file has either 'goal:' (a playbook) or 'steps:', not both")
        if self.goal == "train" and self.spec is None:
            raise ValueError("goal: train needs 'spec:' (a path or a mapping)")
        if self.goal == "recover" and self.job_id is None:
            raise ValueError("goal: recover needs 'job_id:'")
        if (self.goal == "chat") != (self.text is not None):
            raise ValueError("'text:' goes with goal: chat (free text), and goal: chat needs it")
        if self.goal == "chat" and self.planner != "llm":
            raise ValueError("goal: chat is free text: it needs 'planner: llm' (a model endpoint)")
        _anchor_paths(self)
        return self

    def spec_args(self) -> dict[str, Any]:
        """submit_job / config_validator arguments for this goal's spec."""
        if isinstance(self.spec, str):
            return {"spec_path": str((Path(self.base_dir) / self.spec).resolve())}
        return {"spec": self.spec}


def load_goal(path: str | Path) -> Goal:
    data, node, _ = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping with 'goal:' or 'steps:'", path=str(path), line=1)
    data.setdefault("base_dir", str(Path(path).resolve().parent))
    goal = validate(Goal, data, path=str(path), node=node)
    if isinstance(goal.spec, str) and not _exists(Path(goal.base_dir) / goal.spec):
        raise SpecError(
            f"spec file {goal.spec} not found (relative to {goal.base_dir})",
            path=str(path),
            field="spec",
        )
    _check_params(goal, str(path), node)
    return goal


def _check_params(goal: Goal, path: str, node: yaml.Node | None) -> None:
    """`params:` override the spec's parameters of a train goal: a name the spec does not have
    (a typo, say `lrr`) stops here, naming it and the fix, before anything runs. A spec that
    does not load is left to config_validator, which reports it in full."""
    if not goal.params:
        return
    if goal.goal != "train":
        name = next(iter(goal.params))
        kind = f"goal: {goal.goal}" if goal.goal else "a goal of steps"
        raise SpecError(
            f"{kind} takes no params (they override the spec's parameters of goal: train); "
            "remove 'params:', or give them in a step's args",
            path=path,
            field=f"params.{name}",
            line=line_of(node, ("params", name)),
        )
    try:
        spec = (
            load_spec(Path(goal.base_dir) / goal.spec)
            if isinstance(goal.spec, str)
            else validate(ExperimentSpec, goal.spec, path="spec")
        )
    except SpecError:
        return
    known = set(spec.parameters) | set(spec.search_space or {}) | spec.searched()
    for name in goal.params:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        fix = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(
            f"'{name}' is not a parameter of spec '{spec.name}' (its parameters: "
            f"{', '.join(sorted(known)) or 'none'}); {fix}use one of those names, or add "
            f"'{name}' to the spec's parameters",
            path=path,
            field=f"params.{name}",
            line=line_of(node, ("params", name)),
        )


def _exists(path: Path) -> bool:
    """Path.exists that calls a name with a NUL byte or too long for the system missing."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def recover_goal(job_id: int, *, watch: bool = True) -> Goal:
    return Goal(name=f"recover-job-{job_id}", goal="recover", job_id=job_id, watch=watch)
