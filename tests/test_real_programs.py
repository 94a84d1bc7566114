"""nightshift watching and recovering real training programs that tell it nothing, run by the real
CLI (`nightshift run`) and killed with real signals: the plain PyTorch loop in nanoGPT's shape
(examples/programs/train_torch_plain.py: `iter N: loss X` lines, one ckpt.pt overwritten), a
Lightning program (CSV metrics and checkpoints under lightning_logs/version_N/) and a Hugging Face
Trainer program (TensorBoard events, checkpoint-N/ folders). The figures the tests measure are
printed (pytest -s shows them)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import REPO, need, store_row

pytestmark = [pytest.mark.slow, pytest.mark.service]

SPECS = REPO / "examples" / "specs"
SPEC = SPECS / "programs_torch_plain.yaml"


@pytest.fixture(scope="module", autouse=True)
def torch():
    return need("torch", "the example programs train with torch")


def spec_file(tmp_path: Path, template: Path = SPEC, **params) -> Path:
    spec = yaml.safe_load(template.read_text())
    spec["code"]["path"] = str(REPO / "examples" / "programs")
    for key in params:
        if key not in spec["parameters"]:
            spec["command"].append(f"--{key}={{{key}}}")
    spec["parameters"].update(params)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(tmp_path: Path, spec: Path) -> subprocess.Popen:
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"name": "real", "goal": "train", "spec": str(spec)}))
    return subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def row(db: Path, query: str, timeout: float = 120.0, proc: subprocess.Popen | None = None):
    return store_row(db, query, timeout, proc)


def training_process(db: Path, number: int) -> psutil.Process:
    (handle,) = row(db, f"select handle from attempt where number={number} and state='running'")
    supervisor = psutil.Process(json.loads(handle)["pid"])
    end = time.monotonic() + 30
    while not supervisor.children() and time.monotonic() < end:
        time.sleep(0.05)
    return supervisor.children()[0]


def kill_once_and_finish(
    db: Path, proc: subprocess.Popen, after_step: int, target: str = "process"
) -> tuple[int, int, float]:
    """SIGKILL attempt 1's training process (or its whole process group, supervisor included)
    once it passed after_step; wait for attempt 2 to train. (step at the kill, step resumed at,
    seconds to training again.)"""
    row(db, f"select 1 from attempt where number=1 and last_step >= {after_step}", proc=proc)
    (at,) = row(db, "select last_step from attempt where number=1")
    child = training_process(db, 1)
    if target == "process":
        child.send_signal(signal.SIGKILL)
    else:
        os.killpg(os.getpgid(child.pid), signal.SIGKILL)
    killed = time.monotonic()
    (resumed,) = row(
        db, "select start_step from attempt where number=2 and last_step is not null", proc=proc
    )
    return at, resumed, time.monotonic() - killed


def attempts(db: Path) -> list[tuple]:
    return (
        sqlite3.connect(db)
        .execute(
            "select number, outcome, start_step, last_step, cause, params, evidence, first_bad_step "
            "from attempt order by number"
        )
        .fetchall()
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def test_kill_training_process_then_the_group_resumes_twice_and_finishes(home, tmp_path):
    db = home / "nightshift.db"
    proc = start(tmp_path, spec_file(tmp_path, max_iters=240, eval_interval=40, sleep_ms=15))
    figures = []
    for number, target in ((1, "process"), (2, "group")):
        (first,) = row(
            db,
            f"select start_step from attempt where number={number} and state='running'",
            proc=proc,
        )
        row(
            db,
            f"select 1 from attempt where number={number} and last_step >= {first + 60}",
            proc=proc,
        )
        child = training_process(db, number)
        (at,) = row(db, f"select last_step from attempt where number={number}")
        killed = time.monotonic()
        if target == "process":
            child.send_signal(signal.SIGKILL)
        else:
            os.killpg(os.getpgid(child.pid), signal.SIGKILL)
        (start_step,) = row(
            db,
            f"select start_step from attempt where number={number + 1} and last_step is not null",
            proc=proc,
        )
        figures.append((target, at, start_step, time.monotonic() - killed))
    out = finish(proc)
    assert proc.returncode == 0, out
    rows = attempts(db)
    assert [r[1] for r in rows] == ["failed", "lost", "succeeded"], rows
    assert rows[0][4] == "killed" and rows[1][4] == "lost"
    assert rows[-1][3] == 240
    for target, at, resumed, seconds in figures:
        print(
            f"\n[torch_plain] SIGKILL of the {target} at ~step {at}: resumed at {resumed} "
            f"({at - resumed} steps lost), training again {seconds:.1f} s after the kill"
        )
        assert 0 <= at - resumed <= 40 + 5  # at most one checkpoint interval (and a tick)
    show = subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "show", "1", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    shown = json.loads(show.stdout)
    assert [a["cause"] for a in shown["attempts"]] == ["killed", "lost", None]


def test_divergence_is_stopped_rolled_back_to_the_kept_copy_with_a_lower_lr(home, tmp_path):
    """lr 2.0 with a long warm-up: fine at first, then the loss explodes and goes nan while the
    program goes on overwriting ckpt.pt. nightshift stops it, resumes from its own copy of the last
    good ckpt.pt with a lower lr, and the run ends with a finite loss."""
    db = home / "nightshift.db"
    proc = start(
        tmp_path,
        spec_file(
            tmp_path,
            learning_rate=2.0,
            warmup_iters=150,
            max_iters=200,
            eval_interval=20,
            sleep_ms=15,
        ),
    )
    out = finish(proc, timeout=300)
    assert proc.returncode == 0, out
    rows = attempts(db)
    first, last = rows[0], rows[-1]
    assert first[1] == "diverged" and first[4] == "nan_loss", rows
    bad = first[7]
    print(
        f"\n[torch_plain] diverged: first bad step {bad}, stopped at step {first[3]} "
        f"({first[3] - bad} steps later); resumed at {rows[1][2]} with "
        f"lr {json.loads(rows[1][5])['learning_rate']}"
    )
    assert first[3] - bad <= 40
    assert rows[1][2] < bad and json.loads(rows[1][5])["learning_rate"] < 2.0
    # ckpt.pt was overwritten after the first bad step (every 20 iters): only the copy was good
    restored = (
        sqlite3.connect(db)
        .execute("select payload from auditevent where action='checkpoint.restored'")
        .fetchall()
    )
    assert first[3] // 20 * 20 > bad - 2 and restored, rows
    assert last[1] == "succeeded" and last[3] == 200
    (loss,) = (
        sqlite3.connect(db)
        .execute("select value from metricpoint where name='loss' order by id desc limit 1")
        .fetchone()
    )
    assert loss is not None and loss < 10


def test_a_steady_printer_is_not_stalled_and_a_hang_is(home, tmp_path):
    """stall_min is 1 minute in the spec; here 0.1 (6 s): a run printing every 15 ms for longer
    than that is never stalled; the same run hanging at iteration 60 is."""
    db = home / "nightshift.db"
    spec = spec_file(tmp_path, max_iters=600, eval_interval=100, sleep_ms=15, hang_at=300)
    data = yaml.safe_load(spec.read_text())
    data["stall_min"] = 0.1
    data["retries"] = 0
    spec.write_text(yaml.safe_dump(data))
    proc = start(tmp_path, spec)
    out = finish(proc, timeout=200)
    rows = attempts(db)
    assert rows[0][1] == "stalled", (rows, out)
    assert rows[0][3] >= 290  # printed for well over 6 s before the hang, never stalled


FRAMEWORKS = {
    # Lightning writes checkpoints and metrics.csv under lightning_logs/version_N/ of the root it
    # is given; the resumed run is the next version_N, read too. CSVLogger flushes every 25 steps.
    "lightning": {
        "modules": ("lightning",),
        "spec": "programs_lightning.yaml",
        "run": {"max_steps": 200, "every_n_train_steps": 40, "sleep_ms": 20},
        "final": 195,
        "diverge": {"lr": 50.0, "max_steps": 300, "sleep_ms": 20},
        "bad_metric": "grad_norm",
        "seen_within": 25 + 5,
    },
    # Trainer's checkpoint-N/ folders right below output_dir (trainer_state.json written last);
    # the resumed run's TensorBoard events are in a new runs/ folder, read too. With lr 1e5 its
    # train/loss reads 0.0 (logging_nan_inf_filter) while train/grad_norm is nan.
    "hf": {
        "modules": ("transformers", "tensorboard"),
        "spec": "programs_hf.yaml",
        "run": {"max_steps": 160, "save_steps": 40, "sleep_ms": 30},
        "final": 160,
        "diverge": {"lr": 1e5, "max_steps": 300, "save_steps": 20, "sleep_ms": 30},
        "bad_metric": "train/grad_norm",
        "seen_within": 5,
    },
}


def framework(program: str) -> dict:
    f = FRAMEWORKS[program]
    for module in f["modules"]:
        need(module, f"the {program} example program uses {module}")
    return f


# Each framework once and each kill once (both kills of one program are tested above, on the
# example): the full four-way matrix added 40 s to the suite and no case of its own.
@pytest.mark.parametrize(("program", "target"), [("lightning", "process"), ("hf", "group")])
def test_framework_program_killed_resumes_from_its_newest_checkpoint(
    program, target, home, tmp_path
):
    """Killed mid-run (the training process: `killed`; its whole group, supervisor too: `lost`),
    the program resumes from the newest whole checkpoint its framework wrote, at the step the
    checkpoint holds (global_step), loses at most one interval, and finishes."""
    f = framework(program)
    db = home / "nightshift.db"
    proc = start(tmp_path, spec_file(tmp_path, SPECS / f["spec"], **f["run"]))
    at, resumed, seconds = kill_once_and_finish(db, proc, after_step=90, target=target)
    out = finish(proc)
    assert proc.returncode == 0, out
    rows = attempts(db)
    print(
        f"\n[{program}] SIGKILL of the {target} at ~step {at}: resumed at {resumed} "
        f"({at - resumed} steps lost), training again {seconds:.1f} s after the kill"
    )
    want = ("failed", "killed") if target == "process" else ("lost", "lost")
    assert [r[1] for r in rows] == [want[0], "succeeded"] and rows[0][4] == want[1], rows
    assert resumed % 40 == 0 and 0 <= at - resumed <= 40 + 10
    assert rows[1][3] >= f["final"]  # the resumed run's metrics were read to the end


@pytest.mark.parametrize("program", list(FRAMEWORKS))
def test_framework_program_divergence_is_caught_and_stopped(program, home, tmp_path):
    """A learning rate that makes the loss non-finite at once: the program would train on and exit
    0; nightshift reads the framework's own metric files, stops it within the framework's flush
    interval of the first non-finite value, and diagnoses nan_loss."""
    f = framework(program)
    db = home / "nightshift.db"
    spec = spec_file(tmp_path, SPECS / f["spec"], **f["diverge"])
    data = yaml.safe_load(spec.read_text())
    data["retries"] = 0
    spec.write_text(yaml.safe_dump(data))
    out = finish(start(tmp_path, spec))
    first = attempts(db)[0]
    print(
        f"\n[{program}] {f['bad_metric']} non-finite first at step {first[7]}, stopped at step "
        f"{first[3]} of 300"
    )
    assert first[1] == "diverged" and first[4] == "nan_loss", (first, out)
    assert f["bad_metric"] in first[6] and first[3] - first[7] <= f["seen_within"], first
