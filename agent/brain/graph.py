"""The agent: a LangGraph state machine  plan → act | watch → plan … → report.

Each planned call gets an id (thread/step) that is recorded before anything runs. `act` passes
the call through the gate (which validates, decides, audits and runs), returns the stored result
when that id already ran, so a node that LangGraph re-runs after an interrupt or a crash never
launches or kills anything twice, and pauses with `interrupt()` while a human decides an
approval; `watch` hands the job to the one scheduler/monitor loop until it settles.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pydantic import BaseModel
from sqlmodel import select

from nightshift.agent.brain.goals import Goal
from nightshift.agent.brain.planner import Call, Finish, Observation, Planner, Watch
from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.runtime.engine import job_paths
from nightshift.runtime.errors import (
    ApprovalRejected,
    ApprovalRequired,
    BadArguments,
    NightshiftError,
    Refused,
)
from nightshift.runtime.scheduling.snapshot import FAILED_OUTCOMES
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, GoalRun, Job, PlannedCall

AGENT = "agent"


class AgentState(TypedDict, total=False):
    goal: dict[str, Any]
    on_behalf_of: str
    history: list[dict[str, Any]]
    pending: dict[str, Any] | None
    finish: dict[str, Any] | None


def job_observation(w: Wiring, job_id: int) -> dict[str, Any]:
    """What a planner needs to know about a job after it settles."""
    with w.store.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return {"job_id": job_id, "state": "missing", "reason": f"no job {job_id}"}
        atts = list(
            s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))
        )
    spec = ExperimentSpec.model_validate(job.spec)
    paths = job_paths(w.settings, job)
    last = atts[-1] if atts else None
    return {
        "job_id": job.id,
        "state": job.state,
        "reason": job.reason,
        "params": job.params,
        "knobs": spec.knobs.model_dump(exclude_none=True),
        "attempts": len(atts),
        # what counts against max_attempts: the run's failures, not pauses or holds
        "failures": lifecycle.failures([a.outcome for a in atts]),
        "max_attempts": job.max_attempts,
        "checkpoint_dir": str(paths["checkpoint_dir"]),
        "good_checkpoint_dir": str(paths["good_checkpoints"]),
        "steps_per_epoch": spec.checkpoint.steps_per_epoch if spec.checkpoint else None,
        "attempt_history": [
            {"number": a.number, "outcome": a.outcome, "cause": a.cause, "last_step": a.last_step}
            for a in atts
        ],
        "attempt": None
        if last is None
        else {
            "number": last.number,
            "outcome": last.outcome,
            "exit_code": last.exit_code,
            "signal": last.signal,
            "log_path": last.log_path,
            "last_step": last.last_step,
            "start_step": last.start_step,
            "evidence": last.evidence,
            "first_bad_step": last.first_bad_step,
        },
    }


def _pending(state: AgentState) -> dict[str, Any]:
    """The call plan decided; act and watch run only after plan set one."""
    p = state["pending"]
    assert p is not None
    return p


def build_graph(
    w: Wiring,
    planner: Planner,
    *,
    checkpointer: Any = None,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
):
    """Compile the agent graph over the given wiring and planner."""
    say = on_progress or (lambda kind, data: None)
    # Calls this process planned and has not finished: act need not read their rows back.
    fresh: set[str] = set()

    def plan(state: AgentState, config) -> dict[str, Any]:
        thread = config["configurable"]["thread_id"]
        goal = Goal.model_validate(state["goal"])
        history = [Observation.model_validate(o) for o in state.get("history", [])]
        call_id = f"{thread}/{len(history) + 1}"
        with w.store.session() as s:
            stored = s.get(PlannedCall, call_id)
        if stored is not None:  # decided before a crash: replay the same decision, never re-ask
            action: Call | Watch | Finish = (
                Watch(job_id=stored.args["job_id"], wait=stored.args.get("wait", True))
                if stored.skill == "@watch"
                else Call(skill=stored.skill, args=stored.args)
            )
        else:
            # No session is open while the planner thinks (a model may take seconds); the
            # decision is recorded before anything acts.
            action = planner.next(goal, history)
            if isinstance(action, Finish):
                return {"pending": None, "finish": action.model_dump()}
            with w.store.session() as s:
                if not history:  # the goal, for a replay if the run dies before a checkpoint
                    s.add(
                        GoalRun(
                            thread_id=thread,
                            goal=state["goal"],
                            on_behalf_of=str(state.get("on_behalf_of") or AGENT),
                            created_at=local_now(),
                        )
                    )
                s.add(
                    PlannedCall(
                        call_id=call_id,
                        thread_id=thread,
                        principal=AGENT,
                        skill="@watch" if isinstance(action, Watch) else action.skill,
                        args={"job_id": action.job_id, "wait": action.wait}
                        if isinstance(action, Watch)
                        else action.args,
                    )
                )
        step_id = None
        if goal.steps is not None and len(history) < len(goal.steps):
            step_id = goal.steps[len(history)].id
        if stored is None:
            fresh.add(call_id)
        pending = {"call_id": call_id, "step_id": step_id, **action.model_dump()}
        say("plan", pending)
        return {"pending": pending, "finish": None}

    def route_plan(state: AgentState) -> str:
        if state.get("finish"):
            return "report"
        return "watch" if _pending(state)["kind"] == "watch" else "act"

    def act(state: AgentState, config) -> dict[str, Any]:
        """One planned call through the gate. A call that needs approval pauses the graph with
        `interrupt()` before anything runs; on resume the node runs again and the gate carries
        the approved call out once (or returns what was carried out while we were away)."""
        p = _pending(state)
        if p["call_id"] not in fresh:  # a replay (another process, a crash): it may be done
            row = w.store.planned_call(p["call_id"])
            if row.state == "done":
                return _observe(state, p, "ok", result=row.result)
            if row.state in ("error", "denied", "rejected"):
                return _observe(
                    state,
                    p,
                    row.state,
                    error=row.error,
                    bad_input=bool((row.result or {}).get("bad_input")),
                )
            # A row still "planned" after a crash runs again: launch and change skills are
            # idempotent on the call id (submit_job, launch_container) or on the job's state
            # (resume_job, cancel_job), and an approved call is claimed once, so nothing acts
            # twice.
        thread = config["configurable"]["thread_id"]
        args = p["args"]
        if p["skill"] == "diagnose_failure":
            from nightshift.skills.attempt_diagnosis import with_stored_machine

            # The machine's evidence the loop kept with the attempt: the cgroup and the
            # processes are gone by now, and the agent's verdict must not read less than the loop's.
            args = with_stored_machine(w.store, args)

        def call() -> BaseModel:
            return w.gate.call(
                w.context(AGENT, p["call_id"]),
                p["skill"],
                args,
                via="agent",
                thread_id=thread,
                on_verdict=lambda v: say("verdict", {**p, "verdict": v.model_dump()}),
            )

        out, status, err, bad = None, "ok", None, False
        try:
            try:
                out = call().model_dump(mode="json")
            except ApprovalRequired as exc:
                decision = interrupt(
                    {
                        "approval_id": exc.approval_id,
                        "call_id": p["call_id"],
                        "skill": p["skill"],
                        "args": p["args"],
                        "rule": exc.rule,
                        "quorum": exc.quorum,
                    }
                )
                if decision != "approved":
                    raise ApprovalRejected(f"approval {exc.approval_id} {decision}") from None
                out = call().model_dump(mode="json")
        except ApprovalRejected as exc:
            status, err = "rejected", str(exc)
        except Refused as exc:
            status, err = "denied", str(exc)
        except NightshiftError as exc:
            status, err, bad = (
                "error",
                f"{type(exc).__name__}: {exc}",
                isinstance(exc, BadArguments),
            )
        with w.store.write_session() as s:
            row = s.get(PlannedCall, p["call_id"])
            row.state = "done" if status == "ok" else status
            row.result = out if status == "ok" else {"bad_input": bad}
            row.error = err
            row.finished_at = local_now()
            s.add(row)
            fresh.discard(p["call_id"])
            if (
                status == "ok"
                and out is not None
                and p["skill"] == "diagnose_failure"
                and p["args"].get("log_path")
            ):
                # Bookkeeping for reports: the diagnosed cause on the attempt whose log it read.
                lifecycle.record_cause(
                    s, p["args"]["log_path"], out.get("category"), stored_diagnosis(out)
                )
        return _observe(state, p, status, result=out, error=err, bad_input=bad)

    def watch(state: AgentState) -> dict[str, Any]:
        p = _pending(state)
        job_id = p["job_id"]
        say("watch", p)

        def tick() -> None:
            atts = w.store.attempts(job_id)
            if atts:
                a = atts[-1]
                say(
                    "attempt",
                    {
                        "job_id": job_id,
                        "number": a.number,
                        "state": a.state,
                        "last_step": a.last_step,
                        "last_loss": a.last_loss,
                    },
                )
                if a.outcome in FAILED_OUTCOMES and a.ended_at is not None:
                    job = w.store.job(job_id)
                    if job is not None and job.state == "queued":  # a retry, after the backoff
                        at = w.settings.retry.not_before(
                            a.ended_at, a.number, job_id, job.spec.get("retry_wait_s")
                        )
                        say(
                            "backoff",
                            {
                                "job_id": job_id,
                                "attempt": a.number,
                                "outcome": a.outcome,
                                "exit_code": a.exit_code,
                                "seconds_left": (at - local_now()).total_seconds(),
                            },
                        )

        # A goal run without a daemon places only the jobs it queued; watching never starts one.
        job = w.store.job(job_id)
        if job is None:  # a goal naming a job that does not exist is bad input, told at once
            err = f"UnknownJob: no job {job_id}: `nightshift jobs` lists the jobs"
            with w.store.session() as s:
                row = s.get(PlannedCall, p["call_id"])
                row.state, row.error, row.finished_at = "error", err, local_now()
                row.result = {"bad_input": True}
                s.add(row)
            return _observe(state, p, "error", error=err, bad_input=True)
        scope = w.engine.scope
        unplaced = (
            job is not None
            and job.state == "queued"
            and scope is not None
            and job_id not in scope()
        )
        if p.get("wait", True) and not unplaced:
            w.engine.run_until_settled([job_id], on_tick=tick)
        obs = job_observation(w, job_id)
        if unplaced:
            obs["reason"] = (
                "queued, and no daemon is running to place it: a goal run starts only the jobs it "
                "submitted or requeued, never one it watches. Start `nightshift daemon` to run it"
            )
        with w.store.session() as s:
            row = s.get(PlannedCall, p["call_id"])
            row.state, row.result, row.finished_at = "done", obs, local_now()
            s.add(row)
        return _observe(state, p, "ok", result=obs)

    def report(state: AgentState) -> dict[str, Any]:
        fin = state["finish"]
        assert fin is not None  # route_plan sends here only with one
        w.audit.append(
            AGENT,
            "goal.finish",
            payload={
                "goal": state["goal"].get("name"),
                **fin,
                "on_behalf_of": state.get("on_behalf_of"),
            },
        )
        say("finish", fin)
        return {}

    def _observe(
        state: AgentState,
        p: dict[str, Any],
        status: str,
        *,
        result: Any = None,
        error: str | None = None,
        bad_input: bool = False,
    ) -> dict[str, Any]:
        obs = Observation(
            call_id=p["call_id"],
            kind=p["kind"],
            skill=p.get("skill"),
            args=p.get("args") or {"job_id": p.get("job_id")},
            status=status,
            result=result,
            error=error,
            bad_input=bad_input,
            step_id=p.get("step_id"),
        )
        say("observe", obs.model_dump())
        return {"history": [*state.get("history", []), obs.model_dump()], "pending": None}

    g = StateGraph(AgentState)
    g.add_node("plan", plan)
    g.add_node("act", act)
    g.add_node("watch", watch)
    g.add_node("report", report)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", route_plan, ["act", "watch", "report"])
    g.add_edge("act", "plan")
    g.add_edge("watch", "plan")
    g.add_edge("report", END)
    return AgentGraph(w, g.compile(checkpointer=checkpointer))


class AgentGraph:
    """The compiled graph, checkpointed only where a run stops: at an approval interrupt, at the
    end, on an error (LangGraph's `durability="exit"`). Checkpointing every super-step bought
    nothing: each call is a PlannedCall row written before it acts and answered from after, so a
    run killed between checkpoints is replayed from its goal (a GoalRun row, written with its first
    planned call) and every call it had made answers from its row instead of acting again.
    Anything else is LangGraph's."""

    def __init__(self, w: Wiring, compiled: Any):
        self.w = w
        self.compiled = compiled

    def invoke(self, input: Any, config: dict[str, Any], **kw: Any) -> Any:
        kw.setdefault("durability", "exit")
        return self.compiled.invoke(input, config, **kw)

    def resume(self, config: dict[str, Any], decide: Callable[[int], str]) -> Any:
        """Continue a thread where it stopped: answer its pending approval with `decide`
        (approval id → "approved" / "rejected" / "expired"), run its next step, or replay its
        recorded goal if it was killed before its first checkpoint. None: no such thread."""
        snap = self.compiled.get_state(config)
        if not snap.values:
            row = goal_run(self.w, config["configurable"]["thread_id"])
            if row is None:
                return None
            return self.invoke(
                {"goal": row.goal, "history": [], "on_behalf_of": row.on_behalf_of}, config
            )
        pending = [i for t in snap.tasks for i in t.interrupts]
        if pending:
            return self.invoke(Command(resume=decide(pending[0].value["approval_id"])), config)
        if snap.next:
            return self.invoke(None, config)
        return snap.values

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def goal_run(w: Wiring, thread: str) -> GoalRun | None:
    with w.store.session() as s:
        return s.get(GoalRun, thread)


def recorded_goal(w: Wiring, checkpointer: Any, thread: str) -> dict[str, Any] | None:
    """The goal a thread was started with: its newest checkpoint's, else its GoalRun row's
    (read without compiling a graph)."""
    saved = checkpointer.get_tuple({"configurable": {"thread_id": thread}})
    if saved is not None and saved.checkpoint["channel_values"].get("goal"):
        return saved.checkpoint["channel_values"]["goal"]
    row = goal_run(w, thread)
    return None if row is None else row.goal


def sqlite_checkpointer(w: Wiring) -> SqliteSaver:
    """LangGraph's SQLite checkpointer in $NIGHTSHIFT_HOME/graph.db."""
    w.settings.home_path.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(w.settings.home_path / "graph.db"), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # as durable as the store it sits beside
    return SqliteSaver(conn)


def stored_diagnosis(out: dict[str, Any]) -> dict[str, Any] | None:
    """A diagnose_failure result in the form kept with the attempt; None if it does not parse."""
    from pydantic import ValidationError

    from nightshift.skills.attempt_diagnosis import from_result
    from nightshift.skills.diagnose_failure import DiagnoseFailureResult

    try:
        return from_result(DiagnoseFailureResult.model_validate(out)).model_dump()
    except ValidationError:
        return None
