"""Tool calls under constrained decoding (`llm.tool_mode: json_schema` or `json_object`): instead
of `tools`, the request carries a `response_format` whose schema is "one of these calls"
({"name": <a tool offered>, "arguments": <its parameters>}), so a server that decodes under a
schema (llama.cpp's server builds a grammar from it) cannot let a small model write a call that
is not JSON, names no tool, or lacks a required argument. The model reads the tools as a short
list in the system prompt; its earlier calls and their results go back as plain messages, which
every chat template takes. `nightshift doctor` says whether the endpoint offers it.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA_NAME = "tool_call"


def response_format(tools: list[dict[str, Any]], mode: str = "json_schema") -> dict[str, Any]:
    """The `response_format` that admits exactly one call of one of `tools`: OpenAI's form
    (`json_schema`: OpenAI, vLLM, llama.cpp's server) or llama-cpp-python's (`json_object` with
    a `schema`, which its server reads; llama.cpp's takes it too)."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    schema = {"anyOf": options}
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    return {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": True},
    }


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The tools as the model reads them in this mode: one line each, name(arguments): what."""
    lines = [
        'Answer with one JSON object: {"name": TOOL, "arguments": {...}}. The tools:',
    ]
    for t in tools:
        fn = t["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        required = set((fn.get("parameters") or {}).get("required") or [])
        args = ", ".join(
            f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}" for k, v in props.items()
        )
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '')}")
    return "\n".join(lines)


def as_plain_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict]:
    """The conversation without tool-call messages: the tools listed in the system prompt, each
    earlier call as the assistant's JSON, each result as a user message."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system" and not out:
            out.append({"role": "system", "content": m["content"] + "\n\n" + tools_text(tools)})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            try:
                arguments = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                arguments = fn.get("arguments")
            out.append(
                {
                    "role": "assistant",
                    "content": json.dumps({"name": fn["name"], "arguments": arguments}),
                }
            )
        elif m["role"] == "tool":
            out.append({"role": "user", "content": m["content"]})
        else:
            out.append(m)
    return out


def call_from_content(content: str | None) -> dict[str, Any] | None:
    """The tool call a constrained reply's content holds, in the shape of a parsed tool call
    ({"id", "type", "function": {"name", "arguments"}}); None when it holds none."""
    try:
        value = json.loads(content or "")
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    return {
        "id": "call_constrained",
        "type": "function",
        "function": {
            "name": value["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }
