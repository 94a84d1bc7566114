"""Page times of the web dashboard (issue 30) with 1,000 jobs in the store.

    python -m nightshift.evals.dashboard_pages                  # 1,000 jobs, 20 requests a page
    python -m nightshift.evals.dashboard_pages --jobs 1000 10000 --requests 20 --csv out.csv

The store is metrics_scrape's (N jobs in every state, an attempt per started job, a week of GPU
readings, 50 pending approvals); one job of the signed-in user gets 2,000 metric points and a
200-line log, and another of theirs 1,000 loss points to compare it with. The app is served on 127.0.0.1 as the daemon serves it, and each request is a GET
over HTTP with the session cookie, signed in through a token as a browser is: every page checks
the token and asks the gate (an audited decision) as it would for a person. Printed per page:
the median and worst of `--requests` requests after one warm-up, and the answer's size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from nightshift.evals.metrics_scrape import build
from nightshift.evals.output import write_csv

USER = "alice"


def measure(jobs: int, requests: int) -> list[dict[str, object]]:
    from sqlmodel import col, select

    from nightshift.agent.doors.web import tokens
    from nightshift.agent.doors.web.dashboard import COOKIE, Dashboard
    from nightshift.agent.doors.web.server import WebServer
    from nightshift.runtime.engine import job_paths
    from nightshift.runtime.store.db import Attempt, Job, MetricPoint

    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp), jobs)
        with w.store.session() as s:  # the followed job: the user's, a valid spec, a log
            att = s.exec(
                select(Attempt).where(col(Attempt.ended_at).is_not(None)).order_by(col(Attempt.id))
            ).first()
            assert att is not None and att.id is not None
            job = s.get(Job, att.job_id)
            assert job is not None and job.id is not None
            job.owner = USER
            job.spec = {"name": job.name, "command": ["python", "-c", "pass"]}
            s.add(job)
            log = job_paths(w.settings, job)["workspace"] / "attempt-1.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(f"step {i} loss {1 / (i + 1):.4f}\n" for i in range(200)))
            att.log_path = str(log)
            s.add(att)
            s.add_all(
                MetricPoint(attempt_id=att.id, job_id=job.id, step=i, name=n, value=1 / (i + 1))
                for i in range(1000)
                for n in ("loss", "lr")
            )
            other = s.exec(  # the compared one: another ended attempt's job, also the user's
                select(Attempt)
                .where(col(Attempt.ended_at).is_not(None), col(Attempt.job_id) != job.id)
                .order_by(col(Attempt.id))
            ).first()
            assert other is not None and other.id is not None
            job2 = s.get(Job, other.job_id)
            assert job2 is not None and job2.id is not None
            job2.owner = USER
            job2.spec = {"name": job2.name, "command": ["python", "-c", "pass"]}
            s.add(job2)
            s.add_all(
                MetricPoint(
                    attempt_id=other.id, job_id=job2.id, step=i, name="loss", value=2 / (i + 1)
                )
                for i in range(1000)
            )
            s.commit()
            job_id, job2_id = job.id, job2.id
        secret = tokens.issue(w.store, USER).secret
        server = WebServer("127.0.0.1:0", {}, print, dashboard=Dashboard(w))
        server.start()
        pages = {
            "jobs list": "/",
            "jobs, state=failed": "/?state=failed",
            "jobs, name filter": "/?name=job-99",
            "job page": f"/jobs/{job_id}",
            "log tail (JSON)": f"/jobs/{job_id}/log.json",
            "metric curves (JSON)": f"/jobs/{job_id}/metrics.json",
            "approvals (50 pending)": "/approvals",
            "night (Gantt, 24 h)": "/gantt",
            "compare (2 jobs, 1,000 points each)": f"/compare?jobs={job_id},{job2_id}",
            "morning report (24 h)": "/report",
            "submit form": "/submit",
        }
        try:
            with httpx.Client(
                base_url=server.address, timeout=30, cookies={COOKIE: secret}
            ) as client:
                for name, path in pages.items():
                    times, size = [], 0
                    for _ in range(requests + 1):
                        t = time.perf_counter()
                        r = client.get(path)
                        times.append(time.perf_counter() - t)
                        assert r.status_code == 200, (path, r.status_code, r.text[:300])
                        size = len(r.content)
                    rest = times[1:]
                    out.append(
                        {
                            "jobs": jobs,
                            "page": name,
                            "median_ms": round(statistics.median(rest) * 1000, 1),
                            "worst_ms": round(max(rest) * 1000, 1),
                            "bytes": size,
                        }
                    )
        finally:
            server.stop()
        w.store.engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[1000])
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--csv", type=Path)
    args = p.parse_args(argv)
    rows = [r for n in args.jobs for r in measure(n, args.requests)]
    print("| jobs | page | median (ms) | worst (ms) | answer bytes |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['jobs']:,} | {r['page']} | {r['median_ms']} | {r['worst_ms']} | {r['bytes']:,} |"
        )
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
