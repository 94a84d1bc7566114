"""A character-level GPT trained by a plain PyTorch loop, in the shape of nanoGPT's `train.py`.

Why this shape: a great many research programs are a single script with a hand-written loop,
globals for configuration, `print` for logging and one `torch.save` for checkpointing, as
nanoGPT (github.com/karpathy/nanoGPT) made popular. Such a program tells nightshift nothing on
purpose; everything must be read from its stdout and its one checkpoint file. What it does, as
nanoGPT does it:

* configuration is module-level globals overridden by `--key=value` arguments (nanoGPT's
  `configurator.py`): the value goes through `ast.literal_eval` and must have the type of the
  default (`--learning_rate=50` is an int, and an `AssertionError`: write `--learning_rate=50.0`);
  an unknown key is a `ValueError`;
* every iteration prints `iter N: loss X, time Yms` (flushed); every `eval_interval` iterations it
  prints `step N: train loss X, val loss Y` and overwrites ONE `ckpt.pt` in `out_dir` with a plain
  `torch.save({'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config'}, ...)`
  to the final path, no temporary file and no rename: a kill during the write leaves a torn file,
  and a diverged run overwrites the good weights with bad ones;
* `--init_from=resume` loads `out_dir/ckpt.pt` and continues from its `iter_num` (the learning
  rate is recomputed from the configuration every iteration, so a resume with a new
  `--learning_rate` uses the new one);
* it never checks the loss: with a very high `--learning_rate` (e.g. `--learning_rate=50.0`) the
  loss becomes nan, the script keeps training and keeps overwriting `ckpt.pt`, and exits 0.

Unlike nanoGPT, each iteration's batch comes from a generator seeded with (seed, iteration), so a
run resumed from a checkpoint draws exactly the batches the uninterrupted run would have drawn.

Data: the dataset descriptions (`datasets/descr/*.rst`, about 43 kB of English) that ship with
scikit-learn, split 90/10 into train and val, one token per character (as nanoGPT's
`shakespeare_char`). Two test knobs that nanoGPT does not have: `--sleep_ms=N` sleeps N ms per
iteration, and `--hang_at=N` stops printing at iteration N and sleeps forever (a deadlock).

Run it: `python train_torch_plain.py --out_dir=out --max_iters=300`.
"""

import ast
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values
out_dir = "out"
eval_interval = 50
log_interval = 1
eval_iters = 10
always_save_checkpoint = (
    True  # save at every eval, not only when val loss improves (nanoGPT's default)
)
init_from = "scratch"  # 'scratch' or 'resume'
# data
batch_size = 16
block_size = 64
# model
n_layer = 2
n_head = 2
n_embd = 64
dropout = 0.0
# adamw optimizer
learning_rate = 3e-3
max_iters = 400
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0  # clip gradients at this value, or disable if == 0.0
# learning rate decay settings
decay_lr = True
warmup_iters = 20
lr_decay_iters = 400  # should be ~= max_iters per Chinchilla
min_lr = 3e-4
# system
seed = 1337
threads = 1  # torch.set_num_threads: small models run fastest on one core
sleep_ms = 0  # sleep this many ms per iteration (to slow the run down for tests)
hang_at = -1  # at this iteration stop printing and sleep forever (a deadlock); -1: never
# -----------------------------------------------------------------------------
config_keys = [
    k
    for k, v in globals().items()
    if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]


def _configure(argv: list[str]) -> None:
    """nanoGPT's configurator: `--key=value` overrides a global of the same type."""
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(
                f"arguments are --key=value, got {arg!r} (config files are not supported)"
            )
        key, val = arg[2:].split("=", 1)
        if key not in config_keys:
            raise ValueError(f"Unknown config key: {key}")
        try:
            attempt = ast.literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val  # a string
        assert type(attempt) == type(globals()[key]), (  # noqa: E721 (nanoGPT's exact check)
            f"{key}={val!r}: expected {type(globals()[key]).__name__}, got {type(attempt).__name__}"
        )
        print(f"Overriding: {key} = {attempt}")
        globals()[key] = attempt


_configure(sys.argv[1:])
config = {k: globals()[k] for k in config_keys}  # will be useful for logging
# -----------------------------------------------------------------------------


def load_text() -> str:
    """The .rst dataset descriptions bundled with scikit-learn (found without importing it)."""
    spec = importlib.util.find_spec("sklearn")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        files = sorted((Path(loc) / "datasets" / "descr").glob("*.rst"))
        if files:
            return "\n".join(f.read_text(encoding="utf-8") for f in files)
    raise FileNotFoundError(
        "scikit-learn's datasets/descr/*.rst not found: pip install scikit-learn"
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr (nanoGPT's schedule)."""
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main():
    torch.set_num_threads(threads)
    os.makedirs(out_dir, exist_ok=True)
    text = load_text()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}

    def get_batch(split, gen):
        d = splits[split]
        ix = torch.randint(len(d) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([d[i : i + block_size] for i in ix])
        y = torch.stack([d[i + 1 : i + 1 + block_size] for i in ix])
        return x, y

    model_args = dict(
        vocab_size=len(chars),
        block_size=block_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=dropout,
    )
    iter_num, best_val_loss = 0, 1e9
    torch.manual_seed(seed)
    if init_from == "scratch":
        print("Initializing a new model from scratch")
        model = GPT(**model_args)
        checkpoint = None
    elif init_from == "resume":
        print(f"Resuming training from {out_dir}")
        checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
        for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            model_args[k] = checkpoint["model_args"][k]  # the checkpoint's shape wins
        model = GPT(**model_args)
        model.load_state_dict(checkpoint["model"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    else:
        raise ValueError(f"init_from must be 'scratch' or 'resume', not {init_from!r}")
    print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e3:.1f}K")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=learning_rate,
        betas=(beta1, beta2),
    )
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None  # free up memory

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(seed + 7)  # the same eval batches every time
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                _, loss = model(*get_batch(split, gen))
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    t0 = time.time()
    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        # evaluate the loss on train/val sets and write checkpoints
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
            print(
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}",
                flush=True,
            )
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > 0:
                    ckpt = {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "model_args": model_args,
                        "iter_num": iter_num,
                        "best_val_loss": best_val_loss,
                        "config": config,
                    }
                    print(f"saving checkpoint to {out_dir}", flush=True)
                    torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
        if iter_num >= max_iters:
            break
        if iter_num == hang_at:
            while True:  # a deadlock: no output, no progress, never exits by itself
                time.sleep(3600)

        # forward, backward, update
        gen = torch.Generator().manual_seed(seed * 1_000_003 + iter_num)
        X, Y = get_batch("train", gen)
        _, loss = model(X, Y)
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)

        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % log_interval == 0:
            print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
        iter_num += 1


if __name__ == "__main__":
    main()
