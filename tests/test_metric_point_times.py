"""Each metric point keeps its own time (issue 30, the MLflow mirror's timestamps): the source's
wall time where it has one — a TensorBoard event's `wall_time`, a JSONL line's `time` or
`timestamp` — else the moment the loop read it; a `time` that is a duration stays a metric."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import yaml

from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.training import metric_sources as ms

from conftest import need, nightshift

JSONL = MetricSpec(source="jsonl", name="loss")


def _read(spec: MetricSpec, tmp: Path, write) -> ms.Read:
    cursor = ms.start_cursor(
        spec, log_path=tmp / "attempt-1.log", metrics_file=tmp / "m.jsonl", search_roots=[tmp]
    )
    write()
    return ms.read_new(
        spec,
        log_path=tmp / "attempt-1.log",
        metrics_file=tmp / "m.jsonl",
        search_roots=[tmp],
        cursor=cursor,
    )


def test_a_jsonl_lines_time_is_its_points_time_not_a_metric(tmp_path):
    """Seconds (`time.time()`), milliseconds (`Date.now()`) and ISO 8601 text are moments: the
    line's points carry them and no metric `time` is made; `"time": 0.25` (a step's duration) is
    a metric as before, and its points have no time of their own."""
    lines = [
        {"step": 1, "loss": 0.5, "time": 1_780_000_000.25},
        {"step": 2, "loss": 0.4, "timestamp": 1_780_000_001_500},
        {"step": 3, "loss": 0.3, "time": "2026-06-01T10:00:00+00:00"},
        {"step": 4, "loss": 0.2, "time": 0.25},
    ]
    path = tmp_path / "m.jsonl"
    got = _read(
        JSONL, tmp_path, lambda: path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    )
    assert [(p.step, p.name, p.value, p.wall_time) for p in got.points] == [
        (1, "loss", 0.5, 1_780_000_000.25),
        (2, "loss", 0.4, 1_780_000_001.5),
        (3, "loss", 0.3, datetime(2026, 6, 1, 10, tzinfo=UTC).timestamp()),
        (4, "loss", 0.2, None),
        (4, "time", 0.25, None),
    ]


def test_a_tensorboard_events_wall_time_is_its_points_time(tmp_path):
    """torch's SummaryWriter writes each scalar with a wall time: the point carries it."""
    need("tensorboard", "reading TensorBoard event files")
    tb = need("torch.utils.tensorboard", "writing TensorBoard event files with torch")
    spec = MetricSpec(source="tensorboard", name="train/loss")

    def write() -> None:
        writer = tb.SummaryWriter(log_dir=str(tmp_path / "runs" / "a"))
        writer.add_scalar("train/loss", 2.0, 0, walltime=1_780_000_000.5)
        writer.add_scalar("train/loss", 1.5, 1, walltime=1_780_000_060.0)
        writer.close()

    got = _read(spec, tmp_path, write)
    assert [(p.step, p.wall_time) for p in got.points] == [
        (0, 1_780_000_000.5),
        (1, 1_780_000_060.0),
    ]


PROGRAM = """
import json, sys, time
path, timed = sys.argv[1], sys.argv[2] == "timed"
for step in range(1, 4):
    line = {"step": step, "loss": 1.0 / step}
    if timed:
        line["time"] = 1_780_000_000 + step
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\\n")
    time.sleep(0.4)
"""


def test_the_store_keeps_each_points_time(home, tmp_path):
    """Through `nightshift run`: a program that writes its own `time` gets exactly those times in
    the store; one that writes none gets the times the loop read its points, within the attempt."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    for name in ("timed", "plain"):
        spec = {
            "name": name,
            "code": {"path": str(tmp_path)},
            "command": ["{python}", "prog.py", "{metrics_file}", name],
            "resources": {"gpus": 0},
            "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
            "seed": 1,
            "retries": 0,
        }
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        goal = tmp_path / f"goal-{name}.yaml"
        goal.write_text(
            yaml.safe_dump({"name": name, "goal": "train", "spec": str(tmp_path / f"{name}.yaml")})
        )
        res = nightshift("run", str(goal), env={"NIGHTSHIFT_GPU__PROBE": "none"})
        assert res.returncode == 0, res.stdout + res.stderr
    db = sqlite3.connect(home / "nightshift.db")
    rows = db.execute(
        "select j.name, p.step, p.name, p.wall_time, a.started_at, a.ended_at from metricpoint p"
        " join job j on j.id = p.job_id join attempt a on a.id = p.attempt_id order by p.id"
    ).fetchall()
    timed = [
        (step, name, datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp())
        for job, step, name, when, _, _ in rows
        if job == "timed"
    ]
    assert timed == [(s, "loss", 1_780_000_000.0 + s) for s in (1, 2, 3)]
    plain = [r for r in rows if r[0] == "plain"]
    assert [r[1] for r in plain] == [1, 2, 3]
    assert all(start <= when <= end for _, _, _, when, start, end in plain)
    assert [r[3] for r in plain] == sorted(r[3] for r in plain)
