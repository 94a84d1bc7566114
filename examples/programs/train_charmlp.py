"""A character-level language model in NumPy: Bengio et al.'s MLP (2003) on English text.

Why it exists: the sweep benchmark (`evals/sweep_bench.py`) needs a second model that differs
from the quickstart's digits classifier in kind (next-character prediction over a 90-symbol
vocabulary, with a learned embedding) and in data, yet starts in a fraction of a second, so a
trial's time is spent training rather than importing a framework.

The model: the previous `--context` characters are looked up in an embedding table
(`--embed` wide), concatenated, passed through one tanh layer (`--hidden` wide) and a softmax
over the vocabulary; Adam on minibatches of random windows. Data: the dataset descriptions
(`datasets/descr/*.rst`, about 43 kB of English) that ship with scikit-learn, the first 90% to
train on and the last 10% held out, one token per character (the same text as
`train_torch_plain.py`).

What nightshift relies on, as in `examples/train_numpy.py`:

* the effective arguments are printed first, as one line: `nightshift-args: {...}`;
* deterministic given `--seed`: step s draws its batch from a generator seeded with (seed, s),
  so a resumed run trains on exactly the batches the uninterrupted run would have;
* every `--checkpoint-every` steps (and at the last step) `step_<N:08d>.npz` is written
  atomically (temporary file, fsync, `os.replace`, fsync of the folder) with the weights, the
  Adam state, the step and the arguments; `--resume PATH` continues from one;
* JSON lines appended (and flushed) to `--metrics-file`: `{"step", "loss", "lr"}` every
  `--log-every` steps, `{"step", "val_loss", "val_bpc"}` every `--val-every` steps and at the
  last step (the mean cross-entropy in nats over every held-out position, and in bits per
  character), and `{"event": "done", ...}` at the end.

Run it: `python train_charmlp.py --steps 2000 --val-every 200 --metrics-file metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
PARAM_NAMES = ("E", "W1", "b1", "W2", "b2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a NumPy character-level MLP language model.")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--micro-batch", type=int, default=64, help="windows per step")
    p.add_argument("--context", type=int, default=8, help="characters the model sees")
    p.add_argument("--embed", type=int, default=16, help="embedding width per character")
    p.add_argument("--hidden", type=int, default=128, help="hidden units")
    p.add_argument("--steps", type=int, default=2000, help="optimiser steps in total")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="where step_<N>.npz files go")
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    p.add_argument("--metrics-file", default=None, help="JSONL file to append metrics to")
    p.add_argument("--val-every", type=int, default=200, help="log val_loss every N steps")
    p.add_argument("--log-every", type=int, default=50, help="log the training loss every N steps")
    p.add_argument("--resume", default=None, metavar="PATH", help="a step_<N>.npz to continue from")
    args = p.parse_args(argv)
    for name in (
        "micro_batch", "context", "embed", "hidden", "steps", "checkpoint_every", "val_every",
        "log_every",
    ):  # fmt: skip
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        p.error("--lr must be a positive number")
    return args


def load_text() -> str:
    """The .rst dataset descriptions bundled with scikit-learn, found without importing it."""
    spec = importlib.util.find_spec("sklearn")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        files = sorted((Path(loc) / "datasets" / "descr").glob("*.rst"))
        if files:
            return "\n".join(f.read_text(encoding="utf-8") for f in files)
    raise FileNotFoundError(
        "scikit-learn's datasets/descr/*.rst not found: pip install scikit-learn"
    )


def windows(data: np.ndarray, starts: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets): `context` characters from each start, and the character after them."""
    idx = starts[:, None] + np.arange(context)[None, :]
    return data[idx], data[starts + context]


def init_params(seed: int, vocab: int, args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 0])
    fan_in = args.context * args.embed
    return {
        "E": rng.normal(0.0, 1.0, (vocab, args.embed)),
        "W1": rng.normal(0.0, 1.0 / math.sqrt(fan_in), (fan_in, args.hidden)),
        "b1": np.zeros(args.hidden),
        "W2": rng.normal(0.0, 1.0 / math.sqrt(args.hidden), (args.hidden, vocab)),
        "b2": np.zeros(vocab),
    }


def forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flattened embeddings, hidden activations, log-probabilities) for windows `x`."""
    e = p["E"][x].reshape(len(x), -1)
    h = np.tanh(e @ p["W1"] + p["b1"])
    logits = h @ p["W2"] + p["b2"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    return e, h, shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def loss_and_grads(
    p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean cross-entropy of the next character and its gradients (backpropagation by hand)."""
    e, h, log_probs = forward(p, x)
    n = len(y)
    loss = float(-log_probs[np.arange(n), y].mean())
    d_logits = np.exp(log_probs)
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_h = (d_logits @ p["W2"].T) * (1.0 - h * h)
    d_e = (d_h @ p["W1"].T).reshape(x.shape + (p["E"].shape[1],))
    d_E = np.zeros_like(p["E"])
    np.add.at(d_E, x, d_e)
    return loss, {
        "E": d_E,
        "W1": e.T @ d_h,
        "b1": d_h.sum(axis=0),
        "W2": h.T @ d_logits,
        "b2": d_logits.sum(axis=0),
    }


def evaluate(p: dict[str, np.ndarray], data: np.ndarray, context: int) -> float:
    """Mean cross-entropy (nats) over every position of the held-out text, in chunks."""
    starts = np.arange(len(data) - context)
    total = 0.0
    for chunk in np.array_split(starts, max(1, len(starts) // 2048)):
        x, y = windows(data, chunk, context)
        _, _, log_probs = forward(p, x)
        total += float(-log_probs[np.arange(len(y)), y].sum())
    return total / len(starts)


class Adam:
    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def update(
        self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float
    ) -> None:
        self.t += 1
        c1, c2 = 1.0 - ADAM_BETA1**self.t, 1.0 - ADAM_BETA2**self.t
        for k, g in grads.items():
            self.m[k] = ADAM_BETA1 * self.m[k] + (1.0 - ADAM_BETA1) * g
            self.v[k] = ADAM_BETA2 * self.v[k] + (1.0 - ADAM_BETA2) * g * g
            params[k] -= lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + ADAM_EPS)


def effective_args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items()}


def save_checkpoint(
    folder: Path, step: int, params: dict[str, np.ndarray], opt: Adam, args: argparse.Namespace
) -> Path:
    """The whole training state, atomically: a crash leaves the old file set or the new file."""
    arrays = {k: params[k] for k in PARAM_NAMES}
    arrays.update({f"adam_m_{k}": opt.m[k] for k in PARAM_NAMES})
    arrays.update({f"adam_v_{k}": opt.v[k] for k in PARAM_NAMES})
    arrays.update(
        {
            "adam_t": np.array(opt.t),
            "step": np.array(step),
            "args": np.array(json.dumps(effective_args(args))),
        }
    )
    final = folder / f"step_{step:08d}.npz"
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load_checkpoint(path: str, params: dict[str, np.ndarray], opt: Adam) -> int:
    with np.load(path, allow_pickle=False) as ck:
        for k in PARAM_NAMES:
            if ck[k].shape != params[k].shape:
                raise SystemExit(
                    f"train_charmlp: {path} holds {k} of shape {ck[k].shape}, this run's is "
                    f"{params[k].shape}: resume with the arguments it was written with"
                )
            params[k] = np.array(ck[k])
            opt.m[k] = np.array(ck[f"adam_m_{k}"])
            opt.v[k] = np.array(ck[f"adam_v_{k}"])
        opt.t = int(ck["adam_t"])
        return int(ck["step"])


def write(path: Path | None, record: dict[str, Any]) -> None:
    """Append one JSON line and close the file, so a sudden death loses nothing logged."""
    if path is not None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("nightshift-args: " + json.dumps(effective_args(args)), flush=True)
    text = load_text()
    chars = sorted(set(text))
    data = np.array([chars.index(c) for c in text], dtype=np.int64)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]

    params = init_params(args.seed, len(chars), args)
    opt = Adam(params)
    start = 0
    if args.resume:
        start = load_checkpoint(args.resume, params, opt)
        print(f"resumed from step {start}", flush=True)
    folder = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    metrics = Path(args.metrics_file) if args.metrics_file else None
    if metrics is not None:
        metrics.parent.mkdir(parents=True, exist_ok=True)

    loss, val_loss = float("nan"), float("nan")
    for step in range(start + 1, args.steps + 1):
        rng = np.random.default_rng([args.seed, step])
        x, y = windows(
            train, rng.integers(0, len(train) - args.context, args.micro_batch), args.context
        )
        loss, grads = loss_and_grads(params, x, y)
        if not math.isfinite(loss):
            write(metrics, {"step": step, "loss": loss, "lr": args.lr})
            raise FloatingPointError(f"loss is {loss} at step {step}")
        opt.update(params, grads, args.lr)
        last = step == args.steps
        if step % args.log_every == 0 or last:
            write(metrics, {"step": step, "loss": loss, "lr": args.lr})
        if step % args.val_every == 0 or last:
            val_loss = evaluate(params, val, args.context)
            write(metrics, {"step": step, "val_loss": val_loss, "val_bpc": val_loss / math.log(2)})
            print(f"step {step}: loss {loss:.4f} val_loss {val_loss:.4f}", flush=True)
        if folder is not None and (step % args.checkpoint_every == 0 or last):
            save_checkpoint(folder, step, params, opt, args)
    write(
        metrics,
        {"event": "done", "step": max(args.steps, start), "loss": loss, "val_loss": val_loss},
    )
    print(f"done: loss {loss:.4f} val_loss {val_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
