"""Scale: how nightshift holds up with a deep queue.

    python -m nightshift.evals.bench_scale            # the sizes reported in docs/benchmarks.md
    python -m nightshift.evals.bench_scale --quick    # small sizes: a smoke test (seconds)
    python -m nightshift.evals.bench_scale --place-only [--compare-with OLD_placement.py]
        # (b) alone at 10,000 x 512 and 100,000 x 4,096, beside an older placement module
        # (and its pending_columns.py, when one is beside it)
    python -m nightshift.evals.bench_scale --engine-ticks
        # (e) alone: the daemon's whole tick at 10,000 x 512 and 100,000 x 4,096
    python -m nightshift.evals.bench_scale --postgres postgresql+psycopg://…/EMPTY_DB
        # (f) alone: the snapshot's load from PostgreSQL at 100,000 x 4,096
    nightshift eval scale [--quick]                   # the same, through the CLI

(a) submissions per second into one SQLite store from 4 processes through the library API
    (`nightshift.agent.doors.api.Client().submit`: policy gate, audit, store), then a check that no job
    was lost or duplicated; beside it, one process alone (what contention costs) and the same
    rows written straight into the store (the ceiling the gate and the audit leave room for);
(b) one `place()` call on an in-memory snapshot of 10,000 pending jobs and 512 GPUs (median, min
    and max over repeats); with `--place-only`, also 100,000 pending jobs on 4,096 GPUs, each
    size called again on the same snapshot, on a queue that changes between calls
    (`tick_snapshots`), on the same queue rebuilt as new objects (`fresh_snapshots`, as a
    daemon reloading the store passes it) and under the daemon's scheduler defaults
    (`daemon_order`), median and p95 of wall and CPU time; and the daemon's own step, a SQLite
    store changed between ticks, loaded (`load_snapshot`, keeping the last tick's jobs as the
    engine does, and without) and placed (`bench_daemon_ticks`);
(c) the time to load that snapshot from the store (`load_snapshot` below);
(d) resident memory of a daemon-like process: a Store and an Engine over a store with 10,000
    queued jobs, after one tick; and of the same process loading the snapshot and placing;
(e) with `--engine-ticks`, the daemon's whole tick (`Engine.place_queued`: the snapshot loaded,
    placed, every waiting job's hold reason written into `job_hold`, the starts launched through
    an executor that starts nothing) over a SQLite store that `store_ticks` changes between ticks;
(f) with `--postgres URL` (an empty database), `load_snapshot` from PostgreSQL filled as in (c),
    by the path it takes there (each spec's placement fields as one small array, the parameters
    as text) beside the path any other database takes (every spec and parameters decoded here),
    interleaved, the waiting jobs kept between loads as the engine keeps them.

Prints a table and writes the figures as CSV (`--csv`).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import func, insert, select
from sqlmodel import select as sqlmodel_select

from nightshift.runtime.executors.executor import gang_host
from nightshift.runtime.gpu.ray_census import HOST_PREFIX
from nightshift.runtime.scheduling.placement import (
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
    place,
)
from nightshift.runtime.scheduling.snapshot import by_host, load_snapshot
from nightshift.runtime.scheduling.tariff import PriceWindow, Tariff
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, GpuSample, Job, Store
from nightshift.runtime.store.lifecycle import AttemptState, Ended

NOW = datetime(2026, 12, 2, 3, 0)  # naive UTC, like the store
GPUS_PER_HOST = 8
GPU_MIB = 81920.0
# A minute between the ticks `store_ticks` models: more change per tick than the daemon meets
# (it ticks again `loop.poll_interval_s`, 0.5 s, after a tick; at 100,000 queued ≈ 3 s apart)
DAEMON_TICK_S = 60.0


def night_tariff() -> Tariff:
    return Tariff(
        timezone="Europe/Berlin",
        currency="EUR",
        windows=[
            PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.12),
            PriceWindow(name="day", start="07:00", end="23:00", price_per_kwh=0.35),
        ],
    )


# ------------------------------------------------------------------------------ synthetic world
def synthetic_snapshot(
    n_pending: int = 10_000,
    n_gpus: int = 512,
    seed: int = 0,
    now: datetime = NOW,
    preempt_margin: int | None = 5,
) -> Snapshot:
    """A busy cluster: 8-GPU hosts, 2 % quarantined, all but 16 GPUs running 1-8 GPU jobs; a
    queue of mixed requests (CPU, 1-8 GPUs, 20-70 GiB, some sharing with caps), 10 % waiting on a
    dependency, 5 % in backoff, 20 % cost-sensitive under a night tariff, submitted over two days."""
    rnd = random.Random(seed)
    gpus = [
        GpuSlot(
            index=i,
            host=f"h{i // GPUS_PER_HOST}",
            memory_total_mib=GPU_MIB,
            memory_used_mib=rnd.choice([0.0, 0.0, 0.0, 500.0]),
            verdict="CRITICAL" if rnd.random() < 0.02 else "OK",
        )
        for i in range(n_gpus)
    ]
    running: list[RunningJob] = []
    i, rid = 0, 1_000_000
    while i < n_gpus - 16:
        host_end = (i // GPUS_PER_HOST + 1) * GPUS_PER_HOST
        ids = list(range(i, min(i + rnd.choice([1, 1, 2, 4, 8]), host_end)))
        running.append(
            RunningJob(
                id=rid,
                name=f"run{rid}",
                gpus=ids,
                priority=rnd.randint(0, 10),
                submitted_at=now - timedelta(hours=10),
                started_at=now - timedelta(hours=rnd.random() * 5),
                expected_end=now + timedelta(hours=rnd.random() * 8),
                pausable=rnd.random() < 0.5,
            )
        )
        rid += 1
        i += len(ids)
    pending = []
    for j in range(n_pending):
        r = rnd.random()
        backoff = 0.10 <= r < 0.15
        pending.append(
            PendingJob(
                id=j + 1,
                name=f"exp{j}",
                priority=rnd.randint(0, 10),
                gpus=rnd.choice([0, 1, 1, 1, 2, 2, 4, 8]),
                gpu_memory_gb=rnd.choice([None, 20, 40, 70]),
                share_gpu=rnd.random() < 0.1,
                gpu_memory_cap_gb=rnd.choice([None, 10, 20]),
                blocked_by=["prep"] if r < 0.10 else [],
                not_before=now + timedelta(minutes=30) if backoff else None,
                attempt=1 if backoff else 0,
                submitted_at=now - timedelta(hours=rnd.random() * 48),
                cost_class="cost_sensitive" if rnd.random() < 0.2 else "urgent",
                expected_duration_s=rnd.choice([None, 600, 3600, 4 * 3600, 12 * 3600]),
            )
        )
    return Snapshot(
        now=now,
        pending=pending,
        running=running,
        gpus=gpus,
        cpu_slots=4,
        tariff=night_tariff(),
        preempt_margin=preempt_margin,
    )


def daemon_order() -> dict[str, Any]:
    """The Snapshot fields a daemon's default scheduler settings set, as its engine applies them
    (`SchedulerSettings.snapshot_fields`: order srpt, the starvation guard, best fit, no aging,
    preemption at a margin of 1, migration after 30 minutes, no pause of a job ending within
    30); the synthetic snapshot keeps its own for the rest."""
    from nightshift.runtime.config import SchedulerSettings

    return SchedulerSettings().snapshot_fields()


def tick_snapshots(snap: Snapshot, seed: int = 1) -> Iterator[Snapshot]:
    """The snapshots after `snap`, one per call, as a daemon's ticks see the queue: a minute
    later each time, 0.5 % of the waiting jobs gone (started) and as many new ones (new
    objects, new ids), three priorities raised in place just before the call; the other jobs
    are the same objects, as the simulator passes them (a daemon that reloads the store each
    tick builds new ones: the first call on a snapshot measures that)."""
    rnd = random.Random(seed)
    pending, now = list(snap.pending), snap.now
    next_id = max(j.id for j in pending) + 1
    churn = max(1, len(pending) // 200)
    while True:
        now += timedelta(minutes=1)
        for _ in range(churn):
            pending.pop(rnd.randrange(len(pending)))
            fresh = rnd.choice(pending).model_copy(update={"id": next_id, "submitted_at": now})
            pending.append(fresh)
            next_id += 1
        for _ in range(3):
            rnd.choice(pending).priority += 1
        yield snap.model_copy(update={"now": now, "pending": list(pending)})


def fresh_snapshots(snap: Snapshot) -> Iterator[Snapshot]:
    """`snap` again and again with every job a new object of the same fields: what a daemon
    that reloads its queue from the store passes at every tick."""
    while True:
        yield snap.model_copy(update={"pending": [j.model_copy() for j in snap.pending]})


def bench_spec(i: int, rnd: random.Random) -> dict[str, Any]:
    """A valid spec, as submit_job stores it (model_dump(mode="json"))."""
    r = rnd.random()
    spec = ExperimentSpec(
        name=f"exp{i % 200}",
        command=["{python}", "train.py", "--lr", "{lr}"],
        parameters={"lr": 1e-3},
        priority=rnd.randint(0, 10),
        resources={
            "gpus": rnd.choice([0, 1, 1, 1, 2, 2, 4, 8]),
            "gpu_memory_gb": rnd.choice([None, 20, 40, 70]),
            "share_gpu": r < 0.1,
            "gpu_memory_cap_gb": 20 if r < 0.1 else None,
            "expected_duration_min": rnd.choice([None, 10, 60, 240, 720]),
        },
        cost_class="cost_sensitive" if rnd.random() < 0.2 else "urgent",
        checkpoint={"dir": "ckpt"},
        depends_on=["prep"] if 0.1 <= r < 0.2 else [],
    )
    return spec.model_dump(mode="json")


def populate(
    store: Store,
    n_queued: int,
    n_gpus: int,
    seed: int = 0,
    now: datetime = NOW,
    cluster: str | None = None,
) -> None:
    """Fill a store the way a long night leaves it: `n_queued` queued jobs (5 % retrying after a
    failed attempt), one running job per busy GPU group, a history of succeeded jobs, and the
    latest health sample of every GPU (recorded twice: the table keeps history). The GPUs are
    this node's; with `cluster` (a host prefix, "ray:"), the census's of GPUS_PER_HOST-GPU hosts,
    each running job on one host."""
    per_host = GPUS_PER_HOST if cluster is not None else n_gpus

    def host_of(g: int) -> str:
        return f"{cluster}10.0.{g // per_host // 250}.{g // per_host % 250}" if cluster else ""

    rnd = random.Random(seed)
    jobs, attempts = [], []
    job_id = 0

    def job(state: str, spec: dict[str, Any], created: datetime) -> int:
        nonlocal job_id
        job_id += 1
        jobs.append(
            {
                "id": job_id,
                "name": spec["name"],
                "spec": spec,
                "params": {"lr": 1e-3},
                "state": state,
                "priority": spec["priority"],
                "owner": "bench",
                "max_attempts": 3,
                "submitted_by_call": f"bench-{job_id}",
                "created_at": created,
                "updated_at": created,
                "spec_path": None,
                "resume_from": None,
                "resume_step": None,
                "reason": None,
            }
        )
        return job_id

    for i in range(200):  # history: succeeded runs give expected durations by name
        spec = bench_spec(i, rnd)
        start = now - timedelta(days=2, minutes=i)
        jid = job("succeeded", spec, start)
        attempts.append(
            {
                "job_id": jid,
                "number": 1,
                "state": "exited",
                "outcome": "succeeded",
                "started_at": start,
                "ended_at": start + timedelta(minutes=30 + i % 90),
                "gpus": [],
                "handle": {},
                "argv": [],
                "params": {},
            }
        )
    gpu = 0
    while gpu < n_gpus - 16:
        spec = bench_spec(rnd.randrange(10_000), rnd)
        host_end = (gpu // per_host + 1) * per_host
        spec["resources"]["gpus"] = k = min(
            rnd.choice([1, 1, 2, 4, 8]), n_gpus - 16 - gpu, host_end - gpu
        )
        spec["depends_on"] = []
        jid = job("running", spec, now - timedelta(hours=10))
        attempts.append(
            {
                "job_id": jid,
                "number": 1,
                "state": "running",
                "outcome": None,
                "started_at": now - timedelta(hours=rnd.random() * 5),
                "ended_at": None,
                "gpus": [i % per_host for i in range(gpu, gpu + k)],
                "host": host_of(gpu),
                "handle": {"pid": 0},
                "argv": ["python"],
                "params": {},
            }
        )
        gpu += k
    for i in range(n_queued):
        spec = bench_spec(i, rnd)
        jid = job("queued", spec, now - timedelta(hours=rnd.random() * 48))
        if rnd.random() < 0.05:
            attempts.append(
                {
                    "job_id": jid,
                    "number": 1,
                    "state": "exited",
                    "outcome": "failed",
                    "started_at": now - timedelta(minutes=20),
                    "ended_at": now - timedelta(minutes=5),
                    "gpus": [0],
                    "handle": {},
                    "argv": [],
                    "params": {},
                }
            )
    samples = [
        {
            "gpu_index": g % per_host,
            "host": host_of(g) or "localhost",
            "verdict": v,
            "taken_at": now - timedelta(minutes=m),
            "data": {"memory_total_mib": GPU_MIB, "memory_used_mib": 0.0},
        }
        for m in (10, 1)
        for g in range(n_gpus)
        # 2 % quarantined: in a cluster, whole hosts (one bad GPU quarantines its host)
        for v in [("CRITICAL" if (g // per_host if cluster else g) % 50 == 7 else "OK")]
    ]
    with store.session() as s:
        s.execute(insert(Job), jobs)
        s.execute(
            insert(Attempt),
            [
                {
                    "metrics_offset": 0,
                    "metrics_cursor": {},
                    "start_step": 0,
                    "executor": "local",
                    **a,
                }
                for a in attempts
            ],
        )
        s.execute(insert(GpuSample), samples)


# ------------------------------------------------------------------------------ measurements
@dataclass
class Row:
    what: str
    value: float
    unit: str
    goal: str = ""
    detail: str = ""


def _rss_mib() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB, from /proc/self/status."""
    got = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                got[key] = float(value.split()[0]) / 1024
    return got.get("VmRSS", 0.0), got.get("VmHWM", 0.0)


def _child(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nightshift.evals.bench_scale", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        **kw,
    )


BATCH = 100  # jobs per submit_many call in the batch measurement


def submit_worker(proc: int, count: int, raw: bool, batch: bool = False) -> None:
    """One submitting process: build the client, say ready, wait for go, submit, report."""
    from nightshift.agent.doors.api import Client
    from nightshift.skills.registry import get_skill

    client = Client()
    client.w.gate  # noqa: B018 - built now, not on the first (timed) submission
    get_skill("submit_job")
    spec = ExperimentSpec(
        name="bench", command=["{python}", "-c", "pass"], resources={"gpus": 1}
    ).model_dump(mode="json")
    store = client.w.store
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    if batch:
        for b in range(0, count, BATCH):
            client.submit_many(
                [{"spec": spec} for _ in range(min(BATCH, count - b))], call_id=f"bench-{proc}-b{b}"
            )
    for i in range(0 if batch else count):
        call_id = f"bench-{proc}-{i}"
        if raw:
            with store.session() as s:
                s.add(Job(name="bench", spec=spec, params={}, submitted_by_call=call_id))
        else:
            client.submit(spec=spec, call_id=call_id)
    print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def bench_submit(procs: int, per_proc: int, *, raw: bool = False, batch: bool = False) -> Row:
    """`procs` processes submitting `per_proc` jobs each into one fresh store, started together."""
    with tempfile.TemporaryDirectory(prefix="ns-bench-") as tmp:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")},
            "NIGHTSHIFT_HOME": tmp,
        }
        Store(f"sqlite:///{tmp}/nightshift.db").engine.dispose()  # the schema, created once
        kids = [
            _child(
                ["--submit-worker", str(p), str(per_proc)]
                + (["--raw"] if raw else [])
                + (["--batch"] if batch else []),
                env,
            )
            for p in range(procs)
        ]
        for kid in kids:
            assert kid.stdout is not None
            line = kid.stdout.readline().strip()
            if line != "ready":
                kid.wait()
                raise RuntimeError(f"a submitting process failed to start (exit {kid.returncode})")
        t0 = time.perf_counter()
        for kid in kids:
            assert kid.stdin is not None
            kid.stdin.write("go\n")
            kid.stdin.flush()
        took = []
        for kid in kids:
            out, _ = kid.communicate()
            if kid.returncode:
                raise RuntimeError(f"a submitting process exited with {kid.returncode}")
            took.append(json.loads(out.strip().splitlines()[-1])["seconds"])
        wall = max(took)  # from "go" to the last process's last submission, without exits
        assert wall <= time.perf_counter() - t0
        store = Store(f"sqlite:///{tmp}/nightshift.db")
        with store.session() as s:
            calls = list(s.execute(select(Job.submitted_by_call)).scalars())
        store.engine.dispose()
    want = (
        {f"bench-{p}-b{b - b % BATCH}#{b % BATCH}" for p in range(procs) for b in range(per_proc)}
        if batch
        else {f"bench-{p}-{i}" for p in range(procs) for i in range(per_proc)}
    )
    lost, dup = len(want - set(calls)), len(calls) - len(set(calls))
    if lost or dup or len(calls) != len(want):
        raise RuntimeError(
            f"{lost} submissions lost, {dup} duplicated, {len(calls)} rows for "
            f"{len(want)} submissions"
        )
    total = procs * per_proc
    how = (
        "rows straight into the store (no gate, no audit)"
        if raw
        else f"Client().submit_many, {BATCH} per call"
        if batch
        else "Client().submit"
    )
    return Row(
        f"submissions/s, {procs} process{'es' if procs > 1 else ''}, {how}",
        total / wall,
        "jobs/s",
        ">= 1,000/s" if procs == 4 and not raw else "",
        f"{total} jobs in {wall:.2f} s; none lost or duplicated",
    )


def bench_place(snap: Snapshot, repeats: int) -> Row:
    place(snap)  # warm: the first call pays for imports and caches
    times, cpu = [], []
    d = None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        d = place(snap)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert d is not None
    ms = [t * 1000 for t in times]
    return Row(
        f"place(): {len(snap.pending):,} pending, {len(snap.gpus)} GPUs, "
        f"{len(snap.running)} running",
        statistics.median(ms),
        "ms (median)",
        "<= 20 ms",
        f"min {min(ms):.1f}, max {max(ms):.1f} ms over {repeats}; CPU median "
        f"{statistics.median(cpu) * 1000:.1f} ms; {len(d.starts)} starts, "
        f"{len(d.holds)} holds, {len(d.preemptions)} preemptions",
    )


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def _in_turn(names: list[str], n: int) -> list[str]:
    """`names` from the n-th on, then the rest: each called first in turn, call by call."""
    k = n % len(names)
    return names[k:] + names[:k]


def bench_place_many(
    label: str, places: dict[str, Any], snaps: Iterator[Snapshot], repeats: int
) -> list[Row]:
    """Each `place` of `places` on the next of `snaps` (one snapshot again and again, or a
    queue that changes), interleaved call by call, each first in turn, so that load on the
    machine falls on all alike; median and p95. Their decisions must be the same."""
    first = next(snaps)
    for place_fn in places.values():
        place_fn(first)  # warm: imports, caches, the columns of the first snapshot
    wall: dict[str, list[float]] = {k: [] for k in places}
    cpu: dict[str, list[float]] = {k: [] for k in places}
    got: dict[str, Any] = {}
    names = list(places)
    for n in range(repeats):
        snap = next(snaps)
        # each first in turn: on a snapshot of new objects the copy called second was the
        # slower, whichever it was (stop 50: 183-187 ms first, 213-219 ms second)
        for name in _in_turn(names, n):
            place_fn = places[name]
            c0, t0 = time.process_time(), time.perf_counter()
            got[name] = place_fn(snap)
            wall[name].append((time.perf_counter() - t0) * 1000)
            cpu[name].append((time.process_time() - c0) * 1000)
        dumps = [d.model_dump() for d in got.values()]
        if any(x != dumps[0] for x in dumps[1:]):
            raise RuntimeError(f"{label}: the placements compared decided differently")
    rows = []
    for name in places:
        d = got[name]
        w, c = wall[name], cpu[name]
        rows.append(
            Row(
                f"place(), {name}: {label}",
                statistics.median(w),
                "ms (median)",
                "<= 50 ms" if len(first.pending) >= 100_000 else "<= 20 ms",
                f"p95 {_pct(w, 95):.1f} ms; CPU median {statistics.median(c):.1f}, p95 "
                f"{_pct(c, 95):.1f} ms; {repeats} calls; last: {len(d.starts)} starts, "
                f"{len(d.holds)} holds",
            )
        )
    return rows


def store_ticks(store: Store, seed: int = 1, tick_s: float = DAEMON_TICK_S) -> Iterator[datetime]:
    """Change `store` between a daemon's ticks as `tick_snapshots` changes a snapshot: a minute
    later each time, 0.5 % of the queued jobs gone (failed) and as many submitted (copies of
    queued ones under new ids), three priorities raised, 1 % of the running jobs finished;
    yields the tick's time. (The ticks' starts are recorded by `start_in_store`.) `tick_s`:
    another time between ticks, with as many jobs gone, submitted and finished per minute (at
    least one of each a tick)."""
    rnd = random.Random(seed)
    table = Job.__table__
    with store.session() as s:
        queued = list(s.execute(select(Job.id).where(Job.state == "queued")).scalars())
        next_id = int(s.execute(select(func.max(Job.id))).scalar_one()) + 1
    share = tick_s / 60.0  # churn is per minute
    churn, now = max(1, int(len(queued) / 200 * share)), NOW
    while True:
        now += timedelta(seconds=tick_s)
        gone = [queued.pop(rnd.randrange(len(queued))) for _ in range(churn)]
        with store.session() as s:
            for job_id in gone:
                lifecycle.fail_queued(s, job_id, "gone from the queue (bench)", now)
            rows = [
                dict(r)
                for r in s.execute(
                    select(table).where(Job.id.in_(rnd.sample(queued, churn)))
                ).mappings()
            ]
            for r in rows:
                r.update(id=next_id, submitted_by_call=f"bench-{next_id}", created_at=now)
                queued.append(next_id)
                next_id += 1
            s.execute(insert(Job), rows)
            for job_id in rnd.sample(queued, 3):
                s.get_one(Job, job_id).priority += 1
            live = list(
                s.exec(
                    sqlmodel_select(Attempt).where(Attempt.state == "running").order_by(Attempt.id)
                ).all()
            )
            for att in rnd.sample(live, min(len(live), max(1, int(len(live) / 100 * share)))):
                lifecycle.end_attempt(s, att, Ended(AttemptState.EXITED, exit_code=0), now)
        yield now


def start_in_store(store: Store, snap: Snapshot, starts: list[Any], now: datetime) -> None:
    """Record placement's starts as the engine does before it launches (the job claimed, a
    running attempt on the GPUs given, a gang's on each host), launching nothing."""
    with store.session() as s:
        for start in starts:
            if lifecycle.claim(s, start.job_id, now) is None:
                continue
            ranks = by_host(snap, start.gpus)
            number = len(
                s.exec(sqlmodel_select(Attempt.id).where(Attempt.job_id == start.job_id)).all()
            )
            s.add(
                Attempt(
                    job_id=start.job_id,
                    number=number + 1,
                    state="running",
                    gpus=[i for r in ranks for i in r.gpus],
                    host=gang_host(ranks),
                    started_at=now,
                    executor="ray",
                )
            )


def bench_daemon_ticks(
    n_pending: int,
    n_gpus: int,
    repeats: int,
    places: dict[str, Any] | None = None,
    tick_s: float = DAEMON_TICK_S,
) -> list[Row]:
    """The daemon's placement step from a SQLite store (`load_snapshot` + `place()` on a Ray
    cluster of GPUS_PER_HOST-GPU hosts, under the daemon's scheduler defaults, its starts then
    recorded) over ticks that change the queue (`store_ticks`): loading with
    the previous tick's jobs kept (`previous=`, as the engine does), then without, each over its
    own store that the same seed changes alike (placement's caches are per process: interleaved,
    one mode's new objects would push the other's out); their decisions must be the same. Each
    of `places` (default: this tree's) places every tick's snapshot, first in turn; `tick_s`
    apart (`store_ticks`)."""
    places = places or {"this tree": place}
    rows, decisions = [], []
    for mode, previous in (("jobs kept between ticks", {}), ("all new", None)):
        load_ms: list[float] = []
        place_ms: dict[str, list[float]] = {name: [] for name in places}
        made: list[Any] = []
        with tempfile.TemporaryDirectory(prefix="ns-ticks-") as tmp:
            store = Store(f"sqlite:///{tmp}/nightshift.db")
            populate(store, n_pending, n_gpus, cluster=HOST_PREFIX)
            ticks = store_ticks(store, tick_s=tick_s)
            for i in range(repeats + 2):  # two warm-up ticks: imports, caches, first columns
                now = next(ticks)
                t0 = time.perf_counter()
                snap = load_snapshot(
                    store,
                    now,
                    cpu_slots=4,
                    tariff=night_tariff(),
                    cluster=HOST_PREFIX,
                    previous=previous,
                ).model_copy(update=daemon_order())
                t1 = time.perf_counter()
                names = list(places)
                got = {}
                for name in _in_turn(names, i):
                    t2 = time.perf_counter()
                    got[name] = places[name](snap)
                    if i >= 2:
                        place_ms[name].append((time.perf_counter() - t2) * 1000)
                dumps = [d.model_dump() for d in got.values()]
                if any(x != dumps[0] for x in dumps[1:]):
                    raise RuntimeError("the placements compared decided differently")
                made.append(dumps[0])
                start_in_store(store, snap, got[names[-1]].starts, now)
                if i >= 2:
                    load_ms.append((t1 - t0) * 1000)
            store.engine.dispose()
        decisions.append(made)
        for name, ms in place_ms.items():
            rows.append(
                Row(
                    f"place(){'' if len(places) == 1 else f', {name},'} in the daemon's tick, "
                    f"{mode}: {n_pending:,} pending, {n_gpus:,} GPUs from SQLite, a changing "
                    f"queue{'' if tick_s == DAEMON_TICK_S else f', ticks {tick_s:g} s apart'}",
                    statistics.median(ms),
                    "ms (median)",
                    "<= 50 ms" if n_pending >= 100_000 else "<= 20 ms",
                    f"p95 {_pct(ms, 95):.1f} ms; load_snapshot() median "
                    f"{statistics.median(load_ms):,.0f} ms (p95 {_pct(load_ms, 95):,.0f}); "
                    f"{repeats} ticks",
                )
            )
    if decisions[0] != decisions[1]:
        raise RuntimeError("the daemon's ticks decided differently with jobs kept")
    return rows


def bench_engine_ticks(n_pending: int, n_gpus: int, repeats: int, heap: bool) -> Row:
    """The daemon's whole tick (`Engine.place_queued`) over a store changed between ticks, the
    engine's own scheduler settings; median and p95 after two warm-up ticks. With `heap`, each
    tick ends as the daemon's do (`TickHeap.after_tick`, counted in the tick)."""
    from nightshift.agent.brain.tick_heap import TickHeap
    from nightshift.runtime.config import Settings
    from nightshift.runtime.engine import Engine

    tick_s: list[float] = []
    kept = TickHeap() if heap else None
    with tempfile.TemporaryDirectory(prefix="ns-engine-") as tmp:
        store = Store(f"sqlite:///{tmp}/nightshift.db")
        populate(store, n_pending, n_gpus)
        ticks = store_ticks(store)
        engine = Engine(store, NullExecutor(), Settings(home=tmp), clock=lambda: NOW)
        try:
            for i in range(repeats + 2):
                now = next(ticks)
                t0 = time.perf_counter()
                engine.place_queued(now)
                if kept is not None:
                    kept.after_tick()
                if i >= 2:
                    tick_s.append(time.perf_counter() - t0)
        finally:
            TickHeap.release()
        store.engine.dispose()
    return Row(
        f"the daemon's whole tick (Engine.place_queued: load, place, hold reasons written, "
        f"starts){', the heap frozen after each (TickHeap)' if heap else ''}: {n_pending:,} "
        f"queued, {n_gpus:,} GPUs in SQLite, a changing queue",
        statistics.median(tick_s),
        "s (median)",
        "",
        f"p95 {_pct(tick_s, 95):.2f} s; {repeats} ticks",
    )


def run_engine_ticks(quick: bool, csv_path: str | None, console: Console) -> list[Row]:
    sizes = [(1_000, 64)] if quick else [(10_000, 512), (100_000, 4_096)]
    rows = [
        bench_engine_ticks(n, g, 3 if quick else 7, heap)
        for n, g in sizes
        for heap in (False, True)
    ]
    _print(rows, f"the daemon's tick ({'quick' if quick else 'full'})", csv_path, console)
    return rows


def load_placement(path: str) -> Any:
    """Another version of placement.py (say `git show REV:runtime/scheduling/placement.py`),
    loaded as a module of its own beside today's. With a pending_columns.py beside it (say
    `git archive REV runtime/scheduling | tar -x -C DIR`, then DIR/runtime/scheduling/
    placement.py), that version's columns come with it: the placement loaded reads its own,
    and a job changed in place is forgotten by both."""
    import importlib.util
    import types

    from nightshift.runtime.scheduling import pending_columns

    source = Path(path).read_text()
    columns_py = Path(path).with_name("pending_columns.py")
    if columns_py.is_file() and columns_py.resolve() != Path(pending_columns.__file__).resolve():
        spec = importlib.util.spec_from_file_location("pending_columns_compared", columns_py)
        assert spec is not None and spec.loader is not None
        theirs = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = theirs
        spec.loader.exec_module(theirs)
        ours_forget, ours_renewed = pending_columns.forget, pending_columns.renewed

        def forget(job: object) -> None:
            ours_forget(job)
            theirs.forget(job)

        def renewed(job: object) -> None:
            ours_renewed(job)
            theirs.renewed(job)

        pending_columns.forget, pending_columns.renewed = forget, renewed  # type: ignore[assignment]
        source = source.replace(
            "from nightshift.runtime.scheduling import pending_columns\n",
            "import pending_columns_compared as pending_columns\n",
        ).replace(
            "from nightshift.runtime.scheduling.pending_columns import",
            "from pending_columns_compared import",
        )
    mod = types.ModuleType("placement_compared")
    mod.__file__ = path
    sys.modules[mod.__name__] = mod
    exec(compile(source, path, "exec"), mod.__dict__)
    return mod


def run_place_only(
    quick: bool,
    compare_with: str | None,
    csv_path: str | None,
    console: Console,
    tick_s: float = DAEMON_TICK_S,
) -> list[Row]:
    places: dict[str, Any] = {"this tree": place}
    if compare_with:
        places = {"compared": load_placement(compare_with).place, **places}
    sizes = [(1_000, 64), (10_000, 256)] if quick else [(10_000, 512), (100_000, 4_096)]
    repeats = 5 if quick else 21
    rows: list[Row] = []
    for n_pending, n_gpus in sizes:
        snap = synthetic_snapshot(n_pending, n_gpus)
        size = f"{n_pending:,} pending, {n_gpus:,} GPUs"
        rows += bench_place_many(
            f"{size}, the same snapshot", places, itertools.repeat(snap), repeats
        )
        rows += bench_place_many(f"{size}, a changing queue", places, tick_snapshots(snap), repeats)
        rows += bench_place_many(
            f"{size}, every job a new object", places, fresh_snapshots(snap), repeats
        )
        daemon = snap.model_copy(update=daemon_order())
        rows += bench_place_many(
            f"{size}, the same snapshot, the daemon's scheduler defaults (srpt, best fit...)",
            places,
            itertools.repeat(daemon),
            repeats,
        )
        rows += bench_daemon_ticks(n_pending, n_gpus, 3 if quick else 11, places, tick_s)
    _print(rows, f"place() ({'quick' if quick else 'full'})", csv_path, console)
    return rows


def bench_load(url: str, repeats: int) -> tuple[Row, Row]:
    store = Store(url)
    load_snapshot(store, NOW)  # warm the page cache and SQLAlchemy's statement cache
    times = []
    snap = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        snap = load_snapshot(store, NOW, cpu_slots=4, tariff=night_tariff(), preempt_margin=5)
        times.append(time.perf_counter() - t0)
    assert snap is not None
    ms = [t * 1000 for t in times]
    load = Row(
        f"load_snapshot(): {len(snap.pending):,} queued jobs from SQLite",
        statistics.median(ms),
        "ms (median)",
        "",
        f"min {min(ms):.0f}, max {max(ms):.0f} ms over {repeats}; {len(snap.running)} "
        f"running, {len(snap.gpus)} GPUs",
    )
    placed = bench_place(snap, repeats)
    placed.what = "place() on the loaded snapshot"
    placed.goal = ""
    store.engine.dispose()
    return load, placed


def bench_postgres_load(url: str, n_pending: int, n_gpus: int, repeats: int) -> list[Row]:
    """(f): load_snapshot from an empty PostgreSQL database filled by `populate`, by its own path
    and by the generic one (the dialect named otherwise for those loads), each first in turn."""
    store = Store(url)
    if store.engine.dialect.name != "postgresql":
        raise SystemExit(f"--postgres needs a PostgreSQL URL, not {url}")
    with store.session() as s:
        if s.execute(select(func.count()).select_from(Job)).scalar_one():
            raise SystemExit(f"--postgres needs an empty database; {url} has jobs")
    populate(store, n_pending, n_gpus)
    paths = {
        "PostgreSQL's own path (fields as one array, parameters as text)": "postgresql",
        "the generic path (every spec and parameters decoded in Python)": "postgresql-generic",
    }
    kept: dict[str, dict[int, PendingJob]] = {label: {} for label in paths}
    times: dict[str, list[float]] = {label: [] for label in paths}
    pending: dict[str, int] = {}
    try:
        for i in range(repeats + 1):  # the first load of each (nothing kept yet) is not counted
            for label in _in_turn(list(paths), i):
                store.engine.dialect.name = paths[label]
                t0 = time.perf_counter()
                snap = load_snapshot(store, NOW, previous=kept[label])
                if i:
                    times[label].append(time.perf_counter() - t0)
                pending[label] = len(snap.pending)
    finally:
        store.engine.dialect.name = "postgresql"
        store.engine.dispose()
    return [
        Row(
            f"load_snapshot() from PostgreSQL, {label}: {pending[label]:,} queued, {n_gpus:,} "
            "GPUs, jobs kept between loads",
            statistics.median(t),
            "s (median)",
            "",
            f"min {min(t):.2f}, max {max(t):.2f} s over {repeats}",
        )
        for label, t in times.items()
    ]


def run_postgres_load(url: str, quick: bool, csv_path: str | None, console: Console) -> list[Row]:
    n, g = (1_000, 64) if quick else (100_000, 4_096)
    rows = bench_postgres_load(url, n, g, 3 if quick else 7)
    _print(
        rows,
        f"the snapshot's load from PostgreSQL ({'quick' if quick else 'full'})",
        csv_path,
        console,
    )
    return rows


class NullExecutor:
    """Starts nothing: every run it is asked about is running. For measuring the loop alone."""

    kind = "null"

    def start(self, req: Any) -> dict[str, Any]:
        return {"key": req.key}

    def find(self, key: str) -> dict[str, Any] | None:
        return None

    def poll(self, handle: dict[str, Any]) -> Any:
        from nightshift.runtime.executors.executor import RunStatus

        return RunStatus(state="running")

    def stop(self, handle: dict[str, Any], grace_s: float = 10.0) -> Any:
        from nightshift.runtime.executors.executor import RunStatus

        return RunStatus(state="exited", exit_code=0)

    def cleanup(self, handle: dict[str, Any], grace_s: float = 10.0) -> list[int]:
        return []

    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        return ""

    def render(self, req: Any) -> str:
        return ""


def rss_worker(url: str, mode: str, home: str) -> None:
    """Report this process's memory holding a Store and an Engine over `url` after one tick
    ("tick"), or after loading the snapshot and placing it ("place")."""
    from nightshift.runtime.config import Settings
    from nightshift.runtime.engine import Engine

    base = _rss_mib()[0]
    store = Store(url)
    engine = Engine(store, NullExecutor(), Settings(home=home), clock=lambda: NOW)
    t0 = time.perf_counter()
    if mode == "tick":
        holds = engine.tick()
        n = len(holds)
    else:
        snap = load_snapshot(store, NOW, cpu_slots=4, tariff=night_tariff(), preempt_margin=5)
        n = len(place(snap).holds)
    took = time.perf_counter() - t0
    rss, hwm = _rss_mib()
    print(json.dumps({"base": base, "rss": rss, "hwm": hwm, "seconds": took, "holds": n}))


def bench_rss(url: str, n_queued: int) -> list[Row]:
    rows = []
    for mode, what in (
        ("tick", "Engine.tick() as the engine is today"),
        ("place", "load_snapshot() + place()"),
    ):
        with tempfile.TemporaryDirectory(prefix="ns-rss-") as tmp:
            db = Path(tmp) / "nightshift.db"
            shutil.copy(url[len("sqlite:///") :], db)
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")},
                "NIGHTSHIFT_HOME": tmp,
            }
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nightshift.evals.bench_scale",
                    "--rss-worker",
                    f"sqlite:///{db}",
                    mode,
                    tmp,
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
        got = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            Row(
                f"daemon memory, {n_queued:,} queued: {what}",
                got["hwm"],
                "MiB (peak)",
                "",
                f"RSS {got['rss']:.0f} MiB after (interpreter and imports: "
                f"{got['base']:.0f} MiB); took {got['seconds'] * 1000:.0f} ms; "
                f"{got['holds']} holds",
            )
        )
    return rows


def run(quick: bool, csv_path: str | None, console: Console) -> list[Row]:
    procs = 4
    per_proc = 25 if quick else 250
    n_pending, n_gpus = (1_000, 64) if quick else (10_000, 512)
    repeats = 5 if quick else 31
    rows = [
        bench_submit(procs, per_proc),
        bench_submit(procs, per_proc, batch=True),
        bench_submit(1, per_proc),
        bench_submit(procs, per_proc, raw=True),
    ]
    rows.append(bench_place(synthetic_snapshot(n_pending, n_gpus), repeats))
    with tempfile.TemporaryDirectory(prefix="ns-load-") as tmp:
        url = f"sqlite:///{tmp}/nightshift.db"
        store = Store(url)
        populate(store, n_pending, n_gpus)
        store.engine.dispose()
        rows.extend(bench_load(url, repeats))
        rows.extend(bench_rss(url, n_pending))

    _print(rows, f"nightshift scale ({'quick' if quick else 'full'})", csv_path, console)
    return rows


def _print(rows: list[Row], title: str, csv_path: str | None, console: Console) -> None:
    table = Table(title=f"{title}; {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    for col in ("measure", "value", "unit", "goal", "detail"):
        table.add_column(col, justify="right" if col == "value" else "left", overflow="fold")
    for r in rows:
        table.add_row(r.what, f"{r.value:,.1f}", r.unit, r.goal, r.detail)
    console.print(table)
    if csv_path:
        with open(csv_path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["measure", "value", "unit", "goal", "detail"])
            for r in rows:
                w.writerow([r.what, f"{r.value:.3f}", r.unit, r.goal, r.detail])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nightshift eval scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument(
        "--csv",
        default="bench_scale.csv",
        help="where to write the figures (default: bench_scale.csv; '' for none)",
    )
    parser.add_argument(
        "--place-only",
        action="store_true",
        help="only (b), at 10,000 x 512 and 100,000 x 4,096, same snapshot and a changing queue",
    )
    parser.add_argument(
        "--engine-ticks",
        action="store_true",
        help="only (e): the daemon's whole tick at 10,000 x 512 and 100,000 x 4,096",
    )
    parser.add_argument(
        "--compare-with",
        metavar="PLACEMENT_PY",
        help="with --place-only: also time this placement.py, interleaved call by call",
    )
    parser.add_argument(
        "--submit-worker", nargs=2, metavar=("PROC", "COUNT"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=DAEMON_TICK_S,
        metavar="S",
        help="with --place-only: the daemon's ticks S seconds apart, with as many jobs "
        "submitted, gone and finished per minute (default 60)",
    )
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="(f) alone: the snapshot's load from this empty PostgreSQL database, filled here",
    )
    parser.add_argument(
        "--rss-worker", nargs=3, metavar=("URL", "MODE", "HOME"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.tick_s <= 0:
        parser.error("--tick-s must be above 0 (seconds between the daemon's ticks)")
    if args.submit_worker:
        submit_worker(int(args.submit_worker[0]), int(args.submit_worker[1]), args.raw, args.batch)
        return 0
    if args.rss_worker:
        rss_worker(*args.rss_worker)
        return 0
    if args.place_only:
        run_place_only(args.quick, args.compare_with, args.csv or None, Console(), args.tick_s)
        return 0
    if args.engine_ticks:
        run_engine_ticks(args.quick, args.csv or None, Console())
        return 0
    if args.postgres:
        run_postgres_load(args.postgres, args.quick, args.csv or None, Console())
        return 0
    if args.compare_with or args.tick_s != DAEMON_TICK_S:
        parser.error("--compare-with and --tick-s need --place-only")
    run(args.quick, args.csv or None, Console())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
