"""Regular expressions that users write (a spec's `metrics.regex`) run on RE2, in time linear in
the text: a pattern that backtracks catastrophically under Python's `re`, such as
`(?P<step>\\d+)(?P<loss>(x+x+)+y)` against a line of x's, would hold the loop (and every user's
socket API calls) for hours. RE2 refuses what it cannot run in linear time (backreferences,
lookarounds); the spec validator says so at submit, naming the field."""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the reason is raised; RE2 need not print it to stderr as well

# What RE2 lacks, for the message: the features people reach for from Python's `re`.
_LACKS = (
    "RE2 has no backreferences (\\1, (?P=name)), lookarounds ((?=...), (?!...), (?<=...), "
    "(?<!...)), atomic or possessive groups, or \\Z (write \\z)"
)


class PatternError(ValueError):
    """A pattern RE2 does not accept; the message says why and what to write instead."""


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program for `pattern` (cached: the loop reads logs every tick), with `search`,
    `groupindex` and matches with `group` and `groupdict`, as Python's `re` has them."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = _reason(exc)
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise PatternError(f"does not compile: {exc}") from None
    raise PatternError(
        f"uses what the linear-time engine (RE2) that reads logs cannot run ({reason}): "
        f"{_LACKS}. Match the text around the value plainly instead, e.g. "
        "'iter (?P<step>\\d+): loss (?P<loss>\\S+)'"
    )


def _reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else exc
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
