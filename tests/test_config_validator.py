"""config_validator: schema errors with field paths and lines, then the engineering checks."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import SkillInputError
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store import GpuSample, Store
from nightshift.skills.base import SkillContext
from nightshift.skills.config_validator import config_validator, estimate_memory

NOW = datetime(2026, 12, 2, 3, 0)


@pytest.fixture
def ctx(tmp_path: Path) -> SkillContext:
    return SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"), settings=Settings(home=str(tmp_path)), now=NOW
    )


def good_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "gpt-small",
        "environment": {"image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"},
        "command": [
            "{python}",
            "train.py",
            "--lr",
            "{lr}",
            "--bs",
            "{micro_batch_size}",
            "--seed",
            "{seed}",
        ],
        "parameters": {"lr": 3e-4, "optimizer": "adamw", "micro_batch_size": 32, "seed": 1},
        "checkpoint": {"dir": "ckpt"},
        "knobs": {"learning_rate": "lr", "micro_batch": "micro_batch_size"},
    }
    spec.update(over)
    return spec


def fields(findings: list) -> list[str | None]:
    return [f.field for f in findings]


def test_valid_spec_has_no_findings(ctx):
    """A careful spec passes with no errors, warnings or suggestions."""
    out = config_validator(ctx, {"spec": good_spec()})
    assert out.valid and out.errors == [] and out.warnings == [] and out.suggestions == []
    assert out.estimate is None


def test_schema_errors_name_field_path_and_line(ctx, tmp_path):
    """Every schema error names its field path and, from a file, the line it is on."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: bad\ncommand: [python, train.py]\nretries: -1\nresources:\n  gpus: two\npriorty: 3\n"
    )
    out = config_validator(ctx, {"path": str(path)})
    assert not out.valid
    found = {(f.field, f.line) for f in out.errors}
    assert found == {("retries", 3), ("resources.gpus", 5), ("priorty", 6)}
    assert out.warnings == [] and "schema" in out.suggestions[0]


def test_schema_errors_from_a_mapping_have_paths_but_no_lines(ctx):
    """A spec passed as a mapping has no lines; the field path still says where."""
    out = config_validator(ctx, {"spec": good_spec(command="python train.py --lr 1")})
    assert not out.valid and fields(out.errors) == ["command"] and out.errors[0].line is None


def test_unreadable_file_is_an_error(ctx, tmp_path):
    """A missing file or broken YAML is reported as an error, with the line where YAML broke."""
    assert not config_validator(ctx, {"path": str(tmp_path / "nope.yaml")}).valid
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ncommand: [a, b\n")
    out = config_validator(ctx, {"path": str(broken)})
    assert not out.valid and out.errors[0].line is not None


def test_json_spec_file(ctx, tmp_path):
    """JSON spec files are read the same way as YAML."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(good_spec()))
    assert config_validator(ctx, {"path": str(path)}).valid


def test_missing_script_and_workdir_are_errors(ctx, tmp_path):
    """A command naming a script that is not there fails validation, before anything launches."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = good_spec(code={"path": str(tmp_path)}, environment={})
    assert config_validator(ctx, {"spec": spec}).valid
    spec["command"] = ["python", "trian.py", "--lr", "{lr}", "--seed", "{seed}"]
    out = config_validator(ctx, {"spec": spec})
    assert (
        not out.valid
        and fields(out.errors) == ["command.1"]
        and "trian.py" in out.errors[0].message
    )
    missing = good_spec(code={"path": str(tmp_path / "nowhere")}, environment={})
    assert fields(config_validator(ctx, {"spec": missing}).errors) == ["code.path"]


def test_script_resolved_against_the_spec_file(ctx, tmp_path):
    """A relative code path resolves against the spec file's folder; `python -m module` is not a file."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    spec = good_spec(code={"path": "src"}, environment={})
    spec["command"] = ["python", "train.py", "-m", "x.py", "--lr", "{lr}", "--seed", "{seed}"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert config_validator(ctx, {"path": str(path)}).valid


def test_unfilled_placeholder_is_an_error(ctx):
    """A {placeholder} that no parameter fills would fail at launch: an error with a fix."""
    spec = good_spec(
        command=["python", "train.py", "--epochs", "{epochs}", "--ckpt", "{checkpoint_dir}"]
    )
    out = config_validator(ctx, {"spec": spec})
    assert (
        not out.valid and fields(out.errors) == ["command"] and "{epochs}" in out.errors[0].message
    )
    assert any("epochs" in s for s in out.suggestions)


def test_search_space_fills_placeholders(ctx):
    """A sweep's search space fills its placeholders too."""
    spec = good_spec(
        command=["python", "t.py", "--wd", "{wd}", "--seed", "{seed}"],
        search_space={"wd": [0.0, 0.1]},
    )
    assert config_validator(ctx, {"spec": spec}).valid


@pytest.mark.parametrize(
    ("image", "floating"),
    [
        ("pytorch/pytorch", True),
        ("pytorch/pytorch:latest", True),
        ("ghcr.io/org/train:nightly", True),
        ("localhost:5000/train", True),
        ("localhost:5000/train:1.2.0", False),
        ("pytorch/pytorch@sha256:" + "a" * 64, False),
        ("nvcr.io/nvidia/pytorch:24.05-py3", False),
    ],
)
def test_floating_image_tag_warns(ctx, image, floating):
    """An image without a pinned tag or digest may change under the same spec."""
    out = config_validator(ctx, {"spec": good_spec(environment={"image": image})})
    assert out.valid
    assert ("environment.image" in fields(out.warnings)) is floating


def test_missing_seed_warns(ctx):
    """Without a seed a rerun or a resumed attempt is not reproducible."""
    params = {"lr": 3e-4, "optimizer": "adamw", "micro_batch_size": 32}
    spec = good_spec(parameters=params, command=["python", "t.py", "--lr", "{lr}"])
    out = config_validator(ctx, {"spec": spec})
    assert out.valid and fields(out.warnings) == ["seed"]
    assert config_validator(ctx, {"spec": {**spec, "seed": 7}}).warnings == []


@pytest.mark.parametrize(
    ("optimizer", "lr", "warns"),
    [
        ("adamw", 0.5, True),
        ("adamw", 1e-7, True),
        ("adam", "3e-4", False),  # YAML reads 3e-4 as a string
        ("adamw_bnb_8bit", 2e-4, False),
        ("torch.optim.AdamW", 0.05, True),
        ("sgd", 0.1, False),
        ("sgd", 5.0, True),
        ("mystery", 5.0, False),
    ],
)
def test_learning_rate_range_per_optimizer(ctx, optimizer, lr, warns):
    """The learning rate is checked against the usual range of the optimiser the spec names."""
    params = {"lr": lr, "optimizer": optimizer, "micro_batch_size": 32, "seed": 1}
    out = config_validator(ctx, {"spec": good_spec(parameters=params)})
    assert ("parameters.lr" in fields(out.warnings)) is warns


def test_retries_without_checkpoint_warns(ctx):
    """Retries without a checkpoint dir restart from step 0 every time."""
    spec = good_spec()
    del spec["checkpoint"]
    out = config_validator(ctx, {"spec": spec})
    assert fields(out.warnings) == ["checkpoint"]
    assert config_validator(ctx, {"spec": {**spec, "retries": 0}}).warnings == []


def big_model(**params: Any) -> dict[str, Any]:
    """A 1.3B-parameter transformer with bf16 mixed precision and AdamW (16 bytes per parameter)."""
    base = {
        "lr": 3e-4,
        "optimizer": "adamw",
        "seed": 1,
        "params_millions": 1300,
        "precision": "bf16-mixed",
        "micro_batch_size": 64,
        "grad_accum": 1,
        "seq_len": 1024,
        "hidden_size": 2048,
        "n_layer": 24,
    }
    base.update(params)
    return good_spec(
        parameters=base,
        command=["python", "t.py", "--lr", "{lr}"],
        knobs={
            "learning_rate": "lr",
            "micro_batch": "micro_batch_size",
            "grad_accum": "grad_accum",
        },
    )


def test_memory_estimate_terms():
    """Weights, gradients and optimiser states follow params × bytes; activations add 34·s·b·h·L."""
    est = estimate_memory(ExperimentSpec.model_validate(big_model()))
    assert est is not None and est.bytes_per_param == 16
    assert est.weights_gib == pytest.approx(1.3e9 * 6 / 2**30, abs=0.01)
    assert est.optimizer_gib == pytest.approx(1.3e9 * 8 / 2**30, abs=0.01)
    assert est.activations_gib == pytest.approx(34 * 1024 * 64 * 2048 * 24 / 2**30, abs=0.01)
    assert est.total_gib == pytest.approx(121.37, abs=0.05)


def test_memory_over_target_suggests_smaller_micro_batch(ctx):
    """Over the GPU's memory: an error, and the knob change that fits with the same effective batch."""
    out = config_validator(ctx, {"spec": big_model(), "gpu_memory_gib": 80})
    assert not out.valid and fields(out.errors) == ["parameters"]
    assert "exceeds" in out.errors[0].message
    assert any("`micro_batch_size` 64 → 32 with `grad_accum` 1 → 2" in s for s in out.suggestions)
    assert out.estimate is not None and out.estimate.target_gpu_memory_gib == 80


def test_memory_that_no_batch_fixes_suggests_sharding(ctx):
    """When weights and optimiser states alone do not fit, a smaller batch is not offered."""
    out = config_validator(ctx, {"spec": big_model(params_millions=7000), "gpu_memory_gib": 80})
    assert not out.valid
    assert not any("→" in s for s in out.suggestions) and any("FSDP" in s for s in out.suggestions)


def test_memory_target_from_latest_healthy_gpu_sample(ctx):
    """Without a target, the smallest healthy GPU recorded by gpu_health_check is the target."""
    with ctx.store.session() as s:
        s.add(
            GpuSample(
                gpu_index=0,
                uuid="a",
                verdict="OK",
                taken_at=NOW,
                data={"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559},
            )
        )
        s.add(
            GpuSample(
                gpu_index=1,
                uuid="b",
                verdict="OK",
                taken_at=datetime(2026, 12, 1),
                data={"name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960},
            )
        )
        s.add(
            GpuSample(
                gpu_index=1,
                uuid="b",
                verdict="CRITICAL",
                taken_at=NOW,
                data={"name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960},
            )
        )
    out = config_validator(ctx, {"spec": big_model(micro_batch_size=16)})
    assert out.estimate is not None
    assert out.estimate.target_gpu_memory_gib == pytest.approx(81559 / 1024)
    assert "H100" in (out.estimate.target_source or "")
    assert out.valid


def test_memory_without_target_is_only_an_estimate(ctx):
    """No target GPU known: the estimate is returned and nothing is judged against it."""
    out = config_validator(ctx, {"spec": big_model()})
    assert out.valid and out.estimate is not None and out.estimate.target_gpu_memory_gib is None


def test_paths_outside_allowed_mounts_are_advice(tmp_path):
    """With the policy's mount roots, outside paths warn (the policy, not the skill, blocks)."""
    ctx = SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"),
        settings=Settings(home=str(tmp_path)),
        now=NOW,
        policy_limits={"allowed_mount_roots": ["/data"]},
    )
    params = {
        **good_spec()["parameters"],
        "data_dir": "/scratch/imagenet",
        "out_dir": "/data/runs/x",
    }
    out = config_validator(ctx, {"spec": good_spec(parameters=params)})
    assert out.valid and fields(out.warnings) == ["parameters.data_dir"]
    bare = SkillContext(store=ctx.store, settings=ctx.settings, now=NOW)
    assert config_validator(bare, {"spec": good_spec(parameters=params)}).warnings == []


def test_exactly_one_source(ctx):
    """Both or neither of spec and path is an argument error for the planner."""
    with pytest.raises(SkillInputError):
        config_validator(ctx, {})
    with pytest.raises(SkillInputError):
        config_validator(ctx, {"spec": good_spec(), "path": "x.yaml"})
