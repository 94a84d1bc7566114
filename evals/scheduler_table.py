"""Issue 31's scheduler table from one command: every trace and window docs/benchmarks.md
reports, every baseline and nightshift side by side, and the goals table with PASS/FAIL, so the
numbers in the docs come from one invocation anyone can repeat on a clean clone.

    python -m nightshift.evals.scheduler_table --out evals/out/table --jobs 2
    python -m nightshift.evals.scheduler_table --tiny      # small windows: seconds, a smoke test
    python -m nightshift.evals.scheduler_table --seeds 0,1,2 --jobs 2   # every window per seed
    python -m nightshift.evals.scheduler_table --held-out --jobs 2      # windows never tuned on

The runs are evals/simulate.py's (`make_setups`, `simulate`, `add_shares`, `strongest`): this
module only chooses the setups and policies and judges the rows. Per trace and window it prints
mean / p99 / max queueing delay, utilisation inside the window, deadline misses by cause (after
a tariff hold and met by the no-tariff twin; after a power cap and met by the uncapped twin; any
miss the uncapped twin meets), energy and the share of the achievable saving, and writes
`scheduler_table.csv`, `scheduler_goals.csv` and `scheduler_table.md` into --out.

Goals (issue 31, "What to build"), per trace and judged policy: mean delay ≤ 0.9 × EASY+SJF's and
≤ 0.9 × the strongest baseline's (lowest mean among simulate.BASELINES), longest wait ≤ EASY's,
useful utilisation (without redone work) ≥ EASY's, no deadline miss that the no-tariff twin meets
(held or not), and energy: the saving share ≥ 0.9 of the deadline-feasible floor. The last two
are n/a for a policy without the lever they judge (no tariff; for the saving, no tariff and no
power cap), and the count of failed goals is over those that apply. Beside each saving verdict
is the most any schedule could save on that window while meeting both delay goals
(`saving_bound.annotate`): where it is under 0.9, no scheduler passes all three there.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nightshift.evals import simulate as S
from nightshift.evals.output import write_csv


@dataclass(frozen=True)
class Window:
    """One trace window the docs report: the trace, its length in days (None: the whole trace)
    and the offered load."""

    trace: str
    days: float | None
    load: float
    gpus_per_host: int | None = None  # None: the trace's own hosts (simulate.size_cluster)

    @property
    def label(self) -> str:
        length = "whole trace" if self.days is None else f"{self.days:g} d"
        hosts = "" if self.gpus_per_host is None else f", {self.gpus_per_host}-GPU hosts"
        return f"{self.trace} ({length}, load {self.load:g}{hosts})"


# docs/benchmarks.md's windows (seed 0): Philly's seeded week, Alibaba's fortnight, the Pollux
# window (its busiest day: its busiest week takes minutes per policy), Tiresias' whole trace at
# 0.8 and at its own load, 2 (at 0.8 its jobs wait seconds)
WINDOWS = (
    Window("philly", 7.0, 0.8),
    Window("alibaba", 14.0, 0.8),
    Window("pollux", 1.0, 0.8),
    Window("tiresias", None, 0.8),
    Window("tiresias", None, 2.0),
)
# a smoke test: the same traces in windows of minutes to hours (a test runs it in seconds)
TINY = (
    Window("philly", 0.1, 0.8),
    Window("alibaba", 0.2, 0.8),
    Window("pollux", 0.003, 8.0),  # its busiest minutes hold long jobs: at 0.8, 3,000 GPUs
    Window("tiresias", None, 2.0),
)
# Windows no choice of the daemon's order was tuned on (`--held-out`): other lengths, loads and
# host sizes, run with seeds the tuning never drew (HELD_OUT_SEEDS; the seed draws Philly's and
# Alibaba's window, and every window's estimates, deadlines and health events). A rule shaped on
# WINDOWS that only fits them shows here. Each has a queue under EASY (the busiest 2 days of
# Pollux at 0.9 and 2 Philly days on 4-GPU hosts at 1.0 had none: every goal there passes
# unjudged); Pollux's 3 days hold its busiest day, WINDOWS' Pollux window, on another cluster.
# One window per trace and load: rows are keyed by both.
HELD_OUT = (
    Window("philly", 3.5, 0.9),
    Window("philly", 3.5, 0.8, gpus_per_host=4),
    Window("alibaba", 7.0, 1.0),
    Window("pollux", 3.0, 1.0),
    Window("tiresias", None, 1.2),
)
HELD_OUT_SEEDS = "10,11,12"
POLICIES = (
    *S.BASELINES,  # fifo, easy, easy-sjf, easy-sjf-aging, 2d-las, 2d-gittins
    S.NOTARIFF,
    S.NIGHTSHIFT,
    "nightshift-cap",
    "nightshift-caponly",
)
# the policies the goals judge: the ordering alone (the baselines have no tariff either), the
# daemon's default with the tariff, and that with the power cap at peak
JUDGED = (S.NOTARIFF, S.NIGHTSHIFT, "nightshift-cap")


@dataclass(frozen=True)
class Goal:
    """One of issue 31's goals: `value(judged, rows of its trace)` against a limit."""

    name: str
    column: str
    limit: float
    at_most: bool  # pass when value <= limit (else value >= limit)
    # a ratio goal: the judged policy's `metric` ÷ the `reference` policy's ("strongest": the
    # strongest baseline on that window)
    metric: str = ""
    reference: str = ""
    # a goal of the tariff's (or of any cost lever's): not applicable to a policy without it,
    # where it would hold by construction (a policy is its own no-tariff twin) or judge a
    # saving nothing in it tries to make
    needs: str = ""  # "tariff", "lever" (a tariff or a power cap), or "" (every policy)

    def applies(self, policy: str) -> bool:
        pol = S.POLICIES.get(policy)
        if not self.needs or pol is None:
            return True
        return pol.tariff or (self.needs == "lever" and pol.cap_at_peak_w is not None)

    def passes(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value <= self.limit + 1e-12 if self.at_most else value >= self.limit - 1e-12


GOALS = (
    Goal(
        "mean delay ÷ EASY+SJF's ≤ 0.9", "delay_vs_easy_sjf", 0.9, True, "delay_mean_h", "easy-sjf"
    ),
    Goal(
        "mean delay ÷ strongest baseline's ≤ 0.9",
        "delay_vs_strongest",
        0.9,
        True,
        "delay_mean_h",
        "strongest",
    ),
    Goal("longest wait ÷ EASY's ≤ 1", "max_vs_easy", 1.0, True, "delay_max_h", "easy"),
    # on the work done, not on GPUs busy redoing what a pause lost (that would flatter preemption)
    Goal("useful utilisation − EASY's ≥ 0", "util_vs_easy", 0.0, False),
    # any miss the no-tariff twin meets, held or not (issue 31: "counted for any cause")
    Goal(
        "deadline misses the no-tariff twin meets = 0", "misses_vs_twin", 0.0, True, needs="tariff"
    ),
    Goal(
        "saving share of deadline-feasible ≥ 0.9",
        "saving_share_deadline",
        0.9,
        False,
        needs="lever",
    ),
)


def judge(by: dict[str, dict[str, float]], judged: str) -> dict[str, object]:
    """One goals row for `judged` from the metrics of every policy that ran on one trace window
    (`by`: policy -> metrics, after simulate.add_shares). A ratio goal is judged as the
    inequality it states (mean ≤ 0.9 × the reference's), so where neither queues (both 0) it
    passes with no ratio (nan) and where only the judged one does it fails (inf); a goal whose
    reference did not run fails with nan."""
    m = by[judged]
    nan = math.nan
    best = S.strongest({("", 0.0, p): v for p, v in by.items()}, "", 0.0)
    easy = by.get("easy")
    row: dict[str, object] = {"policy": judged, "strongest": best}
    verdict: dict[str, bool] = {}
    for g in GOALS:
        if not g.metric:
            continue
        b = by.get(best if g.reference == "strongest" else g.reference)
        if b is None:
            row[g.column], verdict[g.column] = nan, False
            continue
        mine, ref = m[g.metric], b[g.metric]
        row[g.column] = mine / ref if ref else (nan if mine == 0 else math.inf)
        verdict[g.column] = mine <= g.limit * ref + 1e-12
    row["util_vs_easy"] = m["util_useful"] - easy["util_useful"] if easy is not None else nan
    row["misses_vs_twin"] = float(m.get("misses_vs_twin", nan))
    row["saving_share_deadline"] = float(m.get("saving_share_deadline", nan))
    for g in GOALS:
        if not g.applies(judged):
            row[g.column], row[f"{g.column}_pass"] = nan, None  # not applicable
            continue
        row[f"{g.column}_pass"] = verdict.get(g.column, g.passes(_num(row[g.column])))
    return row


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


@dataclass
class Table:
    """What one command produced: the setups, every run, and the goals rows."""

    setups: list[S.Setup]
    results: list[S.RunResult]
    goals: list[dict[str, object]]
    wall_s: float
    workers: int
    started: datetime


def _run(unit: tuple[S.Setup, str]) -> S.RunResult:
    return S.simulate(*unit)


def run(
    windows: tuple[Window, ...],
    policies: tuple[str, ...],
    seed: int,
    workers: int,
    underestimate: float = S.Options.min_overestimate,
    judged: tuple[str, ...] = JUDGED,
) -> Table:
    """Every policy on every window (in `workers` processes, the slowest units first), the
    saving shares and misses by cause, and the goals rows of each judged policy that ran;
    `underestimate`: the lowest estimate factor (simulate's --underestimate)."""
    t0, started = time.perf_counter(), datetime.now(UTC)
    opts = S.Options(seed=seed, min_overestimate=underestimate)
    setups = [
        s
        for w in windows
        for s in S.make_setups([w.trace], [w.load], {w.trace: w.days}, w.gpus_per_host, opts)
    ]
    units = [(s, p) for s in setups for p in policies]
    # the biggest windows first, so that a worker is not left with Philly's week at the end
    order = sorted(range(len(units)), key=lambda k: -len(units[k][0].jobs) * units[k][0].gpus)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = dict(zip(order, pool.map(_run, [units[k] for k in order]), strict=True))
        results = [done[k] for k in range(len(units))]
    else:
        results = [_run(u) for u in units]
    S.add_shares(results)
    goals = goal_rows(results, judged)
    from nightshift.evals import saving_bound  # it builds on this module's windows and goals

    saving_bound.annotate(goals, setups, results)
    wall = time.perf_counter() - t0
    return Table(setups, results, goals, wall, workers, started)


def goal_rows(
    results: list[S.RunResult], judged: tuple[str, ...] = JUDGED
) -> list[dict[str, object]]:
    """The goals table: for each trace window (in the order run) and each judged policy that
    ran on it, `judge` over that window's rows."""
    rows = []
    for trace, load in dict.fromkeys((r.trace, r.load) for r in results):
        by = {r.policy: r.metrics for r in results if r.trace == trace and r.load == load}
        for p in judged:
            if p in by:
                rows.append({"trace": trace, "load": load, **judge(by, p)})
    return rows


# (metric, header, format) of the per-trace tables
COLUMNS = (
    ("delay_mean_h", "delay mean h", "{:.3g}"),
    ("delay_p99_h", "p99 h", "{:.3g}"),
    ("delay_max_h", "max h", "{:.3g}"),
    ("util", "util", "{:.3f}"),
    ("util_useful", "useful util", "{:.3f}"),
    ("idle_waiting", "idle while jobs wait", "{:.3f}"),
    ("deadline_misses", "missed", "{:.0f}"),
    ("hold_misses_caused", "caused by holds", "{:.0f}"),
    ("misses_vs_twin", "met without the tariff", "{:.0f}"),
    ("cap_misses_caused", "caused by the cap", "{:.0f}"),
    ("misses_vs_cap_twin", "met uncapped", "{:.0f}"),
    ("energy_kwh", "MWh", "{:.3f}"),
    ("saving_share", "saving share", "{:.3f}"),
    ("saving_share_deadline", "of deadline-feasible", "{:.3f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("pauses", "pauses", "{:.0f}"),
    ("wall_s", "wall s", "{:.0f}"),
)


def _fmt(key: str, fmt: str, v: float) -> str:
    if math.isnan(v):
        return "–"
    return fmt.format(v / 1000 if key == "energy_kwh" else v)


def _window_line(s: S.Setup) -> str:
    start = s.origin + timedelta(seconds=s.window[0])
    return (
        f"**{s.trace}**, load {s.load:g}: {start:%Y-%m-%d %H:%M} + "
        f"{(s.window[1] - s.window[0]) / S.DAY:.3g} d, {len(s.jobs)} jobs on {s.gpus} GPUs "
        f"({len(s.hosts)} hosts, {s.counts['gangs']} gangs), seed {s.opts.seed}, estimates "
        f"{s.opts.min_overestimate:g}–{s.opts.max_overestimate:g} × the run time"
    )


def markdown(table: Table, command: str) -> str:
    """The per-window tables and the goals table, with the command, date, machine and wall."""
    cpu = _cpu_name()
    out = [
        f"Command: `{command}`  ",
        f"Started {table.started:%Y-%m-%d %H:%M} UTC on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} CPUs{', ' + cpu if cpu else ''}; Python "
        f"{platform.python_version()}), {table.workers} worker process(es): "
        f"**{table.wall_s / 60:.1f} min wall** "
        f"(Σ per-run wall {sum(r.metrics['wall_s'] for r in table.results) / 60:.1f} min).",
        "",
        "Delays in hours over every completed job; utilisation inside the window (useful: without "
        "the GPU time jobs spent redoing what a pause lost); misses: every "
        "missed deadline, those after a tariff hold met by the no-tariff twin, those after a "
        "cap met by the uncapped twin, and every miss the uncapped twin meets; saving share: "
        "(FIFO's cost − cost) ÷ (FIFO's cost − floor), valley and deadline-feasible floors.",
        "",
    ]
    for s in table.setups:
        runs = [r for r in table.results if r.trace == s.trace and r.load == s.load]
        out += [
            _window_line(s),
            "",
            "| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
            "| --- | " + " | ".join("---:" for _ in COLUMNS) + " |",
        ]
        for r in runs:
            cells = [_fmt(k, f, float(r.metrics.get(k, math.nan))) for k, _, f in COLUMNS]
            out.append(f"| `{r.policy}` | " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "Goals (PASS/FAIL; the value judged after it):",
        "",
        "| trace | load | policy | strongest baseline | "
        + " | ".join(g.name for g in GOALS)
        + " |",
        "| --- | ---: | --- | --- | " + " | ".join("---" for _ in GOALS) + " |",
    ]
    for row in table.goals:
        cells = [_verdict(row, g) for g in GOALS]
        out.append(
            f"| {row['trace']} | {row['load']:g} | `{row['policy']}` | {row['strongest']} | "
            + " | ".join(cells)
            + " |"
        )
    failed, verdicts = count(table.goals)
    out += ["", f"Goals failed: {failed} of {verdicts} ({NOT_APPLICABLE}).", ""]
    capped = unreachable(table.goals)
    if capped:
        out += [f"{capped} {UNREACHABLE}.", ""]
    return "\n".join(out)


NOT_APPLICABLE = "a tariff goal is not applicable to a policy without the lever it judges"


def count(goals: list[dict[str, object]]) -> tuple[int, int]:
    """(failed, given) verdicts over goals rows; a goal that does not apply is neither."""
    verdicts = [row[f"{g.column}_pass"] for row in goals for g in GOALS]
    given = [bool(v) for v in verdicts if v is not None]
    return given.count(False), len(given)


UNREACHABLE = (
    "saving verdict(s) where no schedule can reach 0.9 and also meet both delay goals "
    "(the most it can save is in brackets: `evals/saving_bound.py`)"
)


def unreachable(goals: list[dict[str, object]]) -> int:
    """How many goals rows have a saving goal that no schedule meets beside both delay goals."""
    return sum(1 for row in goals if _num(row.get("saving_ceiling")) < 0.9)


def _verdict(row: dict[str, object], g: Goal) -> str:
    """'PASS 0.42', 'FAIL 1.3'; a ratio goal where neither queued: 'PASS (both 0)'; 'n/a'; the
    saving goal with the most any schedule meeting the delay goals could save, '(≤ 0.31)'."""
    if row[f"{g.column}_pass"] is None:
        return "n/a"
    ok, v = bool(row[f"{g.column}_pass"]), _num(row[g.column])
    if ok and math.isnan(v):
        return "PASS (both 0)"
    cell = f"{'PASS' if ok else 'FAIL'} {v:.3g}"
    most = _num(row.get("saving_ceiling")) if g.column == "saving_share_deadline" else math.nan
    return cell if math.isnan(most) else f"{cell} (≤ {round(most, 2) + 0.0:.2f})"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def csv_rows(table: Table) -> list[dict[str, object]]:
    """One row per trace window and policy: the window, the seed and every metric."""
    by = {(s.trace, s.load): s for s in table.setups}
    return [
        {
            "trace": r.trace,
            "load": r.load,
            "policy": r.policy,
            "window_start": f"{by[(r.trace, r.load)].origin + timedelta(seconds=by[(r.trace, r.load)].window[0]):%Y-%m-%d %H:%M}",
            "days": (by[(r.trace, r.load)].window[1] - by[(r.trace, r.load)].window[0]) / S.DAY,
            "seed": by[(r.trace, r.load)].opts.seed,
            **{k: f"{v:.6g}" for k, v in r.metrics.items()},
        }
        for r in table.results
    ]


def _policy_names(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[str, ...]:
    """A comma list of simulate.POLICIES names, or the parser's error naming the flag."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in S.POLICIES]
    if bad or not names:
        parser.error(
            f"{flag}: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(S.POLICIES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nightshift eval scheduler-table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="evals/out/scheduler_table", help="folder for CSV + md")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--seeds",
        default=None,
        help=f"comma list of seeds (default 0; {HELD_OUT_SEEDS} with --held-out): each runs "
        "every window anew (its jobs' estimates, deadlines and health events drawn again), and "
        "the goals are counted over all",
    )
    parser.add_argument("--tiny", action="store_true", help="windows of minutes: a smoke test")
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="the windows no choice of the daemon's order was tuned on (other lengths, loads "
        f"and host sizes), with seeds {HELD_OUT_SEEDS} unless --seeds is given",
    )
    parser.add_argument(
        "--underestimate",
        type=float,
        default=S.Options.min_overestimate,
        help="the lowest estimate factor, in (0, 1]: 0.25 draws estimates from 0.25 to 4 x the "
        "run time, so holds meet estimates that fall short (default 1: from 1 to 4 x)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma list (default: the baselines, nightshift and its no-tariff and power twins)",
    )
    parser.add_argument(
        "--judge",
        default=",".join(JUDGED),
        help="comma list of the policies the goals judge (default: nightshift without the "
        "tariff, with it, and with the power cap); an ablation such as nightshift-nomove is "
        "judged beside them when named here and in --policies",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs: 1 or more worker processes")
    if args.tiny and args.held_out:
        parser.error("--tiny and --held-out: one set of windows at a time")
    if args.seeds is None:
        args.seeds = HELD_OUT_SEEDS if args.held_out else "0"
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--seeds: whole numbers separated by commas, not {args.seeds!r}")
    if not seeds:
        parser.error("--seeds: at least one seed")
    if not 0 < args.underestimate <= 1:
        parser.error("--underestimate: a factor in (0, 1], e.g. 0.25")
    pols = _policy_names(parser, "--policies", args.policies)
    judged = _policy_names(parser, "--judge", args.judge)
    windows = TINY if args.tiny else HELD_OUT if args.held_out else WINDOWS
    tables = [run(windows, pols, seed, args.jobs, args.underestimate, judged) for seed in seeds]
    command = "python -m nightshift.evals.scheduler_table " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    text = "\n".join(
        (f"#### Seed {seed}\n\n" if len(seeds) > 1 else "") + markdown(t, command.strip())
        for seed, t in zip(seeds, tables, strict=True)
    )
    if len(seeds) > 1:
        failed, verdicts = count([g for t in tables for g in t.goals])
        text += (
            f"\nOver seeds {args.seeds}: goals failed {failed} of {verdicts} ({NOT_APPLICABLE}); "
            f"{unreachable([g for t in tables for g in t.goals])} {UNREACHABLE}.\n"
        )
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "scheduler_table.csv", [row for t in tables for row in csv_rows(t)])
    goal_csv = [{"seed": seed, **g} for seed, t in zip(seeds, tables, strict=True) for g in t.goals]
    if goal_csv:
        write_csv(out / "scheduler_goals.csv", goal_csv)
    (out / "scheduler_table.md").write_text(text)
    print(f"wrote {out}/scheduler_table.{{csv,md}} and scheduler_goals.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
