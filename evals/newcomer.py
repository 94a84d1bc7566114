"""A newcomer's first day, timed and checked from outside: README's first command on a fresh clone
and a fresh home, then the day a researcher has with nightshift.

    nightshift eval newcomer                 # clones this repository's HEAD, installs, walks the day
    nightshift eval newcomer --skip-install  # the day only, with the nightshift already installed

Each step runs the `nightshift` command a user types, as a new process with the fresh home, and
asserts what the user sees (the exit code, a line of the output) and what is true on disk (the
job's own output file, the store's rows read with sqlite3): nothing is taken from nightshift's
own reports. The day:

 1. README's first command (`pip install …` and the quickstart), run as README writes it;
 2. the daemon started, as a user starts it in a second terminal;
 3. a plain command submitted with `--watch` fails (its input file is missing): exit 6;
 4. `nightshift why JOB` says why (file_missing, the log line);
 5. the file put in place, `nightshift retry JOB`, and `nightshift logs JOB -f` follows it to
    success: exit 0, and the program's own output file exists;
 6. a running plain command (no checkpoint) cannot be held: the refusal says why and what to do;
    a job waiting for 23:59 is held and released;
 7. one's own jobs cancelled from a script (`cancel --yes`, no terminal): exit 0, cancelled.

Prints a table of the steps with their seconds and whether each held; writes it as CSV.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nightshift.evals.output import write_csv

# The program of the day: it reads its settings, trains a few steps (printing step and loss, as
# `submit -- CMD` reads them) and writes its result where the user can see it.
TRAIN = """\
import json, sys, time
settings = json.load(open("settings.json"))  # the file the newcomer forgot
for step in range(1, settings["steps"] + 1):
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(settings["pause_s"])
open("result.txt", "w").write("trained\\n")
"""
LONG = """\
import time
for step in range(1, 100000):
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.5)
"""


@dataclass
class Step:
    what: str
    seconds: float
    held: bool
    detail: str = ""


class Day:
    def __init__(self, repo: Path, home: Path, bin_dir: Path | None) -> None:
        self.repo, self.home, self.work = repo, home, home / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        path = os.environ.get("PATH", "/usr/bin:/bin")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")},
            "HOME": str(home),
            "PATH": f"{bin_dir}:{path}" if bin_dir else path,
            "COLUMNS": "200",
        }
        self.env.pop("VIRTUAL_ENV", None)
        self.steps: list[Step] = []
        self.daemon: subprocess.Popen[bytes] | None = None

    def ns(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nightshift", *args],
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def record(self, what: str, t0: float, held: bool, detail: str = "") -> None:
        self.steps.append(Step(what, round(time.perf_counter() - t0, 2), held, detail[:160]))

    def state(self, job_id: int) -> str | None:
        db = self.home / ".nightshift" / "nightshift.db"
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("select state from job where id = ?", (job_id,)).fetchone()
        finally:
            con.close()
        return None if row is None else str(row[0])

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 120) -> str | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.2)
        return self.state(job_id)


def _job_id(r: subprocess.CompletedProcess[str]) -> int:
    """The job id a submit printed ("queued job(s) 3", "job 3 …"); 0 when none."""
    m = re.search(r"job(?:\(s\))? (\d+)", r.stdout + r.stderr)
    return int(m.group(1)) if m else 0


def readme_first_command(readme: Path) -> str:
    """The first command of README's "Two commands" block, as a user copies it."""
    block = readme.read_text().split("## Two commands", 1)[1].split("```bash", 1)[1]
    lines = [ln for ln in block.split("```", 1)[0].splitlines() if ln and not ln.startswith("#")]
    return lines[0]


def install(day: Day) -> None:
    line = readme_first_command(day.repo / "README.md")
    t0 = time.perf_counter()
    # README's line is a shell line (venv, activate, pip, the quickstart): run it as a user's
    # shell does. It is this repository's own text, never input from anyone.
    r = subprocess.run(
        ["bash", "-c", line],
        cwd=day.repo,
        env=day.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    held = r.returncode == 0 and "steps lost" in r.stdout
    day.record("README's first command (install + quickstart)", t0, held, r.stderr[-300:])
    if not held:
        raise SystemExit(f"README's first command failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")


def walk(day: Day) -> None:
    (day.work / "train.py").write_text(TRAIN)
    (day.work / "long.py").write_text(LONG)
    t0 = time.perf_counter()
    day.daemon = subprocess.Popen(
        ["nightshift", "daemon"],
        cwd=day.work,
        env=day.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The user waits for nothing: the daemon takes the queue when it is up.
    day.record("daemon started", t0, day.daemon.poll() is None)

    t0 = time.perf_counter()
    r = day.ns("submit", "--watch", "--", "python", "train.py")
    job = _job_id(r)
    day.record(
        "submit --watch a plain command that fails (exit 6)",
        t0,
        r.returncode == 6 and "settings.json" in r.stdout,
        f"exit {r.returncode}",
    )

    t0 = time.perf_counter()
    r = day.ns("why", str(job))
    day.record(
        "why JOB names the cause and the line",
        t0,
        r.returncode == 0 and "file_missing" in r.stdout and "line" in r.stdout,
        r.stdout.strip().splitlines()[1] if r.stdout.count("\n") > 1 else r.stdout,
    )

    (day.work / "settings.json").write_text('{"steps": 20, "pause_s": 0.1}')
    t0 = time.perf_counter()
    r = day.ns("retry", str(job))
    follow = day.ns("logs", str(job), "-f")
    day.record(
        "fix, retry JOB, logs JOB -f to success (exit 0)",
        t0,
        r.returncode == 0
        and follow.returncode == 0
        and "attempt 2" in follow.stdout
        and (day.work / "result.txt").exists(),
        f"retry exit {r.returncode}, follow exit {follow.returncode}",
    )

    t0 = time.perf_counter()
    long_job = _job_id(day.ns("submit", "--", "python", "long.py"))
    running = day.wait_state(long_job, ("running",)) == "running"
    refused = day.ns("hold", str(long_job))
    day.record(
        "hold a running plain command: refused, saying why and what to do",
        t0,
        running
        and refused.returncode != 0
        and "no checkpoint" in refused.stderr
        and "Traceback" not in refused.stderr
        and day.state(long_job) == "running",
        refused.stderr.strip()[-120:],
    )

    t0 = time.perf_counter()
    later = _job_id(day.ns("submit", "--at", "23:59", "--", "python", "train.py"))
    held = day.ns("hold", str(later))
    is_held = day.wait_state(later, ("held",), timeout=30) == "held"
    released = day.ns("release", str(later))
    queued = day.wait_state(later, ("queued",), timeout=30) == "queued"
    day.record(
        "hold a waiting job, release it: queued again",
        t0,
        held.returncode == 0 and is_held and released.returncode == 0 and queued,
        f"hold exit {held.returncode}, release exit {released.returncode}",
    )

    t0 = time.perf_counter()
    r = day.ns("cancel", str(long_job), "--yes")
    cancelled = day.wait_state(long_job, ("cancelled",)) == "cancelled"
    gone = day.ns("cancel", str(later), "--yes")
    day.record(
        "cancel one's own jobs from a script (--yes, no terminal)",
        t0,
        r.returncode == 0
        and cancelled
        and gone.returncode == 0
        and day.wait_state(later, ("cancelled",)) == "cancelled",
        f"exit {r.returncode}, {gone.returncode}",
    )

    t0 = time.perf_counter()
    r = day.ns("jobs")
    day.record(
        "jobs lists the day",
        t0,
        r.returncode == 0 and "cancelled" in r.stdout and "succeeded" in r.stdout,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="nightshift eval newcomer", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--repo", default=".", help="the repository to clone (its committed HEAD)")
    ap.add_argument(
        "--skip-install",
        action="store_true",
        help="use the nightshift on PATH; do not clone or run README's first command",
    )
    ap.add_argument("--csv", default="evals/out/newcomer.csv", help="where the rows go")
    ap.add_argument("--keep", action="store_true", help="keep the fresh home (path printed)")
    ns = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ns-newcomer-"))
    home = root / "home"
    home.mkdir()
    console = Console()
    day: Day | None = None
    try:
        if ns.skip_install:
            day = Day(Path(ns.repo).resolve(), home, None)
        else:
            clone = root / "nightshift"
            subprocess.run(
                [
                    "git",
                    "clone",
                    "-q",
                    "--depth",
                    "1",
                    f"file://{Path(ns.repo).resolve()}",
                    str(clone),
                ],
                check=True,
            )
            day = Day(clone, home, clone / ".venv" / "bin")
            install(day)
        walk(day)
    finally:
        if day is not None and day.daemon is not None:
            day.daemon.send_signal(signal.SIGTERM)
            try:
                day.daemon.wait(30)
            except subprocess.TimeoutExpired:
                day.daemon.kill()
        if ns.keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    assert day is not None
    table = Table(title="a newcomer's first day (fresh clone, fresh home)")
    for col in ("step", "seconds", "held", "detail"):
        table.add_column(col)
    for s in day.steps:
        table.add_row(s.what, f"{s.seconds:.2f}", "yes" if s.held else "NO", s.detail)
    console.print(table)
    write_csv(Path(ns.csv), [s.__dict__ for s in day.steps])
    return 0 if all(s.held for s in day.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
