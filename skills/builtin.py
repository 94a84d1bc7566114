"""Importing this module registers every built-in skill."""

from nightshift.skills import (  # noqa: F401
    auto_resume,
    cancel_job,
    config_validator,
    diagnose_failure,
    gpu_health,
    job_logs,
    launch_container,
    list_jobs,
    pause_job,
    resume_job,
    retry_job,
    show_job,
    submit_job,
    submit_jobs,
    tune_lr,
)
