"""The `nightshift` command. The four everyday reads in their plain forms are answered here,
before Typer is imported; everything else is the full command line's (cli.py).

Why: Typer checks every argument of the command it runs through pydantic, which it imports for
that — a tenth of a second on a small machine before the command starts, a third of what `jobs`
may take (issue 28: `squeue`'s speed). The plain forms are

    jobs   [--state STATE]... [--json] [--config FILE]
    status [--json] [--config FILE]
    show   JOB [--config FILE]
    logs   JOB [--tail N | -n N] [--attempt N] [--config FILE]

(`--opt=value` too). Anything else — help, another option, a value that is not plainly right —
and any answer the fast path cannot give (quick.py says None) goes to cli.py, which parses,
checks and answers as always, errors included. tests/test_fast_answers.py holds each plain form's
output to the full command line's.
"""

from __future__ import annotations

import sys
from typing import Any

from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.store.quick_read import JOB_STATES

# command → its options: name → (flags, takes a value, may repeat)
OPTIONS: dict[str, dict[str, tuple[tuple[str, ...], bool, bool]]] = {
    "jobs": {
        "state": (("--state",), True, True),
        "json": (("--json",), False, False),
        "config": (("--config",), True, False),
    },
    "status": {"json": (("--json",), False, False), "config": (("--config",), True, False)},
    "show": {"config": (("--config",), True, False)},
    "logs": {
        "tail": (("--tail", "-n"), True, False),
        "attempt": (("--attempt",), True, False),
        "config": (("--config",), True, False),
    },
}
TAKES_JOB = ("show", "logs")
TAIL_DEFAULT, TAIL_MAX = 100, 5000  # job_logs' tail: 1 to 5000 lines
MAX_ID = 2**63 - 1  # SQLite's integers


def main() -> None:
    """`nightshift ARGS`: a plain read answered here, anything else by cli.py."""
    try:
        if answered(sys.argv[1:]):
            return
    except NightshiftError as exc:
        from nightshift.agent.doors.console import error

        error(str(exc))
        raise SystemExit(exc.exit_code) from None
    from nightshift.agent.doors.cli import main as full

    full()


def plain(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(command, its values) when argv is one of the plain forms, else None."""
    if not argv or argv[0] not in OPTIONS:
        return None
    command, options = argv[0], OPTIONS[argv[0]]
    flags = {
        flag: (name, value, repeat) for name, (fs, value, repeat) in options.items() for flag in fs
    }
    got: dict[str, Any] = {}
    rest = list(argv[1:])
    while rest:
        word = rest.pop(0)
        flag, eq, given = word.partition("=") if word.startswith("--") else (word, "", "")
        if flag not in flags:
            if word.startswith("-") or command not in TAKES_JOB or "job" in got:
                return None
            if not word.isdigit() or int(word) > MAX_ID:
                return None
            got["job"] = int(word)
            continue
        name, takes, repeat = flags[flag]
        if not takes:
            if eq or name in got:
                return None
            got[name] = True
            continue
        if not eq:
            if not rest or rest[0].startswith("-"):
                return None
            given = rest.pop(0)
        if repeat:
            got.setdefault(name, []).append(given)
        elif name in got:
            return None
        else:
            got[name] = given
    if command in TAKES_JOB and "job" not in got:
        return None
    for name in ("tail", "attempt"):
        if name in got:
            if not got[name].isdigit() or int(got[name]) > MAX_ID:
                return None
            got[name] = int(got[name])
    if not 1 <= got.get("tail", TAIL_DEFAULT) <= TAIL_MAX:
        return None
    if any(s not in JOB_STATES for s in got.get("state", [])):
        return None
    return command, got


def answered(argv: list[str]) -> bool:
    """Answer a plain read; False when it is not one, or when only the full path can answer."""
    found = plain(argv)
    if found is None:
        return False
    command, got = found
    from nightshift.agent.doors import job_views, quick

    config = got.get("config")
    if command == "jobs":
        rows = quick.rows_and_switch(config, got.get("state", []), switch=False)[0]
        job_views.answer_jobs(rows, as_json=got.get("json", False))
        return True
    if command == "status":
        job_views.answer_status(*quick.rows_and_switch(config, []), as_json=got.get("json", False))
        return True
    if command == "show":
        r = quick.show(config, got["job"])
        if r is None:
            return False
        job_views.print_show(r)
        return True
    lines = quick.log_lines(config, got["job"], got.get("attempt"), got.get("tail", TAIL_DEFAULT))
    if lines is None:
        return False
    job_views.print_logs(got["job"], *lines)
    return True


if __name__ == "__main__":
    main()
