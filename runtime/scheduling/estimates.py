"""How long a queued job will run, learned from the store's history.

The ordering (`srpt`) and the tariff holds both lean on a job's expected duration, and people's
own estimates are poor: Tiresias and 3Sigma found the same job's past runs, and a person's past
errors, far better guides. So, in this order:

1. the owner's earlier runs of the same job (same name, same parameters): their median;
2. the owner's own estimate (`expected_duration_min`), scaled by how their estimates turned out
   (the median of took ÷ asked over their finished jobs that gave one, once there are
   MIN_RATIOS of them); as written where there are fewer (its worst case then from everyone's
   took ÷ asked, where that runs over the estimate);
3. the owner's earlier runs of that name with other parameters, then anyone's: their median;
4. nothing (the snapshot's default applies).

Each estimate also has an `upper_s`, what the same history says the run may take at worst (its
UPPER_QUANTILE), for what must not be late; and a `source` that says which rule gave it. Pure
functions of the records given: no clock, no store.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_RATIOS = 3  # a person's estimates are corrected once this many of them can be checked
UPPER_QUANTILE = 0.9


@dataclass(frozen=True)
class PastRun:
    """A finished job: whose, what, what its owner expected (None: nothing) and what it took
    (seconds of all its attempts)."""

    owner: str
    name: str
    params: str  # params_key() of its parameters
    asked_s: float | None
    took_s: float


@dataclass(frozen=True)
class Estimate:
    expected_s: float
    upper_s: float
    source: str


def params_key(params: dict[str, Any] | None) -> str:
    """One text per set of parameters (key order does not matter)."""
    return json.dumps(params or {}, sort_keys=True, default=str)


def _upper(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return max(cuts[round(UPPER_QUANTILE * 10) - 1], statistics.median(values))


def upper_ratio(ratios: Sequence[float]) -> float | None:
    """What took ÷ asked may come to at worst by these past ratios (their UPPER_QUANTILE), once
    there are MIN_RATIOS of them; None before: a hold's margin comes from how such estimates
    turned out, not from the estimate alone."""
    return _upper(ratios) if len(ratios) >= MIN_RATIOS else None


class Estimator:
    """Expected durations from a store's finished jobs (see the module's docstring)."""

    def __init__(self, runs: Iterable[PastRun]):
        self._exact: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        self._owner_name: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._name: dict[str, list[float]] = defaultdict(list)
        self._ratios: dict[str, list[float]] = defaultdict(list)
        everyone: list[float] = []  # every owner's took ÷ asked
        for r in runs:
            if r.took_s <= 0:
                continue
            self._exact[(r.owner, r.name, r.params)].append(r.took_s)
            self._owner_name[(r.owner, r.name)].append(r.took_s)
            self._name[r.name].append(r.took_s)
            if r.asked_s:
                self._ratios[r.owner].append(r.took_s / r.asked_s)
                everyone.append(r.took_s / r.asked_s)
        # computed once: a snapshot asks for every queued job, most of them by few owners
        self._everyone = (len(everyone), upper_ratio(everyone))
        self._scale: dict[str, tuple[float, float] | None] = {}

    def _owner_scale(self, owner: str) -> tuple[float, float] | None:
        """The median and the worst of the owner's took ÷ asked, once they have MIN_RATIOS."""
        if owner not in self._scale:
            ratios = self._ratios.get(owner, [])
            worst = upper_ratio(ratios)
            self._scale[owner] = None if worst is None else (statistics.median(ratios), worst)
        return self._scale[owner]

    def estimate(
        self, owner: str, name: str, params: str, asked_s: float | None
    ) -> Estimate | None:
        exact = self._exact.get((owner, name, params))
        if exact:
            return Estimate(statistics.median(exact), _upper(exact), "this job's earlier runs")
        if asked_s:
            scale = self._owner_scale(owner)
            if scale is not None:
                return Estimate(
                    asked_s * scale[0],
                    asked_s * scale[1],
                    f"the owner's estimate × how their estimates turned out "
                    f"({len(self._ratios[owner])} jobs)",
                )
            # too few of their own: expected as asked, but what must not be late leaves room for
            # how everyone's estimates turned out (a newcomer's holds keep a margin too)
            n, everyone = self._everyone
            if everyone is not None and everyone > 1.0:
                return Estimate(
                    asked_s,
                    asked_s * everyone,
                    f"the owner's estimate; its worst case from everyone's ({n} jobs)",
                )
            return Estimate(asked_s, asked_s, "the owner's estimate")
        for took, source in (
            (self._owner_name.get((owner, name)), "the owner's runs of this name"),
            (self._name.get(name), "runs of this name"),
        ):
            if took:
                return Estimate(statistics.median(took), _upper(took), source)
        return None
