"""Hand-made simulator setups for tests: a few jobs on hosts of given sizes, estimates equal to
the truth, no health events."""

from __future__ import annotations

from datetime import datetime

from nightshift.evals import simulate as S


def hand_setup(jobs: list[tuple], hosts: list[int]) -> S.Setup:
    """Per job (submit s, run time s, GPUs[, cost-sensitive, deadline s]), ids from 1; without
    the last two: not cost-sensitive, the deadline far away. Day one starts at midnight
    2024-01-01 (a Monday: the simulation tariff's peak is 17:00-21:00)."""
    sims = []
    for i, (sub, dur, g, *rest) in enumerate(jobs, 1):
        cs, deadline = rest if rest else (False, sub + 100 * dur)
        sims.append(S.SimJob(i, sub, dur, g, 1.0, 0, False, 1.0, cs, deadline))
    end = max(j[0] for j in jobs) + 1.0
    counts = {"gangs": 0, "censored": 0}
    return S.Setup(
        "hand",
        datetime(2024, 1, 1),
        (0.0, end),
        0.8,
        sims,
        hosts,
        counts,
        S.Options(health_fraction=0.0),
    )
