"""Checkpoint search below a run root, on files the real libraries wrote: torch.save in nanoGPT's
shape (step under `iter_num`), safetensors with NaN weights, a transformers model and TrainerState
saved as Trainer saves a checkpoint-N folder, nested a few levels down, and TensorFlow's own
checkpoints (recorded fixtures). (Lightning's version_K
folders and Trainer's own checkpoint-N folders are searched in tests/test_real_programs.py, which
runs those programs under nightshift.)"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.runtime.config import Settings
from nightshift.runtime.training import checkpoints
from nightshift.skills.auto_resume import auto_resume
from nightshift.skills.base import SkillContext

from conftest import empty_store, need, run_skill


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 2, 3, 0),
    )


@pytest.fixture(scope="module")
def torch():
    return need("torch", "writing checkpoints with torch.save")


def nanogpt_ckpt(torch, path: Path, iter_num: int, bad: bool = False) -> Path:
    model = torch.nn.Linear(4, 4)
    if bad:
        with torch.no_grad():
            model.weight[0, 0] = float("nan")
    opt = torch.optim.AdamW(model.parameters())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "model_args": {"n_layer": 1},
            "iter_num": iter_num,
            "best_val_loss": 1.5,
            "config": {"learning_rate": 3e-3},
        },
        path,
    )
    return path


def test_step_from_iter_num_nested_and_newest_first(torch, tmp_path):
    nanogpt_ckpt(torch, tmp_path / "a" / "out" / "ckpt.pt", 250)
    nanogpt_ckpt(torch, tmp_path / "b" / "ckpt.pt", 100)
    found = checkpoints.scan(tmp_path)
    assert [(f.step, f.step_from, f.framework) for f in found] == [
        (250, "metadata", "pytorch"),
        (100, "metadata", "pytorch"),
    ]
    assert checkpoints.verify(found[0]) is None and checkpoints.nonfinite(found[0]) is None


def test_torn_and_nan_checkpoints_are_passed_over(torch, ctx, tmp_path):
    nanogpt_ckpt(torch, tmp_path / "run" / "ckpt_100.pt", 100)
    nan = nanogpt_ckpt(torch, tmp_path / "run" / "ckpt_200.pt", 200, bad=True)
    torn = nanogpt_ckpt(torch, tmp_path / "run" / "ckpt_300.pt", 300)
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    r = run_skill(auto_resume, ctx, {"checkpoint_dir": str(tmp_path)})
    assert r.step == 100 and r.path.endswith("ckpt_100.pt")
    reasons = {Path(s.path).name: s.reason for s in r.skipped}
    assert "zip" in reasons["ckpt_300.pt"]
    assert "NaN" in reasons["ckpt_200.pt"] and "model.weight" in reasons["ckpt_200.pt"]
    assert str(nan) in [s.path for s in r.skipped]
    kept = run_skill(auto_resume, ctx, {"checkpoint_dir": str(tmp_path), "reject_nonfinite": False})
    assert kept.step == 200


def test_safetensors_nan_and_epoch_steps(torch, ctx, tmp_path):
    st = need("safetensors.torch", "writing safetensors files")
    st.save_file(
        {"w": torch.tensor([1.0, float("inf")])}, str(tmp_path / "model_step_20.safetensors")
    )
    st.save_file({"w": torch.ones(2)}, str(tmp_path / "model_step_10.safetensors"))
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, tmp_path / "last.pth")
    found = checkpoints.scan(tmp_path, steps_per_epoch=5)
    assert [(f.path.name, f.step, f.step_from) for f in found] == [
        ("model_step_20.safetensors", 20, "name"),
        ("last.pth", 15, "metadata"),
        ("model_step_10.safetensors", 10, "name"),
    ]
    assert "inf" in checkpoints.nonfinite(found[0])
    r = run_skill(auto_resume, ctx, {"checkpoint_dir": str(tmp_path), "steps_per_epoch": 5})
    assert r.step == 15


def test_hf_checkpoint_folder_two_levels_down(torch, ctx, tmp_path):
    transformers = need("transformers", "saving a model as Trainer does")
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    )
    for step in (50, 100):
        folder = tmp_path / "runs" / "exp1" / "hf_out" / f"checkpoint-{step}"
        model.save_pretrained(folder)  # Trainer writes the weights first ...
        transformers.TrainerState(global_step=step).save_to_json(str(folder / "trainer_state.json"))
    (tmp_path / "runs" / "exp1" / "hf_out" / "checkpoint-100" / "trainer_state.json").unlink()
    r = run_skill(
        auto_resume, ctx, {"checkpoint_dir": str(tmp_path / "runs")}
    )  # ... its state last
    assert r.framework == "huggingface" and r.step == 50 and r.step_from == "trainer_state"
    assert "trainer_state.json" in r.skipped[0].reason
    assert r.command is None
    plan = run_skill(
        auto_resume, ctx, {"checkpoint_dir": str(tmp_path / "runs"), "command": ["train.py"]}
    )
    assert plan.command == ["train.py", "--resume_from_checkpoint", plan.path]


def test_symlinks_out_of_the_root_and_the_depth_bound(torch, tmp_path):
    outside = nanogpt_ckpt(torch, tmp_path / "elsewhere" / "ckpt_900.pt", 900).parent
    root = tmp_path / "root"
    nanogpt_ckpt(torch, root / "a" / "b" / "c" / "ckpt_5.pt", 5)
    (root / "link").symlink_to(outside)
    assert [f.step for f in checkpoints.scan(root)] == [5]
    assert [f.step for f in checkpoints.scan(root, allowed_roots=[tmp_path])] == [900, 5]
    assert checkpoints.scan(root, max_depth=2) == []


def test_trainer_state_infinities_are_not_weights(torch, tmp_path):
    """Lightning saves ModelCheckpoint's kth_value, which starts at inf, beside the weights: only
    the weights (state_dict, model, ...) decide whether a checkpoint is finite. The real Lightning
    file is checked in tests/test_real_programs.py."""
    callbacks = {"ModelCheckpoint{'monitor': None}": {"kth_value": torch.tensor(float("inf"))}}
    torch.save(
        {"state_dict": {"w": torch.ones(2)}, "global_step": 80, "callbacks": callbacks},
        tmp_path / "epoch=1-step=80.ckpt",
    )
    torch.save(
        {
            "state_dict": {"w": torch.tensor([float("nan")])},
            "global_step": 120,
            "callbacks": callbacks,
        },
        tmp_path / "epoch=2-step=120.ckpt",
    )
    bad, good = checkpoints.scan(tmp_path)
    assert checkpoints.nonfinite(good) is None
    assert "state_dict.w" in checkpoints.nonfinite(bad)


# --- TensorFlow: files TensorFlow 2.21 wrote (tests/fixtures/checkpoints/tensorflow/make.py) ----
TF_FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints" / "tensorflow"


@pytest.fixture
def protobuf():
    return need("google.protobuf", "the TF .index entries are decoded with protobuf")


def test_tf_model_dir_newest_whole_checkpoint_below_the_root(protobuf, ctx, tmp_path):
    """The `checkpoint` index file sits in model_dir/train/; given model_dir, the newest prefix is
    found; one whose data shard was cut short is passed over for the one before."""
    import shutil

    root = shutil.copytree(TF_FIXTURES / "model_dir", tmp_path / "model_dir")
    r = run_skill(auto_resume, ctx, {"checkpoint_dir": str(root)})
    assert (r.framework, r.step, Path(r.path).name) == ("tensorflow", 3, "ckpt-3")
    data = root / "train" / "ckpt-3.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-100])  # the index is intact, the data is not
    r = run_skill(auto_resume, ctx, {"checkpoint_dir": str(root)})
    assert r.step == 2 and "cut short" in r.skipped[0].reason, r.skipped


def test_tf_every_shard_of_a_sharded_checkpoint_is_checked(protobuf, tmp_path):
    import shutil

    root = shutil.copytree(TF_FIXTURES / "sharded", tmp_path / "sharded")
    (found,) = checkpoints.scan(root)
    assert checkpoints.verify(found) is None
    middle = root / "ckpt-1.data-00001-of-00003"
    middle.write_bytes(middle.read_bytes()[:1000])
    assert "data shard 1 is cut short" in checkpoints.verify(found)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=1015), st.binary(min_size=1, max_size=8))
def test_a_damaged_tf_index_is_a_reason_never_a_crash(tmp_path_factory, at, junk):
    import shutil

    root = shutil.copytree(TF_FIXTURES / "model_dir", tmp_path_factory.mktemp("tf") / "m")
    index = root / "train" / "ckpt-3.index"
    raw = bytearray(index.read_bytes())
    raw[at : at + len(junk)] = junk
    index.write_bytes(bytes(raw))
    found = next(f for f in checkpoints.scan(root) if f.step == 3)
    reason = checkpoints.verify(found)
    assert reason is None or isinstance(reason, str)
