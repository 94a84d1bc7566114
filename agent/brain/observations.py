"""A tool result as the model reads it: a short observation, not the raw JSON. A list_jobs or a
gpu_health_check result is thousands of characters of keys, nulls and nesting; the model needs
the values that are there. Each result becomes `path: value` pairs with empty values left out,
long strings and lists cut, and the whole cut to a limit; older results are cut harder so a long
goal stays inside a small model's context.
"""

from __future__ import annotations

import json
from typing import Any

STRING_CHARS = 200  # one string value (a log line, a reason) at most
LIST_ITEMS = 8  # items of one list shown; the rest counted


def summarise(value: Any, limit: int) -> str:
    """`value` (a tool result body) as `key: value` pairs, at most `limit` characters."""
    parts: list[str] = []
    texts: list[str] = []  # lists of lines (a log's end): what job_logs is asked for
    _walk(value, "", parts, texts)
    facts, lines = "; ".join(parts), "; ".join(texts)
    joined = "; ".join(t for t in (facts, lines) if t)
    if len(joined) <= limit:
        return joined
    if not lines:
        return _head(facts, limit)
    if not facts:
        return _tail(lines, limit)
    # both do not fit: the facts keep at most two thirds, the lines' END the rest (the last
    # lines of a log are the ones that say how it is doing)
    facts = _head(facts, max(limit - len(lines) - 2, limit // 3))
    return f"{facts}; {_tail(lines, limit - len(facts) - 2)}"


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 30)].rstrip() + f" … [{len(text) - limit + 30} more chars]"


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit + 30} earlier chars] … " + text[-max(0, limit - 30) :].lstrip()


def _walk(value: Any, path: str, out: list[str], texts: list[str]) -> None:
    if value is None or value == "" or value == [] or value == {}:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, f"{path}.{k}" if path else str(k), out, texts)
        return
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value) and len(value) > 2:
            # lines (of a log): the last ones matter
            more = f"(+{len(value) - LIST_ITEMS} earlier) " if len(value) > LIST_ITEMS else ""
            shown = " | ".join(_scalar(v) for v in value[-LIST_ITEMS:])
            texts.append(f"{path}: {more}{shown}")
            return
        if all(not isinstance(v, dict | list) for v in value):
            shown = ", ".join(_scalar(v) for v in value[:LIST_ITEMS])
            more = f" (+{len(value) - LIST_ITEMS} more)" if len(value) > LIST_ITEMS else ""
            out.append(f"{path}: [{shown}{more}]")
            return
        for i, v in enumerate(value[:LIST_ITEMS]):
            _walk(v, f"{path}[{i}]", out, texts)
        if len(value) > LIST_ITEMS:
            out.append(f"{path}: +{len(value) - LIST_ITEMS} more")
        return
    out.append(f"{path}: {_scalar(value)}" if path else _scalar(value))


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        text = " ".join(value.split())
        return text if len(text) <= STRING_CHARS else text[: STRING_CHARS - 1] + "…"
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value, default=str, ensure_ascii=False)
