"""A team on one PostgreSQL store: submitters and several daemons at once, checked from outside.

    python -m nightshift.evals.team_load --url postgresql+psycopg://user@host/db
    python -m nightshift.evals.team_load --url … --submitters 4 --per-submitter 1000 --daemons 2

`--submitters` processes each queue `--per-submitter` jobs, one `submit_job` call each, through
the gate (validated, decided, audited) into the store at `--url`, while `--daemons` daemons, each
its own node (`loop.node`) with its own home and `loop.cpu_slots`, start them. Every job is a real
program that appends `job attempt node pid` to a ledger (O_APPEND, one write) and exits, so "none
run twice" is counted by the programs, not by nightshift's records. All processes sign the audit
with one key file, as a team's daemons must.

Reported: submissions per second, jobs started per node, the time until every job had run, and
the invariants — none lost (every id a submitter got back is in the store and succeeded), none
run twice (ledger), no attempt row doubled, the audit chain linear (every event's prev_hash
unique) and `audit verify` passing. The database must be empty (a fresh one per run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

WORKLOAD = """\
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
job, attempt = os.environ["NIGHTSHIFT_JOB_ID"], os.environ["NIGHTSHIFT_ATTEMPT"]
os.write(fd, ("%s %s %d\\n" % (job, attempt, os.getpid())).encode())
os.close(fd)
"""

SUBMITTER = """\
import json, sys, time
from nightshift.agent.doors.api import Client
spec, count, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = Client()
ids, start = [], time.monotonic()
for i in range(count):
    ids.append(client.submit(spec, params={"i": i, "who": who}))
print(json.dumps({"ids": ids, "seconds": time.monotonic() - start}))
"""


class Report(BaseModel):
    submitters: int
    per_submitter: int
    daemons: int
    submitted: int = 0
    submit_s: float = 0.0
    submits_per_s: float = 0.0
    started_by_node: dict[str, int] = {}
    all_ran_s: float = 0.0
    jobs_lost: int = 0
    not_succeeded: int = 0
    launches: int = 0
    launches_doubled: int = 0
    attempt_rows_doubled: int = 0
    audit_events: int = 0
    audit_forks: int = 0
    audit_ok: bool = False
    audit_output: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.jobs_lost == 0
            and self.not_succeeded == 0
            and self.launches_doubled == 0
            and self.attempt_rows_doubled == 0
            and self.audit_forks == 0
            and self.audit_ok
        )


def run(
    url: str,
    workdir: Path,
    *,
    submitters: int = 4,
    per_submitter: int = 1000,
    daemons: int = 2,
    cpu_slots: int = 8,
    timeout_s: float = 1800,
    say: Callable[[str], None] = lambda s: None,
) -> Report:
    report = Report(submitters=submitters, per_submitter=per_submitter, daemons=daemons)
    work, ledger, key = workdir / "work", workdir / "ledger.txt", workdir / "audit.key"
    work.mkdir(parents=True, exist_ok=True)
    (work / "work.py").write_text(WORKLOAD)
    spec = work / "job.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "team-load",
                "code": {"path": str(work)},
                "command": ["{python}", "work.py", str(ledger)],
                "parameters": {"i": 0, "who": ""},
                "resources": {"gpus": 0, "expected_duration_min": 1},
            }
        )
    )

    def env(home: Path, node: str | None = None) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        out = {
            **os.environ,
            "NIGHTSHIFT_HOME": str(home),
            "NIGHTSHIFT_STORE__URL": url,
            "NIGHTSHIFT_AUDIT__KEY_FILE": str(key),
            "NIGHTSHIFT_GPU__PROBE": "none",
            "NIGHTSHIFT_LOOP__CPU_SLOTS": str(cpu_slots),
            "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.2",
            "NIGHTSHIFT_API__SERVE": "false",
            "NIGHTSHIFT_CHANNELS__LISTEN": "null",
        }
        if node is not None:
            out["NIGHTSHIFT_LOOP__NODE"] = node
        return out

    # The store and the key exist before anyone races to make them.
    first = subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "audit", "verify"],
        env=env(workdir / "setup"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if first.returncode != 0:
        raise RuntimeError(f"cannot open the store at {url}: {first.stdout}{first.stderr}")
    nodes = [f"node-{chr(ord('a') + i)}" for i in range(daemons)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
            env=env(workdir / n, n),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in nodes
    ]
    try:
        start = time.monotonic()
        subs = [
            subprocess.Popen(
                [sys.executable, "-c", SUBMITTER, str(spec), str(per_submitter), f"s{i}"],
                env=env(workdir / f"submitter-{i}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(submitters)
        ]
        ids: list[int] = []
        for sub in subs:
            out, err = sub.communicate(timeout=timeout_s)
            if sub.returncode != 0:
                raise RuntimeError(f"a submitter failed: {err[-2000:]}")
            ids += json.loads(out.strip().splitlines()[-1])["ids"]
        report.submit_s = round(time.monotonic() - start, 2)
        report.submitted = len(ids)
        report.submits_per_s = round(len(ids) / report.submit_s, 1)
        say(f"{len(ids)} submitted in {report.submit_s} s")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = _states(url)
            left = sum(1 for j in ids if states.get(j) not in ("succeeded", "failed", "cancelled"))
            if not left:
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                err = dead[0].stderr.read().decode() if dead[0].stderr else ""
                raise RuntimeError(f"a daemon exited: {err[-2000:]}")
            time.sleep(0.5)
        report.all_ran_s = round(time.monotonic() - start, 2)
    finally:
        for d in procs:
            d.terminate()
        for d in procs:
            try:
                d.wait(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
    states = _states(url)
    report.jobs_lost = sum(1 for j in ids if j not in states)
    report.not_succeeded = sum(1 for j in ids if states.get(j) != "succeeded")
    lines = [x.split() for x in ledger.read_text().splitlines()] if ledger.exists() else []
    starts = Counter((x[0], x[1]) for x in lines)
    report.launches = len(lines)
    report.launches_doubled = sum(n - 1 for n in starts.values() if n > 1)
    facts = _facts(url)
    report.started_by_node = facts.pop("by_node")
    report.attempt_rows_doubled = facts["attempt_rows_doubled"]
    report.audit_events, report.audit_forks = facts["events"], facts["forks"]
    verify = subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "audit", "verify"],
        env=env(workdir / nodes[0], nodes[0]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report.audit_ok = verify.returncode == 0
    report.audit_output = (verify.stdout + verify.stderr).strip()[-500:]
    return report


def _engine(url: str) -> Any:
    from sqlalchemy import create_engine

    return create_engine(url)


def _states(url: str) -> dict[int, str]:
    from sqlalchemy import text

    eng = _engine(url)
    try:
        with eng.connect() as c:
            return {int(i): s for i, s in c.execute(text("select id, state from job"))}
    finally:
        eng.dispose()


def _facts(url: str) -> dict[str, Any]:
    from sqlalchemy import text

    eng = _engine(url)
    try:
        with eng.connect() as c:
            doubled = c.execute(
                text(
                    "select count(*) from (select job_id, number from attempt "
                    "group by job_id, number having count(*) > 1) d"
                )
            ).scalar_one()
            events = c.execute(text("select count(*) from auditevent")).scalar_one()
            forks = c.execute(
                text(
                    "select count(*) from (select prev_hash from auditevent "
                    "group by prev_hash having count(*) > 1) f"
                )
            ).scalar_one()
            by_node = dict(
                c.execute(text("select node, count(*) from attempt group by node")).all()
            )
        return {
            "attempt_rows_doubled": int(doubled),
            "events": int(events),
            "forks": int(forks),
            "by_node": by_node,
        }
    finally:
        eng.dispose()


def _print(r: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"team load: {r.submitters} submitters × {r.per_submitter}, {r.daemons} daemons"
    )
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("goal", justify="right")
    rows: list[tuple[str, Any, str]] = [
        ("jobs submitted", r.submitted, f"{r.submitters * r.per_submitter}"),
        ("submissions per second (all submitters)", r.submits_per_s, ""),
        (
            "started, by node",
            ", ".join(f"{k} {v}" for k, v in sorted(r.started_by_node.items())),
            "",
        ),
        ("until every job had run", f"{r.all_ran_s} s", ""),
        ("jobs lost", r.jobs_lost, "0"),
        ("jobs not succeeded", r.not_succeeded, "0"),
        ("launches (ledger) / doubled", f"{r.launches} / {r.launches_doubled}", "— / 0"),
        ("attempt rows doubled", r.attempt_rows_doubled, "0"),
        ("audit events / forks in the chain", f"{r.audit_events} / {r.audit_forks}", "— / 0"),
        ("audit verify", "ok" if r.audit_ok else "FAILED", "ok"),
    ]
    for name, value, goal in rows:
        t.add_row(name, str(value), goal)
    Console().print(t)
    if not r.audit_ok:
        print(r.audit_output)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="an empty PostgreSQL database (SQLAlchemy URL)")
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--per-submitter", type=int, default=1000)
    ap.add_argument("--daemons", type=int, default=2)
    ap.add_argument("--cpu-slots", type=int, default=8, help="jobs each daemon runs at once")
    ap.add_argument("--json", help="also write the report here")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nightshift-team-") as tmp:
        report = run(
            ns.url,
            Path(tmp),
            submitters=ns.submitters,
            per_submitter=ns.per_submitter,
            daemons=ns.daemons,
            cpu_slots=ns.cpu_slots,
            say=print,
        )
    _print(report)
    if ns.json:
        Path(ns.json).write_text(report.model_dump_json(indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
