"""A job's history as `nightshift show` tells it, from its rows alone: each attempt's steps, the
steps the next attempt lost, how long it ran, the parameters it changed and the checkpoint it
resumed from; and where the job's files are.

Plain Python on rows that have the store's attributes (the ORM's `Job` and `Attempt`, or
quick_read's rows), so the show_job skill and `show`'s fast answer are one computation: the skill
validates this into its result model, the fast answer prints it as it is.
"""

from __future__ import annotations

import re
import string
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.runtime.training import keeper, provenance

ENDED = ("exited", "lost", "stopped")
DEFAULT_CHECKPOINT_DIR = "checkpoints"
DEFAULT_METRICS_FILE = "metrics.jsonl"


def job_folder(runs_dir: Path, job_id: int) -> Path:
    """Per-job folder for logs, metrics and (relative) checkpoints."""
    return runs_dir / f"job-{job_id}"


def paths(
    runs_dir: Path, job_id: int, checkpoint_dir: str | None, metrics_file: str | None
) -> dict[str, Path]:
    """The job's folder, its checkpoint folder and metrics file (a relative one is in the job's
    folder) and the folder of the good checkpoints kept."""
    ws = job_folder(runs_dir, job_id)
    ckpt = Path(checkpoint_dir or DEFAULT_CHECKPOINT_DIR)
    metrics = Path(metrics_file or DEFAULT_METRICS_FILE)
    return {
        "workspace": ws,
        "checkpoint_dir": ckpt if ckpt.is_absolute() else ws / ckpt,
        "metrics_file": metrics if metrics.is_absolute() else ws / metrics,
        "good_checkpoints": keeper.good_dir(ws),
    }


def detail(
    job: Any,
    attempts: list[Any],
    *,
    where: dict[str, Path],
    resume_template: list[str],
    now: datetime,
    hold: str | None,
) -> dict[str, Any]:
    """Everything `show` says of one job, as plain values: the show_job skill's result, field for
    field (each attempt's `diagnosis` still the row's raw value); `hold` is why the last tick
    left it waiting."""
    details: list[dict[str, Any]] = []
    for i, a in enumerate(attempts):
        if i + 1 < len(attempts):
            next_start: int | None = attempts[i + 1].start_step
        else:  # the job is waiting for its next attempt: it will start from the resume point
            next_start = (job.resume_step or 0) if job.state == "queued" else None
        lost = (
            None if next_start is None or a.last_step is None else max(0, a.last_step - next_start)
        )
        ckpt, ckpt_step, note = resume_point(a.argv, a.start_step, resume_template)
        details.append(
            {
                "number": a.number,
                "state": a.state,
                "outcome": a.outcome,
                "cause": a.cause,
                "diagnosis": a.diagnosis,
                "evidence": a.evidence,
                "first_bad_step": a.first_bad_step,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "duration_s": duration_s(a, now),
                "start_step": a.start_step,
                "last_step": a.last_step,
                "last_loss": a.last_loss,
                "steps_lost": lost,
                "exit_code": a.exit_code,
                "signal": a.signal,
                "gpus": list(a.gpus),
                "param_changes": param_changes(attempts[i - 1].params if i else None, a.params),
                "resumed_from": ckpt,
                "resumed_from_step": ckpt_step,
                "resume_note": note,
                "log_path": a.log_path,
                "provenance": getattr(a, "provenance", None),
                "provenance_changes": provenance.changes(
                    getattr(attempts[i - 1], "provenance", None) if i else None,
                    getattr(a, "provenance", None),
                ),
            }
        )
    return {
        "job_id": job.id,
        "name": job.name,
        "state": job.state,
        "reason": hold if job.state == "queued" and hold else job.reason,
        "owner": job.owner,
        "priority": job.priority,
        "group": job.group,
        "reproduces": getattr(job, "reproduces", None),
        "spec_path": job.spec_path,
        "workspace": str(where["workspace"]),
        "checkpoint_dir": str(where["checkpoint_dir"]),
        "params": dict(job.params),
        "max_attempts": job.max_attempts,
        "resume_from": job.resume_from,
        "resume_step": job.resume_step,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "good_checkpoints": keeper.kept(where["workspace"]),
        "steps_lost_total": sum(d["steps_lost"] or 0 for d in details),
        "attempts": details,
    }


def resume_point(
    argv: list[str], start_step: int, template: list[str]
) -> tuple[str | None, int | None, str]:
    """The checkpoint an attempt resumed from, read back from its argv.

    The loop renders an attempt's argv as the spec's command plus, when the job had a resume point,
    the spec's `checkpoint.resume_arg` filled in; so the argv's last len(resume_arg) items, matched
    against that template, give the `{checkpoint}` (and `{step}`) it was started with. This is
    what the process was really told, which the job row no longer says once a later resume changed
    it. Returns (checkpoint, step, how it was found)."""
    if not argv:
        return None, None, "unknown: the attempt's command was not recorded"
    found = _match_tail(argv, template)
    if found is None:
        if start_step:
            return (
                None,
                start_step,
                (
                    f"started at step {start_step}; its argv names no "
                    "checkpoint (the spec's resume argument is not in it)"
                ),
            )
        return None, None, "from scratch"
    ckpt, step = found
    if step is None and start_step:
        step = start_step
    if ckpt is None:
        return None, step, "resumed; the resume argument names no checkpoint path"
    return ckpt, step, "from the resume argument in its argv"


def _match_tail(argv: list[str], template: list[str]) -> tuple[str | None, int | None] | None:
    if not template or len(argv) < len(template):
        return None
    ckpt: str | None = None
    step: int | None = None
    for arg, item in zip(argv[-len(template) :], template, strict=True):
        m = _template_regex(item).fullmatch(arg)
        if m is None:
            return None
        groups = m.groupdict()
        ckpt = groups.get("checkpoint") or ckpt
        if groups.get("step") is not None:
            step = int(groups["step"])
    return ckpt, step


def _template_regex(item: str) -> re.Pattern[str]:
    """`--resume={checkpoint}` → a regex capturing the checkpoint; other placeholders match anything."""
    out, seen = [], set()
    for literal, name, _spec, _conv in string.Formatter().parse(item):
        out.append(re.escape(literal))
        if name is None:
            continue
        if name in ("checkpoint", "step") and name not in seen:
            seen.add(name)
            out.append(r"(?P<step>-?\d+)" if name == "step" else r"(?P<checkpoint>.+?)")
        else:
            out.append(r".*?")
    return re.compile("".join(out), re.DOTALL)


def duration_s(att: Any, now: datetime) -> float | None:
    """Run time; for a live attempt, so far; None for one that ended unseen."""
    if att.ended_at is not None:
        return max(0.0, (att.ended_at - att.started_at).total_seconds())
    if att.state in ENDED:
        return None
    return max(0.0, (now - att.started_at).total_seconds())


def param_changes(
    before: dict[str, Any] | None, after: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The parameters that differ from the previous attempt's: name → {before, after}."""
    if before is None:
        return {}
    return {
        k: {"before": before.get(k), "after": after.get(k)}
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }
