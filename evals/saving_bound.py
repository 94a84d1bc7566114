"""How much of the tariff's saving any schedule could keep while it also met issue 31's delay
goals: a bound, computed from the jobs alone, that no scheduler can beat.

The goals table asks a tariff policy for three things on each window at once: a mean queueing
delay ≤ 0.9 × the strongest baseline's, a longest wait ≤ EASY's, and a saving share ≥ 0.9 of
the deadline-feasible floor's. Moving work into cheap hours costs waiting, so the first two cap
the third. This module computes that cap. Where it is below 0.9, no scheduler, however clever,
meets all three goals on that window: at least one verdict must fail.

The bound drops every constraint but the delays: no capacity limit (every job may run whenever
it likes), and each job's run may be cut into any pieces. A job with queueing delay w (the
simulator's: finished − submitted − time spent running) has at most w seconds of its span not
running. Its span therefore starts at its submission, and it has done all its work by
submission + w + duration ÷ σ, where σ is the slowest speed a power limit the policy uses runs
at (1 without a cap). Inside that stretch, each second of work costs at least the price of a
second times the least energy per unit of work (`e_min`: the full limit's watts, or the cap's
watts ÷ its speed, whichever is lower). So the job costs at least `e_min` × the cheapest
`duration` seconds of price in [submit, submit + w + duration ÷ σ]: `c_j(w)`, which falls as w
grows. Redone work (a pause's lost progress) only adds running time and energy: the argument
holds with it.

- **Longest wait ≤ W**: every job's cost is at least c_j(W). The floor is Σ c_j(W).
- **Mean delay ≤ M** (a total budget B = jobs × M): the least Σ c_j(w_j) with Σ w_j ≤ B is
  bounded below by Lagrangian duality: for every λ ≥ 0, Σ_j min_w (c_j(w) + λ w) − λ B. The
  minimum over w is taken on a grid with a rule that keeps it a lower bound: on (w_k, w_k+1],
  c_j(w) ≥ c_j(w_k+1) and λ w ≥ λ w_k. The best λ of a log-spaced set is kept; any λ gives a
  valid bound.
- **Both**: the same, with the grid ending at W.

The saving share's ceiling is then (FIFO's cost − the floor) ÷ (FIFO's cost − the
deadline-feasible floor), with FIFO's cost and the deadline-feasible floor exactly as
`simulate.add_shares` uses them.

    python -m nightshift.evals.scheduler_table --seeds 0,1,2 --jobs 2 --out DIR   # the runs
    python -m nightshift.evals.saving_bound --from DIR/scheduler_table.csv     # every ceiling
    nightshift eval saving-bound --from DIR/scheduler_table.csv               # the same

The goals table itself prints the ceiling under both delay goals beside each saving verdict.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np

from nightshift.evals import scheduler_table as T
from nightshift.evals import simulate as S
from nightshift.evals.output import write_csv
from nightshift.runtime.scheduling.power_model import power_model

HOUR = 3600.0
STEP_S = 600.0  # the grid of waits for the mean budget: looser with a coarser grid, never wrong
HORIZON_S = 72 * HOUR  # beyond it a job is priced at the valley price (what waiting for ever buys)
CHUNK = 2048  # jobs at a time: the grid of waits is jobs × points


@dataclass(frozen=True)
class Power:
    """What a policy's power limits allow: the least energy per second of full-speed work, in
    watts, and the slowest speed (1: no cap)."""

    e_min_w: float
    slowest: float


def policy_power(policy: str, opts: S.Options) -> Power:
    """`policy`'s limits as the simulator runs them: the default limit, and the peak cap if it
    has one (`Policy.cap_at_peak_w`), speeds relative to the default limit."""
    model = power_model(opts.gpu_type)
    full_w = model.busy_watts(model.default_w)
    cap = S.POLICIES[policy].cap_at_peak_w
    if cap is None:
        return Power(full_w, 1.0)
    r = model.at(cap)
    rate = r.throughput / model.throughput_factor(model.default_w)
    return Power(min(full_w, r.watts / rate), min(1.0, rate))


class Prices:
    """The simulation tariff over a stretch of trace seconds, as cumulative seconds spent at
    each price: `seconds(level, t)` is exact (piecewise linear between the tariff's pieces)."""

    def __init__(self, setup: S.Setup, lo: float, hi: float):
        starts, prices = S._price_table(setup.origin, lo, hi)
        bounds = np.array([*starts, max(hi, starts[-1]) + S.DAY], dtype=np.float64)
        price = np.array(prices, dtype=np.float64)
        self.levels = sorted(set(prices))
        self.bounds = bounds
        self.cum = []
        for level in self.levels:
            span = np.where(price == level, np.diff(bounds), 0.0)
            self.cum.append(np.concatenate([[0.0], np.cumsum(span)]))

    def seconds(self, level: int, t: np.ndarray) -> np.ndarray:
        return np.interp(t, self.bounds, self.cum[level])


def cheapest(prices: Prices, start: np.ndarray, end: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Σ price × seconds of the cheapest `need` seconds inside [start, end] (broadcast arrays;
    € per kW when multiplied by kW / 3600 s)."""
    left = np.broadcast_to(need, np.broadcast_shapes(start.shape, end.shape, need.shape)).copy()
    paid = np.zeros_like(left)
    for k, level in enumerate(prices.levels):
        have = prices.seconds(k, end) - prices.seconds(k, start)
        take = np.minimum(left, np.maximum(have, 0.0))
        paid += level * take
        left -= take
    return paid


@dataclass(frozen=True)
class Jobs:
    """The window's jobs as arrays: submission, run time at full speed, and kW at e_min."""

    submit: np.ndarray
    duration: np.ndarray
    kw: np.ndarray

    @classmethod
    def of(cls, setup: S.Setup, power: Power) -> Jobs:
        js = setup.jobs
        return cls(
            np.array([j.submit_s for j in js], dtype=np.float64),
            np.array([j.duration_s for j in js], dtype=np.float64),
            np.array([j.gpus * j.share for j in js], dtype=np.float64) * power.e_min_w / 1000.0,
        )


def cost_floor(
    setup: S.Setup,
    policy: str,
    *,
    max_wait_s: float | None = None,
    mean_wait_s: float | None = None,
) -> float:
    """The least energy cost (€) any schedule of `setup`'s jobs under `policy`'s power limits
    can have with every queueing delay ≤ max_wait_s and the mean delay ≤ mean_wait_s (either may
    be None: no such constraint)."""
    power = policy_power(policy, setup.opts)
    jobs = Jobs.of(setup, power)
    if not len(jobs.submit):
        return 0.0
    reach = jobs.duration / power.slowest
    top = HORIZON_S if max_wait_s is None else max_wait_s
    prices = Prices(
        setup, float(jobs.submit.min()) - S.DAY, float((jobs.submit + reach).max()) + top + S.DAY
    )
    per_s = jobs.kw / HOUR  # € per (price × second)

    def c(at: slice, waits: np.ndarray) -> np.ndarray:  # c_j(w) for jobs `at`, waits (m,)
        s = jobs.submit[at][:, None]
        return (
            cheapest(prices, s, s + waits[None, :] + reach[at][:, None], jobs.duration[at][:, None])
            * per_s[at][:, None]
        )

    n = len(jobs.submit)
    if mean_wait_s is None:
        w = np.array([top])
        total = 0.0
        for a in range(0, n, CHUNK):
            at = slice(a, a + CHUNK)
            if max_wait_s is None:  # the valley price for all of its work: as cheap as it gets
                total += float((jobs.duration[at] * prices.levels[0] * per_s[at]).sum())
            else:
                total += float(c(at, w).sum())
        return total
    grid = np.arange(0.0, top + STEP_S, STEP_S)
    grid[-1] = top
    grid = np.unique(np.minimum(grid, top))
    lambdas = np.concatenate([[0.0], np.logspace(-9, 0, 91)])  # € per second of delay
    best = np.full(len(lambdas), 0.0)
    budget = n * mean_wait_s
    for a in range(0, n, CHUNK):
        at = slice(a, a + CHUNK)
        cw = c(at, grid)  # (jobs, points), falling along the points
        # g_j(λ) = min(c_j(0), min_k c_j(w_k+1) + λ w_k [, tail + λ top]) per λ
        for li, lam in enumerate(lambdas):
            g = np.minimum(
                cw[:, 0],
                (cw[:, 1:] + lam * grid[None, :-1]).min(axis=1) if len(grid) > 1 else cw[:, 0],
            )
            if max_wait_s is None:
                tail = jobs.duration[at] * prices.levels[0] * per_s[at] + lam * top
                g = np.minimum(g, tail)
            best[li] += float(g.sum())
    return float((best - lambdas * budget).max())


def limits(by: dict[str, dict[str, float]]) -> tuple[float, float]:
    """The delay goals' limits on one window, in seconds, from its runs' metrics (policy ->
    metrics): EASY's longest wait, and 0.9 × the strongest baseline's mean."""
    best = S.strongest({("", 0.0, p): v for p, v in by.items()}, "", 0.0)
    return by["easy"]["delay_max_h"] * HOUR, 0.9 * by[best]["delay_mean_h"] * HOUR


SAVING = next(g for g in T.GOALS if g.column == "saving_share_deadline")  # judged where it applies

CASES = {  # the delay goals a ceiling is computed under
    "free": (False, False),
    "max": (True, False),
    "mean": (False, True),
    "both": (True, True),
}


def ceiling(
    setup: S.Setup, by: dict[str, dict[str, float]], policy: str, case: str = "both"
) -> float:
    """The largest saving share (of the deadline-feasible floor's, as `simulate.add_shares`
    computes it) that any schedule under `policy`'s power limits can reach on `setup` while it
    meets the delay goals of `case` (CASES); nan where FIFO leaves nothing to save."""
    fifo = by["fifo"]
    room = fifo["cost"] - fifo["cost_floor_deadline"]
    if not room > 0:
        return math.nan
    max_s, mean_s = limits(by)
    use_max, use_mean = CASES[case]
    floor = cost_floor(
        setup,
        policy,
        max_wait_s=max_s if use_max else None,
        mean_wait_s=mean_s if use_mean else None,
    )
    return (fifo["cost"] - floor) / room


def annotate(goals: list[dict[str, object]], setups: list[S.Setup], results: list) -> None:
    """Give each goals row whose saving goal applies its `saving_ceiling`: the most any schedule
    can save on that window beside both delay goals (nan for the others, and where a run the
    limits need is missing)."""
    for row in goals:
        row["saving_ceiling"] = math.nan
        if row.get("saving_share_deadline_pass") is None:
            continue
        trace, load = row["trace"], row["load"]
        by = {r.policy: r.metrics for r in results if r.trace == trace and r.load == load}
        setup = next((s for s in setups if s.trace == trace and s.load == load), None)
        if setup is None or "fifo" not in by or "easy" not in by:
            continue
        row["saving_ceiling"] = ceiling(setup, by, str(row["policy"]))


def table_rows(csv_rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """For each seed and window of a scheduler_table CSV (its runs' metrics), each policy with
    a cost lever: the ceilings under every case of CASES beside the share it reached. The setup
    is made again from the trace (make_setups is deterministic): the goals table's window, or
    its smoke test's, whose start and length match the row's."""
    out: list[dict[str, object]] = []
    groups: dict[tuple[int, str, float], dict[str, dict[str, str]]] = {}
    for r in csv_rows:
        groups.setdefault((int(r["seed"]), r["trace"], float(r["load"])), {})[r["policy"]] = r
    for (seed, trace, load), runs in groups.items():
        by = {p: {k: _float(v) for k, v in r.items()} for p, r in runs.items()}
        setup = _setup_of(seed, trace, load, next(iter(runs.values())))
        if setup is None or "fifo" not in by or "easy" not in by:
            continue
        max_s, mean_s = limits(by)
        for policy in (p for p in by if p in S.POLICIES and SAVING.applies(p)):
            out.append(
                {
                    "seed": seed,
                    "trace": trace,
                    "load": load,
                    "policy": policy,
                    "easy_max_h": max_s / HOUR,
                    "mean_limit_h": mean_s / HOUR,
                    **{case: ceiling(setup, by, policy, case) for case in CASES},
                    "reached": by[policy]["saving_share_deadline"],
                }
            )
    return out


def _setup_of(seed: int, trace: str, load: float, row: dict[str, str]) -> S.Setup | None:
    for w in (*T.WINDOWS, *T.TINY, *T.HELD_OUT):
        if (w.trace, w.load) != (trace, load):
            continue
        opts = S.Options(seed=seed)
        (setup,) = S.make_setups([trace], [load], {trace: w.days}, w.gpus_per_host, opts)
        start = setup.origin + timedelta(seconds=setup.window[0])
        days = (setup.window[1] - setup.window[0]) / S.DAY
        if f"{start:%Y-%m-%d %H:%M}" == row["window_start"] and math.isclose(
            days, float(row["days"]), rel_tol=1e-9
        ):
            return setup
    return None


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return math.nan


HEADERS = (
    "seed",
    "trace",
    "load",
    "policy",
    "EASY's longest wait h",
    "0.9 × strongest mean h",
    "no delay goal",
    "longest wait ≤ EASY's",
    "mean ≤ 0.9 × strongest",
    "both",
    "reached",
)


def markdown(rows: list[dict[str, object]]) -> str:
    """The ceilings as a markdown table, and how many windows no schedule can pass."""
    out = ["| " + " | ".join(HEADERS) + " |", "| " + " | ".join("---" for _ in HEADERS) + " |"]
    for r in rows:
        cells = [str(r["seed"]), str(r["trace"]), f"{r['load']:g}", f"`{r['policy']}`"]
        cells += [f"{r[k]:.3g}" for k in ("easy_max_h", "mean_limit_h")]
        cells += [f"{round(T._num(r[k]), 3) + 0.0:.3f}" for k in (*CASES, "reached")]
        out.append("| " + " | ".join(cells) + " |")
    judged = [r for r in rows if not math.isnan(T._num(r["both"]))]
    under = sum(1 for r in judged if T._num(r["both"]) < 0.9)
    out += [
        "",
        f"No schedule can reach a saving share of 0.9 beside both delay goals on {under} of "
        f"the {len(judged)} policy windows with a saving to make.",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import csv

    ap = argparse.ArgumentParser(
        prog="nightshift eval saving-bound", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--from",
        dest="src",
        required=True,
        type=Path,
        help="a scheduler_table.csv (`scheduler_table --out DIR` writes DIR/scheduler_table.csv)",
    )
    ap.add_argument("--csv", type=Path, default=None, help="also write the rows as CSV here")
    args = ap.parse_args(argv)
    if not args.src.is_file():
        ap.error(f"--from: no file {args.src}; run scheduler_table --out DIR first")
    with args.src.open(newline="") as f:
        rows = table_rows(list(csv.DictReader(f)))
    if not rows:
        ap.error(f"--from: {args.src} has no window with fifo, easy and a tariff or cap policy")
    print(markdown(rows))
    if args.csv is not None:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
