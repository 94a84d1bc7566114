"""Crash consistency: SIGKILL the daemon at random moments and between every two steps of a
launch, race `nightshift run` against a daemon started later, and check from outside that no
attempt ever ran twice and no job was lost.

    python -m nightshift.evals.crash_consistency                  # 120 random kills, the long form
    python -m nightshift.evals.crash_consistency --kills 20       # what CI runs (tests/)
    python -m nightshift.evals.crash_consistency --json out.json

The workload is a real program that appends `job attempt pid start|end time` to a ledger file
(O_APPEND, one write per line) when it starts and ends, so "one process per attempt" is checked by
the programs themselves, not by nightshift's own records. Phases, in one fresh NIGHTSHIFT_HOME:

1. random: start `nightshift daemon`, wait until it holds its lock, SIGKILL it after a random
   0-`--max-life-s` s; again, `--kills` times, topping up the queue as jobs finish;
2. targeted: for each point of runtime/executors/crashpoints.py, a daemon started with NIGHTSHIFT_CRASH_AT
   dies there (the supervisor's own point kills one supervisor, then the daemon is killed too);
3. race: `nightshift run GOAL` trains a job whose first attempt SIGKILLs itself (retryable); a
   daemon is started while that attempt runs, so both loops see attempt 2 become placeable at
   about the same moment;
4. settle: one daemon runs until every job is terminal.

Invariants: each (job, attempt) started at most once by the ledger (launches doubled: goal 0), no
two attempt rows with one number, every submitted job present and terminal, no workload process
left, and `nightshift audit verify` passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nightshift.runtime.executors import crashpoints

WORKLOAD = """\
import os, sys, time
ledger, sleep_s = sys.argv[1], float(sys.argv[2])
fail_first = sys.argv[3] == "1"
job, attempt = os.environ["NIGHTSHIFT_JOB_ID"], os.environ["NIGHTSHIFT_ATTEMPT"]
def note(what):
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{job} {attempt} {os.getpid()} {what} {time.time():.6f}\\n".encode())
    os.close(fd)
note("start")
end = time.time() + sleep_s
while time.time() < end:
    print("working", flush=True)
    time.sleep(0.05)
if fail_first and attempt == "1":
    note("fail")
    os.kill(os.getpid(), 9)  # "killed": retryable, so the goal's recovery requeues attempt 2
note("end")
"""

TERMINAL = ("succeeded", "failed", "cancelled")
BATCH = 12  # jobs submitted whenever fewer than half a batch wait


class Report(BaseModel):
    kills_random: int = 0
    kills_before_ready: int = 0
    targeted: dict[str, str] = {}  # point -> "crashed" | "not reached"
    races: int = 0
    races_failed: int = 0  # a `nightshift run` that did not exit 0 (its job did not succeed)
    jobs: int = 0
    attempts: int = 0
    launches: int = 0
    launches_doubled: int = 0
    attempt_rows_doubled: int = 0
    jobs_lost: int = 0
    not_terminal: int = 0
    states: dict[str, int] = {}
    leftover_processes: int = 0
    audit_ok: bool = False
    audit_output: str = ""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.launches_doubled == 0
            and self.attempt_rows_doubled == 0
            and self.races_failed == 0
            and all(v == "crashed" for v in self.targeted.values())
            and self.jobs_lost == 0
            and self.not_terminal == 0
            and self.leftover_processes == 0
            and self.audit_ok
        )


class Harness:
    """One home, its workload, its daemons; everything through the CLI and the store file."""

    def __init__(self, home: Path, *, seed: int, say: Callable[[str], None] = lambda s: None):
        self.home = home
        self.rng = random.Random(seed)
        self.say = say
        self.db = home / "nightshift.db"
        self.ledger = home / "ledger.txt"
        self.work = home / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "work.py").write_text(WORKLOAD)
        self.submitted: list[int] = []
        self.batches = 0

    # ------------------------------------------------------------------ processes
    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("NIGHTSHIFT_") and ("__" in k or k.startswith("NIGHTSHIFT_CRASH")))
        }
        env.update(
            {
                "NIGHTSHIFT_HOME": str(self.home),
                "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.05",
                "NIGHTSHIFT_LOOP__CPU_SLOTS": "4",
                "NIGHTSHIFT_RETRY__BASE_S": "0.5",
                "COLUMNS": "200",
            }
        )
        env.update(extra)
        return env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nightshift.agent.doors.cli", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def daemon(self, **extra: str) -> subprocess.Popen[bytes]:
        with (self.home / "daemons.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
                env=self.env(**extra),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> bool:
        """Until the daemon holds its lock (its pid in the lock file); False if it died first."""
        lock = self.home / "daemon.lock"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                return False
            try:
                if lock.read_text().strip() == str(proc.pid):
                    return True
            except OSError:
                pass
            time.sleep(0.01)
        raise AssertionError("the daemon did not take its lock within a minute")

    @classmethod
    def stop(cls, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM, as an operator stops a daemon; SIGKILL if it has not ended in 30 s."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            cls.kill(proc)

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    # ------------------------------------------------------------------ work
    def spec(self, name: str, sleep_s: float, fail_first: bool = False) -> Path:
        path = self.work / f"{name}.yaml"
        spec = {
            "name": name,
            "code": {"path": str(self.work)},
            "command": ["{python}", "work.py", str(self.ledger), "{sleep}", "{fail_first}"],
            "parameters": {"sleep": sleep_s, "fail_first": int(fail_first), "i": 0},
            "resources": {"gpus": 0, "expected_duration_min": 1},
            "retries": 5,
            "retry_wait_s": 0.5,
        }
        path.write_text(json.dumps(spec))  # JSON is YAML
        return path

    def queued(self) -> int:
        if not self.db.exists():
            return 0
        with sqlite3.connect(self.db, timeout=30) as c:
            return int(c.execute("select count(*) from job where state='queued'").fetchone()[0])

    def top_up(self) -> None:
        """Keep work waiting, so that every daemon has launches to be killed in."""
        if self.queued() >= BATCH // 2:
            return
        spec = self.spec("crash", sleep_s=0.3)
        items = [
            {"spec_path": str(spec), "params": {"i": self.batches * BATCH + k}}
            for k in range(BATCH)
        ]
        code = (
            "import json, sys\n"
            "from nightshift.agent.doors.api import Client\n"
            "items = json.loads(sys.argv[1])\n"
            "print(json.dumps(Client().submit_many(items, call_id=sys.argv[2])))\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", code, json.dumps(items), f"crash-batch-{self.batches}"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode != 0:
            raise AssertionError(f"submitting a batch failed: {res.stdout}{res.stderr}")
        self.submitted += json.loads(res.stdout.strip().splitlines()[-1])
        self.batches += 1

    # ------------------------------------------------------------------ phases
    def random_kills(self, kills: int, max_life_s: float, report: Report) -> None:
        for k in range(kills):
            self.top_up()
            proc = self.daemon()
            if not self.wait_ready(proc):
                report.kills_before_ready += 1
            time.sleep(self.rng.uniform(0, max_life_s))
            self.kill(proc)
            report.kills_random += 1
            self.say(f"random kill {k + 1}/{kills}")

    def targeted_kills(self, report: Report, timeout_s: float = 20) -> None:
        for point in crashpoints.POINTS:
            self.top_up()
            once = self.home / f"crashed-at-{point}"
            proc = self.daemon(
                **{crashpoints.ENV: point, crashpoints.ONCE_ENV: str(once)},
            )
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and proc.poll() is None and not once.exists():
                time.sleep(0.01)
            if once.exists() and proc.poll() is None:
                time.sleep(0.3)  # the supervisor died; let the daemon notice, then kill it too
            self.kill(proc)
            report.targeted[point] = "crashed" if once.exists() else "not reached"
            self.say(f"targeted kill at {point}: {report.targeted[point]}")

    def race(self, trials: int, report: Report) -> None:
        for t in range(trials):
            goal = self.work / f"race-{t}-goal.yaml"  # not the spec's own file
            spec = self.spec(f"race-{t}", sleep_s=0.8, fail_first=True)
            goal.write_text(json.dumps({"name": f"race-{t}", "goal": "train", "spec": str(spec)}))
            before = set(self._job_ids())
            with (self.home / f"race-{t}.log").open("wb") as log:
                run = subprocess.Popen(
                    [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
                    env=self.env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            # Start the daemon while attempt 1 runs; it is ready (~2 s) about when attempt 1 has
            # failed and its retry wait is over, so both loops may place attempt 2.
            job = self._wait_new_job(before, run)
            time.sleep(self.rng.uniform(0, 0.6))
            d = self.daemon()
            try:
                run.wait(timeout=180)
            finally:
                self.stop(d)
            if job is not None:
                self.submitted.append(job)
            report.races += 1
            report.races_failed += run.returncode != 0
            self.say(f"race {t + 1}/{trials}: run exited {run.returncode}")

    def settle(self, timeout_s: float = 240) -> None:
        proc = self.daemon()
        end = time.monotonic() + timeout_s
        try:
            while time.monotonic() < end:
                states = self._states()
                if self.submitted and all(states.get(j) in TERMINAL for j in self.submitted):
                    return
                time.sleep(0.2)
        finally:
            self.stop(proc)

    # ------------------------------------------------------------------ checks
    def check(self, report: Report) -> None:
        states = self._states()
        report.jobs = len(states)
        report.jobs_lost = len([j for j in self.submitted if j not in states])
        report.not_terminal = len([j for j in self.submitted if states.get(j) not in TERMINAL])
        report.states = dict(Counter(states.values()))
        with sqlite3.connect(self.db, timeout=30) as c:
            report.attempts = int(c.execute("select count(*) from attempt").fetchone()[0])
            report.attempt_rows_doubled = int(
                c.execute(
                    "select count(*) from (select job_id, number from attempt "
                    "group by job_id, number having count(*) > 1)"
                ).fetchone()[0]
            )
        starts = Counter(
            (line.split()[0], line.split()[1])
            for line in self.ledger.read_text().splitlines()
            if line.split()[3] == "start"
        )
        report.launches = sum(starts.values())
        report.launches_doubled = sum(n - 1 for n in starts.values() if n > 1)
        report.leftover_processes = self._stop_leftovers()
        res = self.cli("audit", "verify")
        report.audit_ok = res.returncode == 0
        report.audit_output = (res.stdout + res.stderr).strip()[-500:]

    def _job_ids(self) -> list[int]:
        return list(self._states())

    def _states(self) -> dict[int, str]:
        if not self.db.exists():
            return {}
        try:
            with sqlite3.connect(self.db, timeout=30) as c:
                return dict(c.execute("select id, state from job").fetchall())
        except sqlite3.OperationalError:
            return {}

    def _wait_new_job(self, before: set[int], run: subprocess.Popen[bytes]) -> int | None:
        end = time.monotonic() + 60
        while time.monotonic() < end and run.poll() is None:
            new = set(self._job_ids()) - before
            if new:
                return max(new)
            time.sleep(0.02)
        return None

    def _stop_leftovers(self) -> int:
        """Workload processes still running after everything settled (goal: none); stopped."""
        import psutil

        left = 0
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmd = proc.info["cmdline"] or []
                if str(self.ledger) in cmd and proc.environ().get("NIGHTSHIFT_HOME") == str(
                    self.home
                ):
                    left += 1
                    proc.kill()
            except (psutil.Error, OSError):
                continue
        return left


def run(
    home: Path,
    *,
    kills: int,
    races: int,
    seed: int = 0,
    max_life_s: float = 1.0,
    targeted: bool = True,
    say: Callable[[str], None] = lambda s: None,
) -> Report:
    """All four phases in `home`; the report says what happened and whether the invariants hold."""
    start = time.monotonic()
    h = Harness(home, seed=seed, say=say)
    report = Report()
    h.random_kills(kills, max_life_s, report)
    if targeted:
        h.targeted_kills(report)
    h.race(races, report)
    h.settle()
    h.check(report)
    report.wall_s = round(time.monotonic() - start, 1)
    return report


def _print(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="crash consistency")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    reached = sum(v == "crashed" for v in report.targeted.values())
    rows: list[tuple[str, Any, str]] = [
        ("daemon SIGKILLs at random moments", report.kills_random, ""),
        ("  of them before it held its lock", report.kills_before_ready, ""),
        ("targeted kills (points reached / points)", f"{reached}/{len(report.targeted)}", "all"),
        ("run + daemon races", report.races, ""),
        ("  of them whose `nightshift run` failed", report.races_failed, "0"),
        (
            "jobs / attempts / launches (ledger)",
            f"{report.jobs} / {report.attempts} / {report.launches}",
            "",
        ),
        ("launches doubled (ledger)", report.launches_doubled, "0"),
        ("attempt rows doubled", report.attempt_rows_doubled, "0"),
        ("jobs lost", report.jobs_lost, "0"),
        ("jobs not terminal", report.not_terminal, "0"),
        ("workload processes left", report.leftover_processes, "0"),
        ("audit verify", "ok" if report.audit_ok else "FAILED", "ok"),
        ("final states", ", ".join(f"{k} {v}" for k, v in sorted(report.states.items())), ""),
        ("wall time", f"{report.wall_s} s", ""),
    ]
    for name, value, goal in rows:
        table.add_row(name, str(value), goal)
    Console().print(table)
    for point, what in report.targeted.items():
        print(f"  {point}: {what}")
    if not report.audit_ok:
        print(report.audit_output)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=120, help="random SIGKILLs of the daemon")
    ap.add_argument("--races", type=int, default=4, help="`nightshift run` + daemon races")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-life-s", type=float, default=1.0, help="longest a daemon lives")
    ap.add_argument("--json", help="also write the report here")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nightshift-crash-") as tmp:
        report = run(
            Path(tmp),
            kills=ns.kills,
            races=ns.races,
            seed=ns.seed,
            max_life_s=ns.max_life_s,
            say=lambda s: print(s, file=sys.stderr, flush=True),
        )
    _print(report)
    if ns.json:
        Path(ns.json).write_text(report.model_dump_json(indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
