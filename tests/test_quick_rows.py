"""The fast answers' second reading of the store (runtime/store/quick_read.py) and of a stored
diagnosis (runtime/training/diagnosis_view.py), held to the ORM's and the model's: the same
columns decoded the same way, the same diagnosis or a refusal that sends the command to the full
path — never a different answer."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, DateTime

from nightshift.runtime.store import quick_read
from nightshift.runtime.store.db import Attempt, Job, JobHold, Store
from nightshift.runtime.training.attempt_diagnosis import Diagnosis
from nightshift.runtime.training.diagnosis_view import DiagnosisView, NotPlain


def _columns(model: Any, kind: type) -> tuple[str, ...]:
    return tuple(
        c.name
        for c in model.__table__.columns
        if isinstance(c.type, kind) or isinstance(getattr(c.type, "impl", None), kind)
    )


def test_the_decoded_columns_are_the_models():
    """Every column the ORM reads as JSON or as a datetime is decoded so here, and no other."""
    for table, model in (("job", Job), ("attempt", Attempt)):
        assert set(quick_read.JSON_COLUMNS[table]) == set(_columns(model, JSON))
        assert set(quick_read.TIME_COLUMNS[table]) == set(_columns(model, DateTime))


def test_a_job_and_its_attempts_read_as_the_orm_reads_them(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    spec = {"name": "j", "command": ["python", "-c", "pass"], "checkpoint": {"dir": "ck"}}
    with store.session() as s:
        job = Job(name="j", spec=spec, params={"lr": 0.001, "nested": {"a": [1, 2]}}, priority=3)
        s.add(job)
        s.flush()
        s.add(JobHold(job_id=job.id, reason="waiting for 2 GPUs"))
        for n in (1, 2):
            s.add(
                Attempt(
                    job_id=job.id,
                    number=n,
                    argv=["python", "-c", "pass", "--resume", f"ck/step-{n}"],
                    params={"lr": 0.001 / n},
                    gpus=[0, n],
                    diagnosis={"category": "crashed", "why": ["ü", None]},
                    last_step=10 * n,
                    last_loss=0.5 / n,
                    last_progress_at=datetime(2026, 12, 5, 1, 2, 3, 456789),
                )
            )
    found = quick_read.job_with_attempts(store.url, 1, 5.0)
    assert found is not None
    job_row, attempt_rows = found
    orm_job, orm_attempts = store.job(1), store.attempts(1)
    # the row and the reason the last tick gave the job, from its own table
    assert vars(job_row) == {**orm_job.model_dump(), "hold_reason": "waiting for 2 GPUs"}
    assert store.hold_reason(1) == "waiting for 2 GPUs"
    assert [vars(a) for a in attempt_rows] == [a.model_dump() for a in orm_attempts]
    assert quick_read.job_with_attempts(store.url, 2, 5.0) == (None, [])


def test_another_schema_or_database_is_left_to_the_full_path(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    with sqlite3.connect(tmp_path / "n.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'older'")
    assert quick_read.job_with_attempts(store.url, 1, 5.0) is None
    assert quick_read.status_rows(store.url, [], 5.0) is None
    assert quick_read.status_rows("postgresql://h/db", [], 5.0) is None


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.lists(st.integers(), max_size=2),
    st.lists(st.dictionaries(st.sampled_from(["source", "text"]), st.text(max_size=3)), max_size=2),
)
KEYS = st.sampled_from(
    [
        "category",
        "confidence",
        "retryable",
        "line_no",
        "evidence",
        "source",
        "summary",
        "action",
        "fix",
        "changes",
        "machine",
        "second_opinion",
        "extra",
    ]
)
PLAIN = st.fixed_dictionaries(
    {
        "category": st.text(max_size=12),
        "confidence": st.sampled_from(["high", "low"]),
        "retryable": st.booleans(),
        "summary": st.text(max_size=90),
        "action": st.just("stop"),
        "fix": st.text(max_size=10),
    },
    optional={
        "line_no": st.one_of(st.none(), st.integers(0, 10**6)),
        "evidence": st.one_of(st.none(), st.text(max_size=90)),
        "source": st.sampled_from([None, "log", "kernel_log", "monitor"]),
        "changes": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        "machine": st.lists(
            st.fixed_dictionaries({"source": st.just("cgroup"), "text": st.text(max_size=9)}),
            max_size=2,
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(PLAIN, st.dictionaries(KEYS, FIELD_VALUES), FIELD_VALUES))
def test_a_stored_diagnosis_reads_as_the_model_or_goes_to_it(raw):
    """A row the view reads, it reads as the model does (the same dump, where and brief); any
    other it refuses, so the command asks the model."""
    try:
        view = DiagnosisView.stored(raw)
    except NotPlain:
        return
    model = Diagnosis.stored(raw)
    if view is None:
        assert model is None and raw is None
        return
    assert model is not None
    assert view.model_dump() == model.model_dump()
    assert (view.where(), view.brief(), view.brief(20)) == (
        model.where(),
        model.brief(),
        model.brief(20),
    )


@settings(max_examples=100, deadline=None)
@given(raw=PLAIN)
def test_what_the_loop_writes_is_read_by_the_view(raw):
    """Every diagnosis the loop writes (the model's dump) is one the view reads itself."""
    assert DiagnosisView.stored(Diagnosis.model_validate(raw).model_dump()) is not None
