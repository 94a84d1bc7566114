"""The model door a small model fits through (issue 32): a step's prompt within the budget,
tools routed by the request's intent (English and Chinese), schemas in the subset every server
accepts, ids and paths grounded in the store before the gate, a looping model stopped, and
failures told as what they are (context overflow, empty content, an answer that looked nothing
up, one exit code for an endpoint that does not answer). Through the real `openai` client
against the scripted server, the real graph, gate and store, and the real CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import SecretStr

from nightshift.agent.brain.goals import Goal
from nightshift.agent.brain.graph import build_graph
from nightshift.agent.brain.llm import (
    DID_NOT_LOOK,
    META_TOOLS,
    REMINDER,
    LLMPlanner,
    tool_schemas,
)
from nightshift.agent.brain.tool_routing import intents, route
from nightshift.agent.brain.tool_schemas import SENT_KEYWORDS, UNSENT, keywords, sent_schema
from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.evals.openai_stub import StubServer, http_error, reply_text, reply_tools, tool_call
from nightshift.runtime.config import LlmSettings
from nightshift.skills.registry import registry

from conftest import empty_store, nightshift, write_spec


@pytest.fixture
def w(home) -> Wiring:
    empty_store(home / "nightshift.db")  # Wiring opens it, already at HEAD
    return Wiring.load()


def planner(w: Wiring, url: str, **llm: Any) -> LLMPlanner:
    settings = LlmSettings(
        base_url=url,
        model="stub-model",
        api_key=SecretStr("k"),
        timeout_s=5.0,
        max_retries=0,
        **llm,
    )
    w.settings = w.settings.model_copy(update={"llm": settings})
    return LLMPlanner.from_settings(w.settings, audit=w.audit)


def run_goal(w: Wiring, p: LLMPlanner, text: str) -> dict[str, Any]:
    goal = Goal(name="g", goal="chat", planner="llm", text=text)
    graph = build_graph(w, p, checkpointer=InMemorySaver())
    return graph.invoke(
        {"goal": goal.model_dump(mode="json"), "history": []},
        {"configurable": {"thread_id": "t1"}, "recursion_limit": 300},
    )


def starts(w: Wiring, skill: str) -> int:
    return sum(1 for e in w.audit.events(action="skill.start") if e.skill == skill)


def offered(req: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in req["tools"]]


def last_tool(req: dict[str, Any]) -> str | None:
    results = [m["content"] for m in req["messages"] if m["role"] == "tool"]
    return results[-1] if results else None


def submitted(w: Wiring, tmp_path, n: int) -> list[int]:
    client = Client(w, principal="alice")
    return [
        client.submit(str(write_spec(tmp_path, steps=5, file=f"s{i}.yaml")), call_id=f"w-{i}")
        for i in range(n)
    ]


# ------------------------------------------------------------------------------ the schemas
@pytest.mark.parametrize("name", sorted(registry()))
def test_every_sent_schema_is_in_the_subset_every_server_accepts(name):
    """What each skill sends uses only the whitelisted keywords (no maxLength, minLength,
    pattern, format, $ref, title, default: llama-cpp-python's grammar builder crashed on
    maxLength), is a valid JSON schema, and still names every field of the input model, with
    the same required ones; the input model keeps the limits and validates."""
    skill = registry()[name]
    sent = sent_schema(skill)["function"]
    params = sent["parameters"]
    assert keywords(params) <= SENT_KEYWORDS, keywords(params) - SENT_KEYWORDS
    Draft202012Validator.check_schema(params)
    full = skill.input_model.model_json_schema()
    unsent = UNSENT.get(name, frozenset())
    assert set(params["properties"]) == set(full.get("properties", {})) - unsent
    assert set(params.get("required", [])) == set(full.get("required", []))
    assert len(sent["description"]) <= 110
    assert "maxLength" in json.dumps(full) or "maxLength" not in json.dumps(params)


def test_meta_tools_are_in_the_subset_too():
    for tool in META_TOOLS:
        assert keywords(tool["function"]["parameters"]) <= SENT_KEYWORDS


# ------------------------------------------------------------------------------ the prompt
def test_a_default_step_stays_under_1500_tokens_and_all_tools_sends_the_old_8k(w, tmp_path):
    """The same four-look goal: each step under the 1,500-token budget by the server's count
    (the stub counts JSON length / 4, as the measurement in docs/benchmarks.md), with a handful
    of tools; llm.all_tools sends every tool, most of an 8k context."""
    submitted(w, tmp_path, 2)
    calls = [
        ("list_jobs", {}),
        ("gpu_health_check", {}),
        ("show_job", {"job_id": 1}),
        ("job_logs", {"job_id": 2}),
        ("finish", {"ok": True, "summary": "two jobs queued; GPUs fine"}),
    ]
    usage: dict[bool, list[int]] = {}
    for all_tools in (False, True):
        script = [reply_tools(tool_call(n, a)) for n, a in calls]
        with StubServer(script) as srv:
            out = run_goal(
                w,
                planner(w, srv.base_url, all_tools=all_tools),
                "What is running, and are the GPUs ok?",
            )
        assert out["finish"]["ok"], out["finish"]
        usage[all_tools] = [
            len(json.dumps([r["messages"], r["tools"]], default=str)) // 4
            for r in srv.chat_requests
        ]
        if not all_tools:
            assert all(len(r["tools"]) <= 8 for r in srv.chat_requests)
    assert len(usage[False]) == 5 and max(usage[False]) <= 1500, usage
    assert min(usage[True]) > 5000, usage  # every tool: most of an 8k context


def test_a_thirty_step_goal_never_outgrows_an_8k_context(w):
    """History is summarised, older results shortened: thirty big results later the prompt
    still fits an 8,192-token context with room for the reply."""

    def model(req: dict[str, Any]) -> dict[str, Any]:
        n = sum(1 for m in req["messages"] if m["role"] == "tool")
        return reply_tools(tool_call("gpu_health_check", {"gpus": [0], "record": n % 2 == 0}))

    with StubServer(model) as srv:
        p = planner(w, srv.base_url, max_steps=30, max_repeats=30)
        out = run_goal(w, p, "Are the GPUs ok?")
    assert "step budget spent" in out["finish"]["summary"]
    sizes = [len(json.dumps([r["messages"], r["tools"]])) // 4 for r in srv.chat_requests]
    assert len(sizes) == 30 and max(sizes) <= 8192 - 512, sizes


@pytest.mark.parametrize(
    ("text", "want", "not_offered"),
    [
        ("What is running right now?", "list_jobs", "cancel_job"),
        ("现在有哪些任务在跑？", "list_jobs", "cancel_job"),
        ("Why did job 1 fail?", "diagnose_failure", "cancel_job"),
        ("为什么任务1失败了？", "diagnose_failure", "submit_job"),
        ("cancel job 2", "cancel_job", "submit_job"),
        ("取消任务2", "cancel_job", "submit_job"),
        ("submit examples/specs/quickstart.yaml tonight when power is cheap", "submit_job", None),
        ("提交 spec.yaml 今晚跑", "submit_job", "cancel_job"),
        ("sweep lr from 1e-4 to 1e-2", "start_sweep", "cancel_job"),
        ("hello", "list_jobs", "cancel_job"),
    ],
)
def test_requests_route_to_a_handful_of_tools_by_intent(text, want, not_offered):
    names = route(text, known=registry())
    assert want in names and len(names) <= 9, (intents(text), names)
    if not_offered:
        assert not_offered not in names


# ------------------------------------------------------------------------------ grounding
def test_a_guessed_job_id_is_answered_from_the_store_and_never_run(w, tmp_path):
    """show_job 1234567890123456 (as SmolLM2 asked) goes back as "no such job …; these exist:
    …" with the real ids, the skill never starts; the model's corrected call runs."""
    ids = submitted(w, tmp_path, 2)

    def model(req: dict[str, Any]) -> dict[str, Any]:
        last = last_tool(req)
        if last is None:
            return reply_tools(tool_call("show_job", {"job_id": 1234567890123456}))
        if "no such job" in last:
            return reply_tools(tool_call("show_job", {"job_id": ids[0]}))
        return reply_tools(tool_call("finish", {"ok": True, "summary": "job 1 is queued"}))

    with StubServer(model) as srv:
        out = run_goal(w, planner(w, srv.base_url), "show me job 1234567890123456")
    told = last_tool(srv.chat_requests[1]) or ""
    assert "no such job 1234567890123456" in told
    assert f"{ids[1]} (queued" in told and f"{ids[0]} (queued" in told
    assert starts(w, "show_job") == 1  # the corrected call only
    assert [o["skill"] for o in out["history"]] == ["show_job"]
    assert any(e.action == "llm.refused" for e in w.audit.events())


def test_a_guessed_id_for_a_destructive_call_never_reaches_the_gate(w, tmp_path):
    """cancel_job on a job that does not exist is refused before the gate: no approval is asked,
    nothing is audited as a call."""
    submitted(w, tmp_path, 1)
    replies = [reply_tools(tool_call("cancel_job", {"job_id": 77, "reason": "x"}))] * 3
    with StubServer(replies) as srv:
        out = run_goal(w, planner(w, srv.base_url, max_bad_calls=3), "cancel job 77")
    assert not out["finish"]["ok"] and "no such job 77" in out["finish"]["summary"]
    assert starts(w, "cancel_job") == 0
    assert not [e for e in w.audit.events() if e.skill == "cancel_job"]
    assert len(srv.chat_requests) == 3


def test_a_read_of_a_path_outside_the_allowed_roots_is_refused_as_bad_arguments(w):
    """auto_resume with checkpoint_dir `/etc/...` (the model's invention) never runs."""
    replies = [
        reply_tools(tool_call("auto_resume", {"checkpoint_dir": "/etc/nightshift-never"})),
        reply_tools(tool_call("finish", {"ok": False, "summary": "no checkpoint found"})),
    ]
    with StubServer(replies) as srv:
        out = run_goal(w, planner(w, srv.base_url), "find the checkpoint to resume from")
    told = last_tool(srv.chat_requests[1]) or ""
    assert "checkpoint_dir '/etc/nightshift-never' is outside the allowed roots" in told
    assert starts(w, "auto_resume") == 0 and out["history"] == []


def test_the_same_call_again_and_again_is_stopped(w):
    """A model that calls list_jobs {} forever is stopped at llm.max_repeats, not max_steps."""
    with StubServer(lambda req: reply_tools(tool_call("list_jobs", {}))) as srv:
        out = run_goal(w, planner(w, srv.base_url, max_repeats=2), "what is queued?")
    assert not out["finish"]["ok"] and "same call 3 times" in out["finish"]["summary"]
    assert starts(w, "list_jobs") == 2 and len(srv.chat_requests) == 3


# ------------------------------------------------------------------------------ failures
def test_a_context_overflow_is_explained_as_one(w):
    message = (
        "This model's maximum context length is 8192 tokens. However, you requested 9100 "
        "tokens (8588 in the messages, 512 in the completion)."
    )
    with StubServer([http_error(400, message)]) as srv:
        out = run_goal(w, planner(w, srv.base_url), "what is running?")
    summary = out["finish"]["summary"]
    assert summary.startswith("the prompt is longer than the model's context (8192 tokens")
    assert "tool calls for this model" not in summary and out["finish"]["operator"]


def test_empty_content_is_reported_as_empty_not_null(w):
    with StubServer([{"content": "", "finish_reason": "length"}]) as srv:
        out = run_goal(w, planner(w, srv.base_url), "Say hello.")
    summary = out["finish"]["summary"]
    assert "empty content ''" in summary and "content null" not in summary
    assert "llm.max_reply_tokens=512" in summary
    assert srv.chat_requests[0]["max_tokens"] == 512


def test_an_answer_about_jobs_without_a_lookup_gets_one_reminder_then_fails(w):
    """ "ok" (SmolLM2 echoing the prompt) to a question about jobs is not an answer: one
    reminder as the user, then "the model did not look anything up", not ok."""
    with StubServer([reply_text("ok"), reply_text("All jobs are fine.")]) as srv:
        out = run_goal(w, planner(w, srv.base_url), "what is running?")
    assert not out["finish"]["ok"] and out["finish"]["summary"].startswith(DID_NOT_LOOK)
    assert srv.chat_requests[1]["messages"][-1] == {"role": "user", "content": REMINDER}
    assert len(srv.chat_requests) == 2


def test_the_reminder_is_heeded(w):
    replies = [
        reply_text("ok"),
        reply_tools(tool_call("list_jobs", {})),
        reply_text("Nothing is running."),
    ]
    with StubServer(replies) as srv:
        out = run_goal(w, planner(w, srv.base_url), "现在有哪些任务在跑？")
    assert out["finish"] == {
        "kind": "finish",
        "ok": True,
        "summary": "Nothing is running.",
        "bad_input": False,
        "operator": False,
    }


def test_chat_once_exits_non_zero_when_the_model_did_not_look(home):
    with StubServer(lambda req: reply_text("ok")) as srv:
        env = {"OPENAI_BASE_URL": srv.base_url, "NIGHTSHIFT_MODEL": "m"}
        r = nightshift("chat", "--once", "were any of the jobs slow last night?", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert DID_NOT_LOOK in r.stdout


def test_an_unreachable_endpoint_is_the_same_exit_code_in_chat_and_doctor(home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "NIGHTSHIFT_MODEL": "m",
        "NIGHTSHIFT_LLM__MAX_RETRIES": "0",
    }
    chat = nightshift("chat", "--once", "anything unusual on the cluster today?", env=env)
    doctor = nightshift("doctor", "--json", env=env)
    assert "cannot reach" in chat.stdout, chat.stdout + chat.stderr
    assert chat.returncode == doctor.returncode == 5


def test_doctor_checks_the_word_that_comes_back(home):
    """doctor_ping({"word": "pong&#34;"}) (llama-cpp-python's server) is a failed check."""
    with StubServer(
        lambda req: reply_tools(tool_call("doctor_ping", {"word": "pong&#34;"}))
    ) as srv:
        env = {"OPENAI_BASE_URL": srv.base_url, "NIGHTSHIFT_MODEL": "stub-model"}
        r = nightshift("doctor", "--json", env=env)
        assert srv.chat_requests[0]["max_tokens"] == 128
    checks = {c["area"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 5
    assert checks["tool calls"]["status"] == "fail"
    assert "word is 'pong&#34;', not 'pong'" in checks["tool calls"]["detail"]


# ------------------------------------------------------------------------------ the eval
def test_eval_chat_runs_small_against_the_scripted_server(tmp_path):
    """`nightshift eval chat` (the real CLI) on a few requests, both languages and a planted
    instruction: every first call right, every argument valid, no forbidden call, and the
    server's usage per step under the 1,500-token budget."""
    out, totals = tmp_path / "chat.csv", tmp_path / "chat.json"
    ids = "*-zh"
    r = nightshift(
        "eval", "chat", "--ids", ids, "--csv", str(out), "--json", str(totals), timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(totals.read_text())
    assert got["requests"] == 11 and got["tool_choice_accuracy"] == 1.0, got
    assert got["argument_validity"] == 1.0 and got["forbidden_calls"] == 0, got
    assert got["prompt_tokens_per_step_max"] <= 1500, got
    rows = out.read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("id,lang,tool_ok") and len(rows) == 12
    assert "logs-injected-zh" in out.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ constrained calls
@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_constrained_mode_sends_one_of_the_calls_as_a_schema_and_runs_the_answer(w, tmp_path, mode):
    """llm.tool_mode json_schema / json_object: no `tools`; response_format admits one call of an
    offered tool; the JSON the model writes becomes the call (through the gate, as any); its
    result goes back as a plain message every chat template takes."""
    ids = submitted(w, tmp_path, 1)

    def model(req: dict[str, Any]) -> dict[str, Any]:
        if not any(m["role"] == "assistant" for m in req["messages"]):
            return reply_text(json.dumps({"name": "show_job", "arguments": {"job_id": ids[0]}}))
        return reply_text(
            json.dumps({"name": "finish", "arguments": {"ok": True, "summary": "queued"}})
        )

    with StubServer(model) as srv:
        out = run_goal(w, planner(w, srv.base_url, tool_mode=mode), "show me job 1")
    assert out["finish"]["ok"] and out["finish"]["summary"] == "queued"
    assert starts(w, "show_job") == 1
    first, second = srv.chat_requests
    assert "tools" not in first and "tool_choice" not in first
    fmt = first["response_format"]
    assert fmt["type"] == mode  # OpenAI's form, or llama-cpp-python's json_object + schema
    schema = fmt["json_schema"]["schema"] if mode == "json_schema" else fmt["schema"]
    names = [o["properties"]["name"]["const"] for o in schema["anyOf"]]
    assert "show_job" in names and "finish" in names and "cancel_job" not in names
    assert "- show_job(job_id: integer)" in first["messages"][0]["content"]
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "user"] and "tool_calls" not in str(second)
    assert "status: ok" in second["messages"][-1]["content"]


def test_doctor_reports_constrained_output_when_the_server_enforces_it(home):
    def server(req: dict[str, Any]) -> dict[str, Any]:
        if "response_format" in req:
            return reply_text('{"word": "pong"}')
        return reply_tools(tool_call("doctor_ping", {"word": "pong"}))

    with StubServer(server) as srv:
        env = {"OPENAI_BASE_URL": srv.base_url, "NIGHTSHIFT_MODEL": "stub-model"}
        r = nightshift("doctor", "--json", env=env)
    checks = {c["area"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 0, r.stdout
    got = checks["constrained output"]
    assert got["status"] == "ok" and "llm.tool_mode: tools" in got["detail"]
    assert "llm.tool_mode: json_schema" in got["fix"]
    assert "mode: tool calls parsed by the server" in checks["tool calls"]["detail"]


LLAMA_PYTHON = os.environ.get("NIGHTSHIFT_LLAMA_PYTHON")
GRAMMAR = (
    "import json, sys\n"
    "from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf\n"
    "out = {}\n"
    "for name, params in json.load(sys.stdin).items():\n"
    "    g = json_schema_to_gbnf(json.dumps(params))\n"
    "    LlamaGrammar.from_string(g, verbose=False)\n"
    "    out[name] = len(g)\n"
    "print(json.dumps(out))\n"
)


@pytest.mark.skipif(
    not LLAMA_PYTHON,
    reason="opt-in, not CI: set NIGHTSHIFT_LLAMA_PYTHON to an interpreter with llama-cpp-python "
    "(its grammar builder is what crashed the server)",
)
def test_llama_cpp_builds_a_small_grammar_from_every_sent_schema():
    """llama-cpp-python's own json_schema_to_gbnf and grammar parser, on every tool we send:
    each builds, and small (gpu_health_check's full schema, with its maxLength, built a 16 MB
    grammar; the sent one well under 10 kB)."""
    sent = {t["function"]["name"]: t["function"]["parameters"] for t in tool_schemas()}
    full = {"gpu_health_check": registry()["gpu_health_check"].tool_schema()["function"]}
    r = subprocess.run(
        [str(LLAMA_PYTHON), "-c", GRAMMAR],
        input=json.dumps({**sent, "full:gpu_health_check": full["gpu_health_check"]["parameters"]}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    sizes = json.loads(r.stdout)
    assert sizes.pop("full:gpu_health_check") > 1_000_000  # the crash this avoids
    assert set(sizes) == set(sent) and max(sizes.values()) < 10_000, sizes


def test_a_log_read_shows_its_last_lines_when_the_facts_are_long():
    """job_logs' long paths do not push the log's last lines out of the observation: the model
    is asked how a job is doing, and the end of its log is the answer."""
    from nightshift.agent.brain.observations import summarise

    result = {
        "job_id": 1,
        "log_path": "/home/alice/" + "deep/" * 40 + "attempt-1.log",
        "checkpoint_dir": "/home/alice/" + "deep/" * 40 + "checkpoints",
        "lines": [f"step {i} loss {1 / (i + 1):.3f}" for i in range(40)] + ["Traceback: CUDA OOM"],
    }
    text = summarise(result, 600)
    assert len(text) <= 600 and text.endswith("Traceback: CUDA OOM")
    assert "job_id: 1" in text
