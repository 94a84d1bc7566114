"""The LLM planner: any OpenAI-compatible server (OpenAI, vLLM, Ollama, llama.cpp's server) plans
a goal into tool calls, one per step, with the skill registry's tool schemas.

What the model may do, and what it never does:

* It chooses the next call. The call is a `Call` like any planner's: the graph records it, the
  gate validates its arguments against the skill's input model, decides the policy, audits it and
  runs it (or asks a human first). A refused call comes back as an observation, which goes back
  to the model as the tool result so it can correct itself, a bounded number of times in a row.
  Arguments that are not a JSON object are refused, never run with defaults.
* Everything the model reads that someone other than nightshift wrote — the user's text, tool
  results, logs, file contents — arrives inside a labelled block (`untrusted()`), and the system
  prompt says such blocks are data. No model output is ever run as a command.
* Known failures stay with the deterministic playbooks: when a job this goal launched fails or
  is paused, the recover playbook (diagnose → auto_resume → resume) takes over without a model
  call; the model comes back to explain once the playbook is done.
* Each goal has a step budget and a token budget; each model call is one `llm.step` audit event
  (tokens, latency, cost, never the key). An endpoint that fails ends the goal with a `Finish`
  naming the endpoint and what to check (a context overflow as one), never a traceback, with
  the operator's exit code (EXIT_ENDPOINT, as `nightshift doctor`).

Sized for small models (issue 32): a step offers the few tools the request's intent routes to
(tool_routing.py) in compact schemas every server accepts (tool_schemas.py), under a short
system prompt, with earlier results as short observations (observations.py), within
llm.prompt_budget; llm.all_tools sends everything to a large model. Ids, sweep names and read
paths the model names are checked against the store before the gate (grounding.py): a guess goes
back to the model, never runs. The same call made again is stopped (llm.max_repeats); words
answering a question about the world with nothing looked up get one reminder, then fail. Where
the server decodes under a schema, llm.tool_mode makes the call unbreakable
(constrained_calls.py).

The conversation is rebuilt from the goal and the graph's history at every step, so a goal
resumed in another process (`nightshift run --resume`) continues with the same context.
"""

from __future__ import annotations

import json
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from nightshift.agent.brain import constrained_calls
from nightshift.agent.brain.goals import Goal, recover_goal
from nightshift.agent.brain.grounding import Grounding
from nightshift.agent.brain.observations import summarise
from nightshift.agent.brain.planner import (
    Action,
    Call,
    DeterministicPlanner,
    Finish,
    Observation,
    Watch,
)
from nightshift.agent.brain.tool_routing import matched, route
from nightshift.agent.brain.tool_schemas import sent_schema
from nightshift.prompts import load, render
from nightshift.runtime.config import LlmSettings, Settings
from nightshift.runtime.errors import ConfigError, NightshiftError
from nightshift.skills.base import field_errors
from nightshift.skills.registry import registry

if TYPE_CHECKING:
    from openai import OpenAI

    from nightshift.policies.audit import AuditLog

AGENT = "agent"
PROMPTS = ("system", "skill_guidance", "answer_style")  # with llm.all_tools
SHORT_PROMPTS = ("system_short",)  # the default: a small model's context is small
# A question about the world that the model answered without looking: one reminder, then this.
DID_NOT_LOOK = "the model did not look anything up"
REMINDER = (
    "You answered without calling a tool. The request is about jobs, GPUs or costs: call the "
    "tool that looks it up, then finish with what the result says."
)
# The exit code of an endpoint failure, for `chat --once`, `run` and `doctor` alike: the
# operator fixes the endpoint or its configuration.
EXIT_ENDPOINT = 5
MIN_TOOLS = 3  # tools a step offers however small the budget (with watch_job and finish)

# The planner's own tools, next to the skills: wait for a job, and end the goal.
META_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "watch_job",
            "description": "Wait until the job is no longer queued or running, then return its "
            "state, attempts and latest attempt (log path, exit code, last step).",
            "parameters": {
                "type": "object",
                "properties": {"job_id": {"type": "integer"}},
                "required": ["job_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "End the goal: ok says whether it was met; summary is the answer "
            "the user reads.",
            "parameters": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "summary": {"type": "string"}},
                "required": ["ok"],
            },
        },
    },
]
META_NAMES = frozenset(t["function"]["name"] for t in META_TOOLS)

# The key an argument text that is not a JSON object is kept under: no input model has the
# field, so the gate refuses the call before anything runs, and the error names it.
NOT_JSON = "arguments_were_not_json"

# Skills whose result names jobs this goal started: a failure of one of those is a known failure.
LAUNCHES = ("submit_job", "submit_jobs", "resume_job", "retry_job", "reproduce_job")


def tool_schemas() -> list[dict[str, Any]]:
    """The OpenAI tool definitions of every registered skill, in the subset every server takes
    (agent/brain/tool_schemas.py), then watch_job and finish: what `llm.all_tools` sends."""
    return [sent_schema(s) for _, s in sorted(registry().items())] + META_TOOLS


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """The prompt's size in tokens as the scripted server counts it (its JSON's length / 4):
    no tokenizer is at hand offline, and a real one counts fewer (about 5 characters a token
    for these prompts), so a budget kept by this count is kept by the server's."""
    return len(json.dumps([messages, tools], default=str)) // 4


# ------------------------------------------------------------------------------ untrusted text
_OPEN = re.compile(r"<{3,}")
_CLOSE = re.compile(r">{3,}")
_LABEL = re.compile(r"[^A-Za-z0-9_.:/@#-]")


def neutralise(text: str) -> str:
    """Text with every run of three or more angle brackets turned into look-alikes (‹‹‹, ›››),
    so nothing inside a block can open or close one."""
    text = _OPEN.sub(lambda m: "‹" * len(m.group()), text)
    return _CLOSE.sub(lambda m: "›" * len(m.group()), text)


def untrusted(text: str, source: str, **labels: Any) -> str:
    """`text` as a labelled block of data for the model:

    <<<untrusted source=tool:job_logs call=call_3>>>
    ...
    <<<end untrusted>>>
    """
    parts = [f"source={_LABEL.sub('_', source)[:80]}"]
    parts += [f"{k}={_LABEL.sub('_', str(v))[:80]}" for k, v in labels.items() if v is not None]
    return f"<<<untrusted {' '.join(parts)}>>>\n{neutralise(text)}\n<<<end untrusted>>>"


# ------------------------------------------------------------------------------ the endpoint
@dataclass(frozen=True)
class Endpoint:
    """A configured model endpoint. The key stays a SecretStr: its repr never shows it."""

    base_url: str
    model: str
    api_key: SecretStr | None
    timeout_s: float
    max_retries: int

    def describe(self) -> str:
        return f"{self.model} at {self.base_url}"

    def client(self) -> OpenAI:
        """The real `openai` client for this endpoint. A server that needs no key (llama.cpp,
        Ollama, vLLM by default) gets a placeholder: the client refuses to start without one."""
        try:
            from openai import OpenAI
        except ImportError:
            raise ConfigError(
                f"a model endpoint is configured ({self.describe()}), but the openai client is "
                "not installed: pip install 'nightshift[llm]'"
            ) from None

        key = self.api_key.get_secret_value() if self.api_key is not None else "no-key"
        return OpenAI(
            base_url=self.base_url,
            api_key=key,
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )


def endpoint(settings: Settings) -> Endpoint | None:
    """The configured endpoint, or None when no base URL or no model is set (then only the
    deterministic planner plans). ConfigError for a key file that others may read."""
    llm = settings.llm
    if not llm.base_url or not llm.model:
        return None
    key = llm.api_key
    if key is None and llm.api_key_file:
        key = SecretStr(_read_key_file(Path(llm.api_key_file).expanduser()))
    return Endpoint(llm.base_url, llm.model, key, llm.timeout_s, llm.max_retries)


def _read_key_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"llm.api_key_file {path}: cannot be read ({exc.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"llm.api_key_file {path}: others may read it; `chmod 600 {path}` (it holds a secret)"
        )
    if not text:
        raise ConfigError(f"llm.api_key_file {path}: empty")
    return text


NO_ENDPOINT = (
    "no model endpoint is configured: set OPENAI_BASE_URL (e.g. http://127.0.0.1:8080/v1) and "
    "NIGHTSHIFT_MODEL, and OPENAI_API_KEY if the server needs one (or llm.base_url and llm.model "
    "in the config file); `nightshift doctor` checks them"
)


# ------------------------------------------------------------------------------ the planner
class _WatchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: int = Field(ge=1)


class _Retry(Exception):
    """The model's reply cannot become an action; the message goes back to it as the result."""


class LLMPlanner:
    """Plans with a model over an OpenAI-compatible endpoint (see the module docstring)."""

    name = "llm"

    def __init__(
        self,
        ep: Endpoint,
        llm: LlmSettings,
        *,
        audit: AuditLog | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        client: OpenAI | None = None,
        grounding: Grounding | None = None,
    ):
        self.endpoint = ep
        self.llm = llm
        self.audit = audit
        self.on_step = on_step
        self.client = client if client is not None else ep.client()
        # The ids and paths the model names are checked against this store before the gate.
        store = getattr(audit, "store", None)
        self.grounding = grounding or (Grounding(store) if store is not None else None)
        self.schemas = {n: sent_schema(s) for n, s in sorted(registry().items())}
        self.system = "\n\n".join(load(p) for p in (PROMPTS if llm.all_tools else SHORT_PROMPTS))
        self.playbook = DeterministicPlanner()
        # Per goal, counted from the goal's first step (a planner may plan many goals in turn).
        self.model_calls = 0
        self.tokens = 0
        self.cost = 0.0
        self.reminded = False

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        audit: AuditLog | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
    ) -> LLMPlanner:
        """The planner for the configured endpoint; ConfigError when none is configured."""
        ep = endpoint(settings)
        if ep is None:
            raise ConfigError(NO_ENDPOINT)
        grounding = None
        store = getattr(audit, "store", None)
        if store is not None:
            grounding = Grounding(store, read_roots(settings))
        return cls(ep, settings.llm, audit=audit, on_step=on_step, grounding=grounding)

    # the planner protocol -------------------------------------------------------------------
    def next(self, goal: Goal, history: list[Observation]) -> Action:
        if not history:
            self.model_calls, self.tokens, self.cost = 0, 0, 0.0
            self.reminded = False
        if goal.steps is not None or goal.goal == "recover":
            # Explicit steps and the recover playbook leave nothing for a model to choose.
            return self.playbook.next(goal, history)
        owned, action = _playbook_segments(self.playbook, history)
        if action is not None:
            return action
        streak = 0
        for o in reversed(history):
            if o.status != "error" or not o.bad_input or o.kind != "call":
                break
            streak += 1
        if streak >= self.llm.max_bad_calls:
            return Finish(
                ok=False,
                summary=f"the model's last {streak} calls were refused, the last one: "
                f"{history[-1].error}",
            )
        messages = self._messages(goal, history, owned)
        return self._ask(goal, history, messages, self.tools_for(goal, history, messages[:2]))

    # the conversation -----------------------------------------------------------------------
    def tools_for(
        self, goal: Goal, history: list[Observation], head: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """The tools this step offers: every one with llm.all_tools; else those the request's
        intent routes to (agent/brain/tool_routing.py) and the history used, as many as leave a
        quarter of llm.prompt_budget to the conversation after the system prompt and the request
        (`head`), at least MIN_TOOLS; then watch_job and finish."""
        if self.llm.all_tools:
            return [*self.schemas.values(), *META_TOOLS]
        used = [o.skill for o in history if o.skill in self.schemas]
        tools = [self.schemas[n] for n in route(_goal_words(goal), used, known=self.schemas)]
        room = self.llm.prompt_budget - self.llm.prompt_budget // 4
        while len(tools) > MIN_TOOLS and estimate_tokens(head or [], tools + META_TOOLS) > room:
            tools.pop()  # the least useful first: routing put them last
        return tools + META_TOOLS

    def _messages(
        self, goal: Goal, history: list[Observation], owned: set[int]
    ) -> list[dict[str, Any]]:
        if goal.goal == "chat":
            user = render("user_chat", request=untrusted(goal.text or "", "user:chat"))
        else:
            described = goal.model_dump(mode="json", exclude_defaults=True, exclude={"base_dir"})
            if goal.goal == "train":
                described.update(goal.spec_args())
            user = render("user_goal", goal=untrusted(json.dumps(described, indent=1), "goal_file"))
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": user},
        ]
        for i, o in enumerate(history):
            call_id = f"call_{i + 1}"
            name = o.skill or "watch_job"
            raw = o.args.get(NOT_JSON) if set(o.args) == {NOT_JSON} else None
            arguments = raw if isinstance(raw, str) else json.dumps(o.args, default=str)
            msgs.append(
                {
                    "role": "assistant",
                    # A string, never null: llama-cpp-python's server refuses null (and its
                    # chat templates read the key), and the API takes "" beside tool calls.
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ],
                }
            )
            body: dict[str, Any] = {"status": o.status}
            if i in owned:
                body["planned_by"] = "nightshift's recover playbook, not you"
            if o.status == "ok":
                body["result"] = o.result
            elif raw is not None and not (o.error or "").startswith("UnknownSkill"):
                body["error"] = _not_json_error(name, raw)
            else:
                body["error"] = o.error
            msgs.append({"role": "tool", "tool_call_id": call_id, "body": body, "name": name})
        return self._fit(msgs, self.tools_for(goal, history, msgs[:2]))

    def _fit(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tool messages' contents, as short observations that fit the prompt budget: the
        newest at llm.observation_chars, older ones shorter as the budget needs (with
        llm.all_tools: the raw JSON, cut at llm.max_tool_result_chars)."""
        tool_msgs = [m for m in msgs if m["role"] == "tool"]
        if self.llm.all_tools:
            for m in tool_msgs:
                body, name = m.pop("body"), m.pop("name")
                m["content"] = self._raw_result(body, name, m["tool_call_id"])
            return msgs
        bodies = [(m.pop("body"), m.pop("name")) for m in tool_msgs]
        limits = [self.llm.observation_chars] * len(tool_msgs)
        older = len(tool_msgs) - 1
        while True:
            for m, (body, name), limit in zip(tool_msgs, bodies, limits, strict=True):
                m["content"] = self._tool_result(body, name, m["tool_call_id"], limit)
            if estimate_tokens(msgs, tools) <= self.llm.prompt_budget or older <= 0:
                return msgs
            # Shorten the oldest results first, down to a line each, newest last.
            for j in range(older):
                limits[j] = max(120, limits[j] // 2)
            if all(limits[j] == 120 for j in range(older)):
                older -= 1

    def _tool_result(self, body: dict[str, Any], name: str, call_id: str, limit: int) -> str:
        status = body.get("status")
        head = f"status: {status}"
        if body.get("planned_by"):
            head += f" (planned_by {body['planned_by']})"
        value = body.get("result") if status == "ok" else body.get("error")
        text = f"{head}: {summarise(value, limit)}" if value not in (None, "", {}) else head
        return untrusted(text, f"tool:{name}", call=call_id)

    def _raw_result(self, body: dict[str, Any], name: str, call_id: str) -> str:
        text = json.dumps(body, default=str, ensure_ascii=False)
        limit = self.llm.max_tool_result_chars
        if len(text) > limit:
            text = text[:limit] + f" … [cut: {len(text) - limit} more characters]"
        return untrusted(text, f"tool:{name}", call=call_id)

    # one planning step ----------------------------------------------------------------------
    def _ask(
        self,
        goal: Goal,
        history: list[Observation],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> Action:
        retries = 0
        while True:
            if self.model_calls >= self.llm.max_steps:
                return Finish(
                    ok=False,
                    summary=f"step budget spent: {self.model_calls} model calls for this goal "
                    f"(llm.max_steps={self.llm.max_steps}); the goal is not finished",
                )
            if self.tokens >= self.llm.max_tokens:
                return Finish(
                    ok=False,
                    summary=f"token budget spent: {self.tokens} tokens for this goal "
                    f"(llm.max_tokens={self.llm.max_tokens}); the goal is not finished",
                )
            reply, failed = self._complete(goal, history, messages, tools)
            if failed is not None:
                return failed
            try:
                return self._action(goal, history, reply)
            except _Remind:
                # Words where a look was due: one reminder, as the user, then a plain failure.
                self.reminded = True
                messages = [
                    *messages,
                    {"role": "assistant", "content": (reply.get("content") or "")[:500]},
                    {"role": "user", "content": REMINDER},
                ]
            except _Retry as why:
                # A reply that names no call the graph can take (a bad watch_job or finish, text
                # that is not JSON for a skill that takes any argument, an id or a path that
                # names nothing): back to the model now; nothing ran.
                retries += 1
                self._record_refusal(goal, history, str(why))
                if retries >= self.llm.max_bad_calls:
                    return Finish(
                        ok=False, summary=f"the model's calls kept failing, the last one: {why}"
                    )
                call = reply["tool_calls"][0]
                messages = [
                    *messages,
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": self._tool_result(
                            {"status": "error", "error": str(why)},
                            call["function"]["name"],
                            call["id"],
                            self.llm.observation_chars,
                        ),
                    },
                ]

    def _complete(
        self,
        goal: Goal,
        history: list[Observation],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> tuple[dict[str, Any], Finish | None]:
        """One chat completion: the reply message as a plain dict, or the Finish an endpoint
        failure ends the goal with. Records the step either way."""
        ep = self.endpoint
        self.model_calls += 1
        estimate = estimate_tokens(messages, tools)
        step: dict[str, Any] = {
            "goal": goal.name,
            "step": self.model_calls,
            "model": ep.model,
            "endpoint": ep.base_url,
            "tools_offered": len(tools),
            "prompt_estimate": estimate,
        }
        if history:
            thread = history[-1].call_id.rsplit("/", 1)[0]
            step["call_id"] = f"{thread}/{len(history) + 1}"
        constrained = self.llm.tool_mode in ("json_schema", "json_object")
        if constrained:  # the call under the server's schema-constrained decoding
            request: dict[str, Any] = {
                "messages": constrained_calls.as_plain_messages(messages, tools),
                "response_format": constrained_calls.response_format(tools, self.llm.tool_mode),
            }
        else:
            request = {
                "messages": messages,
                "tools": tools,
                # The API's default with tools, said outright: llama-cpp-python's server treats
                # a request without it as "none" and offers the model no tools at all.
                "tool_choice": "auto",
            }
        step["tool_mode"] = self.llm.tool_mode
        started = time.monotonic()
        try:
            resp = self.client.chat.completions.create(
                model=ep.model,
                temperature=0,
                # A tool call needs few tokens; a rambling small model is stopped, not waited on.
                max_tokens=self.llm.max_reply_tokens,
                **cast(Any, request),
            )
        except Exception as exc:  # noqa: BLE001  (every endpoint failure ends the goal clearly)
            step["latency_s"] = round(time.monotonic() - started, 3)
            summary = endpoint_failure(self.endpoint, exc, prompt_estimate=estimate)
            step["error"] = summary
            self._record(step)
            return {}, Finish(ok=False, summary=summary, operator=True)
        step["latency_s"] = round(time.monotonic() - started, 3)
        usage = getattr(resp, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        self.tokens += prompt + completion
        step.update(
            prompt_tokens=prompt,
            completion_tokens=completion,
            goal_tokens=self.tokens,
            cost=self._cost(prompt, completion),
        )
        choices = getattr(resp, "choices", None) or []
        if not choices:
            step["error"] = "no choices in the reply"
            self._record(step)
            return {}, Finish(
                ok=False,
                summary=f"the model endpoint {ep.base_url} answered without any choice: "
                f"check that {ep.model} serves chat completions there",
                operator=True,
            )
        choice = choices[0]
        msg = choice.message
        calls: list[dict[str, Any]] = [
            {
                "id": tc.id or f"call_{i}",
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for i, tc in enumerate(msg.tool_calls or [])
            if getattr(tc, "type", "function") == "function" and getattr(tc, "function", None)
        ]
        if constrained and not calls:
            call = constrained_calls.call_from_content(msg.content)
            calls = [call] if call is not None else []
        reply: dict[str, Any] = {
            "content": None if constrained and calls else msg.content,
            "refusal": msg.refusal,
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
        }
        step["finish_reason"] = choice.finish_reason
        step["tool"] = calls[0]["function"]["name"] if calls else None
        if len(calls) > 1:
            step["ignored_tool_calls"] = len(calls) - 1  # one call per step: the model re-plans
        self._record(step)
        return reply, None

    def _action(self, goal: Goal, history: list[Observation], reply: dict[str, Any]) -> Action:
        ep = self.endpoint
        if reply.get("refusal"):
            return Finish(ok=False, summary=f"the model refused: {reply['refusal']}")
        calls = reply.get("tool_calls") or []
        if not calls:
            content = reply.get("content")
            text = (content or "").strip()
            if text:  # an answer in words is the model's way of finishing
                return self._answer(goal, history, text)
            cut = (
                f" (it stopped at llm.max_reply_tokens={self.llm.max_reply_tokens})"
                if reply.get("finish_reason") == "length"
                else ""
            )
            what = "content null" if content is None else f"empty content {content!r}"
            return Finish(
                ok=False,
                summary=f"the model {ep.describe()} answered with neither a tool call nor "
                f"text ({what}){cut}: check that the server parses tool calls for this model "
                "(llama.cpp server: --jinja; vLLM: --enable-auto-tool-choice and a "
                "--tool-call-parser); `nightshift doctor` checks it",
            )
        fn = calls[0]["function"]
        name, raw = str(fn.get("name") or ""), fn.get("arguments")
        args, why = _parse_arguments(raw)
        if name == "finish":
            if args is None:
                raise _Retry(_not_json_error(name, raw, why))
            ok = args.get("ok", True)
            ok = ok if isinstance(ok, bool) else str(ok).strip().lower() in ("true", "1", "yes")
            summary = str(args.get("summary") or reply.get("content") or "")
            if ok:
                return self._answer(goal, history, summary)
            return Finish(ok=False, summary=summary)
        if name == "watch_job":
            if args is None:
                raise _Retry(_not_json_error(name, raw, why))
            try:
                job_id = _WatchArgs.model_validate(args).job_id
            except ValidationError as exc:
                raise _Retry(f"watch_job: invalid arguments: {field_errors(exc)}") from None
            self._ground("watch_job", "read", {"job_id": job_id})
            return Watch(job_id=job_id, why="planned by model")
        if args is None:
            skill = registry().get(name)
            if skill is not None and skill.input_model.model_config.get("extra") == "allow":
                raise _Retry(_not_json_error(name, raw, why))  # an open model would take it
            # Refused by the gate (the input model has no such field): audited, never run.
            return Call(skill=name, args={NOT_JSON: str(raw)[:2000]}, why="planned by model")
        skill = registry().get(name)
        if skill is not None:
            self._ground(name, skill.capability, args)
        # The same call again (refused arguments have their own bound, llm.max_bad_calls).
        key = _call_key(name, args)
        same = [
            o
            for o in history
            if o.skill == name and not o.bad_input and _call_key(name, o.args) == key
        ]
        repeats = len(same)
        if repeats >= self.llm.max_repeats:
            last = same[-1]
            return Finish(
                ok=False,
                summary=f"the model made the same call {repeats + 1} times ({name} "
                f"{json.dumps(args, default=str)[:200]}; llm.max_repeats={self.llm.max_repeats});"
                f" the last result: {last.status}"
                + (f" ({_short(last.error, 200)})" if last.error else ""),
            )
        return Call(skill=name, args=args, why="planned by model")

    def _ground(self, name: str, capability: str, args: dict[str, Any]) -> None:
        """Refuse, back to the model, a call naming a job, a sweep or a path that is not there."""
        if self.grounding is None:
            return
        why = self.grounding.check(name, capability, args)
        if why is not None:
            raise _Retry(why)

    def _answer(self, goal: Goal, history: list[Observation], text: str) -> Finish:
        """The model's answer, unless it answers a question about the world without having
        looked at it: then one reminder, and after it a plain failure."""
        looked = any(o.status == "ok" for o in history)
        about_world = goal.goal == "chat" and bool(matched(goal.text or ""))
        if looked or not about_world:
            return Finish(ok=True, summary=text)
        if not self.reminded:
            raise _Remind
        return Finish(
            ok=False,
            summary=f"{DID_NOT_LOOK}: it answered without calling any tool, after a reminder, "
            f"so its words are a guess. It said: {_short(text, 300)!r}",
        )

    # bookkeeping ----------------------------------------------------------------------------
    def _cost(self, prompt: int, completion: int) -> float | None:
        pin, pout = self.llm.price_in_per_1k, self.llm.price_out_per_1k
        if pin is None and pout is None:
            return None
        cost = prompt / 1000 * (pin or 0.0) + completion / 1000 * (pout or 0.0)
        self.cost += cost
        return round(cost, 6)

    def _record_refusal(self, goal: Goal, history: list[Observation], why: str) -> None:
        """A call refused before the gate (grounding, a bad watch_job or finish) is audited as
        the step's refusal: it never became a call the gate saw."""
        if self.audit is not None:
            call_id = None
            if history:
                call_id = f"{history[-1].call_id.rsplit('/', 1)[0]}/{len(history) + 1}"
            self.audit.append(
                AGENT,
                "llm.refused",
                call_id=call_id,
                payload={"goal": goal.name, "step": self.model_calls, "why": _short(why, 500)},
            )

    def _record(self, step: dict[str, Any]) -> None:
        if self.audit is not None:
            self.audit.append(AGENT, "llm.step", call_id=step.get("call_id"), payload=step)
        if self.on_step is not None:
            self.on_step(dict(step))


def _call_key(name: str, args: dict[str, Any]) -> str:
    """A call's arguments as its input model reads them (defaults filled), for "the same call"."""
    skill = registry().get(name)
    args = {k: v for k, v in args.items() if v is not None}  # the graph records {} as job_id None
    try:
        value: Any = skill.parse(args).model_dump(mode="json") if skill is not None else args
    except Exception:  # noqa: BLE001  (arguments the model refuses: compared as they came)
        value = args
    return json.dumps(value, sort_keys=True, default=str)


class _Remind(Exception):
    """The model answered a question about the world in words, without looking: remind it."""


def _goal_words(goal: Goal) -> str:
    """What routing reads: the chat request, or a goal file's goal, name and text."""
    if goal.goal == "chat":
        return goal.text or ""
    return " ".join(str(x) for x in (goal.goal, goal.name, goal.text or "") if x)


def read_roots(settings: Settings) -> list[Path] | None:
    """The folders a read skill the model calls may open: the policy's allowed roots (None:
    the policy sets none, and reads are not confined)."""
    from nightshift.policies.model import load_policy

    try:
        roots = load_policy(settings.policy.file).limits.mount_roots()
    except (OSError, ValueError, NightshiftError):
        return None
    return None if roots is None else [*roots, settings.home_path.resolve()]


_CONTEXT = re.compile(r"context|n_ctx|too long|too many tokens", re.IGNORECASE)
_CONTEXT_SIZE = re.compile(
    r"(?:context(?: length| size| window)?|n_ctx)\D{0,40}?(\d[\d,]*)|(\d[\d,]*) tokens",
    re.IGNORECASE,
)


def context_overflow(message: str) -> int | None:
    """The model's context size when `message` (an HTTP 400's) says the prompt overflowed it:
    0 when it says so without a number, None when it is about something else."""
    if not _CONTEXT.search(message):
        return None
    m = _CONTEXT_SIZE.search(message)
    return int((m.group(1) or m.group(2)).replace(",", "")) if m else 0


def endpoint_failure(ep: Endpoint, exc: Exception, *, prompt_estimate: int | None = None) -> str:
    """What went wrong with a request to the endpoint, and what to check, in one line."""
    import openai

    where = f"the model endpoint {ep.base_url}"
    tries = f"after {ep.max_retries} retr{'y' if ep.max_retries == 1 else 'ies'}"
    if isinstance(exc, openai.APITimeoutError):
        return (
            f"{where} did not answer within {ep.timeout_s:g} s ({tries}): check that the "
            "server is up and not overloaded, or raise llm.timeout_s"
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return (
            f"cannot reach {where} ({type(cause).__name__}: {_short(str(cause), 160)}): check "
            "OPENAI_BASE_URL (llm.base_url) and that the server runs; `nightshift doctor` checks it"
        )
    if isinstance(exc, openai.RateLimitError):
        return (
            f"{where} refused with 429 Too Many Requests {tries}: wait and run the goal again, "
            "or raise llm.max_retries or the server's rate limit"
        )
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return (
            f"{where} refused the key (HTTP {exc.status_code}): check OPENAI_API_KEY "
            "(llm.api_key or llm.api_key_file)"
        )
    if isinstance(exc, openai.NotFoundError):
        return (
            f"{where} answered 404 for model {ep.model}: check NIGHTSHIFT_MODEL (llm.model; "
            "GET /models lists what the server has) and that the URL ends in /v1"
        )
    if isinstance(exc, openai.APIStatusError):
        detail = _short(getattr(exc, "message", "") or str(exc))
        if exc.status_code >= 500:
            return f"{where} answered HTTP {exc.status_code} {tries}: {detail}; check its log"
        size = context_overflow(detail) if exc.status_code in (400, 413) else None
        if size is not None:
            sent = f", about {prompt_estimate} were sent" if prompt_estimate else ""
            return (
                "the prompt is longer than the model's context ("
                + (f"{size} tokens" if size else "its size not given")
                + f"{sent}): {where} answered HTTP {exc.status_code}: {detail}. Start the server "
                "with a larger context (llama.cpp: -c 8192), or lower llm.prompt_budget; "
                "llm.all_tools sends far more"
            )
        return (
            f"{where} answered HTTP {exc.status_code}: {detail}; the server may not support "
            "this request (tool calls for this model?)"
        )
    return f"{where} failed: {type(exc).__name__}: {_short(str(exc))}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """The arguments as a mapping, or None and why they are not one. No arguments at all (an
    empty string, as some servers send for a tool without parameters) is an empty mapping."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, ""
    if isinstance(raw, dict):
        return raw, ""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, ""


def _not_json_error(name: str, raw: Any, why: str = "") -> str:
    if not why:
        why = _parse_arguments(raw)[1]
    return (
        f"{name}: the arguments were not JSON ({why}); nothing ran. Send the call again with "
        "the arguments as one JSON object that matches the tool's parameters"
    )


# ------------------------------------------------------------------------------ known failures
def _launched(o: Observation) -> set[int]:
    """Jobs an ok observation of a launching skill started or requeued."""
    if o.status != "ok" or o.skill not in LAUNCHES:
        return set()
    r = o.result or {}
    ids = {r["job_id"]} if isinstance(r.get("job_id"), int) else set()
    ids |= {j["job_id"] for j in r.get("jobs") or [] if isinstance(j.get("job_id"), int)}
    return ids


def _known_failure(o: Observation, launched: set[int]) -> int | None:
    """The job id when `o` watched a job this goal launched and found it failed or paused."""
    if o.kind != "watch" or o.status != "ok":
        return None
    r = o.result or {}
    job = r.get("job_id", o.args.get("job_id"))
    if r.get("state") in ("failed", "paused") and job in launched:
        return int(job)
    return None


def _playbook_segments(
    playbook: DeterministicPlanner, history: list[Observation]
) -> tuple[set[int], Action | None]:
    """Which observations the recover playbook planned, and its next action while it still owns
    the goal (None: the model plans). It takes over at a watch that found a job this goal launched
    failed or paused, and owns every step until it would finish; it is deterministic, so its
    steps are found again by replaying it on the history."""
    owned: set[int] = set()
    launched: set[int] = set()
    i = 0
    while i < len(history):
        launched |= _launched(history[i])
        job = _known_failure(history[i], launched)
        if job is None:
            i += 1
            continue
        goal = recover_goal(job)
        end = i + 1
        while True:
            action = playbook.next(goal, history[i:end])
            if isinstance(action, Finish):
                break  # the playbook is done: the model explains, or plans on
            if end == len(history):
                return owned, action
            owned.add(end)
            launched |= _launched(history[end])
            end += 1
        i = end
    return owned, None
