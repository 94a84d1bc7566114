"""The MLflow mirror's cost (issue 30): seconds to mirror a job of N metric points.

`nightshift eval mlflow [--points N ...] [--url URL] [--quick] [--out DIR]`

A temporary NIGHTSHIFT_HOME holds one ended job per size with N `loss` points (written straight
into the store, as the loop records them); the mirror (runtime/training/mlflow_mirror.py, its
default `batch` of 5,000 points per job and pass) then makes each job's MLflow run — parameters,
tags, every point (each at its own time), the log and the curves' plot as artifacts, FINISHED —
timed from the first pass to the pass that leaves the job whole. Also timed: a pass with nothing to do, and what a launch waits for its
job's run id (`env_for`) when the run exists, and when MLflow is down (a closed port).

The server is a real `mlflow server` on 127.0.0.1 (SQLite backend, one worker, job execution
off), started from /opt/nightshift-mlflow/bin/mlflow (.ci/mlflow.sh; NIGHTSHIFT_TEST_MLFLOW names
another) unless `--url` names a running one. Nothing else is reached.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from nightshift.evals.output import write_csv

SIZES = (1_000, 10_000, 100_000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server(root: Path) -> tuple[str, subprocess.Popen]:
    binary = os.environ.get("NIGHTSHIFT_TEST_MLFLOW") or "/opt/nightshift-mlflow/bin/mlflow"
    if not Path(binary).exists():
        raise SystemExit(f"error: no MLflow server at {binary}: bash .ci/mlflow.sh, or --url URL")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    proc = subprocess.Popen(
        [binary, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        + ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
        + ["--artifacts-destination", str(root / "artifacts")],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("error: the MLflow server did not start")


def _jobs(w: Any, sizes: list[int]) -> list[int]:
    """One ended job per size, with a log and `n` loss points."""
    from nightshift.runtime.engine import job_paths
    from nightshift.runtime.store.db import Attempt, Job, MetricPoint, utcnow

    spec = {
        "name": "bench",
        "code": {"path": "."},
        "command": ["true"],
        "metrics": {"file": "metrics.jsonl", "name": "loss"},
    }
    ids = []
    for n in sizes:
        with w.store.session() as s:
            job = Job(name=f"bench-{n}", spec=spec, params={"lr": 0.01, "n": n}, owner="bench")
            job.state = "succeeded"
            s.add(job)
            s.flush()
            att = Attempt(job_id=job.id, number=1, node=w.settings.node, state="exited")
            att.outcome, att.ended_at = "succeeded", utcnow()
            s.add(att)
            s.flush()
            start = att.started_at
            s.add_all(  # read by the loop ten a second, each point at its own time
                MetricPoint(
                    attempt_id=att.id,
                    job_id=job.id,
                    step=i,
                    name="loss",
                    value=1 / i,
                    wall_time=start + timedelta(milliseconds=100 * i),
                )
                for i in range(1, n + 1)
            )
            ids.append(int(job.id))  # type: ignore[arg-type]
            folder = job_paths(w.settings, job)["workspace"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "attempt-1.log").write_text("step 1\n" * 1000)
    return ids


def measure(root: Path, url: str, sizes: list[int]) -> list[dict[str, Any]]:
    os.environ["NIGHTSHIFT_HOME"] = str(root / "home")
    os.environ["NIGHTSHIFT_TRACKING__MLFLOW__URI"] = url
    os.environ["NIGHTSHIFT_TRACKING__MLFLOW__EXPERIMENT"] = f"bench-{time.time_ns()}"
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import MlflowRun

    w = Wiring.load(None)
    mirror = w.mirror
    assert mirror is not None
    rows: list[dict[str, Any]] = []
    job_id = 0
    for n in sizes:
        (job_id,) = _jobs(w, [n])  # one at a time: a pass takes every job not yet whole
        passes, start = 0, time.perf_counter()
        while True:
            done = mirror.sync(final=True)
            passes += 1
            if done.errors:
                raise SystemExit(f"error: {done.errors[0]}")
            with w.store.session() as s:
                row = s.get(MlflowRun, job_id)
                whole = row is not None and row.synced_update is not None
            if whole or passes > n // 1000 + 5:
                break
        took = time.perf_counter() - start
        rows.append(
            {
                "benchmark": "mirror a job",
                "variant": f"{n:,} points",
                "passes": passes,
                "ms": took * 1000,
                "points_per_s": n / took,
            }
        )
    idle = []
    for _ in range(5):
        t = time.perf_counter()
        mirror.sync(final=True)
        idle.append(time.perf_counter() - t)
    rows.append(
        {
            "benchmark": "a pass",
            "variant": "nothing to do",
            "passes": 5,
            "ms": statistics.median(idle) * 1000,
            "points_per_s": "",
        }
    )
    t = time.perf_counter()
    assert mirror.env_for(job_id)
    rows.append(
        {
            "benchmark": "launch env",
            "variant": "run exists",
            "passes": 1,
            "ms": (time.perf_counter() - t) * 1000,
            "points_per_s": "",
        }
    )
    # MLflow down: a new job, a closed port, one short try (launch_wait_s) and no more.
    from nightshift.runtime.training.mlflow_mirror import Mirror

    os.environ["NIGHTSHIFT_TRACKING__MLFLOW__URI"] = f"http://127.0.0.1:{_free_port()}"
    down = Mirror(w.store, Wiring.load(None).settings)
    (new,) = _jobs(w, [1])
    waits = []
    for _ in range(3):
        t = time.perf_counter()
        assert down.env_for(new) == {}
        waits.append(time.perf_counter() - t)
    rows.append(
        {
            "benchmark": "launch env",
            "variant": "MLflow down (closed port)",
            "passes": 3,
            "ms": max(waits) * 1000,
            "points_per_s": "",
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval mlflow", description=__doc__)
    ap.add_argument("--points", type=int, nargs="+", default=list(SIZES), help="job sizes")
    ap.add_argument("--url", default=None, help="a running MLflow server (default: start one)")
    ap.add_argument("--quick", action="store_true", help="one job of 1,000 points")
    ap.add_argument("--out", default="evals/out", help="folder for the CSV (default evals/out)")
    args = ap.parse_args(argv)
    sizes = [1000] if args.quick else args.points
    saved = {k: v for k, v in os.environ.items() if k.startswith("NIGHTSHIFT_")}
    with tempfile.TemporaryDirectory(prefix="ns-mlflow-") as tmp:
        root = Path(tmp)
        url, proc = (args.url, None) if args.url else _server(root)
        try:
            rows = measure(root, url, sizes)
        finally:
            if proc is not None:
                os.killpg(proc.pid, 15)
                proc.wait(30)
            for k in [k for k in os.environ if k.startswith("NIGHTSHIFT_")]:
                del os.environ[k]
            os.environ.update(saved)
    write_csv(Path(args.out) / "mlflow.csv", rows)
    from nightshift.evals.provenance_cost import print_table

    print_table(rows, "MLflow mirror: cost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
