"""Only the lifecycle moves jobs: a watch on every write of a job's state or reason and of an
attempt's state or end (outcome, exit status, energy, cause, diagnosis) in the test process.

A write made by code of ours outside `runtime/store/lifecycle.py` to a row that is already in the store
is recorded, and conftest's autouse fixture fails the test during which it happened. Writes from
the tests themselves (setting up a store by hand) and to rows being created are not counted.
Core UPDATE statements do not pass through these events; tests/test_lifecycle.py reads the
source for those."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect

from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, Job

REPO = Path(__file__).resolve().parents[1]
OURS = tuple(str(REPO / d) + "/" for d in ("agent", "skills", "runtime", "policies", "evals"))
TESTS = str(REPO / "tests") + "/"
LIFECYCLE = str(Path(lifecycle.__file__).resolve())
WATCHED: dict[type, tuple[str, ...]] = {
    Job: ("state", "reason"),
    Attempt: (
        "state",
        "outcome",
        "ended_at",
        "ended_mono",
        "exit_code",
        "signal",
        "energy_kwh",
        "energy_source",
        "cause",
        "diagnosis",
    ),
}
VIOLATIONS: list[str] = []


def _writer() -> str | None:
    """file:line of our code that made the write, or None for the lifecycle or a test."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path == LIFECYCLE or path.startswith(TESTS):
            return None
        if path.startswith(OURS):
            return f"{path[len(str(REPO)) + 1 :]}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return None


def _listener(cls: type, attr: str) -> Any:
    def on_set(target: Any, value: Any, oldvalue: Any, initiator: Any) -> None:
        if value == oldvalue or not inspect(target).persistent:
            return
        where = _writer()
        if where is not None:
            VIOLATIONS.append(f"{where} wrote {cls.__name__}.{attr} = {value!r}")

    return on_set


for _cls, _attrs in WATCHED.items():
    for _attr in _attrs:
        event.listen(getattr(_cls, _attr), "set", _listener(_cls, _attr))
