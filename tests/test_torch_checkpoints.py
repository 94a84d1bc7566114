"""auto_resume on checkpoints written by real PyTorch (model *and* optimiser state), in the
layouts people use: plain `*.pt`, Lightning `epoch=N-step=M.ckpt` and `last.ckpt`, Hugging Face
`checkpoint-N/`. Needs torch: skipped with the reason without it, required in CI."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from nightshift.runtime.config import Settings
from nightshift.skills.auto_resume import auto_resume
from nightshift.skills.base import SkillContext

from conftest import empty_store, need, run_skill

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def torch():
    return need("torch", "auto_resume must read checkpoints written by real torch.save")


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 2, 3, 0),
    )


def train_and_save(torch, path: Path, step: int, **extra) -> None:
    """A few real optimiser steps, then torch.save of model, optimiser and step."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": step, **extra},
        path,
    )


def test_plain_torch_files_newest_truncated_is_skipped(torch, ctx, tmp_path):
    """A torch.save cut short (a crash mid-write) is skipped for the checkpoint before it."""
    for step in (100, 200, 300):
        train_and_save(torch, tmp_path / f"ckpt_{step}.pt", step)
    newest = tmp_path / "ckpt_300.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    r = run_skill(
        auto_resume,
        ctx,
        {
            "checkpoint_dir": str(tmp_path),
            "command": ["python", "train.py"],
            "resume_arg": ["--resume", "{checkpoint}"],
            "current_step": 340,
        },
    )
    assert r.found and r.step == 200 and r.path.endswith("ckpt_200.pt")
    assert [Path(s.path).name for s in r.skipped] == ["ckpt_300.pt"]
    assert r.steps_to_recompute == 140
    assert r.command == ["python", "train.py", "--resume", r.path]
    state = torch.load(r.path, weights_only=True)  # the chosen one really loads
    assert state["global_step"] == 200 and "state" in state["optimizer"]


def test_flipped_byte_in_tensor_data_fails_the_crc(torch, ctx, tmp_path):
    """Silent corruption inside a tensor record is caught by the zip CRC, without loading torch."""
    train_and_save(torch, tmp_path / "model_step1000.pth", 1000)
    train_and_save(torch, tmp_path / "model_step2000.pth", 2000)
    bad = tmp_path / "model_step2000.pth"
    raw = bytearray(bad.read_bytes())
    marker = raw.find(b"/data/0")
    # Flip a byte well inside the first tensor's stored bytes (after its local file header).
    raw[marker + 200] ^= 0xFF
    bad.write_bytes(bytes(raw))
    r = run_skill(auto_resume, ctx, {"checkpoint_dir": str(tmp_path)})
    assert r.step == 1000
    assert "model_step2000.pth" in r.skipped[0].path


def test_lightning_layout(torch, ctx, tmp_path):
    """Lightning names carry the step; last.ckpt's step comes from the file itself."""
    train_and_save(torch, tmp_path / "epoch=0-step=500.ckpt", 500)
    train_and_save(torch, tmp_path / "last.ckpt", 900)
    r = run_skill(
        auto_resume,
        ctx,
        {
            "checkpoint_dir": str(tmp_path),
            "framework": "lightning",
            "command": ["python", "fit.py"],
        },
    )
    assert r.found and r.step == 900 and r.path.endswith("last.ckpt")
    assert "--ckpt_path" in r.command


def test_huggingface_checkpoint_folders(torch, ctx, tmp_path):
    """HF Trainer folders need their weights and trainer_state.json; an incomplete newest is skipped."""
    for step in (50, 100):
        d = tmp_path / f"checkpoint-{step}"
        train_and_save(torch, d / "pytorch_model.bin", step)
        train_and_save(torch, d / "optimizer.pt", step)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-150").mkdir()  # the Trainer died while writing it
    (tmp_path / "checkpoint-150" / "trainer_state.json").write_text(
        json.dumps({"global_step": 150})
    )
    r = run_skill(
        auto_resume, ctx, {"checkpoint_dir": str(tmp_path), "command": ["python", "run_clm.py"]}
    )
    assert r.found and r.step == 100 and r.path.endswith("checkpoint-100")
    assert r.command[-2:] == ["--resume_from_checkpoint", r.path]
    assert any("checkpoint-150" in s.path for s in r.skipped)
