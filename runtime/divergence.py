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

from nightshift.runtime.spec import MetricSpec


@dataclass(frozen=True, slots=True)
class Divergence:
    step: int  # the first bad step
    name: str
    value: float
    why: str


def first_divergence(spec: MetricSpec, points: Sequence[tuple[int, str, float]]) -> Divergence | None:
    """The first divergence in this attempt's points (step, name, value), in the order logged:
    whichever comes first, a non-finite value or the onset of an explosion before it."""
    rule = spec.divergence
    if not rule.enabled:
        return None
    watched = {spec.name, *rule.also}
    cut = next((i for i, (_, name, value) in enumerate(points)
                if name in watched and not math.isfinite(value)), None)
    finite = points if cut is None else points[:cut]
    explosion = _explosion(spec, finite) if spec.mode == "min" else None
    if explosion is not None or cut is None:
        return explosion
    step, name, value = points[cut]
    return Divergence(step, name, value, f"{name} is {value} at step {step} (not finite)")


def _explosion(spec: MetricSpec, points: Sequence[tuple[int, str, float]]) -> Divergence | None:
    rule = spec.divergence
    series = [(step, value) for step, name, value in points if name == spec.name]
    best: float | None = None
    for i in range(len(series)):
        recent = series[max(0, i - rule.window + 1): i + 1]
        smooth = sum(v for _, v in recent) / len(recent)
        if best is not None and best > 0 and smooth > rule.k * best:
            onset, value = next(((s, v) for s, v in recent if v > rule.k * best), series[i])
            return Divergence(onset, spec.name, value,
                              f"{spec.name} averaged over the last {len(recent)} points is "
                              f"{smooth:.4g} at step {series[i][0]}, {smooth / best:.3g}x its "
                              f"running minimum {best:.4g} (k = {rule.k:g}); first above the "
                              f"limit at step {onset} ({value:.4g})")
        if best is None or smooth < best:
            best = smooth
    return None
