"""Sweeps with Optuna: a spec's `search` space searched by ask-and-tell, one job per trial.

`nightshift sweep` validates the spec, creates the Optuna study once (before any trial exists:
two processes creating one study on a fresh SQLite database race) and records a `Sweep` row.
From then on the daemon's loop calls `SweepDriver.tick` once per step, which for every running
sweep:

1. tells Optuna how finished trials ended: a succeeded job (early_stopped included) is COMPLETE
   with the best value of the objective metric, or PRUNED when the driver stopped it; a job that
   failed for good (its retries spent) or was cancelled is FAIL;
2. reports the objective's new metric points (the monitor's `MetricPoint`s) to the running
   trials and, when the pruner says so, stops the job as `early_stopped` (a success for the
   sweep) through the engine's own stop path;
3. asks for new trials while the budget (trials, GPU-hours, a deadline) lasts and fewer than
   `max_parallel` trials — and no more than the configured share of the GPUs (CPU slots for
   CPU-only trials) — are active; each is submitted as an ordinary job (tariffs, priorities,
   placement and recovery apply unchanged) under the call id `sweep-<id>-trial-<n>`, so a
   driver killed at any instant never queues a trial twice.

Where the study lives: Optuna's RDBStorage keeps its own Alembic revision in the default
`alembic_version` table, which the store's migrations own, so not among the store's tables. With
a SQLite store, in a file next to it (`nightshift-optuna.db` beside `nightshift.db`, which also
keeps Optuna's writes off the store's write lock); with PostgreSQL, in the same database under a
schema of its own (`nightshift_optuna`, the connection's search_path), so every daemon of a team
sees it.

Seeded: the sampler of trial n is seeded from (seed, n), so the same seed and the same results in
the same order ask for the same trials, even across a restarted daemon.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from sqlmodel import col, select

from nightshift.runtime.errors import BadArguments, ConfigError, OperatorError
from nightshift.runtime.gpu.gpu import health_sources
from nightshift.runtime.scheduling.local_time import until_deadline
from nightshift.runtime.spec import ExperimentSpec, SearchParam, SweepSpec
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt, GpuSample, Job, MetricPoint, Store, Sweep, utcnow

if TYPE_CHECKING:
    import optuna

    from nightshift.runtime.engine import Engine

SWEEP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
EventSink = Callable[[str, dict[str, Any]], None]
# Submit one trial as a job: the job's id, or None while its submission waits (an approval).
Submit = Callable[[Sweep, int, dict[str, Any]], "int | None"]


class SweepRefused(Exception):
    """A trial could not be queued for good (the policy denied it, its arguments are bad): the
    sweep stops, failed, with this reason."""


def call_key(sweep_id: int, number: int) -> str:
    """The call id of trial `number`'s submission: the one link between a trial and its job."""
    return f"sweep-{sweep_id}-trial-{number}"


OPTUNA_SCHEMA = "nightshift_optuna"
_IN_SCHEMA = "schema:"  # Sweep.storage for a study kept in a schema of the store's database


def storage_url(store_url: str) -> str:
    """Where the studies live (recorded on the sweep, never with a password): a SQLite file next
    to a SQLite store, or a schema of its own in a PostgreSQL store's database."""
    if store_url.startswith("postgresql"):
        return _IN_SCHEMA + OPTUNA_SCHEMA
    if not store_url.startswith("sqlite:///") or store_url.endswith(":memory:"):
        raise ConfigError(
            f"sweeps keep their Optuna study beside a SQLite store or in a PostgreSQL one; "
            f"store.url {store_url!r} is neither"
        )
    path = Path(store_url[len("sqlite:///") :]).resolve()
    return f"sqlite:///{path.with_name(path.stem + '-optuna.db')}"


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("sweeps need Optuna: pip install 'nightshift[sweeps]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


_STORAGES: dict[tuple[str, str], Any] = {}


def storage(where: str, store_url: str | None = None) -> optuna.storages.RDBStorage:
    """The study storage a sweep records (`storage_url`), for the store at `store_url`; one per
    process (making one checks the schema: not once a tick). In PostgreSQL, Optuna's tables and
    its Alembic revision live in their own schema (the connection's search_path), apart from the
    store's `alembic_version`."""
    key = (where, store_url or "")
    if key not in _STORAGES:
        optuna = _optuna()
        if where.startswith(_IN_SCHEMA):
            if store_url is None:
                raise ConfigError(f"sweep storage {where!r} is the store's: give its URL")
            schema = where[len(_IN_SCHEMA) :]
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
                raise ConfigError(f"sweep storage {where!r} names no valid schema")
            _create_schema(store_url, schema)
            kwargs = {"connect_args": {"options": f"-csearch_path={schema}"}}
            _STORAGES[key] = optuna.storages.RDBStorage(store_url, engine_kwargs=kwargs)
        else:
            _STORAGES[key] = optuna.storages.RDBStorage(
                where, engine_kwargs={"connect_args": {"timeout": 30}}
            )
    return _STORAGES[key]  # type: ignore[no-any-return]


def _create_schema(store_url: str, schema: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ the search
def objective(spec: ExperimentSpec) -> tuple[str, str]:
    """(metric, mode) the sweep optimises: sweep.metric/mode, else metrics.name/mode."""
    sw = spec.sweep or SweepSpec()
    return sw.metric or spec.metrics.name, sw.mode or spec.metrics.mode


def sweep_seed(spec: ExperimentSpec) -> int:
    sw = spec.sweep or SweepSpec()
    return sw.seed if sw.seed is not None else (spec.seed or 0)


def sampler_for(sw: SweepSpec, seed: int, number: int) -> Any:
    """The sampler that asks for trial `number`: seeded from (seed, number) alone, so a
    restarted driver asks what an uninterrupted one would have."""
    optuna = _optuna()
    trial_seed = (seed * 1_000_003 + number) % (2**32)
    if sw.sampler == "random":
        return optuna.samplers.RandomSampler(seed=trial_seed)
    return optuna.samplers.TPESampler(seed=trial_seed, n_startup_trials=sw.startup_trials)


def pruner_for(sw: SweepSpec) -> Any:
    optuna = _optuna()
    if sw.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=sw.prune_startup_trials, n_warmup_steps=sw.prune_warmup_steps
        )
    if sw.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=sw.min_resource or "auto", reduction_factor=sw.reduction_factor
        )
    return optuna.pruners.NopPruner()


def suggest(trial: Any, search: dict[str, SearchParam], defaults: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters: the spec's `parameters`, with each search dimension whose `when`
    holds sampled by the trial (define-by-run, so conditional spaces work with TPE)."""
    params = dict(defaults)
    for name, p in search.items():
        if p.when and not all(
            params.get(other) in (v if isinstance(v, list) else [v]) for other, v in p.when.items()
        ):
            continue
        if p.type == "categorical":
            params[name] = trial.suggest_categorical(name, p.choices)
        elif p.type == "int":
            assert p.low is not None and p.high is not None  # the model checked
            params[name] = trial.suggest_int(
                name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
            )
        else:
            assert p.low is not None and p.high is not None
            params[name] = trial.suggest_float(
                name, p.low, p.high, log=p.type == "log_uniform", step=p.step
            )
    return params


def seed_lr_prior(spec: ExperimentSpec, suggested: float) -> ExperimentSpec:
    """The spec with tune_lr's range-test suggestion as the sweep's prior on the learning rate
    (knobs.learning_rate): its float range narrowed to a decade either side of the suggestion
    (within the declared bounds) and a first trial queued at the suggestion itself."""
    knob = spec.knobs.learning_rate
    dim = (spec.search or {}).get(knob or "")
    if knob is None or dim is None or dim.type not in ("log_uniform", "uniform"):
        raise BadArguments(
            "--lr-range-test seeds the learning rate's prior: name it in knobs.learning_rate "
            "and give it a log_uniform or uniform search dimension"
        )
    assert dim.low is not None and dim.high is not None
    low, high = max(dim.low, suggested / 10), min(dim.high, suggested * 10)
    if not low < high:
        raise BadArguments(
            f"the range test suggests lr {suggested:.3g}, outside search.{knob} "
            f"[{dim.low:g}, {dim.high:g}]: widen it, or leave --lr-range-test out"
        )
    first = min(max(suggested, low), high)
    search = {**(spec.search or {}), knob: dim.model_copy(update={"low": low, "high": high})}
    sw = spec.sweep or SweepSpec()
    sweep = sw.model_copy(update={"enqueue": [{knob: first}, *sw.enqueue]})
    return spec.model_copy(update={"search": search, "sweep": sweep})


# ------------------------------------------------------------------------------ the budget
class Budget(BaseModel):
    """What a sweep may spend; every bound is optional, and at least one is set."""

    trials: int | None = None
    gpu_hours: float | None = None
    deadline: datetime | None = Field(None, description="Naive UTC: no new trial after it")
    max_parallel: int = 2
    seed: int = 0
    stopped: str | None = Field(None, description="Who stopped the sweep, and why (stop_sweep)")

    def spent(self, trials: int, gpu_hours: float, now: datetime) -> str | None:
        """Why no new trial may start, or None while the budget lasts."""
        if self.stopped is not None:
            return self.stopped
        if self.trials is not None and trials >= self.trials:
            return f"{trials} of {self.trials} trials queued"
        if self.gpu_hours is not None and gpu_hours >= self.gpu_hours:
            return f"{gpu_hours:.3g} of {self.gpu_hours:g} GPU-hours used"
        if self.deadline is not None and now >= self.deadline:
            return f"the deadline {self.deadline:%Y-%m-%d %H:%M} UTC passed"
        return None


def budget_of(sw: SweepSpec, seed: int, now: datetime, tz: tzinfo) -> Budget:
    """The sweep's budget from its (already overridden) sweep section; BadArguments if none."""
    deadlines = []
    if sw.until:
        deadlines.append(until_deadline(sw.until, now, tz))
    if sw.deadline is not None:
        d = sw.deadline if sw.deadline.tzinfo else sw.deadline.replace(tzinfo=tz)
        deadlines.append(d.astimezone(UTC).replace(tzinfo=None))
    if sw.trials is None and sw.gpu_hours is None and not deadlines:
        raise BadArguments(
            "a sweep needs a budget: set sweep.trials, sweep.gpu_hours, sweep.until or "
            "sweep.deadline in the spec, or --trials, --gpu-hours, --until or --deadline"
        )
    return Budget(
        trials=sw.trials,
        gpu_hours=sw.gpu_hours,
        deadline=min(deadlines) if deadlines else None,
        max_parallel=sw.max_parallel,
        seed=seed,
    )


# ------------------------------------------------------------------------------ creating one
def create_sweep(
    store: Store,
    spec: ExperimentSpec,
    *,
    spec_path: str | None,
    owner: str,
    name: str,
    now: datetime,
    tz: tzinfo,
) -> Sweep:
    """Create the study (once, here, before any trial), then record the sweep for the driver.

    `spec.sweep` is the effective section (the command line's overrides applied). The stored
    spec has an absolute code path, so its trials run where the spec file said."""
    if not SWEEP_NAME.match(name):
        raise BadArguments(f"sweep name {name!r}: letters, digits, '.', '_' and '-' only")
    if not spec.search:
        raise BadArguments(
            "the spec has no search space: add search: {lr: {type: log_uniform, low: 1e-4, "
            "high: 1e-1}} (and a sweep: section for the budget)"
        )
    sw = spec.sweep or SweepSpec()
    seed = sweep_seed(spec)
    budget = budget_of(sw, seed, now, tz)
    with store.session() as s:
        if s.exec(select(Sweep.id).where(Sweep.name == name)).first() is not None:
            raise BadArguments(f"a sweep named {name!r} exists already: choose another --name")
    stored = spec.model_copy(
        update={"code": spec.code.model_copy(update={"path": str(spec.run_dir())})}
    )
    url = storage_url(store.url)
    optuna = _optuna()
    _, mode = objective(spec)
    study = optuna.create_study(
        storage=storage(url, store.url),
        study_name=name,
        direction="minimize" if mode == "min" else "maximize",
        load_if_exists=True,  # a creation cut short before its row was written
    )
    if not study.trials:
        for fixed in sw.enqueue:
            study.enqueue_trial(fixed, skip_if_exists=True)
    row = Sweep(
        name=name,
        study=name,
        storage=url,
        spec=stored.model_dump(mode="json"),
        spec_path=spec_path,
        owner=owner,
        budget=budget.model_dump(mode="json"),
        created_at=now,
        updated_at=now,
    )
    with store.session() as s:
        s.add(row)
    return row


def load_study(sweep: Sweep, store_url: str | None = None, number: int = 0) -> Any:
    spec = ExperimentSpec.model_validate(sweep.spec)
    sw = spec.sweep or SweepSpec()
    return _optuna().load_study(
        study_name=sweep.study,
        storage=storage(sweep.storage, store_url),
        sampler=sampler_for(sw, Budget.model_validate(sweep.budget).seed, number),
        pruner=pruner_for(sw),
    )


# ------------------------------------------------------------------------------ the driver
class SweepDriver:
    """Tells, reports, prunes and asks for every running sweep; one call per loop step."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        submit: Submit,
        *,
        on_event: EventSink | None = None,
        clock: Callable[[], datetime] = utcnow,
        share: float = 1.0,
        cpu_slots: int = 1,
        node: str = "",
    ):
        self.store, self.engine, self.submit = store, engine, submit
        self.on_event = on_event or (lambda action, payload: None)
        self.clock = clock
        self.share, self.cpu_slots, self.node = share, cpu_slots, node
        self.health_sources = health_sources(engine.settings)  # the GPUs as its placement sees

    def tick(self) -> None:
        """Drive every running sweep. One that cannot be driven (its study file deleted or
        corrupt, say) ends failed with the reason; it never stops the loop for everyone else.
        A fault of the store itself (a full disk) is the loop's to report and wait out."""
        with self.store.session() as s:
            sweeps = list(s.exec(select(Sweep).where(Sweep.state == "running")))
        for sweep in sweeps:
            try:
                self.drive(sweep)
            except OperatorError:
                raise
            except Exception as exc:
                if self.store.fault_of(exc) is not None:
                    raise
                why = f"the sweep could not be driven: {type(exc).__name__}: {exc}"
                self._end(sweep, None, "failed", why[:500], self.clock())

    def drive(self, sweep: Sweep) -> None:
        now = self.clock()
        spec = ExperimentSpec.model_validate(sweep.spec)
        sw = spec.sweep or SweepSpec()
        budget = Budget.model_validate(sweep.budget)
        study = load_study(sweep, self.store.url)
        optuna = _optuna()
        RUNNING = optuna.trial.TrialState.RUNNING
        jobs = self._jobs(sweep)
        active = 0
        try:
            for t in study.get_trials(deepcopy=False, states=(RUNNING,)):
                job = jobs.get(t.number)
                if job is None:
                    active += self._unqueued(sweep, study, t)
                elif self._settle(sweep, spec, study, t, job, now):
                    active += 1
            used_trials = len(jobs)
            # Trials queued below have no attempt yet: the hours used stay what they are now.
            hours = self._gpu_hours(jobs, now)
            spent = budget.spent(used_trials, hours, now)
            free = min(budget.max_parallel, self._share_cap(spec)) - active
            while spent is None and free > 0:
                number = len(study.get_trials(deepcopy=False))
                study.sampler = sampler_for(sw, budget.seed, number)
                trial = study.ask()
                params = suggest(trial, spec.search or {}, spec.parameters)
                trial.set_user_attr("params", params)
                queued = self._queue(sweep, study, trial.number, params)
                used_trials += 1
                active += 1
                free -= 1
                spent = budget.spent(used_trials, hours, now)
                if not queued:
                    break  # its submission waits (an approval): ask for no more this step
        except SweepRefused as exc:
            self._end(sweep, study, "failed", f"a trial could not be queued: {exc}", now)
            return
        if spent is not None and active == 0:
            self._end(sweep, study, "done", f"budget spent: {spent}", now)

    # -------------------------------------------------------------- one running trial
    def _queue(self, sweep: Sweep, study: Any, number: int, params: dict[str, Any]) -> bool:
        """Submit trial `number` (again, after a crash: the call id makes it once); True once
        it is a job."""
        job_id = self.submit(sweep, number, params)
        if job_id is None:
            return False
        study._storage.set_trial_user_attr(_trial_id(study, number), "job_id", job_id)
        self.on_event(
            "sweep.trial",
            {"sweep": sweep.name, "trial": number, "job_id": job_id, "params": params},
        )
        return True

    def _unqueued(self, sweep: Sweep, study: Any, t: Any) -> int:
        """A running trial without a job: the driver stopped between asking and submitting, or
        the submission waits for an approval. 1 while it still counts as active."""
        params = t.user_attrs.get("params")
        if params is None:  # asked, but its parameters were never recorded: never a job
            study._storage.set_trial_user_attr(
                t._trial_id, "reason", "the driver stopped before the trial was queued"
            )
            study.tell(t.number, state=_optuna().trial.TrialState.FAIL)
            return 0
        self._queue(sweep, study, t.number, params)
        return 1

    def _settle(
        self, sweep: Sweep, spec: ExperimentSpec, study: Any, t: Any, job: Job, now: datetime
    ) -> bool:
        """Report new points to a live trial, prune it or tell how it ended. True while the
        trial is still active."""
        optuna = _optuna()
        metric, mode = objective(spec)
        if job.state == "succeeded":
            values = [v for _, v in self._points(job.id, metric)]
            if t.user_attrs.get("pruned_at") is not None:
                study.tell(t.number, state=optuna.trial.TrialState.PRUNED)
                self._told(sweep, t.number, job, "pruned", None)
            elif values:
                best = min(values) if mode == "min" else max(values)
                study.tell(t.number, best)
                self._told(sweep, t.number, job, "complete", best)
            else:
                study._storage.set_trial_user_attr(
                    t._trial_id, "reason", f"the job recorded no {metric}"
                )
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                self._told(sweep, t.number, job, "fail", None)
            return False
        if job.state == "cancelled" or (
            job.state == "failed"
            and lifecycle.failures([a.outcome for a in self.store.attempts(job.id)])
            >= job.max_attempts
        ):
            study._storage.set_trial_user_attr(t._trial_id, "reason", job.reason or job.state)
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            self._told(sweep, t.number, job, "fail", None)
            return False
        if job.state == "running":
            self._report(sweep, spec, study, t, job, now)
        return True

    def _report(
        self, sweep: Sweep, spec: ExperimentSpec, study: Any, t: Any, job: Job, now: datetime
    ) -> None:
        metric, _ = objective(spec)
        done = max(t.intermediate_values, default=-1)
        new = [(step, v) for step, v in self._points(job.id, metric, after=done) if step > done]
        if not new:
            return
        trial = _optuna().trial.Trial(study, t._trial_id)
        last = done
        for step, v in new:
            if step > last:  # a resumed attempt logs steps again: each step once
                trial.report(v, step)
                last = step
        sw = spec.sweep or SweepSpec()
        if sw.pruner == "none" or not trial.should_prune():
            return
        why = (
            f"pruned by sweep {sweep.name}'s {sw.pruner} pruner at step {last}: {metric} "
            f"{new[-1][1]:.6g} (trial {t.number})"
        )
        trial.set_user_attr("pruned_at", last)
        if self.engine.pause_job(job.id, now, outcome=lifecycle.Outcome.EARLY_STOPPED, why=why):
            self.on_event(
                "sweep.pruned",
                {"sweep": sweep.name, "trial": t.number, "job_id": job.id, "step": last},
            )

    def _told(self, sweep: Sweep, number: int, job: Job, state: str, value: float | None) -> None:
        self.on_event(
            "sweep.told",
            {
                "sweep": sweep.name,
                "trial": number,
                "job_id": job.id,
                "state": state,
                "value": value,
            },
        )

    def _end(self, sweep: Sweep, study: Any, state: str, reason: str, now: datetime) -> None:
        result = best_of(study) if study is not None else {}
        with self.store.session() as s:
            row = s.get(Sweep, sweep.id)
            if row is None or row.state != "running":
                return
            row.state, row.reason, row.result, row.updated_at = state, reason, result, now
            s.add(row)
        self.on_event(
            "sweep.end", {"sweep": sweep.name, "state": state, "reason": reason, **result}
        )

    # -------------------------------------------------------------- store queries
    def _jobs(self, sweep: Sweep) -> dict[int, Job]:
        """The sweep's jobs by trial number (from their submission's call id)."""
        prefix = f"sweep-{sweep.id}-trial-"
        with self.store.session() as s:
            rows = s.exec(select(Job).where(Job.group == sweep.name))
            return {
                int(j.submitted_by_call[len(prefix) :]): j
                for j in rows
                if j.submitted_by_call and j.submitted_by_call.startswith(prefix)
            }

    def _points(self, job_id: int, metric: str, after: int = -1) -> list[tuple[int, float]]:
        with self.store.session() as s:
            rows = s.exec(
                select(MetricPoint.step, MetricPoint.value)
                .where(
                    MetricPoint.job_id == job_id,
                    MetricPoint.name == metric,
                    MetricPoint.step > after,
                    col(MetricPoint.value).is_not(None),
                )
                .order_by(col(MetricPoint.id))
            ).all()
        return [(step, v) for step, v in rows if v is not None and math.isfinite(v)]

    def _gpu_hours(self, jobs: dict[int, Job], now: datetime) -> float:
        return gpu_hours_of(self.store, [j.id for j in jobs.values() if j.id is not None], now)

    def _share_cap(self, spec: ExperimentSpec) -> int:
        """Trials one sweep may hold at once: `scheduler.sweep_share` of this node's GPUs (of
        its CPU slots for CPU-only trials), at least one."""
        gpus = spec.resources.gpus
        if gpus == 0:
            return max(1, math.floor(self.share * self.cpu_slots))
        with self.store.session() as s:
            known = s.exec(
                select(GpuSample.host, GpuSample.gpu_index)
                .where(
                    col(GpuSample.host).in_((self.node, "localhost")),
                    col(GpuSample.source).in_(self.health_sources),
                )
                .distinct()
            ).all()
        if not known:
            return 10_000  # no inventory recorded yet: placement holds what cannot run
        return max(1, math.floor(self.share * len(known) / gpus))


def _trial_id(study: Any, number: int) -> int:
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)  # type: ignore[no-any-return]


def gpu_hours_of(store: Store, job_ids: list[int], now: datetime) -> float:
    """GPU-hours the attempts of these jobs took (a CPU-only attempt counts as one slot)."""
    if not job_ids:
        return 0.0
    with store.session() as s:
        atts = s.exec(select(Attempt).where(col(Attempt.job_id).in_(job_ids))).all()
    return (
        sum(
            max(1, len(a.gpus)) * max(0.0, ((a.ended_at or now) - a.started_at).total_seconds())
            for a in atts
        )
        / 3600
    )


def best_of(study: Any) -> dict[str, Any]:
    """The best complete trial (number, value, parameters, job), or {} while there is none."""
    try:
        best = study.best_trial
    except ValueError:
        return {}
    return {
        "best_trial": best.number,
        "best_value": best.value,
        "best_params": best.user_attrs.get("params", best.params),
        "best_job_id": best.user_attrs.get("job_id"),
    }
