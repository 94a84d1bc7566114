"""Poison-proof input: a spec, goal or API mapping that would hang, blow up memory or crash the
loop later is refused at submit with a SpecError naming the field, and the store is untouched;
a stored job that no longer validates fails alone, never the loop."""

from __future__ import annotations

import math
import sqlite3
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from sqlmodel import select

from nightshift.agent.brain.goals import load_goal
from nightshift.agent.doors.api import Client
from nightshift.evals.fuzz_inputs import param_dicts, spec_dicts, texts
from nightshift.runtime.errors import BadArguments, NightshiftError, SpecError
from nightshift.runtime.scheduling.snapshot import load_snapshot
from nightshift.runtime.spec import ExperimentSpec, load_spec, stored_spec
from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_STRING

from conftest import REPO

GOOD = {"name": "p", "command": ["{python}", "-c", "pass", "{lr}"], "parameters": {"lr": 0.1}}


def spec_file(tmp_path: Path, text: str | bytes, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def counts(home: Path) -> tuple[int, int]:
    """Jobs, and audit events about jobs: what a rejected submit must not change."""
    db = home / "nightshift.db"
    if not db.exists():
        return (0, 0)
    con = sqlite3.connect(db)
    try:
        return (
            con.execute("select count(*) from job").fetchone()[0],
            con.execute("select count(*) from auditevent where action like 'job.%'").fetchone()[0],
        )
    finally:
        con.close()


@pytest.fixture
def client(home):
    c = Client()
    c.submit(spec=GOOD)  # something already stored, which a rejection must leave alone
    return c


# Files ------------------------------------------------------------------------------------------

BAD_FILES = {
    "inf duration": "name: p\ncommand: [x]\nresources: {expected_duration_min: .inf}\n",
    "inf host memory": "name: p\ncommand: [x]\nresources: {host_memory_gb: .inf}\n",
    "inf power": "name: p\ncommand: [x]\nresources: {power_w: .inf}\n",
    "huge stall": "name: p\ncommand: [x]\nstall_min: 1e300\n",
    "nan parameter": "name: p\ncommand: [x, '{lr}']\nparameters: {lr: .nan}\n",
    "negative gpus": "name: p\ncommand: [x]\nresources: {gpus: -1}\n",
    "huge priority": "name: p\ncommand: [x]\npriority: 1000000000000000000000000000000\n",
    "unknown resume placeholder": (
        "name: p\ncommand: [x]\ncheckpoint: {dir: c, resume_arg: ['--resume', '{nope}']}\n"
    ),
    "unbalanced brace": "name: p\ncommand: [x, 'a{b']\n",
    "format spec": "name: p\ncommand: [x, '{lr:.3f}']\nparameters: {lr: 1}\n",
    "self dependency": "name: p\ncommand: [x]\ndepends_on: [p]\n",
    "alias": "name: p\nparameters: &a {x: 1}\nsearch_space: *a\ncommand: [x]\n",
    "relative escape": "name: p\ncommand: [x]\ncheckpoint: {dir: ../../../etc/ck}\n",
    "metrics escape": "name: p\ncommand: [x]\nmetrics: {file: ../../m.jsonl}\n",
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_spec_files_are_refused_with_the_field(tmp_path, case):
    """Each of the issue's poison values is a SpecError at load, never a crash later."""
    with pytest.raises(SpecError) as err:
        load_spec(spec_file(tmp_path, BAD_FILES[case]))
    assert "s.yaml" in str(err.value)


def test_alias_bomb_is_refused_fast(tmp_path):
    """The billion-laughs file took 5.6 GB; now it is refused at its first alias."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    p = spec_file(tmp_path, "\n".join(lines) + "\nname: p\ncommand: [x]\n")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="aliases"):
        load_spec(p)
    assert time.monotonic() - t0 < 2


def test_oversized_binary_deep_and_long_files(tmp_path):
    """Size, encoding, nesting and string length are bounded, each with its own message."""
    big = spec_file(tmp_path, "name: p\ncommand: [x]\n#" + "x" * MAX_FILE_BYTES, "big.yaml")
    with pytest.raises(SpecError, match="larger than"):
        load_spec(big)
    binary = spec_file(tmp_path, b"name: p\ncommand: [x]\n\xff\xfe\x00", "bin.yaml")
    with pytest.raises(SpecError, match=r"not UTF-8 text \(byte 21"):
        load_spec(binary)
    deep = spec_file(
        tmp_path, "name: p\ncommand: [x]\nparameters: {a: " + "[" * 1000 + "]" * 1000 + "}\n"
    )
    with pytest.raises(SpecError, match=f"deeper than {MAX_DEPTH}"):
        load_spec(deep)
    long = spec_file(tmp_path, f"name: p\ncommand: [x, {'y' * (MAX_STRING + 1)}]\n", "l.yaml")
    with pytest.raises(SpecError, match="longer than"):
        load_spec(long)


def test_literal_brace_is_written_doubled():
    """`{{` is a literal brace in the command, as in resume_arg (str.format's rule)."""
    spec = ExperimentSpec(name="p", command=["x", '{{"lr": {lr}}}'], parameters={"lr": 0.5})
    assert spec.render({"lr": 0.5}, {}) == ["x", '{"lr": 0.5}']


def test_goal_file_bounds(tmp_path):
    """Goal files go through the same loader and numbers are finite and in range."""
    spec_file(tmp_path, "name: p\ncommand: [x]\n")
    for text in (
        "name: g\ngoal: train\nspec: s.yaml\npriority: 1000000000000\n",
        "name: g\ngoal: train\nspec: s.yaml\nparams: {lr: .inf}\n",
        "name: g\ngoal: recover\njob_id: -3\n",
        "name: g\ngoal: train\nspec: &s s.yaml\nparams: {x: *s}\n",
        'name: g\ngoal: train\nspec: "a\\0b"\n',
    ):
        with pytest.raises(SpecError):
            load_goal(spec_file(tmp_path, text, "g.yaml"))


# Through the API: nothing stored on a refusal -----------------------------------------------------


def nested(n: int) -> list:
    out: list = []
    for _ in range(n):
        out = [out]
    return out


API_BAD = [
    {**GOOD, "command": ["x", "{unfilled}"]},
    {**GOOD, "priority": 10**30},
    {**GOOD, "parameters": {"lr": math.nan}},
    {**GOOD, "parameters": {"lr": math.inf}},
    {**GOOD, "resources": {"expected_duration_min": math.inf}},
    {**GOOD, "command": ["x", "a{b"]},
    {**GOOD, "depends_on": ["p"]},
    {**GOOD, "parameters": {"lr": 0.1, "deep": nested(200)}},
    {**GOOD, "command": ["x", "y" * (MAX_STRING + 1)]},
]


@pytest.mark.parametrize("i", range(len(API_BAD)))
def test_api_refusals_store_nothing(client, home, i):
    """A mapping through the real Client is refused as BadArguments; no job, no job event."""
    before = counts(home)
    with pytest.raises(BadArguments):
        client.submit(spec=API_BAD[i])
    assert counts(home) == before


def test_api_params_and_priority_overrides_are_checked(client, home):
    before = counts(home)
    for kwargs in ({"params": {"lr": math.inf}}, {"priority": 10**30}):
        with pytest.raises(BadArguments):
            client.submit(spec=GOOD, **kwargs)
    assert counts(home) == before


def test_dependency_cycle_across_jobs_is_refused(client, home):
    """a waits for b; b waiting for a would leave both queued forever."""
    client.submit(spec={**GOOD, "name": "a", "depends_on": ["b"]})
    before = counts(home)
    with pytest.raises(BadArguments, match="cycle"):
        client.submit(spec={**GOOD, "name": "b", "depends_on": ["a"]})
    with pytest.raises(BadArguments, match="cycle"):
        client.submit_many(
            [
                {"spec": {**GOOD, "name": "c", "depends_on": ["d"]}},
                {"spec": {**GOOD, "name": "d", "depends_on": ["c"]}},
            ]
        )
    assert counts(home) == before


# Stored jobs: re-validated, failed alone ----------------------------------------------------------


def test_poisoned_stored_job_fails_alone(home):
    """A stored spec with inf in it (an older version, a hand edit) fails its job with the
    reason; the snapshot loads, and the good job is still placed."""
    store = Store(f"sqlite:///{home}/nightshift.db")
    good = ExperimentSpec.model_validate(GOOD).model_dump(mode="json")
    bad = {**good, "resources": {**good["resources"], "expected_duration_min": "soon"}}
    now = datetime(2026, 1, 1)
    with store.session() as s:
        s.add(Job(name="good", spec=good, params={"lr": 0.1}, created_at=now, updated_at=now))
        s.add(Job(name="bad", spec=bad, params={}, created_at=now, updated_at=now))
    snap = load_snapshot(store, now)
    assert [p.name for p in snap.pending] == ["good"]
    with store.session() as s:
        failed = s.exec(select(Job).where(Job.name == "bad")).one()
    assert failed.state == "failed"
    assert "resources.expected_duration_min" in (failed.reason or "")
    with pytest.raises(SpecError, match="expected_duration_min"):
        stored_spec(bad, {})
    with pytest.raises(SpecError, match="command"):
        stored_spec({**good, "command": ["x", "{gone}"]}, {})
    assert stored_spec(good, {"lr": 0.1}).name == "p"


def test_a_stored_spec_that_is_not_json_fails_its_job_alone(home):
    """A spec text a hand edit broke (not JSON at all): the queued job fails with the reason, a
    running one is left out of the snapshot (its fields cannot be read), and the good job is
    placed; one scan of the table tells them apart."""
    store = Store(f"sqlite:///{home}/nightshift.db")
    good = ExperimentSpec.model_validate(GOOD).model_dump(mode="json")
    now = datetime(2026, 1, 1)
    with store.session() as s:
        for name, state in (
            ("good", "queued"),
            ("edited", "queued"),
            ("edited-running", "running"),
        ):
            s.add(Job(name=name, spec=good, params={}, state=state, created_at=now, updated_at=now))
    db = sqlite3.connect(f"{home}/nightshift.db")
    with db:
        db.execute("UPDATE job SET spec = '{\"resources\": ' WHERE name LIKE 'edited%'")
    db.close()
    snap = load_snapshot(store, now)
    assert [p.name for p in snap.pending] == ["good"]
    assert snap.running == []
    with store.session() as s:
        states = {n: (st, why) for n, st, why in s.exec(select(Job.name, Job.state, Job.reason))}
    assert states["edited"][0] == "failed"
    assert "stored spec is not valid JSON" in (states["edited"][1] or "")
    assert states["edited-running"][0] == "running"


def test_parameters_and_a_finished_spec_broken_by_hand_do_not_stop_the_load(home):
    """Parameters of a queued job a hand edit broke read as the ORM reads them, and a finished
    job's spec a hand edit broke gives its run no estimate: every load (so every tick) raised on
    either before, the second as "the store is damaged"."""
    store = Store(f"sqlite:///{home}/nightshift.db")
    good = ExperimentSpec.model_validate(GOOD).model_dump(mode="json")
    now = datetime(2026, 1, 1)
    with store.session() as s:
        for name, state in (("good", "queued"), ("params", "queued"), ("done", "succeeded")):
            s.add(Job(name=name, spec=good, params={}, state=state, created_at=now, updated_at=now))
        s.flush()
        done = s.exec(select(Job).where(Job.name == "done")).one()
        s.add(
            Attempt(
                job_id=done.id,
                number=1,
                state="exited",
                started_at=now - timedelta(hours=2),
                ended_at=now - timedelta(hours=1),
            )
        )
    db = sqlite3.connect(f"{home}/nightshift.db")
    with db:
        db.execute("UPDATE job SET params = '{\"lr\": ' WHERE name = 'params'")
        db.execute("UPDATE job SET spec = '{\"resources\": ' WHERE name = 'done'")
    db.close()
    snap = load_snapshot(store, now)
    assert sorted(p.name for p in snap.pending) == ["good", "params"]


# Fuzzing --------------------------------------------------------------------------------------


def _only_spec_errors(fn) -> None:
    try:
        fn()
    except SpecError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts)
def test_fuzz_spec_and_goal_text(tmp_path_factory, text):
    """Any text is a spec or goal, or a SpecError: never another exception, never a hang."""
    d = tmp_path_factory.mktemp("fz")
    p = d / "f.yaml"
    p.write_bytes(text.encode("utf-8", "surrogatepass"))
    _only_spec_errors(lambda: load_spec(p))
    _only_spec_errors(lambda: load_goal(p))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=spec_dicts)
def test_fuzz_spec_yaml_round_trip(tmp_path_factory, data):
    """Structured specs written as YAML (with inf, nan, huge ints): a spec or a SpecError, and
    every accepted spec renders without error and is accepted again when stored."""
    p = tmp_path_factory.mktemp("fz") / "s.yaml"
    try:
        p.write_text(yaml.safe_dump(data))
    except yaml.YAMLError:
        return
    try:
        spec = load_spec(p)
    except SpecError:
        return
    stored = spec.model_dump(mode="json")
    try:
        spec.check_filled(spec.parameters)
    except SpecError:
        return
    stored_spec(stored, spec.parameters)
    spec.render(
        spec.parameters, dict.fromkeys(("python", "checkpoint_dir", "metrics_file", "run_dir"), "v")
    )


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=spec_dicts, params=param_dicts)
def test_fuzz_api_submit_store_invariant(client, home, data, params):
    """Through the real Client: accepted, or a NightshiftError with no job and no job event."""
    before = counts(home)
    try:
        client.submit(spec=data, params=params)
    except NightshiftError:
        assert counts(home) == before
    else:
        assert counts(home)[0] == before[0] + 1


def test_examples_still_load():
    """The shipped specs pass the stricter checks."""
    for p in sorted((REPO / "examples/specs").glob("*.yaml")):
        load_spec(p)
