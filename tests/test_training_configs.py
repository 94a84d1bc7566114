"""training_configs: real accelerate, DeepSpeed, axolotl, LitGPT and detectron2 configs (copied with
their attribution into tests/fixtures/configs) read into one view, with the numbers they hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nightshift.runtime.errors import SpecError
from nightshift.runtime.spec import ExperimentSpec
from nightshift.runtime.training.training_configs import (
    MODEL_TABLE,
    LoraView,
    TrainingView,
    detect_format,
    load_training_view,
    lookup_model,
    lora_trainable_params,
    params_from_dimensions,
    read_config,
    view_from_spec,
)

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
REAL = {
    "accelerate__multi_gpu.yaml": "accelerate",
    "accelerate__deepspeed.yaml": "accelerate",
    "accelerate__zero_stage3_offload_config.json": "deepspeed",
    "axolotl__llama-3_lora-8b.yml": "axolotl",
    "litgpt__llama-3.1-8b_lora.yaml": "litgpt",
    "detectron2__Base-RCNN-FPN.yaml": "detectron2",
    "detectron2__COCO-Detection_faster_rcnn_R_50_FPN_1x.yaml": "detectron2",
}
LLAMA3_8B = 8_030_261_248


def view_of(name: str) -> TrainingView:
    return load_training_view(CONFIGS / name)


def test_fixtures_are_exactly_the_attributed_files():
    """Every real config in the fixture folder is listed in its SOURCES.md, and nothing else is."""
    listed = (CONFIGS / "SOURCES.md").read_text()
    files = {p.name for p in CONFIGS.iterdir() if p.name != "SOURCES.md"}
    assert files == set(REAL)
    assert all(f"`{name}`" in listed for name in files)


@pytest.mark.parametrize(("name", "fmt"), sorted(REAL.items()))
def test_every_real_config_loads_and_is_detected(name, fmt):
    """Each real config is detected as its format and loads with no error-level issue."""
    doc = read_config(CONFIGS / name)
    assert detect_format(CONFIGS / name, doc.data) == fmt
    view = view_of(name)
    assert view.source_format == fmt
    assert [i for i in view.issues if i.severity == "error"] == []


def test_accelerate_multi_gpu():
    """accelerate MULTI_GPU: 2 processes in bf16 autocast; the model and batch live elsewhere."""
    v = view_of("accelerate__multi_gpu.yaml")
    assert (v.devices, v.precision) == (2, "bf16-mixed")
    assert v.sources["precision"].key == "mixed_precision" and v.sources["precision"].line == 4
    assert v.model is None and v.params is None and v.params_source == "unknown"
    assert v.micro_batch is None and v.learning_rate is None
    assert any("training script" in n for n in v.notes)


def test_accelerate_deepspeed_with_its_json_missing():
    """The DeepSpeed file it references is not beside it: a warning on that line, stage unknown."""
    v = view_of("accelerate__deepspeed.yaml")
    assert v.devices == 2 and v.zero_stage is None and v.precision is None
    [issue] = v.issues
    assert issue.severity == "warning"
    assert issue.key == "deepspeed_config.deepspeed_config_file" and issue.line == 6
    assert "zero_stage1_config.json" in issue.message


def test_accelerate_reads_the_deepspeed_json_it_references(tmp_path):
    """The DeepSpeed JSON an accelerate config names is read, and the global batch derived."""
    # Laid out as in the accelerate repository; global = micro 4 × accumulation 2 × 2 processes.
    (tmp_path / "config_yaml_templates").mkdir()
    (tmp_path / "deepspeed_config_templates").mkdir()
    shutil.copy(
        CONFIGS / "accelerate__deepspeed.yaml",
        tmp_path / "config_yaml_templates" / "deepspeed.yaml",
    )
    ds = {
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-5}},
        "zero_optimization": {"stage": 1},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "train_batch_size": "auto",
    }
    json_path = tmp_path / "deepspeed_config_templates" / "zero_stage1_config.json"
    json_path.write_text(json.dumps(ds, indent=2))
    v = load_training_view(tmp_path / "config_yaml_templates" / "deepspeed.yaml")
    assert v.issues == []
    assert (v.devices, v.zero_stage, v.precision) == (2, 1, "bf16-mixed")
    assert (v.micro_batch, v.grad_accum, v.global_batch) == (4, 2, 4 * 2 * 2)
    assert v.sources["global_batch"].derived and v.optimizer == "AdamW"
    assert v.learning_rate == 3e-5 and v.sources["learning_rate"].file == str(json_path.resolve())
    assert "zero_stage1_config.json:train_batch_size" in v.auto_fields


def test_deepspeed_zero3_offload_with_auto_values():
    """DeepSpeed ZeRO-3 offload JSON: every "auto" stays unknown and is listed by its key path."""
    v = view_of("accelerate__zero_stage3_offload_config.json")
    assert (v.precision, v.optimizer, v.zero_stage) == ("fp16-mixed", "AdamW", 3)
    assert v.offload_optimizer is True and v.offload_params is True
    assert v.grad_accum == 1
    assert v.learning_rate is None and v.sources["learning_rate"].auto
    assert v.micro_batch is None and v.global_batch is None and v.devices is None
    assert v.auto_fields == [
        "optimizer.params.lr",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "gradient_clipping",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
    ]


def _deepspeed(tmp_path: Path, **batch) -> TrainingView:
    cfg = json.loads((CONFIGS / "accelerate__zero_stage3_offload_config.json").read_text())
    cfg.update(batch)
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg, indent=4))
    return load_training_view(p)


def test_deepspeed_batch_triple_gives_the_gpu_count(tmp_path):
    """train_batch_size = micro × accumulation × GPUs: given all three, the GPU count follows."""
    v = _deepspeed(
        tmp_path,
        train_batch_size=64,
        train_micro_batch_size_per_gpu=4,
        gradient_accumulation_steps=2,
    )
    assert (v.global_batch, v.micro_batch, v.grad_accum, v.devices) == (64, 4, 2, 64 // (4 * 2))
    assert v.sources["devices"].derived and v.issues == []


def test_deepspeed_batch_triple_that_cannot_hold_is_an_error(tmp_path):
    """A train_batch_size that no GPU count makes whole is an error DeepSpeed would raise."""
    v = _deepspeed(
        tmp_path,
        train_batch_size=65,
        train_micro_batch_size_per_gpu=4,
        gradient_accumulation_steps=2,
    )
    [issue] = v.issues
    assert issue.severity == "error" and issue.key == "train_batch_size" and issue.line == 49


def test_axolotl_llama3_lora():
    """axolotl: the file's numbers, LoRA, 8-bit base, bf16 "auto" and Llama-3-8B's table shape."""
    v = view_of("axolotl__llama-3_lora-8b.yml")
    assert v.model == "NousResearch/Meta-Llama-3-8B" and v.init == "pretrained"
    assert (v.params, v.params_source) == (LLAMA3_8B, "table")
    assert (v.hidden, v.layers, v.heads, v.kv_heads, v.vocab) == (4096, 32, 32, 8, 128256)
    assert (v.learning_rate, v.optimizer) == (0.0002, "adamw_bnb_8bit")
    assert (v.micro_batch, v.grad_accum, v.epochs, v.seq_len) == (2, 4, 4, 4096)
    assert v.devices is None and v.global_batch is None  # the launcher picks the GPU count
    assert v.quantization == "int8" and v.activation_checkpointing is True
    assert v.precision is None and v.auto_fields == ["bf16"] and v.sources["precision"].auto
    assert v.lora is not None
    assert (v.lora.rank, v.lora.alpha, v.lora.dropout) == (32, 16, 0.05)
    assert v.lora.targets == ["all-linear"]
    assert v.lora.modules_to_save == ["embed_tokens", "lm_head"]
    assert v.seed == 42 and v.sources["seed"].default  # HF TrainingArguments' default
    assert v.sources["micro_batch"].key == "micro_batch_size"
    assert v.sources["micro_batch"].line == 40
    assert v.paths == {"output_dir": "./outputs/lora-out"}


def test_litgpt_llama31_lora():
    """LitGPT: nested train/optimizer sections; accumulation follows from the global batch."""
    v = view_of("litgpt__llama-3.1-8b_lora.yaml")
    assert v.model == "meta-llama/Meta-Llama-3.1-8B" and v.init == "pretrained"
    assert (v.params, v.params_source) == (LLAMA3_8B, "table")
    assert (v.precision, v.devices) == ("bf16", 1)  # bf16-true: pure bf16
    assert (v.global_batch, v.micro_batch, v.epochs, v.seq_len) == (8, 1, 2, 512)
    assert v.grad_accum == 8 // 1 // 1 and v.sources["grad_accum"].derived
    assert (v.optimizer, v.learning_rate) == ("torch.optim.AdamW", 0.0002)
    assert v.sources["learning_rate"].key == "optimizer.init_args.lr"
    assert v.max_steps is None and v.seed == 1337
    assert v.lora is not None
    assert (v.lora.rank, v.lora.alpha, v.lora.dropout) == (32, 16, 0.05)
    assert v.lora.targets == ["q", "v"]


def test_detectron2_base_is_merged():
    """detectron2: _BASE_ resolves (here to the flattened copy beside it) and its SOLVER shows."""
    v = view_of("detectron2__COCO-Detection_faster_rcnn_R_50_FPN_1x.yaml")
    base = str((CONFIGS / "detectron2__Base-RCNN-FPN.yaml").resolve())
    assert (v.learning_rate, v.global_batch, v.max_steps) == (0.02, 16, 90000)
    assert v.sources["learning_rate"].file == base and v.sources["learning_rate"].line == 37
    assert (v.optimizer, v.momentum, v.precision) == ("SGD", 0.9, "fp32")
    assert v.micro_batch is None  # IMS_PER_BATCH is split over --num-gpus at launch
    assert v.init == "pretrained"
    assert v.init_from == "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
    assert v.model == "GeneralizedRCNN (ResNet-50 FPN backbone)" and v.model_kind == "cnn"
    assert v.params == 25_557_032 and v.params_source == "table"
    assert v.seed is None and any("SEED -1" in n for n in v.notes)
    assert any("flattened copy" in n for n in v.notes)
    assert v.files[1] == base


def test_detectron2_base_in_the_repository_layout(tmp_path):
    """In detectron2's own layout _BASE_ resolves against the file's folder; the child wins."""
    (tmp_path / "configs" / "COCO-Detection").mkdir(parents=True)
    shutil.copy(
        CONFIGS / "detectron2__Base-RCNN-FPN.yaml", tmp_path / "configs" / "Base-RCNN-FPN.yaml"
    )
    child = tmp_path / "configs" / "COCO-Detection" / "faster_rcnn_R_50_FPN_1x.yaml"
    text = (CONFIGS / "detectron2__COCO-Detection_faster_rcnn_R_50_FPN_1x.yaml").read_text()
    child.write_text(text + "SOLVER:\n  BASE_LR: 0.01\nSEED: 7\n")
    v = load_training_view(child)
    assert (v.learning_rate, v.global_batch, v.max_steps, v.seed) == (0.01, 16, 90000, 7)
    assert v.sources["learning_rate"].file == str(child)
    assert not any("flattened" in n for n in v.notes)


def test_detectron2_missing_base_is_an_error(tmp_path):
    """A _BASE_ that is nowhere is an error naming the field and line."""
    p = tmp_path / "x.yaml"
    p.write_text('MODEL:\n  WEIGHTS: ""\n_BASE_: "../nowhere.yaml"\n')
    with pytest.raises(SpecError) as exc:
        load_training_view(p)
    assert exc.value.field == "_BASE_" and exc.value.line == 3


def test_detectron2_defaults_without_base(tmp_path):
    """Keys a config leaves out take detectron2's documented defaults, marked as defaults."""
    p = tmp_path / "x.yaml"
    p.write_text("MODEL:\n  META_ARCHITECTURE: GeneralizedRCNN\nSOLVER:\n  STEPS: (50000,)\n")
    v = load_training_view(p)
    assert (v.learning_rate, v.global_batch, v.max_steps) == (0.001, 16, 40000)
    assert v.sources["learning_rate"].default and v.init == "scratch"
    [issue] = v.issues  # the LR step at 50000 lies past MAX_ITER 40000
    assert issue.key == "SOLVER.STEPS" and issue.severity == "warning"


def test_model_table_counts_match_published_dimensions():
    """Every transformer row's count is the sum of the weight shapes of its published config."""
    # Llama-3-8B by hand: per layer q,o 2·4096² + k,v 2·4096·1024 + MLP 3·4096·14336
    # + 2 norms·4096 = 218,112,000; × 32 layers + embedding and head 2·128256·4096
    # + final norm 4096 = 8,030,261,248.
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert per_layer == 218_112_000
    assert (
        32 * per_layer + 2 * 128256 * 4096 + 4096 == LLAMA3_8B == lookup_model("Llama-3-8B").params
    )
    for row in MODEL_TABLE:
        if row.kind != "transformer" or row.vocab is None:
            continue
        dims = params_from_dimensions(
            row.hidden,
            row.layers,
            row.vocab,
            heads=row.heads,
            kv_heads=row.kv_heads,
            intermediate=row.intermediate,
            mlp_gated=row.mlp_gated,
        )
        positions = 0 if row.mlp_gated else 1024 * row.hidden  # GPT-2's learned positions
        assert dims + positions == row.params, row.name


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("meta-llama/Meta-Llama-3-8B", "Llama-3-8B"),
        ("NousResearch/Meta-Llama-3-8B", "Llama-3-8B"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B"),
        ("checkpoints/meta-llama/Meta-Llama-3.1-8B", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("meta-llama/Llama-2-13b-chat-hf", "Llama-2-13B"),
        ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B-v0.1"),
        ("openai-community/gpt2-medium", "gpt2-medium"),
        ("R-101", "ResNet-101"),
        ("google/vit-base-patch16-224", "ViT-B/16"),
        ("my-org/secret-model-7b", None),
        ("Llama-3-8B-extended", None),
    ],
)
def test_model_names_tolerate_org_prefixes_but_do_not_guess(name, row):
    """Org prefixes and chat/instruct suffixes match the base row; anything else is unknown."""
    found = lookup_model(name)
    assert (found.name if found else None) == row


def test_unknown_model_says_unknown(tmp_path):
    """A base model the table does not know, without dimensions: the count is unknown."""
    text = (CONFIGS / "axolotl__llama-3_lora-8b.yml").read_text()
    p = tmp_path / "a.yml"
    p.write_text(text.replace("NousResearch/Meta-Llama-3-8B", "my-org/house-model-9b"))
    v = load_training_view(p)
    assert v.params is None and v.params_source == "unknown" and v.hidden is None
    assert v.lora is not None and v.lora.trainable_params is None
    assert any("not in the model table" in n for n in v.notes)


def test_dimensions_in_the_config_give_the_count(tmp_path):
    """An unlisted model's parameters are counted from the config's own model_config."""
    # GPT-style block with tied embeddings: 12·L·h² + 13·L·h + V·h + 2h.
    p = tmp_path / "pretrain.yaml"
    p.write_text(
        "model_name: tiny-house\nmodel_config:\n  n_embd: 512\n  n_layer: 8\n  n_head: 8\n"
        "  padded_vocab_size: 32000\nout_dir: out/tiny\nprecision: bf16-mixed\n"
        "train:\n  global_batch_size: 64\n  micro_batch_size: 8\n  max_seq_length: 1024\n"
        "optimizer:\n  class_path: torch.optim.AdamW\n  init_args:\n    lr: 6e-4\n"
    )
    v = load_training_view(p)
    assert v.params_source == "dimensions" and v.init == "scratch"
    assert v.params == 12 * 8 * 512**2 + 13 * 8 * 512 + 32000 * 512 + 2 * 512
    assert (v.global_batch, v.micro_batch, v.devices, v.grad_accum) == (64, 8, 1, 8)
    assert v.learning_rate == 6e-4 and v.precision == "bf16-mixed"


def test_litgpt_auto_devices_stay_unknown(tmp_path):
    """devices: auto is decided at launch, so it and the accumulation stay unknown."""
    text = (CONFIGS / "litgpt__llama-3.1-8b_lora.yaml").read_text()
    p = tmp_path / "l.yaml"
    p.write_text(text.replace("devices: 1", "devices: auto"))
    v = load_training_view(p)
    assert v.devices is None and v.sources["devices"].auto and v.grad_accum is None
    assert v.auto_fields == ["devices"]


def test_lora_adapter_sizes():
    """LoRA size is r × (in + out) per adapted matrix per layer, plus modules trained in full."""
    # LitGPT q,v on Llama-3.1-8B: q 32·(4096+4096) + v 32·(4096+1024) = 425,984 per layer × 32
    # = 13,631,488. axolotl all linear layers at r=32: 2,621,440 per layer × 32 = 83,886,080,
    # plus embed_tokens and lm_head in full, 128256·4096 each.
    litgpt = view_of("litgpt__llama-3.1-8b_lora.yaml")
    assert litgpt.lora.trainable_params == 32 * (32 * 8192 + 32 * 5120) == 13_631_488
    axolotl = view_of("axolotl__llama-3_lora-8b.yml")
    per_layer = 32 * (2 * 8192 + 2 * 5120 + 3 * (4096 + 14336))
    assert per_layer == 2_621_440
    assert axolotl.lora.trainable_params == 32 * per_layer + 2 * 128256 * 4096
    gpt2 = TrainingView(source_format="nightshift", hidden=768, layers=12, heads=12, kv_heads=12)
    assert lora_trainable_params(gpt2, LoraView(rank=8, targets=["qkv"])) == 12 * 8 * (768 + 2304)
    assert lora_trainable_params(gpt2, LoraView(rank=8, targets=["wq_custom"])) is None


def test_experiment_spec_view():
    """Our own spec maps through the knobs and the usual parameter names."""
    spec = ExperimentSpec.model_validate(
        {
            "name": "x",
            "command": ["python", "t.py"],
            "parameters": {
                "learning_rate": 3e-4,
                "bs": 16,
                "accum": 4,
                "model": "gpt2-medium",
                "precision": "bf16-mixed",
                "seq_len": 1024,
            },
            "knobs": {"micro_batch": "bs", "grad_accum": "accum"},
            "resources": {"gpus": 2},
            "seed": 3,
        }
    )
    v = view_from_spec(spec)
    assert (v.learning_rate, v.micro_batch, v.grad_accum, v.devices) == (3e-4, 16, 4, 2)
    assert v.global_batch == 16 * 4 * 2 and v.seed == 3
    assert (v.params, v.params_source, v.hidden, v.layers) == (354_823_168, "table", 1024, 24)


def test_detection_of_formats_and_non_configs():
    """Each format is told apart by its keys; a mapping that is none of them is None."""
    assert detect_format("x.yaml", {"name": "a", "command": ["python"]}) == "nightshift"
    assert detect_format("x.yaml", {"train": {"epochs": 1}}) is None
    assert detect_format("x.yaml", ["a", "list"]) is None
    with pytest.raises(SpecError):
        load_training_view(CONFIGS / "SOURCES.md")


def test_experiment_spec_lora_parameters():
    """A spec's lora_r and PEFT module names size the adapters; without targets PEFT's q,v default."""
    params = {"model": "meta-llama/Meta-Llama-3-8B", "lora_r": 16, "lora_alpha": 32}
    spec = {"name": "x", "command": ["python", "t.py"], "parameters": params}
    v = view_from_spec(ExperimentSpec.model_validate(spec))
    # q 16·(4096+4096) + v 16·(4096+1024) per layer × 32
    assert v.lora is not None and v.lora.targets == ["q", "v"]
    assert v.lora.trainable_params == 32 * 16 * (8192 + 5120) and v.notes
    params["lora_target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    v = view_from_spec(ExperimentSpec.model_validate(spec))
    assert v.lora.trainable_params == 32 * 16 * (8192 + 5120 + 5120 + 8192)
