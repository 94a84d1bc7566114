"""Metric sources: regexes over a log, JSONL, and the files the real libraries write (Lightning's
CSVLogger, torch's TensorBoard SummaryWriter, transformers' TrainerState), read incrementally with a
cursor that survives a JSON round trip (a daemon restart) and never yields a point twice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.training import metric_sources as ms

from conftest import need

NANOGPT = MetricSpec(
    source="log",
    regex=[
        r"iter (?P<step>\d+): loss (?P<loss>[^,\s]+), time",
        r"step (?P<step>\d+): train loss (?P<train_loss>[^,\s]+), val loss (?P<val_loss>[^,\s]+)",
    ],
)


def read(spec: MetricSpec, tmp: Path, cursor: dict, log: Path | None = None) -> ms.Read:
    return ms.read_new(
        spec,
        log_path=log or tmp / "attempt-1.log",
        metrics_file=tmp / "m.jsonl",
        search_roots=[tmp],
        cursor=json.loads(json.dumps(cursor)),
    )


def start(spec: MetricSpec, tmp: Path, min_step: int = 0) -> dict:
    return ms.start_cursor(
        spec,
        log_path=tmp / "attempt-1.log",
        metrics_file=tmp / "m.jsonl",
        search_roots=[tmp],
        min_step=min_step,
    )


def test_log_regexes_two_patterns_nan_inf_and_half_lines(tmp_path):
    log = tmp_path / "attempt-1.log"
    cur = start(NANOGPT, tmp_path)
    log.write_text(
        "number of parameters: 0.21M\n"
        "step 0: train loss 4.2022, val loss 4.2019\n"
        "iter 0: loss 4.2131, time 12.3ms, mfu -100.00%\n"
        "iter 1: loss nan, time 9.1ms\n"
        "iter 2: loss inf, time 9.0ms\n"
        "iter 3: loss -inf, time 9.0ms\n"
        "iter 4: loss 3.9"
    )  # half a line: not yet
    got = read(NANOGPT, tmp_path, cur)
    assert [(p.step, p.name) for p in got.points] == [
        (0, "train_loss"),
        (0, "val_loss"),
        (0, "loss"),
        (1, "loss"),
        (2, "loss"),
        (3, "loss"),
    ]
    values = [p.value for p in got.points]
    assert math.isnan(values[3]) and values[4] == math.inf and values[5] == -math.inf
    assert got.points[2].where == "attempt-1.log line 3"
    assert got.output_bytes == log.stat().st_size
    with log.open("a") as f:
        f.write("876, time 9.0ms\r\x1b[2Kiter 5: loss 3.8, time 1ms\n")
    again = read(NANOGPT, tmp_path, got.cursor)
    assert [(p.step, p.value) for p in again.points] == [(4, 3.9876), (5, 3.8)]
    assert read(NANOGPT, tmp_path, again.cursor).points == []


def test_value_group_names_the_spec_metric_and_garbage_is_skipped(tmp_path):
    spec = MetricSpec(source="log", name="xent", regex=r"step=(?P<step>\S+) v=(?P<value>\S+)")
    cur = start(spec, tmp_path)
    (tmp_path / "attempt-1.log").write_bytes(
        b"step=1 v=2.5\nstep=x v=1\nstep=2 v=oops\n\xff\xfe\nstep=3 v=1e-3,\n"
    )
    got = read(spec, tmp_path, cur)
    assert [(p.step, p.name, p.value) for p in got.points] == [(1, "xent", 2.5), (3, "xent", 1e-3)]


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_reading_in_pieces_equals_reading_at_once(tmp_path_factory, cuts):
    tmp = tmp_path_factory.mktemp("pieces")
    text = "".join(f"iter {i}: loss {1 / (i + 1):.4f}, time 1ms\n" for i in range(12)).encode()
    log = tmp / "attempt-1.log"
    log.write_bytes(b"")
    cur, points = start(NANOGPT, tmp), []
    for cut in sorted(c % (len(text) + 1) for c in cuts) + [len(text)]:
        log.write_bytes(text[:cut])
        got = read(NANOGPT, tmp, cur)
        points += got.points
        cur = got.cursor
    assert [(p.step, p.value) for p in points] == [(i, round(1 / (i + 1), 4)) for i in range(12)]


def test_jsonl_starts_at_the_end_of_an_earlier_attempt(tmp_path):
    spec = MetricSpec()  # auto, no regex: the JSONL file
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 1, "loss": 2.0}\n')
    cur = start(spec, tmp_path)
    with f.open("a") as out:
        out.write(
            '{"step": 2, "loss": 1.5, "lr": 0.1}\nnot json\n{"step": true, "loss": 1}\n'
            '{"step": 3, "loss": NaN}\n{"step": 4, "lo'
        )
    got = read(spec, tmp_path, cur)
    assert got.cursor["kind"] == "jsonl"
    assert [(p.step, p.name) for p in got.points] == [(2, "loss"), (2, "lr"), (3, "loss")]
    assert math.isnan(got.points[-1].value)


def test_lightning_csv_logger_rewrites_with_a_new_column(tmp_path):
    loggers = need("lightning.pytorch.loggers", "reading the CSV that Lightning writes")
    logger = loggers.CSVLogger(save_dir=str(tmp_path), name="lightning_logs")
    spec = MetricSpec(source="auto", name="train_loss")
    cur = start(spec, tmp_path)
    for step in range(3):
        logger.log_metrics({"train_loss": 1.0 / (step + 1)}, step=step)
    logger.save()
    got = read(spec, tmp_path, cur)
    assert got.cursor["kind"] == "lightning_csv"
    assert [(p.step, p.name) for p in got.points] == [
        (0, "train_loss"),
        (1, "train_loss"),
        (2, "train_loss"),
    ]
    logger.log_metrics({"train_loss": 0.2, "val_loss": float("nan")}, step=3)  # a new column:
    logger.save()  # Lightning rewrites the whole file with the wider header
    again = read(spec, tmp_path, got.cursor)
    assert [(p.step, p.name) for p in again.points] == [(3, "train_loss"), (3, "val_loss")]
    assert math.isnan(again.points[1].value)
    assert "version_0/metrics.csv" in again.points[0].where


def test_tensorboard_events_from_torch_summary_writer(tmp_path):
    need("tensorboard", "reading TensorBoard event files")
    tb = need("torch.utils.tensorboard", "writing TensorBoard event files with torch")
    spec = MetricSpec(source="tensorboard", name="train/loss")
    cur = start(spec, tmp_path)
    writer = tb.SummaryWriter(log_dir=str(tmp_path / "runs" / "a"))
    for step in range(4):
        writer.add_scalar("train/loss", 2.0 - step / 4, step)
    writer.flush()
    got = read(spec, tmp_path, cur)
    assert [(p.step, p.value) for p in got.points] == [(0, 2.0), (1, 1.75), (2, 1.5), (3, 1.25)]
    writer.add_scalar("train/loss", float("inf"), 4)
    writer.add_scalar("train/grad_norm", float("nan"), 4)
    writer.flush()
    writer.close()
    again = read(spec, tmp_path, got.cursor)
    assert [(p.step, p.name) for p in again.points] == [(4, "train/loss"), (4, "train/grad_norm")]
    assert again.points[0].value == math.inf and math.isnan(again.points[1].value)
    # A record cut short (a write in progress) is left for later, never half read.
    events = next((tmp_path / "runs" / "a").glob("events.out.tfevents.*"))
    whole = events.read_bytes()
    copy = tmp_path / "runs" / "b" / events.name
    copy.parent.mkdir()
    copy.write_bytes(whole[:-7])
    part = read(spec, tmp_path, again.cursor)
    assert [(p.step, p.name) for p in part.points][-2:] == [(3, "train/loss"), (4, "train/loss")]
    copy.write_bytes(whole)  # the last record (grad_norm) completed
    rest = read(spec, tmp_path, part.cursor)
    assert [(p.step, p.name) for p in rest.points] == [(4, "train/grad_norm")]


def test_trainer_state_log_history_past_the_steps_read(tmp_path):
    transformers = need("transformers", "reading the trainer_state.json that transformers writes")
    spec = MetricSpec(source="hf_trainer_state", name="loss")
    old = tmp_path / "out" / "checkpoint-10" / "trainer_state.json"
    old.parent.mkdir(parents=True)
    transformers.TrainerState(
        global_step=10,
        log_history=[{"loss": 3.0, "grad_norm": 1.0, "step": 5}, {"loss": 2.5, "step": 10}],
    ).save_to_json(str(old))
    cur = start(spec, tmp_path, min_step=10)
    assert read(spec, tmp_path, cur).points == []  # an earlier attempt's file, unchanged
    new = tmp_path / "out" / "checkpoint-20" / "trainer_state.json"
    new.parent.mkdir()
    transformers.TrainerState(
        global_step=20,
        log_history=[
            {"loss": 3.0, "step": 5},
            {"loss": 2.5, "step": 10},
            {"loss": 2.0, "grad_norm": float("nan"), "step": 15},
            {"eval_loss": 2.1, "step": 20},
            {"loss": 1.9, "step": 20},
        ],
    ).save_to_json(str(new))
    got = read(spec, tmp_path, cur)
    assert [(p.step, p.name) for p in got.points] == [
        (15, "grad_norm"),
        (15, "loss"),
        (20, "eval_loss"),
        (20, "loss"),
    ]  # keys sorted
    assert read(spec, tmp_path, got.cursor).points == []


def test_auto_waits_for_a_file_this_attempt_writes(tmp_path):
    spec = MetricSpec(name="train_loss")
    csv = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("epoch,step,train_loss\n0,0,1.0\n")
    cur = start(spec, tmp_path)
    got = read(spec, tmp_path, cur)
    assert got.cursor["kind"] is None and got.points == []
    (tmp_path / "lightning_logs" / "version_1").mkdir()
    (tmp_path / "lightning_logs" / "version_1" / "metrics.csv").write_text(
        "epoch,step,train_loss\n0,5,0.5\n"
    )
    again = read(spec, tmp_path, got.cursor)
    assert again.cursor["kind"] == "lightning_csv"
    assert [(p.step, p.value) for p in again.points] == [(5, 0.5)]


def test_a_symlinked_folder_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "lightning_logs").mkdir(parents=True)
    (outside / "lightning_logs" / "metrics.csv").write_text("step,train_loss\n1,1.0\n")
    job = tmp_path / "job"
    job.mkdir()
    (job / "link").symlink_to(outside)
    spec = MetricSpec(source="lightning_csv", name="train_loss")
    cur = ms.start_cursor(
        spec, log_path=job / "a.log", metrics_file=job / "m.jsonl", search_roots=[job]
    )
    got = ms.read_new(
        spec, log_path=job / "a.log", metrics_file=job / "m.jsonl", search_roots=[job], cursor=cur
    )
    assert got.points == []


@pytest.mark.parametrize(
    "text", ["", "\n\n", "iter : loss 1, time", "iter 9999999999999999999999: loss 1, time 2"]
)
def test_odd_lines_never_raise(tmp_path, text):
    cur = start(NANOGPT, tmp_path)
    (tmp_path / "attempt-1.log").write_text(text)
    got = read(NANOGPT, tmp_path, cur)
    assert all(isinstance(p.step, int) for p in got.points)
