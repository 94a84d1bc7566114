"""The built-in skills, an explicit table: what the agent can call unless a package adds more
(entry points may add skills, never replace these; see registry.py)."""

from __future__ import annotations

from nightshift.skills import (
    apply_policy,
    auto_resume,
    cancel_job,
    config_validator,
    diagnose_failure,
    gpu_health,
    job_logs,
    launch_container,
    list_jobs,
    pause_job,
    release_job,
    resume_job,
    retry_job,
    show_job,
    start_sweep,
    stop_sweep,
    submit_job,
    submit_jobs,
    tune_lr,
)
from nightshift.skills.base import Skill

MODULES = (
    apply_policy,
    auto_resume,
    cancel_job,
    config_validator,
    diagnose_failure,
    gpu_health,
    job_logs,
    launch_container,
    list_jobs,
    pause_job,
    release_job,
    resume_job,
    retry_job,
    show_job,
    start_sweep,
    stop_sweep,
    submit_job,
    submit_jobs,
    tune_lr,
)


def _table() -> dict[str, Skill]:
    table: dict[str, Skill] = {}
    for module in MODULES:
        for obj in vars(module).values():
            if isinstance(obj, Skill) and table.setdefault(obj.name, obj) is not obj:
                raise TypeError(f"two built-in skills are named {obj.name!r}")
    return table


BUILTINS: dict[str, Skill] = _table()
