"""Sweep benchmark: trial time to reach the validation loss 50 random trials find, for random
search, TPE, and TPE with median pruning, on real training of two models.

Every trial is a real training process run through nightshift's own machinery: a sweep created
as `nightshift sweep` creates it, driven by the daemon's loop in this process (SweepDriver: ask,
tell, report, prune), each trial a job that the engine places, starts, watches and stops. The
models: the quickstart's NumPy MLP on scikit-learn's digits (examples/train_numpy.py) and the
char-level GPT of examples/programs/train_torch_plain.py (PyTorch, CPU).

For each model, random search runs `--trials` trials first; its best validation loss is the
target. TPE and TPE + median pruning then run until one of their trials reaches the target (or
they too have run `--trials`). The figure is the *trial time to reach the target*: the run time
of every attempt up to the moment the first trial at or below the target ended, summed (work of
trials still running then counts up to that moment). On a GPU server that is GPU-time; this
benchmark's machine has no GPU, so it is CPU-slot time of the trial processes (`--parallel` of
them at once), which is what the same sweep would spend in GPU-time with one GPU per trial.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.evals.output import write_csv

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def numpy_spec(steps: int) -> tuple[dict[str, Any], int]:
    every = max(1, steps // 12)
    return {
        "name": "bench-numpy",
        "code": {"path": str(EXAMPLES)},
        "command": [
            "{python}",
            "train_numpy.py",
            "--lr",
            "{lr}",
            "--micro-batch",
            "{micro_batch}",
            "--hidden",
            "{hidden}",
            "--steps",
            str(steps),
            "--val-every",
            str(every),
            "--seed",
            "0",
            "--checkpoint-dir",
            "{checkpoint_dir}",
            "--checkpoint-every",
            str(steps),
            "--metrics-file",
            "{metrics_file}",
        ],  # fmt: skip
        "parameters": {"lr": 0.01, "micro_batch": 32, "hidden": 64},
        "search": {
            "lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0},
            "micro_batch": {"type": "categorical", "choices": [8, 16, 32, 64, 128]},
            "hidden": {"type": "int", "low": 8, "high": 256, "log": True},
        },
        "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
        "checkpoint": {"dir": "checkpoints"},
        "retries": 0,
        "seed": 0,
    }, every


def torch_spec(steps: int) -> tuple[dict[str, Any], int]:
    every = max(1, steps // 6)
    return {
        "name": "bench-torch",
        "code": {"path": str(EXAMPLES / "programs")},
        "command": [
            "{python}",
            "train_torch_plain.py",
            "--out_dir={checkpoint_dir}",
            "--learning_rate={learning_rate}",
            "--batch_size={batch_size}",
            "--dropout={dropout}",
            f"--max_iters={steps}",
            f"--lr_decay_iters={steps}",
            f"--eval_interval={every}",
            "--log_interval=10",
            "--seed=1337",
        ],  # fmt: skip
        "parameters": {"learning_rate": 0.003, "batch_size": 16, "dropout": 0.0},
        "search": {
            "learning_rate": {"type": "log_uniform", "low": 1e-4, "high": 0.1},
            "batch_size": {"type": "categorical", "choices": [4, 8, 16, 32]},
            "dropout": {"type": "uniform", "low": 0.0, "high": 0.3},
        },
        "checkpoint": {"dir": "out", "resume_arg": ["--init_from=resume"]},
        "metrics": {
            "source": "log",
            "name": "loss",
            "mode": "min",
            "regex": [
                r"iter (?P<step>\d+): loss (?P<loss>[^,\s]+), time",
                r"step (?P<step>\d+): train loss (?P<train_loss>[^,\s]+), "
                r"val loss (?P<val_loss>[^,\s]+)",
            ],
            "divergence": {"enabled": False},
        },
        "retries": 0,
        "seed": 1337,
    }, every


MODELS = {"numpy": (numpy_spec, 600), "torch": (torch_spec, 120)}
METHODS = {
    "random": {"sampler": "random", "pruner": "none"},
    "tpe": {"sampler": "tpe", "pruner": "none"},
    "tpe+median": {"sampler": "tpe", "pruner": "median"},
}


@dataclass
class Outcome:
    model: str
    method: str
    seed: int = 0
    trials: int = 0
    pruned: int = 0
    best: float = math.inf
    total_s: float = 0.0  # every attempt's run time
    reach_s: float | None = None  # run time until the target was first reached
    reach_trials: int | None = None
    curve: list[tuple[float, float]] = field(default_factory=list)  # (trial seconds, best so far)
    wall_s: float = 0.0


def run_sweep(
    model: str,
    method: str,
    *,
    trials: int,
    parallel: int,
    seed: int,
    target: float | None,
    workdir: Path,
    poll_s: float,
    steps: int | None,
) -> Outcome:
    """One sweep through the real loop, in a home of its own; stops once `target` is reached."""
    from sqlmodel import select

    from nightshift.agent.wiring import Wiring
    from nightshift.runtime.spec import ExperimentSpec
    from nightshift.runtime.store import Attempt, Job, Sweep
    from nightshift.runtime.sweeps import create_sweep, load_study

    make, default_steps = MODELS[model]
    raw, every = make(steps or default_steps)
    raw["sweep"] = {
        **METHODS[method],
        "trials": trials,
        "metric": "val_loss",
        "mode": "min",
        "startup_trials": 10,
        "prune_startup_trials": 5,
        "prune_warmup_steps": every * 2,
        "max_parallel": parallel,
        "seed": seed + list(METHODS).index(method),  # independent draws per method
    }
    home = workdir / f"{model}-{method.replace('+', '-')}-seed{seed}"
    env = {
        "NIGHTSHIFT_HOME": str(home),
        "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": str(poll_s),
        "NIGHTSHIFT_LOOP__CPU_SLOTS": str(parallel),
        "NIGHTSHIFT_SCHEDULER__SWEEP_SHARE": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        w = Wiring.load()
        w.loop.drive_sweeps = True
        spec = ExperimentSpec.model_validate(raw)
        from nightshift.agent.wiring import local_now

        sweep = create_sweep(
            w.store,
            spec,
            spec_path=None,
            owner=w.user,
            name=f"{model}-{method.replace('+', '-')}-seed{seed}",
            now=local_now(),
            tz=datetime.now().astimezone().tzinfo,  # type: ignore[arg-type]
        )
        start = time.monotonic()
        reached_at: datetime | None = None
        while True:
            w.loop.step()
            with w.store.session() as s:
                row = s.get(Sweep, sweep.id)
            assert row is not None
            if row.state != "running":
                break
            if target is not None and reached_at is None:
                study = load_study(row)
                done = [t for t in study.trials if t.value is not None and t.value <= target]
                if done:
                    reached_at = min(t.datetime_complete for t in done)
                    break
            time.sleep(poll_s)
        wall = time.monotonic() - start
        if reached_at is not None:  # stop what still runs: the target is reached
            with w.store.session() as s:
                live = [j.id for j in s.exec(select(Job).where(Job.state == "running"))]
            for job_id in live:
                w.engine.pause_job(job_id, w.engine.clock(), outcome="cancelled", why="bench over")
        with w.store.session() as s:
            atts = list(s.exec(select(Attempt)))
            row = s.get(Sweep, sweep.id)
        assert row is not None
        study = load_study(row)
        return _outcome(model, method, study, atts, target, wall)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _outcome(
    model: str, method: str, study: Any, atts: list[Any], target: float | None, wall: float
) -> Outcome:
    """Trial time spent until each trial ended, the best value then, and when the target (or,
    for the run that sets it, its own best) was first reached."""
    spans = [(a.started_at, a.ended_at or a.started_at) for a in atts]

    def spent_until(t: datetime) -> float:
        return sum(max(0.0, (min(e, t) - s).total_seconds()) for s, e in spans if s < t)

    told = sorted(
        (t for t in study.trials if t.datetime_complete is not None and t.user_attrs.get("job_id")),
        key=lambda t: t.datetime_complete,
    )
    out = Outcome(model, method, trials=len(told))
    out.pruned = sum(t.state.name == "PRUNED" for t in told)
    out.total_s = sum((e - s).total_seconds() for s, e in spans)
    out.wall_s = wall
    values = [t.value for t in told if t.value is not None]
    out.best = min(values) if values else math.inf
    goal = target if target is not None else out.best
    best = math.inf
    for i, t in enumerate(told, 1):
        # optuna records naive local times; attempts naive UTC: compare in UTC
        ended = _utc(t.datetime_complete)
        if t.value is not None:
            best = min(best, t.value)
        out.curve.append((spent_until(ended), best))
        if out.reach_s is None and t.value is not None and t.value <= goal:
            out.reach_s, out.reach_trials = spent_until(ended), i
    return out


def _utc(local_naive: datetime) -> datetime:
    from datetime import UTC

    return local_naive.astimezone().astimezone(UTC).replace(tzinfo=None)


def plot(outcomes: list[Outcome], targets: dict[str, float], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(dict.fromkeys(o.model for o in outcomes))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for o in outcomes:
            if o.model == model and o.curve:
                xs, ys = zip(*[(x, y) for x, y in o.curve if math.isfinite(y)], strict=True)
                ax.step(xs, ys, where="post", label=f"{o.method} ({o.trials} trials)")
        ax.axhline(targets[model], color="grey", ls="--", lw=0.8, label="best of random")
        ax.set(
            xlabel="trial time, s (CPU here; GPU-time on a GPU server)",
            ylabel="best val_loss so far",
            title=model,
            yscale="log",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="numpy,torch", help="comma-separated: numpy,torch")
    ap.add_argument("--trials", type=int, default=50, help="random trials (and the others' cap)")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument(
        "--seeds", default="0", help="comma-separated seeds: one run of every method per seed"
    )
    ap.add_argument("--steps", type=int, default=None, help="training steps per trial")
    ap.add_argument("--poll-s", type=float, default=0.05, help="loop.poll_interval_s")
    ap.add_argument("--out", default="evals/out", help="folder for the CSV")
    ap.add_argument("--plot", default="docs/img/sweep_bench.png", help="PNG path ('' for none)")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    outcomes: list[Outcome] = []
    targets: dict[tuple[str, int], float] = {}
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(
        prefix="nightshift-sweep-bench-", ignore_cleanup_errors=True
    ) as tmp:
        todo = [(m, seed) for m in args.models.split(",") if m for seed in seeds]
        for model, seed in todo:
            if model not in MODELS:
                console.print(f"error: no model {model!r}; one of {', '.join(MODELS)}")
                return 2
            for method in METHODS:
                target = targets.get((model, seed))
                o = run_sweep(
                    model,
                    method,
                    trials=args.trials,
                    parallel=args.parallel,
                    seed=seed * 10,
                    target=target,
                    workdir=Path(tmp),
                    poll_s=args.poll_s,
                    steps=args.steps,
                )
                o.seed = seed
                if method == "random":
                    targets[(model, seed)] = o.best
                outcomes.append(o)
                console.print(
                    f"{model} seed {seed} {method}: {o.trials} trials, best {o.best:.4f}, reached "
                    f"{'-' if o.reach_s is None else f'{o.reach_s:.0f} s'} ({o.wall_s:.0f} s wall)"
                )
    table = Table(title="sweep benchmark: trial time to reach the best val_loss of random search")
    for col in (
        "model", "seed", "method", "trials", "pruned", "best val_loss", "to target", "ratio"
    ):  # fmt: skip
        table.add_column(col)
    rows = []
    ratios: dict[tuple[str, str], list[float]] = {}
    for o in outcomes:
        base = next(
            x for x in outcomes if (x.model, x.seed, x.method) == (o.model, o.seed, "random")
        ).reach_s
        # not reached within the trial cap: at least all the time it spent
        spent = o.reach_s if o.reach_s is not None else o.total_s
        ratio = spent / base if base else None
        if ratio is not None:
            ratios.setdefault((o.model, o.method), []).append(ratio)
        rows.append(
            {
                "model": o.model,
                "seed": o.seed,
                "method": o.method,
                "trials": o.trials,
                "pruned": o.pruned,
                "best_val_loss": round(o.best, 5),
                "target": round(targets[(o.model, o.seed)], 5),
                "reach_trial_s": None if o.reach_s is None else round(o.reach_s, 1),
                "reach_trials": o.reach_trials,
                "ratio_vs_random": None if ratio is None else round(ratio, 3),
                "all_trial_s": round(o.total_s, 1),
                "wall_s": round(o.wall_s, 1),
            }
        )
        table.add_row(
            o.model,
            str(o.seed),
            o.method,
            str(o.trials),
            str(o.pruned),
            f"{o.best:.4f}",
            "not reached" if o.reach_s is None else f"{o.reach_s:.0f} s (trial {o.reach_trials})",
            "-" if ratio is None else ("≥" if o.reach_s is None else "") + f"{ratio:.2f}x",
        )
    console.print(table)
    summary = Table(title="median ratio to random search's trial time, over the seeds")
    for col in ("model", "method", "seeds", "median ratio"):
        summary.add_column(col)
    for (model, method), rs in ratios.items():
        summary.add_row(model, method, str(len(rs)), f"{statistics.median(rs):.2f}x")
    console.print(summary)
    write_csv(Path(args.out) / "sweep_bench.csv", rows)
    first = [o for o in outcomes if o.seed == seeds[0]]
    if args.plot and plot(
        first, {m: t for (m, sd), t in targets.items() if sd == seeds[0]}, Path(args.plot)
    ):
        console.print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
