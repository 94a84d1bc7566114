"""Scrape time of the daemon's /metrics (issue 30) against a store of 1,000 and 10,000 jobs.

    python -m nightshift.evals.metrics_scrape                 # 1,000 and 10,000 jobs
    python -m nightshift.evals.metrics_scrape --jobs 1000 --scrapes 20 --csv evals/out/scrape.csv

Each store is a fresh SQLite home: N jobs (70 % finished, 10 % failed with a diagnosed cause,
10 % queued, 5 % running, 5 % held), one attempt per job that started (energy on the ended
ones), 8 GPUs with a week of health readings each (one every 10 minutes: 8,064 rows), 50 pending
approvals and a tariff (so the cost is priced too). The app is served on 127.0.0.1 as the daemon
serves it; each scrape is a GET /metrics over HTTP with the scrape cache cleared, so every one
reads the store. Printed: rows, the first scrape (prices every ended attempt once), then the
median and worst of the rest, and the answer's size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

from nightshift.evals.output import write_csv

CAUSES = ["cuda_oom", "nan_loss", "nccl_or_distributed", "preempted", "stalled"]


def build(home: Path, jobs: int):
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.config import Settings
    from nightshift.runtime.store.db import Approval, Attempt, GpuSample, Job, utcnow

    settings = Settings.model_validate(
        {
            "home": str(home),
            "gpu": {"probe": "none"},
            "tariff": {
                "timezone": "UTC",
                "currency": "EUR",
                "windows": [],
                "default_price_per_kwh": 0.3,
            },
        }
    )
    w = Wiring(settings, server=True)
    now = utcnow()
    with w.store.session() as s:
        rows = []
        for i in range(jobs):
            r = i % 20
            state = (
                "succeeded" if r < 14 else "failed" if r < 16 else "queued" if r < 18 else
                "running" if r < 19 else "held"
            )  # fmt: skip
            rows.append(
                Job(
                    name=f"job-{i}",
                    spec={},
                    state=state,
                    created_at=now - timedelta(minutes=jobs - i),
                )
            )
        s.add_all(rows)
        s.flush()
        for i, job in enumerate(rows):
            assert job.id is not None
            if job.state in ("queued", "held"):
                continue
            ended = job.state in ("succeeded", "failed")
            start = job.created_at + timedelta(minutes=1)
            s.add(
                Attempt(
                    job_id=job.id,
                    number=1,
                    state="exited" if ended else "running",
                    outcome=job.state if ended else None,
                    cause=CAUSES[i % len(CAUSES)] if job.state == "failed" else None,
                    gpus=[i % 8],
                    started_at=start,
                    ended_at=start + timedelta(minutes=30) if ended else None,
                    energy_kwh=0.2 if ended else None,
                    node=settings.node,
                )
            )
        for k in range(7 * 24 * 6):
            taken = now - timedelta(minutes=10 * k)
            for g in range(8):
                s.add(
                    GpuSample(
                        host=settings.node,
                        gpu_index=g,
                        uuid=f"GPU-{g}",
                        verdict="OK",
                        source="none",
                        taken_at=taken,
                        data={
                            "utilization_pct": 40 + g,
                            "memory_used_mib": 1000 * g,
                            "memory_total_mib": 81559,
                            "temperature_c": 50,
                            "power_w": 300.0,
                            "pci_bus_id": f"00000000:{g:02x}:00.0",
                        },
                    )
                )
        for a in range(50):
            s.add(Approval(call_id=f"call-{a}", skill="cancel_job", requester="agent", rule="r"))
    return w


def measure(jobs: int, scrapes: int) -> dict[str, object]:
    from nightshift.agent.doors.web.metrics import Metrics
    from nightshift.agent.doors.web.server import WebServer

    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp), jobs)
        cost_of, currency = w.energy_pricing()
        metrics = Metrics(w.store, w.settings, cost_of=cost_of, currency=currency)
        server = WebServer("127.0.0.1:0", {}, print, metrics=metrics)
        server.start()
        try:
            with httpx.Client(base_url=server.address, timeout=30) as client:
                times = []
                size = 0
                for _ in range(scrapes + 1):
                    metrics._cached = None
                    t = time.perf_counter()
                    r = client.get("/metrics")
                    times.append(time.perf_counter() - t)
                    assert r.status_code == 200, r.text
                    size = len(r.content)
        finally:
            server.stop()
        w.store.engine.dispose()
    rest = times[1:]
    return {
        "jobs": jobs,
        "first_ms": round(times[0] * 1000, 1),
        "median_ms": round(statistics.median(rest) * 1000, 1),
        "worst_ms": round(max(rest) * 1000, 1),
        "bytes": size,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--csv", type=Path)
    args = p.parse_args(argv)
    rows = [measure(n, args.scrapes) for n in args.jobs]
    print("| jobs | first scrape (ms) | median (ms) | worst (ms) | answer bytes |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['jobs']:,} | {r['first_ms']} | {r['median_ms']} | {r['worst_ms']} | "
            f"{r['bytes']:,} |"
        )
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
