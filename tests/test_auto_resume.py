"""auto_resume across checkpoint layouts, built byte for byte in tmp_path: real zip archives the
way torch.save writes them, real safetensors headers, checkpoints TensorFlow wrote (recorded fixtures),
orbax step folders, and the example's own .npz checkpoints from a real crashed run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from nightshift.runtime.config import Settings
from nightshift.skills.auto_resume import auto_resume, inject_resume_args
from nightshift.skills.base import SkillContext

from conftest import empty_store, run_skill

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train_numpy.py"
PAYLOAD = bytes(range(256)) * 16  # stands in for a tensor storage


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 2, 3, 0),
    )


def plan(ctx, folder: Path, **kw):
    return run_skill(auto_resume, ctx, {"checkpoint_dir": str(folder), **kw})


# --- writers for real checkpoint bytes ------------------------------------------------------------
def torch_zip(path: Path, obj: dict | None = None) -> Path:
    """A torch.save-style zip: <name>/data.pkl (protocol 2 pickle), byteorder, data/0, version."""
    name = path.name.split(".")[0]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", pickle.dumps(obj or {"state_dict": {}}, protocol=2))
        zf.writestr(f"{name}/byteorder", "little")
        zf.writestr(f"{name}/data/0", PAYLOAD)
        zf.writestr(f"{name}/version", "3\n")
    return path


def torch_legacy(path: Path, obj: dict) -> Path:
    """torch.save(..., _use_new_zipfile_serialization=False): magic, protocol, sys_info, object."""
    with open(path, "wb") as f:
        f.writelines(
            pickle.dumps(part, protocol=2)
            for part in (
                0x1950A86A20F9469CFC6C,
                1001,
                {
                    "protocol_version": 1001,
                    "little_endian": True,
                    "type_sizes": {"short": 2, "int": 4, "long": 4},
                },
                obj,
                [],
            )
        )
    return path


def truncate(path: Path, keep: float = 0.6) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def flip_payload_byte(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    at = bytes(data).index(PAYLOAD[:64]) + 100
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def safetensors(path: Path, metadata: dict[str, str] | None = None) -> Path:
    """A valid safetensors file: u64 LE header length, JSON header, then the tensor bytes."""
    header: dict = {
        "w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [64, 80]},
    }
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + np.arange(20, dtype="<f4").tobytes())
    return path


def hf_checkpoint(folder: Path, step: int, *, state: bool = True) -> Path:
    folder.mkdir(parents=True)
    safetensors(folder / "model.safetensors")
    torch_zip(folder / "optimizer.pt")
    if state:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.0}))
    return folder


TF_FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints" / "tensorflow"


def tf_checkpoint(
    folder: Path, prefix: str, *, shards: int = 1, drop_shard: int | None = None
) -> None:
    """A checkpoint TensorFlow wrote (tests/fixtures/checkpoints/tensorflow/make.py), renamed to
    `prefix`: one data shard (model_dir) or three (sharded)."""
    src = TF_FIXTURES / ("model_dir/train/ckpt-3" if shards == 1 else "sharded/ckpt-1")
    n = 1 if shards == 1 else 3
    shutil.copy(f"{src}.index", folder / f"{prefix}.index")
    for i in range(n):
        if i != drop_shard:
            shutil.copy(
                f"{src}.data-{i:05d}-of-{n:05d}", folder / f"{prefix}.data-{i:05d}-of-{n:05d}"
            )


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))


# --- tests ----------------------------------------------------------------------------------------
def test_missing_folder_is_not_an_error(ctx, tmp_path):
    """A run that never checkpointed has no folder: say so and start from scratch."""
    r = plan(ctx, tmp_path / "nope")
    assert r.found is False and "does not exist" in r.message


def test_empty_folder_means_start_from_scratch(ctx, tmp_path):
    """No checkpoint is a normal answer with a clear message, not an error."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "metrics.jsonl").write_text("{}\n")
    r = plan(ctx, tmp_path / "ck", command=["python", "train.py"])
    assert r.found is False and r.candidates == 0 and "start from scratch" in r.message
    assert r.command is None


def test_orders_by_step_never_by_mtime(ctx, tmp_path):
    """The newest step wins even when its file is the oldest on disk (and 100 > 9 numerically)."""
    for i, step in enumerate((9, 10, 100)):
        set_mtime(torch_zip(tmp_path / f"ckpt_{step}.pt"), 2_000_000_000 - i * 1000)
    r = plan(ctx, tmp_path)
    assert r.found and r.step == 100 and r.path.endswith("ckpt_100.pt") and r.framework == "pytorch"
    assert r.candidates == 3 and r.skipped == []


def test_truncated_newest_is_skipped_for_the_one_before(ctx, tmp_path):
    """A torch zip cut short by a crash during torch.save is passed over, with the reason."""
    torch_zip(tmp_path / "model_step1000.pth")
    truncate(torch_zip(tmp_path / "model_step2000.pth"))
    r = plan(ctx, tmp_path, current_step=2150)
    assert r.step == 1000 and r.steps_to_recompute == 1150
    assert [Path(s.path).name for s in r.skipped] == ["model_step2000.pth"]
    assert "truncated" in r.skipped[0].reason


def test_crc_corruption_is_caught_without_torch(ctx, tmp_path):
    """A flipped byte inside a tensor fails the zip CRC check; torch is never imported for it (only
    the finite-weights check loads tensors, with torch when it is installed)."""
    torch_zip(tmp_path / "ckpt_100.pt")
    flip_payload_byte(torch_zip(tmp_path / "ckpt_200.pt"))
    r = plan(ctx, tmp_path, reject_nonfinite=False)
    assert r.step == 100
    assert "CRC" in r.skipped[0].reason and "data/0" in r.skipped[0].reason
    probe = (
        "import sys; from nightshift.runtime.training import checkpoints as c; "
        f"f = c.scan(c.Path({str(tmp_path)!r})); print([c.verify(x) is None for x in f], "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[False,", "True]", "False"]


def test_empty_and_foreign_files_are_skipped(ctx, tmp_path):
    """An empty file and a zip that is not a torch.save archive are not checkpoints to resume."""
    torch_zip(tmp_path / "ckpt_100.pt")
    (tmp_path / "ckpt_300.pt").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "ckpt_200.pt", "w") as zf:
        zf.writestr("notes.txt", "hello")
    r = plan(ctx, tmp_path)
    assert r.step == 100
    reasons = {Path(s.path).name: s.reason for s in r.skipped}
    assert "empty" in reasons["ckpt_300.pt"] and "data.pkl" in reasons["ckpt_200.pt"]


def test_legacy_torch_pickle(ctx, tmp_path):
    """Old non-zip torch files: the magic number is checked, and the step is read from the pickle."""
    torch_legacy(tmp_path / "checkpoint.pth.tar", {"epoch": 7, "step": 7000, "state_dict": {}})
    (tmp_path / "ckpt_9000.pt").write_bytes(pickle.dumps({"step": 9000}, protocol=2))  # no magic
    r = plan(ctx, tmp_path)
    assert r.found and r.step == 7000 and r.path.endswith("checkpoint.pth.tar")
    assert "magic" in r.skipped[0].reason


def test_lightning_last_ckpt_takes_its_step_from_the_pickle(ctx, tmp_path):
    """last.ckpt has no step in its name; its pickled global_step orders it, without unpickling."""
    torch_zip(
        tmp_path / "epoch=3-step=1200.ckpt", {"epoch": 3, "global_step": 1200, "state_dict": {}}
    )
    torch_zip(tmp_path / "last.ckpt", {"epoch": 4, "global_step": 1500, "state_dict": {}})
    r = plan(ctx, tmp_path, command=["python", "train.py", "fit", "--ckpt_path", "old.ckpt"])
    assert r.framework == "lightning" and r.step == 1500 and r.path.endswith("last.ckpt")
    assert r.command == ["python", "train.py", "fit", "--ckpt_path", r.path]


def test_lightning_last_ckpt_without_a_step_ranks_after_named_steps(ctx, tmp_path):
    """A checkpoint whose step cannot be known is only used when no known step verifies."""
    torch_zip(tmp_path / "epoch=3-step=1200.ckpt", {"global_step": 1200})
    torch_zip(tmp_path / "last.ckpt", {"state_dict": {}})
    assert plan(ctx, tmp_path).step == 1200
    truncate(tmp_path / "epoch=3-step=1200.ckpt")
    r = plan(ctx, tmp_path, current_step=1300)
    assert r.found and r.path.endswith("last.ckpt") and r.step is None
    assert r.steps_to_recompute is None and "records no step" in r.message


def test_huggingface_folders(ctx, tmp_path):
    """checkpoint-N folders need trainer_state.json and verified weights; HF's resume flag replaces the old one."""
    hf_checkpoint(tmp_path / "checkpoint-500", 500)
    hf_checkpoint(tmp_path / "checkpoint-1000", 1000, state=False)  # save interrupted
    truncate(hf_checkpoint(tmp_path / "checkpoint-1500", 1500) / "model.safetensors")
    (tmp_path / "tmp-checkpoint-2000").mkdir()  # transformers' staging folder
    cmd = ["accelerate", "launch", "run_clm.py", "--resume_from_checkpoint=old", "--bf16"]
    r = plan(ctx, tmp_path, command=cmd, current_step=1700)
    assert r.framework == "huggingface" and r.step == 500 and r.steps_to_recompute == 1200
    assert r.command == [
        "accelerate",
        "launch",
        "run_clm.py",
        "--bf16",
        "--resume_from_checkpoint",
        r.path,
    ]
    reasons = {Path(s.path).name: s.reason for s in r.skipped}
    assert "trainer_state.json" in reasons["checkpoint-1000"]
    assert (
        "model.safetensors" in reasons["checkpoint-1500"]
        and "truncated" in reasons["checkpoint-1500"]
    )
    assert "unfinished" in reasons["tmp-checkpoint-2000"]


def test_huggingface_sharded_index_needs_every_shard(ctx, tmp_path):
    """A sharded save is complete only when every shard the index names exists."""
    good = hf_checkpoint(tmp_path / "checkpoint-10", 10)
    bad = tmp_path / "checkpoint-20"
    bad.mkdir()
    (bad / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    safetensors(bad / "model-00001-of-00002.safetensors")
    (bad / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a": "model-00001-of-00002.safetensors",
                    "b": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    r = plan(ctx, tmp_path)
    assert r.path == str(good) and "model-00002-of-00002" in r.skipped[0].reason


def test_safetensors_headers_are_validated(ctx, tmp_path):
    """A safetensors file whose data is shorter than its header promises, or whose header is garbage, is skipped."""
    safetensors(tmp_path / "weights.safetensors", {"step": "300"})
    truncate(safetensors(tmp_path / "model_step500.safetensors"), keep=0.9)
    bad = tmp_path / "model_step400.safetensors"
    bad.write_bytes(struct.pack("<Q", 16) + b"{not json!!!!!!}" + b"\x00" * 8)
    r = plan(
        ctx, tmp_path, command=["python", "train.py"], resume_arg=["--init-from", "{checkpoint}"]
    )
    assert r.framework == "safetensors" and r.step == 300  # the step from __metadata__
    assert r.command == ["python", "train.py", "--init-from", r.path]
    reasons = {Path(s.path).name: s.reason for s in r.skipped}
    assert "truncated" in reasons["model_step500.safetensors"]
    assert "JSON" in reasons["model_step400.safetensors"]


def test_tensorflow_checkpoint_index(ctx, tmp_path):
    """Prefixes listed in the `checkpoint` file need a .index ending in the table magic and every data shard."""
    tf_checkpoint(tmp_path, "ckpt-1")
    tf_checkpoint(tmp_path, "ckpt-2", shards=2)
    tf_checkpoint(tmp_path, "ckpt-3", shards=2, drop_shard=1)
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\n'
        'all_model_checkpoint_paths: "ckpt-1"\n'
        'all_model_checkpoint_paths: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-3"\n'
    )
    r = plan(
        ctx,
        tmp_path,
        command=["python", "train.py"],
        resume_arg=["--restore", "{checkpoint}", "--initial-step", "{step}"],
    )
    assert r.framework == "tensorflow" and r.step == 2 and r.path == str(tmp_path / "ckpt-2")
    assert r.command == ["python", "train.py", "--restore", r.path, "--initial-step", "2"]
    assert "[1] of 3 missing" in r.skipped[0].reason
    (tmp_path / "ckpt-2.index").write_bytes(b"\x00" * 100)  # cut before its footer
    assert plan(ctx, tmp_path).step == 1


def test_orbax_step_folders(ctx, tmp_path):
    """Orbax steps count only once committed; a temporary folder of an unfinished save is skipped."""
    for step, committed in ((100, True), (200, True), (300, False)):
        d = tmp_path / str(step)
        (d / "default").mkdir(parents=True)
        (d / "default" / "array_metadatas").write_text("{}")
        if committed:
            (d / "_CHECKPOINT_METADATA").write_text(json.dumps({"init_timestamp_nsecs": 1}))
    (tmp_path / "400.orbax-checkpoint-tmp-1733100000").mkdir()
    r = plan(ctx, tmp_path, current_step=310)
    assert r.framework == "orbax" and r.step == 200 and r.steps_to_recompute == 110
    reasons = {Path(s.path).name: s.reason for s in r.skipped}
    assert (
        "did not finish" in reasons["300"]
        and "unfinished" in reasons["400.orbax-checkpoint-tmp-1733100000"]
    )


def test_framework_filter(ctx, tmp_path):
    """Asking for one framework ignores the others' (newer) checkpoints in a shared folder."""
    torch_zip(tmp_path / "ckpt_900.pt")
    hf_checkpoint(tmp_path / "checkpoint-100", 100)
    assert plan(ctx, tmp_path).step == 900
    r = plan(ctx, tmp_path, framework="huggingface")
    assert r.step == 100 and r.candidates == 1
    assert plan(ctx, tmp_path, framework="orbax").found is False


def test_inject_replaces_rather_than_duplicates():
    """A resume flag already in the command (either spelling) is replaced, other arguments kept."""
    tpl = ["--resume", "{checkpoint}"]
    assert inject_resume_args(["python", "t.py", "--resume", "a", "--lr", "0.1"], tpl, "b", 5) == [
        "python",
        "t.py",
        "--lr",
        "0.1",
        "--resume",
        "b",
    ]
    assert inject_resume_args(["python", "t.py", "--resume=a"], tpl, "b", 5) == [
        "python",
        "t.py",
        "--resume",
        "b",
    ]
    assert inject_resume_args(
        ["python", "t.py"], ["--resume={checkpoint}", "--step", "{step}"], "b", 7
    ) == ["python", "t.py", "--resume=b", "--step", "7"]


def test_a_real_crashed_run_resumes_from_the_plan(ctx, tmp_path):
    """The example crashes at step 140; the plan picks step 125, and its command finishes the run."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAULT_")}
    env = {**clean, "NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140"}
    ck = tmp_path / "checkpoints"
    cmd = [
        sys.executable,
        str(TRAIN),
        "--steps",
        "160",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "25",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
    ]
    crashed = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert crashed.returncode == 1
    (ck / ".step_00000150.npz.x1y2.tmp").write_bytes(b"PK\x03\x04partial")  # a save cut short

    r = plan(ctx, ck, command=cmd, resume_arg=["--resume", "{checkpoint}"], current_step=139)
    assert r.found and r.framework == "nightshift" and r.step == 125 and r.steps_to_recompute == 14
    assert r.candidates == 5 and "unfinished" in r.skipped[0].reason
    resumed = subprocess.run(
        r.command, check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 125" in resumed.stdout
    assert plan(ctx, ck).step == 160


def test_npz_checks_its_recorded_step(ctx, tmp_path):
    """A nightshift .npz must hold a readable step that matches its name, plus state."""
    np.savez(tmp_path / "step_00000010.npz", step=np.array(10), W1=np.zeros(3))
    np.savez(tmp_path / "step_00000020.npz", step=np.array(19), W1=np.zeros(3))
    np.savez(tmp_path / "step_00000030.npz", W1=np.zeros(3))
    r = plan(ctx, tmp_path)
    assert r.step == 10
    reasons = [s.reason for s in r.skipped]
    assert "missing required array(s) step" in reasons[0] and "records step 19" in reasons[1]
