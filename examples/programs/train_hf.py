"""A tiny GPT-2 trained by Hugging Face `transformers.Trainer`, as a fine-tuning script is written.

Why this shape: with `Trainer` the script owns neither the loop nor the files. Everything that
nightshift must read is where *transformers* puts it, under `--output_dir`:

* `checkpoint-N/` every `--save_steps` optimiser steps (N is the global step), each holding
  `model.safetensors`, `config.json`, `generation_config.json`, `optimizer.pt`, `scheduler.pt`,
  `rng_state.pth`, `trainer_state.json` (its `global_step` and `log_history`) and
  `training_args.bin`; only the newest `--save_total_limit` folders are kept. No final
  `checkpoint-<max_steps>` unless max_steps is a multiple of save_steps;
* with `report_to=["tensorboard"]`, TensorBoard event files in
  `output_dir/runs/<Mon DD_HH-MM-SS>_<host>/events.out.tfevents.*` (a new `runs/` folder per
  process: a resumed run writes a second one), with the scalars `train/loss`,
  `train/grad_norm`, `train/learning_rate`, `train/epoch` every `--logging_steps` steps and
  `eval/loss` every `--eval_steps` steps;
* resuming is `--resume_from_checkpoint PATH` → `trainer.train(resume_from_checkpoint=PATH)`,
  which restores the weights, optimiser, scheduler, RNG state and the step.

Does `Trainer` stop on NaN? No (transformers 5.24, read in `trainer.py`): nothing stops a run
whose loss is non-finite. `logging_nan_inf_filter` (default True) only changes what is *logged*:
a nan/inf step's loss is replaced by the mean of the losses since the last log, so the logged
`train/loss` stays finite and flat (0.0 when no finite loss came before) while the weights are
already nan; `train/grad_norm` (the norm before clipping, `max_grad_norm=1.0`) does show nan or
inf. `--nan_inf_filter false` logs the raw loss. Training goes on to `--max_steps`, saves
checkpoints of nan weights on schedule and exits 0.

One choice that a stock script does not make: the learning rate given on the command line wins
on resume. `Trainer` restores `scheduler.pt`, whose `base_lrs` are the checkpointed run's, so
`--lr` on a resumed run would be silently ignored; a callback sets `--lr` again at
`on_train_begin` (after the restore), so a recovery that lowers the learning rate works.

Data: synthetic token sequences from a seeded generator. Each sequence counts upward from a
random start with a random stride (mod the vocabulary), so after two tokens the rest is
predictable: the loss falls from ln(64) ≈ 4.2 well below 1.

`--sleep_ms N` sleeps N ms at every `on_step_end` (a `TrainerCallback`), to slow it for tests.

Run it: `python train_hf.py --output_dir runs/hf --max_steps 300`.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

VOCAB, SEQ = 64, 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny GPT-2 with transformers.Trainer.")
    p.add_argument("--output_dir", default="hf_out", help="checkpoint-N/ and runs/ go here")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (linear decay)")
    p.add_argument("--batch_size", type=int, default=16, help="per_device_train_batch_size")
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save_steps", type=int, default=50)
    p.add_argument("--save_total_limit", type=int, default=3)
    p.add_argument("--logging_steps", type=int, default=5)
    p.add_argument("--eval_steps", type=int, default=50)
    p.add_argument(
        "--nan_inf_filter",
        choices=["true", "false"],
        default="true",
        help="TrainingArguments.logging_nan_inf_filter",
    )
    p.add_argument("--sleep_ms", type=float, default=0.0, help="sleep at every step end")
    p.add_argument(
        "--resume_from_checkpoint",
        default=None,
        metavar="PATH",
        help="a checkpoint-N folder to continue from",
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    return p.parse_args(argv)


class CountingSequences(torch.utils.data.Dataset):
    """`n` sequences (start + stride * t) mod VOCAB, drawn once from a generator seeded by `seed`."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SleepPerStep(TrainerCallback):
    def __init__(self, ms: float):
        self.s = ms / 1000

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.s)


class LrFromArgs(TrainerCallback):
    """After a resume, train at the --lr of this run, not the checkpointed scheduler's."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if lr_scheduler is None or state.global_step == 0:
            return
        lr_scheduler.base_lrs = [args.learning_rate for _ in lr_scheduler.base_lrs]
        lambdas = getattr(lr_scheduler, "lr_lambdas", None)
        for i, group in enumerate(optimizer.param_groups):
            factor = lambdas[i](lr_scheduler.last_epoch) if lambdas else 1.0
            group["lr"] = args.learning_rate * factor


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        seed=args.seed,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        report_to=["tensorboard"],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        logging_nan_inf_filter=args.nan_inf_filter == "true",
    )
    callbacks: list[TrainerCallback] = [LrFromArgs()]
    if args.sleep_ms:
        callbacks.append(SleepPerStep(args.sleep_ms))
    trainer = Trainer(
        model=model,
        args=training_args,
        callbacks=callbacks,
        train_dataset=CountingSequences(2048, args.seed),
        eval_dataset=CountingSequences(64, 10_000 + args.seed),
    )
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print(
        f"done: global_step {result.global_step}, training_loss {result.training_loss:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
