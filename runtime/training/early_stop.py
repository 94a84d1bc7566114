"""Early stopping as pure functions over metric histories: patience/min_delta on the run's own
metric, and the median rule against sibling trials of the same sweep."""

from __future__ import annotations

from statistics import median
from typing import Literal

Mode = Literal["min", "max"]


def _better(a: float, b: float, mode: Mode, min_delta: float) -> bool:
    return a < b - min_delta if mode == "min" else a > b + min_delta


def patience_exhausted(
    values: list[float | None], *, mode: Mode, patience: int, min_delta: float = 0.0
) -> str | None:
    """Why to stop when the last `patience` evaluations brought no improvement greater than
    `min_delta` over the best before them; None while the run is still improving. NaN/None values
    count as no improvement (divergence is tune_lr's business, not this rule's)."""
    if len(values) <= patience:
        return None
    before, recent = values[:-patience], values[-patience:]
    finite_before = [v for v in before if v is not None]
    if not finite_before:
        return None
    best = min(finite_before) if mode == "min" else max(finite_before)
    if any(v is not None and _better(v, best, mode, min_delta) for v in recent):
        return None
    return (
        f"no improvement of the metric by more than {min_delta:g} in the last {patience} "
        f"evaluations (best {best:.6g} before them)"
    )


def median_rule(
    own_best: float, sibling_bests: list[float], *, mode: Mode, min_siblings: int = 3
) -> str | None:
    """Stop a trial whose best so far is worse than the median of its siblings' bests at the same
    step (the median stopping rule of Google Vizier); needs `min_siblings` to compare against."""
    if len(sibling_bests) < min_siblings:
        return None
    m = median(sibling_bests)
    worse = own_best > m if mode == "min" else own_best < m
    if not worse:
        return None
    return (
        f"best {own_best:.6g} is worse than the median {m:.6g} of {len(sibling_bests)} "
        "sibling trials at the same step"
    )
