"""Sweep benchmark: trial time to reach the validation loss 50 random trials find, for random
search, TPE, TPE with median pruning and TPE with successive halving, on real training of two
models.

Every trial is a real training process run through nightshift's own machinery: a sweep created
as `nightshift sweep` creates it, driven by the daemon's loop in this process (SweepDriver: ask,
tell, report, prune), each trial a job that the engine places, starts, watches and stops. The
models (NumPy, one BLAS thread per trial, so a trial starts in about 0.1 s and its time is
training): the quickstart's MLP on scikit-learn's digits (examples/train_numpy.py, 6000 steps)
and a character-level MLP language model on English text (examples/programs/train_charmlp.py,
3000 steps); each logs its validation loss 20 times per trial. `--models torch` adds the
nanoGPT-shaped GPT (examples/programs/train_torch_plain.py), whose trials on a CPU are mostly
importing torch.

For each model and seed, random search runs `--trials` trials first; its best validation loss
is the target. The other methods then run until one of their trials reaches the target (or they
too have run `--trials`). A method's figure is its *trial time to reach the target*: the run
time of every attempt, pruned ones included, up to the moment the first trial at or below the
target was told (work of trials still running then counts up to that moment). Random search's
own figure is averaged over the order of its trials (`expected_reach`): its trials are
independent draws, and whether its best came first or last in one run is luck. The ratio is a
method's figure over random search's, same model and seed; the CSV also has it against the
random run as it happened and against all its trials. On a GPU server that time is GPU-time;
this benchmark's machine has no GPU, so it is CPU-slot time of the trial processes
(`--parallel` of them at once), which is what the same sweep would spend in GPU-time with one
GPU per trial.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.evals.output import write_csv

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


# One BLAS thread per trial: with OpenBLAS's default (a thread per core), two trials on a small
# machine spin against each other and a 2-second trial takes 20; on a GPU the work is on the GPU.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _mlp_spec(
    name: str,
    folder: Path,
    program: str,
    steps: int,
    parameters: dict[str, Any],
    search: dict[str, Any],
) -> tuple[dict[str, Any], int]:
    """A sweep spec for one of the NumPy example programs, which share their arguments: each
    searched parameter as `--name {name}`, 20 validations and 50 loss lines per trial, one
    checkpoint at the end."""
    every = max(1, steps // 20)
    searched = [w for p in parameters for w in (f"--{p.replace('_', '-')}", f"{{{p}}}")]
    command = [
        "{python}", program, *searched,
        "--steps", str(steps),
        "--val-every", str(every),
        "--log-every", str(max(1, steps // 50)),
        "--seed", "0",
        "--checkpoint-dir", "{checkpoint_dir}",
        "--checkpoint-every", str(steps),
        "--metrics-file", "{metrics_file}",
    ]  # fmt: skip
    return {
        "name": name,
        "code": {"path": str(folder)},
        "environment": {"env": ONE_THREAD},
        "command": command,
        "parameters": parameters,
        "search": search,
        "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
        "checkpoint": {"dir": "checkpoints"},
        "retries": 0,
        "seed": 0,
    }, every


def numpy_spec(steps: int) -> tuple[dict[str, Any], int]:
    """The quickstart's MLP on digits (examples/train_numpy.py)."""
    return _mlp_spec(
        "bench-numpy",
        EXAMPLES,
        "train_numpy.py",
        steps,
        {"lr": 0.01, "micro_batch": 32, "hidden": 64},
        {
            "lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0},
            "micro_batch": {"type": "categorical", "choices": [8, 16, 32, 64, 128]},
            "hidden": {"type": "int", "low": 8, "high": 256, "log": True},
        },
    )


def charmlp_spec(steps: int) -> tuple[dict[str, Any], int]:
    """A character-level MLP language model on English text (examples/programs/train_charmlp.py)."""
    return _mlp_spec(
        "bench-charmlp",
        EXAMPLES / "programs",
        "train_charmlp.py",
        steps,
        {"lr": 0.003, "micro_batch": 64, "hidden": 128, "embed": 16},
        {
            "lr": {"type": "log_uniform", "low": 1e-4, "high": 0.1},
            "micro_batch": {"type": "categorical", "choices": [16, 32, 64, 128]},
            "hidden": {"type": "int", "low": 32, "high": 256, "log": True},
            "embed": {"type": "categorical", "choices": [4, 8, 16, 24]},
        },
    )


def torch_spec(steps: int) -> tuple[dict[str, Any], int]:
    """nanoGPT-shaped char-level GPT (examples/programs/train_torch_plain.py), PyTorch on the
    CPU: importing torch alone takes about 2 s, so its trials are dominated by start-up here."""
    every = max(1, steps // 6)
    return {
        "name": "bench-torch",
        "code": {"path": str(EXAMPLES / "programs")},
        "environment": {"env": ONE_THREAD},
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


MODELS = {
    "numpy": (numpy_spec, 6000),
    "charmlp": (charmlp_spec, 3000),
    "torch": (torch_spec, 120),
}
# The pruners wait for 5 finished trials and judge a trial from its 4th validation (a fifth of
# its steps) on; successive halving's rungs are at 4, 12 and (never reached) 36 validations.
METHODS: dict[str, dict[str, Any]] = {
    "random": {"sampler": "random", "pruner": "none"},
    "tpe": {"sampler": "tpe", "pruner": "none"},
    "tpe+median": {"sampler": "tpe", "pruner": "median"},
    "tpe+sha": {"sampler": "tpe", "pruner": "successive_halving"},
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
    # random search only: the time to its best trial averaged over every order of its trials
    expect_s: float | None = None
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

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.scheduling.sweeps import create_sweep, load_study
    from nightshift.runtime.spec import ExperimentSpec
    from nightshift.runtime.store.db import Attempt, Job, Sweep

    make, default_steps = MODELS[model]
    raw, every = make(steps or default_steps)
    raw["sweep"] = {
        **METHODS[method],
        "trials": trials,
        "metric": "val_loss",
        "mode": "min",
        "startup_trials": 10,
        "prune_startup_trials": 5,
        "prune_warmup_steps": every * 4,
        "min_resource": every * 4,
        "reduction_factor": 3,
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
        from nightshift.agent.brain.wiring import local_now

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
    if target is None and values:
        out.expect_s = expected_reach(study.trials, atts, goal)
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


def expected_reach(trials: list[Any], atts: list[Any], goal: float) -> float:
    """Random search's time to its best trial, averaged over the order of its trials.

    Random trials are independent draws, so the order they ran in is luck: one run's best may
    come first (a few seconds) or last (all of them). Averaged over every order, each trial that
    does not reach the goal runs before the first that does with probability 1/(k+1), k being
    how many reach it (1 for random search's own best): the expected time is the mean duration
    of a trial that reaches it plus that share of the others'."""
    took: dict[int, float] = {}
    for a in atts:
        end = a.ended_at or a.started_at
        took[a.job_id] = took.get(a.job_id, 0.0) + (end - a.started_at).total_seconds()
    hits: list[float] = []
    misses: list[float] = []
    for t in trials:
        if t.user_attrs.get("job_id") is None or t.datetime_complete is None:
            continue
        d = took.get(t.user_attrs["job_id"], 0.0)
        (hits if t.value is not None and t.value <= goal else misses).append(d)
    if not hits:
        return math.inf
    return statistics.mean(hits) + sum(misses) / (len(hits) + 1)


def _utc(local_naive: datetime) -> datetime:
    from datetime import UTC

    return local_naive.astimezone().astimezone(UTC).replace(tzinfo=None)


def ratio_rows(
    outcomes: list[Outcome], targets: dict[tuple[str, int], float]
) -> list[dict[str, Any]]:
    """One row per sweep: its time to the target and that time over random search's (same model,
    same seed). A method that never reached the target is charged all the time it spent: a lower
    bound on its ratio, flagged `reached: False`."""
    rows = []
    for o in outcomes:
        rnd = next(
            x for x in outcomes if (x.model, x.seed, x.method) == (o.model, o.seed, "random")
        )
        spent = o.reach_s if o.reach_s is not None else o.total_s
        if o.method == "random":
            spent = rnd.expect_s or spent
        ratio = spent / rnd.expect_s if rnd.expect_s else None
        rows.append(
            {
                "model": o.model,
                "seed": o.seed,
                "method": o.method,
                "trials": o.trials,
                "pruned": o.pruned,
                "best_val_loss": round(o.best, 5),
                "target": round(targets[(o.model, o.seed)], 5),
                "reached": o.reach_s is not None,
                "reach_trial_s": None if o.reach_s is None else round(o.reach_s, 1),
                "reach_trials": o.reach_trials,
                "ratio_vs_random": None if ratio is None else round(ratio, 3),
                # against this run's own order of random trials and against all 50 of them
                "random_expected_s": None if rnd.expect_s is None else round(rnd.expect_s, 1),
                "random_reach_s": None if rnd.reach_s is None else round(rnd.reach_s, 1),
                "random_all_s": round(rnd.total_s, 1),
                "ratio_vs_random_as_run": None
                if not rnd.reach_s or o.method == "random"
                else round((o.reach_s if o.reach_s is not None else o.total_s) / rnd.reach_s, 3),
                "ratio_vs_random_all": round(spent / rnd.total_s, 3) if rnd.total_s else None,
                "all_trial_s": round(o.total_s, 1),
                "wall_s": round(o.wall_s, 1),
            }
        )
    return rows


def to_target(r: dict[str, Any]) -> str:
    """The table's 'to target' cell: random search's order-averaged time, the run's own."""
    if r["method"] == "random":
        return (
            f"{r['random_expected_s']:.0f} s expected (this order: {r['reach_trial_s']:.0f} s, "
            f"trial {r['reach_trials']}; all: {r['all_trial_s']:.0f} s)"
        )
    if r["reached"]:
        return f"{r['reach_trial_s']:.0f} s (trial {r['reach_trials']})"
    return f"not reached ({r['all_trial_s']:.0f} s)"


def plot(outcomes: list[Outcome], targets: dict[tuple[str, int], float], path: Path) -> bool:
    """How far above the target each method's best stood as trial time went by, both measured
    against random search of the same seed (time over its expected time to the target, loss over
    the target), so every seed shares one scale: one panel per model, one colour per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(dict.fromkeys(o.model for o in outcomes))
    seeds = list(dict.fromkeys(o.seed for o in outcomes))
    colours = dict(zip(METHODS, ("tab:grey", "tab:blue", "tab:red", "tab:green"), strict=True))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for o in outcomes:
            rnd = [
                x for x in outcomes if (x.model, x.seed, x.method) == (o.model, o.seed, "random")
            ]
            points = [(x, y) for x, y in o.curve if math.isfinite(y)]
            if o.model != model or not points or not rnd or not rnd[0].expect_s:
                continue
            target, base = targets[(o.model, o.seed)], rnd[0].expect_s
            xs = [x / base for x, _ in points]
            ys = [100 * (y / target - 1) for _, y in points]
            ax.step(xs, ys, where="post", color=colours.get(o.method), lw=1.1, alpha=0.8)
            if o.method != "random" and o.reach_s is not None:
                ax.plot([o.reach_s / base], [0], "o", color=colours.get(o.method), ms=4)
        for method, colour in colours.items():
            if any(o.model == model and o.method == method for o in outcomes):
                ax.plot([], [], color=colour, label=method)
        ax.axhline(0, color="black", lw=0.6)
        ax.axvline(1, color="black", ls=":", lw=0.8, label="random's expected time")
        ax.axvline(0.3, color="tab:purple", ls="--", lw=0.8, label="goal: 0.3x")
        ax.set_ylim(-3, 25)
        ax.set_xlim(0, 2.5)
        ax.set(
            xlabel="trial time / random search's expected time to the target (same seed)",
            ylabel="best val_loss so far, % above the target",
            title=f"{model}: seeds {', '.join(map(str, seeds))}; dots: target reached",
        )
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def save(outcomes: list[Outcome], targets: dict[tuple[str, int], float], path: Path) -> None:
    """Every sweep's outcome and curve as JSON, so the plot can be redrawn (`--replot`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "outcomes": [asdict(o) for o in outcomes],
                "targets": [[m, sd, t] for (m, sd), t in targets.items()],
            }
        )
    )


def load(path: Path) -> tuple[list[Outcome], dict[tuple[str, int], float]]:
    raw = json.loads(path.read_text())
    outcomes = [Outcome(**{**o, "curve": [tuple(p) for p in o["curve"]]}) for o in raw["outcomes"]]
    return outcomes, {(m, sd): t for m, sd, t in raw["targets"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval sweep", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", default="numpy,charmlp", help=f"comma-separated, of {', '.join(MODELS)}"
    )
    ap.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join(METHODS)} (random always runs: it sets the target)",
    )
    ap.add_argument("--trials", type=int, default=50, help="random trials (and the others' cap)")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument(
        "--seeds", default="0", help="comma-separated seeds: one run of every method per seed"
    )
    ap.add_argument("--steps", type=int, default=None, help="training steps per trial")
    ap.add_argument("--poll-s", type=float, default=0.1, help="loop.poll_interval_s")
    ap.add_argument("--out", default="evals/out", help="folder for the CSV")
    ap.add_argument("--plot", default="docs/img/sweep_bench.png", help="PNG path ('' for none)")
    ap.add_argument(
        "--replot", default=None, help="redraw --plot from a saved curves JSON; run nothing"
    )
    args = ap.parse_args(argv)
    if args.replot:
        return 0 if plot(*load(Path(args.replot)), Path(args.plot)) else 1
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    models = [m for m in args.models.split(",") if m]
    methods = ["random"] + [m for m in args.methods.split(",") if m and m != "random"]
    for name, known in ((models, MODELS), (methods, METHODS)):
        unknown = [x for x in name if x not in known]
        if unknown:
            console.print(f"error: unknown {unknown}; choose from {', '.join(known)}")
            return 2
    outcomes: list[Outcome] = []
    targets: dict[tuple[str, int], float] = {}
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    csv = Path(args.out) / "sweep_bench.csv"
    with tempfile.TemporaryDirectory(
        prefix="nightshift-sweep-bench-", ignore_cleanup_errors=True
    ) as tmp:
        for model in models:
            for seed in seeds:
                for method in methods:
                    o = run_sweep(
                        model,
                        method,
                        trials=args.trials,
                        parallel=args.parallel,
                        seed=seed * 10,
                        target=targets.get((model, seed)),
                        workdir=Path(tmp),
                        poll_s=args.poll_s,
                        steps=args.steps,
                    )
                    o.seed = seed
                    if method == "random":
                        targets[(model, seed)] = o.best
                    outcomes.append(o)
                    reach = "-" if o.reach_s is None else f"{o.reach_s:.0f} s"
                    console.print(
                        f"{model} seed {seed} {method}: {o.trials} trials ({o.pruned} pruned), "
                        f"best {o.best:.4f}, reached {reach}, all trials {o.total_s:.0f} s "
                        f"({o.wall_s:.0f} s wall)"
                    )
                    write_csv(csv, ratio_rows(outcomes, targets))  # a stopped run keeps its rows
                    save(outcomes, targets, csv.with_name("sweep_bench_curves.json"))
    rows = ratio_rows(outcomes, targets)
    table = Table(title="sweep benchmark: trial time to reach the best val_loss of random search")
    for col in (
        "model", "seed", "method", "trials", "pruned", "best val_loss", "to target", "ratio"
    ):  # fmt: skip
        table.add_column(col)
    ratios: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for r in rows:
        ratio = r["ratio_vs_random"]
        if ratio is not None:
            ratios.setdefault((r["model"], r["method"]), []).append((ratio, r["reached"]))
        table.add_row(
            r["model"],
            str(r["seed"]),
            r["method"],
            str(r["trials"]),
            str(r["pruned"]),
            f"{r['best_val_loss']:.4f}",
            to_target(r),
            "-" if ratio is None else ("" if r["reached"] else "≥") + f"{ratio:.2f}x",
        )
    console.print(table)
    summary = Table(title="ratio to random search's trial time over the seeds (≥: a lower bound)")
    for col in ("model", "method", "seeds", "per seed", "mean", "median"):
        summary.add_column(col)
    for (model, method), rs in ratios.items():
        bound = "" if all(ok for _, ok in rs) else "≥"
        values = [x for x, _ in rs]
        summary.add_row(
            model,
            method,
            str(len(rs)),
            " / ".join(("" if ok else "≥") + f"{x:.2f}" for x, ok in rs),
            f"{bound}{statistics.mean(values):.2f}x",
            f"{bound}{statistics.median(values):.2f}x",
        )
    console.print(summary)
    console.print(f"csv: {csv}")
    if args.plot and plot(outcomes, targets, Path(args.plot)):
        console.print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
