"""The built-in skills, an explicit table: what the agent can call unless a package adds more
(entry points may add skills, never replace these; see registry.py).

Each built-in is named with the module that defines it, so that one call imports one skill's
module: `nightshift show` needs show_job, not the checkpoint search's NumPy or the sweeps'
Optuna. `builtins()` imports them all, and checks that this table says where each one is."""

from __future__ import annotations

import importlib
from functools import cache

from nightshift.skills.base import Skill

# skill name → the module of nightshift.skills that defines it
MODULE_OF = {
    "apply_policy": "apply_policy",
    "auto_resume": "auto_resume",
    "cancel_job": "cancel_job",
    "compare_jobs": "compare_jobs",
    "config_validator": "config_validator",
    "correct_diagnosis": "correct_diagnosis",
    "diagnose_failure": "diagnose_failure",
    "gpu_health_check": "gpu_health",
    "job_logs": "job_logs",
    "launch_container": "launch_container",
    "list_jobs": "list_jobs",
    "pause_job": "pause_job",
    "release_job": "release_job",
    "reproduce_job": "reproduce_job",
    "resume_job": "resume_job",
    "retry_job": "retry_job",
    "set_power_limit": "set_power_limit",
    "show_job": "show_job",
    "show_power_limits": "show_power_limits",
    "start_sweep": "start_sweep",
    "stop_sweep": "stop_sweep",
    "submit_job": "submit_job",
    "submit_jobs": "submit_jobs",
    "tune_lr": "tune_lr",
}
MODULES = tuple(dict.fromkeys(MODULE_OF.values()))
# The built-ins imported so far, by name (a test may register one of its own here).
BUILTINS: dict[str, Skill] = {}


def builtin(name: str) -> Skill | None:
    """The built-in skill `name`, importing its module only; None if there is none."""
    if name not in BUILTINS and name in MODULE_OF:
        BUILTINS.update(_skills_of(MODULE_OF[name]))
    return BUILTINS.get(name)


@cache
def _skills_of(module: str) -> dict[str, Skill]:
    found = vars(importlib.import_module(f"nightshift.skills.{module}")).values()
    return {obj.name: obj for obj in found if isinstance(obj, Skill)}


def builtins() -> dict[str, Skill]:
    """Every built-in skill, in the table's order; a skill the table does not place where it is
    defined is a TypeError (the table is what `builtin` imports by)."""
    table: dict[str, Skill] = {}
    for module in MODULES:
        for obj in _skills_of(module).values():
            if table.setdefault(obj.name, obj) is not obj:
                raise TypeError(f"two built-in skills are named {obj.name!r}")
            if MODULE_OF.get(obj.name) != module:
                raise TypeError(f"skills/builtin.py: MODULE_OF[{obj.name!r}] must be {module!r}")
    missing = set(MODULE_OF) - set(table)
    if missing:
        raise TypeError(f"skills/builtin.py names skills no module defines: {sorted(missing)}")
    BUILTINS.update({k: v for k, v in table.items() if k not in BUILTINS})
    return {**table, **BUILTINS}
