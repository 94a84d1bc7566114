"""How fast the everyday read commands answer, on a store of a realistic size, timed from outside.

    nightshift eval latency                 # 10,000 queued jobs, 5 warm runs per command
    nightshift eval latency --jobs 500 --runs 2 --no-cold     # a smoke test
    nightshift eval latency --home DIR --full-path  # a kept store again, by the full path

A fresh NIGHTSHIFT_HOME gets one job that really ran (its log on disk), run by the daemon, then
`--jobs` queued jobs submitted through the library API in batches (policy gate, audit, store: the
rows a user's store holds), each asking for a GPU on a machine whose probe finds none, so they stay
queued. Each command (`jobs`, `status`, `show 1`, `logs 1`) is then run as a new process, the way
a user types it, and timed by the wall clock of this process: once cold (the page cache dropped
first, where this process may: root on Linux) and `--runs` times warm (median and max).
`squeue`'s answer on a Slurm machine is the comparison a user makes; no Slurm runs here, so the
table states the issue's target instead (warm ≤ 0.3 s, cold ≤ 1 s). `--full-path` times the
commands with NIGHTSHIFT_FULL_READ_PATH set: the ORM's read and Rich's layout of every table, what
they did before their fast path (docs/benchmarks.md, "Fast answers"); `--home` measures a store
kept by an earlier run (`--keep`) instead of filling a new one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from nightshift.evals.output import write_csv

COMMANDS = (["jobs"], ["status"], ["show", "1"], ["logs", "1"])
BATCH = 500
WARM_GOAL_S, COLD_GOAL_S = 0.3, 1.0


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "NIGHTSHIFT_HOME": str(home),
        "NIGHTSHIFT_GPU__PROBE": "none",
        "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.1",
        "COLUMNS": "160",
    }


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nightshift.agent.doors.entry", *args]


def fill(home: Path, n_jobs: int) -> None:
    """One job that ran (through the daemon), then n_jobs queued ones (through the library API)."""
    env = _env(home)
    spec = home / "hello.yaml"
    spec.write_text(
        "name: hello\ncommand: ['{python}', '-c', 'print(\"step 1 loss 0.5\")']\n"
        "resources: {gpus: 0}\n"
    )
    subprocess.run(_cli("submit", str(spec)), env=env, check=True, capture_output=True)
    subprocess.run(
        _cli("daemon", "--max-ticks", "60"), env=env, check=True, capture_output=True, timeout=300
    )
    code = (
        "import sys\n"
        "from nightshift.agent.doors.api import Client\n"
        "from nightshift.runtime.spec import ExperimentSpec\n"
        "n, batch = int(sys.argv[1]), int(sys.argv[2])\n"
        "spec = ExperimentSpec(name='queued', command=['{python}', '-c', 'pass'],"
        " resources={'gpus': 1}).model_dump(mode='json')\n"
        "c = Client()\n"
        "for b in range(0, n, batch):\n"
        "    c.submit_many([{'spec': spec} for _ in range(min(batch, n - b))], call_id=f'fill-{b}')\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(n_jobs), str(BATCH)], env=env, check=True, timeout=3600
    )


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _time(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = subprocess.run(_cli(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0, r.returncode


def measure(home: Path, runs: int, cold: bool, full_path: bool = False) -> list[dict[str, Any]]:
    env = _env(home)
    if full_path:
        env["NIGHTSHIFT_FULL_READ_PATH"] = "1"
    rows = []
    _time(["status"], env)  # a read command keeps the settings it loaded, as any user's first does
    for args in COMMANDS:
        cold_s = None
        if cold and _drop_caches():
            cold_s, _ = _time(args, env)
        warm = []
        code = 0
        _time(args, env)  # warm-up
        for _ in range(runs):
            s, code = _time(args, env)
            warm.append(s)
        rows.append(
            {
                "command": "nightshift " + " ".join(args),
                "cold_s": None if cold_s is None else round(cold_s, 3),
                "warm_median_s": round(statistics.median(warm), 3),
                "warm_max_s": round(max(warm), 3),
                "exit_code": code,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval latency", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000, help="queued jobs in the store")
    ap.add_argument("--runs", type=int, default=5, help="warm runs per command")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold run (drops caches)")
    ap.add_argument("--csv", default="evals/out/cli_latency.csv", help="where the rows go")
    ap.add_argument("--keep", action="store_true", help="keep the store's folder (path printed)")
    ap.add_argument("--home", help="measure this kept store (--jobs then only labels the table)")
    ap.add_argument(
        "--full-path", action="store_true", help="time the full path (ORM, Rich's layout)"
    )
    ns = ap.parse_args(argv)
    home = Path(ns.home) if ns.home else Path(tempfile.mkdtemp(prefix="ns-latency-"))
    console = Console()
    try:
        if not ns.home:
            t0 = time.perf_counter()
            fill(home, ns.jobs)
            console.print(
                f"store: 1 finished + {ns.jobs} queued jobs in {time.perf_counter() - t0:.0f} s"
            )
        rows = measure(home, ns.runs, not ns.no_cold, ns.full_path)
    finally:
        if ns.keep or ns.home:
            console.print(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    path = " (full path)" if ns.full_path else ""
    table = Table(
        title=f"read commands{path} on {ns.jobs:,} queued jobs "
        f"(goal: warm ≤ {WARM_GOAL_S} s, cold ≤ {COLD_GOAL_S} s)"
    )
    for col in rows[0]:
        table.add_column(col)
    for r in rows:
        table.add_row(*("—" if v is None else str(v) for v in r.values()))
    console.print(table)
    write_csv(Path(ns.csv), rows)
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
