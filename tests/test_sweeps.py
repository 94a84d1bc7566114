"""Sweeps with Optuna (`nightshift sweep`): the search space and budget a spec declares, seeded
asks, and a real sweep of real training driven by the loop through a restart."""

from __future__ import annotations

import getpass
import json
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import select

from nightshift.runtime.errors import BadArguments, SpecError
from nightshift.runtime.scheduling.sweeps import (
    Budget,
    budget_of,
    call_key,
    load_study,
    sampler_for,
    storage_url,
    suggest,
    until_deadline,
)
from nightshift.runtime.spec import ExperimentSpec, SweepSpec
from nightshift.runtime.yamlfile import validate

from conftest import REPO, nightshift

pytest.importorskip("optuna")

BASE: dict[str, Any] = {
    "name": "s",
    "command": ["python", "t.py", "--lr", "{lr}", "--opt", "{opt}", "--mom", "{mom}"],
    "parameters": {"mom": 0.0},
}
SEARCH = {
    "lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0},
    "opt": {"type": "categorical", "choices": ["sgd", "adam"]},
    "mom": {"type": "uniform", "low": 0.0, "high": 0.99, "when": {"opt": "sgd"}},
}


def spec_of(search: Any = SEARCH, sweep: Any = None, **top: Any) -> ExperimentSpec:
    data = {**BASE, "search": search, **top}
    if sweep is not None:
        data["sweep"] = sweep
    return validate(ExperimentSpec, data, path="spec.yaml")


# ------------------------------------------------------------------------ the search space
@pytest.mark.parametrize(
    "search, field, words",
    [
        ({"lr": {"type": "log_uniform", "low": 0, "high": 1}}, "search.lr", "low > 0"),
        ({"lr": {"type": "uniform", "low": 1, "high": 1}}, "search.lr", "must be below"),
        ({"lr": {"type": "uniform", "low": 1}}, "search.lr", "both low and high"),
        ({"lr": {"type": "normal", "low": 0, "high": 1}}, "search.lr.type", "log_uniform"),
        ({"n": {"type": "int", "low": 1.5, "high": 4}}, "search.n", "whole low and high"),
        ({"c": {"type": "categorical"}}, "search.c", "needs choices"),
        ({"c": {"type": "categorical", "choices": [1], "low": 0}}, "search.c", "not low"),
        ({"lr": {"type": "uniform", "low": 0, "high": 1, "log": True}}, "search.lr", "log_uniform"),
        (
            {"lr": {"type": "uniform", "low": 0, "high": 1, "when": {"opt": "sgd"}}},
            None,
            "not a categorical parameter listed before it",
        ),
        (
            {
                "opt": {"type": "categorical", "choices": ["sgd"]},
                "lr": {"type": "uniform", "low": 0, "high": 1, "when": {"opt": "adamw"}},
            },
            None,
            "'adamw' is not one of search.opt.choices",
        ),
    ],
)
def test_a_bad_search_entry_names_the_field_and_the_fix(search, field, words):
    """Each mistake in a search dimension is one SpecError naming where it is and what to do."""
    with pytest.raises(SpecError) as info:
        spec_of(search)
    assert words in str(info.value)
    if field is not None:
        assert info.value.field == field


def test_a_conditional_parameter_needs_a_default_and_a_sweep_needs_a_search():
    with pytest.raises(SpecError, match="give it a value in parameters"):
        spec_of(SEARCH, parameters={})
    with pytest.raises(SpecError, match="sweep needs a search space"):
        validate(ExperimentSpec, {**BASE, "sweep": {"trials": 3}})
    with pytest.raises(SpecError, match="HH:MM"):
        spec_of(sweep={"until": "7am"})
    with pytest.raises(SpecError, match="use one of them"):
        spec_of(search_space={"wd": [0.0, 0.1]})


junk = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
dimension = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["log_uniform", "uniform", "int", "categorical", "x"]) | junk,
        "low": junk | st.floats(-10, 10),
        "high": junk | st.floats(-10, 10),
        "step": junk,
        "log": junk,
        "choices": junk,
        "when": junk,
    },
)
sweep_section = st.fixed_dictionaries(
    {},
    optional={
        k: junk | st.integers(-3, 10**6)
        for k in ("trials", "gpu_hours", "until", "deadline", "sampler", "pruner", "max_parallel")
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    search=st.dictionaries(
        st.sampled_from(["lr", "opt", "mom", "x y"]), dimension | junk, max_size=3
    ),
    sweep=sweep_section | junk,
)
def test_fuzzed_search_and_sweep_sections_give_a_clear_error_never_a_traceback(search, sweep):
    """Whatever a user writes under search: and sweep:, the spec either loads or fails with a
    SpecError (a field and a message): never another exception."""
    try:
        spec = spec_of(search, sweep)
    except SpecError as exc:
        assert str(exc)
        return
    assert spec.sweep is None or isinstance(spec.sweep, SweepSpec)
    try:
        budget_of(spec.sweep or SweepSpec(), 0, datetime(2026, 12, 2, 3, 0), ZoneInfo("UTC"))
    except BadArguments as exc:
        assert "needs a budget" in str(exc)


# ------------------------------------------------------------------------ the budget
def test_until_is_the_next_local_time_of_day():
    """`until: "07:00"` in Paris is 06:00 UTC in winter: today before it, tomorrow after it."""
    paris = ZoneInfo("Europe/Paris")
    assert until_deadline("07:00", datetime(2026, 12, 2, 3, 0), paris) == datetime(2026, 12, 2, 6)
    assert until_deadline("07:00", datetime(2026, 12, 2, 6, 30), paris) == datetime(2026, 12, 3, 6)
    # across the switch to summer time, 07:00 is 05:00 UTC
    assert until_deadline("07:00", datetime(2026, 3, 28, 12), paris) == datetime(2026, 3, 29, 5)


def test_the_budget_ends_at_trials_gpu_hours_or_the_deadline_whichever_first():
    now = datetime(2026, 12, 2, 3, 0)
    b = budget_of(SweepSpec(trials=4, gpu_hours=2.0, until="07:00"), 0, now, ZoneInfo("UTC"))
    assert b.deadline == datetime(2026, 12, 2, 7, 0)
    assert b.spent(3, 1.9, now) is None
    assert "4 of 4 trials" in (b.spent(4, 0.0, now) or "")
    assert "GPU-hours" in (b.spent(1, 2.0, now) or "")
    assert "deadline" in (b.spent(1, 0.0, datetime(2026, 12, 2, 7, 0)) or "")
    with pytest.raises(BadArguments, match="needs a budget"):
        budget_of(SweepSpec(), 0, now, ZoneInfo("UTC"))
    assert Budget(trials=1).spent(0, 0.0, now) is None


# ------------------------------------------------------------------------ seeded asks
def asks(url: str, seed: int, restart_at: int | None = None) -> list[dict[str, Any]]:
    """Ask-and-tell 9 trials (TPE after 4 random) on a fresh study, with a fixed objective;
    `restart_at`: load the study anew there, as a restarted daemon does."""
    import optuna

    from nightshift.runtime.scheduling.sweeps import storage

    spec = spec_of(sweep={"trials": 9, "startup_trials": 4, "seed": seed})
    sw = spec.sweep
    assert sw is not None
    optuna.create_study(storage=storage(url), study_name="s", direction="minimize")
    study = optuna.load_study(study_name="s", storage=storage(url))
    out = []
    for n in range(9):
        if n == restart_at:
            study = optuna.load_study(study_name="s", storage=storage(url))
        study.sampler = sampler_for(sw, seed, n)
        trial = study.ask()
        params = suggest(trial, spec.search or {}, spec.parameters)
        out.append(params)
        study.tell(trial, (params["lr"] - 0.01) ** 2 + (params["opt"] == "sgd") * params["mom"])
    return out


def test_the_same_seed_asks_for_the_same_trials_even_across_a_restart(tmp_path):
    """Seeded: a rerun asks for the same parameters, and so does a driver restarted halfway
    (each trial's sampler is seeded from the seed and its number); another seed asks others.
    A conditional parameter is sampled only where its condition holds."""
    first = asks(f"sqlite:///{tmp_path}/a.db", seed=7)
    assert asks(f"sqlite:///{tmp_path}/b.db", seed=7) == first
    assert asks(f"sqlite:///{tmp_path}/c.db", seed=7, restart_at=6) == first
    assert asks(f"sqlite:///{tmp_path}/d.db", seed=8) != first
    assert all(p["mom"] == 0.0 for p in first if p["opt"] == "adam")
    assert any(p["mom"] != 0.0 for p in first if p["opt"] == "sgd")


def test_the_study_lives_beside_a_sqlite_store_or_in_a_postgresql_schema():
    """(PostgreSQL for real: tests/test_postgres_store.py.) No password is ever recorded."""
    assert storage_url("sqlite:////h/nightshift.db") == "sqlite:////h/nightshift-optuna.db"
    assert storage_url("postgresql+psycopg://u:secret@db/n") == "schema:nightshift_optuna"
    with pytest.raises(Exception, match="neither"):
        storage_url("mysql://u@db/n")


# ------------------------------------------------------------------------ a real sweep
def sweep_spec(tmp_path: Path) -> Path:
    """The shipped example, shortened: 5 trials one at a time, the first four fixed (three good
    learning rates, then a far too small one the median pruner must stop), each step slowed so
    the loop sees the points while the trial runs."""
    spec = yaml.safe_load((REPO / "examples/specs/sweep_numpy.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    spec["environment"] = {"env": {"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.012"}}
    spec["parameters"].update(steps=100, val_every=10)
    spec["sweep"].update(
        trials=5,
        max_parallel=1,
        startup_trials=2,
        prune_startup_trials=2,
        prune_warmup_steps=20,
        enqueue=[
            {"lr": 0.02, "micro_batch": 32, "hidden": 32},
            {"lr": 0.01, "micro_batch": 32, "hidden": 32},
            {"lr": 0.03, "micro_batch": 32, "hidden": 32},
            {"lr": 0.0001, "micro_batch": 32, "hidden": 32},
        ],
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def drive(until: Any, timeout: float = 60.0) -> Any:
    """A fresh in-process loop on the home's store (what a restarted daemon builds), stepped
    until `until(wiring)` holds."""
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load()
    w.loop.drive_sweeps = True
    end = time.monotonic() + timeout
    while not until(w):
        assert time.monotonic() < end, "the sweep did not get there in time"
        w.loop.step()
        time.sleep(0.05)
    return w


@pytest.mark.slow
def test_a_sweep_runs_real_trials_prunes_one_and_continues_after_a_restart(home, tmp_path):
    """`nightshift sweep` records the sweep and returns; loops drive it: trials are jobs that
    really train, the far too small learning rate is pruned as early_stopped, a loop dropped midway
    and one built anew finish it without a trial twice (including a trial asked but never
    queued when the first loop died), and the report names the best trial and writes a plot."""
    from nightshift.runtime.store.db import Attempt, Job, Sweep

    spec = sweep_spec(tmp_path)
    r = nightshift("sweep", str(spec), "--name", "t1", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert "sweep t1" in r.stdout

    def trials_queued(n: int) -> Any:
        def check(w: Any) -> bool:
            with w.store.session() as s:
                return len(list(s.exec(select(Job.id).where(Job.group == "t1")))) >= n

        return check

    w1 = drive(trials_queued(2))
    # The first loop dies here. Its driver had asked for one more trial and recorded its
    # parameters, but not yet submitted it (a kill between the two).
    with w1.store.session() as s:
        row = s.exec(select(Sweep)).one()
    study = load_study(row)
    trial = study.ask()
    trial.set_user_attr("params", {**row.spec["parameters"], "lr": 0.02, "micro_batch": 32})
    del w1

    def finished(w: Any) -> bool:
        with w.store.session() as s:
            return s.exec(select(Sweep)).one().state != "running"

    w2 = drive(finished, timeout=90)
    with w2.store.session() as s:
        row = s.exec(select(Sweep)).one()
        jobs = list(s.exec(select(Job).where(Job.group == "t1").order_by(Job.id)))
        attempts = {a.job_id: a for a in s.exec(select(Attempt))}
    assert row.state == "done" and "5 of 5 trials" in (row.reason or "")
    assert sorted(j.submitted_by_call for j in jobs) == [call_key(row.id, n) for n in range(5)]
    study = load_study(row)
    states = {t.number: t.state.name for t in study.trials}
    assert len(study.trials) == 5 and "FAIL" not in states.values(), states
    pruned = [j for j in jobs if "median pruner" in (j.reason or "")]
    assert 0.0001 in [j.params["lr"] for j in pruned]  # the fixed bad trial; TPE's may be too
    for j in pruned:  # stopped as early_stopped: a success for the sweep
        assert j.state == "succeeded" and attempts[j.id].outcome == "early_stopped"
    assert list(states.values()).count("PRUNED") == len(pruned)
    assert row.result and row.result["best_params"]["lr"] in (0.01, 0.02, 0.03)
    events = list(w2.audit.events())
    assert {"sweep.trial", "sweep.pruned", "sweep.told", "sweep.end"} <= {e.action for e in events}
    started = [e for e in events if e.action == "skill.start" and e.skill == "start_sweep"]
    assert len(started) == 1  # the sweep began as a call through the gate, audited as one

    md = tmp_path / "sweep.md"
    r = nightshift("report", "--sweep", "t1", "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert f"best: trial {row.result['best_trial']}" in text and f"{len(pruned)} pruned" in text
    assert "an estimate" in text and md.with_suffix(".png").stat().st_size > 10_000
    db = home / "nightshift-optuna.db"
    assert sqlite3.connect(db).execute("select count(*) from trials").fetchone() == (5,)


def test_a_range_test_suggestion_becomes_the_learning_rate_prior():
    """tune_lr's suggested lr narrows the lr dimension to a decade either side (within its
    bounds) and is the first trial; a suggestion outside the bounds is refused."""
    from nightshift.runtime.scheduling.sweeps import seed_lr_prior

    spec = spec_of(sweep={"trials": 3}, knobs={"learning_rate": "lr"})
    seeded = seed_lr_prior(spec, 0.05)
    lr = (seeded.search or {})["lr"]
    assert (lr.low, lr.high) == pytest.approx((0.005, 0.5))
    assert seeded.sweep is not None and seeded.sweep.enqueue == [{"lr": 0.05}]
    with pytest.raises(BadArguments, match="outside search.lr"):
        seed_lr_prior(spec, 50.0)
    with pytest.raises(BadArguments, match="knobs.learning_rate"):
        seed_lr_prior(spec_of(sweep={"trials": 3}), 0.05)


def test_a_sweep_that_cannot_be_driven_fails_alone_and_the_loop_goes_on(home, tmp_path):
    """A sweep whose study is gone ends failed with the reason; the other sweep is driven on
    (its first trials queued) and the loop's step raises nothing."""
    from nightshift.runtime.store.db import Job, Sweep

    spec = sweep_spec(tmp_path)
    for name in ("broken", "fine"):
        r = nightshift("sweep", str(spec), "--name", name)
        assert r.returncode == 0, r.stderr
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load()
    with w.store.session() as s:
        row = s.exec(select(Sweep).where(Sweep.name == "broken")).one()
        row.study = "deleted-by-hand"
        s.add(row)
    w.loop.drive_sweeps = True
    w.loop.step()
    assert w.loop.fault is None
    with w.store.session() as s:
        rows = {r.name: r for r in s.exec(select(Sweep))}
        fine_jobs = list(s.exec(select(Job.id).where(Job.group == "fine")))
    assert rows["broken"].state == "failed" and "could not be driven" in (
        rows["broken"].reason or ""
    )
    assert rows["fine"].state == "running" and len(fine_jobs) >= 1


@pytest.mark.slow
def test_a_stopped_sweep_queues_no_more_and_ends_when_its_trial_does(home, tmp_path):
    """`nightshift sweep-stop` while the first trial trains: no second trial is ever queued, the
    running one finishes and is told, and the sweep ends done, saying who stopped it."""
    from nightshift.runtime.store.db import Job, Sweep

    r = nightshift("sweep", str(sweep_spec(tmp_path)), "--name", "halt")
    assert r.returncode == 0, r.stderr

    def trial_running(w: Any) -> bool:
        with w.store.session() as s:
            return s.exec(select(Job).where(Job.group == "halt", Job.state == "running")).first()

    drive(trial_running)
    r = nightshift("sweep-stop", "halt", "--reason", "enough", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"sweep": "halt", "before": "running", "after": "stopping"}

    def ended(w: Any) -> bool:
        with w.store.session() as s:
            return s.exec(select(Sweep)).one().state != "running"

    w = drive(ended, timeout=60)
    with w.store.session() as s:
        row = s.exec(select(Sweep)).one()
        jobs = list(s.exec(select(Job).where(Job.group == "halt")))
    assert (
        row.state == "done"
        and row.reason == f"budget spent: stopped by {getpass.getuser()}: enough"
    )
    assert len(jobs) == 1 and jobs[0].state == "succeeded"
    assert row.result and row.result["best_job_id"] == jobs[0].id
    again = nightshift("sweep-stop", "halt")
    assert again.returncode == 0 and "already ended (done)" in again.stdout
