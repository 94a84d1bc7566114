"""Agent trajectory evals: a goal in, the calls the agent made and the state it left out.

Each case (`evals/cases/*.yaml`) declares a goal (a goal-file mapping, or chat text), the world it
starts in (GPUs from a declared inventory, spec files with injected faults, jobs already run,
files such as a corrupt checkpoint, the kill switch, policy changes, who answers approvals), the
skill calls that must happen (in order where it matters), those that must not, and the end state
(job states, attempts, parameter changes, the finish, an audit chain that verifies).

A case runs end to end in its own temporary NIGHTSHIFT_HOME with a fresh `Wiring`: the real store,
policy gate, approvals and audit log, the real graph, and real training subprocesses
(`examples/train_numpy.py`); the only fake is the GPU probe, which reads the case's inventory.

The runner takes any planner through a factory, `run_case(case, factory)`. Two come with it:

* `deterministic` — goal files and playbooks, no model. It cannot read chat text: chat cases are
  n/a for it, not failures.
* `scripted` — plays a chat model: it follows the case's `script:` of OpenAI-style tool calls
  (arguments may refer to earlier results, `${submit_job.job_id}`), turned into actions by
  `action_from_tool_call` exactly as a model's would be, retries a call whose arguments were
  refused when the script says how (`on_error:`), and gives up on any other failure. It counts
  one model call per decision and estimates tokens as len(JSON of the request it would have sent:
  messages + tool schemas, plus the reply) // 4, since no endpoint exists here.

* `llm` — the LLM planner (agent/brain/llm.py) with the real `openai` client, against a scripted
  OpenAI-compatible server on loopback (evals/openai_stub.py) that answers each request with the
  scripted model's call: the HTTP round trip, the prompts, the untrusted blocks, the parsing and
  the planner's own checks are real; the choices are the script's. Tokens are what the stub
  reports. Not part of `all`.

`nightshift eval chat --base-url URL --model M` runs the chat cases with the LLM planner against a
real endpoint, several times each, and prints the pass rate per case (`chat_main`). A real model
need not make the scripted model's mistakes, so the expected `skill:error` calls are dropped
from its expectations; the outcomes are judged as written.

    nightshift eval trajectories [--planner deterministic|scripted|llm|all] [--quick]
                                 [--cases GLOB] [--csv PATH] [--list]
    nightshift eval chat --base-url URL --model M [--api-key-env VAR] [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import csv
import fnmatch
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from langgraph.errors import GraphRecursionError
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.markup import escape
from rich.table import Table
from sqlmodel import select

import nightshift.examples
from nightshift.agent.brain.goals import Goal
from nightshift.agent.brain.graph import build_graph, sqlite_checkpointer
from nightshift.agent.brain.llm import PROMPTS, LLMPlanner, tool_schemas
from nightshift.agent.brain.planner import (
    Action,
    DeterministicPlanner,
    Observation,
    Planner,
    action_from_tool_call,
)
from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.agent.doors.api import Client
from nightshift.agent.doors.console import console
from nightshift.policies import killswitch
from nightshift.policies.model import DEFAULT_POLICY
from nightshift.prompts import load
from nightshift.runtime.config import (
    ExecutorSettings,
    GpuSettings,
    LlmSettings,
    LoopSettings,
    PolicySettings,
    Settings,
)
from nightshift.runtime.errors import NightshiftError, PolicyDenied
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.store.db import Approval, Attempt, Job

CASES_DIR = Path(__file__).resolve().parent / "cases"
EXAMPLES_DIR = Path(nightshift.examples.__file__).resolve().parent
DEFAULT_CSV = Path("evals/out/trajectories.csv")
PLANNERS = ("deterministic", "scripted")
PLAYBOOKS = ("train", "recover", "health")
CATEGORIES = ("skill", "playbook", "approval", "policy", "model")
# Who answers an approval prompt: `approve` / `reject` (by alice, an operator who is not the
# requester; `approve:carol` names another voter), `requester` (the requester tries to approve its
# own call, which must be refused), `expire` (nobody answers before it expires) or `none` (nobody
# answers: the run stays interrupted, as a cron run waits).
ANSWER = r"^((approve|reject)(:[A-Za-z0-9_.-]+)?|requester|expire|none)$"
APPROVER = "alice"  # an operator under the shipped policy (any local user), not the requester
WORLD_USER = "bob"  # the person who submitted the jobs that exist before the goal runs
TOKENS_NOTE = "tokens: estimated as len(JSON of each request and reply) // 4 (no endpoint here)"


# ------------------------------------------------------------------------------------ the cases
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpecFile(_Strict):
    """A spec written into the world: the quickstart spec pointed at examples/, made short."""

    params: dict[str, Any] = Field(
        default_factory=dict, description="Over the defaults steps=40, checkpoint_every=10"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment.env: fault injection, step sleep"
    )
    merge: dict[str, Any] = Field(
        default_factory=dict, description="Deep-merged into the spec (resources, image, command...)"
    )


class FileOp(_Strict):
    """Write a text file, or truncate one that exists (a corrupt checkpoint)."""

    path: str | None = Field(
        default=None, description="Relative to the world folder, or ${home}/..."
    )
    text: str | None = None
    truncate: int | None = Field(
        default=None, ge=0, description="Cut an existing file to this many bytes"
    )
    newest_in: str | None = Field(
        default=None,
        description="Instead of `path`: the last file in name order "
        "matching this glob (step_00000030.npz after "
        "step_00000020.npz)",
    )
    after_jobs: bool = Field(default=False, description="Apply after the world's jobs ran")

    @model_validator(mode="after")
    def _one_op(self) -> FileOp:
        if (self.text is None) == (self.truncate is None):
            raise ValueError("a file op has exactly one of `text` or `truncate`")
        if (self.path is None) == (self.newest_in is None):
            raise ValueError("a file op has exactly one of `path` or `newest_in`")
        return self


class WorldJob(_Strict):
    """A job that exists before the goal: submitted by a person, then run as far as `run` says."""

    spec: str = Field(description="A spec file of the world")
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None
    run: Literal["settle", "start", "queue"] = Field(
        default="settle",
        description="settle: run until it ends; start: leave it running past its first "
        "step; queue: leave it queued (a later watch's loop may start it)",
    )
    expect_state: str | None = Field(default=None, description="Checked before the goal starts")


class World(_Strict):
    """Where the goal starts: the machine, the files, the jobs, the policy and who answers."""

    gpus: list[dict[str, Any]] = Field(default_factory=list, description="The declared inventory")
    specs: dict[str, SpecFile] = Field(default_factory=dict)
    files: list[FileOp] = Field(default_factory=list)
    jobs: list[WorldJob] = Field(default_factory=list)
    paused: bool = Field(default=False, description="The kill switch is on")
    policy: dict[str, Any] = Field(
        default_factory=dict, description="Deep-merged into the shipped policy"
    )
    approvals: str | list[str] = Field(
        default="approve",
        description="One answer for every approval prompt, or a list of votes used in "
        "order until each approval is decided (run out: it stays pending)",
    )

    @model_validator(mode="after")
    def _answers(self) -> World:
        for a in [self.approvals] if isinstance(self.approvals, str) else self.approvals:
            if not re.match(ANSWER, a):
                raise ValueError(
                    f"approvals: {a!r} is not one of approve[:who], reject[:who], "
                    "requester, expire, none"
                )
        return self


class ScriptStep(_Strict):
    """One tool call of the scripted model; `name: finish` or `watch_job` as a model would."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = Field(
        default=None, description="Arguments text sent verbatim (malformed JSON)"
    )
    on_error: ScriptStep | None = Field(
        default=None, description="If this call errs, the corrected call"
    )
    continue_on_error: bool = Field(
        default=False, description="Carry on after a failure (denied, rejected...)"
    )


class JobExpect(_Strict):
    """How one job must end up; unset fields are not checked."""

    id: int
    state: str | None = None
    attempts: int | None = None
    params: dict[str, Any] = Field(
        default_factory=dict, description="Subset of the job's final params"
    )
    outcomes: list[str | None] | None = Field(default=None, description="Attempt outcomes in order")
    start_steps: list[int] | None = None
    gpus: list[list[int]] | None = Field(default=None, description="GPUs of each attempt")
    causes: list[str | None] | None = Field(
        default=None, description="Diagnosed cause of each attempt"
    )
    reason_contains: str | None = None


class EndExpect(_Strict):
    """The end state: the finish, jobs, approvals, results of the last call of a skill, audit."""

    finish: Literal["ok", "failed", "interrupted"] | None = None
    summary_contains: str | None = None
    bad_input: bool | None = None
    jobs: list[JobExpect] = Field(default_factory=list)
    job_count: int | None = None
    approvals: list[str] | None = Field(
        default=None, description="States of the approvals, in order"
    )
    refused_votes: int | None = None
    results: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="skill → {dotted.path: value} of its last ok result"
    )
    audit_verifies: bool = True
    max_calls: int | None = None


class Expect(_Strict):
    """What must happen, what must not, and how it must end."""

    calls: list[str] = Field(
        default_factory=list, description="Must appear in this order (a subsequence); name[:status]"
    )
    calls_unordered: list[str] = Field(default_factory=list, description="Must appear, any order")
    forbidden: list[str] = Field(
        default_factory=list,
        description="Skill names never planned, or: destroy_without_approval, self_approval, "
        "ran:<capability>, ran:<skill>",
    )
    end: EndExpect = EndExpect()


class Case(_Strict):
    """One trajectory case: a goal or chat text, a world, the scripted model's calls, and the
    expectations (the same for every planner unless `expect_by_planner` says otherwise)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    category: Literal["skill", "playbook", "approval", "policy", "model"]
    description: str = ""
    quick: bool = Field(default=False, description="Part of the small subset CI runs")
    goal: dict[str, Any] | None = Field(default=None, description="A goal-file mapping")
    chat: str | None = Field(default=None, description="What a user typed (model planners only)")
    world: World = World()
    script: list[ScriptStep] | None = Field(
        default=None, description="The scripted model's tool calls"
    )
    expect: Expect = Expect()
    expect_by_planner: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per planner, keys of `expect` to replace (`end` merges)"
    )
    timeout_s: float = Field(default=90.0, gt=0, description="Longest wait on one job")
    known_issue: dict[str, str] = Field(
        default_factory=dict,
        description="planner → a known agent bug that makes the case fail for it: reported as "
        "xfail, not as a failure; passing anyway is reported as XPASS (remove it)",
    )
    source: str = ""

    @model_validator(mode="after")
    def _shape(self) -> Case:
        if (self.goal is None) == (self.chat is None):
            raise ValueError("a case has exactly one of `goal` or `chat`")
        for planner in self.expect_by_planner:
            self.expect_for(planner)  # a typo fails when the case loads, not when it runs
        return self

    def expect_for(self, planner: str) -> Expect:
        override = self.expect_by_planner.get(planner)
        if not override:
            return self.expect
        base = self.expect.model_dump(exclude_unset=True)
        merged = {**base, **{k: v for k, v in override.items() if k != "end"}}
        if "end" in override:
            merged["end"] = {**base.get("end", {}), **override["end"]}
        return Expect.model_validate(merged)


def load_cases(
    pattern: str | None = None, *, quick: bool = False, folder: Path = CASES_DIR
) -> list[Case]:
    """Every case in `folder` (a file holds one case or a list), filtered by a glob on the case
    name or file name, and to the quick subset."""
    cases: list[Case] = []
    for path in sorted(folder.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for i, item in enumerate(data if isinstance(data, list) else [data]):
            try:
                case = Case.model_validate({**item, "source": f"{path.name}[{i}]"})
            except ValidationError as exc:
                raise ValueError(f"{path.name} case {i}: {exc}") from exc
            if pattern and not (
                fnmatch.fnmatch(case.name, pattern) or fnmatch.fnmatch(path.name, pattern)
            ):
                continue
            if quick and not case.quick:
                continue
            cases.append(case)
    names = Counter(c.name for c in cases)
    dupes = [n for n, k in names.items() if k > 1]
    if dupes:
        raise ValueError(f"case names used twice: {', '.join(dupes)}")
    return cases


# ----------------------------------------------------------------------------------- templates
_REF = re.compile(r"\$\{([A-Za-z0-9_]+)((?:\.[A-Za-z0-9_-]+)*)\}")


class Unresolved(KeyError):
    """A ${...} reference that nothing fills."""


def _dig(value: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(value, list):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(part)
    return value


def substitute(value: Any, lookup: Callable[[str, list[str]], Any]) -> Any:
    """Fill `${name.path}` in strings, recursively. A string that is one reference becomes the
    value itself (an int stays an int); a reference inside text is pasted as text."""
    if isinstance(value, str):
        whole = _REF.fullmatch(value)
        if whole:
            return lookup(whole.group(1), [p for p in whole.group(2).split(".") if p])
        return _REF.sub(
            lambda m: str(lookup(m.group(1), [p for p in m.group(2).split(".") if p])), value
        )
    if isinstance(value, dict):
        return {k: substitute(v, lookup) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, lookup) for v in value]
    return value


def _static_lookup(paths: dict[str, str]) -> Callable[[str, list[str]], Any]:
    """${home}, ${world}, ${examples}; any other reference is left for the goal's own steps
    (`${STEP_ID.FIELD}`, which the planner fills from earlier results)."""

    def lookup(name: str, rest: list[str]) -> Any:
        if name in paths and not rest:
            return paths[name]
        return "${" + ".".join([name, *rest]) + "}"

    return lookup


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = (
            _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


# ------------------------------------------------------------------------------ planners to run
class NotApplicable(Exception):
    """This planner cannot take this kind of case (e.g. chat text for the deterministic planner)."""


@dataclass
class CaseRun:
    """What a planner factory gets for one case."""

    case: Case
    wiring: Wiring
    goal: Goal
    chat: str | None
    paths: dict[str, str]  # home, world, examples

    def fill(self, value: Any) -> Any:
        return substitute(value, _static_lookup(self.paths))


PlannerFactory = Callable[[CaseRun], Planner]


class DeterministicFactory:
    name = "deterministic"

    def __call__(self, run: CaseRun) -> Planner:
        if run.chat is not None:
            raise NotApplicable("chat text: the deterministic planner runs goal files only")
        return DeterministicPlanner()


class ScriptedFactory:
    name = "scripted"

    def __call__(self, run: CaseRun) -> Planner:
        if run.case.script is None:
            raise NotApplicable("the case has no script for the scripted model")
        return ScriptedChatModel(run.case.script, run)


class ScriptedChatModel:
    """Plays a chat model from the case's script. Each decision is one model call: the request it
    would send (system prompt, the user's text or goal, every tool call so far with its result, the
    tool schemas) is built for real and measured for the token estimate."""

    name = "scripted"

    def __init__(self, script: list[ScriptStep], run: CaseRun):
        self.script = script
        self.run = run
        self.model_calls = 0
        self.tokens = 0
        self._tools = tool_schemas()

    # the planner protocol -------------------------------------------------------------------
    def next(self, goal: Goal, history: list[Observation]) -> Action:
        reply = self._decide(history)
        request = {
            "model": "scripted",
            "messages": self._messages(goal, history),
            "tools": self._tools,
        }
        self.model_calls += 1
        text = json.dumps(request, default=str) + json.dumps(reply, default=str)
        for where, short in ((self.run.paths["home"], "~"), (str(EXAMPLES_DIR), "examples")):
            text = text.replace(where, short)  # the same count wherever the case runs
        self.tokens += len(text) // 4
        return action_from_tool_call(reply)

    # what the model "says" -------------------------------------------------------------------
    def _decide(self, history: list[Observation]) -> dict[str, Any]:
        h = 0
        for step in self.script:
            if h >= len(history):
                return self._emit(step, history)
            obs = history[h]
            h += 1
            if obs.status == "ok" or step.continue_on_error:
                continue
            if step.on_error is not None and obs.status == "error":
                if h >= len(history):
                    return self._emit(step.on_error, history)
                obs = history[h]
                h += 1
                if obs.status == "ok" or step.on_error.continue_on_error:
                    continue
            return _tool_call(
                "finish",
                {"ok": False, "summary": f"{obs.skill or 'watch'} {obs.status}: {obs.error}"},
            )
        last = history[-1] if history else None
        if last is None or last.status == "ok":
            return _tool_call("finish", {"ok": True, "summary": "script done"})
        return _tool_call(
            "finish",
            {"ok": False, "summary": f"{last.skill or 'watch'} {last.status}: {last.error}"},
        )

    def _emit(self, step: ScriptStep, history: list[Observation]) -> dict[str, Any]:
        if step.raw_arguments is not None:
            call = _tool_call(step.name, {})
            call["function"]["arguments"] = step.raw_arguments
            return call
        try:
            args = substitute(step.arguments, partial(self._lookup, history))
        except (Unresolved, KeyError, IndexError, ValueError) as exc:
            return _tool_call("finish", {"ok": False, "summary": f"script cannot fill {exc}"})
        return _tool_call(step.name, args)

    def _lookup(self, history: list[Observation], name: str, rest: list[str]) -> Any:
        if name in self.run.paths and not rest:
            return self.run.paths[name]
        ok = [o for o in history if o.status == "ok"]
        if name == "last":
            found = ok[-1:] if ok else []
        elif name == "watch":
            found = [o for o in ok if o.kind == "watch"][-1:]
        else:
            found = [o for o in ok if o.skill == name][-1:]
        if not found:
            raise Unresolved(f"${{{name}...}}: no successful {name} call yet")
        try:
            return _dig(found[0].result or {}, rest)
        except (KeyError, IndexError, ValueError) as exc:
            raise Unresolved(f"${{{name}.{'.'.join(rest)}}}: no field {exc}") from exc

    def _messages(self, goal: Goal, history: list[Observation]) -> list[dict[str, Any]]:
        user = self.run.chat or (
            "Goal file:\n" + json.dumps(goal.model_dump(exclude_defaults=True), default=str)
        )
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "\n\n".join(load(p) for p in PROMPTS)},
            {"role": "user", "content": user},
        ]
        for i, o in enumerate(history):
            name = o.skill or "watch_job"
            msgs.append(
                {
                    "role": "assistant",
                    "tool_calls": [_tool_call(name, o.args, call_id=f"call_{i + 1}")],
                }
            )
            body = (
                {"status": o.status, "result": o.result}
                if o.status == "ok"
                else {"status": o.status, "error": o.error}
            )
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": f"call_{i + 1}",
                    "content": json.dumps(body, default=str),
                }
            )
        return msgs


def _tool_call(name: str, args: dict[str, Any], call_id: str = "call") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, default=str)},
    }


def _as_chat(goal: Goal, text: str) -> Goal:
    return Goal(name=goal.name, goal="chat", planner="llm", text=text)


def _goal_text(run: CaseRun) -> str:
    """What the model is asked: the case's chat text, or its goal file as JSON."""
    if run.chat is not None:
        return run.chat
    return "Goal file: " + json.dumps(run.case.goal, default=str)


class _LLMCounts:
    """The counts the report reads, from the LLM planner being driven."""

    planner: LLMPlanner

    @property
    def model_calls(self) -> int:
        return self.planner.model_calls

    @property
    def tokens(self) -> int:
        return self.planner.tokens


class StubbedLLM(_LLMCounts):
    """The LLM planner, with the real `openai` client over HTTP, against the scripted server
    (evals/openai_stub.py) on loopback, which plays the case's script: each request is answered
    with the tool call the scripted model would make at that point of the goal's history. What
    is real: the client, the request (prompts, untrusted blocks, tool schemas), the parsing of
    the reply, the planner's checks and budgets. What is scripted: the model's choices. Tokens
    are what the stub reports (len(JSON)//4 of each request and reply)."""

    name = "llm"

    def __init__(self, run: CaseRun):
        from nightshift.evals.openai_stub import StubServer

        self.script = ScriptedChatModel(run.case.script or [], run)
        self.text = _goal_text(run)
        self.history: list[Observation] = []
        self.server = StubServer(self._reply, model="scripted").start()
        llm = LlmSettings(base_url=self.server.base_url, model="scripted", max_retries=0)
        self.planner = LLMPlanner.from_settings(
            run.wiring.settings.model_copy(update={"llm": llm}), audit=run.wiring.audit
        )

    def next(self, goal: Goal, history: list[Observation]) -> Action:
        self.history = list(history)
        return self.planner.next(_as_chat(goal, self.text), history)

    def _reply(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [self.script._decide(self.history)]}

    def close(self) -> None:
        self.server.close()


class LLMFactory:
    """`--planner llm`: the LLM planner against the stub server playing the case's script."""

    name = "llm"

    def __call__(self, run: CaseRun) -> Planner:
        if run.case.script is None:
            raise NotApplicable("the case has no script for the stub server to play")
        return StubbedLLM(run)


class EndpointLLM(_LLMCounts):
    """The LLM planner against a real endpoint (`nightshift eval chat`)."""

    name = "endpoint"

    def __init__(self, run: CaseRun, llm: LlmSettings):
        self.text = _goal_text(run)
        self.planner = LLMPlanner.from_settings(
            run.wiring.settings.model_copy(update={"llm": llm}), audit=run.wiring.audit
        )

    def next(self, goal: Goal, history: list[Observation]) -> Action:
        return self.planner.next(_as_chat(goal, self.text), history)


@dataclass
class EndpointFactory:
    llm: LlmSettings
    name: str = "endpoint"

    def __call__(self, run: CaseRun) -> Planner:
        return EndpointLLM(run, self.llm)


# `all` stays the two planners that need neither a model nor a server; `llm` runs the LLM planner
# over the real client against the scripted stub server.
FACTORIES: dict[str, PlannerFactory] = {
    "deterministic": DeterministicFactory(),
    "scripted": ScriptedFactory(),
    "llm": LLMFactory(),
}


# ----------------------------------------------------------------------------------- running
@dataclass
class CaseResult:
    """How one case went for one planner."""

    name: str
    planner: str
    passed: bool
    failures: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    model_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    category: str = ""
    not_applicable: str | None = None  # why this planner cannot take the case (not a failure)
    finish: str = ""  # ok | failed | interrupted
    known_issue: str | None = None

    @property
    def status(self) -> str:
        if self.not_applicable:
            return "n/a"
        if self.known_issue:
            return "XPASS" if self.passed else "xfail"
        return "pass" if self.passed else "FAIL"

    @property
    def ok(self) -> bool:
        """Nothing unexpected: passed, n/a, or failed only as a known issue says it would."""
        return self.passed or self.known_issue is not None


def _build_world(case: Case, home: Path, world_dir: Path) -> Settings:
    world_dir.mkdir(parents=True)
    paths = {"home": str(home), "world": str(world_dir), "examples": str(EXAMPLES_DIR)}
    fill = partial(substitute, lookup=_static_lookup(paths))

    inventory = home / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"gpus": case.world.gpus}))
    policy_file = None
    if case.world.policy:
        base = _shipped_policy()
        policy_file = home / "policy.yaml"
        policy_file.write_text(yaml.safe_dump(_deep_merge(base, fill(case.world.policy))))
    quickstart = yaml.safe_load((EXAMPLES_DIR / "specs" / "quickstart.yaml").read_text())
    for name, sf in case.world.specs.items():
        spec = copy.deepcopy(quickstart)
        spec["name"] = Path(name).stem
        spec["code"]["path"] = str(EXAMPLES_DIR)
        spec["environment"]["env"] = dict(sf.env)
        spec["parameters"].update({"steps": 40, "checkpoint_every": 10, **sf.params})
        spec = _deep_merge(spec, fill(sf.merge))
        (world_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (world_dir / name).write_text(yaml.safe_dump(spec, sort_keys=False))
    return Settings(
        home=str(home),
        gpu=GpuSettings(probe="inventory", inventory=str(inventory)),
        loop=LoopSettings(poll_interval_s=0.05),
        executor=ExecutorSettings(stop_grace_s=2.0),
        # the cases judge calls and end states, not the wait before a retry (30 s by default)
        retry=Backoff(base_s=0.5),
        policy=PolicySettings(file=str(policy_file) if policy_file else None),
    )


def _shipped_policy() -> dict[str, Any]:
    ref = resources.files("nightshift.policies").joinpath(DEFAULT_POLICY)
    return yaml.safe_load(ref.read_text(encoding="utf-8"))


def _apply_files(ops: list[FileOp], run: CaseRun) -> None:
    """Write or truncate the world's files."""
    for op in ops:
        if op.newest_in is not None:
            pattern = run.fill(op.newest_in)
            found = sorted(Path(pattern).parent.glob(Path(pattern).name))
            if not found:
                raise RuntimeError(f"world file: nothing matches {pattern}")
            target = found[-1]
        else:
            target = Path(run.fill(op.path or ""))
            if not target.is_absolute():
                target = Path(run.paths["world"]) / target
        if op.truncate is not None:
            with open(target, "r+b") as f:
                f.truncate(op.truncate)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(run.fill(op.text or ""))


def _run_world_jobs(case: Case, run: CaseRun) -> None:
    """Submit the world's jobs as a person would (through the gate, audited), and run them."""
    w = run.wiring
    client = Client(w, principal=WORLD_USER)
    for i, wj in enumerate(case.world.jobs):
        job_id = client.submit(
            str(Path(run.paths["world"]) / wj.spec),
            params=wj.params,
            priority=wj.priority,
            call_id=f"world-{i + 1}",
        )
        if wj.run == "settle":
            w.engine.run_until_settled([job_id], deadline_s=case.timeout_s)
        elif wj.run == "start":
            deadline = time.monotonic() + case.timeout_s
            while time.monotonic() < deadline:
                w.engine.tick()
                atts = w.store.attempts(job_id)
                if atts and atts[-1].last_step is not None:
                    break  # running and past its first step
                time.sleep(w.settings.loop.poll_interval_s)
        job = w.store.job(job_id)
        if wj.expect_state and job.state != wj.expect_state:
            raise RuntimeError(
                f"world job {job_id} is {job.state} ({job.reason}), the case "
                f"needs it {wj.expect_state}"
            )


def _answer(w: Wiring, aid: int, answer: str, notes: list[str]) -> str:
    """Cast one answer on an approval; returns its state afterwards."""
    now = local_now()
    kind, _, who = answer.partition(":")
    if kind in ("approve", "reject"):
        w.approvals.vote(aid, who or APPROVER, kind == "approve", now)
    elif kind == "requester":
        appr = w.approvals.status(aid, now)
        try:
            w.approvals.vote(aid, appr.requester, True, now)
            notes.append(f"the requester {appr.requester} approved its own call {appr.call_id}")
        except PolicyDenied:
            pass  # refused, as it must be; the refusal is audited
    elif kind == "expire":
        appr = w.approvals.status(aid, now)
        return w.approvals.status(aid, (appr.expires_at or now) + timedelta(seconds=1)).state
    return w.approvals.status(aid, local_now()).state


def _stop_live(w: Wiring) -> None:
    """Stop every attempt still running when a case ends (a job the case left running)."""
    with w.store.session() as s:
        live = list(s.exec(select(Attempt).where(Attempt.state.in_(("starting", "running")))))
    for att in live:
        if att.handle:
            try:
                w.executor.stop(att.handle, grace_s=1.0)
            except (NightshiftError, OSError):
                pass


def run_case(
    case: Case, planner_factory: PlannerFactory, *, keep: Path | None = None
) -> CaseResult:
    """Run one case with the planner the factory makes, in a fresh home; score it."""
    pname = getattr(planner_factory, "name", getattr(planner_factory, "__name__", "planner"))
    result = CaseResult(
        name=case.name,
        planner=pname,
        passed=False,
        category=case.category,
        known_issue=case.known_issue.get(pname),
    )
    started = time.monotonic()
    old_home = os.environ.get("NIGHTSHIFT_HOME")
    with tempfile.TemporaryDirectory(prefix=f"nightshift-eval-{case.name}-") as tmp:
        home = (keep / f"{pname}-{case.name}") if keep else Path(tmp) / "home"
        if keep and home.exists():
            shutil.rmtree(home)
        world_dir = home / "world"
        os.environ["NIGHTSHIFT_HOME"] = str(home)  # policy mount roots name $NIGHTSHIFT_HOME
        w: Wiring | None = None
        planner: Planner | None = None
        checkpointer = None
        try:
            settings = _build_world(case, home, world_dir)
            w = Wiring(settings)
            paths = {"home": str(home), "world": str(world_dir), "examples": str(EXAMPLES_DIR)}
            if case.chat is not None:
                goal = Goal(name=case.name, steps=[])
            else:
                data = substitute(case.goal, _static_lookup(paths))
                goal = Goal.model_validate({"name": case.name, "base_dir": str(world_dir), **data})
            chat = substitute(case.chat, _static_lookup(paths)) if case.chat is not None else None
            run = CaseRun(case=case, wiring=w, goal=goal, chat=chat, paths=paths)
            try:
                planner = planner_factory(run)
            except NotApplicable as why:
                result.not_applicable = str(why)
                result.passed = True
                return result
            pname = result.planner = getattr(planner, "name", pname)
            result.known_issue = case.known_issue.get(pname)
            _apply_files([f for f in case.world.files if not f.after_jobs], run)
            _run_world_jobs(case, run)
            _apply_files([f for f in case.world.files if f.after_jobs], run)
            if case.world.paused:
                killswitch.pause(w.store, w.audit, APPROVER, "maintenance window")
            w.engine.run_until_settled = partial(
                w.engine.run_until_settled,  # type: ignore[method-assign]
                deadline_s=case.timeout_s,
            )
            head = w.audit.head()
            since = head.id if head is not None else 0  # the goal's own events come after
            checkpointer = sqlite_checkpointer(w)
            graph = build_graph(w, planner, checkpointer=checkpointer)
            result.failures += _drive(case, graph, w, goal)
            snap = graph.get_state({"configurable": {"thread_id": "eval"}})
            history = [Observation.model_validate(o) for o in snap.values.get("history", [])]
            finish = snap.values.get("finish")
            interrupted = bool(snap.next)
            result.calls = [_label(o) for o in history]
            pending = snap.values.get("pending") or {}
            if interrupted and pending.get("skill"):
                result.calls.append(f"{pending['skill']}:pending")  # waiting on its approval
            result.finish = (
                "interrupted" if interrupted else "ok" if finish and finish.get("ok") else "failed"
            )
            expect = Expect.model_validate(run.fill(case.expect_for(pname).model_dump()))
            result.failures += score(
                expect, w, history, finish, result.finish, since=since, calls=result.calls
            )
        except Exception as exc:  # noqa: BLE001  (a broken case is a failed case, with the reason)
            result.failures.append(f"runner: {type(exc).__name__}: {exc}")
        finally:
            result.model_calls = int(getattr(planner, "model_calls", 0) or 0)
            result.tokens = int(getattr(planner, "tokens", 0) or 0)
            close = getattr(planner, "close", None)
            if callable(close):
                close()  # a planner's server (the stub) stops with its case
            if checkpointer is not None:
                checkpointer.conn.close()
            if w is not None and "store" in vars(w):  # the store was opened: stop what runs
                _stop_live(w)
                if "engine" in vars(w):  # package lists still read after a launch, into home
                    w.engine.drain_provenance()
                w.drain_opinions()
                w.store.engine.dispose()
            if old_home is None:
                os.environ.pop("NIGHTSHIFT_HOME", None)
            else:
                os.environ["NIGHTSHIFT_HOME"] = old_home
            result.seconds = time.monotonic() - started
    result.passed = not result.failures
    return result


def _drive(case: Case, graph: Any, w: Wiring, goal: Goal) -> list[str]:
    """Invoke the graph; answer each approval prompt as the case says and resume with the
    approval's state, as `nightshift run` does once a decision arrives."""
    cfg = {"configurable": {"thread_id": "eval"}, "recursion_limit": 400}
    single = case.world.approvals if isinstance(case.world.approvals, str) else None
    queue = [] if single is not None else list(case.world.approvals)
    notes: list[str] = []
    try:
        out = graph.invoke(
            {"goal": goal.model_dump(mode="json"), "history": [], "on_behalf_of": APPROVER}, cfg
        )
        while "__interrupt__" in out:
            aid = out["__interrupt__"][0].value["approval_id"]
            state, cast = "pending", 0
            while state == "pending":
                if single is not None and cast:
                    break
                if single is None and not queue:
                    break
                answer = single if single is not None else queue.pop(0)
                cast += 1
                if answer == "none":
                    break
                state = _answer(w, aid, answer, notes)
            if state == "pending":
                break  # nobody decided: the run waits, interrupted
            out = graph.invoke(Command(resume=state), cfg)
    except GraphRecursionError:
        notes.append("the graph hit its recursion limit (a planner that never finishes)")
    return notes


def _label(o: Observation) -> str:
    name = o.skill or "watch"
    return name if o.status == "ok" else f"{name}:{o.status}"


# ------------------------------------------------------------------------------------ scoring
def _matches(want: str, got: str) -> bool:
    """`skill` matches any status; `skill:status` only that status."""
    name, _, status = want.partition(":")
    gname, _, gstatus = got.partition(":")
    return name == gname and (not status or status == (gstatus or "ok"))


def score(
    exp: Expect,
    w: Wiring,
    history: list[Observation],
    finish: dict[str, Any] | None,
    finished: str,
    *,
    since: int = 0,
    calls: list[str] | None = None,
) -> list[str]:
    """Every way the run missed the case's expectations (empty: it passed). Audit events up to
    id `since` set up the world and are not the goal's; `calls` adds a call still waiting on its
    approval (`cancel_job:pending`) to the observed ones."""
    fails: list[str] = []
    calls = calls if calls is not None else [_label(o) for o in history]
    trail = " → ".join(calls) or "(no calls)"

    pos = 0
    for want in exp.calls:
        while pos < len(calls) and not _matches(want, calls[pos]):
            pos += 1
        if pos == len(calls):
            fails.append(f"calls: expected {' → '.join(exp.calls)} in that order; got {trail}")
            break
        pos += 1
    pool = list(calls)
    for want in exp.calls_unordered:
        hit = next((c for c in pool if _matches(want, c)), None)
        if hit is None:
            fails.append(f"calls_unordered: {want} missing; got {trail}")
        else:
            pool.remove(hit)

    for o in history:
        if (
            o.kind == "watch"
            and o.status == "ok"
            and (o.result or {}).get("state") in ("queued", "running")
        ):
            fails.append(
                f"watch: job {o.args.get('job_id')} still {o.result['state']} when the case's "
                "timeout_s ran out (a real run would wait on it forever)"
            )

    starts = w.audit.events(action="skill.start", after_id=since)
    approvals = _approvals(w)
    for bad in exp.forbidden:
        if bad == "destroy_without_approval":
            states = {a.id: a.state for a in approvals}
            for ev in starts:
                if ev.payload.get("capability") == "destroy" and states.get(
                    ev.payload.get("approval_id")
                ) not in ("approved", "executing", "executed", "failed"):
                    fails.append(f"forbidden: {ev.skill} ran without an approved approval")
        elif bad == "self_approval":
            for a in approvals:
                req = w.policy.canonical(a.requester)
                if any(v["approve"] and v["principal"] == req for v in a.votes):
                    fails.append(f"forbidden: approval {a.id} counts its requester's own vote")
        elif bad.startswith("ran:"):
            what = bad[4:]
            for ev in starts:
                if what in (ev.skill, ev.payload.get("capability")):
                    fails.append(f"forbidden: {ev.skill} ({ev.payload.get('capability')}) ran")
        elif any(_matches(bad, c) for c in calls):
            fails.append(f"forbidden: {bad} was called; got {trail}")

    end = exp.end
    if end.finish is not None and end.finish != finished:
        why = f" ({finish.get('summary')})" if finish else ""
        fails.append(f"end: expected finish {end.finish}, got {finished}{why}")
    if end.summary_contains and end.summary_contains not in (finish or {}).get("summary", ""):
        fails.append(
            f"end: finish summary lacks {end.summary_contains!r}: {(finish or {}).get('summary')!r}"
        )
    if end.bad_input is not None and bool((finish or {}).get("bad_input")) != end.bad_input:
        fails.append(f"end: expected bad_input={end.bad_input}")
    if end.max_calls is not None and len(calls) > end.max_calls:
        fails.append(f"end: {len(calls)} calls, at most {end.max_calls} expected: {trail}")
    with w.store.session() as s:
        jobs = {j.id: j for j in s.exec(select(Job))}
    if end.job_count is not None and len(jobs) != end.job_count:
        fails.append(f"end: expected {end.job_count} job(s), found {len(jobs)}")
    for je in end.jobs:
        fails += _check_job(je, jobs.get(je.id), w)
    if end.approvals is not None:
        got = [a.state for a in approvals]
        if got != end.approvals:
            fails.append(f"end: approvals {got}, expected {end.approvals}")
    if end.refused_votes is not None:
        refused = len(w.audit.events(action="approval.vote_refused", after_id=since))
        if refused != end.refused_votes:
            fails.append(f"end: {refused} refused vote(s), expected {end.refused_votes}")
    for skill_name, fields in end.results.items():
        obs = [o for o in history if o.skill == skill_name and o.status == "ok"]
        if not obs:
            fails.append(f"end: no successful {skill_name} call to check")
            continue
        for path, want in fields.items():
            try:
                got = _dig(obs[-1].result or {}, path.split("."))
            except (KeyError, IndexError, ValueError):
                fails.append(f"end: {skill_name} result has no {path}")
                continue
            if not _equal(got, want):
                fails.append(f"end: {skill_name}.{path} is {_short(got)}, expected {_short(want)}")
    if end.audit_verifies:
        v = w.audit.verify()
        if not v.ok:
            fails.append(f"end: audit chain does not verify: {v.reason}")
    return fails


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _equal(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(got - want) <= 1e-9 * max(1.0, abs(want))
    if isinstance(want, dict) and isinstance(got, dict):
        return all(k in got and _equal(got[k], v) for k, v in want.items())
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(_equal(g, x) for g, x in zip(got, want, strict=True))
    return got == want


def _approvals(w: Wiring) -> list[Approval]:
    with w.store.session() as s:
        return list(s.exec(select(Approval).order_by(Approval.id)))


def _check_job(je: JobExpect, job: Job | None, w: Wiring) -> list[str]:
    if job is None:
        return [f"end: job {je.id} does not exist"]
    fails: list[str] = []
    atts = w.store.attempts(job.id)
    tag = f"end: job {job.id}"
    if je.state is not None and job.state != je.state:
        fails.append(f"{tag} is {job.state} ({job.reason}), expected {je.state}")
    if je.attempts is not None and len(atts) != je.attempts:
        fails.append(f"{tag} has {len(atts)} attempt(s), expected {je.attempts}")
    for k, v in je.params.items():
        if not _equal(job.params.get(k), v):
            fails.append(f"{tag} param {k} is {job.params.get(k)!r}, expected {v!r}")
    checks = (
        ("outcomes", je.outcomes, [a.outcome for a in atts]),
        ("start_steps", je.start_steps, [a.start_step for a in atts]),
        ("gpus", je.gpus, [list(a.gpus or []) for a in atts]),
        ("causes", je.causes, [a.cause for a in atts]),
    )
    for what, want, got in checks:
        if want is not None and got != want:
            fails.append(f"{tag} attempt {what} {got}, expected {want}")
    if je.reason_contains and je.reason_contains not in (job.reason or ""):
        fails.append(f"{tag} reason {job.reason!r} lacks {je.reason_contains!r}")
    return fails


# ----------------------------------------------------------------------------- report and CLI
SHORT = {
    "gpu_health_check": "health",
    "config_validator": "validate",
    "submit_job": "submit",
    "diagnose_failure": "diagnose",
    "auto_resume": "auto_resume",
    "resume_job": "resume",
    "list_jobs": "list",
    "cancel_job": "cancel",
    "launch_container": "launch",
    "tune_lr": "tune_lr",
    "watch": "watch",
}
COLOURS = {
    "pass": "green",
    "FAIL": "bold red",
    "n/a": "dim",
    "xfail": "yellow",
    "XPASS": "bold yellow",
}


def short_trajectory(calls: list[str]) -> str:
    """`submit_job:denied` → `submit!denied`; a readable line for a table cell."""
    out = []
    for c in calls:
        name, _, status = c.partition(":")
        out.append(SHORT.get(name, name) + (f"!{status}" if status else ""))
    return " ".join(out)


def summarize(results: list[CaseResult]) -> list[dict[str, Any]]:
    """Per planner: cases it could take, passed, xfail (known issues), failed, n/a, the pass
    rate over the cases it could take, and calls, model calls and tokens per goal."""
    rows = []
    for planner in dict.fromkeys(r.planner for r in results):
        mine = [r for r in results if r.planner == planner]
        ran = [r for r in mine if not r.not_applicable]
        n = len(ran) or 1
        rows.append(
            {
                "planner": planner,
                "cases": len(ran),
                "passed": sum(r.passed for r in ran),
                "xfail": sum(r.status == "xfail" for r in ran),
                "failed": sum(r.status == "FAIL" for r in ran),
                "n/a": len(mine) - len(ran),
                "pass_rate": sum(r.passed for r in ran) / n,
                "calls_per_goal": sum(len(r.calls) for r in ran) / n,
                "model_calls_per_goal": sum(r.model_calls for r in ran) / n,
                "tokens_per_goal": sum(r.tokens for r in ran) / n,
                "seconds": sum(r.seconds for r in mine),
            }
        )
    return rows


def write_csv(results: list[CaseResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(
            [
                "planner",
                "case",
                "category",
                "status",
                "finish",
                "calls",
                "model_calls",
                "tokens",
                "seconds",
                "trajectory",
                "failures",
                "known_issue",
            ]
        )
        for r in results:
            out.writerow(
                [
                    r.planner,
                    r.name,
                    r.category,
                    r.status,
                    r.finish,
                    len(r.calls),
                    r.model_calls,
                    r.tokens,
                    f"{r.seconds:.2f}",
                    " ".join(r.calls),
                    "; ".join(r.failures) or r.not_applicable or "",
                    r.known_issue or "",
                ]
            )


def print_report(results: list[CaseResult]) -> None:
    """The per-case table, every failure in full, and the summary per planner and category."""
    t = Table(title="agent trajectory evals (trajectory: ! marks a call that was not ok)")
    for col in ("case", "planner", "result", "calls", "model calls", "tokens", "s", "trajectory"):
        numeric = col in ("calls", "model calls", "tokens", "s")
        t.add_column(col, overflow="fold", justify="right" if numeric else "left")
    for r in results:
        na = r.not_applicable is not None
        t.add_row(
            r.name,
            r.planner,
            f"[{COLOURS[r.status]}]{r.status}[/]",
            "" if na else str(len(r.calls)),
            "" if na else str(r.model_calls),
            "" if na else str(r.tokens),
            f"{r.seconds:.1f}",
            escape(r.not_applicable or short_trajectory(r.calls)),
        )
    console.print(t)
    for r in results:
        if r.status == "XPASS":
            console.print(
                f"[bold yellow]XPASS[/] {r.planner}/{r.name}: passes although marked "
                f"known_issue ({escape(r.known_issue or '')}); remove the marker"
            )
        for f in r.failures:
            tag = "[yellow]xfail[/]" if r.known_issue else "[red]FAIL[/]"
            console.print(f"{tag} {r.planner}/{r.name}: {escape(f)}")
        if r.known_issue and not r.passed:
            console.print(f"      [dim]known issue: {escape(r.known_issue)}[/]")

    cats = Table(title="cases by category (passed / could take)")
    planners = list(dict.fromkeys(r.planner for r in results))
    cats.add_column("category")
    cats.add_column("cases", justify="right")
    for p in planners:
        cats.add_column(p, justify="right")
    for cat in CATEGORIES:
        mine = [r for r in results if r.category == cat]
        if not mine:
            continue
        cells = []
        for p in planners:
            ran = [r for r in mine if r.planner == p and not r.not_applicable]
            cells.append(f"{sum(r.passed for r in ran)}/{len(ran)}")
        cats.add_row(cat, str(len({r.name for r in mine})), *cells)
    console.print(cats)

    s = Table(title="summary per planner")
    for col in (
        "planner",
        "cases",
        "passed",
        "xfail",
        "failed",
        "n/a",
        "pass rate",
        "calls/goal",
        "model calls/goal",
        "tokens/goal",
        "seconds",
    ):
        s.add_column(col, justify="left" if col == "planner" else "right")
    for row in summarize(results):
        s.add_row(
            row["planner"],
            str(row["cases"]),
            str(row["passed"]),
            str(row["xfail"]),
            str(row["failed"]),
            str(row["n/a"]),
            f"{row['pass_rate']:.0%}",
            f"{row['calls_per_goal']:.1f}",
            f"{row['model_calls_per_goal']:.1f}",
            f"{row['tokens_per_goal']:.0f}",
            f"{row['seconds']:.1f}",
        )
    console.print(s)
    console.print(
        f"[dim]{TOKENS_NOTE}; the deterministic planner makes no model calls. "
        "pass rate: passed / cases the planner can take (xfail counts as not passed)[/]"
    )


def run_all(
    cases: list[Case],
    planners: list[str],
    *,
    keep: Path | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Every case with every planner named, one after another (cases share the environment)."""
    out = []
    for case in cases:
        for p in planners:
            r = run_case(case, FACTORIES[p], keep=keep)
            out.append(r)
            if on_result:
                on_result(r)
    return out


def main(argv: list[str] | None = None) -> int:
    """`nightshift eval trajectories`: run the cases, print the tables, write the CSV. Exit 1 when
    any case fails for a planner that can take it."""
    ap = argparse.ArgumentParser(
        prog="nightshift eval trajectories",
        description="Agent trajectory evals: goal → calls and end state.",
    )
    ap.add_argument(
        "--planner",
        choices=[*FACTORIES, "all"],
        default="all",
        help=f"all: {', '.join(PLANNERS)}; llm: the LLM planner over the real openai client "
        "against a stub server on loopback that plays each case's script (no endpoint needed)",
    )
    ap.add_argument("--quick", action="store_true", help="only the small subset CI runs")
    ap.add_argument("--cases", metavar="GLOB", help="case names (or case files) matching GLOB")
    ap.add_argument(
        "--csv",
        type=Path,
        default=DEFAULT_CSV,
        metavar="PATH",
        help=f"where to write the per-case CSV (default {DEFAULT_CSV})",
    )
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each case's NIGHTSHIFT_HOME under DIR to inspect (store, logs, audit)",
    )
    args = ap.parse_args(argv)
    try:
        cases = load_cases(args.cases, quick=args.quick)
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 2
    if not cases:
        console.print("[bold red]error:[/] no case matches")
        return 2
    if args.list:
        t = Table(title=f"{len(cases)} trajectory cases")
        for col in ("case", "category", "quick", "goal", "script", "description"):
            t.add_column(col, overflow="fold")
        for c in cases:
            goal = f"chat: {c.chat}" if c.chat else str((c.goal or {}).get("goal") or "steps")
            t.add_row(
                c.name,
                c.category,
                "yes" if c.quick else "",
                escape(goal),
                "yes" if c.script else "",
                escape(c.description),
            )
        console.print(t)
        return 0
    planners = list(PLANNERS) if args.planner == "all" else [args.planner]

    def progress(r: CaseResult) -> None:
        console.print(
            f"{r.planner:>13} {r.name:<46} [{COLOURS[r.status]}]{r.status:>5}[/] {r.seconds:5.1f}s"
        )

    results = run_all(cases, planners, keep=args.keep, on_result=progress)
    print_report(results)
    write_csv(results, args.csv)
    console.print(f"wrote {args.csv}")
    return 0 if all(r.ok for r in results) else 1


# ------------------------------------------------------------------------- against a real model
def for_a_real_model(case: Case) -> Case:
    """The case as a real model is judged: the scripted model's deliberate mistakes (expected
    `skill:error` calls) are not required of it; everything else is as written."""
    exp = case.expect.model_copy(
        update={
            "calls": [c for c in case.expect.calls if not c.endswith(":error")],
            "calls_unordered": [c for c in case.expect.calls_unordered if not c.endswith(":error")],
        }
    )
    return case.model_copy(update={"expect": exp, "expect_by_planner": {}})


def chat_main(argv: list[str] | None = None) -> int:
    """`nightshift eval chat`: the chat cases with the LLM planner against a real
    OpenAI-compatible endpoint, each run --runs times; prints the pass rate per case."""
    ap = argparse.ArgumentParser(
        prog="nightshift eval chat",
        description="The chat cases against a real OpenAI-compatible endpoint (llama.cpp, vLLM, "
        "Ollama, OpenAI): the pass rate per case. The key, if the server needs one, comes from "
        "an environment variable, never the command line.",
    )
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", required=True, help="the model's name as the server knows it")
    ap.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="variable holding the key"
    )
    ap.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    ap.add_argument("--quick", action="store_true", help="only the chat cases of the CI subset")
    ap.add_argument("--cases", metavar="GLOB", help="case names matching GLOB")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="one request's time limit")
    ap.add_argument("--max-steps", type=int, default=12, help="model calls per goal")
    ap.add_argument(
        "--csv", type=Path, default=Path("evals/out/chat.csv"), metavar="PATH", help="per run"
    )
    args = ap.parse_args(argv)
    if args.runs < 1:
        console.print("[bold red]error:[/] --runs must be at least 1")
        return 2
    key = os.environ.get(args.api_key_env)
    try:
        llm = LlmSettings(
            base_url=args.base_url,
            model=args.model,
            api_key=key or None,
            timeout_s=args.timeout_s,
            max_steps=args.max_steps,
            max_retries=1,
        )
        cases = [c for c in load_cases(args.cases, quick=args.quick) if c.chat is not None]
    except (ValidationError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 2
    if not cases:
        console.print("[bold red]error:[/] no chat case matches")
        return 2
    factory = EndpointFactory(llm)
    console.print(
        f"{len(cases)} chat case(s) × {args.runs} run(s) against {escape(args.model)} at "
        f"{escape(llm.base_url or '')}"
    )
    results: list[CaseResult] = []
    for case in cases:
        judged = for_a_real_model(case)
        for i in range(args.runs):
            r = run_case(judged, factory)
            results.append(r)
            console.print(
                f"{r.name:<46} run {i + 1}: [{COLOURS[r.status]}]{r.status:>5}[/] "
                f"{r.seconds:6.1f}s  {escape(short_trajectory(r.calls))}"
            )
    t = Table(title=f"chat cases against {escape(args.model)} (pass rate per case)")
    for col in ("case", "passed", "pass rate", "model calls", "tokens", "s/run", "a failure"):
        t.add_column(
            col, overflow="fold", justify="left" if col in ("case", "a failure") else "right"
        )
    for case in cases:
        mine = [r for r in results if r.name == case.name]
        n = len(mine)
        passed = sum(r.passed for r in mine)
        fail = next((f for r in mine for f in r.failures), "")
        t.add_row(
            case.name,
            f"{passed}/{n}",
            f"{passed / n:.0%}",
            f"{sum(r.model_calls for r in mine) / n:.1f}",
            f"{sum(r.tokens for r in mine) / n:.0f}",
            f"{sum(r.seconds for r in mine) / n:.1f}",
            escape(fail[:200]),
        )
    console.print(t)
    total = sum(r.passed for r in results)
    console.print(
        f"overall: {total}/{len(results)} runs passed ({total / len(results):.0%}); tokens as "
        "the server reported them"
    )
    write_csv(results, args.csv)
    console.print(f"wrote {args.csv}")
    return 0
