"""The agent graph in-process: deterministic and scripted planners, the gate, approvals via
interrupt/resume, the kill switch, and idempotent re-runs of a node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from sqlmodel import select

from nightshift.agent.brain.goals import Goal
from nightshift.agent.brain.graph import build_graph
from nightshift.agent.brain.planner import (
    Action,
    DeterministicPlanner,
    Finish,
    Observation,
    action_from_tool_call,
)
from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.policies import killswitch
from nightshift.runtime.store.db import AuditEvent, Job, PlannedCall

from conftest import REPO, empty_store


def spec_file(tmp_path: Path, steps: int = 60, env: dict | None = None) -> Path:
    spec = yaml.safe_load((REPO / "examples/specs/quickstart.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    spec["environment"]["env"] = env or {}
    spec["parameters"].update(steps=steps, checkpoint_every=20)
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


class ScriptedModel:
    """Emits OpenAI-style tool calls from a script, the way a model would, reading observations."""

    name = "scripted"

    def __init__(self, script):
        self.script = script  # callables: history -> tool call dict
        self.seen: list[list[Observation]] = []

    def next(self, goal: Goal, history: list[Observation]) -> Action:
        self.seen.append(list(history))
        if len(history) >= len(self.script):
            return Finish(ok=True, summary="script done")
        return action_from_tool_call(self.script[len(history)](history))


def tool(name: str, **args) -> dict:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


@pytest.fixture
def w(home) -> Wiring:
    empty_store(home / "nightshift.db")  # Wiring opens it, already at HEAD
    return Wiring.load()


def run(graph, state, thread="t1"):
    return graph.invoke(state, {"configurable": {"thread_id": thread}, "recursion_limit": 200})


def test_goal_steps_run_in_order_with_references(w, tmp_path):
    """Explicit steps run through the gate in order, and ${id.field} feeds one result to the next."""
    goal = Goal(
        name="g",
        steps=[
            {"id": "sub", "skill": "submit_job", "args": {"spec_path": str(spec_file(tmp_path))}},
            {"watch": "${sub.job_id}"},
            {"skill": "list_jobs", "args": {"states": ["succeeded"]}},
        ],
    )
    graph = build_graph(w, DeterministicPlanner(), checkpointer=InMemorySaver())
    out = run(graph, {"goal": goal.model_dump(), "history": []})
    assert out["finish"]["ok"], out["finish"]
    hist = [Observation.model_validate(o) for o in out["history"]]
    assert [o.skill or o.kind for o in hist] == ["submit_job", "watch", "list_jobs"]
    assert hist[1].result["state"] == "succeeded"
    assert [j["id"] for j in hist[2].result["jobs"]] == [hist[0].result["job_id"]]


def test_scripted_model_bad_arguments_go_back_as_observation(w, tmp_path):
    """Arguments that fail the input model reach the planner as an error, and nothing runs."""
    model = ScriptedModel(
        [
            lambda h: tool("gpu_health_check"),
            lambda h: tool("cancel_job", job_id="not-a-number"),
        ]
    )
    graph = build_graph(w, model, checkpointer=InMemorySaver())
    out = run(graph, {"goal": Goal(name="g", goal="health").model_dump(), "history": []})
    hist = [Observation.model_validate(o) for o in out["history"]]
    assert hist[0].status == "ok" and hist[0].result["overall"] == "NO_GPUS"
    assert hist[1].status == "error" and "job_id" in hist[1].error
    assert w.approvals.pending(local_now()) == []


def test_destroy_pauses_for_approval_and_resumes_when_approved(w, tmp_path):
    """cancel_job interrupts the graph before any side effect; a vote by someone else resumes it."""
    model = ScriptedModel(
        [
            lambda h: tool("submit_job", spec_path=str(spec_file(tmp_path, steps=100_000))),
            lambda h: tool("cancel_job", job_id=h[0].result["job_id"]),
        ]
    )
    graph = build_graph(w, model, checkpointer=InMemorySaver())
    out = run(graph, {"goal": Goal(name="g", goal="health").model_dump(), "history": []})
    req = out["__interrupt__"][0].value
    with w.store.session() as s:
        assert s.get(Job, 1).state == "queued"  # nothing destroyed yet
    appr = w.approvals.vote(req["approval_id"], "alice", True, local_now())
    assert appr.state == "approved"
    out = graph.invoke(Command(resume="approved"), {"configurable": {"thread_id": "t1"}})
    assert out["finish"]["ok"]
    with w.store.session() as s:
        assert s.get(Job, 1).state == "cancelled"


def test_rejected_approval_stops_the_call(w, tmp_path):
    """A rejection reaches the planner as 'rejected' and the job is untouched."""
    model = ScriptedModel(
        [
            lambda h: tool("submit_job", spec_path=str(spec_file(tmp_path, steps=100_000))),
            lambda h: tool("cancel_job", job_id=1),
        ]
    )
    graph = build_graph(w, model, checkpointer=InMemorySaver())
    out = run(graph, {"goal": Goal(name="g", goal="health").model_dump(), "history": []})
    w.approvals.vote(out["__interrupt__"][0].value["approval_id"], "alice", False, local_now())
    out = graph.invoke(Command(resume="rejected"), {"configurable": {"thread_id": "t1"}})
    assert Observation.model_validate(out["history"][-1]).status == "rejected"
    with w.store.session() as s:
        assert s.get(Job, 1).state == "queued"


def test_kill_switch_denies_launch_but_not_reads(w, tmp_path):
    """While paused, submit_job is denied by the kill switch; health checks still run."""
    killswitch.pause(w.store, w.audit, "alice", "maintenance")
    model = ScriptedModel(
        [
            lambda h: tool("gpu_health_check"),
            lambda h: tool("submit_job", spec_path=str(spec_file(tmp_path))),
        ]
    )
    graph = build_graph(w, model, checkpointer=InMemorySaver())
    out = run(graph, {"goal": Goal(name="g", goal="health").model_dump(), "history": []})
    hist = [Observation.model_validate(o) for o in out["history"]]
    assert [o.status for o in hist] == ["ok", "denied"]
    assert "nightshift resume" in hist[1].error
    with w.store.session() as s:
        assert s.exec(select(Job)).first() is None


def test_replayed_call_id_never_acts_twice(w, tmp_path):
    """A new graph run over the same thread id (as after a crash) reuses stored results."""
    goal = Goal(
        name="g", steps=[{"skill": "submit_job", "args": {"spec_path": str(spec_file(tmp_path))}}]
    )
    for _ in range(2):  # a fresh checkpointer each time: the graph itself remembers nothing
        graph = build_graph(w, DeterministicPlanner(), checkpointer=InMemorySaver())
        out = run(graph, {"goal": goal.model_dump(), "history": []}, thread="same")
        assert out["finish"]["ok"]
    with w.store.session() as s:
        assert len(list(s.exec(select(Job)))) == 1
        assert len(list(s.exec(select(PlannedCall)))) == 1
        starts = s.exec(select(AuditEvent).where(AuditEvent.action == "skill.start")).all()
        assert len(starts) == 1


def test_train_playbook_recovers_from_sigkill(w, tmp_path):
    """The train playbook: a run SIGKILLed mid-way is diagnosed and resumed from its checkpoint."""
    spec = spec_file(tmp_path, steps=80, env={"NIGHTSHIFT_FAULT_KILL_AT_STEP": "50"})
    goal = Goal(name="g", goal="train", spec=str(spec))
    graph = build_graph(w, DeterministicPlanner(), checkpointer=InMemorySaver())
    out = run(graph, {"goal": goal.model_dump(), "history": []})
    assert out["finish"]["ok"], out["finish"]
    hist = [Observation.model_validate(o) for o in out["history"]]
    diag = next(o for o in hist if o.skill == "diagnose_failure").result
    assert (
        diag["category"] == "killed"
    )  # SIGKILL with no other evidence: the OOM killer or a person
    resume = next(o for o in hist if o.skill == "resume_job").result
    assert resume["resume_step"] == 40
    atts = w.store.attempts(1)
    assert [a.signal for a in atts] == [9, None]
    assert atts[1].start_step == 40
