"""The chat session behind `nightshift chat`: what a person types, turned into events.

UI-free: the Textual app (agent/tui) and `nightshift chat --once TEXT` both drive a ChatSession
and show the events it emits — the agent's answers, a tool card per skill call (arguments,
verdict and rule, result), approvals that need a decision, and the model's per-step stats.

Two paths, one gate:

- **Direct commands** (`status`, `health`, `submit FILE`, `logs JOB`, `cancel JOB`, `retry JOB`,
  `approve ID`, `reject ID [REASON]`, `why did job N fail`, `pause`, `resume`, … `help` lists
  them) run the deterministic path without any model: each is one or two skill calls through
  `Gate.call` as the person at the chat. A destructive one is their own request: they confirm it
  (the `confirm` callback: a modal in the TUI, y/N at a terminal) where the policy lets a
  requester confirm, or it waits for other principals' votes.
- **Everyday requests in free words**, English or Chinese ("could you show me the logs of job
  2?", "what did last night cost", "任务 3 为什么失败", "今晚提交 spec.yaml") are understood by the
  deterministic parser in agent/doors/intents.py and run the same commands. Every id is grounded
  first: a job or approval that does not exist is answered with the ones that do, and nothing
  runs. A request that needs a job and names none (or a name two jobs share) gets one question
  back ("Which job? …"); the next message ("2", "the second", "任务 2") completes it.
- **Anything else** is free text for the model planner: a `goal: chat` goal run through the
  agent graph, whose calls are the `agent` principal's. A call that needs approval pauses the
  graph; the person at the chat is another principal and may vote on it, and the graph resumes
  when the approval is decided — here or anywhere else (another shell, the daemon).

What the person types, the logs and every result are data: shown, never executed, and never
read as a command beyond the grammar below. Without a model endpoint the free-text path says so.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field

from nightshift.agent.doors import intents
from nightshift.agent.doors.intents import Intent
from nightshift.policies.gate import Confirm, Via
from nightshift.runtime.errors import (
    ApprovalRejected,
    ApprovalRequired,
    BadArguments,
    NightshiftError,
    OperatorError,
    Refused,
    UnknownJob,
)

if TYPE_CHECKING:
    from nightshift.agent.brain.planner import Planner
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import Approval, Job

# How the person's own calls reach the gate: a person who can confirm their own call here
# (policies/gate.py, PERSON_HERE), told apart from a shell in the audit.
USER_VIA: Via = "chat"

MAX_JOB_ID = 2**63 - 1
LOG_LINES = 40

Outcome = Literal["ok", "failed", "bad_input", "refused", "waiting", "operator"]
EXIT_CODES: dict[str, int] = {
    "ok": 0,
    "failed": 1,
    "bad_input": 2,
    "refused": 3,
    "waiting": 4,
    "operator": 5,
}

NO_ENDPOINT = (
    "Free-form requests need a model endpoint, and none is configured: set OPENAI_BASE_URL "
    "(and OPENAI_API_KEY if the server asks for one) and NIGHTSHIFT_MODEL, then run "
    "`nightshift doctor` to check them. Without a model I understand the direct commands; "
    "`help` lists them."
)


# ------------------------------------------------------------------------------------ events
class Answer(BaseModel):
    """What the agent says: a direct command's answer, or the end of a planned goal."""

    kind: Literal["answer"] = "answer"
    text: str
    outcome: Outcome = "ok"
    stats: dict[str, Any] | None = Field(
        None, description="Totals of the model steps behind this answer (tokens, latency, cost)"
    )


class ToolCard(BaseModel):
    """One skill call, as it goes: planned → (pending) → ok | error | denied | rejected. The same
    call_id is emitted again as it changes."""

    kind: Literal["tool"] = "tool"
    call_id: str
    skill: str
    args: dict[str, Any] = Field(default_factory=dict)
    requester: str
    why: str = ""
    status: Literal["planned", "running", "pending", "ok", "error", "denied", "rejected"] = (
        "planned"
    )
    decision: str | None = Field(None, description="The policy's verdict: allow, deny, ...")
    rule: str | None = None
    reasons: list[str] = Field(default_factory=list)
    summary: str = ""
    result: dict[str, Any] | None = None
    error: str | None = None


class ApprovalView(BaseModel):
    """The whole request behind an approval, as a person deciding it needs to see it."""

    id: int
    call_id: str
    skill: str
    args: dict[str, Any]
    requester: str
    requested_via: str
    rule: str
    quorum: int
    state: str
    votes: list[dict[str, Any]] = Field(default_factory=list)
    approvers: list[str] = Field(default_factory=list, description="Who has approved so far")
    created_at: datetime | None = None
    expires_at: datetime | None = None
    files: dict[str, str] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list, description="Why the policy asks")
    claims: dict[str, Any] = Field(default_factory=dict)
    jobs: list[dict[str, Any]] = Field(
        default_factory=list, description="The jobs it touches, as they are now"
    )
    thread_id: str | None = None


class ApprovalNeeded(BaseModel):
    kind: Literal["approval"] = "approval"
    approval: ApprovalView
    can_vote: bool = Field(description="Whether the person at the chat may approve it")
    note: str = ""


class ApprovalClosed(BaseModel):
    kind: Literal["approval_closed"] = "approval_closed"
    approval_id: int
    state: str


class StepStats(BaseModel):
    """One planning step of the model: tokens, latency, cost, as the planner reports them."""

    kind: Literal["stats"] = "stats"
    thread_id: str
    step: int
    data: dict[str, Any]


class Progress(BaseModel):
    """A line about what runs meanwhile: a job watched, an attempt's step, a retry's wait."""

    kind: Literal["progress"] = "progress"
    text: str


ChatEvent = Annotated[
    Answer | ToolCard | ApprovalNeeded | ApprovalClosed | StepStats | Progress,
    Field(discriminator="kind"),
]
Emit = Callable[[BaseModel], None]
# Given the per-step callback, a planner for one goal.
PlannerFactory = Callable[[Callable[[dict[str, Any]], None]], "Planner"]


# ------------------------------------------------------------------------------------ helpers
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from a log, a result or a model, safe to show: control characters (terminal escapes,
    carriage returns) become visible placeholders instead of acting on the terminal."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text.replace("\r\n", "\n"))


def now() -> datetime:
    from nightshift.agent.brain.wiring import local_now

    return local_now()


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summarize(
    skill: str | None, status: str, result: dict[str, Any] | None, error: str | None
) -> str:
    """One plain line for a call's outcome (no markup: it holds data)."""
    if status not in ("ok", "planned", "running", "pending"):
        return f"{status}: {error or ''}".strip()
    if status != "ok":
        return status
    r = result or {}
    if skill == "watch":
        att = r.get("attempt") or {}
        return f"job {r.get('job_id')} {r.get('state')}" + (
            f" after attempt {att.get('number')} (last step {att.get('last_step')})" if att else ""
        )
    if skill == "gpu_health_check":
        first = (str(r.get("message") or "").splitlines() or [""])[0]
        return f"GPU health {r.get('overall')}: {first}"
    if skill == "config_validator":
        return (
            f"spec {'valid' if r.get('valid') else 'INVALID'}: "
            f"{len(r.get('errors') or [])} error(s), {len(r.get('warnings') or [])} warning(s)"
        )
    if skill == "submit_job":
        return f"queued job {r.get('job_id')} ({r.get('name')})"
    if skill == "reproduce_job":
        return (
            f"queued job {r.get('job_id')} reproducing job {r.get('source_job_id')} "
            f"attempt {r.get('source_attempt')}"
        )
    if skill == "submit_jobs":
        return "queued jobs " + ", ".join(str(j.get("job_id")) for j in r.get("jobs") or [])
    if skill == "list_jobs":
        return f"{len(r.get('jobs') or [])} job(s)"
    if skill == "show_job":
        return f"job {r.get('job_id')} {r.get('state')}, {len(r.get('attempts') or [])} attempt(s)"
    if skill == "job_logs":
        return f"{len(r.get('lines') or [])} log line(s) of job {r.get('job_id')}"
    if skill in ("cancel_job", "pause_job", "retry_job", "resume_job"):
        return f"job {r.get('job_id')}: {r.get('before')} → {r.get('after')}"
    if skill == "diagnose_failure":
        return f"{r.get('category')} (retryable: {'yes' if r.get('retryable') else 'no'})"
    if skill == "auto_resume":
        return (
            f"checkpoint at step {r.get('step')}"
            if r.get("found")
            else f"no checkpoint: {r.get('message')}"
        )
    return f"{skill}: ok"


def approval_view(w: Wiring, row: Approval) -> ApprovalView:
    """The approval with what the policy said about its call and the jobs it touches."""
    from nightshift.runtime.store.db import Job

    verdict = w.audit.events(
        call_id=row.call_id, action="policy.verdict", limit=1, newest_first=True
    )
    payload = verdict[0].payload if verdict else {}
    claims = payload.get("claims") or {}
    job_ids = list(claims.get("jobs") or [])
    if not job_ids and isinstance(row.args.get("job_id"), int):
        job_ids = [row.args["job_id"]]
    jobs = []
    with w.store.session() as s:
        for jid in job_ids[:20]:
            job = s.get(Job, jid)
            if job is not None:
                jobs.append(
                    {
                        "id": job.id,
                        "name": job.name,
                        "state": job.state,
                        "owner": job.owner,
                        "priority": job.priority,
                        "reason": job.reason,
                    }
                )
    return ApprovalView(
        id=row.id or 0,
        call_id=row.call_id,
        skill=row.skill,
        args=row.args,
        requester=row.requester,
        requested_via=row.requested_via,
        rule=row.rule,
        quorum=row.quorum,
        state=row.state,
        votes=list(row.votes),
        approvers=sorted({v["principal"] for v in row.votes if v.get("approve")}),
        created_at=row.created_at,
        expires_at=row.expires_at,
        files=dict(row.files),
        reasons=list(payload.get("reasons") or []),
        claims={k: v for k, v in claims.items() if v},
        jobs=jobs,
        thread_id=row.thread_id,
    )


def model_planner_factory(w: Wiring) -> PlannerFactory | None:
    """The model planner (agent/brain/llm.py) when an endpoint is configured, else None: without one,
    chat keeps to the direct commands."""
    from nightshift.agent.brain.llm import LLMPlanner, endpoint

    if endpoint(w.settings) is None:
        return None

    def make(on_step: Callable[[dict[str, Any]], None]) -> Planner:
        return LLMPlanner.from_settings(w.settings, audit=w.audit, on_step=on_step)

    return make


def endpoint_label(w: Wiring) -> str | None:
    """`model at base_url` of the configured endpoint, for a header; None without one."""
    from nightshift.agent.brain.llm import endpoint

    ep = endpoint(w.settings)
    return None if ep is None else ep.describe()


def format_stats(data: dict[str, Any]) -> str:
    """`512 in / 40 out tokens · 0.81 s · cost 0.0004 · → submit_job` from an `llm.step` record
    (agent/brain/llm.py; the cost is in the currency of the configured prices)."""
    parts = []
    tin, tout = data.get("prompt_tokens"), data.get("completion_tokens")
    if tin is not None or tout is not None:
        parts.append(
            f"{tin if tin is not None else '?'} in / {tout if tout is not None else '?'} out tokens"
        )
    latency = data.get("latency_s")
    if isinstance(latency, int | float):
        parts.append(f"{latency:.2f} s")
    cost = data.get("cost")
    if isinstance(cost, int | float):
        parts.append(f"cost {cost:.4f}")
    if data.get("tool"):
        parts.append(f"→ {data['tool']}")
    if data.get("error"):
        parts.append(f"error: {data['error']}")
    return " · ".join(parts) or ", ".join(f"{k}={v}" for k, v in data.items())


SUMMED = ("prompt_tokens", "completion_tokens", "latency_s", "cost")


def add_stats(total: dict[str, Any], data: dict[str, Any]) -> None:
    """Add one step's tokens, latency and cost to the totals of a goal."""
    total["steps"] = total.get("steps", 0) + 1
    for key in SUMMED:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            total[key] = round(total.get(key, 0) + value, 6)


# ------------------------------------------------------------------------------------ grammar
class Usage(Exception):
    """A direct command with arguments it cannot take."""


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    help: str


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("status", "status", "jobs and their attempts (also: jobs)"),
        Command("health", "health", "check the GPUs and give each a verdict"),
        Command("submit", "submit FILE", "validate an experiment spec and queue it"),
        Command("show", "show JOB", "one job: state, attempts, causes"),
        Command("logs", "logs JOB [LINES]", "the end of a job's log"),
        Command("cancel", "cancel JOB [REASON]", "end a job for good (you confirm it)"),
        Command("retry", "retry JOB [from-scratch]", "one more attempt of a failed job"),
        Command("why", "why did job N fail", "diagnose the job's last failed attempt"),
        Command("approve", "approve ID", "approve another principal's pending call"),
        Command("reject", "reject ID [REASON]", "reject a pending call, with a reason"),
        Command("pause", "pause [JOB | REASON]", "pause a job; alone: the kill switch"),
        Command(
            "resume", "resume [JOB]", "resume a held or paused job; alone: lift the kill switch"
        ),
        Command("approvals", "approvals", "the pending approvals"),
        Command("skill", "skill NAME [k=v ...]", "call any skill through the gate"),
        Command("help", "help", "this list"),
    )
}
ALIASES = {"jobs": "status", "?": "help", "log": "logs", "approvals": "approvals"}

WHY = re.compile(
    r"^\s*why\s+(?:did|does|has|is)?\s*(?:job\s*)?(?P<id>#?[0-9]+)\s*"
    r"(?:(?:fail|failed|die|died|crash|crashed|break|broke|stop|stopped)\s*)?\??\s*$",
    re.IGNORECASE,
)


def help_text() -> str:
    width = max(len(c.usage) for c in COMMANDS.values())
    lines = ["Direct commands (no model needed; each call goes through the policy gate):"]
    lines += [f"  {c.usage.ljust(width)}  {c.help}" for c in COMMANDS.values()]
    lines.append(
        "Everyday requests in free words work too, in English or Chinese: what is running?, "
        "why did 3 fail, show me the logs of job 2, submit FILE tonight / after job 3, kill "
        "job 4, what did last night cost?, 现在有哪些任务在跑？, 看看任务 2 的日志, 取消任务 4, 批准 5."
    )
    lines.append(
        "Anything else is a request for the model planner (needs OPENAI_BASE_URL and "
        "NIGHTSHIFT_MODEL; `nightshift doctor` checks them)."
    )
    return "\n".join(lines)


_ID = re.compile(r"#?([0-9]{1,19})")


def _number(text: str) -> int | None:
    """An id as typed (`3` or `#3`, ASCII digits), if it is one the store can hold."""
    m = _ID.fullmatch(text)
    value = int(m.group(1)) if m else 0
    return value if 1 <= value <= MAX_JOB_ID else None


def _job_id(args: list[str], usage: str) -> tuple[int, list[str]]:
    """A job id from the front of `args` (`3`, `#3` or `job 3`) and what follows it."""
    rest = list(args)
    if rest and rest[0].lower() == "job":
        rest = rest[1:]
    value = _number(rest[0]) if rest else None
    if value is None:
        raise Usage(usage)
    return value, rest[1:]


def _approval_id(args: list[str], usage: str) -> tuple[int, list[str]]:
    value = _number(args[0]) if args else None
    if value is None:
        raise Usage(usage)
    return value, args[1:]


CANDIDATES = 200  # jobs a question may choose among (newest first)
ASKED = 8  # choices a question lists
LISTED = 5  # jobs "no such job N; these exist: …" names
# The jobs a request without an id may mean, by intent; () any.
FITS: dict[str, tuple[str, ...]] = {
    "why": ("failed",),
    "retry": ("failed",),
    "cancel": ("queued", "running", "paused", "held"),
    "hold": ("queued", "running", "paused"),
    "release": ("held", "paused"),
    "logs": (),
    "show": (),
}
VERB = {
    "why": "explain",
    "retry": "retry",
    "cancel": "cancel",
    "hold": "hold",
    "release": "release",
    "logs": "show the log of",
    "show": "show",
}
USAGE_OF = {"why": "why", "retry": "retry", "cancel": "cancel", "hold": "pause"}
USAGE_OF |= {"release": "resume", "logs": "logs", "show": "show"}


def _name_matches(name: str, said: str) -> bool:
    return said.casefold() in name.casefold()


def _named(jobs: list[Any], said: str) -> tuple[list[Any], bool]:
    """The jobs a name points at: those with exactly that name (True), else those whose name
    holds it (False: a change is then asked about, never guessed)."""
    exact = [j for j in jobs if j.name.casefold() == said.casefold()]
    if exact:
        return exact, True
    return [j for j in jobs if len(said) >= 2 and _name_matches(j.name, said)], False


def _depending_on(spec: Any, name: str) -> dict[str, Any]:
    """The spec as a mapping that also waits for a job named `name`; its code folder made
    absolute, since a mapping has no file to be relative to."""
    mapping = spec.model_dump(mode="json")
    mapping["code"] = {**(mapping.get("code") or {}), "path": str(spec.run_dir())}
    mapping["depends_on"] = list(dict.fromkeys([*spec.depends_on, name]))
    return mapping


# ------------------------------------------------------------------------------------ session
@dataclass
class _Waiter:
    """What resumes once an approval is decided: a paused graph, or the person's own call."""

    resume: Callable[[str], None]


@dataclass
class _Question:
    """A request waiting for the person to say which job (or approval) they mean."""

    intent: Intent
    choices: list[tuple[int, str, str]]  # (id, name, label), in the order the question listed
    what: str = "job"


@dataclass
class _Goal:
    thread: str
    cards: dict[str, ToolCard] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    ticks: dict[int, tuple[Any, ...]] = field(default_factory=dict)


class ChatSession:
    """One person's chat with nightshift. `send(text)` handles one message (blocking: a UI calls
    it from a worker thread) and emits events as they come; `decide` votes on an approval;
    `poll` resumes what waited on approvals decided since (here or elsewhere)."""

    def __init__(
        self,
        w: Wiring,
        *,
        emit: Emit | None = None,
        confirm: Confirm | None = None,
        planner_factory: PlannerFactory | None = None,
        use_model: bool = True,
        spawn: Callable[[Callable[[], None]], None] | None = None,
        cwd: Path | None = None,
    ):
        self.w = w
        self.user = w.user
        self._emit = emit or (lambda event: None)
        self.confirm = confirm
        self.planner_factory = (
            planner_factory
            if planner_factory is not None
            else (model_planner_factory(w) if use_model else None)
        )
        self._spawn = spawn or (lambda fn: fn())
        self.cwd = cwd or Path.cwd()
        self._lock = threading.Lock()
        self._waiting: dict[int, _Waiter] = {}
        self._owned: set[int] = set()
        self._threads: list[str] = []
        self._checkpointer: Any = None
        self._question: _Question | None = None
        self.loop_owner: Literal["chat", "daemon", "none"] = "none"

    # The loop ------------------------------------------------------------------------------------
    def start_loop(self, background: bool = True) -> str:
        """Without a daemon, run the scheduler/monitor loop here for the jobs this chat queued
        (as `nightshift run` does for its goal); with one, leave placing to it. Returns who
        places this chat's jobs: chat | daemon | none (no background loop: a goal that watches
        its job still ticks the loop, for this chat's jobs only, while it waits)."""
        from nightshift.agent.doors.daemon import DaemonLock

        if DaemonLock.held(self.w.settings.home_path):
            self.w.engine.passive = True
            self.loop_owner = "daemon"
            return self.loop_owner
        self.w.engine.scope = self.owned_jobs
        self.w.loop.report = lambda line: self._emit(Progress(text=printable(line)))
        if background:
            self.w.engine.start_background()
            self.loop_owner = "chat"
        return self.loop_owner

    def stop_loop(self) -> None:
        if self.loop_owner == "chat":
            self.w.engine.stop_background()

    def owned_jobs(self) -> set[int]:
        """The jobs this chat queued or requeued: the only ones its own loop starts."""
        from nightshift.agent.doors.summary import thread_jobs

        with self._lock:
            owned, threads = set(self._owned), list(self._threads)
        for thread in threads:
            owned.update(thread_jobs(self.w, thread))
        return owned

    @property
    def has_model(self) -> bool:
        return self.planner_factory is not None

    # Messages ------------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Handle one message: a direct command, or free text for the model planner. Errors the
        person can act on are answers, never exceptions."""
        text = text.strip()
        if text:
            self._guard(lambda: self._dispatch(text))

    def decide(self, approval_id: int, approve: bool, reason: str = "") -> None:
        """Vote on an approval as this user (the approvals layer refuses a requester's own
        approval and a user without can_approve), note the reason in the audit, and resume
        whatever waited on it if that settles it. A refused vote is an answer."""
        self._guard(lambda: self._decide(approval_id, approve, reason))

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except ApprovalRequired as exc:  # the person's own call, waiting for others' votes
            self._answer(str(exc), "waiting")
        except BadArguments as exc:
            self._answer(str(exc), "bad_input")
        except Refused as exc:
            self._answer(str(exc), "refused")
        except OperatorError as exc:
            self._answer(str(exc), "operator")
        except NightshiftError as exc:
            self._answer(f"{type(exc).__name__}: {exc}", "failed")
        except Exception as exc:  # a bug: one answer that says so, never a traceback at the user
            self._answer(
                f"internal error (a bug; please report it): {type(exc).__name__}: {exc}", "failed"
            )

    def _dispatch(self, text: str) -> None:
        with self._lock:
            question, self._question = self._question, None
        if question is not None:
            choice = intents.parse_choice(text)
            if choice is not None and choice.name is not None:
                first = choice.name.split()[0]
                if first in COMMANDS or first in ALIASES:  # `help`, `status`: a new request
                    choice = None
            if choice is not None:
                try:
                    self._answer_question(question, choice)
                except Usage as exc:
                    self._answer(f"usage: {exc}", "bad_input")
                return
        why = WHY.match(text)
        if why:
            self._why(int(why.group("id").lstrip("#")))
            return
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        verb = words[0].lower() if words else ""
        verb = ALIASES.get(verb, verb)
        handler = getattr(self, f"_cmd_{verb}", None) if verb in COMMANDS else None
        usage: Usage | None = None
        if handler is not None:
            try:
                handler(words[1:])
                return
            except Usage as exc:
                usage = exc
        intent = intents.parse(text)
        if intent is not None:
            try:
                if self._run_intent(intent):
                    return
            except Usage as exc:  # e.g. "logs" alone, and no job to ask about
                usage = exc
        if usage is not None and not self.has_model:
            self._answer(f"usage: {usage}", "bad_input")
            return
        if not self.has_model:
            self._answer(NO_ENDPOINT, "bad_input")
            return
        self._plan(text)

    def _answer(self, text: str, outcome: Outcome = "ok", stats: dict[str, Any] | None = None):
        self._emit(Answer(text=printable(text), outcome=outcome, stats=stats))

    # One call as the person at the chat ----------------------------------------------------------
    def _call(
        self,
        skill: str,
        args: dict[str, Any],
        *,
        why: str = "",
        on_done: Callable[[Any], None] | None = None,
    ) -> Any:
        """One skill call through the gate as this user. A call that waits for other principals
        raises ApprovalRequired after registering `on_done`, which runs once it is carried out."""
        call_id = f"chat-{uuid.uuid4().hex[:12]}"
        card = ToolCard(
            call_id=call_id, skill=skill, args=args, requester=self.user, why=why, status="running"
        )
        self._emit(card.model_copy())

        def verdict(v: Any) -> None:
            card.decision, card.rule, card.reasons = v.decision, v.rule, list(v.reasons)
            if v.decision != "allow":
                self._emit(card.model_copy())

        def run(confirm: Confirm | None) -> Any:
            try:
                out = self.w.gate.call(
                    self.w.context(self.user, call_id),
                    skill,
                    args,
                    via=USER_VIA,
                    confirm=confirm,
                    on_verdict=verdict,
                )
            except ApprovalRequired:
                card.status, card.summary = "pending", "waiting for approval"
                self._emit(card.model_copy())
                raise
            except NightshiftError as exc:
                card.status = (
                    "rejected"
                    if isinstance(exc, ApprovalRejected)
                    else "denied"
                    if isinstance(exc, Refused)
                    else "error"
                )
                card.error = printable(str(exc))
                card.summary = summarize(skill, card.status, None, card.error)
                self._emit(card.model_copy())
                raise
            card.status, card.result = "ok", out.model_dump(mode="json")
            card.summary = summarize(skill, "ok", card.result, None)
            self._emit(card.model_copy())
            return out

        try:
            return run(self.confirm)
        except ApprovalRequired as exc:
            approval_id = exc.approval_id

            def carry_out(state: str) -> None:
                if state not in ("approved", "executing", "executed", "failed"):
                    card.status, card.error = "rejected", f"approval {approval_id} {state}"
                    card.summary = summarize(skill, "rejected", None, card.error)
                    self._emit(card.model_copy())
                    self._answer(
                        f"{skill}: approval {approval_id} was {state}; nothing ran", "refused"
                    )
                    return
                try:
                    out = run(None)
                except NightshiftError as err:
                    self._answer(str(err), "failed")
                    return
                if on_done is not None:
                    on_done(out)

            with self._lock:
                self._waiting[approval_id] = _Waiter(resume=carry_out)
            self._announce(approval_id, mine=True)
            raise

    def read(self, skill: str, args: dict[str, Any]) -> Any:
        """A read the UI makes for a view (a job's attempts, its log): through the gate as this
        user and audited like any call, without a card in the chat."""
        from nightshift.skills.registry import get_skill

        if get_skill(skill).capability != "read":
            raise BadArguments(f"{skill} is not a read skill")
        return self.w.gate.call(
            self.w.context(self.user, f"chat-{uuid.uuid4().hex[:12]}"), skill, args, via=USER_VIA
        )

    def can_vote(self, row: Approval) -> bool:
        """Whether this user's vote would count: not the requester, allowed to approve by the
        policy, and not voted yet (the approvals layer checks again when the vote comes)."""
        me = self.w.policy.canonical(self.user)
        return (
            row.state == "pending"
            and me != self.w.policy.canonical(row.requester)
            and self.w.policy.may_approve(self.user)
            and not any(v["principal"] == me for v in row.votes)
        )

    def _announce(self, approval_id: int, *, mine: bool) -> None:
        row = self.w.approvals.status(approval_id, now())
        view = approval_view(self.w, row)
        can_vote = not mine and self.can_vote(row)
        note = (
            f"your own {row.skill}: it needs {row.quorum} approval(s) from others (rule {row.rule})"
            if mine
            else f"approve {row.id} / reject {row.id} REASON"
            if can_vote
            else f"you may not vote on it: `nightshift approvals approve {row.id}` from another "
            "principal's shell"
        )
        self._emit(ApprovalNeeded(approval=view, can_vote=can_vote, note=note))

    # Direct commands -----------------------------------------------------------------------------
    def _cmd_help(self, args: list[str]) -> None:
        self._answer(help_text() + ("" if self.has_model else "\n" + NO_ENDPOINT))

    def _cmd_status(self, args: list[str]) -> None:
        if args:
            raise Usage(COMMANDS["status"].usage)
        self._status()

    def _status(self, states: tuple[str, ...] = ()) -> None:
        """The jobs (those in `states` where given: "what is running?") and the kill switch."""
        from nightshift.policies import killswitch

        query: dict[str, Any] = {"limit": 50}
        if states:
            query["states"] = list(states)
        r = self._call("list_jobs", query)
        lines = []
        paused = killswitch.pause_info(self.w.store)
        if paused:
            lines.append(
                f"PAUSED by {paused['by']} ({paused['reason']}): only reads run until `resume`"
            )
        for j in sorted(r.jobs, key=lambda j: j.id):
            last = j.attempts[-1] if j.attempts else None
            line = f"job {j.id} {j.name}: {j.state}"
            if last is not None:
                line += f", attempt {last.number}, step {last.last_step}"
                if last.last_loss is not None:
                    line += f", loss {_num(last.last_loss)}"
            why = j.hold_reason if j.state == "queued" else j.reason
            if why:
                line += f" — {why}"
            lines.append(line)
        if states and not r.jobs:
            lines.append(f"no {' or '.join(states)} job; `status` lists them all")
        self._answer("\n".join(lines) or "no jobs yet: `submit FILE` queues one")

    def _cmd_health(self, args: list[str]) -> None:
        if args:
            raise Usage(COMMANDS["health"].usage)
        r = self._call("gpu_health_check", {})
        lines = [f"{r.overall}: {r.message}"]
        lines += [f"  {g.summary}" for g in r.gpus if g.summary not in r.message]
        self._answer(
            "\n".join(lines), "ok" if r.overall in ("OK", "NO_GPUS", "WARNING") else "failed"
        )

    def _cmd_submit(self, args: list[str]) -> None:
        if len(args) != 1:
            raise Usage(COMMANDS["submit"].usage)
        self._submit(args[0])

    def _submit(self, spec_file: str, *, cheap: bool = False, after: int | None = None) -> None:
        """Validate and queue a spec file; `cheap` waits for the tariff's cheap hours
        (cost_class cost_sensitive), `after` waits for that job to succeed (depends_on by name,
        as `nightshift submit --after` does)."""
        from nightshift.runtime.spec import load_spec

        try:
            path = Path(spec_file).expanduser()
            if not path.is_absolute():
                path = self.cwd / path
            is_file = path.is_file()
        except (OSError, ValueError, RuntimeError):  # ~nobody, a NUL byte, a name too long
            path, is_file = Path(spec_file), False
        if not is_file:
            raise BadArguments(f"submit: no spec file {spec_file} (looked at {path})")
        check = self._call("config_validator", {"path": str(path)}, why="validate the spec")
        if not check.valid:
            errs = "; ".join(f"{e.field}: {e.message}" for e in check.errors)
            raise BadArguments(f"submit: {spec_file} is not a valid spec: {errs}")
        spec = load_spec(path)
        source: dict[str, Any] = {"spec_path": str(path)}
        notes = []
        if cheap:
            source["cost_class"] = "cost_sensitive"
            notes.append("it waits for cheap hours (cost_sensitive)")
        if after is not None:
            first = self._ground_job(after)
            source = {k: v for k, v in source.items() if k != "spec_path"}
            source["spec"] = _depending_on(spec, first.name)
            notes.append(f"it starts once a job named {first.name} (job {after}) has succeeded")
            if first.state in ("failed", "cancelled"):
                notes.append(f"job {after} is {first.state}: `retry {after}` runs it again")
        trials = spec.grid()
        if len(trials) > 1:
            group = f"chat-{uuid.uuid4().hex[:8]}"
            items = [{**source, "params": t, "group": group} for t in trials]
            r = self._call("submit_jobs", {"items": items}, why="queue the sweep")
            ids = [j.job_id for j in r.jobs]
        else:
            r = self._call("submit_job", source, why="queue the run")
            ids = [r.job_id]
        with self._lock:
            self._owned.update(ids)
        self._answer(
            "; ".join([f"queued job(s) {', '.join(map(str, ids))}", *notes, self._who_places()])
        )

    def _who_places(self) -> str:
        if self.loop_owner == "chat":
            return "this chat starts it when placement allows (runs go on if you quit)"
        if self.loop_owner == "daemon":
            return "the daemon places it"
        return "`nightshift daemon` places it"

    def _cmd_show(self, args: list[str]) -> None:
        job_id, rest = _job_id(args, COMMANDS["show"].usage)
        if rest:
            raise Usage(COMMANDS["show"].usage)
        self._ground_job(job_id)
        r = self._call("show_job", {"job_id": job_id})
        lines = [f"job {r.job_id} {r.name}: {r.state}" + (f" — {r.reason}" if r.reason else "")]
        lines.append(
            f"owner {r.owner}, priority {r.priority}, {len(r.attempts)} of at most "
            f"{r.max_attempts} attempt(s), steps lost {r.steps_lost_total}"
        )
        for a in r.attempts:
            how = a.outcome or a.state
            if a.exit_code not in (None, 0):
                how += f" (exit {a.exit_code})"
            lines.append(
                f"  attempt {a.number}: steps {a.start_step}→{a.last_step}, {how}"
                + (f", cause {a.cause}" if a.cause else "")
                + (f" — {a.evidence}" if a.evidence else "")
            )
        self._answer("\n".join(lines))

    def _cmd_logs(self, args: list[str]) -> None:
        usage = COMMANDS["logs"].usage
        job_id, rest = _job_id(args, usage)
        tail = LOG_LINES
        if rest:
            lines = _number(rest[0]) if len(rest) == 1 else None
            if lines is None or lines > 5000:
                raise Usage(usage)
            tail = lines
        self._ground_job(job_id)
        r = self._call("job_logs", {"job_id": job_id, "tail": tail})
        if r.log_path is None:
            self._answer(f"job {job_id} has no attempt yet, so no log")
            return
        head = f"job {job_id}, attempt {r.attempt}, last {len(r.lines)} line(s) of {r.log_path}:"
        self._answer("\n".join([head, *r.lines]))

    def _cmd_cancel(self, args: list[str]) -> None:
        job_id, rest = _job_id(args, COMMANDS["cancel"].usage)
        reason = " ".join(rest) or f"cancelled by {self.user} in chat"
        job = self._ground_job(job_id)
        if job.state in ("succeeded", "failed", "cancelled"):
            self._answer(f"job {job_id} is {job.state}: nothing to cancel")
            return

        def done(r: Any) -> None:
            self._answer(
                f"job {job_id}: {r.before} → {r.after}"
                + (f" (attempt {r.stopped_attempt} stopped)" if r.stopped_attempt else "")
            )

        done(self._call("cancel_job", {"job_id": job_id, "reason": reason}, on_done=done))

    def _cmd_retry(self, args: list[str]) -> None:
        usage = COMMANDS["retry"].usage
        job_id, rest = _job_id(args, usage)
        if rest not in ([], ["from-scratch"], ["--from-scratch"]):
            raise Usage(usage)
        self._ground_job(job_id)

        def done(r: Any) -> None:
            with self._lock:
                self._owned.add(job_id)
            where = (
                f"from {r.resume_from} (step {r.resume_step})" if r.resume_from else "from scratch"
            )
            self._answer(
                f"job {job_id}: {r.before} → {r.after}; attempt {r.attempts + 1} starts {where}; "
                + self._who_places()
            )

        done(self._call("retry_job", {"job_id": job_id, "from_scratch": bool(rest)}, on_done=done))

    def _cmd_pause(self, args: list[str]) -> None:
        if args and (_ID.fullmatch(args[0]) or args[0].lower() == "job"):
            job_id, rest = _job_id(args, COMMANDS["pause"].usage)
            reason = " ".join(rest) or f"paused by {self.user} in chat"
            self._ground_job(job_id)

            def done(r: Any) -> None:
                if r.before == r.after:
                    self._answer(f"job {job_id} is {r.after}: only a queued or running job pauses")
                else:
                    self._answer(
                        f"job {job_id}: {r.before} → {r.after}"
                        + (f" at step {r.last_step}" if r.last_step is not None else "")
                        + f"; `resume {job_id}` resumes it from its newest checkpoint"
                    )

            done(self._call("pause_job", {"job_id": job_id, "reason": reason}, on_done=done))
            return
        from nightshift.policies import killswitch

        reason = " ".join(args) or f"paused by {self.user} in chat"
        killswitch.pause(self.w.store, self.w.audit, self.user, reason)
        self._answer("paused (kill switch): only read skills run until `resume`")

    def _cmd_resume(self, args: list[str]) -> None:
        if not args:
            from nightshift.policies import killswitch

            was = killswitch.resume(self.w.store, self.w.audit, self.user)
            self._answer("resumed: the kill switch is off" if was else "was not paused")
            return
        job_id, rest = _job_id(args, COMMANDS["resume"].usage)
        if rest:
            raise Usage(COMMANDS["resume"].usage)
        from nightshift.agent.brain.graph import job_observation

        self._ground_job(job_id)
        job = job_observation(self.w, job_id)
        if job["state"] == "held":  # a person's hold ends with release_job, then resume as paused
            released = self._call("release_job", {"job_id": job_id}, why="end the hold")
            if released.after != "paused":
                self._answer(f"job {job_id}: held → {released.after}; " + self._who_places())
                return
        elif job["state"] not in ("paused", "failed"):
            self._answer(
                f"job {job_id} is {job['state']}: only a held, paused or failed job resumes"
            )
            return
        args_ckpt: dict[str, Any] = {
            "checkpoint_dir": job["checkpoint_dir"],
            "current_step": (job.get("attempt") or {}).get("last_step"),
            "search_dirs": [job["good_checkpoint_dir"]],
        }
        if job.get("steps_per_epoch"):
            args_ckpt["steps_per_epoch"] = job["steps_per_epoch"]
        found = self._call("auto_resume", args_ckpt, why="find the newest valid checkpoint")

        def done(r: Any) -> None:
            with self._lock:
                self._owned.add(job_id)
            self._answer(
                f"job {job_id}: {r.before} → {r.after}, resuming "
                + (f"from step {r.resume_step}" if r.resume_from else "from scratch")
                + "; "
                + self._who_places()
            )

        done(
            self._call(
                "resume_job",
                {
                    "job_id": job_id,
                    "checkpoint": found.path if found.found else None,
                    "step": found.step if found.found else None,
                },
                on_done=done,
            )
        )

    def _cmd_approvals(self, args: list[str]) -> None:
        rows = self.w.approvals.pending(now())
        if not rows:
            self._answer("no pending approvals")
            return
        for row in rows:
            self._announce(row.id or 0, mine=False)
        self._answer(f"{len(rows)} pending approval(s)")

    def _cmd_approve(self, args: list[str]) -> None:
        approval_id, rest = _approval_id(args, COMMANDS["approve"].usage)
        if rest:
            raise Usage(COMMANDS["approve"].usage)
        self._decide(approval_id, True, "")

    def _cmd_reject(self, args: list[str]) -> None:
        approval_id, rest = _approval_id(args, COMMANDS["reject"].usage)
        self._decide(approval_id, False, " ".join(rest))

    def _cmd_skill(self, args: list[str]) -> None:
        if not args:
            raise Usage(COMMANDS["skill"].usage)
        import yaml

        from nightshift.agent.doors.shell import parse_key_values
        from nightshift.skills.registry import get_skill

        skill = get_skill(args[0])
        try:
            values = parse_key_values(args[1:], "skill")
        except yaml.YAMLError as exc:
            raise BadArguments(f"skill {skill.name}: a value is not YAML: {exc}") from None

        def done(r: Any) -> None:
            self._answer(
                f"{skill.name}: {summarize(skill.name, 'ok', r.model_dump(mode='json'), None)}"
            )

        done(self._call(skill.name, values, on_done=done))

    # Everyday requests (agent/doors/intents.py) ---------------------------------------------------
    def _run_intent(self, intent: Intent) -> bool:
        """Run an understood request. False when the words that should name a job name none
        (then it was not about a job after all: the model's, or the no-model message's)."""
        kind = intent.kind
        if kind == "status":
            self._status(intent.states)
        elif kind == "health":
            self._cmd_health([])
        elif kind == "cost":
            self._cost()
        elif kind == "submit":
            assert intent.path is not None
            self._submit(intent.path, cheap=intent.cheap, after=intent.after)
        elif kind in intents.NEEDS_APPROVAL:
            if intent.approval_id is None:
                self._ask_approval(intent)
            else:
                self._decide(intent.approval_id, kind == "approve", "")
        elif intent.job_id is not None:
            self._on_job(intent, intent.job_id)
        else:
            return self._pick_job(intent)
        return True

    def _on_job(self, intent: Intent, job_id: int) -> None:
        """The request about one job, by the direct command that does it (each grounds the id
        and calls its skills through the gate as this user)."""
        arg = [str(job_id)]
        kind = intent.kind
        if kind == "why":
            self._why(job_id)
        elif kind == "logs":
            self._cmd_logs(arg + ([str(intent.lines)] if intent.lines else []))
        elif kind == "show":
            self._cmd_show(arg)
        elif kind == "hold":
            self._cmd_pause(arg)
        elif kind == "release":
            self._cmd_resume(arg)
        elif kind == "cancel":
            self._cmd_cancel(arg)
        elif kind == "retry":
            self._cmd_retry(arg)

    def _pick_job(self, intent: Intent) -> bool:
        """No id given: the job a name points at, or the only one that fits a read ("why did my
        job fail" with one failed job), said which; otherwise one question back."""
        jobs = self.read("list_jobs", {"limit": CANDIDATES}).jobs
        if intent.mine:
            me = self.w.policy.canonical(self.user)
            jobs = [j for j in jobs if self.w.policy.canonical(j.owner) == me]
        exact = False
        if intent.name is not None:
            jobs, exact = _named(jobs, intent.name)
            if not jobs:
                return False
        want = intent.states or FITS[intent.kind]
        fitting = [j for j in jobs if not want or j.state in want]
        if intent.kind == "logs":
            fitting = [j for j in fitting if j.attempts]
        if intent.name is not None and not fitting:
            fitting = jobs  # the person named it: its own command says why it does not fit
        if not fitting:
            if not jobs and intent.name is None and not intent.mine:
                raise Usage(COMMANDS[USAGE_OF[intent.kind]].usage)
            which = " or ".join(want) if want else "such"
            self._answer(
                f"no {which} job{' of yours' if intent.mine else ''} to {VERB[intent.kind]}; "
                + self._these_exist(),
                "bad_input",
            )
            return True
        if len(fitting) == 1 and (exact or intent.kind not in intents.ACTING):
            j = fitting[0]
            fits = "named so" if intent.name is not None else "that fits"
            self._emit(
                Progress(
                    text=printable(f"taking job {j.id} ({j.name}, {j.state}): the only one {fits}")
                )
            )
            self._on_job(intent, j.id)
            return True
        self._ask(intent, [(j.id, j.name, f"{j.id} ({j.name}, {j.state})") for j in fitting])
        return True

    def _ask_approval(self, intent: Intent) -> None:
        rows = [r for r in self.w.approvals.pending(now()) if self.can_vote(r)]
        if not rows:
            raise Usage(COMMANDS[intent.kind].usage)
        self._ask(
            intent,
            [
                (r.id or 0, r.skill, f"{r.id} ({r.skill} {_json(r.args)[:60]} by {r.requester})")
                for r in sorted(rows, key=lambda r: -(r.id or 0))
            ],
            what="approval",
        )

    def _ask(self, intent: Intent, choices: list[tuple[int, str, str]], what: str = "job") -> None:
        """One question back; the next message completes it (`_answer_question`)."""
        shown = ", ".join(label for _, _, label in choices[:ASKED])
        more = f", and {len(choices) - ASKED} more" if len(choices) > ASKED else ""
        with self._lock:
            self._question = _Question(intent, choices, what)
        self._answer(f"Which {what}? {shown}{more}", "bad_input")

    def _answer_question(self, q: _Question, choice: intents.Choice) -> None:
        chosen: int | None = choice.number
        if choice.ordinal is not None:
            listed = q.choices[:ASKED]
            chosen = listed[choice.ordinal - 1][0] if 1 <= choice.ordinal <= len(listed) else None
        elif choice.name is not None:
            named = [c for c in q.choices if _name_matches(c[1], choice.name)]
            chosen = named[0][0] if len(named) == 1 else None
        if chosen is None:
            self._ask(q.intent, q.choices, q.what)
            return
        if q.what == "approval":
            self._decide(chosen, q.intent.kind == "approve", "")
        else:
            self._ground_job(chosen)
            self._on_job(q.intent, chosen)

    def _ground_job(self, job_id: int) -> Job:
        """The job, or UnknownJob naming the ones that exist: an id nobody stored (a typo, a
        model's guess) never reaches a skill."""
        job = self.w.store.job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
        if job is None:
            raise UnknownJob(f"no such job {job_id}; {self._these_exist()}")
        return job

    def _these_exist(self) -> str:
        """The newest jobs, as this user's `list_jobs` through the gate sees them."""
        try:
            jobs = self.read("list_jobs", {"limit": LISTED + 1}).jobs
        except NightshiftError:
            return "`status` lists the jobs"
        if not jobs:
            return "there are no jobs yet"
        return (
            "these exist: "
            + ", ".join(f"{j.id} ({j.name}, {j.state})" for j in jobs[:LISTED])
            + (", … (`status` lists them all)" if len(jobs) > LISTED else "")
        )

    def _ground_approval(self, approval_id: int) -> None:
        """An approval id that exists, or UnknownApproval naming the pending ones."""
        from nightshift.runtime.errors import UnknownApproval

        try:
            if 1 <= approval_id <= MAX_JOB_ID:
                self.w.approvals.status(approval_id, now())
                return
        except UnknownApproval:
            pass
        rows = self.w.approvals.pending(now())[:LISTED]
        pending = ", ".join(f"{r.id} ({r.skill} by {r.requester})" for r in rows)
        raise UnknownApproval(
            f"no approval with id {approval_id}; "
            + (f"pending: {pending}" if pending else "none is pending")
        )

    def _cost(self) -> None:
        """What the last 24 hours cost, as `nightshift report` counts it (energy, GPU-hours)."""
        from nightshift.agent.doors.report import default_window, report_of

        self.read("list_jobs", {"limit": 1})  # may this user read the jobs? (the gate says)
        since, until = default_window(now(), 24.0)
        r = report_of(self.w, since, until)
        if r.energy_kwh is None:
            energy = "energy not measured (no meter, no declared power)"
        else:
            energy = f"{r.energy_kwh:.3f} kWh" + (
                f", cost {r.energy_cost:.2f} {r.currency}"
                if r.energy_cost is not None
                else " (no price set)"
            )
        self._answer(
            f"last 24 h ({since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M}): {energy}; "
            f"{r.gpu_hours:.2f} GPU-hours over {r.attempts} attempt(s) of {len(r.jobs)} job(s); "
            "`nightshift report` has the rest"
        )

    def _why(self, job_id: int) -> None:
        """Diagnose the job's last failed attempt and explain it."""
        from nightshift.agent.brain.planner import MONITOR_OUTCOMES
        from nightshift.runtime.scheduling.snapshot import FAILED_OUTCOMES
        from nightshift.runtime.spec import ExperimentSpec

        job = self._ground_job(job_id)
        failed = [
            a
            for a in self.w.store.attempts(job_id)
            if a.outcome in (*FAILED_OUTCOMES, "diverged") and a.ended_at is not None
        ]
        if not failed:
            self._answer(f"job {job_id} ({job.state}) has no failed attempt to explain")
            return
        att = failed[-1]
        monitor = att.outcome if att.outcome in MONITOR_OUTCOMES else None
        spec = ExperimentSpec.model_validate(job.spec)
        args: dict[str, Any] = {
            "exit_code": att.exit_code,
            "signal": att.signal,
            "monitor_says": monitor,
            "params": att.params or job.params,
            "knobs": spec.knobs.model_dump(exclude_none=True),
        }
        if att.log_path:
            args["log_path"] = att.log_path
        if monitor and att.evidence:
            args["monitor_detail"] = att.evidence[:2000]
        d = self._call("diagnose_failure", args, why=f"attempt {att.number} {att.outcome}")
        how = att.outcome or "failed"
        if att.signal:
            how += f", signal {att.signal}"
        elif att.exit_code not in (None, 0):
            how += f", exit {att.exit_code}"
        lines = [
            f"job {job_id} attempt {att.number} ended {how} at step {att.last_step}: "
            f"{d.category} ({d.confidence} confidence; "
            f"{'retryable' if d.retryable else 'not retryable'}).",
            d.reasoning,
        ]
        lines += [f"  evidence ({e.source} line {e.line_no}): {e.text}" for e in d.evidence[:5]]
        lines.append(f"What to do: {d.remediation.message}")
        if d.retryable and job.state == "failed":
            lines.append(f"`retry {job_id}` runs it once more")
        self._answer("\n".join(lines))

    # Approvals -----------------------------------------------------------------------------------
    def _decide(self, approval_id: int, approve: bool, reason: str) -> None:
        from nightshift.policies.audit import job_id_of

        self._ground_approval(approval_id)
        row = self.w.approvals.vote(approval_id, self.user, approve, now())
        reason = reason.strip()[:2000]
        if reason:
            self.w.audit.append(
                self.user,
                "approval.reason",
                skill=row.skill,
                call_id=row.call_id,
                job_id=job_id_of(row.args),
                payload={"approval_id": approval_id, "approve": approve, "reason": reason},
            )
        votes = len({v["principal"] for v in row.votes if v.get("approve")})
        more = (
            f"; {row.quorum - votes} more approval(s) needed"
            if row.state == "pending" and approve
            else ""
        )
        self._answer(
            f"approval {approval_id} ({row.skill}): {row.state} — you voted "
            f"{'yes' if approve else 'no'}{more}",
            "ok",
        )
        self.poll()

    def waiting(self) -> list[int]:
        with self._lock:
            return sorted(self._waiting)

    def poll(self) -> list[int]:
        """Resume what waits on approvals that have been decided (here, in another shell, by the
        daemon) or have expired; returns their ids. Resuming runs through `spawn`."""
        with self._lock:
            ids = list(self._waiting)
        settled = []
        for approval_id in ids:
            row = self.w.approvals.status(approval_id, now())
            if row.state == "pending":
                continue
            with self._lock:
                waiter = self._waiting.pop(approval_id, None)
            if waiter is None:  # another poll took it
                continue
            settled.append(approval_id)
            self._emit(ApprovalClosed(approval_id=approval_id, state=row.state))
            self._spawn(partial(self._resume, waiter, row.state))
        return settled

    def _resume(self, waiter: _Waiter, state: str) -> None:
        self._guard(lambda: waiter.resume(state))

    # The model path ------------------------------------------------------------------------------
    def _graph_checkpointer(self) -> Any:
        if self._checkpointer is None:
            from nightshift.agent.brain.graph import sqlite_checkpointer

            self._checkpointer = sqlite_checkpointer(self.w)
        return self._checkpointer

    def _plan(self, text: str) -> None:
        """Free text: a `goal: chat` goal through the agent graph with the model planner."""
        from nightshift.agent.brain.goals import Goal
        from nightshift.agent.brain.graph import build_graph

        assert self.planner_factory is not None
        goal = Goal(name="chat", goal="chat", text=text[:20_000], planner="llm")
        thread = f"chat-{now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        g = _Goal(thread=thread)
        with self._lock:
            self._threads.append(thread)

        def on_step(raw: dict[str, Any]) -> None:
            g.steps += 1
            data = dict(raw)
            add_stats(g.stats, data)
            self._emit(StepStats(thread_id=thread, step=g.steps, data=data))

        planner = self.planner_factory(on_step)
        graph = build_graph(
            self.w,
            planner,
            checkpointer=self._graph_checkpointer(),
            on_progress=lambda kind, data: self._progress(g, kind, data),
        )
        cfg = {"configurable": {"thread_id": thread}, "recursion_limit": 200}
        self._run_graph(
            g,
            lambda: graph.invoke(
                {"goal": goal.model_dump(mode="json"), "history": [], "on_behalf_of": self.user},
                cfg,
            ),
            graph,
            cfg,
        )

    def _run_graph(self, g: _Goal, step: Callable[[], Any], graph: Any, cfg: dict) -> None:
        from langgraph.types import Command as Resume

        try:
            result = step()
        except NightshiftError:
            raise
        except Exception as exc:  # the model endpoint (HTTP, timeouts) or the planner failed
            self._answer(
                f"the planner failed: {type(exc).__name__}: {exc}. Direct commands still work "
                "(`help`); `nightshift doctor` checks the endpoint",
                "operator",
                stats=g.stats or None,
            )
            return
        if "__interrupt__" in result:
            req = result["__interrupt__"][0].value
            approval_id = req["approval_id"]

            def resume(state: str) -> None:
                # The graph's act node runs its gate call again first: an approved call is
                # carried out once, a rejected or expired one is refused by the gate itself.
                decision = (
                    "approved"
                    if state in ("approved", "executing", "executed", "failed")
                    else state
                )
                self._run_graph(g, lambda: graph.invoke(Resume(resume=decision), cfg), graph, cfg)

            with self._lock:
                self._waiting[approval_id] = _Waiter(resume=resume)
            self._announce(approval_id, mine=False)
            return
        fin = result.get("finish") or {"ok": False, "summary": "the goal ended without a result"}
        outcome: Outcome = (
            "ok" if fin.get("ok") else "bad_input" if fin.get("bad_input") else "failed"
        )
        if fin.get("operator"):  # the model endpoint failed: exit 5, as `nightshift doctor`
            outcome = "operator"
        self._answer(str(fin.get("summary") or ""), outcome, stats=g.stats or None)

    def _progress(self, g: _Goal, kind: str, data: dict[str, Any]) -> None:
        """The graph's progress events as cards and lines."""
        card: ToolCard | None
        if kind == "plan" and data.get("kind") == "call":
            card = ToolCard(
                call_id=data["call_id"],
                skill=data["skill"],
                args=data.get("args") or {},
                requester="agent",
                why=printable(str(data.get("why") or "")),
            )
            g.cards[card.call_id] = card
            self._emit(card.model_copy())
        elif kind == "plan" and data.get("kind") == "watch":
            card = ToolCard(
                call_id=data["call_id"],
                skill="watch",
                args={"job_id": data.get("job_id"), "wait": data.get("wait", True)},
                requester="agent",
                why=printable(str(data.get("why") or "")),
                status="running",
            )
            g.cards[card.call_id] = card
            self._emit(card.model_copy())
        elif kind == "verdict":
            card = g.cards.get(data["call_id"])
            if card is not None:
                v = data["verdict"]
                card.decision, card.rule, card.reasons = v["decision"], v["rule"], v["reasons"]
                card.status = "pending" if v["decision"] == "needs_approval" else "running"
                card.summary = "waiting for approval" if card.status == "pending" else ""
                self._emit(card.model_copy())
        elif kind == "observe":
            card = g.cards.get(data["call_id"])
            if card is None:
                return
            card.status = data["status"]
            card.result = data.get("result")
            card.error = printable(data["error"]) if data.get("error") else None
            card.summary = printable(summarize(card.skill, card.status, card.result, card.error))
            self._emit(card.model_copy())
        elif kind == "attempt" and data.get("last_step") is not None:
            key = (data["number"], data["last_step"])
            if g.ticks.get(data["job_id"]) != key:
                g.ticks[data["job_id"]] = key
                self._emit(
                    Progress(
                        text=f"job {data['job_id']} attempt {data['number']}: step "
                        f"{data['last_step']}, loss {_num(data.get('last_loss'))}"
                    )
                )
        elif kind == "backoff":
            key = (data["attempt"], -1)
            if g.ticks.get(data["job_id"]) != key:
                g.ticks[data["job_id"]] = key
                self._emit(
                    Progress(
                        text=f"job {data['job_id']} attempt {data['attempt']} {data['outcome']}: "
                        f"the next starts in {max(0, round(data['seconds_left']))} s"
                    )
                )


def render_event(event: BaseModel) -> str | None:
    """An event as plain lines for `nightshift chat --once` (None: nothing to print)."""
    if isinstance(event, Answer):
        text = event.text
        if event.stats:
            text += f"\n  [{format_stats(event.stats)}]"
        return text
    if isinstance(event, ToolCard):
        if event.status in ("planned", "running"):
            return None
        verdict = f" · {event.decision} ({event.rule})" if event.decision else ""
        return f"→ {event.skill} {_json(event.args)}{verdict} · {event.summary}"
    if isinstance(event, ApprovalNeeded):
        a = event.approval
        return (
            f"approval {a.id} needed: {a.skill} {_json(a.args)} requested by {a.requester} "
            f"(rule {a.rule}, {len(a.approvers)}/{a.quorum} approved"
            + (f", expires {a.expires_at:%Y-%m-%d %H:%M} UTC" if a.expires_at else "")
            + f"); decide with `nightshift approvals approve {a.id}` or `reject {a.id}`"
        )
    if isinstance(event, ApprovalClosed):
        return f"approval {event.approval_id}: {event.state}"
    if isinstance(event, StepStats):
        return f"  model step {event.step}: {format_stats(event.data)}"
    if isinstance(event, Progress):
        return f"  {event.text}"
    return None
