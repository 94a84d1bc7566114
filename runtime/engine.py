"""The one loop that owns attempts: it places queued jobs, starts them through the executor,
watches them (metrics, progress, timeout, stall) and records how they end.

It observes and places; it never decides a recovery. A failed attempt leaves its job `failed`,
and the agent's `recover` playbook decides what happens next through the policy gate. Every job
state change is reported through `on_event`, which the agent wires to the audit log (runtime
imports nothing above it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.early_stop import median_rule, patience_exhausted
from nightshift.runtime.executor import Executor, LaunchRequest, RunStatus
from nightshift.runtime.placement import Decision, place
from nightshift.runtime.snapshot import load_snapshot
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import Attempt, Job, MetricPoint, Store, utcnow

ACTIVE = ("queued", "running")
# How a job stands after an attempt the loop ended on purpose (anything else unclean: failed).
JOB_STATE_AFTER = {"early_stopped": "succeeded", "paused": "paused", "preempted": "paused",
                   "cancelled": "cancelled"}
EventSink = Callable[[str, dict[str, Any]], None]


def attempt_energy(spec: ExperimentSpec, start: datetime, end: datetime) -> tuple[float | None, str]:
    """kWh of one attempt from the spec's declared draw; None where nothing measures or declares
    it (a GPU's own energy counter, where one exists, is read by the health check samples)."""
    if spec.resources.power_w is None:
        return None, "none"
    hours = max(0.0, (end - start).total_seconds()) / 3600
    return spec.resources.power_w * hours / 1000, "declared_power"


def job_workspace(settings: Settings, job_id: int) -> Path:
    """Per-job folder for logs, metrics and (relative) checkpoints."""
    return settings.runs_dir / f"job-{job_id}"


def job_paths(settings: Settings, job: Job) -> dict[str, Path]:
    spec = ExperimentSpec.model_validate(job.spec)
    ws = job_workspace(settings, job.id)
    ckpt = Path(spec.checkpoint.dir) if spec.checkpoint else Path("checkpoints")
    metrics = Path(spec.metrics.file or "metrics.jsonl")
    return {
        "workspace": ws,
        "checkpoint_dir": ckpt if ckpt.is_absolute() else ws / ckpt,
        "metrics_file": metrics if metrics.is_absolute() else ws / metrics,
    }


class Engine:
    def __init__(self, store: Store, executor: Executor, settings: Settings,
                 on_event: EventSink | None = None, clock: Callable[[], datetime] = utcnow,
                 paused: Callable[[], str | None] = lambda: None):
        self.store, self.executor, self.settings = store, executor, settings
        self.on_event = on_event or (lambda action, payload: None)
        self.clock = clock
        self.paused = paused  # returns why new work may not start (the kill switch), or None
        # Which queued jobs this loop may start; None = all (the daemon). A `nightshift run`
        # without a daemon starts only its own goal's jobs.
        self.scope: Callable[[], set[int]] | None = None
        # Passive: another process (the daemon) owns the loop; only read the store.
        self.passive = False
        self.last_decision: Decision | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ one tick
    def tick(self) -> dict[int, str]:
        """Watch what runs, then place what waits. Returns the hold reason of each waiting job."""
        with self._lock:
            now = self.clock()
            self.watch_running(now)
            why = self.paused()
            if why:
                with self.store.session() as s:
                    queued = list(s.exec(select(Job).where(Job.state == "queued")))
                holds = {j.id: why for j in queued}
                self._record_holds([j.id for j in queued], holds)
                return holds
            return self.place_queued(now)

    def start_background(self) -> None:
        """Tick in a thread, so runs are watched and placed while the agent waits (on a human)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self.settings.loop.poll_interval_s)

        self._thread = threading.Thread(target=loop, name="nightshift-loop", daemon=True)
        self._thread.start()

    def stop_background(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def run_until_settled(self, job_ids: Iterable[int], *, on_tick: Callable[[], None] | None = None,
                          deadline_s: float | None = None) -> dict[int, str]:
        """Until none of `job_ids` is queued or running (ticking here unless a background loop
        does); returns their final states."""
        ids = list(job_ids)
        start = time.monotonic()
        while True:
            if not self.passive and (self._thread is None or not self._thread.is_alive()):
                self.tick()
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
            self.store, now, cpu_slots=self.settings.loop.cpu_slots, backoff=self.settings.retry,
            tariff=self.settings.tariff, cost_threshold=sched.cost_threshold_per_kwh,
            aging_per_hour=sched.aging_per_hour, preempt_margin=sched.preempt_margin,
            default_duration_s=sched.default_duration_min * 60,
            scope=self.scope() if self.scope is not None else None)
        snap = snap.model_copy(update={
            "tariff_horizon_h": sched.tariff_horizon_h, "preempt_max_per_call": sched.preempt_max_per_call,
            "long_job_start_grace_s": sched.long_job_start_grace_min * 60,
            "display_tz": sched.display_tz})
        if not snap.pending and not snap.running:
            return {}
        decision = place(snap)
        self.last_decision = decision
        self._record_holds([p.id for p in snap.pending], decision.holds)
        for start in decision.starts:
            self.start_attempt(start.job_id, start.gpus, now)
        for pause in decision.pauses:
            self.pause_job(pause.job_id, now, outcome="paused", why=pause.reason)
        return decision.holds

    def pause_job(self, job_id: int, now: datetime, *, outcome: str, why: str) -> bool:
        """Stop a job's live attempt at its last checkpoint; the job becomes `paused` and the
        recover playbook requeues it from that checkpoint. False when nothing was running."""
        with self.store.session() as s:
            att = s.exec(select(Attempt).where(Attempt.job_id == job_id,
                                               Attempt.state == "running")).first()
        if att is None:
            return False
        self._stop_for(att, now, outcome, why)
        return True

    def _record_holds(self, pending: list[int], holds: dict[int, str]) -> None:
        """Keep each waiting job's reason in the store for `nightshift jobs`; write only changes."""
        if not pending:
            return
        with self.store.session() as s:
            rows = s.exec(select(Job.id, Job.hold_reason).where(Job.id.in_(pending))).all()
            changed = {jid: holds.get(jid) for jid, old in rows if old != holds.get(jid)}
            for job in s.exec(select(Job).where(Job.id.in_(list(changed)))) if changed else []:
                job.hold_reason = changed[job.id]
                s.add(job)

    # ------------------------------------------------------------------ starting
    def start_attempt(self, job_id: int, gpus: list[int], now: datetime) -> Attempt:
        """Record the attempt first, then launch under a key derived from its id, so a crash in
        between is finished by `recover_starting` without launching twice."""
        with self.store.session() as s:
            job = s.get(Job, job_id)
            if job is None or job.state != "queued":
                raise ValueError(f"job {job_id} is not queued")
            number = len(list(s.exec(select(Attempt.id).where(Attempt.job_id == job_id)))) + 1
            paths = job_paths(self.settings, job)
            metrics_file = paths["metrics_file"]
            att = Attempt(job_id=job_id, number=number, gpus=gpus, params=dict(job.params),
                          start_step=job.resume_step or 0, started_at=now, last_progress_at=now,
                          metrics_offset=metrics_file.stat().st_size if metrics_file.exists() else 0,
                          log_path=str(paths["workspace"] / f"attempt-{number}.log"))
            s.add(att)
            job.state, job.updated_at, job.reason, job.hold_reason = "running", now, None, None
            s.add(job)
            s.flush()
            att.argv = self.render_argv(job, paths)
            s.add(att)
        self.on_event("job.state", {"job_id": job_id, "before": "queued", "after": "running",
                                    "attempt": number, "gpus": gpus, "argv": att.argv})
        return self._launch(att)

    def render_argv(self, job: Job, paths: dict[str, Path]) -> list[str]:
        spec = ExperimentSpec.model_validate(job.spec)
        spec.base_dir = str(Path(job.spec_path).parent) if job.spec_path else spec.base_dir
        builtins = {
            "python": spec.environment.python or ("python3" if spec.environment.image else sys.executable),
            "checkpoint_dir": str(paths["checkpoint_dir"]),
            "metrics_file": str(paths["metrics_file"]),
            "run_dir": str(paths["workspace"]),
        }
        argv = spec.render(job.params, builtins)
        if job.resume_from and spec.checkpoint:
            extra = {**builtins, "checkpoint": job.resume_from, "step": str(job.resume_step or 0)}
            argv += [a.format(**extra) for a in spec.checkpoint.resume_arg]
        return argv

    def _request(self, att: Attempt, job: Job) -> LaunchRequest:
        spec = ExperimentSpec.model_validate(job.spec)
        spec.base_dir = str(Path(job.spec_path).parent) if job.spec_path else None
        paths = job_paths(self.settings, job)
        for p in (paths["workspace"], paths["checkpoint_dir"], paths["metrics_file"].parent):
            p.mkdir(parents=True, exist_ok=True)
        env = {**spec.environment.env, "NIGHTSHIFT_JOB_ID": str(job.id),
               "NIGHTSHIFT_ATTEMPT": str(att.number), "PYTHONUNBUFFERED": "1"}
        mounts = []
        if spec.environment.image:
            # In a container the code and the job's folder sit at the same paths as on the host,
            # so the rendered argv ({checkpoint_dir}, {metrics_file}) means the same in both.
            mounts = [{"source": str(spec.run_dir()), "target": str(spec.run_dir()), "read_only": True},
                      {"source": str(paths["workspace"]), "target": str(paths["workspace"]),
                       "read_only": False}]
            if paths["checkpoint_dir"].resolve() != paths["workspace"] and not \
                    paths["checkpoint_dir"].resolve().is_relative_to(paths["workspace"]):
                mounts.append({"source": str(paths["checkpoint_dir"]),
                               "target": str(paths["checkpoint_dir"]), "read_only": False})
            mounts += [m.model_dump() for m in spec.environment.mounts]
        res = spec.resources
        return LaunchRequest(key=f"attempt-{att.id}", argv=att.argv, cwd=str(spec.run_dir()),
                             env=env, gpus=att.gpus, log_path=att.log_path or "",
                             image=spec.environment.image, mounts=mounts,
                             network_mode=spec.environment.network_mode,
                             memory_gb=res.host_memory_gb,
                             labels={"nightshift.job": str(job.id), "nightshift.attempt": str(att.number)})

    def _launch(self, att: Attempt) -> Attempt:
        job = self.store.job(att.job_id)
        assert job is not None
        try:
            handle = self.executor.start(self._request(att, job))
        except Exception as exc:  # the run never started: record why, leave recovery to the agent
            self._finish(att.id, RunStatus(state="exited", exit_code=None,
                                           detail=f"could not start: {exc}"), self.clock(),
                         outcome="failed", reason=f"could not start: {exc}")
            return self._attempt(att.id)
        with self.store.session() as s:
            row = s.get(Attempt, att.id)
            row.handle, row.state, row.executor = handle, "running", self.executor.kind
            s.add(row)
        return self._attempt(att.id)

    def recover_starting(self) -> None:
        """Finish launches that a crashed process recorded but may not have started."""
        with self.store.session() as s:
            starting = list(s.exec(select(Attempt).where(Attempt.state == "starting")))
        for att in starting:
            self._launch(att)

    def _attempt(self, attempt_id: int) -> Attempt:
        with self.store.session() as s:
            return s.get(Attempt, attempt_id)

    # ------------------------------------------------------------------ watching
    def watch_running(self, now: datetime) -> None:
        self.recover_starting()
        with self.store.session() as s:
            running = list(s.exec(select(Attempt).where(Attempt.state == "running")))
        for att in running:
            job = self.store.job(att.job_id)
            status = self.executor.poll(att.handle)
            self._read_metrics(att, job, now)
            att = self._attempt(att.id)
            if status.state != "running":
                self._finish(att.id, status, now)
                continue
            spec = ExperimentSpec.model_validate(job.spec)
            stop_early = self._early_stop_reason(att, job, spec)
            if stop_early:
                self._stop_for(att, now, "early_stopped", stop_early)
            elif spec.timeout_min and now - att.started_at > timedelta(minutes=spec.timeout_min):
                self._stop_for(att, now, "timeout", f"timeout_min={spec.timeout_min:g} reached")
            elif spec.stall_min and att.last_progress_at and \
                    now - att.last_progress_at > timedelta(minutes=spec.stall_min):
                self._stop_for(att, now, "stalled",
                               f"no progress for stall_min={spec.stall_min:g} minutes")

    def _early_stop_reason(self, att: Attempt, job: Job, spec: ExperimentSpec) -> str | None:
        rule = spec.early_stopping
        if rule is None or att.last_step is None or att.last_step < rule.grace_steps:
            return None
        name, mode = spec.metrics.name, spec.metrics.mode
        values = [p.value for p in self.store.metrics(job.id, name)]
        why = patience_exhausted(values, mode=mode, patience=rule.patience, min_delta=rule.min_delta)
        if why is None and rule.median_rule and job.group:
            why = self._median_rule(job, name, mode, att.last_step, rule.min_siblings, values)
        return f"early_stopped (spec.early_stopping): {why}" if why else None

    def _median_rule(self, job: Job, name: str, mode: str, step: int, min_siblings: int,
                     own: list[float | None]) -> str | None:
        finite = [v for v in own if v is not None]
        if not finite:
            return None
        best = min if mode == "min" else max
        with self.store.session() as s:
            siblings = [j.id for j in s.exec(select(Job).where(Job.group == job.group, Job.id != job.id))]
            rows = s.exec(select(MetricPoint.job_id, MetricPoint.value).where(
                MetricPoint.job_id.in_(siblings), MetricPoint.name == name,
                MetricPoint.step <= step, MetricPoint.value.is_not(None))).all()
        per: dict[int, list[float]] = {}
        for jid, v in rows:
            per.setdefault(jid, []).append(v)
        return median_rule(best(finite), [best(v) for v in per.values()], mode=mode,
                           min_siblings=min_siblings)

    def _stop_for(self, att: Attempt, now: datetime, outcome: str, why: str) -> None:
        """Enforce a limit the user declared in the spec; audited as a system action."""
        self.on_event("limit.enforced", {"job_id": att.job_id, "attempt": att.number,
                                         "limit": outcome, "why": why})
        status = self.executor.stop(att.handle, grace_s=self.settings.executor.stop_grace_s)
        self._finish(att.id, status, now, outcome=outcome, reason=why)

    def _read_metrics(self, att: Attempt, job: Job, now: datetime) -> None:
        spec = ExperimentSpec.model_validate(job.spec)
        path = job_paths(self.settings, job)["metrics_file"]
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(att.metrics_offset)
            chunk = f.read()
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        points, last_step, last_loss = [], att.last_step, att.last_loss
        for raw in chunk[: end + 1].splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a torn or foreign line is data we skip, never an instruction
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                continue
            last_step = rec["step"]
            for name, value in rec.items():
                if name == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                v = float(value)
                points.append(MetricPoint(attempt_id=att.id, job_id=att.job_id, step=rec["step"],
                                          name=name, value=v if v == v else None))
                if name == spec.metrics.name:
                    last_loss = v
        with self.store.session() as s:
            row = s.get(Attempt, att.id)
            row.metrics_offset = att.metrics_offset + end + 1
            if points:
                s.add_all(points)
                row.last_step, row.last_loss, row.last_progress_at = last_step, last_loss, now
            s.add(row)

    def _finish(self, attempt_id: int, status: RunStatus, now: datetime, *, outcome: str | None = None,
                reason: str | None = None) -> None:
        with self.store.session() as s:
            att = s.get(Attempt, attempt_id)
            if att.state in ("exited", "lost", "stopped"):
                return
            job = s.get(Job, att.job_id)
            ok = status.state == "exited" and status.exit_code == 0 and outcome is None
            att.outcome = outcome or ("succeeded" if ok else "failed")
            att.state = {"exited": "exited", "lost": "lost"}.get(status.state, "stopped")
            att.exit_code, att.signal, att.ended_at = status.exit_code, status.signal, now
            spec = ExperimentSpec.model_validate(job.spec)
            att.energy_kwh, att.energy_source = attempt_energy(spec, att.started_at, now)
            before = job.state
            if job.state == "running":
                job.state = "succeeded" if ok else JOB_STATE_AFTER.get(att.outcome, "failed")
                job.reason = reason or status.detail or (
                    None if ok else f"attempt {att.number} exited with code {status.exit_code}"
                    + (f" (signal {status.signal})" if status.signal else ""))
                job.updated_at = now
            s.add(att)
            s.add(job)
        self.on_event("job.state", {"job_id": job.id, "before": before, "after": job.state,
                                    "attempt": att.number, "outcome": att.outcome,
                                    "exit_code": att.exit_code, "signal": att.signal,
                                    "last_step": att.last_step, "reason": job.reason})

