"""Fault-injection recovery: nightshift's daemon against a plain retry loop, on real training runs.

`nightshift eval recovery [--runs N] [--faults oom,nan,...] [--quick]`

Every run trains `examples/train_numpy.py` (a NumPy MLP on scikit-learn's digits) as a real
subprocess, with one fault injected through the script's own switches:

| fault                | how                                                   | persists on a rerun?        |
| -------------------- | ----------------------------------------------------- | --------------------------- |
| `oom`                | CUDA-OOM-shaped error at step K while micro-batch > 16 | yes, with the same params   |
| `nan`                | NaN loss at step K while lr > 0.006                   | yes, with the same params   |
| `crash`              | `RuntimeError` traceback, exit 1, at step K           | no (transient)              |
| `kill`               | SIGKILL of itself at step K (OOM killer, `kill -9`)    | no                          |
| `hang`               | sleeps forever at step K (a deadlocked collective)    | no                          |
| `corrupt_checkpoint` | crash at step K, and the newest checkpoint before K is truncated as it appears | no |
| `missing_data`       | the command opens a data file that does not exist     | yes                         |
| `none`               | no fault: the control                                 |                             |

The example cannot read a data file of our choosing, so `missing_data` runs it behind a one-line
preflight (`python -c "open(data_file); runpy.run_path('train_numpy.py')"`), which fails the way
a loader does: `FileNotFoundError: [Errno 2] No such file or directory`. K is drawn per run from a
seeded generator, so the fault lands anywhere within a checkpoint interval.

Each fault is run twice in the same invocation:

* **nightshift** — a fresh `NIGHTSHIFT_HOME`, the spec submitted through the library API
  (`Client.submit`, through the policy gate), and the daemon ticked in-process (`Daemon.step()`)
  until the job is final (succeeded, or failed with its recovery over) or a time limit. Recoveries
  go through the graph with the deterministic planner: diagnose_failure → auto_resume →
  resume_job, so parameter changes are read back from the audit log.
* **naive** — what a plain retry loop does: the same argv, cwd and environment as a subprocess,
  rerun from scratch (no `--resume`) on a non-zero exit, with the same parameters, up to the same
  budget of attempts (1 + spec.retries) and the same backoff between them (`--backoff-s`, default
  0 for both; the daemon's shipped retry.base_s is 30 s), and no stall detector (a hung attempt is stopped at a
  wall-clock cap and counted as not finished). A transient fault fires in its first attempt only,
  as a real one would (the script's own rule, "only in a run that started from step 0", would
  otherwise fire it in every fresh restart); a persistent fault stays.

Measured per run, from the store (nightshift) or the loop's own bookkeeping (naive):

* finished — the job succeeded;
* steps lost — over every failed attempt followed by another, its last logged step minus the step
  the next attempt started from (naive: from 0), next to the checkpoint interval;
* steps run — optimiser steps computed over all attempts (the job needs `steps`);
* time to detect — from the fault to the attempt's end being recorded. The fault's time is the
  run's last sign of life: the newer of its log file's and metrics file's last write (a watcher
  thread records the metrics file's writes), plus the per-step sleep for `kill`, which dies
  silently one step-sleep after its last write. Nightshift sees an end at its next loop tick
  (`--poll-s`, 0.05 s here; the shipped default loop.poll_interval_s is 0.5 s) and a hang after
  the spec's stall_min; naive: from the fault to the process's exit, which a blocking wait sees at
  once;
* time to decide — nightshift only: from the attempt's end to resume_job requeueing the job (the
  recovery graph: diagnose_failure, auto_resume, resume_job, each through the gate and the audit);
* time to recover — from the attempt's end to the next attempt's first new metric line (blank for
  runs that never finished): the decision, the next placement tick, process start, data loading
  and the checkpoint load;
* parameter changes — resume_job's params_before/params_after in the audit log;
* model calls — the deterministic planner makes none (its decisions are counted alongside).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from nightshift.evals.output import write_csv

FAULTS = ("oom", "nan", "crash", "kill", "hang", "corrupt_checkpoint", "missing_data", "none")
TRANSIENT = {"crash", "kill", "hang", "corrupt_checkpoint"}
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
OOM_ABOVE_BATCH, NAN_ABOVE_LR = 16, 0.006
# Runs `train_numpy.py` after opening its data file, as a data loader would first.
PREFLIGHT = (
    "import runpy, sys; open(sys.argv[1], 'rb').close(); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass(frozen=True)
class Profile:
    """How long the runs are and how long either approach may take."""

    steps: int
    every: int  # checkpoint interval, in steps
    sleep_s: float  # per step, so that faults land mid-run and the loop has something to watch
    stall_min: float  # the spec's stall limit (the daemon's hang detector)
    retries: int
    limit_s: float  # nightshift: give up waiting for a final state after this
    naive_cap_s: float  # naive: wall-clock cap per attempt (only a hung one reaches it)
    poll_s: float = 0.05
    backoff_s: float = 0.0  # wait before the first retry (then ×2 per failure), for both approaches


FULL = Profile(
    steps=200, every=25, sleep_s=0.02, stall_min=0.05, retries=2, limit_s=180, naive_cap_s=30
)
# The quick profile's stall limit (9 s) leaves room for a start-up under CI load: a fresh
# attempt's first metric took 3.5-3.9 s behind six busy loops on 2 cores, and 2.4 s once
# stopped a run with no fault as stalled in CI.
QUICK = Profile(
    steps=60, every=10, sleep_s=0.02, stall_min=0.15, retries=2, limit_s=60, naive_cap_s=8
)


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    run: int
    at_step: int | None  # K: the step the fault fires at (None: none, or at start-up)
    env: dict[str, str]
    corrupt_step: int | None = None  # the checkpoint to truncate as soon as it is written


@dataclass
class AttemptRec:
    """One attempt, as either approach saw it (times are epoch seconds)."""

    start_step: int
    last_step: int | None
    started: float
    ended: float | None
    ok: bool
    outcome: str
    cause: str | None = None
    fault_time: float | None = None
    decided: float | None = None  # nightshift: when resume_job requeued the job after this attempt
    first_metric_after_end: float | None = None


@dataclass
class RunResult:
    fault: str
    run: int
    approach: str
    finished: bool
    attempts: int
    fault_step: int | None
    checkpoint_every: int
    steps: int
    steps_lost: int
    steps_run: int
    detect_s: float | None
    decide_s: float | None
    recover_s: float | None
    param_changes: int
    changes: str
    model_calls: int
    planner_decisions: int
    causes: str
    wall_s: float
    note: str = ""
    attempt_log: list[AttemptRec] = field(default_factory=list, repr=False)


# ---------------------------------------------------------------------------------- planning
def plan_fault(kind: str, run: int, p: Profile, rng: random.Random) -> FaultPlan:
    """Draw K for one run and the environment that injects the fault."""
    base = {"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": repr(p.sleep_s)}
    lo, hi = 2 * p.every + 1, p.steps - p.every  # a fault with two checkpoints behind it
    k = rng.randint(lo, hi)
    if kind == "oom":
        env = {
            "NIGHTSHIFT_FAULT_OOM_AT_STEP": str(k),
            "NIGHTSHIFT_FAULT_OOM_ABOVE_BATCH": str(OOM_ABOVE_BATCH),
        }
    elif kind == "nan":
        env = {
            "NIGHTSHIFT_FAULT_NAN_AT_STEP": str(k),
            "NIGHTSHIFT_FAULT_NAN_ABOVE_LR": repr(NAN_ABOVE_LR),
        }
    elif kind == "crash":
        env = {"NIGHTSHIFT_FAULT_CRASH_AT_STEP": str(k)}
    elif kind == "kill":
        env = {"NIGHTSHIFT_FAULT_KILL_AT_STEP": str(k)}
    elif kind == "hang":
        env = {"NIGHTSHIFT_FAULT_HANG_AT_STEP": str(k)}
    elif kind == "corrupt_checkpoint":
        # Crash in the second half of the interval after checkpoint C (C has one before it), so
        # that the watcher has time to truncate C once it is written.
        c = p.every * rng.randint(2, p.steps // p.every - 1)
        k = c + rng.randint(p.every // 2, p.every - 1)
        return FaultPlan(
            kind, run, k, {**base, "NIGHTSHIFT_FAULT_CRASH_AT_STEP": str(k)}, corrupt_step=c
        )
    elif kind in ("missing_data", "none"):
        return FaultPlan(kind, run, None, base)
    else:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULTS)}")
    return FaultPlan(kind, run, k, {**base, **env})


def build_spec(plan: FaultPlan, p: Profile, home: Path) -> dict[str, Any]:
    """The quickstart spec with this run's length, interval, faults and stall limit."""
    spec = yaml.safe_load((EXAMPLES / "specs" / "quickstart.yaml").read_text())
    spec["name"] = f"{plan.kind}-{plan.run}".replace("_", "-")
    spec["code"]["path"] = str(EXAMPLES)
    spec["environment"]["env"] = dict(plan.env)
    spec["parameters"].update(steps=p.steps, checkpoint_every=p.every)
    spec["checkpoint"]["every_steps"] = p.every
    spec["retries"] = p.retries
    spec["stall_min"] = p.stall_min
    if plan.kind == "missing_data":
        spec["command"] = ["{python}", "-c", PREFLIGHT, "{data_file}", *spec["command"][1:]]
        spec["parameters"]["data_file"] = str(home / "data" / "digits-train.npz")
    return spec


# ---------------------------------------------------------------------------------- watching
class MetricsWatch:
    """Records every growth of a metrics file with the file's mtime (polled every few ms), and
    truncates one checkpoint the moment it is written, as a full disk or a torn copy would."""

    def __init__(self, metrics: Path, corrupt: Path | None = None, every_s: float = 0.005):
        self.metrics, self.corrupt, self.every_s = metrics, corrupt, every_s
        self.writes: list[tuple[float, int]] = []  # (mtime, size) after each growth seen
        self.corrupted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="recovery-watch", daemon=True)

    def __enter__(self) -> MetricsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every_s)

    def _sample(self) -> None:
        try:
            st = self.metrics.stat()
        except FileNotFoundError:
            pass
        else:
            if not self.writes or st.st_size != self.writes[-1][1]:
                self.writes.append((st.st_mtime, st.st_size))
        if self.corrupt is not None and not self.corrupted and self.corrupt.exists():
            self.corrupt.write_bytes(self.corrupt.read_bytes()[:100])
            self.corrupted = True

    def last_write(self, start: float, end: float) -> float | None:
        inside = [t for t, _ in self.writes if start <= t <= end]
        return max(inside) if inside else None

    def first_write_after(self, t: float) -> float | None:
        return next((w for w, _ in self.writes if w > t), None)


def _mtime(path: str | Path | None) -> float | None:
    try:
        return Path(path).stat().st_mtime if path else None
    except FileNotFoundError:
        return None


def _fault_time(
    kind: str, log_mtime: float | None, last_metric: float | None, sleep_s: float
) -> float | None:
    """The run's last sign of life before it failed (see the module docstring)."""
    seen = [t for t in (log_mtime, last_metric) if t is not None]
    if not seen:
        return None
    return max(seen) + (sleep_s if kind == "kill" else 0.0)


def _iso_epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.removesuffix("Z")).replace(tzinfo=UTC).timestamp()


def _epoch(dt: datetime | None) -> float | None:
    return None if dt is None else dt.replace(tzinfo=UTC).timestamp()


# ---------------------------------------------------------------------------------- nightshift
class _CountingPlanner:
    """The deterministic planner, counting its decisions (none of which calls a model)."""

    def __init__(self) -> None:
        from nightshift.agent.brain.planner import DeterministicPlanner

        self.inner = DeterministicPlanner()
        self.name = self.inner.name
        self.decisions = 0

    def next(self, goal: Any, history: list[Any]) -> Any:
        self.decisions += 1
        return self.inner.next(goal, history)


def run_nightshift(plan: FaultPlan, p: Profile, workdir: Path) -> RunResult:
    """Submit through the library API and tick the daemon in-process until the job is final."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client
    from nightshift.agent.doors.daemon import Daemon
    from nightshift.runtime.config import ExecutorSettings, GpuSettings, LoopSettings, Settings
    from nightshift.runtime.engine import job_workspace
    from nightshift.runtime.scheduling.backoff import Backoff

    home = workdir / "nightshift"
    home.mkdir(parents=True)
    spec_path = home / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(build_spec(plan, p, home)))
    # The jobs need no GPU: the probe is off, so the host's GPUs (or lack of them) play no part.
    w = Wiring(
        Settings(
            home=str(home),
            loop=LoopSettings(poll_interval_s=p.poll_s),
            executor=ExecutorSettings(stop_grace_s=5.0),
            gpu=GpuSettings(probe="none"),
            retry=Backoff(base_s=p.backoff_s),
        )
    )
    planner = _CountingPlanner()
    daemon = Daemon(w, planner=planner)
    t0 = time.time()
    job_id = Client(w).submit(str(spec_path), call_id=f"recovery-eval-{plan.kind}-{plan.run}")
    ws = job_workspace(w.settings, job_id)
    corrupt = (
        ws / "checkpoints" / f"step_{plan.corrupt_step:08d}.npz" if plan.corrupt_step else None
    )
    note = ""
    try:
        with MetricsWatch(ws / "metrics.jsonl", corrupt) as watch:
            while True:
                daemon.step()
                final, note = _final(daemon, w, job_id)
                if final:
                    break
                if time.time() - t0 > p.limit_s:
                    note = f"not final after the {p.limit_s:g} s limit"
                    for a in w.store.attempts(job_id):  # leave no run behind
                        if a.state == "running":
                            w.executor.stop(a.handle, grace_s=1.0)
                    break
                time.sleep(p.poll_s)
        wall = time.time() - t0
        job = w.store.job(job_id)
        recs = []
        for a in w.store.attempts(job_id):
            ended = _epoch(a.ended_at)
            started = _epoch(a.started_at) or t0
            rec = AttemptRec(
                start_step=a.start_step,
                last_step=a.last_step,
                started=started,
                ended=ended,
                ok=a.outcome == "succeeded",
                outcome=a.outcome or a.state,
                cause=a.cause,
            )
            if ended is not None and not rec.ok:
                rec.fault_time = _fault_time(
                    plan.kind, _mtime(a.log_path), watch.last_write(started, ended), p.sleep_s
                )
                rec.first_metric_after_end = watch.first_write_after(ended)
            recs.append(rec)
        if plan.kind == "corrupt_checkpoint" and not watch.corrupted:
            note = (note + "; " if note else "") + "checkpoint was not truncated in time"
        resumes = [
            e
            for e in w.audit.events(action="skill.result", skill="resume_job")
            if e.payload.get("ok")
        ]
        resumed_at = sorted(_iso_epoch(e.ts) for e in resumes)
        for rec in recs:
            if rec.ended is not None and not rec.ok:
                rec.decided = next((t for t in resumed_at if t >= rec.ended), None)
        changes = []
        for r in (e.payload["result"] for e in resumes):
            pb, pa = r["params_before"], r["params_after"]
            changes += [f"{k} {pb.get(k)}→{pa[k]}" for k in pa if pb.get(k) != pa[k]]
        finished = job is not None and job.state == "succeeded"
        return _result(
            plan,
            p,
            "nightshift",
            finished,
            recs,
            wall,
            changes=changes,
            decisions=planner.decisions,
            note=note,
        )
    finally:
        daemon.graph.checkpointer.conn.close()
        w.store.engine.dispose()


def _final(daemon: Any, w: Any, job_id: int) -> tuple[bool, str]:
    """A job is final when it succeeded or was cancelled, or failed with its recovery over
    (the daemon names recovery threads after the attempt they follow)."""
    job = w.store.job(job_id)
    if job.state in ("succeeded", "cancelled"):
        return True, job.reason or ""
    if job.state != "failed":
        return False, ""
    n = len(w.store.attempts(job_id))
    snap = daemon.graph.get_state(
        {"configurable": {"thread_id": f"recover-job-{job_id}-after-{n}"}}
    )
    if snap.values and not snap.next:
        fin = snap.values.get("finish") or {}
        return True, str(fin.get("summary", ""))
    return False, ""


# ---------------------------------------------------------------------------------- naive
def run_naive(plan: FaultPlan, p: Profile, workdir: Path) -> RunResult:
    """A plain retry loop: same argv, cwd and environment; rerun from scratch on failure."""
    from nightshift.runtime.scheduling.backoff import backoff_delay_s
    from nightshift.runtime.spec import ExperimentSpec

    home = workdir / "naive"
    home.mkdir(parents=True)
    spec = ExperimentSpec.model_validate(build_spec(plan, p, home))
    metrics = home / "metrics.jsonl"
    argv = spec.render(
        spec.parameters,
        {
            "python": sys.executable,
            "run_dir": str(home),
            "checkpoint_dir": str(home / "checkpoints"),
            "metrics_file": str(metrics),
        },
    )
    base_env = {**os.environ, **spec.environment.env, "PYTHONUNBUFFERED": "1"}
    fault_keys = {k for k in spec.environment.env if k.startswith("NIGHTSHIFT_FAULT_")}
    corrupt = (
        home / "checkpoints" / f"step_{plan.corrupt_step:08d}.npz" if plan.corrupt_step else None
    )
    recs: list[AttemptRec] = []
    note = ""
    t0 = time.time()
    with MetricsWatch(metrics, corrupt) as watch:
        for number in range(1, p.retries + 2):
            env = base_env
            if number > 1:  # the same backoff as the daemon's (job 1 in its fresh home)
                time.sleep(backoff_delay_s(number - 1, 1, base_s=p.backoff_s))
            if number > 1 and plan.kind in TRANSIENT:
                env = {k: v for k, v in base_env.items() if k not in fault_keys}
            offset = metrics.stat().st_size if metrics.exists() else 0
            log = home / f"attempt-{number}.log"
            started = time.time()
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    argv,
                    cwd=str(spec.run_dir()),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                code: int | None = proc.wait(timeout=p.naive_cap_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            ended = time.time()
            rec = AttemptRec(
                start_step=0,
                last_step=_last_step(metrics, offset),
                started=started,
                ended=ended,
                ok=code == 0,
                outcome="succeeded"
                if code == 0
                else ("capped" if code is None else f"exit {code}"),
            )
            if code is None:  # hung: a retry loop without a stall detector never sees it end
                rec.ended = None
                note = f"hung attempt never ended; stopped at the {p.naive_cap_s:g} s cap"
                recs.append(rec)
                break
            if not rec.ok:
                rec.fault_time = _fault_time(
                    plan.kind, _mtime(log), watch.last_write(started, ended), p.sleep_s
                )
            recs.append(rec)
            if rec.ok:
                break
        wall = time.time() - t0
    for rec in recs:
        if rec.ended is not None and not rec.ok:
            rec.first_metric_after_end = watch.first_write_after(rec.ended)
    finished = bool(recs) and recs[-1].ok
    if not finished and not note:
        note = f"{len(recs)} attempt(s), all failed"
    return _result(plan, p, "naive", finished, recs, wall, changes=[], decisions=0, note=note)


def _last_step(metrics: Path, offset: int) -> int | None:
    import json

    if not metrics.exists():
        return None
    last = None
    with metrics.open("rb") as f:
        f.seek(offset)
        for raw in f.read().splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                last = rec["step"]
    return last


# ---------------------------------------------------------------------------------- scoring
def _result(
    plan: FaultPlan,
    p: Profile,
    approach: str,
    finished: bool,
    recs: list[AttemptRec],
    wall: float,
    *,
    changes: list[str],
    decisions: int,
    note: str,
) -> RunResult:
    lost = run = 0
    detects, decides, recovers = [], [], []
    for i, a in enumerate(recs):
        done = a.last_step if a.last_step is not None else a.start_step
        run += max(0, done - a.start_step)
        if a.ok:
            continue
        if a.fault_time is not None and a.ended is not None:
            # The engine stamps an attempt's end with the start of the tick that saw it, which
            # can precede the exit by the few milliseconds the tick spends before polling.
            detects.append(max(0.0, a.ended - a.fault_time))
        if i + 1 < len(recs) and a.ended is not None:
            lost += max(0, done - recs[i + 1].start_step)
            if a.decided is not None:
                decides.append(a.decided - a.ended)
            if a.first_metric_after_end is not None:
                recovers.append(a.first_metric_after_end - a.ended)
    causes = ",".join(dict.fromkeys(a.cause for a in recs if a.cause))
    return RunResult(
        fault=plan.kind,
        run=plan.run,
        approach=approach,
        finished=finished,
        attempts=len(recs),
        fault_step=plan.at_step,
        checkpoint_every=p.every,
        steps=p.steps,
        steps_lost=lost,
        steps_run=run,
        detect_s=_mean(detects),
        decide_s=_mean(decides),
        recover_s=_mean(recovers) if finished else None,
        param_changes=len(changes),
        changes="; ".join(changes),
        model_calls=0,
        planner_decisions=decisions,
        causes=causes,
        wall_s=round(wall, 3),
        note=note,
        attempt_log=recs,
    )


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 3) if xs else None


def summarise(results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per (fault, approach): finished %, medians with min and max."""
    rows = []
    keys = list(dict.fromkeys((r.fault, r.approach) for r in results))
    for fault, approach in keys:
        rs = [r for r in results if r.fault == fault and r.approach == approach]
        rows.append(
            {
                "fault": fault,
                "approach": approach,
                "runs": len(rs),
                "finished_pct": round(100 * sum(r.finished for r in rs) / len(rs), 1),
                "attempts_median": statistics.median(r.attempts for r in rs),
                "checkpoint_every": rs[0].checkpoint_every,
                "steps": rs[0].steps,
                **_stats("steps_lost", [r.steps_lost for r in rs]),
                **_stats("steps_run", [r.steps_run for r in rs]),
                **_stats("detect_s", [r.detect_s for r in rs]),
                **_stats("decide_s", [r.decide_s for r in rs]),
                **_stats("recover_s", [r.recover_s for r in rs]),
                **_stats("wall_s", [r.wall_s for r in rs]),
                "param_changes": "; ".join(dict.fromkeys(r.changes for r in rs if r.changes)),
                "model_calls": sum(r.model_calls for r in rs),
                "planner_decisions_median": statistics.median(r.planner_decisions for r in rs),
                "causes": ",".join(dict.fromkeys(c for r in rs for c in r.causes.split(",") if c)),
                "note": "; ".join(dict.fromkeys(r.note for r in rs if r.note)),
            }
        )
    return rows


def _stats(name: str, xs: list[float | int | None]) -> dict[str, Any]:
    vals = [x for x in xs if x is not None]
    if not vals:
        return {f"{name}_median": None, f"{name}_min": None, f"{name}_max": None}
    return {
        f"{name}_median": round(statistics.median(vals), 3),
        f"{name}_min": min(vals),
        f"{name}_max": max(vals),
    }


# ---------------------------------------------------------------------------------- output
def _span(row: dict[str, Any], name: str, fmt: str = "{:g}") -> str:
    med = row[f"{name}_median"]
    if med is None:
        return "–"
    lo, hi = row[f"{name}_min"], row[f"{name}_max"]
    text = fmt.format(med)
    return text if lo == hi else f"{text} [{fmt.format(lo)}–{fmt.format(hi)}]"


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for col, just in (
        ("fault", "left"),
        ("approach", "left"),
        ("finished", "right"),
        ("attempts", "right"),
        ("steps lost", "right"),
        ("ckpt every", "right"),
        ("steps run / needed", "right"),
        ("detect s", "right"),
        ("decide s", "right"),
        ("recover s", "right"),
        ("param changes", "left"),
        ("model calls", "right"),
        ("cause / note", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    last = None
    for r in rows:
        if last is not None and r["fault"] != last:
            t.add_section()
        last = r["fault"]
        t.add_row(
            r["fault"],
            r["approach"],
            f"{r['finished_pct']:g}%",
            f"{r['attempts_median']:g}",
            _span(r, "steps_lost"),
            str(r["checkpoint_every"]),
            f"{_span(r, 'steps_run')} / {r['steps']}",
            _span(r, "detect_s", "{:.2f}"),
            _span(r, "decide_s", "{:.2f}"),
            _span(r, "recover_s", "{:.2f}"),
            r["param_changes"] or "–",
            str(r["model_calls"]),
            r["causes"] or r["note"] or "",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    console.print(t)


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Steps lost per fault, nightshift vs naive (median, min–max whiskers); unfinished marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    faults = [f for f in dict.fromkeys(r["fault"] for r in rows) if f != "none"]
    if not faults:
        return False
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(faults)), 4))
    width = 0.38
    for i, (approach, color) in enumerate((("nightshift", "#2a7ab0"), ("naive", "#c8553d"))):
        for j, fault in enumerate(faults):
            r = next((x for x in rows if x["fault"] == fault and x["approach"] == approach), None)
            if r is None:
                continue
            med = r["steps_lost_median"] or 0
            lo, hi = r["steps_lost_min"] or 0, r["steps_lost_max"] or 0
            x = j + (i - 0.5) * width
            ax.bar(
                x,
                med,
                width,
                color=color,
                label=approach if j == 0 else None,
                yerr=[[med - lo], [hi - med]],
                capsize=3,
                hatch="//" if r["finished_pct"] < 100 else None,
                edgecolor="black",
                lw=0.5,
            )
            ax.text(x, hi, f"{r['finished_pct']:.0f}%", ha="center", va="bottom", fontsize=7)
    every = rows[0]["checkpoint_every"]
    ax.axhline(every, color="grey", ls="--", lw=1, label=f"checkpoint interval ({every} steps)")
    ax.set_xticks(range(len(faults)), faults, rotation=20)
    ax.set_ylabel("steps lost (median, min–max)")
    ax.set_title("Steps lost per fault; label: finished %, hatched: not always finished")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------- entry
def run_all(
    faults: list[str],
    runs: int,
    p: Profile,
    seed: int,
    workdir: Path,
    *,
    jobs: int = 1,
    say: Any = print,
) -> list[RunResult]:
    """Every fault × run × approach; `jobs` of them at once (each in its own folder and home)."""
    tasks = []
    for fault in faults:
        for run in range(1, runs + 1):
            # One generator per (seed, fault, run): a subset of faults draws the same K.
            plan = plan_fault(fault, run, p, random.Random(f"{seed}/{fault}/{run}"))
            for approach in ("nightshift", "naive"):
                tasks.append((plan, approach))

    def one(task: tuple[FaultPlan, str]) -> RunResult:
        plan, approach = task
        fn = run_nightshift if approach == "nightshift" else run_naive
        r = fn(plan, p, workdir / f"{plan.kind}-{plan.run}")
        say(
            f"{plan.kind} #{plan.run} K={plan.at_step} {approach}: "
            f"{'finished' if r.finished else 'NOT finished'}, {r.attempts} attempt(s), "
            f"lost {r.steps_lost} steps, {r.wall_s:.1f} s {r.note}".rstrip()
        )
        return r

    if jobs <= 1:
        return [one(t) for t in tasks]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, tasks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="nightshift eval recovery", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--runs", type=int, default=None, help="runs per fault (default 5; --quick: 1)")
    ap.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated: " + ",".join(FAULTS)
    )
    ap.add_argument("--quick", action="store_true", help="1 run each, shorter training (for CI)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the fault steps")
    ap.add_argument("--out", default="evals/out", help="folder for CSV and PNG (default evals/out)")
    ap.add_argument("--workdir", default=None, help="keep run folders here (default: a temp dir)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs at once (default 1; --quick: 2, nightshift and naive side by side)",
    )
    ap.add_argument(
        "--poll-s",
        type=float,
        default=0.05,
        help="the daemon's loop.poll_interval_s (default 0.05; nightshift's own: 0.5)",
    )
    ap.add_argument(
        "--backoff-s",
        type=float,
        default=0.0,
        help="retry backoff before the first retry, doubling after (nightshift's "
        "retry.base_s, and a sleep in the naive loop); default 0, shipped: 30",
    )
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    bad = [f for f in faults if f not in FAULTS]
    runs = args.runs if args.runs is not None else (1 if args.quick else 5)
    if bad or runs < 1:
        print(
            f"error: unknown fault(s) {bad}; one of {', '.join(FAULTS)}"
            if bad
            else "error: --runs must be at least 1",
            file=sys.stderr,
        )
        return 2
    p = QUICK if args.quick else FULL
    p = replace(p, poll_s=args.poll_s, backoff_s=args.backoff_s)
    jobs = args.jobs if args.jobs is not None else (2 if args.quick else 1)
    out = Path(args.out)
    tmp = (
        Path(args.workdir)
        if args.workdir
        else Path(tempfile.mkdtemp(prefix="nightshift-recovery-"))
    )
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        results = run_all(faults, runs, p, args.seed, tmp, jobs=jobs)
    finally:
        if not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = summarise(results)
    per_run = [{k: v for k, v in asdict(r).items() if k != "attempt_log"} for r in results]
    write_csv(out / "recovery_runs.csv", per_run)
    write_csv(out / "recovery_summary.csv", rows)
    print_table(
        rows,
        f"Fault-injection recovery: nightshift vs naive retry ({runs} run(s) per "
        f"fault, {p.steps} steps, checkpoint every {p.every}, "
        f"{time.time() - t0:.0f} s)",
    )
    written = [out / "recovery_runs.csv", out / "recovery_summary.csv"]
    if not args.no_plot and plot(rows, out / "recovery_steps_lost.png"):
        written.append(out / "recovery_steps_lost.png")
    print("wrote " + ", ".join(str(x) for x in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
