"""The example training script as a real process: it learns, checkpoints its whole state
atomically, dies the way injected faults say, and resumes exactly where it left off."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nightshift.examples import train_numpy
from nightshift.runtime.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_numpy.py"


def run(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    name: str = "run",
    steps: int = 300,
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run the example in its own folder; return the process, its checkpoint dir and metrics file."""
    folder = tmp_path / name
    ck, metrics = folder / "checkpoints", folder / "metrics.jsonl"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAULT_")}
    proc = subprocess.run(
        [
            sys.executable,
            str(TRAIN),
            "--steps",
            str(steps),
            "--checkpoint-dir",
            str(ck),
            "--checkpoint-every",
            "25",
            "--metrics-file",
            str(metrics),
            *args,
        ],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, ck, metrics


def records(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def losses(metrics: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(metrics) if "event" not in r}


def test_trains_and_loss_decreases(tmp_path):
    """300 steps learn digits: the loss falls, accuracy is high, and it takes about a second."""
    start = time.monotonic()
    proc, _, metrics = run(tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("nightshift-args: ")
    args = json.loads(first.removeprefix("nightshift-args: "))
    assert args["lr"] == 0.01 and args["micro_batch"] == 32 and args["grad_accum"] == 1
    loss = losses(metrics)
    assert sorted(loss) == list(range(1, 301))
    assert loss[1] > 2.0 and np.mean([loss[s] for s in range(281, 301)]) < 0.3
    done = records(metrics)[-1]
    assert done["event"] == "done" and done["eval_accuracy"] > 0.9
    assert {"lr", "micro_batch", "grad_accum"} <= set(records(metrics)[0])
    assert elapsed < 10


def test_log_every_thins_the_training_loss_lines_only(tmp_path):
    """A sweep's long trials log the loss every N steps (and the last); validation is unchanged."""
    proc, _, metrics = run(tmp_path, "--log-every", "40", "--val-every", "100", steps=250)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in records(metrics) if "lr" in r] == [40, 80, 120, 160, 200, 240, 250]
    assert [r["step"] for r in records(metrics) if "val_loss" in r] == [100, 200, 250]


def test_checkpoints_hold_the_whole_training_state(tmp_path):
    """Each checkpoint has weights, Adam m/v/t, step, loss, data RNG state and args; no temp file is left."""
    proc, ck, metrics = run(tmp_path, steps=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in ck.iterdir()) == [
        "step_00000025.npz",
        "step_00000050.npz",
        "step_00000060.npz",
    ]
    with np.load(ck / "step_00000050.npz", allow_pickle=False) as c:
        for k in ("W1", "b1", "W2", "b2"):
            assert c[f"adam_m_{k}"].shape == c[k].shape == c[f"adam_v_{k}"].shape
            assert np.any(c[f"adam_v_{k}"] > 0)
        assert int(c["step"]) == 50 and int(c["adam_t"]) == 50
        assert float(c["loss"]) == losses(metrics)[50]
        assert json.loads(str(c["rng_state"]))["bit_generator"] == "PCG64"
        assert json.loads(str(c["args"]))["seed"] == 0


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_debris(tmp_path, monkeypatch):
    """Writing goes to a temp file then os.replace: a save that dies midway changes nothing."""
    args = train_numpy.parse_args(["--steps", "1"])
    params = train_numpy.init_params(0, 64)
    opt, stream = train_numpy.Adam(params), train_numpy.BatchStream(100, 0)
    good = train_numpy.save_checkpoint(tmp_path, 25, 0.5, params, opt, stream, args)
    before = good.read_bytes()

    def dies_midway(f, **arrays):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_numpy.np, "savez", dies_midway)
    with pytest.raises(OSError):
        train_numpy.save_checkpoint(tmp_path, 50, 0.4, params, opt, stream, args)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000025.npz"]
    assert good.read_bytes() == before


def test_crash_then_resume_matches_the_uninterrupted_run(tmp_path):
    """A crash at step 140 exits 1; resuming from step 125 continues the same losses and ends bit-identical."""
    whole, whole_ck, whole_m = run(tmp_path, name="whole")
    env = {"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140"}
    crashed, ck, metrics = run(tmp_path, name="crashed", env=env)
    assert whole.returncode == 0 and crashed.returncode == 1
    assert "RuntimeError: injected crash at step 140" in crashed.stderr
    assert crashed.stderr.startswith("Traceback (most recent call last):")
    assert max(losses(metrics)) == 139  # every finished step was logged before the sudden death
    assert max(p.name for p in ck.iterdir()) == "step_00000125.npz"

    resumed, _, _ = run(
        tmp_path, "--resume", str(ck / "step_00000125.npz"), name="crashed", env=env
    )
    assert resumed.returncode == 0, resumed.stderr  # a resumed run does not crash again
    assert "resumed from step 125" in resumed.stdout
    reference, got = losses(whole_m), records(metrics)
    after = [r for r in got if "event" not in r][139:]  # the resumed run's lines
    assert after[0]["step"] == 126
    assert after[0]["loss"] == reference[126]  # the same batch, the same state: the same loss
    assert abs(after[0]["loss"] - reference[125]) < 0.5 * reference[125] + 0.05
    assert after[0]["loss"] < reference[1] / 5  # not a fresh start
    assert got[-1]["loss"] == records(whole_m)[-1]["loss"]
    with np.load(whole_ck / "step_00000300.npz") as a, np.load(ck / "step_00000300.npz") as b:
        for k in ("W1", "b1", "W2", "b2", "adam_m_W1", "adam_v_W2", "data_order"):
            assert np.array_equal(a[k], b[k])


def test_kill_fault_is_a_real_sigkill(tmp_path):
    """NIGHTSHIFT_FAULT_KILL_AT_STEP dies by SIGKILL, as the OOM killer would do it."""
    proc, _, metrics = run(tmp_path, env={"NIGHTSHIFT_FAULT_KILL_AT_STEP": "30"}, steps=50)
    assert proc.returncode == -signal.SIGKILL
    assert max(losses(metrics)) == 29


def test_oom_fault_only_above_the_batch_threshold(tmp_path):
    """The fake CUDA OOM fires while micro-batch > B and reads exactly like PyTorch's; a smaller batch passes."""
    env = {"NIGHTSHIFT_FAULT_OOM_AT_STEP": "30", "NIGHTSHIFT_FAULT_OOM_ABOVE_BATCH": "16"}
    big, ck, _ = run(tmp_path, env=env, steps=50, name="big")
    assert big.returncode == 1
    assert (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.02 GiB is free"
    ) in big.stderr
    small, _, metrics = run(
        tmp_path,
        "--micro-batch",
        "16",
        "--grad-accum",
        "2",
        "--resume",
        str(ck / "step_00000025.npz"),
        env=env,
        steps=50,
        name="big",
    )
    assert small.returncode == 0, small.stderr
    args = json.loads(small.stdout.splitlines()[0].removeprefix("nightshift-args: "))
    assert args["micro_batch"] == 16 and args["grad_accum"] == 2
    assert records(metrics)[-2]["micro_batch"] == 16


def test_nan_fault_only_above_the_lr_threshold(tmp_path):
    """The loss goes NaN at step K only while lr > X: logged as NaN, then a non-zero exit."""
    env = {"NIGHTSHIFT_FAULT_NAN_AT_STEP": "20", "NIGHTSHIFT_FAULT_NAN_ABOVE_LR": "0.005"}
    hot, _, metrics = run(tmp_path, env=env, steps=40, name="hot")
    assert hot.returncode == 1
    assert "FloatingPointError: loss is nan at step 20" in hot.stderr
    last = records(metrics)[-1]
    assert last["step"] == 20 and math.isnan(last["loss"])
    cool, _, _ = run(tmp_path, "--lr", "0.005", env=env, steps=40, name="cool")
    assert cool.returncode == 0, cool.stderr


def test_hang_fault_stops_making_progress(tmp_path):
    """NIGHTSHIFT_FAULT_HANG_AT_STEP leaves a live process that logs nothing more."""
    folder = tmp_path / "hang"
    metrics = folder / "metrics.jsonl"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAULT_")}
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN), "--steps", "50", "--metrics-file", str(metrics)],
        env={**clean, "NIGHTSHIFT_FAULT_HANG_AT_STEP": "10"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (metrics.exists() and len(records(metrics)) >= 9):
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None
        assert max(losses(metrics)) == 9
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def test_quickstart_spec_loads_and_renders(tmp_path):
    """The quickstart spec validates, runs in examples/, and fills every placeholder of its command."""
    spec = load_spec(REPO / "examples" / "specs" / "quickstart.yaml")
    assert spec.name == "quickstart" and spec.run_dir() == REPO / "examples"
    assert spec.unfilled_placeholders() == set()
    assert spec.knobs.learning_rate == "lr" and spec.checkpoint.every_steps == 25
    assert spec.environment.env == {"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140"}
    argv = spec.render(
        spec.parameters,
        {
            "python": sys.executable,
            "checkpoint_dir": "ck",
            "metrics_file": "m.jsonl",
            "run_dir": str(tmp_path),
        },
    )
    assert argv[1] == "train_numpy.py" and (spec.run_dir() / argv[1]).is_file()
    assert argv[argv.index("--lr") + 1] == "0.01" and argv[argv.index("--steps") + 1] == "300"
