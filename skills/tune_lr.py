"""tune_lr: deterministic learning-rate decisions from a run's metric history.

It proposes and never applies: a new learning rate reaches a job as resume_job's `param_changes`
(a `launch`, through the policy gate), from the checkpoint it names. Same points and
parameters, same answer: no clock, no randomness, nothing read but the given points (or the job's
recorded metrics).

The history. Points are taken in the order they were logged; a step that goes back (a resumed
attempt appending to the same metrics file, or a later attempt in the store) replaces the points
from that step on, so the history is always the lineage of the weights now in use. A loss of None
is a non-finite loss (the store records NaN as null).

Step convention. The loss logged at step s is measured on the weights before update s, so a
checkpoint written at step c (the weights after c updates) is first measured by the loss of step
c + 1. A checkpoint is trusted only if c + 1 is before the step at which a divergence began.

The analyses, each explained line by line in `reasoning`:

* divergence — a non-finite loss or grad norm; or the loss, smoothed as the mean of the last
  `window` points, above `k` × its running minimum; or the smoothed grad norm above `grad_k` ×
  its running minimum. The divergence began at the first bad point of that window. Proposal:
  lower_lr_and_resume with current_lr × factor — but never above the lr in effect at the loss's
  running minimum, the last lr known to be healthy — from the newest checkpoint before it began.
* plateau — the smoothed loss has not improved by more than `min_delta` (relative by default, as
  torch's ReduceLROnPlateau; or absolute) for `patience` points. The count starts again where the
  lr jumped (changed more than 2× between two points: an earlier reduction or restart, not a
  schedule's gradual decay). Proposal: reduce_lr (× plateau_factor, floored at min_lr) or
  warm_restart (to restart_lr, or the highest lr in the history), as configured.
* range_test — an LR range test's loss-vs-lr curve (the learning rate rising geometrically, one
  value per point). As fastai's LR finder: the loss is smoothed by an exponentially weighted
  average with bias correction (beta 0.98), the curve stops where the smoothed loss exceeds
  `stop_factor` × its minimum, the first tenth and the last five points are set aside, and the
  suggestion is the lr of the steepest descent of the smoothed loss against log(lr), bounded
  above by (lr at the minimum) / 10.
* auto — range_test when the learning rates rise geometrically by at least 10×; otherwise
  divergence, then plateau, else no_change.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from sqlmodel import col, select

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store.db import CheckpointRecord
from nightshift.runtime.user_files import read_limited
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill

Decision = Literal["lower_lr_and_resume", "reduce_lr", "warm_restart", "suggest_lr", "no_change"]
Mode = Literal["auto", "divergence", "plateau", "range_test"]

LR_JUMP = 2.0  # an lr change larger than this factor between two points restarts the plateau count
RANGE_TEST_MIN_RISE = 10.0  # auto: a geometric lr sweep must cover at least this factor
RANGE_TEST_MIN_POINTS = 10
MAX_EVIDENCE = 8


class MetricSample(BaseModel):
    """One logged step: its loss (None or NaN/inf: not finite), and the lr and grad norm if known."""

    step: int = Field(ge=0)
    loss: float | None = Field(description="The training loss; null for a non-finite value")
    lr: float | None = Field(None, description="The learning rate in effect at this step")
    grad_norm: float | None = Field(None, description="The gradient norm at this step")


class TuneLrInput(SkillInput):
    """A metric history (points, or a job whose recorded metrics are read) and the decision's
    parameters. Every default is usable as is."""

    mode: Mode = Field(
        "auto",
        description="Which analysis: divergence, plateau, range_test, or "
        "auto (range_test for a geometric lr sweep, else divergence then plateau)",
    )
    points: list[MetricSample] | None = Field(None, description="The history in the order logged")
    job_id: int | None = Field(None, ge=1, description="Or: read this job's recorded metrics")
    current_lr: float | None = Field(
        None,
        gt=0,
        description="The learning rate now; default: the "
        "job's parameter named by knob, else the last lr logged",
    )
    checkpoint_steps: list[int] | None = Field(
        None,
        description="Steps that have a checkpoint; "
        "default for a job: its valid recorded checkpoints",
    )
    knob: str | None = Field(
        None,
        description="The spec's learning-rate parameter; names the key "
        "of `changes` (default for a job: its spec's knobs.learning_rate)",
    )
    window: int = Field(20, ge=1, le=10_000, description="Points averaged to smooth the loss")
    k: float = Field(4.0, gt=1, description="Divergence: smoothed loss above k × its running min")
    grad_k: float = Field(
        10.0, gt=1, description="Divergence: smoothed grad norm above grad_k × its running minimum"
    )
    factor: float = Field(0.5, gt=0, lt=1, description="Divergence: new lr = current × factor")
    patience: int = Field(50, ge=1, description="Plateau: points without improvement")
    min_delta: float = Field(0.01, ge=0, description="Plateau: the least improvement that counts")
    min_delta_mode: Literal["rel", "abs"] = Field(
        "rel", description="rel: a fraction of the best smoothed loss; abs: in loss units"
    )
    plateau_action: Literal["reduce", "warm_restart"] = Field("reduce")
    plateau_factor: float = Field(0.1, gt=0, lt=1, description="Plateau: new lr = current × this")
    restart_lr: float | None = Field(
        None,
        gt=0,
        description="Warm restart: the lr to restart at (default: the highest lr in the history)",
    )
    min_lr: float = Field(0.0, ge=0, description="Never propose an lr below this")
    smoothing_beta: float = Field(0.98, gt=0, lt=1, description="Range test: EMA coefficient")
    stop_factor: float = Field(
        4.0,
        gt=1,
        description="Range test: the curve ends where the "
        "smoothed loss exceeds stop_factor × its minimum",
    )

    @model_validator(mode="after")
    def _one_history(self) -> TuneLrInput:
        if (self.points is None) == (self.job_id is None):
            raise ValueError("give points or job_id (exactly one)")
        return self

    def claims(self) -> Claims:
        """The job whose metrics it reads, if any: see the policy's denials."""
        return Claims(jobs=[self.job_id] if self.job_id is not None else [])


class EvidencePoint(BaseModel):
    step: int
    loss: float | None = Field(description="The logged loss; null when not finite")
    smoothed: float | None = Field(None, description="The smoothed loss the decision compared")
    lr: float | None = None
    grad_norm: float | None = None
    note: str = Field(description="Why this point matters")


class TuneLrResult(BaseModel):
    """The proposal. Nothing is applied: `changes` is what resume_job's `param_changes` would
    set, and `resume_from_step` the checkpoint to go back to (None: continue, or start over when
    reasoning says so)."""

    decision: Decision
    analysis: Literal["divergence", "plateau", "range_test", "none"] = Field(
        description="The analysis that decided (none: nothing to decide from)"
    )
    current_lr: float | None
    new_lr: float | None = Field(None, description="The proposed learning rate")
    resume_from_step: int | None = Field(None, description="The checkpoint step to resume from")
    divergence_step: int | None = Field(None, description="The step at which the divergence began")
    detected_at_step: int | None = Field(None, description="The step at which it was detected")
    suggested_lr: float | None = Field(None, description="Range test: the suggested lr")
    lr_at_min_loss: float | None = Field(None, description="Range test: the lr at the minimum")
    steepest_lr: float | None = Field(None, description="Range test: the lr of steepest descent")
    changes: dict[str, float] = Field(
        default_factory=dict,
        description="New parameter values by name; empty without a knob or without a proposal",
    )
    reasoning: list[str]
    evidence: list[EvidencePoint] = Field(default_factory=list)
    points_used: int = Field(description="Points in the history after resumed steps are replaced")


@dataclass(frozen=True)
class _Point:
    step: int
    loss: float  # NaN when not finite
    lr: float | None
    grad_norm: float | None


@skill("tune_lr", capability="read")
def tune_lr(ctx: SkillContext, inp: TuneLrInput) -> TuneLrResult:
    """Propose a learning-rate change from a training run's metric history (given points, or a
    job's recorded metrics): on divergence (NaN/inf loss, loss above k× its running minimum,
    grad-norm explosion) a lower lr and the checkpoint step to resume from, before the divergence
    began; on a plateau (no improvement for `patience` points) reduce-on-plateau or a warm restart;
    on an LR range test's curve a suggested lr (steepest descent of the smoothed loss, at most the
    lr at the minimum / 10). Deterministic, with the reasoning and the points it used. It only
    proposes: apply `changes` with resume_job (its `param_changes`)."""
    knob, current, checkpoints = inp.knob, inp.current_lr, inp.checkpoint_steps
    if inp.job_id is not None:
        raw, knob, job_lr, recorded = _from_store(ctx, inp.job_id, knob)
        current = current if current is not None else job_lr
        checkpoints = checkpoints if checkpoints is not None else recorded
    else:
        raw = [
            _Point(p.step, _float(p.loss), _positive(p.lr), _opt_float(p.grad_norm))
            for p in inp.points or []
        ]
    points = _lineage(raw)
    notes = []
    if len(points) < len(raw):
        notes.append(
            f"{len(raw) - len(points)} logged point(s) were replaced by a resumed run "
            "that went back to an earlier step"
        )
    given = current  # a range test's last lr is the top of the sweep, not the run's lr
    if current is None:
        current = next((p.lr for p in reversed(points) if p.lr is not None), None)
    out = _Outcome(current_lr=current, points_used=len(points), reasoning=notes)

    if not points:
        out.reasoning.append("the history has no points: nothing to decide")
        return out.result(knob)

    mode = inp.mode
    if mode == "auto":
        if _is_range_test(points):
            out.reasoning.append(
                "the learning rate rises geometrically from "
                f"{_g(points[0].lr)} to {_g(points[-1].lr)}: an LR range test"
            )
            mode = "range_test"
        else:
            _divergence(points, inp, current, checkpoints, out)
            if out.decision == "no_change":
                _plateau(points, inp, current, out)
            return out.result(knob)
    if mode == "range_test":
        out.current_lr = given
        _range_test(points, inp, out)
    elif mode == "divergence":
        _divergence(points, inp, current, checkpoints, out)
    else:
        _plateau(points, inp, current, out)
    return out.result(knob)


@dataclass
class _Outcome:
    current_lr: float | None
    points_used: int
    reasoning: list[str]
    decision: str = "no_change"
    analysis: str = "none"
    new_lr: float | None = None
    resume_from_step: int | None = None
    divergence_step: int | None = None
    detected_at_step: int | None = None
    suggested_lr: float | None = None
    lr_at_min_loss: float | None = None
    steepest_lr: float | None = None
    evidence: list[EvidencePoint] | None = None

    def result(self, knob: str | None) -> TuneLrResult:
        changes = (
            {knob: self.new_lr}
            if knob and self.new_lr is not None and self.decision != "no_change"
            else {}
        )
        if self.decision != "no_change" and self.new_lr is not None and not knob:
            self.reasoning.append(
                "no learning-rate knob was given, so `changes` is empty: "
                f"set the run's learning rate to {_g(self.new_lr)}"
            )
        return TuneLrResult(
            decision=self.decision,
            analysis=self.analysis,
            current_lr=self.current_lr,
            new_lr=self.new_lr,
            resume_from_step=self.resume_from_step,
            divergence_step=self.divergence_step,
            detected_at_step=self.detected_at_step,
            suggested_lr=self.suggested_lr,
            lr_at_min_loss=self.lr_at_min_loss,
            steepest_lr=self.steepest_lr,
            changes=changes,
            reasoning=self.reasoning,
            evidence=(self.evidence or [])[:MAX_EVIDENCE],
            points_used=self.points_used,
        )


# --- divergence ---------------------------------------------------------------------------------
def _divergence(
    points: list[_Point],
    inp: TuneLrInput,
    current: float | None,
    checkpoints: Sequence[int] | None,
    out: _Outcome,
) -> None:
    w = inp.window
    smooth: list[float] = []
    grads: list[float | None] = []
    best: int | None = None  # index of the smoothed loss's running minimum
    gbest: int | None = None  # same for the smoothed grad norm
    worst_ratio, worst_at = 0.0, 0
    for i, p in enumerate(points):
        lo = max(0, i - w + 1)
        reason = None
        if not math.isfinite(p.loss):
            reason = f"the loss is not finite ({_g(p.loss)}) at step {p.step}"
        elif p.grad_norm is not None and not math.isfinite(p.grad_norm):
            reason = f"the grad norm is not finite ({_g(p.grad_norm)}) at step {p.step}"
        finite = [q.loss for q in points[lo : i + 1] if math.isfinite(q.loss)]
        smooth.append(sum(finite) / len(finite) if finite else math.nan)
        gvals = [
            q.grad_norm
            for q in points[lo : i + 1]
            if q.grad_norm is not None and math.isfinite(q.grad_norm)
        ]
        grads.append(sum(gvals) / len(gvals) if gvals else None)
        if reason is None and best is not None and smooth[best] > 0:
            ratio = smooth[i] / smooth[best]
            if ratio > worst_ratio:
                worst_ratio, worst_at = ratio, i
            if ratio > inp.k:
                reason = (
                    f"the loss averaged over the last {i - lo + 1} points, {_g(smooth[i])} at "
                    f"step {p.step}, is {ratio:.3g}× its running minimum {_g(smooth[best])} "
                    f"(step {points[best].step}), above k = {inp.k:g}"
                )
        g = grads[i]
        if reason is None and g is not None and gbest is not None and (gmin := grads[gbest]):
            gratio = g / gmin
            if gratio > inp.grad_k:
                reason = (
                    f"the grad norm averaged over the last {len(gvals)} points, {_g(g)} at "
                    f"step {p.step}, is {gratio:.3g}× its running minimum "
                    f"{_g(gmin)} (step {points[gbest].step}), above grad_k = "
                    f"{inp.grad_k:g}"
                )
        if reason is not None:
            _diverged(points, inp, current, checkpoints, out, i, best, gbest, smooth, grads, reason)
            return
        if math.isfinite(smooth[i]) and (best is None or smooth[i] < smooth[best]):
            best = i
        if g is not None:
            prev = grads[gbest] if gbest is not None else None  # not None: set only with a g
            if prev is None or g < prev:
                gbest = i
    if best is not None and worst_ratio > 0:
        out.reasoning.append(
            f"no divergence: every loss is finite, and the loss averaged over {w} points rose at "
            f"most to {worst_ratio:.3g}× its running minimum (step {points[worst_at].step}; "
            f"divergence above k = {inp.k:g})"
        )
    else:
        out.reasoning.append(
            "no divergence: every loss is finite and none rose above its running minimum"
        )


def _diverged(
    points: list[_Point],
    inp: TuneLrInput,
    current: float | None,
    checkpoints: Sequence[int] | None,
    out: _Outcome,
    i: int,
    best: int | None,
    gbest: int | None,
    smooth: list[float],
    grads: list[float | None],
    reason: str,
) -> None:
    """Fill in the proposal for a divergence detected at index i."""
    lo = max(0, i - inp.window + 1)

    def bad(p: _Point) -> bool:
        if not math.isfinite(p.loss) or (
            p.grad_norm is not None and not math.isfinite(p.grad_norm)
        ):
            return True
        if best is not None and p.loss > inp.k * smooth[best]:
            return True
        limit = grads[gbest] if gbest is not None else None
        return bool(limit and p.grad_norm is not None and p.grad_norm > inp.grad_k * limit)

    onset = next((j for j in range(lo, i + 1) if bad(points[j])), i)
    began = points[onset].step
    out.analysis, out.decision = "divergence", "lower_lr_and_resume"
    out.divergence_step, out.detected_at_step = began, points[i].step
    out.reasoning.append(f"divergence: {reason}")
    if onset < i:
        out.reasoning.append(
            f"it began at step {began}, the first point of that window above the limit"
        )

    healthy_lr = points[best].lr if best is not None else None
    if current is not None:
        proposed = current * inp.factor
        why = f"{_g(current)} × factor {inp.factor:g}"
        if best is not None and healthy_lr is not None and healthy_lr < proposed:
            proposed = healthy_lr
            why = (
                f"the lr in effect at the loss's running minimum (step {points[best].step}), "
                f"{_g(healthy_lr)}, which is below {_g(current)} × factor {inp.factor:g}"
            )
            out.reasoning.append(
                f"the learning rate was {_g(healthy_lr)} while the loss was at "
                f"its minimum and {_g(current)} when it diverged"
            )
        if proposed < inp.min_lr:
            proposed = inp.min_lr
            why += f", raised to min_lr {_g(inp.min_lr)}"
            if current <= inp.min_lr:
                out.reasoning.append(
                    "the learning rate is already at min_lr: a divergence at the "
                    "floor points to the data or the code more than to the lr"
                )
        out.new_lr = _round(proposed)
        out.reasoning.append(f"new learning rate {_g(out.new_lr)}: {why}")
    else:
        out.reasoning.append(
            f"no current learning rate is known (give current_lr or log lr): "
            f"lower it by factor {inp.factor:g}"
        )

    if onset <= inp.window and points[0].step <= 1:
        out.reasoning.append(
            f"it diverged within the first {onset + 1} steps of training: the "
            "learning rate is far too high for this run; an LR range test would "
            "find a sensible one"
        )
    usable = sorted(c for c in checkpoints or [] if 0 <= c and c + 1 < began)
    if usable:
        out.resume_from_step = usable[-1]
        later = sorted(c for c in checkpoints or [] if c + 1 >= began)
        out.reasoning.append(
            f"resume from the checkpoint of step {usable[-1]}, the newest whose weights were "
            f"measured before the divergence began (by the loss of step {usable[-1] + 1})"
            + (
                f"; the checkpoint{'s' if len(later) > 1 else ''} of step"
                f"{'s' if len(later) > 1 else ''} {_steps(later)} hold"
                f"{'' if len(later) > 1 else 's'} diverging weights"
                if later
                else ""
            )
        )
    elif checkpoints is None and began >= 3:
        out.reasoning.append(
            f"no checkpoint steps were given: resume from the newest checkpoint "
            f"at step {began - 2} or earlier (the loss of step c + 1 measures the "
            f"checkpoint of step c, and step {began} was already bad)"
        )
    elif began >= 3:
        out.reasoning.append(
            f"no checkpoint was written at step {began - 2} or earlier: start "
            "again from the beginning"
        )
    else:
        out.reasoning.append(
            f"no checkpoint can precede a divergence that began at step {began}: "
            "start again from the beginning"
        )

    ev: list[EvidencePoint] = []
    if best is not None:
        ev.append(
            _ev(
                points[best],
                smooth[best],
                "running minimum of the smoothed loss"
                + ("; the last point before the divergence" if best == onset - 1 else ""),
            )
        )
    if gbest is not None and gbest != best and "grad norm" in reason:
        ev.append(
            _ev(
                points[gbest],
                smooth[gbest],
                f"running minimum of the smoothed grad norm ({_g(grads[gbest])})",
            )
        )
    if onset > 0 and best != onset - 1:
        ev.append(_ev(points[onset - 1], smooth[onset - 1], "last point before the divergence"))
    ev.append(_ev(points[onset], smooth[onset], "divergence began"))
    if i != onset:
        ev.append(_ev(points[i], smooth[i], "divergence detected"))
    out.evidence = ev


# --- plateau ------------------------------------------------------------------------------------
def _plateau(points: list[_Point], inp: TuneLrInput, current: float | None, out: _Outcome) -> None:
    start = _last_lr_jump(points)
    seg = [p for p in points[start:] if math.isfinite(p.loss)]
    skipped = len(points) - start - len(seg)
    w, need = inp.window, inp.window + inp.patience
    if start > 0:
        out.reasoning.append(
            f"the plateau count starts at step {points[start].step}, where the "
            f"learning rate jumped from {_g(points[start - 1].lr)} to "
            f"{_g(points[start].lr)}"
        )
    if skipped:
        out.reasoning.append(f"{skipped} non-finite loss(es) are left out of the plateau check")
    if len(seg) < need:
        out.reasoning.append(
            f"too few points to judge a plateau: {len(seg)}, and a plateau needs "
            f"window + patience = {need}"
        )
        return
    smooth = [sum(p.loss for p in seg[j - w + 1 : j + 1]) / w for j in range(w - 1, len(seg))]
    best = 0
    for j in range(1, len(smooth)):
        if inp.min_delta_mode == "rel":
            better = smooth[j] < smooth[best] * (1 - inp.min_delta)
        else:
            better = smooth[j] < smooth[best] - inp.min_delta
        if better:
            best = j
    since = len(smooth) - 1 - best
    best_pt, last_pt = seg[best + w - 1], seg[-1]
    delta = (
        f"{inp.min_delta:g} of its value" if inp.min_delta_mode == "rel" else f"{inp.min_delta:g}"
    )
    summary = (
        f"the loss averaged over {w} points last improved by more than {delta} at step "
        f"{best_pt.step} ({_g(smooth[best])}); {since} point(s) since, to step "
        f"{last_pt.step} ({_g(smooth[-1])})"
    )
    evidence = [
        _ev(best_pt, smooth[best], "best smoothed loss"),
        _ev(last_pt, smooth[-1], "latest point"),
    ]
    if since < inp.patience:
        out.reasoning.append(f"no plateau: {summary}; patience is {inp.patience}")
        if out.evidence is None:
            out.evidence = evidence
        return
    out.analysis, out.evidence = "plateau", evidence
    out.reasoning.append(f"plateau: {summary}, at least patience = {inp.patience}")
    if inp.plateau_action == "warm_restart":
        peak = max((p.lr for p in points if p.lr is not None), default=None)
        target = inp.restart_lr or peak
        source = "restart_lr" if inp.restart_lr else "the highest learning rate in the history"
        if target is None or (current is not None and target <= current):
            out.reasoning.append(
                "warm restart: no learning rate above the current one to restart "
                "at (give restart_lr); no change proposed"
            )
            return
        out.decision, out.new_lr = "warm_restart", _round(target)
        out.reasoning.append(
            f"warm restart: back to {_g(out.new_lr)} ({source}) and anneal again "
            "from the current weights"
        )
        return
    if current is None:
        out.decision = "reduce_lr"
        out.reasoning.append(
            f"reduce the learning rate by factor {inp.plateau_factor:g} (no "
            "current learning rate is known: give current_lr or log lr)"
        )
        return
    if current <= inp.min_lr:
        out.reasoning.append(
            f"the learning rate {_g(current)} is already at min_lr "
            f"{_g(inp.min_lr)}: no change proposed"
        )
        return
    new = max(current * inp.plateau_factor, inp.min_lr)
    out.decision, out.new_lr = "reduce_lr", _round(new)
    out.reasoning.append(
        f"reduce on plateau: {_g(current)} × {inp.plateau_factor:g} → "
        f"{_g(out.new_lr)}"
        + (" (min_lr)" if new == inp.min_lr else "")
        + ", continuing from the current weights"
    )


def _last_lr_jump(points: list[_Point]) -> int:
    """Index of the last point whose lr differs from the point before by more than LR_JUMP×."""
    for j in range(len(points) - 1, 0, -1):
        a, b = points[j - 1].lr, points[j].lr
        if a and b and max(a / b, b / a) > LR_JUMP:
            return j
    return 0


# --- range test ---------------------------------------------------------------------------------
def _is_range_test(points: list[_Point]) -> bool:
    """A geometric sweep: every point has an lr, each one the previous times a near-constant ratio
    above 1, covering at least RANGE_TEST_MIN_RISE×."""
    lrs = [p.lr for p in points if p.lr is not None]
    if len(points) < RANGE_TEST_MIN_POINTS or len(lrs) < len(points):
        return False
    logs = [math.log(b / a) for a, b in pairwise(lrs)]
    if min(logs) <= 0:
        return False
    return max(logs) <= 2 * min(logs) and lrs[-1] / lrs[0] >= RANGE_TEST_MIN_RISE


def _range_test(points: list[_Point], inp: TuneLrInput, out: _Outcome) -> None:
    curve = [p for p in points if p.lr is not None]
    curve_lrs = [p.lr for p in curve if p.lr is not None]  # the same points' learning rates
    if len(curve) < RANGE_TEST_MIN_POINTS:
        out.reasoning.append(
            f"range test: {len(curve)} point(s) carry a learning rate; at least "
            f"{RANGE_TEST_MIN_POINTS} are needed"
        )
        return
    if any(b <= a for a, b in pairwise(curve_lrs)):
        out.reasoning.append(
            "range test: the learning rate does not rise from point to point, so "
            "this is not an LR range test's curve: no suggestion"
        )
        return
    beta, avg, smooth, lowest = inp.smoothing_beta, 0.0, [], math.inf
    stop_note = f"the curve runs to its last point (step {curve[-1].step})"
    for n, p in enumerate(curve, start=1):
        if not math.isfinite(p.loss):
            stop_note = f"the curve ends before step {p.step}, where the loss is not finite"
            break
        avg = beta * avg + (1 - beta) * p.loss
        s = avg / (1 - beta**n)
        if s > inp.stop_factor * lowest:
            stop_note = (
                f"the curve ends before step {p.step} (lr {_g(p.lr)}), where the "
                f"smoothed loss {_g(s)} exceeds {inp.stop_factor:g}× its minimum "
                f"{_g(lowest)}"
            )
            break
        smooth.append(s)
        lowest = min(lowest, s)
    kept = curve[: len(smooth)]
    skip_start, skip_end = len(kept) // 10, 5
    lrs, losses = curve_lrs[: len(kept)][skip_start:-skip_end], smooth[skip_start:-skip_end]
    out.analysis = "range_test"
    out.reasoning.append(
        f"range test: {len(curve)} points, lr {_g(curve[0].lr)} to "
        f"{_g(curve[-1].lr)}; the loss smoothed by an exponentially weighted "
        f"average (beta {beta:g}) with bias correction; {stop_note}"
    )
    if len(lrs) < 3:
        out.reasoning.append(
            f"after setting aside the first {skip_start} and the last {skip_end} "
            f"of {len(kept)} points, too few are left to read a slope: no "
            "suggestion (sweep more steps, or from a lower start)"
        )
        return
    i_min = min(range(len(losses)), key=losses.__getitem__)
    slopes = [
        (losses[j + 1] - losses[j]) / math.log(lrs[j + 1] / lrs[j]) for j in range(len(lrs) - 1)
    ]
    i_steep = min(range(len(slopes)), key=slopes.__getitem__)
    lr_min, lr_steep = lrs[i_min], lrs[i_steep]
    bound = lr_min / 10
    out.lr_at_min_loss, out.steepest_lr = _round(lr_min), _round(lr_steep)
    out.reasoning.append(
        f"points {skip_start + 1}–{skip_start + len(lrs)} are read (the first "
        f"tenth and the last {skip_end} are set aside)"
    )
    out.reasoning.append(
        f"the smoothed loss is lowest, {_g(losses[i_min])}, at lr {_g(lr_min)} "
        f"(step {kept[skip_start + i_min].step}); the bound is a tenth of that, "
        f"{_g(bound)}"
    )
    if slopes[i_steep] >= 0:
        suggestion = bound
        out.reasoning.append(
            f"the smoothed loss never falls as the lr grows: the suggestion is "
            f"the bound, {_g(bound)}"
        )
    else:
        out.reasoning.append(
            f"the smoothed loss falls fastest, {slopes[i_steep]:.3g} per unit of "
            f"log(lr), at lr {_g(lr_steep)} (step "
            f"{kept[skip_start + i_steep].step})"
        )
        suggestion = min(lr_steep, bound)
        out.reasoning.append(
            f"suggested learning rate {_g(suggestion)}: "
            + (
                "the steepest descent, below the bound"
                if suggestion == lr_steep
                else "the bound, since the steepest descent lies above it"
            )
        )
    out.decision = "suggest_lr"
    out.suggested_lr = out.new_lr = _round(suggestion)
    if suggestion < inp.min_lr:
        out.suggested_lr = out.new_lr = _round(inp.min_lr)
        out.reasoning.append(f"raised to min_lr {_g(inp.min_lr)}")
    out.evidence = [
        _ev(kept[skip_start + i_steep], losses[i_steep], "steepest descent"),
        _ev(kept[skip_start + i_min], losses[i_min], "minimum of the smoothed loss"),
    ]
    if len(kept) < len(curve):
        out.evidence.append(_ev(curve[len(kept)], None, "the curve stops here"))


# --- history ------------------------------------------------------------------------------------
# A metrics line is about 75 bytes a step: 64 MiB is some 800,000 steps.
MAX_METRICS_BYTES = 64 << 20


def read_metrics_jsonl(
    path: str | Path, loss_name: str = "loss", argument: str = "metrics file"
) -> tuple[list[dict], int]:
    """Points from a metrics JSONL file as examples/train_numpy.py writes it (one object per step
    with `step`, the loss, and `lr` / `grad_norm` when logged), in file order, and the number of
    lines skipped (torn, not JSON, or without a step and a loss). Event records (`"event": ...`,
    e.g. the final summary) are not steps. Lines are parsed as JSON data, nothing else. A
    non-finite loss becomes None, the store's convention. BadArguments, naming `argument`, for a
    path that is not a regular file (a FIFO would block, a device never end), cannot be read or
    is over MAX_METRICS_BYTES."""
    raw = read_limited(
        path,
        argument,
        MAX_METRICS_BYTES,
        "keep the steps that matter (e.g. `tail -n 500000 FILE > part.jsonl`) and give that",
    )
    points, skipped = [], 0
    # Lines as a text file reads them (universal newlines), never split at U+2028 and its kin.
    for line in io.StringIO(raw.decode("utf-8", errors="replace"), newline=None):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(rec, dict) or "event" in rec:
            continue
        step, loss = rec.get("step"), rec.get(loss_name, _MISSING)
        if (
            not isinstance(step, int)
            or isinstance(step, bool)
            or step < 0
            or not (loss is None or _is_number(loss))
        ):
            skipped += 1
            continue
        point: dict = {
            "step": step,
            "loss": float(loss) if _is_number(loss) and math.isfinite(loss) else None,
        }
        for key in ("lr", "grad_norm"):
            if _is_number(rec.get(key)):
                point[key] = float(rec[key])
        points.append(point)
    return points, skipped


_MISSING = object()


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _lineage(points: list[_Point]) -> list[_Point]:
    """The points in logged order; a step that goes back replaces the points from that step on."""
    out: list[_Point] = []
    for p in points:
        while out and out[-1].step >= p.step:
            out.pop()
        out.append(p)
    return out


def _from_store(
    ctx: SkillContext, job_id: int, knob: str | None
) -> tuple[list[_Point], str | None, float | None, list[int] | None]:
    """The job's recorded points (attempt by attempt), its lr knob, current lr and checkpoints."""
    job = ctx.store.job(job_id)
    if job is None:
        raise SkillFailed(f"no job {job_id}; `nightshift status` lists jobs")
    spec = job.spec or {}
    loss_name = (spec.get("metrics") or {}).get("name") or "loss"
    knob = knob or (spec.get("knobs") or {}).get("learning_rate")
    value = job.params.get(knob) if knob else None
    job_lr = (
        float(value)
        if isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
        else None
    )
    rows: dict[tuple[int, int], dict[str, float | None]] = {}
    for m in ctx.store.metrics(job_id):
        if m.name in (loss_name, "lr", "grad_norm"):
            rows.setdefault((m.attempt_id, m.step), {})[m.name] = m.value
    points = [
        _Point(
            step,
            _float(vals[loss_name]),
            _positive(vals.get("lr")),
            _opt_float(vals.get("grad_norm")),
        )
        for (_, step), vals in rows.items()
        if loss_name in vals
    ]
    with ctx.store.session() as s:
        recs = list(
            s.exec(
                select(CheckpointRecord).where(
                    CheckpointRecord.job_id == job_id, col(CheckpointRecord.valid).is_(True)
                )
            )
        )
    return points, knob, job_lr, (sorted({r.step for r in recs}) if recs else None)


# --- small helpers ------------------------------------------------------------------------------
def _float(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _positive(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) and v > 0 else None


def _opt_float(v: float | None) -> float | None:
    return None if v is None else float(v)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _g(x: float | None) -> str:
    if x is None:
        return "unknown"
    return f"{x:.4g}"


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps[:5]) + (", …" if len(steps) > 5 else "")


def _ev(p: _Point, smoothed: float | None, note: str) -> EvidencePoint:
    def fin(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    return EvidencePoint(
        step=p.step,
        loss=fin(p.loss),
        smoothed=fin(smoothed),
        lr=p.lr,
        grad_norm=fin(p.grad_norm),
        note=note,
    )
