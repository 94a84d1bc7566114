"""The one loop that owns attempts: it places queued jobs, starts them through the executor,
watches them (metrics, progress, timeout, stall) and records how they end.

It observes and places; it never decides a recovery. A failed attempt leaves its job `failed`,
and the agent's `recover` playbook decides what happens next through the policy gate. Every job
state change is reported through `on_event`, which the agent wires to the audit log (runtime
imports nothing above it).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlmodel import Session, col, func, select

from nightshift.runtime.config import Settings
from nightshift.runtime.executors.crashpoints import crash_point
from nightshift.runtime.executors.executor import (
    Executor,
    LaunchRequest,
    RunStatus,
    gang_host,
    gang_ranks,
)
from nightshift.runtime.executors.submitter import RunAs, account_of, submitter_folders
from nightshift.runtime.gpu.gpu import health_sources
from nightshift.runtime.gpu.ray_census import HOST_PREFIX
from nightshift.runtime.scheduling.local_time import local_zone
from nightshift.runtime.scheduling.placement import Decision, PendingJob, RunningJob, place
from nightshift.runtime.scheduling.snapshot import SpecFields, by_host, load_snapshot
from nightshift.runtime.spec import ExperimentSpec, MetricSpec
from nightshift.runtime.store import job_holds, lifecycle, transition_events
from nightshift.runtime.store.db import (
    Attempt,
    CheckpointRecord,
    GpuSample,
    Job,
    MetricPoint,
    Store,
    is_unreadable,
    utcnow,
)
from nightshift.runtime.store.lifecycle import ACTIVE, Ended, JobState, Outcome
from nightshift.runtime.training import (
    checkpoints,
    divergence,
    durations,
    job_history,
    keeper,
    machine_evidence,
    metric_sources,
    provenance,
    stall,
)
from nightshift.runtime.training.attempt_diagnosis import Diagnoser, FailedRun, read_log_tail
from nightshift.runtime.training.divergence import Divergence
from nightshift.runtime.training.early_stop import median_rule, patience_exhausted
from nightshift.runtime.training.machine_evidence import CgroupMemory, MachineEvidence

DEADLINE_MARGIN_S = 300
# A wall-clock jump larger than this between two ticks (beyond the time the monotonic clock saw
# pass) is reported once as a clock step; durations never follow it.
CLOCK_STEP_S = 60.0
# A sleep that ends at a price change ends this much after it, in the new price's window.
PRICE_CHANGE_MARGIN_S = 0.01
EventSink = Callable[[str, dict[str, Any]], None]


CONTAINERS = ("docker", "kubernetes")


def job_workspace(settings: Settings, job_id: int) -> Path:
    """Per-job folder for logs, metrics and (relative) checkpoints."""
    return job_history.job_folder(settings.runs_dir, job_id)


def job_paths(settings: Settings, job: Job) -> dict[str, Path]:
    """The job's folder, checkpoint folder and metrics file; for a stored spec edited into one
    that no longer validates, the folder's defaults (what reads them shows the job all the same;
    the loop fails it and `audit verify` names the row)."""
    try:
        spec = ExperimentSpec.model_validate(job.spec)
    except ValidationError:
        return job_history.paths(settings.runs_dir, job.id, None, MetricSpec().file)
    return job_history.paths(
        settings.runs_dir,
        job.id,
        spec.checkpoint.dir if spec.checkpoint else None,
        spec.metrics.file,
    )


def unreadable(att: Attempt) -> list[str]:
    """The attempt's JSON columns the watch step reads whose stored text is not JSON."""
    return [
        name
        for name in ("handle", "argv", "params", "gpus", "metrics_cursor")
        if is_unreadable(getattr(att, name))
    ]


def first_error(exc: ValidationError) -> str:
    """`spec.<field>: <message>` of a spec's first validation error."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    return f"spec.{'.'.join(str(p) for p in errors[0]['loc'])}: {errors[0]['msg']}"


def metric_roots(paths: dict[str, Path]) -> list[Path]:
    """Where metric files a program writes are looked for: the job's folder, and the checkpoint
    folder when it lies elsewhere."""
    ws, ckpt = paths["workspace"], paths["checkpoint_dir"]
    return [ws] if ckpt.is_relative_to(ws) else [ws, ckpt]


def _utc(seconds: float, fallback: datetime) -> datetime:
    """A source's own time (seconds since the epoch) as the store keeps times, naive UTC; the
    read time when it cannot be one."""
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return fallback


class Engine:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        settings: Settings,
        on_event: EventSink | None = None,
        clock: Callable[[], datetime] = utcnow,
        paused: Callable[[], str | None] = lambda: None,
        mono: Callable[[], float] = time.monotonic,
        diagnose: Diagnoser | None = None,
    ):
        self.store, self.executor, self.settings = store, executor, settings
        # Why a failed attempt failed, kept with it as it ends (the wiring hands in the
        # diagnose_failure classifier; runtime imports nothing above it). None: not diagnosed.
        self.diagnose = diagnose
        self.on_event = on_event or (lambda action, payload: None)
        self.clock = clock  # the wall clock: tariffs, deadlines and what the records show
        # Durations (timeouts, stalls) are measured on the monotonic clock of this boot.
        self.mono = mono
        self.boot_id = durations.boot_id()
        self._last_clocks: tuple[datetime, float] | None = None
        self.paused = paused  # returns why new work may not start (the kill switch), or None
        # Which queued jobs this loop may start; None = all (the daemon). A `nightshift run`
        # without a daemon starts only its own goal's jobs.
        self.scope: Callable[[], set[int]] | None = None
        # Passive: another process (the daemon) owns the loop; only read the store.
        self.passive = False
        self.last_decision: Decision | None = None
        # The running jobs as the last placement saw them (expected ends, deadlines): the
        # daemon's peak power cap reads them (agent/brain/power_caps.py).
        self.last_running: list[RunningJob] = []
        # The waiting jobs of the last snapshot: a job unchanged since is the same object at the
        # next tick, and placement finds its fields by identity instead of reading them again.
        self.waiting: dict[int, PendingJob] = {}
        self.spec_fields = SpecFields()  # each loaded job's spec fields, by their revision
        # What a background or waiting tick runs: this engine's tick, or the whole loop's step
        # (agent/brain/loop.py: health checks, preemption, recovery around the tick).
        self.step: Callable[[], object] = self.tick
        # Set by the wiring where jobs are mirrored to MLflow: what a launch adds to the job's
        # environment (bounded: runtime/training/mlflow_mirror.py's env_for).
        self.run_env: Callable[[int | None], dict[str, str]] | None = None
        self._lock = threading.Lock()
        # package lists read after a launch (runtime/training/provenance.py), on one thread
        self._later_lock = threading.Lock()
        self._later: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ one tick
    def tick(self) -> dict[int, str]:
        """Watch what runs, then place what waits. Returns the hold reason of each waiting job."""
        with self._lock:
            now = self.clock()
            self._check_clock_step(now)
            self.watch_running(now)
            why = self.paused()
            if why:
                with self.store.session() as s:  # ids only: the rows are wide (specs)
                    queued = list(s.exec(select(Job.id).where(Job.state == JobState.QUEUED)))
                holds = dict.fromkeys(queued, why)
                self._record_holds(queued, holds)
                return holds
            return self.place_queued(now)

    def _check_clock_step(self, now: datetime) -> None:
        """Report a wall-clock step (an NTP jump, a hand-set clock) once: durations ignore it,
        but tariff windows and deadlines, which are wall-clock times, move with it."""
        mono = self.mono()
        last, self._last_clocks = self._last_clocks, (now, mono)
        if last is None:
            return
        step_s = (now - last[0]).total_seconds() - (mono - last[1])
        if abs(step_s) > CLOCK_STEP_S:
            self.on_event(
                "clock.stepped",
                {
                    "by_s": round(step_s, 1),
                    "wall_before": last[0].isoformat(),
                    "wall_after": now.isoformat(),
                    "effect": "timeouts and stalls follow the monotonic clock; tariff windows "
                    "and deadlines follow the wall clock",
                },
            )

    def wait_s(self) -> float:
        """How long the loop sleeps before its next tick: `loop.poll_interval_s`, ended just
        after the tariff's next price change when that comes sooner, so holds and power caps
        follow the price at once whatever the poll interval."""
        poll = self.settings.loop.poll_interval_s
        tariff = self.settings.tariff
        if tariff is None:
            return poll
        now = self.clock()
        pieces = tariff.pieces(now, now + timedelta(seconds=poll))
        if len(pieces) < 2:
            return poll
        return min(poll, (pieces[1].start - now).total_seconds() + PRICE_CHANGE_MARGIN_S)

    def start_background(self) -> None:
        """Tick in a thread, so runs are watched and placed while the agent waits (on a human)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(self.wait_s())

        self._thread = threading.Thread(target=loop, name="nightshift-loop", daemon=True)
        self._thread.start()

    def stop_background(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain_provenance()

    def run_until_settled(
        self,
        job_ids: Iterable[int],
        *,
        on_tick: Callable[[], None] | None = None,
        deadline_s: float | None = None,
    ) -> dict[int, str]:
        """Until none of `job_ids` is queued or running (ticking here unless a background loop
        does); returns their final states."""
        ids = list(job_ids)
        start = time.monotonic()
        while True:
            if not self.passive and (self._thread is None or not self._thread.is_alive()):
                self.step()
            states = self._states(ids)
            if on_tick:
                on_tick()
            if all(s not in ACTIVE for s in states.values()):
                return states
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                return states
            time.sleep(self.settings.loop.poll_interval_s)

    def _states(self, ids: list[int]) -> dict[int, str]:
        with self.store.session() as s:
            return {j.id: j.state for j in s.exec(select(Job).where(Job.id.in_(ids)))}

    # ------------------------------------------------------------------ placement
    def place_queued(self, now: datetime) -> dict[int, str]:
        """Load the snapshot, call the one placement function, carry out its starts and the
        pauses the spec allowed (the cheap window closed); keep preemption proposals for the
        daemon, which passes them through the policy gate."""
        sched = self.settings.scheduler
        snap = load_snapshot(
            self.store,
            now,
            cpu_slots=self.settings.loop.cpu_slots,
            backoff=self.settings.retry,
            tariff=self.settings.tariff,
            scope=self.scope() if self.scope is not None else None,
            node=self.settings.node,
            cluster=self.cluster,
            tz=local_zone(sched.display_tz),
            mono=(self.mono(), self.boot_id),
            health_sources=health_sources(self.settings),
            recovery_interval_s=self.settings.loop.health_interval_min * 60,
            previous=self.waiting,
            spec_fields=self.spec_fields,
        )
        snap = snap.model_copy(
            update={
                **sched.snapshot_fields(),  # the scheduler settings, all in one place
                # Only the Ray executor launches one run across hosts (a worker per host): with
                # any other a gang waits, saying so, and never starts on part of its GPUs.
                "cannot_span": None
                if self.cluster
                else f"executor {self.executor.kind} cannot span hosts",
            }
        )
        self.last_running = snap.running
        if not snap.pending and not snap.running:
            return {}
        decision = place(snap)
        self.last_decision = decision
        self._record_holds([p.id for p in snap.pending], decision.holds, decision.shared_tails)
        for start in decision.starts:
            host, gpus = "", start.gpus
            if self.cluster:  # the hosts' own GPU indices, rank by rank for a gang
                ranks = by_host(snap, start.gpus)
                host, gpus = gang_host(ranks), [i for r in ranks for i in r.gpus]
            self.start_attempt(start.job_id, gpus, now, host=host)
        for pause in decision.pauses:
            self.pause_job(pause.job_id, now, outcome=Outcome.PAUSED, why=pause.reason)
        return decision.holds

    def pause_job(self, job_id: int, now: datetime, *, outcome: Outcome, why: str) -> bool:
        """Stop a job's live attempt at its last checkpoint; the job becomes `paused` and the
        recover playbook requeues it from that checkpoint. False when nothing was running."""
        with self.store.session() as s:
            att = s.exec(
                select(Attempt).where(Attempt.job_id == job_id, Attempt.state == "running")
            ).first()
        if att is None:
            return False
        self._stop_for(att, now, outcome, why)
        return True

    def _record_holds(
        self, pending: list[int], holds: dict[int, str], tails: dict[str, str] | None = None
    ) -> None:
        """Keep each waiting job's reason in the store for `nightshift jobs`: only the changes,
        in a table of their own, with the clauses many share and that move from tick to tick
        (`tails`: the reservation, the CPU slots' holders) kept once for this node's loop."""
        if not pending:
            return
        with self.store.session() as s:
            job_holds.record(s, pending, holds, tails=tails, loop=self.settings.node)

    # ------------------------------------------------------------------ starting
    @property
    def cluster(self) -> str | None:
        """The host prefix of the cluster whose GPUs placement places on ("ray:"), or None
        when the GPUs are this node's."""
        return HOST_PREFIX if self.settings.executor.kind == "ray" else None

    def start_attempt(
        self, job_id: int, gpus: list[int], now: datetime, *, host: str = ""
    ) -> Attempt | None:
        """Claim the job, record the attempt, then launch under a key derived from its id, so a
        crash in between is finished by `recover_starting` without launching twice.

        The claim (queued -> running) is the transaction's first statement, a conditional update:
        it takes SQLite's write lock before anything is read, so of two loops placing the same job
        (`nightshift run` and a daemon started later) one claims it and the other gets None."""
        with self.store.write_session() as s:
            job = lifecycle.claim(s, job_id, now)
            if job is None:
                return None  # another loop started it, or it left the queue since the snapshot
            tampered = transition_events.unaudited_content(s, job)
            if tampered is not None:
                lifecycle.move_job(s, job, JobState.FAILED, now, reason=f"not launched: {tampered}")
                return None
            number = len(list(s.exec(select(Attempt.id).where(Attempt.job_id == job_id)))) + 1
            paths = job_paths(self.settings, job)
            spec = ExperimentSpec.model_validate(job.spec)
            log_path = paths["workspace"] / f"attempt-{number}.log"
            cursor = metric_sources.start_cursor(
                spec.metrics,
                log_path=log_path,
                metrics_file=paths["metrics_file"],
                search_roots=metric_roots(paths),
                min_step=job.resume_step or 0,
            )
            att = Attempt(
                job_id=job_id,
                number=number,
                node=self.settings.node,
                host=host,
                gpus=gpus,
                params=dict(job.params),
                start_step=job.resume_step or 0,
                started_at=now,
                last_progress_at=now,
                boot_id=self.boot_id,
                started_mono=self.mono(),
                progress_mono=self.mono(),
                metrics_cursor={"metrics": cursor},
                log_path=str(log_path),
            )
            s.add(att)
            s.flush()
            # Only where the copy will go: the copy itself is made before the launch, outside
            # this transaction, which holds the store's write lock.
            checkpoint = job.resume_from and keeper.restored_path(
                job.resume_from, paths["workspace"]
            )
            att.argv = self.render_argv(job, paths, checkpoint)
            s.add(att)
            lifecycle.started(s, job, att, gpus=gpus, argv=att.argv)
        crash_point("attempt.claimed")
        return self._launch(att)

    def render_argv(
        self, job: Job, paths: dict[str, Path], checkpoint: str | None = None
    ) -> list[str]:
        spec = ExperimentSpec.model_validate(job.spec)
        spec.base_dir = str(Path(job.spec_path).parent) if job.spec_path else spec.base_dir
        builtins = {
            "python": spec.environment.python
            or ("python3" if self._in_image(spec) else sys.executable),
            "checkpoint_dir": str(paths["checkpoint_dir"]),
            "metrics_file": str(paths["metrics_file"]),
            "run_dir": str(paths["workspace"]),
        }
        argv = spec.render(job.params, builtins)
        if job.resume_from and spec.checkpoint:
            extra = {
                **builtins,
                "checkpoint": checkpoint or job.resume_from,
                "step": str(job.resume_step or 0),
            }
            argv += [a.format(**extra) for a in spec.checkpoint.resume_arg]
        return argv

    def _in_image(self, spec: ExperimentSpec) -> bool:
        """Whether the run sees an image's file system, not this host's: the spec names an
        image, or every run is a pod (Kubernetes, with `executor.kubernetes.image` by default).
        Then `{python}` is the image's python3 and the code and job folders are mounted."""
        return bool(spec.environment.image) or self.settings.executor.kind == "kubernetes"

    def _request(self, att: Attempt, job: Job) -> LaunchRequest:
        spec = ExperimentSpec.model_validate(job.spec)
        spec.base_dir = str(Path(job.spec_path).parent) if job.spec_path else None
        paths = job_paths(self.settings, job)
        run_as = account_of(job.owner) if self.settings.jobs_run_as_submitter else None
        if run_as is None:
            for p in (paths["workspace"], paths["checkpoint_dir"], paths["metrics_file"].parent):
                p.mkdir(parents=True, exist_ok=True)
        else:
            submitter_folders(run_as, paths)
        env = {
            **spec.environment.env,
            # MLFLOW_TRACKING_URI and MLFLOW_RUN_ID where jobs are mirrored to MLflow
            **(self.run_env(job.id) if self.run_env is not None else {}),
            "NIGHTSHIFT_JOB_ID": str(job.id),
            "NIGHTSHIFT_ATTEMPT": str(att.number),
            "PYTHONUNBUFFERED": "1",
        }
        mounts = []
        if self._in_image(spec):
            # In a container the code and the job's folder sit at the same paths as on the host,
            # so the rendered argv ({checkpoint_dir}, {metrics_file}) means the same in both.
            mounts = [
                {"source": str(spec.run_dir()), "target": str(spec.run_dir()), "read_only": True},
                {
                    "source": str(paths["workspace"]),
                    "target": str(paths["workspace"]),
                    "read_only": False,
                },
            ]
            if paths["checkpoint_dir"].resolve() != paths["workspace"] and not paths[
                "checkpoint_dir"
            ].resolve().is_relative_to(paths["workspace"]):
                mounts.append(
                    {
                        "source": str(paths["checkpoint_dir"]),
                        "target": str(paths["checkpoint_dir"]),
                        "read_only": False,
                    }
                )
            mounts += [m.model_dump() for m in spec.environment.mounts]
        res = spec.resources
        return LaunchRequest(
            key=att.key,
            argv=att.argv,
            cwd=str(spec.run_dir()),
            env=env,
            gpus=att.gpus,
            host=att.host,
            ranks=gang_ranks(att.host, att.gpus),
            log_path=att.log_path or "",
            image=spec.environment.image,
            run_as=run_as,
            # A container or pod runs as the submitter's uid:gid (the local executor's supervisor
            # switches to the account itself).
            user=run_as.owner
            if run_as is not None and self.settings.executor.kind in CONTAINERS
            else None,
            mounts=mounts,
            network_mode=spec.environment.network_mode,
            memory_gb=res.host_memory_gb,
            cpus=res.cpus,
            labels={
                "nightshift.job": str(job.id),
                "nightshift.attempt": str(att.number),
                # What a cluster executor schedules by: a priority class, and a deadline that
                # backs up the loop's own timeout_min (a few minutes later, so the loop's stop,
                # at a checkpoint, comes first while a daemon watches).
                "nightshift.priority": str(job.priority),
                **(
                    {"nightshift.timeout_s": f"{spec.timeout_min * 60 + DEADLINE_MARGIN_S:g}"}
                    if spec.timeout_min
                    else {}
                ),
            },
        )

    def _launch(self, att: Attempt) -> Attempt:
        job = self.store.job(att.job_id)
        assert job is not None
        self._stop_leftovers(att)
        self._restore_kept(att, job)
        self._record_provenance(att, job)
        try:
            handle = self.executor.start(self._request(att, job))
        except Exception as exc:  # the run never started: record why, leave recovery to the agent
            self._finish(
                att.id,
                RunStatus(state="exited", exit_code=None, detail=f"could not start: {exc}"),
                self.clock(),
                outcome=Outcome.FAILED,
                reason=f"could not start: {exc}",
            )
            return self._attempt(att.id)
        with self.store.write_session() as s:
            row = s.get(Attempt, att.id)
            lifecycle.attempt_running(s, row, handle, self.executor.kind)
        crash_point("attempt.running")
        return self._attempt(att.id)

    def _record_provenance(self, att: Attempt, job: Job) -> None:
        """Read what makes this attempt reproducible (runtime/training/provenance.py) and keep it
        with the attempt, once: a launch finished by `recover_starting` keeps the first reading.
        Bounded by `loop.provenance_budget_s`; a capture that fails is a note, never a failed
        launch. (`att` is as the launch read it; the write below checks the row again.)"""
        if att.provenance is not None:
            return
        budget = self.settings.loop.provenance_budget_s
        try:
            record = provenance.capture(
                self._provenance_inputs(att, job),
                self.settings.home_path,
                budget,
                packages_later=budget > 0,
            )
        except Exception as exc:  # capture() notes its own failures; this is a last resort
            record = {"version": provenance.VERSION, "note": f"not captured: {exc}"}
        with self.store.write_session() as s:
            row = s.get(Attempt, att.id)
            if row is not None and row.provenance is None:
                row.provenance = record
                s.add(row)
        python = record.get("python")
        if isinstance(python, dict) and python.get("pending"):
            self._read_packages_later(att.id, str(python.get("interpreter")), self._reader(job))

    def _reader(self, job: Job) -> RunAs | None:
        """Whose rights the attempt's code, data and interpreter are read with: its submitter's
        where jobs run as their submitters (as the launch itself), else this process's own."""
        return account_of(job.owner) if self.settings.jobs_run_as_submitter else None

    def _read_packages_later(
        self, attempt_id: int | None, interpreter: str, as_user: RunAs | None = None
    ) -> None:
        """A package list not yet cached is read on one worker thread after the launch (`pip
        freeze` takes a second or more; the loop's tick does not wait for it) and put into the
        attempt's provenance; `drain_provenance` waits for those still on their way."""
        home = self.settings.home_path

        def read() -> None:
            got = provenance.python_info(
                interpreter,
                provenance.Budget(provenance.LATER_S),
                provenance.blobs_of(home),
                provenance.pythons_cache(home),
                as_user,
            )
            with self.store.write_session() as s:
                row = s.get(Attempt, attempt_id)
                if row is not None and isinstance(row.provenance, dict):
                    row.provenance = {**row.provenance, "python": got}
                    s.add(row)

        with self._later_lock:
            if self._later is None:
                self._later = ThreadPoolExecutor(max_workers=1, thread_name_prefix="provenance")
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._later.submit(read))

    def drain_provenance(self, timeout_s: float = provenance.LATER_S) -> None:
        """Before this process ends: wait (bounded) for the package lists still being read."""
        with self._later_lock:
            pending = list(self._pending)
        wait(pending, timeout=timeout_s)

    def _gpu_samples(self, s: Session, att: Attempt) -> list[GpuSample]:
        """The newest health readings (at most 64) of the attempt's GPUs on this machine."""
        return list(
            s.exec(
                select(GpuSample)
                .where(
                    col(GpuSample.gpu_index).in_([int(g) for g in att.gpus]),
                    col(GpuSample.host).in_([att.node or self.settings.node, "localhost"]),
                )
                .order_by(col(GpuSample.taken_at).desc())
                .limit(64)
            ).all()
        )

    def _provenance_inputs(self, att: Attempt, job: Job) -> provenance.Inputs:
        spec = ExperimentSpec.model_validate(job.spec)
        spec.base_dir = str(Path(job.spec_path).parent) if job.spec_path else None
        in_image = self._in_image(spec)
        image = spec.environment.image or (
            self.settings.executor.kubernetes.image
            if self.settings.executor.kind == "kubernetes"
            else None
        )
        first = att.argv[0] if att.argv else ""
        interpreter = (
            None
            if in_image
            else first
            if Path(first).name.startswith("python")
            else spec.environment.python or sys.executable
        )
        samples: list[dict[str, Any]] = []
        if att.gpus and not att.host:
            with self.store.session() as s:
                rows = self._gpu_samples(s, att)
                samples = [
                    {
                        "gpu_index": r.gpu_index,
                        "uuid": r.uuid,
                        "verdict": r.verdict,
                        "data": r.data,
                        "taken_at": r.taken_at,
                    }
                    for r in rows
                ]
        return provenance.Inputs(
            code_dir=spec.run_dir(),
            argv=list(att.argv),
            params=dict(att.params),
            spec_seed=spec.seed,
            env=dict(spec.environment.env),
            data=[d.model_dump() for d in spec.data],
            image=image,
            docker_host=getattr(self.executor, "url", None)
            if self.executor.kind == "docker"
            else None,
            interpreter=interpreter,
            gpus=[int(g) for g in att.gpus],
            samples=samples,
            host=att.host or self.settings.node,
            run_as=self._reader(job),
        )

    def _restore_kept(self, att: Attempt, job: Job) -> None:
        """Put a kept good copy back where the program wrote it, once per attempt and before its
        launch (a crash after the copy copies again: nothing had started from it)."""
        if not job.resume_from or att.metrics_cursor.get("restored"):
            return
        paths = job_paths(self.settings, job)
        checkpoint = keeper.restore(
            job.resume_from,
            paths["workspace"],
            att.number,
            checkpoint_dir=paths["checkpoint_dir"],
            outside_ok=not self.settings.jobs_run_as_submitter,
        )
        with self.store.session() as s:
            row = s.get(Attempt, att.id)
            row.metrics_cursor = {**row.metrics_cursor, "restored": True}
            s.add(row)
        att.metrics_cursor = row.metrics_cursor
        if checkpoint != job.resume_from:
            # Many programs only ever load their own fixed path.
            self.on_event(
                "checkpoint.restored",
                {
                    "job_id": job.id,
                    "from": job.resume_from,
                    "to": checkpoint,
                    "attempt": att.number,
                },
            )

    def _stop_leftovers(self, att: Attempt) -> None:
        """Two copies of one job never train at once: before a launch, stop whatever is left of
        the job's earlier attempts (an orphaned training process whose supervisor was killed)."""
        with self.store.session() as s:
            earlier = list(
                s.exec(select(Attempt).where(Attempt.job_id == att.job_id, Attempt.id != att.id))
            )
        for old in earlier:
            if not old.handle or old.handle.get("kind") != self.executor.kind:
                continue
            stopped = self.executor.cleanup(old.handle, grace_s=self.settings.executor.stop_grace_s)
            if stopped:
                self.on_event(
                    "leftovers.stopped",
                    {
                        "job_id": att.job_id,
                        "attempt": old.number,
                        "pids": stopped,
                        "before_attempt": att.number,
                    },
                )

    def mine(self) -> Any:
        """The attempts this node watches: those it started (and those from before nodes)."""
        return col(Attempt.node).in_((self.settings.node, ""))

    def recover_starting(self) -> None:
        """Finish launches that a crashed process recorded but may not have started."""
        with self.store.session() as s:
            starting = list(s.exec(select(Attempt).where(Attempt.state == "starting", self.mine())))
        for att in starting:
            self._launch(att)

    def _attempt(self, attempt_id: int) -> Attempt:
        with self.store.session() as s:
            return s.get(Attempt, attempt_id)

    # ------------------------------------------------------------------ watching
    def watch_running(self, now: datetime) -> None:
        self.recover_starting()
        with self.store.session() as s:
            running = list(s.exec(select(Attempt).where(Attempt.state == "running", self.mine())))
        for att in running:
            broken = unreadable(att)
            if broken:  # its handle may be unreadable: the run is found by its key, as at restart
                why = f"its attempt row's stored {', '.join(broken)} is not JSON"
                self._stop_unwatchable(att, now, why, self.executor.find(att.key))
                continue
            job = self.store.job(att.job_id)
            try:
                spec = ExperimentSpec.model_validate(job.spec)
            except ValidationError as exc:
                why = f"its stored spec no longer validates ({first_error(exc)})"
                self._stop_unwatchable(att, now, why, att.handle)
                continue
            status = self.executor.poll(att.handle)
            mono = self.mono()
            ran_s = durations.elapsed_s(
                att.started_mono,
                att.boot_id,
                att.started_at,
                mono_now=mono,
                this_boot=self.boot_id,
                now=now,
            )
            bad, new_points = self._read_metrics(att, job, spec, now, ran_s)
            att = self._attempt(att.id)
            if bad is not None:
                self._diverged(att, status, bad, now)
                continue
            if new_points:  # nothing is newly measured or confirmed without new points
                self._keep_good(att, job, spec)
            if status.state != "running":
                final = None if status.exit_code != 0 else self._final_value(att, spec)
                if final is not None and not math.isfinite(final):
                    self._finish(
                        att.id,
                        status,
                        now,
                        outcome=Outcome.FAILED,
                        reason=(
                            f"exited with code 0, but its final {spec.metrics.name} is {final}"
                        ),
                    )
                else:
                    self._finish(att.id, status, now)
                continue
            stop_early = self._early_stop_reason(att, job, spec)
            quiet_s = durations.elapsed_s(
                att.progress_mono,
                att.boot_id,
                att.last_progress_at or att.started_at,
                mono_now=mono,
                this_boot=self.boot_id,
                now=now,
            )
            if stop_early:
                self._stop_for(att, now, Outcome.EARLY_STOPPED, stop_early)
            elif spec.timeout_min and ran_s > spec.timeout_min * 60:
                self._stop_for(
                    att, now, Outcome.TIMEOUT, f"timeout_min={spec.timeout_min:g} reached"
                )
            elif spec.stall_min and quiet_s > spec.stall_min * 60:
                self._stop_for(
                    att,
                    now,
                    Outcome.STALLED,
                    f"no progress for stall_min={spec.stall_min:g} minutes "
                    f"(metrics.progress={spec.metrics.progress})",
                )
            elif not spec.stall_min and (
                hung := stall.stalled(
                    att.metrics_cursor.get("pace") or [], quiet_s, self.settings.stall
                )
            ):
                self._stop_for(att, now, Outcome.STALLED, hung)

    def _stop_lost(self, att: Attempt) -> None:
        """A lost attempt can no longer be watched: stop what is left of it now (an orphaned
        training process holding its GPU), and say so in its evidence."""
        stopped = self.executor.cleanup(att.handle, grace_s=self.settings.executor.stop_grace_s)
        if not stopped:
            return
        with self.store.session() as s:
            row = s.get(Attempt, att.id)
            row.evidence = f"{row.evidence or 'lost'}; stopped what was left of it: pids {stopped}"
            s.add(row)
        att.evidence = row.evidence
        self.on_event(
            "leftovers.stopped", {"job_id": att.job_id, "attempt": att.number, "pids": stopped}
        )

    def _final_value(self, att: Attempt, spec: ExperimentSpec) -> float | None:
        """The attempt's last recorded value of metrics.name: NaN for a non-finite one (stored as
        null), None when it recorded none."""
        with self.store.session() as s:
            row = s.exec(
                select(MetricPoint)
                .where(MetricPoint.attempt_id == att.id, MetricPoint.name == spec.metrics.name)
                .order_by(MetricPoint.id.desc())
            ).first()
        if row is None:
            return None
        return math.nan if row.value is None else row.value

    def _diverged(self, att: Attempt, status: RunStatus, bad: Divergence, now: datetime) -> None:
        """Stop a diverged run at once (before it overwrites good checkpoints); a run that already
        ended with a diverged metric, even with exit code 0, did not succeed."""
        why = f"metrics diverged (spec.metrics.divergence): {bad.why}"
        with self.store.session() as s:
            row = s.get(Attempt, att.id)
            row.first_bad_step = bad.step
            row.evidence = why
            s.add(row)
        job = self.store.job(att.job_id)
        # the copies of step b - 1 and later were measured by the diverging loss: not good ones
        dropped = keeper.drop_from(job_paths(self.settings, job)["workspace"], bad.step - 1)
        if dropped:
            self.on_event(
                "checkpoint.dropped",
                {"job_id": att.job_id, "attempt": att.number, "steps": dropped, "why": "diverged"},
            )
        if status.state == "running":
            self._stop_for(att, now, Outcome.DIVERGED, why)
        else:
            self._finish(
                att.id,
                status,
                now,
                outcome=Outcome.DIVERGED,
                reason=why + (" (the process exited with code 0)" if status.exit_code == 0 else ""),
            )

    def _keep_good(self, att: Attempt, job: Job, spec: ExperimentSpec) -> None:
        """Copy the newest checkpoint once a finite metric point has measured it (see keeper),
        then prune: a copy is confirmed once the divergence window of finite points followed it
        (or it is older than this attempt's start)."""
        if spec.checkpoint is None or spec.checkpoint.keep_good == 0 or att.last_step is None:
            return
        rule = spec.metrics.divergence
        confirm = rule.window if rule.enabled else 1

        def measured_after(step: int) -> int:
            with self.store.session() as s:
                return s.exec(
                    select(func.count())
                    .select_from(MetricPoint)
                    .where(
                        MetricPoint.attempt_id == att.id,
                        MetricPoint.name == spec.metrics.name,
                        MetricPoint.value.is_not(None),
                        MetricPoint.step > step,
                    )
                ).one()

        paths = job_paths(self.settings, job)
        root, ws = paths["checkpoint_dir"], paths["workspace"]
        good = paths["good_checkpoints"].resolve()
        done = att.metrics_cursor.get("kept") or []
        for found in checkpoints.scan(root, steps_per_epoch=spec.checkpoint.steps_per_epoch):
            if found.path.resolve().is_relative_to(good) or found.step is None:
                continue
            if found.step >= att.last_step or measured_after(found.step) == 0:
                continue  # no finite point has measured these weights yet
            sig = keeper.signature(found)
            if not sig or sig == done:
                break  # the newest measured checkpoint is already copied
            if checkpoints.verify(found) is not None:
                continue  # torn or half-written: the one before may do
            copy = keeper.keep(found, root, ws)
            if copy is None:
                break  # changed while copied: next tick
            with self.store.session() as s:
                row = s.get(Attempt, att.id)
                row.metrics_cursor = {**row.metrics_cursor, "kept": sig}
                s.add(row)
                s.add(
                    CheckpointRecord(
                        job_id=job.id,
                        attempt_id=att.id,
                        step=found.step,
                        path=str(copy),
                        valid=True,
                    )
                )
            self.on_event(
                "checkpoint.kept",
                {
                    "job_id": job.id,
                    "attempt": att.number,
                    "step": found.step,
                    "from": str(found.path),
                    "copy": str(copy),
                },
            )
            break
        keeper.prune(
            ws,
            spec.checkpoint.keep_good,
            lambda step: step < att.start_step or measured_after(step) >= confirm,
        )

    def _early_stop_reason(self, att: Attempt, job: Job, spec: ExperimentSpec) -> str | None:
        rule = spec.early_stopping
        if rule is None or att.last_step is None or att.last_step < rule.grace_steps:
            return None
        name, mode = spec.metrics.name, spec.metrics.mode
        values = [p.value for p in self.store.metrics(job.id, name)]
        why = patience_exhausted(
            values, mode=mode, patience=rule.patience, min_delta=rule.min_delta
        )
        if why is None and rule.median_rule and job.group:
            why = self._median_rule(job, name, mode, att.last_step, rule.min_siblings, values)
        return f"early_stopped (spec.early_stopping): {why}" if why else None

    def _median_rule(
        self, job: Job, name: str, mode: str, step: int, min_siblings: int, own: list[float | None]
    ) -> str | None:
        finite = [v for v in own if v is not None]
        if not finite:
            return None
        best = min if mode == "min" else max
        with self.store.session() as s:
            siblings = [
                j.id for j in s.exec(select(Job).where(Job.group == job.group, Job.id != job.id))
            ]
            rows = s.exec(
                select(MetricPoint.job_id, MetricPoint.value).where(
                    MetricPoint.job_id.in_(siblings),
                    MetricPoint.name == name,
                    MetricPoint.step <= step,
                    MetricPoint.value.is_not(None),
                )
            ).all()
        per: dict[int, list[float]] = {}
        for jid, v in rows:
            per.setdefault(jid, []).append(v)
        return median_rule(
            best(finite), [best(v) for v in per.values()], mode=mode, min_siblings=min_siblings
        )

    def _stop_unwatchable(
        self, att: Attempt, now: datetime, why: str, handle: dict[str, Any] | None
    ) -> None:
        """Stop a run the loop can no longer watch because its rows were edited in the store
        (its job's spec no longer validates, or its attempt row cannot be read): the attempt
        ends failed saying why, audited (`run.unwatchable`); one such row no longer stops every
        other job's tick. The loop fails the job rather than queue its spec again."""
        why += "; changed in the store behind nightshift's back? `nightshift audit verify` names it"
        self.on_event("run.unwatchable", {"job_id": att.job_id, "attempt": att.number, "why": why})
        status = (
            self.executor.stop(handle, grace_s=self.settings.executor.stop_grace_s)
            if handle
            else RunStatus(state="lost")
        )
        self._finish(att.id, status, now, outcome=Outcome.FAILED, reason=why)

    def _stop_for(self, att: Attempt, now: datetime, outcome: Outcome, why: str) -> None:
        """Enforce a limit the user declared in the spec; audited as a system action."""
        self.on_event(
            "limit.enforced",
            {"job_id": att.job_id, "attempt": att.number, "limit": outcome, "why": why},
        )
        status = self.executor.stop(att.handle, grace_s=self.settings.executor.stop_grace_s)
        self._finish(att.id, status, now, outcome=outcome, reason=why)

    def _read_metrics(
        self, att: Attempt, job: Job, spec: ExperimentSpec, now: datetime, ran_s: float
    ) -> tuple[Divergence | None, bool]:
        """Read what the program wrote since the last tick (any metric source); record the
        points, the progress and (at `ran_s` into the attempt) the run's pace for the default
        stall rule; return the divergence if the metrics diverged, and whether any point was
        new."""
        paths = job_paths(self.settings, job)
        log_path = Path(att.log_path or paths["workspace"] / f"attempt-{att.number}.log")
        cursor = att.metrics_cursor.get("metrics")
        if cursor is None:  # an attempt recorded before metric cursors: JSONL from its offset
            cursor = metric_sources.start_cursor(
                spec.metrics,
                log_path=log_path,
                metrics_file=paths["metrics_file"],
                search_roots=metric_roots(paths),
                min_step=att.start_step,
            )
        got = metric_sources.read_new(
            spec.metrics,
            log_path=log_path,
            metrics_file=paths["metrics_file"],
            search_roots=metric_roots(paths),
            cursor=cursor,
        )
        name = spec.metrics.name
        points = [
            MetricPoint(
                attempt_id=att.id,
                job_id=att.job_id,
                step=p.step,
                name=p.name,
                value=p.value if math.isfinite(p.value) else None,
                wall_time=now if p.wall_time is None else _utc(p.wall_time, now),
            )
            for p in got.points
        ]
        progress = {
            "either": bool(got.points) or got.output_bytes > 0,
            "metrics": bool(got.points),
            "output": got.output_bytes > 0,
        }
        bad, state = None, att.metrics_cursor.get("divergence")
        if att.first_bad_step is None and got.points:
            bad, state = divergence.scan(
                spec.metrics, [(p.step, p.name, p.value) for p in got.points], state
            )
        with self.store.session() as s:
            row = s.get(Attempt, att.id)  # points, cursor and detector state: one transaction
            row.metrics_cursor = {**row.metrics_cursor, "metrics": got.cursor, "divergence": state}
            if points:
                s.add_all(points)
                if any(row.last_step is None or p.step > row.last_step for p in got.points):
                    pace = stall.noted(row.metrics_cursor.get("pace") or [], ran_s)
                    row.metrics_cursor = {**row.metrics_cursor, "pace": pace}
                row.last_step = max(
                    [p.step for p in got.points]
                    + ([row.last_step] if row.last_step is not None else [])
                )
                mine = [p.value for p in got.points if p.name == name]
                if mine:
                    row.last_loss = mine[-1] if math.isfinite(mine[-1]) else None
            if progress[spec.metrics.progress]:
                row.last_progress_at = now
                row.progress_mono = self.mono() if row.boot_id == self.boot_id else None
            s.add(row)
        if bad is not None:
            where = next(
                (
                    p.where
                    for p in got.points
                    if p.step == bad.step and p.name == bad.name and p.where
                ),
                None,
            )
            if where:
                bad = Divergence(bad.step, bad.name, bad.value, f"{bad.why} ({where})")
        return bad, bool(got.points)

    def _finish(
        self,
        attempt_id: int,
        status: RunStatus,
        now: datetime,
        *,
        outcome: Outcome | None = None,
        reason: str | None = None,
        stopped: bool = False,
    ) -> None:
        """Record how an attempt ended (the lifecycle's one end path: exit, outcome, energy,
        and for a failure its diagnosis) and report its job's move; nothing when it had already
        ended."""
        # Read and classified first: never under the store's write lock.
        diagnosis, machine = self._diagnosis(attempt_id, status, outcome, reason, stopped)
        with self.store.write_session() as s:
            att = s.get(Attempt, attempt_id)
            if att.state in lifecycle.ENDED_ATTEMPT:
                return
            lifecycle.end_attempt(
                s,
                att,
                Ended.of(status, stopped=stopped),
                now,
                outcome=outcome,
                reason=reason,
                mono=(self.mono(), self.boot_id),
                diagnosis=diagnosis,
                machine=machine,
            )
        if att.outcome == Outcome.LOST:
            self._stop_lost(att)

    def _diagnosis(
        self,
        attempt_id: int,
        status: RunStatus,
        outcome: Outcome | None,
        reason: str | None,
        stopped: bool,
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Why an attempt that is ending failed, from the tail of its log (read bounded and
        without following a link the job planted), its exit status and the loop's own verdict;
        and what the machine said (`MachineEvidence`), kept with the attempt so that a later
        diagnosis (the agent's) reads the same. (None, None) when it does not end failed or no
        classifier is wired; a diagnosis that fails is reported and left out: it never keeps the
        loop from recording the end."""
        none: tuple[None, None] = (None, None)
        if self.diagnose is None:
            return none
        if outcome is None:
            if status.state == "exited" and status.exit_code == 0 and not stopped:
                return none
        elif Outcome(outcome) not in lifecycle.FAILED_OUTCOMES:
            return none
        machine: dict[str, Any] | None = None
        try:
            att = self._attempt(attempt_id)
            job = self.store.job(att.job_id) if att is not None else None
            if att is None or job is None or att.state in lifecycle.ENDED_ATTEMPT:
                return none
            if outcome is None and job.state != JobState.RUNNING:
                return none  # held, paused or cancelled meanwhile: the move says why, not a failure
            spec = ExperimentSpec.model_validate(job.spec)
            tail, first_line, note = read_log_tail(
                job_workspace(self.settings, job.id), att.log_path
            )
            says = _MONITOR_SAYS.get(Outcome(outcome)) if outcome is not None else None
            if says is None and status.state == "lost" and not stopped:
                says = "lost"
            if outcome == Outcome.FAILED and status.exit_code == 0:
                says = "diverged"  # exited 0 with a non-finite final metric (watch_running)
            evidence = self._machine_evidence(att, job, status)
            machine = evidence.model_dump(mode="json")
            run = FailedRun(
                attempt_id=attempt_id,
                log_tail=tail,
                first_line_no=first_line,
                log_note=note,
                exit_code=status.exit_code,
                signal=status.signal,
                monitor_says=says,
                monitor_detail=reason or status.detail,
                params=dict(att.params),
                knobs=spec.knobs.model_dump(exclude_none=True),
                machine=evidence,
            )
            return self.diagnose(run).model_dump(), machine
        except Exception as exc:  # noqa: BLE001 (a diagnosis is a nicety; the end is a record)
            with contextlib.suppress(Exception):  # nor may reporting it stop the loop
                self.on_event(
                    "diagnosis.failed",
                    {"attempt_id": attempt_id, "error": f"{type(exc).__name__}: {exc}"},
                )
            return None, machine

    def _machine_evidence(self, att: Attempt, job: Job, status: RunStatus) -> MachineEvidence:
        """What the machine says of an attempt that ended failed, beside its log: its cgroup's
        memory counters at exit (the supervisor's record), the kernel log since it started (an
        OOM kill naming its pid where no cgroup counted one; `NVRM: Xid` lines for its GPUs), free
        space on its folders' filesystems, and the non-finite values among its recorded metrics.
        Bounded and best effort: what cannot be read is a note. A run on another host (a cluster)
        has only what its executor and the store hold."""
        ev = MachineEvidence()
        if status.cgroup_memory:
            try:
                ev.cgroup = CgroupMemory.model_validate(status.cgroup_memory)
            except ValueError:
                ev.notes.append("the run's cgroup counters were unreadable")
        handle_pid = att.handle.get("pid") if att.executor == "local" else None
        own = (status.pid, handle_pid, *status.descendants)
        ev.pids = sorted({p for p in own if isinstance(p, int) and not isinstance(p, bool)})[
            : machine_evidence.MAX_PIDS
        ]
        with self.store.session() as s:
            rows = s.exec(
                select(MetricPoint)
                .where(MetricPoint.attempt_id == att.id, col(MetricPoint.value).is_(None))
                .order_by(col(MetricPoint.step))
                .limit(machine_evidence.MAX_METRICS)
            ).all()
            # the store keeps a non-finite value as NULL (JSON and SQL have none)
            ev.metrics = [
                machine_evidence.MetricValue(name=r.name, step=r.step, value="non-finite")
                for r in rows
            ]
            samples = self._gpu_samples(s, att) if att.gpus and not att.host else []
        buses: dict[int, str] = {}
        for g in samples:
            bus = g.data.get("pci_bus_id") if isinstance(g.data, dict) else None
            if isinstance(bus, str) and bus and g.gpu_index not in buses:
                buses[g.gpu_index] = bus
        ev.gpu_bus_ids = sorted(set(buses.values()))
        if att.host or att.executor not in ("local", "docker"):
            return ev  # the kernel and the disks below are another machine's
        paths = job_paths(self.settings, job)
        ev.disks, notes = machine_evidence.disk_free(
            [("job folder", paths["workspace"]), ("checkpoint folder", paths["checkpoint_dir"])]
        )
        ev.notes += notes
        sigkill = status.signal == 9 or status.exit_code in (-9, 137)
        if (sigkill and ev.cgroup is None) or ev.gpu_bus_ids:
            since = att.started_at.replace(tzinfo=UTC).timestamp() - 1.0
            why = "neither journalctl nor /dev/kmsg answered"
            try:
                text = machine_evidence.KERNEL_LOG_READER(since)
            except Exception as exc:  # noqa: BLE001 - an unreadable log is a note, not a crash
                text, why = None, type(exc).__name__
            if text is not None:
                ev.kernel_log = machine_evidence.kernel_lines(text)
            else:
                ev.notes.append(f"the kernel log could not be read ({why})")
        return ev


# The loop's own verdicts, which the classifier takes as the category.
_MONITOR_SAYS = {
    Outcome.STALLED: "stalled",
    Outcome.TIMEOUT: "timeout",
    Outcome.LOST: "lost",
    Outcome.DIVERGED: "diverged",
}
