"""The skill contract: an input model, a result model, one function, a name, a description and a
capability. Skills never check permissions; the policy layer wraps every call.

    @skill("list_jobs", capability="read")
    def list_jobs(ctx: SkillContext, inp: ListJobsInput) -> ListJobsResult:
        \"\"\"One paragraph the planner (and the LLM) reads.\"\"\"
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import BadArguments

if TYPE_CHECKING:  # a skill's result model is imported by a client of the daemon, without the ORM
    from nightshift.runtime.store.db import Store

Capability = Literal["read", "launch", "modify", "destroy"]
CAPABILITIES: tuple[str, ...] = ("read", "launch", "modify", "destroy")


class HostPath(BaseModel):
    """A host path a launch reads or writes, named by the argument field it comes from."""

    field: str = Field(description="Where it comes from: code.path, checkpoint.dir, cwd, ...")
    path: str = Field(description="The path as the run will use it (symlinks resolved on check)")


class Launch(BaseModel):
    """What one job or process a call would start asks of the machine."""

    where: str = Field(
        "", description="Which part of the arguments asks (for messages): spec, items[3], ..."
    )
    gpus: int = 0
    image: str | None = None
    mounts: list[str] = Field(default_factory=list, description="Host paths it would mount")
    paths: list[HostPath] = Field(
        default_factory=list,
        description="Other host paths it would touch, for every executor: its working folder, "
        "checkpoint folder, metrics and log files outside its job folder",
    )
    runtime_min: float | None = None


class Claims(BaseModel):
    """What a call would claim; the gate checks the policy's limits against this, never against
    guessed argument names. The gate fills the owners and priorities of the jobs it touches."""

    launches: list[Launch] = Field(default_factory=list)
    jobs: list[int] = Field(default_factory=list, description="Existing jobs the call changes")
    job_owners: list[str] = Field(default_factory=list)
    max_job_priority: int | None = None


class SkillInput(BaseModel):
    """Base of input models. A launch, modify or destroy skill's input must say what it claims:
    a new skill with a differently named field cannot slip past the limits."""

    def claims(self) -> Claims:
        """What this call would claim; read skills claim nothing."""
        return Claims()

    def files(self) -> dict[str, str]:
        """{path: sha256} of the files whose contents the call acts on, read once, so that an
        approval given for one content is not spent on another."""
        return {}


In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)


@dataclass
class SkillContext:
    """Everything a skill may touch. The clock is `now`, handed in: skills never read one."""

    store: Store
    settings: Settings
    now: datetime
    call_id: str | None = None
    principal: str = "system"
    # Runtime objects, built by the caller; a skill that needs one and finds None reports it.
    probe: Any = None
    executor: Any = None
    policy_limits: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Skill(Generic[In, Out]):
    name: str
    description: str
    capability: Capability
    input_model: type[In]
    output_model: type[Out]
    fn: Callable[[SkillContext, In], Out]
    # Its only effects are rows in the store: they and the call's audit events commit together.
    store_only: bool = False

    def parse(self, args: dict[str, Any] | In) -> In:
        """Validate arguments against the input model; errors name the field for the planner."""
        if isinstance(args, self.input_model):
            return args
        open_model = self.input_model.model_config.get("extra") == "allow"
        unknown = (
            []
            if open_model or not isinstance(args, dict)
            else sorted(set(args) - set(self.input_model.model_fields))
        )
        if unknown:
            raise BadArguments(
                f"{self.name}: unknown argument(s) {', '.join(unknown)}; it takes "
                f"{', '.join(self.input_model.model_fields) or 'no arguments'}"
            )
        try:
            return self.input_model.model_validate(args)
        except ValidationError as exc:
            raise BadArguments(f"{self.name}: invalid arguments: {field_errors(exc)}") from exc

    def tool_schema(self) -> dict[str, Any]:
        """The OpenAI tool definition, generated from the input model."""
        params = self.input_model.model_json_schema()
        params.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }


def field_errors(exc: ValidationError) -> str:
    """`field.path: message; ...` for each error, as the planner and a person read them."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()
    )


def _model_hint(name: str, what: str, hint: Any) -> type[BaseModel]:
    """The annotation `hint` of a skill's input or result, checked to be a pydantic model."""
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        raise TypeError(f"skill {name}: {what} must be a pydantic model")
    return hint


def skill(
    name: str, *, capability: Capability, store_only: bool = False
) -> Callable[[Callable[[SkillContext, Any], Any]], Skill]:
    """Turn a typed function into a Skill; models come from its annotations, the description from
    its docstring. Checked when the module is imported, so a malformed skill never registers.
    `store_only`: the skill changes nothing but rows of `ctx.store`, from this thread (no process,
    file or remote call), so the gate commits those rows and the call's audit in one transaction."""
    if capability not in CAPABILITIES:
        raise ValueError(f"skill {name}: capability must be one of {CAPABILITIES}")

    def wrap(fn: Callable[[SkillContext, Any], Any]) -> Skill:
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        if len(params) != 2:
            raise TypeError(f"skill {name}: takes (ctx, input), got {params}")
        inp = _model_hint(name, "input", hints.get(params[1]))
        out = _model_hint(name, "result", hints.get("return"))
        if capability != "read" and (
            not issubclass(inp, SkillInput) or inp.claims is SkillInput.claims
        ):
            raise TypeError(
                f"skill {name}: a {capability} skill's input model must derive from "
                "SkillInput and define claims(): the gate checks limits on it"
            )
        doc = inspect.cleandoc(fn.__doc__ or "")
        if not doc:
            raise TypeError(f"skill {name}: needs a docstring; the planner reads it")
        return Skill(name, doc, capability, inp, out, fn, store_only)

    return wrap
