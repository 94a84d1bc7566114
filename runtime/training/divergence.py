"""Divergence while a run runs: the first metric point that says the weights have gone bad.

The loop calls this after every read of new metric points, so a diverged run is stopped before it
writes more checkpoints over good ones. The rules are tune_lr's (which explains a divergence after
the fact, with a proposal): a non-finite value of the watched metric or of a metric in
`DivergenceSpec.also` (grad norm) diverges at once; for a metric that is minimised, the mean of the
last `window` points above `k` x its running minimum diverges at the first point of that window
above the limit. Pure: points in, a verdict out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nightshift.runtime.spec import MetricSpec


@dataclass(frozen=True, slots=True)
class Divergence:
    step: int  # the first bad step
    name: str
    value: float
    why: str


def first_divergence(
    spec: MetricSpec, points: Sequence[tuple[int, str, float]]
) -> Divergence | None:
    """The first divergence in this attempt's points (step, name, value), in the order logged:
    whichever comes first, a non-finite value or the onset of an explosion before it."""
    return scan(spec, points, None)[0]


def scan(
    spec: MetricSpec, points: Sequence[tuple[int, str, float]], state: dict[str, Any] | None
) -> tuple[Divergence | None, dict[str, Any]]:
    """first_divergence over points that arrive a few at a time: `state` (JSON, None at the start
    of an attempt) carries the running minimum and the last window between calls, so each tick
    costs the new points only, however long the run."""
    rule = spec.divergence
    state = {"best": None, "recent": [], **(state or {})}
    if not rule.enabled:
        return None, state
    watched = {spec.name, *rule.also}
    best: float | None = state["best"]
    recent: list[list[float]] = [list(r) for r in state["recent"]]
    found: Divergence | None = None
    for step, name, value in points:
        if name in watched and not math.isfinite(value):
            found = Divergence(step, name, value, f"{name} is {value} at step {step} (not finite)")
            break
        if name != spec.name or spec.mode != "min":
            continue
        recent = [*recent, [step, value]][-rule.window :]
        smooth = sum(v for _, v in recent) / len(recent)
        if best is not None and best > 0 and smooth > rule.k * best:
            onset, first = next(
                ((int(s), v) for s, v in recent if v > rule.k * best), (step, value)
            )
            found = Divergence(
                onset,
                spec.name,
                first,
                f"{spec.name} averaged over the last {len(recent)} points is "
                f"{smooth:.4g} at step {step}, {smooth / best:.3g}x its running "
                f"minimum {best:.4g} (k = {rule.k:g}); first above the limit at "
                f"step {onset} ({first:.4g})",
            )
            break
        # the running minimum counts full windows only: the first few points of a run (or of a
        # resumed attempt) are single noisy batches, and their minimum is no baseline
        if len(recent) == rule.window and (best is None or smooth < best):
            best = smooth
    return found, {"best": best, "recent": recent}
