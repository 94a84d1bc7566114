"""The default stall rule, for a spec without `stall_min`: a run is judged against its own pace.

A hung run (a deadlocked collective, a dead data loader) would otherwise hold its GPUs or CPU slot
until `timeout_min`, or forever without one. The rule learns the run's step interval from when its
metric reports arrived (the monitor's ticks, on the monotonic clock) and calls it stalled once it
has shown no progress for `multiple` times the median interval, and never before `floor_min`: a
slow evaluation or checkpoint is not a hang. A run that has reported fewer than `min_reports` times
has no pace to judge, and is left alone. Pure: the same pace and quiet time give the same answer.
"""

from __future__ import annotations

import statistics

from nightshift.runtime.config import StallSettings

# Report times kept per attempt (seconds since its start): the median of their intervals is its
# recent pace, so a run that slows down for good is judged by its new pace.
PACE_KEPT = 9


def noted(pace: list[float], ran_s: float) -> list[float]:
    """`pace` with a report seen `ran_s` seconds into the attempt, the oldest dropped."""
    return [*pace, round(ran_s, 3)][-PACE_KEPT:]


def stalled(pace: list[float], quiet_s: float, rule: StallSettings) -> str | None:
    """Why a run with these report times (seconds since its start, oldest first), quiet for
    `quiet_s` seconds, is stalled; None while it is not (or has no pace to judge yet)."""
    if len(pace) < rule.min_reports:
        return None
    gaps = [b - a for a, b in zip(pace, pace[1:], strict=False)]
    step_s = statistics.median(gaps)
    limit_s = max(rule.floor_min * 60.0, rule.multiple * step_s)
    if quiet_s <= limit_s:
        return None
    return (
        f"no progress for {quiet_s:.0f} s: over {rule.multiple:g}× its own step interval "
        f"({step_s:.1f} s, the median of its last {len(gaps)} interval(s)) and the "
        f"{rule.floor_min:g}-minute "
        f"floor, so {limit_s:.0f} s (default stall rule, settings stall.multiple and "
        "stall.floor_min; no stall_min in the spec)"
    )
