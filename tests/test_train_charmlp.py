"""The character-level MLP example (examples/programs/train_charmlp.py), the sweep benchmark's
second model: its hand-written gradients are right, it learns, and a resumed run continues
exactly where the uninterrupted one would have been."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "examples" / "programs" / "train_charmlp.py"


@pytest.fixture(scope="module")
def charmlp() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_charmlp", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    metrics = folder / "metrics.jsonl"
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), "--metrics-file", str(metrics), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return proc, [json.loads(line) for line in lines]


def test_the_gradients_match_finite_differences(charmlp):
    """Backpropagation is written by hand (the embedding's scatter-add included): check it."""
    args = charmlp.parse_args(["--context", "3", "--embed", "4", "--hidden", "5"])
    params = charmlp.init_params(1, 7, args)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 7, (6, 3)), rng.integers(0, 7, 6)
    x[1] = x[0]  # a character seen twice in a batch: its embedding gradient adds up
    _, grads = charmlp.loss_and_grads(params, x, y)
    for name, p in params.items():
        for index in [(0,) * p.ndim, tuple(s - 1 for s in p.shape)]:
            old = p[index]
            p[index] = old + 1e-6
            up, _ = charmlp.loss_and_grads(params, x, y)
            p[index] = old - 1e-6
            down, _ = charmlp.loss_and_grads(params, x, y)
            p[index] = old
            assert grads[name][index] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8)


def test_it_learns_and_logs_what_a_sweep_reads(tmp_path):
    """Validation loss falls well below a uniform guess's, at every --val-every step."""
    proc, records = run(tmp_path, "--steps", "400", "--val-every", "100", "--log-every", "50")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("nightshift-args: ")
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r and "event" not in r}
    assert sorted(val) == [100, 200, 300, 400]
    assert val[400] < val[100] < np.log(90)
    assert sorted(r["step"] for r in records if "lr" in r) == list(range(50, 401, 50))
    assert records[-1]["event"] == "done"


def test_a_resumed_run_matches_the_uninterrupted_one(tmp_path):
    """Batches come from (seed, step) and the Adam state is checkpointed: resuming from step 100
    gives bit-for-bit the validation loss of a run that never stopped."""
    every = ["--val-every", "100", "--checkpoint-every", "100"]
    whole, expected = run(tmp_path / "whole", "--steps", "200", *every)
    part = tmp_path / "part" / "checkpoints"
    first, _ = run(tmp_path / "part", "--steps", "100", *every, "--checkpoint-dir", str(part))
    assert whole.returncode == 0 and first.returncode == 0, whole.stderr + first.stderr
    resumed, got = run(
        tmp_path / "resumed", "--steps", "200", *every, "--resume", str(part / "step_00000100.npz")
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 100" in resumed.stdout
    assert [r["val_loss"] for r in got if r.get("step") == 200 and "val_bpc" in r] == [
        r["val_loss"] for r in expected if r.get("step") == 200 and "val_bpc" in r
    ]


def test_its_sweep_spec_loads_and_searches_what_the_command_passes():
    """examples/specs/sweep_charmlp.yaml: every searched parameter reaches the program."""
    from nightshift.runtime.spec import load_spec

    spec = load_spec(REPO / "examples" / "specs" / "sweep_charmlp.yaml")
    assert (spec.run_dir() / "train_charmlp.py").is_file()
    assert spec.search and spec.sweep and spec.sweep.metric == "val_loss"
    for name in spec.search:
        assert "{" + name + "}" in spec.command
    args = PROGRAM.read_text()
    for flag in spec.command[2::2]:
        assert f'"{flag}"' in args
