"""config_validator: schema errors with field paths and lines, then the engineering checks."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import BadArguments
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.store.db import GpuSample
from nightshift.runtime.training.training_configs import TrainingView
from nightshift.skills.base import SkillContext
from nightshift.skills.config_validator import SCHEMA_FIRST, config_validator, estimate_memory

from conftest import empty_store, nightshift, run_skill

NOW = datetime(2026, 12, 2, 3, 0)


@pytest.fixture
def ctx(tmp_path: Path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"), settings=Settings(home=str(tmp_path)), now=NOW
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
        "stall_min": 30,  # it reports no steps: without this a hang would hold its GPU
    }
    spec.update(over)
    return spec


def fields(findings: list) -> list[str | None]:
    return [f.field for f in findings]


def test_valid_spec_has_no_findings(ctx):
    """A careful spec passes with no errors, warnings or suggestions."""
    out = run_skill(config_validator, ctx, {"spec": good_spec()})
    assert out.valid and out.errors == [] and out.warnings == [] and out.suggestions == []
    assert out.estimate is None


def test_schema_errors_name_field_path_and_line(ctx, tmp_path):
    """Every schema error names its field path and, from a file, the line it is on."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: bad\ncommand: [python, train.py]\nretries: -1\nresources:\n  gpus: two\npriorty: 3\n"
    )
    out = run_skill(config_validator, ctx, {"path": str(path)})
    assert not out.valid
    found = {(f.field, f.line) for f in out.errors}
    assert found == {("retries", 3), ("resources.gpus", 5), ("priorty", 6)}
    assert out.warnings == [] and "schema" in out.suggestions[0]


def test_schema_errors_from_a_mapping_have_paths_but_no_lines(ctx):
    """A spec passed as a mapping has no lines; the field path still says where."""
    out = run_skill(config_validator, ctx, {"spec": good_spec(command="python train.py --lr 1")})
    assert not out.valid and fields(out.errors) == ["command"] and out.errors[0].line is None


def test_unreadable_file_is_an_error(ctx, tmp_path):
    """A missing file or broken YAML is reported as an error, with the line where YAML broke."""
    assert not run_skill(config_validator, ctx, {"path": str(tmp_path / "nope.yaml")}).valid
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ncommand: [a, b\n")
    out = run_skill(config_validator, ctx, {"path": str(broken)})
    assert not out.valid and out.errors[0].line is not None


def test_json_spec_file(ctx, tmp_path):
    """JSON spec files are read the same way as YAML."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(good_spec()))
    assert run_skill(config_validator, ctx, {"path": str(path)}).valid


def test_missing_script_and_workdir_are_errors(ctx, tmp_path):
    """A command naming a script that is not there fails validation, before anything launches."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = good_spec(code={"path": str(tmp_path)}, environment={})
    assert run_skill(config_validator, ctx, {"spec": spec}).valid
    spec["command"] = ["python", "trian.py", "--lr", "{lr}", "--seed", "{seed}"]
    out = run_skill(config_validator, ctx, {"spec": spec})
    assert (
        not out.valid
        and fields(out.errors) == ["command.1"]
        and "trian.py" in out.errors[0].message
    )
    missing = good_spec(code={"path": str(tmp_path / "nowhere")}, environment={})
    assert fields(run_skill(config_validator, ctx, {"spec": missing}).errors) == ["code.path"]


def test_script_resolved_against_the_spec_file(ctx, tmp_path):
    """A relative code path resolves against the spec file's folder; `python -m module` is not a file."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    spec = good_spec(code={"path": "src"}, environment={})
    spec["command"] = ["python", "train.py", "-m", "x.py", "--lr", "{lr}", "--seed", "{seed}"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert run_skill(config_validator, ctx, {"path": str(path)}).valid


def test_unfilled_placeholder_is_an_error(ctx):
    """A {placeholder} that no parameter fills would fail at launch: an error with a fix."""
    spec = good_spec(
        command=["python", "train.py", "--epochs", "{epochs}", "--ckpt", "{checkpoint_dir}"]
    )
    out = run_skill(config_validator, ctx, {"spec": spec})
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
    assert run_skill(config_validator, ctx, {"spec": spec}).valid


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
    out = run_skill(config_validator, ctx, {"spec": good_spec(environment={"image": image})})
    assert out.valid
    assert ("environment.image" in fields(out.warnings)) is floating


def test_missing_seed_warns(ctx):
    """Without a seed a rerun or a resumed attempt is not reproducible."""
    params = {"lr": 3e-4, "optimizer": "adamw", "micro_batch_size": 32}
    spec = good_spec(parameters=params, command=["python", "t.py", "--lr", "{lr}"])
    out = run_skill(config_validator, ctx, {"spec": spec})
    assert out.valid and fields(out.warnings) == ["seed"]
    assert run_skill(config_validator, ctx, {"spec": {**spec, "seed": 7}}).warnings == []


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
    out = run_skill(config_validator, ctx, {"spec": good_spec(parameters=params)})
    assert ("parameters.lr" in fields(out.warnings)) is warns


def test_retries_without_checkpoint_warns(ctx):
    """Retries without a checkpoint dir restart from step 0 every time."""
    spec = good_spec()
    del spec["checkpoint"]
    out = run_skill(config_validator, ctx, {"spec": spec})
    assert fields(out.warnings) == ["checkpoint"]
    assert run_skill(config_validator, ctx, {"spec": {**spec, "retries": 0}}).warnings == []


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
    out = run_skill(config_validator, ctx, {"spec": big_model(), "gpu_memory_gib": 80})
    assert not out.valid and fields(out.errors) == ["parameters"]
    assert "exceeds" in out.errors[0].message
    assert any("`micro_batch_size` 64 → 32 with `grad_accum` 1 → 2" in s for s in out.suggestions)
    assert out.estimate is not None and out.estimate.target_gpu_memory_gib == 80


def test_memory_that_no_batch_fixes_suggests_sharding(ctx):
    """When weights and optimiser states alone do not fit, a smaller batch is not offered."""
    out = run_skill(
        config_validator, ctx, {"spec": big_model(params_millions=7000), "gpu_memory_gib": 80}
    )
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
    out = run_skill(config_validator, ctx, {"spec": big_model(micro_batch_size=16)})
    assert out.estimate is not None
    assert out.estimate.target_gpu_memory_gib == pytest.approx(81559 / 1024)
    assert "H100" in (out.estimate.target_source or "")
    assert out.valid


def test_memory_without_target_is_only_an_estimate(ctx):
    """No target GPU known: the estimate is returned and nothing is judged against it."""
    out = run_skill(config_validator, ctx, {"spec": big_model()})
    assert out.valid and out.estimate is not None and out.estimate.target_gpu_memory_gib is None


def test_paths_outside_allowed_mounts_are_advice(tmp_path):
    """With the policy's mount roots, outside paths warn (the policy, not the skill, blocks)."""
    ctx = SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=NOW,
        policy_limits={"allowed_mount_roots": ["/data"]},
    )
    params = {
        **good_spec()["parameters"],
        "data_dir": "/scratch/imagenet",
        "out_dir": "/data/runs/x",
    }
    out = run_skill(config_validator, ctx, {"spec": good_spec(parameters=params)})
    assert out.valid and fields(out.warnings) == ["parameters.data_dir"]
    bare = SkillContext(store=ctx.store, settings=ctx.settings, now=NOW)
    assert run_skill(config_validator, bare, {"spec": good_spec(parameters=params)}).warnings == []


def test_exactly_one_source(ctx):
    """Both or neither of spec and path is an argument error for the planner."""
    with pytest.raises(BadArguments):
        run_skill(config_validator, ctx, {})
    with pytest.raises(BadArguments):
        run_skill(config_validator, ctx, {"spec": good_spec(), "path": "x.yaml"})


# ------------------------------------------------------------ the configs people actually write
CONFIGS = Path(__file__).parent / "fixtures" / "configs"
GIB = 2**30
LLAMA3_8B = 8_030_261_248


def derived(tmp_path: Path, fixture: str, name: str, *replacements: tuple[str, str]) -> Path:
    """A copy of a real config with some lines changed, for the what-if cases."""
    text = (CONFIGS / fixture).read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / name
    out.write_text(text)
    return out


def litgpt_full(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    """The LitGPT LoRA config with its lora_* keys removed: a full fine-tune of Llama-3.1-8B."""
    text = (CONFIGS / "litgpt__llama-3.1-8b_lora.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("lora_"))
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / "full.yaml"
    out.write_text(text)
    return out


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
)
def test_real_configs_validate_on_a_24_gib_gpu(ctx, name):
    """Every real config validates (warnings allowed) and comes back with its view."""
    out = run_skill(config_validator, ctx, {"path": str(CONFIGS / name), "gpu_memory_gib": 24})
    assert out.valid, out.errors
    assert out.view is not None and out.view.path == str(CONFIGS / name)


def test_axolotl_memory_by_hand(ctx):
    """The axolotl LoRA config's estimate matches the arithmetic done by hand."""
    # Llama-3-8B LoRA, int8 base, bf16 "auto" (assumed bf16), 8-bit AdamW, micro-batch 2,
    # sequence 4096, activation checkpointing on:
    #   frozen base   8,030,261,248 × 1 byte (int8)                      = 8,030,261,248
    #   trained       83,886,080 adapters + 1,050,673,152 embed/head     = 1,134,559,232 params
    #     weights     × 2 (bf16) = 2,269,118,464; gradients × 2 = 2,269,118,464
    #     optimizer   × 2 states × 1 byte (8-bit)                        = 2,269,118,464
    #   activations   (2·32 + 34) · 4096 · 2 · 4096                      = 3,288,334,336
    #   logits        4096 · 2 · 128256 · 4 bytes                        = 4,202,692,608
    #   total                                                            = 22,328,643,584 B
    out = run_skill(
        config_validator,
        ctx,
        {"path": str(CONFIGS / "axolotl__llama-3_lora-8b.yml"), "gpu_memory_gib": 24},
    )
    est = out.estimate
    assert est is not None and est.precision == "bf16"
    trained = 1_134_559_232
    assert est.trainable_params_millions == pytest.approx(trained / 1e6)
    assert est.weights_gib == pytest.approx((LLAMA3_8B * 1 + trained * 2) / GIB, abs=0.01)
    assert est.gradients_gib == pytest.approx(trained * 2 / GIB, abs=0.01)
    assert est.optimizer_gib == pytest.approx(trained * 2 * 1 / GIB, abs=0.01)
    activations = (2 * 32 + 34) * 4096 * 2 * 4096 + 4096 * 2 * 128256 * 4
    assert est.activations_gib == pytest.approx(activations / GIB, abs=0.01)
    assert est.total_gib == pytest.approx(22_328_643_584 / GIB, abs=0.01)
    assert est.activation_checkpointing and any('"auto"' in a for a in est.assumptions)


def test_lora_8b_fits_24_gib_full_fine_tune_does_not(ctx, tmp_path):
    """LoRA on an 8B model fits a 24 GiB GPU at micro-batch 1; a full AdamW fine-tune does not."""
    # LitGPT Llama-3.1-8B, bf16-true, micro-batch 1, sequence 512, AdamW.
    # LoRA r=32 on q,v (13,631,488 trained):
    #   frozen 8,030,261,248 × 2 + trained 13,631,488 × (2 weights + 2 grads + 2·2 states)
    #   + activations 34·512·1·4096·32 + logits 512·1·128256·4 = 18,713,944,064 B ≈ 17.43 GiB.
    # Full fine-tune: 8,030,261,248 × 8 bytes = 59.83 GiB before activations.
    lora = run_skill(
        config_validator,
        ctx,
        {"path": str(CONFIGS / "litgpt__llama-3.1-8b_lora.yaml"), "gpu_memory_gib": 24},
    )
    expected = (
        LLAMA3_8B * 2
        + 13_631_488 * (2 + 2 + 2 * 2)
        + 34 * 512 * 1 * 4096 * 32
        + 512 * 1 * 128256 * 4
    )
    assert expected == 18_713_944_064
    assert lora.valid and lora.estimate is not None
    assert lora.estimate.total_gib == pytest.approx(expected / GIB, abs=0.01)
    assert lora.estimate.frozen_bytes_per_param == 2

    full = run_skill(
        config_validator, ctx, {"path": str(litgpt_full(tmp_path)), "gpu_memory_gib": 24}
    )
    assert not full.valid and full.estimate is not None
    assert full.estimate.bytes_per_param == 8
    static = full.estimate.weights_gib + full.estimate.gradients_gib + full.estimate.optimizer_gib
    assert static == pytest.approx(LLAMA3_8B * 8 / GIB, abs=0.02)
    [err] = full.errors
    assert err.field == "train.micro_batch_size" and err.line is not None
    assert "exceeds" in err.message
    # what does fit: LoRA instead of every weight (r=16 on all linear layers)
    lora_option = next(o for o in full.options if o.change == "lora")
    assert lora_option.fits and lora_option.total_gib < 24
    assert not any(o.change == "micro_batch" for o in full.options)  # batch 1 already


def test_zero_stages_shard_across_gpus():
    """ZeRO 1/2/3 divide states, gradients and weights by the GPU count; offload moves them."""
    # 1 B parameters, bf16 mixed precision, AdamW (2+4+2+8 bytes), 4 GPUs; per GPU, in GB:
    # stage 0: weights 2+4, grads 2, states 8 = 16; stage 1: 2+4/4, 2, 8/4 = 7;
    # stage 2: 3, 2/4, 2 = 5.5; stage 3: 2/4+1, 0.5, 2 = 4; stage 3 + optimizer offload: 0.5+0.5 = 1
    # on the GPU and 3 (master 1 + states 2) on the host; + parameter offload: 0.5 on the GPU.
    base = TrainingView(
        source_format="deepspeed",
        params=10**9,
        precision="bf16-mixed",
        optimizer="AdamW",
        devices=4,
    )

    def gb(**update: Any) -> tuple[float, float]:
        """(GPU, host) in GB; the estimate rounds to 0.01 GiB."""
        est = estimate_memory(base.model_copy(update=update))
        assert est is not None
        return est.total_gib * GIB / 1e9, est.host_offload_gib * GIB / 1e9

    def near(*expected: float):
        return pytest.approx(expected, abs=0.011)

    assert gb() == near(16.0, 0.0)
    assert gb(zero_stage=1) == near(7.0, 0.0)
    assert gb(zero_stage=2) == near(5.5, 0.0)
    assert gb(zero_stage=3) == near(4.0, 0.0)
    assert gb(zero_stage=3, offload_optimizer=True) == near(1.0, 3.0)
    assert gb(zero_stage=3, offload_optimizer=True, offload_params=True) == near(0.5, 3.5)
    unsharded = estimate_memory(base.model_copy(update={"zero_stage": 3, "devices": None}))
    assert unsharded is not None and any("no sharding" in a for a in unsharded.assumptions)


def test_smaller_micro_batch_keeps_the_global_batch(ctx, tmp_path):
    """Halving the micro-batch doubles the accumulation, so the global batch stays what it was."""
    # LitGPT full fine-tune on 2 GPUs, global batch 64, micro-batch 4, sequence 2048, 80 GiB GPU:
    # 4 → 2 with accumulation 8 → 16 fits, and 2 × 16 × 2 GPUs is still 64.
    path = litgpt_full(
        tmp_path,
        ("devices: 1", "devices: 2"),
        ("global_batch_size: 8", "global_batch_size: 64"),
        ("micro_batch_size: 1", "micro_batch_size: 4"),
        ("max_seq_length: 512", "max_seq_length: 2048"),
    )
    out = run_skill(config_validator, ctx, {"path": str(path), "gpu_memory_gib": 80})
    assert out.view is not None and out.view.grad_accum == 8 and not out.valid
    option = next(o for o in out.options if o.change == "micro_batch")
    assert (
        option.fits and option.settings["micro_batch"] == 2 and option.settings["grad_accum"] == 16
    )
    assert option.global_batch == 64 == 2 * 16 * 2
    assert any(
        "`train.micro_batch_size` 4 → 2 with gradient accumulation 8 → 16" in s
        and "same global batch 64" in s
        for s in out.suggestions
    )
    # also offered, each with its own estimate: checkpointing and a higher ZeRO stage
    changes = {o.change: o for o in out.options}
    assert "activation_checkpointing" in changes and "zero_stage" in changes
    assert changes["zero_stage"].total_gib < out.estimate.total_gib


def test_axolotl_micro_batch_suggestion_names_its_keys(ctx, tmp_path):
    """An axolotl suggestion names the file's own keys and keeps micro-batch × accumulation."""
    # Full fine-tune at micro-batch 8 without checkpointing: 8 × 4 = new micro × new accumulation.
    path = derived(
        tmp_path,
        "axolotl__llama-3_lora-8b.yml",
        "a.yml",
        ("adapter: lora", "adapter:"),
        ("load_in_8bit: true", "load_in_8bit: false"),
        ("micro_batch_size: 2", "micro_batch_size: 8"),
        ("gradient_checkpointing: true", "gradient_checkpointing: false"),
    )
    out = run_skill(config_validator, ctx, {"path": str(path), "gpu_memory_gib": 80})
    assert not out.valid
    option = next(o for o in out.options if o.change == "micro_batch")
    assert option.settings["micro_batch"] * option.settings["grad_accum"] == 8 * 4
    assert any(
        "`micro_batch_size` 8 →" in s and "`gradient_accumulation_steps` 4 →" in s
        for s in out.suggestions
    )
    ckpt = next(o for o in out.options if o.change == "activation_checkpointing")
    assert "gradient_checkpointing: true" in ckpt.text and ckpt.fits


@pytest.mark.parametrize(
    ("lora", "lr", "warns"),
    [
        (True, "0.0002", False),  # the file's own: LoRA at 2e-4
        (True, "0.002", True),  # LoRA above 1e-3
        (False, "0.0002", False),  # full fine-tune at 2e-4: the top of the usual range
        (False, "0.0005", True),  # full fine-tune at 5e-4: high for pretrained weights
    ],
)
def test_learning_rate_depends_on_fine_tune_or_lora(ctx, tmp_path, lora, lr, warns):
    """The same AdamW rate is fine for LoRA adapters and high for a full fine-tune."""
    if lora:
        path = derived(
            tmp_path, "litgpt__llama-3.1-8b_lora.yaml", "l.yaml", ("lr: 0.0002", f"lr: {lr}")
        )
    else:
        path = litgpt_full(tmp_path, ("lr: 0.0002", f"lr: {lr}"))
    out = run_skill(config_validator, ctx, {"path": str(path), "gpu_memory_gib": 141})
    lr_warnings = [w for w in out.warnings if w.field == "optimizer.init_args.lr"]
    assert bool(lr_warnings) is warns
    if warns:
        assert lr_warnings[0].line is not None
        assert ("LoRA" in lr_warnings[0].message) is lora


def test_learning_rate_from_scratch_allows_more(ctx, tmp_path):
    """A pretraining config (no checkpoint to start from) at 6e-4 with AdamW is usual."""
    p = tmp_path / "pretrain.yaml"
    p.write_text(
        "model_name: tiny\nmodel_config:\n  n_embd: 256\n  n_layer: 4\n  n_head: 4\n"
        "  padded_vocab_size: 1024\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 8\n"
        "optimizer:\n  class_path: torch.optim.AdamW\n  init_args:\n    lr: 6e-4\n"
    )
    out = run_skill(config_validator, ctx, {"path": str(p), "gpu_memory_gib": 24})
    assert out.valid and out.view is not None and out.view.init == "scratch"
    assert out.warnings == []


def test_deepspeed_batch_contradiction_is_an_error(ctx, tmp_path):
    """A DeepSpeed batch triple no GPU count can satisfy makes the config invalid, with its line."""
    cfg = json.loads((CONFIGS / "accelerate__zero_stage3_offload_config.json").read_text())
    cfg.update(train_batch_size=65, train_micro_batch_size_per_gpu=4)
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg, indent=4))
    out = run_skill(config_validator, ctx, {"path": str(p)})
    assert not out.valid and [(e.field, e.line) for e in out.errors] == [("train_batch_size", 49)]


def test_auto_values_skip_checks_that_need_them(ctx):
    """DeepSpeed "auto": no learning-rate verdict and no memory estimate, no error either."""
    out = run_skill(
        config_validator,
        ctx,
        {"path": str(CONFIGS / "accelerate__zero_stage3_offload_config.json")},
    )
    assert out.valid and out.warnings == [] and out.estimate is None
    assert out.view is not None and "optimizer.params.lr" in out.view.auto_fields


def test_config_seed_placeholders_and_mounts(tmp_path):
    """On a config, no fixed seed, an unexpanded ${…} and a path outside the mounts are warnings."""
    ctx = SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=NOW,
        policy_limits={"allowed_mount_roots": ["/data"]},
    )
    d2 = run_skill(config_validator, ctx, {"path": str(CONFIGS / "detectron2__Base-RCNN-FPN.yaml")})
    assert d2.valid and fields(d2.warnings) == ["SEED"]
    path = derived(
        tmp_path,
        "axolotl__llama-3_lora-8b.yml",
        "a.yml",
        ("output_dir: ./outputs/lora-out", "output_dir: /scratch/${RUN}/out"),
    )
    out = run_skill(config_validator, ctx, {"path": str(path), "gpu_memory_gib": 24})
    assert out.valid
    assert sorted(fields(out.warnings)) == ["output_dir", "output_dir"]
    messages = " ".join(w.message for w in out.warnings)
    assert "${RUN}" in messages and "outside the allowed mount roots" in messages


def test_unrecognised_file_is_checked_as_a_spec(ctx, tmp_path):
    """A mapping that is no known format gets the spec's schema errors and a hint saying so."""
    p = tmp_path / "x.yaml"
    p.write_text("train:\n  epochs: 3\n")
    out = run_skill(config_validator, ctx, {"path": str(p)})
    assert not out.valid and "name" in fields(out.errors)
    assert out.suggestions[0] == SCHEMA_FIRST and "not a recognised" in out.suggestions[1]


def test_spec_gets_a_view_and_a_table_count(ctx):
    """An experiment spec naming a known model gets its count from the table and an estimate."""
    spec = good_spec()
    spec["parameters"] = {**spec["parameters"], "model": "gpt2", "precision": "fp32"}
    out = run_skill(config_validator, ctx, {"spec": spec})
    assert out.valid and out.view is not None and out.view.params_source == "table"
    assert out.estimate is not None
    assert out.estimate.params_millions == pytest.approx(124.439808)
    assert out.estimate.bytes_per_param == 4 + 4 + 4 * 2  # fp32 weights, grads, Adam's 2 states


# ------------------------------------------------------------------------------ the command line
def test_cli_validates_a_real_config(home):
    """`nightshift validate` prints the view and exits 0 for a valid config."""
    res = nightshift(
        "validate", str(CONFIGS / "axolotl__llama-3_lora-8b.yml"), "--gpu-memory", "24"
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "axolotl" in out and "NousResearch/Meta-Llama-3-8B" in out and "0.0002" in out
    assert "8.03 B (table)" in out and "gradient_accumulation_steps (line 39)" in out
    assert "valid: 0 error(s)" in out


def test_cli_json_and_invalid_exit_code(home, tmp_path):
    """--json prints the result model; a config over the GPU's memory exits 2 with suggestions."""
    res = nightshift("validate", str(CONFIGS / "litgpt__llama-3.1-8b_lora.yaml"), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["view"]["source_format"] == "litgpt" and data["view"]["lora"]["rank"] == 32

    res = nightshift("validate", str(litgpt_full(tmp_path)), "--gpu-memory", "24")
    assert res.returncode == 2
    assert "exceeds" in res.stdout and "suggestion" in res.stdout and "invalid" in res.stdout


def test_cli_goes_through_the_policy_gate(home):
    """The call is audited as the local user with a cli- call id, like `nightshift skill`."""
    res = nightshift("validate", str(CONFIGS / "accelerate__multi_gpu.yaml"))
    assert res.returncode == 0, res.stderr
    audit = json.loads(nightshift("audit", "show", "--json").stdout)
    calls = [e for e in audit if e["skill"] == "config_validator"]
    assert {e["action"] for e in calls} >= {"policy.verdict", "skill.start", "skill.result"}
    assert all(e["call_id"].startswith("cli-") for e in calls)


def test_cli_missing_file(home, tmp_path):
    """A file that is not there is one clear error and exit code 2."""
    res = nightshift("validate", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "no such file" in res.stderr
