"""Arguments grounded in the world, checked before the gate: a small model invents job ids
(`1234567890123456`), sweep names and paths (`$NZB`) that look plausible and name nothing. The
input model cannot know what exists; the store does. A call that names a job or a sweep that is
not there, or that asks a read skill to open a path outside the allowed roots, goes back to the
model as "no such job …; these exist: …" and never reaches the gate, so the skill never runs.

What is checked, by argument name (the same names every built-in skill uses):

* `job_id`, `preempted_for` and each of `job_ids`: a job row with that id;
* `stop_sweep`'s `name`: a sweep with that name;
* a read skill's paths (`log_path`, `checkpoint_dir`, `search_dirs`, `from_file`, `path`,
  `spec_path`): under the policy's allowed roots once `~` and symlinks are resolved (the gate
  confines a launch's paths itself; a read skill's paths are confined here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

if TYPE_CHECKING:
    from nightshift.runtime.store.db import Store

JOB_FIELDS = ("job_id", "preempted_for")
JOB_LISTS = ("job_ids",)
PATH_FIELDS = ("log_path", "checkpoint_dir", "search_dirs", "from_file", "path", "spec_path")
SHOWN = 8  # existing jobs or sweeps named in a refusal


@dataclass
class Grounding:
    """The checks for one planner: the store it reads, and the roots a read may open (None: no
    path check, as where the policy sets no roots)."""

    store: Store
    roots: Sequence[Path] | None = None

    def check(self, skill: str, capability: str, args: dict[str, Any]) -> str | None:
        """Why the call names something that does not exist, or None when everything it names
        does. The text goes back to the model as the tool result."""
        for name in JOB_FIELDS:
            value = args.get(name)
            if isinstance(value, int) and _is_id(value) and self.store.job(value) is None:
                return f"{skill}: no such job {value}; {self._jobs()}. Nothing ran"
        for name in JOB_LISTS:
            listed = args.get(name)
            for value in listed if isinstance(listed, list) else []:
                if isinstance(value, int) and _is_id(value) and self.store.job(value) is None:
                    return f"{skill}: no such job {value}; {self._jobs()}. Nothing ran"
        if skill == "stop_sweep" and isinstance(args.get("name"), str):
            names = self._sweeps()
            if args["name"] not in names:
                shown = ", ".join(names[:SHOWN]) or "none"
                return f"stop_sweep: no such sweep {args['name']!r}; these exist: {shown}"
        if capability == "read" and self.roots is not None:
            for name in PATH_FIELDS:
                for path in _paths(args.get(name)):
                    if not _under(path, self.roots):
                        return (
                            f"{skill}: {name} {path!r} is outside the allowed roots "
                            f"({', '.join(str(r) for r in self.roots)}); nothing ran. Use a path "
                            "a result or the researcher gave you"
                        )
        return None

    def _jobs(self) -> str:
        from nightshift.runtime.store.db import Job

        with self.store.session() as s:
            rows = list(s.exec(select(Job).order_by(col(Job.id).desc()).limit(SHOWN)))
        if not rows:
            return "there are no jobs at all"
        return "these exist: " + ", ".join(f"{j.id} ({j.state}, {j.name})" for j in rows)

    def _sweeps(self) -> list[str]:
        from nightshift.runtime.store.db import Sweep

        with self.store.session() as s:
            return [w.name for w in s.exec(select(Sweep).order_by(col(Sweep.id).desc()))]


def _is_id(value: Any) -> bool:
    """An int the input model will take as a job id (a string or a bool is its error to give)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _paths(value: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v.strip()]
    return []


def _under(path: str, roots: Sequence[Path]) -> bool:
    try:
        real = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(real == r or real.is_relative_to(r) for r in roots)
