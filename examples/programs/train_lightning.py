"""An autoencoder on scikit-learn's digits trained by PyTorch Lightning, as a Lightning user writes it.

Why this shape: a Lightning program hands logging and checkpointing to the framework, so the
metrics and checkpoints are where *Lightning* puts them, not where the script says:

* `CSVLogger(save_dir=ROOT)` writes `ROOT/lightning_logs/version_K/metrics.csv` (K counts up: a
  resumed run is a new version) and `hparams.yaml`; rows hold `epoch`, `step` and whatever was
  logged at that step (`train_loss`, `grad_norm`, `lr` every `--log_every` steps; `val_loss`
  after each epoch). The CSV is flushed every `--flush_every` steps and at the end: a
  killed run loses the rows since the last flush;
* `ModelCheckpoint(save_last=True, every_n_train_steps=K, save_top_k=-1)` writes
  `ROOT/lightning_logs/version_K/checkpoints/epoch=E-step=S.ckpt` every K optimiser steps and
  keeps `last.ckpt` beside them (the newest; its name carries no step, its `global_step` does);
* resuming is `--ckpt_path PATH` → `trainer.fit(..., ckpt_path=PATH)`, which restores the weights,
  the optimiser, the step and the epoch (mid-epoch resume: Lightning warns that the data order
  may differ from an uninterrupted run);
* nothing checks the loss (`detect_anomaly=False`, no `gradient_clip_val`): with a huge `--lr`
  the logged `train_loss` becomes nan and the run goes on to `--max_steps`, exits 0, and keeps
  writing checkpoints of nan weights.

One choice that a stock Lightning script does not make: the learning rate given on the command
line wins on resume. Lightning restores the optimiser's state, and with it the learning rate
that the checkpointed run used, so `--lr` on a resumed run would be silently ignored; this
script sets `--lr` again in `on_train_start` (after the restore) and logs `lr`, so that a
recovery that lowers the learning rate and resumes really trains at the lower rate.

`--sleep_ms N` sleeps N ms after every training batch (a callback), to slow the run for tests.

Run it: `python train_lightning.py --root runs/lit --max_steps 300`.
"""

from __future__ import annotations

import argparse
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import grad_norm
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train an autoencoder on digits with PyTorch Lightning."
    )
    p.add_argument(
        "--root", default="lightning_root", help="default_root_dir and CSVLogger save_dir"
    )
    p.add_argument("--lr", type=float, default=0.5, help="SGD (momentum 0.9) learning rate")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every_n_train_steps", type=int, default=50, help="checkpoint every K steps")
    p.add_argument("--save_top_k", type=int, default=-1, help="-1 keeps every checkpoint")
    p.add_argument("--log_every", type=int, default=5, help="Trainer log_every_n_steps")
    p.add_argument("--flush_every", type=int, default=25, help="CSVLogger flush_logs_every_n_steps")
    p.add_argument("--sleep_ms", type=float, default=0.0, help="sleep per training batch")
    p.add_argument("--ckpt_path", default=None, help="a .ckpt to resume from")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    return p.parse_args(argv)


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int, seed: int):
        super().__init__()
        self.batch_size, self.seed = batch_size, seed

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(20261202))
        train, val = order[:1500], order[1500:]  # the same split for every --seed
        self.train_set, self.val_set = (
            TensorDataset(x[train], y[train]),
            TensorDataset(x[val], y[val]),
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class LitAutoEncoder(L.LightningModule):
    """Lightning's own first example (an encoder and a decoder, MSE reconstruction), on 8x8 digits."""

    def __init__(self, lr: float, hidden: int = 32, code: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, code))
        self.decoder = nn.Sequential(nn.Linear(code, hidden), nn.ReLU(), nn.Linear(hidden, 64))

    def training_step(self, batch, batch_idx):
        x, _ = batch
        loss = F.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("train_loss", loss)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.log("grad_norm", grad_norm(self, norm_type=2)["grad_2.0_norm_total"])

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val_loss", F.mse_loss(self.decoder(self.encoder(x)), x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)

    def on_train_start(self) -> None:
        # After a resume Lightning has restored the checkpointed optimiser, lr included: the lr
        # this run was started with wins (see the module docstring).
        for group in self.trainer.optimizers[0].param_groups:
            group["lr"] = self.hparams["lr"]


class SleepPerBatch(Callback):
    def __init__(self, ms: float):
        self.s = ms / 1000

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.s)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    L.seed_everything(args.seed, workers=True)
    model = LitAutoEncoder(lr=args.lr)
    callbacks: list[Callback] = [
        ModelCheckpoint(
            save_last=True, save_top_k=args.save_top_k, every_n_train_steps=args.every_n_train_steps
        )
    ]
    if args.sleep_ms:
        callbacks.append(SleepPerBatch(args.sleep_ms))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        default_root_dir=args.root,
        logger=CSVLogger(save_dir=args.root, flush_logs_every_n_steps=args.flush_every),
        callbacks=callbacks,
        log_every_n_steps=args.log_every,
        enable_progress_bar=False,
        enable_model_summary=False,
        detect_anomaly=False,
        deterministic=True,
    )
    trainer.fit(model, datamodule=DigitsData(args.batch_size, args.seed), ckpt_path=args.ckpt_path)
    print(
        f"done: global_step {trainer.global_step}, train_loss "
        f"{float(trainer.callback_metrics.get('train_loss', float('nan'))):.4f}, "
        f"log_dir {trainer.log_dir}",
        flush=True,
    )


if __name__ == "__main__":
    main()
