"""`nightshift report --sweep NAME`: where a sweep stands, from the store and its Optuna study.

The best trial and its parameters, every trial (state, value, job, steps, seconds), the GPU-hours
the trials used and an estimate of those pruning saved, and a plot: each trial's objective by
trial number and against each searched parameter, and the learning curves of the top trials.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import col, select

from nightshift.runtime.errors import BadArguments
from nightshift.runtime.scheduling.sweeps import gpu_hours_of, load_study, objective
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store.db import Attempt, Job, MetricPoint, Store, Sweep


class TrialLine(BaseModel):
    number: int
    state: str = Field(description="Optuna's: COMPLETE, PRUNED, FAIL, RUNNING, WAITING")
    value: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    job_id: int | None = None
    job_state: str | None = None
    last_step: int | None = None
    seconds: float = Field(0.0, description="Run time of the trial's attempts")
    pruned_at: int | None = None


class SweepReport(BaseModel):
    name: str
    state: str
    reason: str | None
    metric: str
    mode: str
    searched: list[str]
    budget: dict[str, Any]
    best: TrialLine | None
    trials: list[TrialLine]
    gpu_hours: float = Field(description="GPU-hours of every attempt (CPU-only: one slot)")
    pruned: int
    saved_gpu_hours: float = Field(
        description="An estimate: each pruned trial's remaining steps (to the longest finished "
        "trial's last step) at its own measured seconds per step"
    )


def sweep_report(store: Store, name: str, now: datetime) -> SweepReport:
    with store.session() as s:
        row = s.exec(select(Sweep).where(Sweep.name == name)).first()
        if row is None:
            known = list(s.exec(select(Sweep.name).order_by(col(Sweep.id).desc()).limit(5)))
            raise BadArguments(
                f"no sweep named {name!r}"
                + (
                    f"; the newest: {', '.join(known)}"
                    if known
                    else "; `nightshift sweep` starts one"
                )
            )
        jobs = {j.id: j for j in s.exec(select(Job).where(Job.group == name))}
        atts = list(s.exec(select(Attempt).where(col(Attempt.job_id).in_(list(jobs)))))
    spec = ExperimentSpec.model_validate(row.spec)
    metric, mode = objective(spec)
    seconds: dict[int, float] = {}
    last_step: dict[int, int] = {}
    gpus: dict[int, int] = {}
    for a in atts:
        seconds[a.job_id] = seconds.get(a.job_id, 0.0) + max(
            0.0, ((a.ended_at or now) - a.started_at).total_seconds()
        )
        if a.last_step is not None:
            last_step[a.job_id] = max(last_step.get(a.job_id, 0), a.last_step)
        gpus[a.job_id] = max(1, len(a.gpus))
    lines = []
    for t in load_study(row, store.url).get_trials(deepcopy=False):
        job_id = t.user_attrs.get("job_id")
        job = jobs.get(job_id) if job_id is not None else None
        lines.append(
            TrialLine(
                number=t.number,
                state=t.state.name,
                value=t.value if t.state.name == "COMPLETE" else None,
                params=t.user_attrs.get("params", t.params),
                job_id=job_id,
                job_state=job.state if job else None,
                last_step=last_step.get(job_id) if job_id is not None else None,
                seconds=seconds.get(job_id, 0.0) if job_id is not None else 0.0,
                pruned_at=t.user_attrs.get("pruned_at"),
            )
        )
    done = [t for t in lines if t.value is not None]
    best = (min if mode == "min" else max)(done, key=lambda t: t.value or 0.0) if done else None
    full = max((t.last_step or 0 for t in lines if t.state == "COMPLETE"), default=0)
    saved = 0.0
    for t in lines:
        if t.state == "PRUNED" and t.last_step and t.job_id is not None and full > t.last_step:
            per_step = t.seconds / t.last_step
            saved += (full - t.last_step) * per_step * gpus.get(t.job_id, 1) / 3600
    return SweepReport(
        name=row.name,
        state=row.state,
        reason=row.reason,
        metric=metric,
        mode=mode,
        searched=list(spec.search or {}),
        budget=row.budget,
        best=best,
        trials=lines,
        gpu_hours=gpu_hours_of(store, list(jobs), now),
        pruned=sum(t.state == "PRUNED" for t in lines),
        saved_gpu_hours=saved,
    )


def curves(store: Store, job_ids: list[int], metric: str) -> dict[int, list[tuple[int, float]]]:
    """The objective's points of these jobs, by job, in the order they were recorded."""
    out: dict[int, list[tuple[int, float]]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    with store.session() as s:
        rows = s.exec(
            select(MetricPoint.job_id, MetricPoint.step, MetricPoint.value)
            .where(col(MetricPoint.job_id).in_(job_ids), MetricPoint.name == metric)
            .order_by(col(MetricPoint.id))
        ).all()
    for job_id, step, value in rows:
        if value is not None and math.isfinite(value):
            out[job_id].append((step, value))
    return out


def plot_sweep(store: Store, r: SweepReport, path: Path, top: int = 5) -> bool:
    """A PNG: the objective by trial and against each searched parameter (a scatter per
    parameter), and the learning curves of the `top` best trials. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    told = [t for t in r.trials if t.job_id is not None]
    panels = 2 + len(r.searched)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    ax_trials, ax_curves, *ax_params = axes[0]
    colours = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red"}
    lasts = curves(store, [t.job_id for t in told if t.job_id is not None], r.metric)

    def shown(t: TrialLine) -> float | None:
        if t.value is not None:
            return t.value
        pts = lasts.get(t.job_id or -1) or []
        return pts[-1][1] if pts else None

    for state, colour in colours.items():
        by_trial = [(t.number, shown(t)) for t in told if t.state == state]
        if any(v is not None for _, v in by_trial):
            xs, ys = zip(*[(n, v) for n, v in by_trial if v is not None], strict=True)
            ax_trials.scatter(xs, ys, s=14, c=colour, label=state.lower())
    ax_trials.set(xlabel="trial", ylabel=r.metric, title=f"sweep {r.name}")
    ax_trials.legend(fontsize=7)
    ranked = sorted(
        (t for t in told if t.value is not None),
        key=lambda t: (t.value or 0.0) if r.mode == "min" else -(t.value or 0.0),
    )[:top]
    for t in ranked:
        curve = lasts.get(t.job_id or -1) or []
        if curve:
            ax_curves.plot(*zip(*curve, strict=True), label=f"trial {t.number}: {t.value:.4g}")
    ax_curves.set(xlabel="step", ylabel=r.metric, title=f"top {len(ranked)} trials")
    ax_curves.legend(fontsize=7)
    for ax, name in zip(ax_params, r.searched, strict=True):
        for state, colour in colours.items():
            along = [
                (t.params[name], y)
                for t in told
                if t.state == state and name in t.params and (y := shown(t)) is not None
            ]
            if along:
                ax.scatter(*zip(*along, strict=True), s=14, c=colour)
        values = [t.params.get(name) for t in told]
        numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if numeric and min(numeric) > 0 and max(numeric) / min(numeric) > 50:
            ax.set_xscale("log")
        ax.set(xlabel=name, ylabel=r.metric)
    finite = [y for t in told if (y := shown(t)) is not None]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
        for ax in axes[0]:
            ax.set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
