"""The tool schemas the model is sent: a compact subset of each skill's input schema that every
common server accepts. The input model keeps every limit (maxLength, patterns, bounds) and
validates the model's arguments before anything runs; what the model reads needs only the
shape. Sending the rest cost tokens and crashed servers: llama-cpp-python's server segfaulted
building a grammar from `maxLength` (it unrolls one rule per allowed character), and its
converter asserts on a `pattern` without ^…$ and on keywords it does not know.

The subset is a whitelist (SENT_KEYWORDS): `type`, `properties`, `required`, `items`, `enum`,
`const`, `anyOf`, `additionalProperties`, `description`. `$ref`s are inlined (a nested model
deeper than MAX_DEPTH becomes a plain object), `Optional[X]` becomes X (a field the model may
leave out), and descriptions are cut to their first sentence.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nightshift.skills.base import Skill

SENT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "const",
        "anyOf",
        "additionalProperties",
        "description",
    }
)
TOOL_DESCRIPTION_CHARS = 110
FIELD_DESCRIPTION_CHARS = 70
MAX_DEPTH = 2  # nested models inlined below the arguments object; deeper: {"type": "object"}
# Optional fields left out of what the model reads: filled by the daemon (a diagnosis's machine
# evidence), or tuning constants whose defaults are right. The input model still takes them.
UNSENT: dict[str, frozenset[str]] = {
    "diagnose_failure": frozenset({"machine", "kernel_log", "monitor_detail"}),
    "tune_lr": frozenset(
        {
            "window",
            "k",
            "grad_k",
            "min_delta",
            "min_delta_mode",
            "smoothing_beta",
            "stop_factor",
            "restart_lr",
            "plateau_factor",
            "min_lr",
        }
    ),
    "auto_resume": frozenset({"max_depth", "steps_per_epoch", "reject_nonfinite"}),
}

# The end of a sentence: a full stop before a capital, not the one of "e.g." or "i.e."
_SENTENCE = re.compile(r"(?<!\.[a-z])\.\s+(?=[A-Z])|\n\s*\n")


def short(text: str, limit: int) -> str:
    """The first sentence of `text`, on one line, at most `limit` characters."""
    text = " ".join((text or "").split())
    first = _SENTENCE.split(text, maxsplit=1)[0].rstrip(". ")
    if len(first) > limit:  # cut at the last clause before the limit, else the last word
        head = first[: limit - 1]
        cut = max(head.rfind(mark) for mark in (": ", ", ", " (", " — ", "; "))
        first = (head[:cut] if cut > limit // 2 else head.rsplit(" ", 1)[0]).rstrip(",;: ") + "…"
    return first


def sent_schema(skill: Skill[Any, Any]) -> dict[str, Any]:
    """The OpenAI tool definition the model gets for `skill`: compact, and within the subset."""
    full = skill.input_model.model_json_schema()
    unsent = UNSENT.get(skill.name, frozenset())
    required = set(full.get("required") or [])
    if unsent & required:
        raise ValueError(
            f"{skill.name}: a required field cannot be left unsent: {unsent & required}"
        )
    props = {k: v for k, v in (full.get("properties") or {}).items() if k not in unsent}
    params = _compact({**full, "properties": props}, full.get("$defs") or {}, depth=0)
    params.pop(
        "description", None
    )  # the tool's description says it    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": skill.name,
            "description": short(skill.description, TOOL_DESCRIPTION_CHARS),
            "parameters": params,
        },
    }


def _compact(node: Any, defs: dict[str, Any], depth: int) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1], {})
        if depth > MAX_DEPTH:
            return _described({"type": "object"}, node.get("description"))
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _compact(merged, defs, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list):
            real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
            if len(real) == 1:  # Optional[X]: X, which the model may leave out
                return _compact({**real[0], **rest}, defs, depth)
            union = {"anyOf": [_compact(o, defs, depth) for o in real]}
            return _described(union, node.get("description"))
    allof = node.get("allOf")
    if isinstance(allof, list) and len(allof) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _compact({**allof[0], **rest}, defs, depth)
    out: dict[str, Any] = {}
    kind = node.get("type")
    if isinstance(kind, str | list):
        out["type"] = kind
    if "enum" in node:
        out["enum"] = list(node["enum"])
    if "const" in node:
        out["const"] = node["const"]
    props = node.get("properties")
    if isinstance(props, dict):
        if depth > MAX_DEPTH:
            return _described({"type": "object"}, node.get("description"))
        out["type"] = "object"
        out["properties"] = {k: _compact(v, defs, depth + 1) for k, v in props.items()}
        required = [r for r in node.get("required") or [] if r in props]
        if required:
            out["required"] = required
    items = node.get("items")
    if isinstance(items, dict):
        out["items"] = _compact(items, defs, depth + 1)
    extra = node.get("additionalProperties")
    if isinstance(extra, bool) and "properties" not in out:
        out["additionalProperties"] = extra
    elif isinstance(extra, dict):
        out["additionalProperties"] = _compact(extra, defs, depth + 1)
    if not out.keys() & {"type", "enum", "const", "anyOf"}:
        return {}  # any value: a schema with only a description trips llama.cpp's converter
    return _described(out, node.get("description"))


def _described(out: dict[str, Any], description: Any) -> dict[str, Any]:
    if isinstance(description, str) and description.strip():
        out["description"] = short(description, FIELD_DESCRIPTION_CHARS)
    return out


def keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in `schema` (property names are not keywords)."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for k, v in schema.items():
            found.add(k)
            if k == "properties" and isinstance(v, dict):
                for sub in v.values():
                    found |= keywords(sub)
            elif k in ("items", "additionalProperties"):
                found |= keywords(v)
            elif k == "anyOf" and isinstance(v, list):
                for sub in v:
                    found |= keywords(sub)
    return found
