"""The llama.cpp measurement's parts (evals/llamacpp_server.py): the recording proxy counts what
the server says it counted, an overflow is told apart from other refusals, the schema probe's
keyword stripping, and — only where a real llama-cpp-python server and a GGUF are installed
(docs/llamacpp.md) — the real server started and stopped by PID, answering /v1/models and a tool
call through the proxy.

The real-server test is not part of CI: it runs only when NIGHTSHIFT_LLAMACPP_MODEL names a GGUF
file (and NIGHTSHIFT_LLAMACPP_PYTHON, or this interpreter, has llama-cpp-python[server]); CI sets
neither, so there it is skipped with the reason, as it is on any machine without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nightshift.evals.llamacpp_server import (
    LlamaServer,
    RecordingProxy,
    schema_keywords,
    without,
)
from nightshift.evals.openai_stub import StubServer, http_error, reply_tools, tool_call
from nightshift.skills.registry import registry

PING = {
    "type": "function",
    "function": {
        "name": "doctor_ping",
        "description": "Answer the health check.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "enum": ["pong"]}},
            "required": ["word"],
        },
    },
}


def _chat(base_url: str, **extra: object) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "ping"}], "tools": [PING]}
    return httpx.post(f"{base_url}/chat/completions", json={**body, **extra}, timeout=120)


def test_the_proxy_records_the_usage_the_server_reported():
    """The figures in the tables are the server's own (usage.prompt_tokens), not an estimate:
    the proxy passes the reply through unchanged and keeps the tools the request sent."""
    reply = {**reply_tools(tool_call("doctor_ping", {"word": "pong"}))}
    reply["usage"] = {"prompt_tokens": 1234, "completion_tokens": 7}
    with StubServer([reply]) as stub, RecordingProxy(stub.base_url) as proxy:
        mark = proxy.mark
        resp = _chat(proxy.base_url, max_tokens=64)
        assert resp.status_code == 200
        assert resp.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == (
            "doctor_ping"
        )
        [ex] = proxy.since(mark)
    assert (ex.status, ex.prompt_tokens, ex.completion_tokens) == (200, 1234, 7)
    assert ex.tools_sent == ["doctor_ping"] and ex.tool_called == "doctor_ping"
    assert ex.max_tokens == 64 and not ex.overflow
    assert proxy.tools["doctor_ping"] == PING
    assert stub.chat_requests[0]["tools"] == [PING]  # forwarded as it was sent


def test_a_context_overflow_is_told_apart_from_other_refusals():
    """llama-cpp-python answers a prompt longer than n_ctx with HTTP 400 naming the context and its
    count of the prompt; the table counts those as overflows with that count, and another 400 (a
    bad request) not."""
    overflow = http_error(  # llama_cpp/server/errors.py's words
        400,
        "This model's maximum context length is 8192 tokens. However, you requested 8734 "
        "tokens (8734 in the messages, None in the completion). Please reduce the length of "
        "the messages or completion.",
    )
    with (
        StubServer([overflow, http_error(400, "bad tool_choice")]) as stub,
        RecordingProxy(stub.base_url) as proxy,
    ):
        assert _chat(proxy.base_url).status_code == 400
        assert _chat(proxy.base_url).status_code == 400
        first, second = proxy.since(0)
    assert first.overflow and first.prompt_tokens == 8734  # as the server counted the prompt
    assert not second.overflow and second.error == "bad tool_choice"
    assert second.prompt_tokens is None


def test_a_schema_keyword_is_dropped_wherever_it_is():
    """The probe re-sends a crashing schema without maxLength: every nested occurrence goes, and
    nothing else changes (diagnose_failure's schema has maxLength today)."""
    schema = registry()["diagnose_failure"].tool_schema()
    assert "maxLength" in schema_keywords(schema)
    stripped = without(schema, "maxLength")
    assert "maxLength" not in schema_keywords(stripped)
    assert schema_keywords(schema) - schema_keywords(stripped) == {"maxLength"}
    assert json.dumps(without(stripped, "maxLength")) == json.dumps(stripped)


def _real_server() -> tuple[str, Path]:
    """The interpreter with llama-cpp-python[server] and the GGUF, or skip saying what is
    missing. Never in CI unless NIGHTSHIFT_LLAMACPP_MODEL is set there."""
    model = os.environ.get("NIGHTSHIFT_LLAMACPP_MODEL")
    if not model:
        pytest.skip(
            "NIGHTSHIFT_LLAMACPP_MODEL names no GGUF file: the real llama.cpp server test runs "
            "only where one is installed (docs/llamacpp.md), never in CI unless it is set"
        )
    if not Path(model).is_file():
        pytest.skip(f"NIGHTSHIFT_LLAMACPP_MODEL={model}: no such file (docs/llamacpp.md)")
    python = os.environ.get("NIGHTSHIFT_LLAMACPP_PYTHON") or sys.executable
    found = subprocess.run(
        [python, "-c", "import llama_cpp.server"], capture_output=True, text=True, timeout=120
    )
    if found.returncode != 0:
        pytest.skip(
            f"llama-cpp-python[server] is not installed for {python} (set "
            "NIGHTSHIFT_LLAMACPP_PYTHON; docs/llamacpp.md builds it)"
        )
    return python, Path(model)


def test_a_real_llamacpp_server_answers_models_and_a_forced_tool_call(tmp_path):
    """The server the measurement drives: started with our flags, /v1/models lists the GGUF, a
    tool call forced by name comes back as a tool call with the server's token count recorded
    by the proxy, and stopping it ends its PID."""
    python, model = _real_server()
    server = LlamaServer(model, python=python, log=tmp_path / "server.log")
    with server, RecordingProxy(server.base_url) as proxy:
        listed = httpx.get(f"{proxy.base_url}/models", timeout=30).json()
        assert [m["id"] for m in listed["data"]] == [str(model)]
        resp = _chat(
            proxy.base_url,
            tool_choice={"type": "function", "function": {"name": "doctor_ping"}},
            temperature=0,
            max_tokens=32,
        )
        assert resp.status_code == 200, resp.text
        [ex] = proxy.since(0)
        assert ex.tool_called == "doctor_ping"
        assert ex.prompt_tokens is not None and ex.prompt_tokens > 10
        assert server.alive()
        proc = server.proc
    assert proc is not None and proc.poll() is not None
    assert server.exit_status() != "running"
