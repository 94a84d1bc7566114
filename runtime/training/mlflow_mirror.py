"""Each job mirrored as an MLflow run, off the loop's tick (`tracking.mlflow.uri`).

What a run holds: the job's parameters (once: MLflow's parameters never change; when a recovery
changed them, the newest attempt's as tags `nightshift.last_attempt.param.<key>`); its metric
points by step as the loop records them, in bounded batches; tags — `nightshift.job_id`, the
store's instance, the job's name and owner (`mlflow.user`), the job a reproduction reproduces
(`nightshift.reproduces`), and the newest attempt's provenance
(commit, dirty tree, image digest, seed, host, ... runtime/training/provenance.py's FIELDS);
at the end the attempts' logs, the metrics file, the plots in the job's folder and a plot of the
job's metric curves that the mirror draws (plots/nightshift-curves.png) as artifacts;
and the status: RUNNING while the job may still run, then FINISHED, FAILED or KILLED.

Idempotent across restarts and kill -9. The run id is kept with the job (store table
`mlflow_run`) as soon as the run exists, and before one is created the run is looked for by its
tag `nightshift.job_id` (a daemon killed between the two finds the run it made). The last metric
point MLflow acknowledged is the row's cursor, moved only after the acknowledgement; a batch sent
again after a crash carries the same keys, values, steps and timestamps (a point's timestamp is
the time the store keeps with it — the source's own, else when the loop read it — or, for a
point recorded before nightshift kept one, its attempt's start), which MLflow's SQL store keeps
once.

An unreachable MLflow never stalls the loop and never fails a job: the mirror works in a thread
of its own, a failure is noted once in the audit (`mlflow.unreachable`, `mlflow.recovered`,
`mlflow.refused` per job) and retried with backoff. A launch asks for its job's run id so that
the program's own `mlflow.log_metric` lands in the same run (`MLFLOW_TRACKING_URI`,
`MLFLOW_RUN_ID`): it waits at most `launch_wait_s`, and not at all while MLflow is down.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlmodel import col, or_, select

from nightshift.runtime.config import Settings
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.store.db import Attempt, Job, MetricPoint, MlflowRun, Store, utcnow
from nightshift.runtime.store.lifecycle import JobState
from nightshift.runtime.training import job_files, metric_plot, provenance
from nightshift.runtime.training.mlflow_rest import (
    MAX_PARAM_VALUE,
    MlflowClient,
    MlflowError,
    MlflowRefused,
    MlflowUnavailable,
)

JOB_TAG = "nightshift.job_id"
STORE_TAG = "nightshift.store"
REPRODUCES_TAG = "nightshift.reproduces"
LAST_PARAM_TAG = "nightshift.last_attempt.param."  # + a parameter a recovery changed
# A job's MLflow status by its state; a failed job may still be retried (RUNNING again).
STATUS = {
    JobState.SUCCEEDED: "FINISHED",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "KILLED",
}
TERMINAL = tuple(STATUS)
PLOTS = (".png", ".svg", ".jpg", ".jpeg", ".html")
CURVES = "plots/nightshift-curves.png"  # the job's metric curves, drawn by the mirror
JOBS_PER_PASS = 200
# Waits after a failed sync: 2 s, 4 s, ... 5 min.
RETRY = Backoff(base_s=2.0, factor=2.0, cap_s=300.0, jitter_frac=0.0)

Note = Callable[[str, dict[str, Any]], None]
# What MLflow accepts in a metric's or parameter's name; anything else becomes "_".
_NOT_IN_KEY = re.compile(r"[^\w\-. /]")


def key(name: str) -> str:
    """A metric or parameter name as MLflow accepts it (at most 250 characters)."""
    return _NOT_IN_KEY.sub("_", str(name))[:250] or "_"


def ms(t: datetime | None) -> int | None:
    """A naive-UTC store time in MLflow's milliseconds since the epoch."""
    return None if t is None else int(t.replace(tzinfo=UTC).timestamp() * 1000)


@dataclass
class Pass:
    """What one sync pass did."""

    jobs: int = 0
    runs_created: int = 0
    points: int = 0
    artifacts: int = 0
    errors: list[str] = field(default_factory=list)


class Mirror:
    """Mirrors the store's jobs into MLflow; `sync` is one pass, `start` runs passes in a thread
    every `interval_s` until `stop`; `env_for` is what a launch adds to its job's environment."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        note: Note | None = None,
        client: MlflowClient | None = None,
        report: Callable[[str], None] | None = None,
    ):
        cfg = settings.tracking.mlflow
        assert cfg.uri, "tracking.mlflow.uri is not set"
        self.store, self.settings, self.cfg, self.uri = store, settings, cfg, cfg.uri
        self.node = settings.node
        self.note: Note = note or (lambda action, payload: None)
        self.report = report or (lambda line: None)
        self.client = client or MlflowClient(cfg.uri, timeout_s=cfg.timeout_s)
        # The launch's client: one short try, never the worker's retries.
        self.quick = MlflowClient(cfg.uri, timeout_s=max(cfg.launch_wait_s, 0.05), retries=0)
        self._experiment: str | None = None
        self._create = threading.Lock()  # one run per job: the worker and a launch both create
        self._down_since: float | None = None
        self._down_steps = 0
        self._retry_at = float("-inf")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._store_id: str | None = None
        # job id → (refusals in a row, monotonic time of the next try), for jobs MLflow refused
        self._refusals: dict[int, tuple[int, float]] = {}
        self._last_failure: str | None = None  # the last failed pass, told once

    # ------------------------------------------------------------------ the worker
    def start(self) -> None:
        """Sync every `interval_s` in a thread of its own (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._work, name="mlflow-mirror", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, drain_s: float = 15.0) -> None:
        """One last pass (bounded by `drain_s`) so a job that just ended shows its end, then
        stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(drain_s)
        self._thread = None

    def _work(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self.sync(final=stopping)
            except Exception as exc:  # a store fault, a bug: told once, never the loop's end
                line = f"warning: the MLflow mirror's pass failed: {type(exc).__name__}: {exc}"
                if line != self._last_failure:
                    self.report(line)
                self._last_failure = line
            else:
                self._last_failure = None
            if stopping:
                return
            self._wake.wait(self.cfg.interval_s)
            self._wake.clear()

    # ------------------------------------------------------------------ one pass
    def sync(self, *, final: bool = False) -> Pass:
        """Mirror what changed since the last pass; MLflow being down ends the pass early (and
        later passes wait out the backoff, except a `final` one)."""
        done = Pass()
        if time.monotonic() < self._retry_at and not final:
            return done
        try:
            for job_id in self._due():
                refused = self._refusals.get(job_id)
                if refused is not None and time.monotonic() < refused[1] and not final:
                    continue
                done.jobs += 1
                try:
                    self._sync_job(job_id, done)
                except MlflowRefused as exc:
                    self._refused(job_id, exc)
                    done.errors.append(f"job {job_id}: {exc}")
        except MlflowUnavailable as exc:
            self._unreachable(exc)
            done.errors.append(str(exc))
            return done
        self._reachable()
        return done

    def _due(self) -> list[int]:
        """Jobs with an attempt on this node that MLflow does not show whole yet: no run, a job
        moved since it was last mirrored whole, a job still able to run; a job whose last try
        was refused waits its backoff."""
        now = utcnow()
        with self.store.session() as s:
            q = (
                select(Job.id)
                .join(MlflowRun, col(MlflowRun.job_id) == col(Job.id), isouter=True)
                .where(
                    or_(
                        col(MlflowRun.job_id).is_(None),
                        col(MlflowRun.synced_update).is_(None),
                        col(MlflowRun.synced_update) < col(Job.updated_at),
                    ),
                    or_(col(MlflowRun.next_try_at).is_(None), col(MlflowRun.next_try_at) <= now),
                    col(Job.id).in_(
                        select(Attempt.job_id).where(col(Attempt.node).in_((self.node, "")))
                    ),
                )
                .order_by(col(Job.id))
                .limit(JOBS_PER_PASS)
            )
            return [int(i) for i in s.exec(q).all()]

    def _sync_job(self, job_id: int, done: Pass) -> None:
        with self.store.session() as s:
            job = s.get(Job, job_id)
            row = self._row(s, job_id)
            if job is None:
                return
            s.expunge_all()
        seen_update = job.updated_at
        if row is None:
            row = self._ensure_run(job, self.client, done)
        if not row.params_sent:
            params = {key(k): _text(v) for k, v in sorted((job.params or {}).items())}
            self.client.log_batch(row.run_id, params=params)
            row = self._save(job_id, params_sent=True)
        done.points += self._send_metrics(row)
        status = STATUS.get(JobState(job.state), "RUNNING")
        # an ended job whose every point is sent is synced (a running job never is)
        caught_up = status != "RUNNING" and self._pending_points(row) == 0
        if status != row.status:
            attempts = self._attempts(job_id)
            last = attempts[-1] if attempts else None
            tags = self._tags(job, last)
            if last is not None and len(attempts) > 1:
                tags.update(self._params_now(row, last))
            self.client.log_batch(row.run_id, tags=tags)
            if status != "RUNNING" and last is not None and row.artifacts_attempt != last.id:
                done.artifacts += self._upload(job, attempts, row)
                row = self._save(job_id, artifacts_attempt=last.id)
            end = ms(last.ended_at if last is not None else None) if status != "RUNNING" else None
            self.client.update_run(row.run_id, status, end)
            row = self._save(job_id, status=status)
        self._refusals.pop(job_id, None)
        clean = {
            "synced_update": seen_update if caught_up else None,
            "failures": 0,
            "next_try_at": None,
            "last_error": None,
        }
        if any(getattr(row, k) != v for k, v in clean.items()):  # no write when nothing changes
            self._save(job_id, **clean)

    # ------------------------------------------------------------------ the run
    def _ensure_run(self, job: Job, client: MlflowClient, done: Pass | None = None) -> MlflowRun:
        """The job's run: kept in the store, else found by tag, else created; kept either way."""
        assert job.id is not None
        with self._create:
            with self.store.session() as s:
                row = self._row(s, job.id)
                if row is not None:
                    s.expunge(row)
                    return row
            exp = self._experiment_id(client)
            store_id = self._store()
            found = [
                r
                for r in client.find_runs(exp, JOB_TAG, str(job.id))
                if _tag(r, STORE_TAG) == store_id
            ]
            if found:
                run_id = str(found[0]["info"]["run_id"])
            else:
                tags = self._tags(job, None)
                run_id = client.create_run(
                    exp, f"{job.name}-{job.id}", ms(job.created_at) or 0, tags
                )
                if done is not None:
                    done.runs_created += 1
                self.note("mlflow.run_created", {"job_id": job.id, "run_id": run_id})
            with self.store.session() as s:
                row = s.get(MlflowRun, job.id)
                if row is None:
                    row = MlflowRun(
                        job_id=job.id, run_id=run_id, experiment_id=exp, tracking_uri=self.uri
                    )
                    s.add(row)
                    s.flush()
                s.refresh(row)
                s.expunge(row)
            return row

    def _row(self, s: Any, job_id: int) -> MlflowRun | None:
        """The job's mirror row; one made on another server (`tracking.mlflow.uri` changed) is
        dropped: the job is mirrored afresh on this one."""
        row = s.get(MlflowRun, job_id)
        if row is not None and row.tracking_uri != self.uri:
            s.delete(row)
            s.flush()
            return None
        return row  # type: ignore[no-any-return]

    def _experiment_id(self, client: MlflowClient) -> str:
        if self._experiment is None:
            self._experiment = client.experiment_id(self.cfg.experiment)
        return self._experiment

    def _store(self) -> str:
        if self._store_id is None:
            self._store_id = self.store.instance_id()
        return self._store_id

    def _tags(self, job: Job, last: Attempt | None) -> dict[str, str]:
        tags = {
            JOB_TAG: str(job.id),
            STORE_TAG: self._store(),
            "nightshift.job_name": job.name,
            "nightshift.owner": job.owner,
            "nightshift.state": job.state,
            "mlflow.user": job.owner,
            "mlflow.runName": f"{job.name}-{job.id}",
        }
        if job.group:
            tags["nightshift.group"] = job.group
        if job.reproduces is not None:
            tags[REPRODUCES_TAG] = str(job.reproduces)
        if last is not None:
            tags["nightshift.attempt"] = str(last.number)
            if last.cause:
                tags["nightshift.cause"] = last.cause
            record = last.provenance
            if isinstance(record, dict):
                for label, read in provenance.FIELDS:
                    value = read(record)
                    if value not in (None, [], {}, ""):
                        tags[f"nightshift.provenance.{label.replace(' ', '_')}"] = _text(value)
                commit = provenance._get(record, "git", "commit")
                if commit:
                    tags["mlflow.source.git.commit"] = str(commit)
        return tags

    def _params_now(self, row: MlflowRun, last: Attempt) -> dict[str, str]:
        """MLflow's parameters never change, and a recovery may change a job's (a lower learning
        rate for its next attempt): when the newest attempt ran with others than the run's
        parameters, every parameter it ran with as a tag `nightshift.last_attempt.param.<key>`."""
        ran = {key(k): _text(v) for k, v in (last.params or {}).items()}
        run = self.client.get_run(row.run_id)
        logged = {p["key"]: p["value"] for p in run.get("data", {}).get("params") or []}
        if all(logged.get(k, v[:MAX_PARAM_VALUE]) == v[:MAX_PARAM_VALUE] for k, v in ran.items()):
            return {}
        return {f"{LAST_PARAM_TAG}{k}"[:250]: v for k, v in sorted(ran.items())}

    # ------------------------------------------------------------------ metrics
    def _pending_points(self, row: MlflowRun) -> int:
        with self.store.session() as s:
            q = select(MetricPoint.id).where(
                MetricPoint.job_id == row.job_id, col(MetricPoint.id) > row.metric_cursor
            )
            return len(s.exec(q.limit(1)).all())

    def _send_metrics(self, row: MlflowRun) -> int:
        """At most `batch` points after the cursor, in id order; the cursor moves after MLflow
        acknowledged them."""
        with self.store.session() as s:
            q = (
                select(MetricPoint, Attempt.started_at)
                .join(Attempt, col(Attempt.id) == col(MetricPoint.attempt_id))
                .where(MetricPoint.job_id == row.job_id, col(MetricPoint.id) > row.metric_cursor)
                .order_by(col(MetricPoint.id))
                .limit(self.cfg.batch)
            )
            got = [
                (p.id, p.name, p.step, p.value, p.wall_time or started)
                for p, started in s.exec(q).all()
            ]
        if not got:
            return 0
        metrics = [
            {
                "key": key(name),
                "value": value if value is not None else "NaN",
                "step": step,
                "timestamp": ms(at),
            }
            for _, name, step, value, at in got
        ]
        self.client.log_batch(row.run_id, metrics=metrics)
        self._save(row.job_id, metric_cursor=int(got[-1][0] or 0))
        row.metric_cursor = int(got[-1][0] or 0)
        return len(got)

    # ------------------------------------------------------------------ artifacts
    def _attempts(self, job_id: int) -> list[Attempt]:
        with self.store.session() as s:
            rows = list(
                s.exec(
                    select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
                )
            )
            s.expunge_all()
            return rows

    def _upload(self, job: Job, attempts: Iterable[Attempt], row: MlflowRun) -> int:
        """The attempts' logs, the metrics file and the plots in the job's folder, each read
        without following a link (the folder is the submitter's), the end of one too large."""
        from nightshift.runtime.engine import job_paths

        paths = job_paths(self.settings, job)
        folder = paths["workspace"]
        files: list[tuple[str, str | Path]] = []
        for att in attempts:
            log = att.log_path or folder / f"attempt-{att.number}.log"
            files.append((f"logs/attempt-{att.number}.log", log))
        files.append((f"metrics/{paths['metrics_file'].name}", paths["metrics_file"]))
        try:
            files += [
                (f"plots/{p.name}", p.name)
                for p in sorted(folder.iterdir())
                if p.suffix.lower() in PLOTS and not p.is_symlink() and p.is_file()
            ]
        except OSError:
            pass
        run = self.client.get_run(row.run_id)
        limit = int(self.cfg.max_artifact_mb * 1024 * 1024)
        sent = 0
        for name, path in files:
            data = _read_end(folder, path, limit)
            if data is None:
                continue
            self.client.upload_artifact(run, name, data)
            sent += 1
        curves = self._curves(job)
        if curves is not None:
            self.client.upload_artifact(run, CURVES, curves)
            sent += 1
        return sent

    def _curves(self, job: Job) -> bytes | None:
        """The job's metric curves as the store holds them, drawn (runtime/training/
        metric_plot.py): the run's plot even when the program draws none."""
        with self.store.session() as s:
            q = (
                select(Attempt.number, MetricPoint.name, MetricPoint.step, MetricPoint.value)
                .join(Attempt, col(Attempt.id) == col(MetricPoint.attempt_id))
                .where(MetricPoint.job_id == job.id)
                .order_by(col(MetricPoint.id))
            )
            rows = s.exec(q).all()
        first = (job.spec.get("metrics") or {}).get("name") if isinstance(job.spec, dict) else None
        try:
            return metric_plot.curves_png(rows, title=f"{job.name} (job {job.id})", first=first)
        except Exception:  # noqa: BLE001  # a plot that cannot be drawn never holds the run back
            return None

    # ------------------------------------------------------------------ a launch
    def env_for(self, job_id: int | None) -> dict[str, str]:
        """MLFLOW_TRACKING_URI and MLFLOW_RUN_ID for a job about to start; {} when its run
        cannot be had within `launch_wait_s` (the program then logs nowhere; the mirror still
        mirrors it)."""
        if job_id is None:
            return {}
        with self.store.session() as s:
            row = self._row(s, job_id)
            job = s.get(Job, job_id) if row is None else None
            if job is not None:
                s.expunge(job)
            run_id = row.run_id if row is not None else None
        if run_id is None and job is not None and time.monotonic() >= self._retry_at:
            if self._create.acquire(timeout=self.cfg.launch_wait_s):
                self._create.release()
                try:
                    run_id = self._ensure_run(job, self.quick).run_id
                except MlflowUnavailable as exc:
                    self._unreachable(exc)
                    self.note(
                        "mlflow.env_missing",
                        {"job_id": job_id, "error": str(exc)[:300], "uri": self.uri},
                    )
                except Exception as exc:  # noqa: BLE001  # the launch goes on without it
                    self.note(
                        "mlflow.env_missing",
                        {"job_id": job_id, "error": str(exc)[:300], "uri": self.uri},
                    )
        if run_id is None:
            return {}
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_RUN_ID": run_id}

    # ------------------------------------------------------------------ failures
    def _unreachable(self, exc: MlflowError) -> None:
        self._down_steps += 1
        wait = RETRY.delay_s(self._down_steps, 0)
        self._retry_at = time.monotonic() + wait
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.note(
                "mlflow.unreachable", {"uri": self.uri, "error": str(exc)[:500], "retry_s": wait}
            )
            self.report(f"warning: MLflow at {self.uri} is unreachable ({exc}); retrying")

    def _reachable(self) -> None:
        if self._down_since is not None:
            lasted = time.monotonic() - self._down_since
            self.note("mlflow.recovered", {"uri": self.uri, "seconds": round(lasted, 1)})
            self.report(f"MLflow at {self.uri} answers again after {lasted:.0f} s")
        self._down_since, self._down_steps, self._retry_at = None, 0, float("-inf")

    def _refused(self, job_id: int, exc: MlflowRefused) -> None:
        """Noted once per job (until it mirrors again), retried with backoff."""
        failures = self._refusals.get(job_id, (0, 0.0))[0] + 1
        wait = RETRY.delay_s(failures, 0)
        self._refusals[job_id] = (failures, time.monotonic() + wait)
        with self.store.session() as s:
            known = s.get(MlflowRun, job_id) is not None
        if known:
            self._save(
                job_id,
                failures=failures,
                next_try_at=utcnow() + timedelta(seconds=wait),
                last_error=str(exc)[:1000],
            )
        if failures == 1:
            self.note(
                "mlflow.refused", {"job_id": job_id, "error": str(exc)[:500], "retry_s": wait}
            )

    def _save(self, job_id: int, **values: Any) -> MlflowRun:
        with self.store.session() as s:
            row = s.get(MlflowRun, job_id)
            assert row is not None
            for k, v in values.items():
                setattr(row, k, v)
            s.add(row)
            s.flush()
            s.refresh(row)
            s.expunge(row)
            return row


def _text(value: Any) -> str:
    return provenance.short(value) if not isinstance(value, str) else value


def _tag(run: dict[str, Any], key: str) -> str | None:
    for t in run.get("data", {}).get("tags") or []:
        if t.get("key") == key:
            return str(t.get("value"))
    return None


def _read_end(folder: Path, path: str | Path, limit: int) -> bytes | None:
    """A file in the job's folder (no link followed), or its last `limit` bytes; None when it
    is missing, elsewhere or refused."""
    try:
        if job_files.relative_in(folder, path) is None:
            return None
        with job_files.open_file(folder, path) as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read()
    except (OSError, job_files.JobFileRefused):
        return None
