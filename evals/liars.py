"""Liars: what a job gains by giving an estimate of one minute for hours of work.

    python -m nightshift.evals.liars [--policies nightshift-notariff,easy-sjf] [--share 0.05]

On the goals table's Philly, Alibaba and Pollux windows (seed 0), a seeded share of the jobs that
run over an hour give an estimate of one minute; the rest keep the simulator's 1-4 x the truth.
Prints, per window and policy, the liars' and the honest jobs' mean wait in all (hours queued,
held or paused: simulate's delay), the honest jobs' longest, preemptions and useful utilisation:
how much a lie buys, and what it costs everyone else (docs/benchmarks.md, stop 58).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

from nightshift.evals import scheduler_table as T
from nightshift.evals import simulate as S

# the goals table's windows with a queue of long jobs to lie in (Tiresias' 60 jobs have few)
WINDOWS = tuple(w for w in T.WINDOWS if w.trace != "tiresias")


def run(policies: list[str], share: float, seed: int = 0) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for w in WINDOWS:
        trace = w.trace
        opts = S.Options(seed=seed)
        (setup,) = S.make_setups([trace], [w.load], {trace: w.days}, w.gpus_per_host, opts)
        rnd = random.Random(f"liars:{trace}:{seed}")
        liars = {j.id for j in setup.jobs if j.duration_s > 3600 and rnd.random() < share}
        setup.jobs = [
            dataclasses.replace(j, overestimate=60.0 / j.duration_s) if j.id in liars else j
            for j in setup.jobs
        ]
        for policy in policies:
            sim = S._Run(setup, S.POLICIES[policy])
            result = sim.run()
            waited = {
                j.sj.id: (j.done - j.sj.submit_s - j.ran) / 3600.0
                for j in sim.jobs.values()
                if j.done is not None
            }
            honest = [w for k, w in waited.items() if k not in liars]
            lied = [w for k, w in waited.items() if k in liars]
            rows.append(
                {
                    "trace": trace,
                    "policy": policy,
                    "liars": len(liars),
                    "liars_mean_h": statistics.mean(lied) if lied else float("nan"),
                    "honest_mean_h": statistics.mean(honest),
                    "honest_max_h": max(honest),
                    "preemptions": result.metrics["preemptions"],
                    "util_useful": result.metrics["util_useful"],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nightshift.evals.liars", description=__doc__)
    parser.add_argument("--policies", default="nightshift-notariff,easy-sjf")
    parser.add_argument("--share", type=float, default=0.05, help="of the jobs over an hour")
    args = parser.parse_args(argv)
    unknown = [p for p in args.policies.split(",") if p not in S.POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)}")
    if not 0 < args.share <= 1:
        parser.error("--share: a fraction in (0, 1], e.g. 0.05")
    print(
        "| trace | policy | liars | liars' mean wait h | honest mean h | honest longest h "
        "| preemptions | useful util |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in run(args.policies.split(","), args.share):
        print(
            f"| {r['trace']} | `{r['policy']}` | {r['liars']} | {r['liars_mean_h']:.4f} | "
            f"{r['honest_mean_h']:.4f} | {r['honest_max_h']:.2f} | {r['preemptions']:.0f} | "
            f"{r['util_useful']:.4f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
