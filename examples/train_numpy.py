"""A small, real training run for the quickstart and the tests: NumPy only, no GPU, no torch.

A two-layer MLP (64 → 64 tanh → 10, softmax cross-entropy) learns scikit-learn's `digits` data set
with Adam on minibatches, with gradient accumulation. It behaves like a real training script in the
ways nightshift cares about:

* arguments by argparse; the effective ones are printed first, as one line on stdout:
  `nightshift-args: {"lr": 0.01, "micro_batch": 32, ...}`;
* deterministic given `--seed`: the data order comes from a seeded generator whose state is
  checkpointed, so a resumed run draws exactly the batches the uninterrupted run would have;
* every `--checkpoint-every` steps (and at the last step) it writes `step_<N:08d>.npz` atomically
  (a temporary file in the same folder, fsync, `os.replace`, fsync of the folder) holding the
  weights, the Adam state (m, v, t), the step, its loss, the data generator's state and the
  arguments; `--resume PATH` continues from such a file and prints `resumed from step N`;
* one JSON line per step is appended (and flushed) to `--metrics-file`:
  `{"step": s, "loss": ..., "lr": ..., "micro_batch": ..., "grad_accum": ...}`, and at the end
  `{"event": "done", "step": ..., "loss": ..., "eval_accuracy": ...}`;
* with `--val-every N`, every N steps (and at the last step) one more line
  `{"step": s, "val_loss": ..., "val_accuracy": ...}` measured on the held-out split, the
  objective a sweep (`nightshift sweep`) optimises and prunes on; `--hidden` sets the width of
  the hidden layer (64), a hyperparameter worth searching; `--log-every N` writes the training
  loss line every N steps only (and at the last step), for long runs whose every step need not be
  stored (a sweep's trials).

Fault injection, by environment variable (K is an optimiser step, counted from 1; a fault fires
at the start of step K, before that step's update, so step K is never logged or checkpointed):

* `NIGHTSHIFT_FAULT_CRASH_AT_STEP=K` — only in a run that started from step 0: print a traceback
  ending in `RuntimeError: injected crash at step K` to stderr and die at once with exit code 1
  (`os._exit`: nothing more is flushed or cleaned up). A resumed run does not crash again.
* `NIGHTSHIFT_FAULT_KILL_AT_STEP=K` — only in a run that started from step 0: SIGKILL itself,
  as the kernel's OOM killer or `kill -9` would.
* `NIGHTSHIFT_FAULT_OOM_AT_STEP=K` with `NIGHTSHIFT_FAULT_OOM_ABOVE_BATCH=B` (default 0) — while
  `--micro-batch` > B, raise an error printed exactly as PyTorch prints a CUDA out-of-memory
  error (`torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ...`); a run
  resumed with a micro-batch of B or less passes step K.
* `NIGHTSHIFT_FAULT_NAN_AT_STEP=K` with `NIGHTSHIFT_FAULT_NAN_ABOVE_LR=X` (default 0) — while
  `--lr` > X, the loss of step K is NaN: the step is logged with `"loss": NaN` and the run stops
  with `FloatingPointError: loss is nan at step K` (exit code 1), before the bad update is applied.
* `NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S=S` — not a fault: sleep S seconds per step, so a test (or a
  person) has time to watch, kill or interrupt a run that otherwise ends in a fraction of a second.
* `NIGHTSHIFT_FAULT_HANG_AT_STEP=K` — only in a run that started from step 0: sleep forever, as
  a deadlocked collective would.

LR range test (`--lr-range-test START END`): instead of the constant `--lr`, step s of N uses
`START * (END / START) ** ((s - 1) / (N - 1))` — an exponential sweep from START at step 1 to END
at step N — and logs that lr with the step's loss, as fastai's and Lightning's LR finders do.
No checkpoints are written (weights trained at the top of the sweep are of no use) and `--resume`
is refused; a non-finite loss ends the sweep there, with exit code 0, since that is what the test
looks for. `skills/tune_lr.py` turns the curve into a suggested learning rate.

Run it: `python train_numpy.py --steps 300 --checkpoint-dir ckpt --metrics-file metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

N_HIDDEN = 64  # the default --hidden
N_CLASSES = 10
N_TEST = 297  # digits has 1797 images: 1500 to train on, 297 to evaluate
SPLIT_SEED = 20261202  # the train/test split is the same for every --seed
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
PARAM_NAMES = ("W1", "b1", "W2", "b2")


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError; a traceback prints it under torch's name."""


OutOfMemoryError.__module__ = "torch"


# --- arguments and faults -----------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small NumPy MLP on scikit-learn's digits.")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--micro-batch", type=int, default=32, help="examples per forward/backward pass")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimiser step")
    p.add_argument("--steps", type=int, default=300, help="optimiser steps in total")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="where step_<N>.npz files go")
    p.add_argument("--checkpoint-every", type=int, default=25, help="steps between checkpoints")
    p.add_argument("--metrics-file", default=None, help="JSONL file to append metrics to")
    p.add_argument("--val-every", type=int, default=0, help="log val_loss every N steps (0: never)")
    p.add_argument(
        "--log-every",
        type=int,
        default=1,
        help="log the training loss every N steps (and the last)",
    )
    p.add_argument("--hidden", type=int, default=N_HIDDEN, help="hidden units")
    p.add_argument("--resume", default=None, metavar="PATH", help="a step_<N>.npz to continue from")
    p.add_argument(
        "--lr-range-test",
        nargs=2,
        type=float,
        default=None,
        metavar=("START", "END"),
        help="sweep the lr exponentially from START to END over --steps (ignores --lr)",
    )
    args = p.parse_args(argv)
    if args.val_every < 0:
        p.error("--val-every must be 0 (never) or more")
    for name in ("micro_batch", "grad_accum", "steps", "checkpoint_every", "hidden", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        p.error("--lr must be a positive number")
    if args.lr_range_test is not None:
        start, end = args.lr_range_test
        if not (0 < start < end and math.isfinite(end)):
            p.error("--lr-range-test START END needs 0 < START < END")
        if args.resume:
            p.error(
                "--lr-range-test starts from fresh weights: it cannot be combined with --resume"
            )
    return args


def lr_at(args: argparse.Namespace, step: int) -> float:
    """The learning rate of optimiser step `step` (from 1): constant, or the range test's sweep."""
    if args.lr_range_test is None:
        return args.lr
    start, end = args.lr_range_test
    if args.steps == 1:
        return start
    return start * (end / start) ** ((step - 1) / (args.steps - 1))


def _env_number(name: str, kind: type, default: Any = None) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        sys.exit(f"train_numpy: {name}={raw!r} is not a valid {kind.__name__}")


class Faults:
    """The fault-injection settings read from the environment (see the module docstring)."""

    def __init__(self) -> None:
        self.crash_at = _env_number("NIGHTSHIFT_FAULT_CRASH_AT_STEP", int)
        self.kill_at = _env_number("NIGHTSHIFT_FAULT_KILL_AT_STEP", int)
        self.hang_at = _env_number("NIGHTSHIFT_FAULT_HANG_AT_STEP", int)
        self.oom_at = _env_number("NIGHTSHIFT_FAULT_OOM_AT_STEP", int)
        self.oom_above_batch = _env_number("NIGHTSHIFT_FAULT_OOM_ABOVE_BATCH", int, 0)
        self.nan_at = _env_number("NIGHTSHIFT_FAULT_NAN_AT_STEP", int)
        self.nan_above_lr = _env_number("NIGHTSHIFT_FAULT_NAN_ABOVE_LR", float, 0.0)
        self.step_sleep_s = _env_number("NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S", float, 0.0)

    def before_step(self, step: int, start_step: int, args: argparse.Namespace) -> None:
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        fresh = start_step == 0
        if fresh and step == self.crash_at:
            _die_with_traceback(f"RuntimeError: injected crash at step {step}")
        if fresh and step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if fresh and step == self.hang_at:
            print(f"step {step}: waiting for the other ranks", flush=True)
            while True:
                time.sleep(3600)
        if step == self.oom_at and args.micro_batch > self.oom_above_batch:
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                f"79.15 GiB of which 1.02 GiB is free. Process {os.getpid()} has 78.12 GiB memory "
                "in use. Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.27 GiB "
                "is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
                "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                "fragmentation.  See documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
            )

    def nan_now(self, step: int, args: argparse.Namespace) -> bool:
        return step == self.nan_at and args.lr > self.nan_above_lr


def _die_with_traceback(last_line: str) -> None:
    """Print a traceback of the caller's stack ending in `last_line`, then end the process at once
    (no cleanup, no flushing beyond what was already written), as a sudden crash does."""
    stack = traceback.format_stack(sys._getframe(1))
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(stack) + last_line + "\n")
    sys.stderr.flush()
    os._exit(1)


# --- data -----------------------------------------------------------------------------------------
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 8×8 images, 0–16) as floats in [0, 1] and int labels.

    Read straight from the CSV that scikit-learn ships, which skips the cost of importing
    scikit-learn itself (about a second); falls back to `sklearn.datasets.load_digits`.
    """
    spec = importlib.util.find_spec("sklearn")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1] / 16.0, data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data / 16.0, d.target.astype(np.int64)


class BatchStream:
    """Shuffled passes over the training set from a seeded generator; its state is checkpointed."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = np.random.default_rng([seed, 1])
        self.order = self.rng.permutation(n)
        self.cursor = 0

    def next(self, size: int) -> np.ndarray:
        parts, need = [], size
        while need > 0:
            if self.cursor >= self.n:
                self.order, self.cursor = self.rng.permutation(self.n), 0
            take = self.order[self.cursor : self.cursor + need]
            parts.append(take)
            self.cursor += len(take)
            need -= len(take)
        return np.concatenate(parts)

    def state(self) -> dict[str, np.ndarray]:
        return {
            "rng_state": np.array(json.dumps(self.rng.bit_generator.state)),
            "data_order": self.order,
            "data_cursor": np.array(self.cursor),
        }

    def restore(self, ck: Any) -> None:
        self.rng.bit_generator.state = json.loads(str(ck["rng_state"]))
        self.order = np.array(ck["data_order"])
        self.cursor = int(ck["data_cursor"])


# --- model ----------------------------------------------------------------------------------------
def init_params(seed: int, n_in: int, hidden: int = N_HIDDEN) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 0])
    return {
        "W1": rng.normal(0.0, 1.0 / math.sqrt(n_in), (n_in, hidden)),
        "b1": np.zeros(hidden),
        "W2": rng.normal(0.0, 1.0 / math.sqrt(hidden), (hidden, N_CLASSES)),
        "b2": np.zeros(N_CLASSES),
    }


def evaluate(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy on held-out data."""
    _, logits = forward(params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-log_probs[np.arange(len(y)), y].mean())
    return loss, float((logits.argmax(axis=1) == y).mean())


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.tanh(x @ params["W1"] + params["b1"])
    return h, h @ params["W2"] + params["b2"]


def loss_and_grads(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean softmax cross-entropy over the batch and its gradients."""
    h, logits = forward(params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = len(y)
    loss = float(-log_probs[np.arange(n), y].mean())
    d_logits = np.exp(log_probs)
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_h = (d_logits @ params["W2"].T) * (1.0 - h * h)
    return loss, {
        "W1": x.T @ d_h,
        "b1": d_h.sum(axis=0),
        "W2": h.T @ d_logits,
        "b2": d_logits.sum(axis=0),
    }


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


# --- checkpoints ------------------------------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.npz"


def save_checkpoint(
    folder: Path,
    step: int,
    loss: float,
    params: dict[str, np.ndarray],
    opt: Adam,
    stream: BatchStream,
    args: argparse.Namespace,
) -> Path:
    """Write the whole training state so that a crash at any instant leaves either the previous
    file set or the new complete file: temp file in the same folder, fsync, rename, fsync folder."""
    arrays: dict[str, np.ndarray] = {k: params[k] for k in PARAM_NAMES}
    arrays.update({f"adam_m_{k}": opt.m[k] for k in PARAM_NAMES})
    arrays.update({f"adam_v_{k}": opt.v[k] for k in PARAM_NAMES})
    arrays.update(stream.state())
    arrays.update(
        {
            "adam_t": np.array(opt.t),
            "step": np.array(step),
            "loss": np.array(loss),
            "args": np.array(json.dumps(effective_args(args))),
        }
    )
    final = folder / checkpoint_name(step)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            # numpy's stub: mypy matches **arrays against savez's allow_pickle: bool too.
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


def load_checkpoint(
    path: str, params: dict[str, np.ndarray], opt: Adam, stream: BatchStream
) -> tuple[int, float, dict[str, Any]]:
    with np.load(path, allow_pickle=False) as ck:
        for k in PARAM_NAMES:
            params[k] = np.array(ck[k])
            opt.m[k] = np.array(ck[f"adam_m_{k}"])
            opt.v[k] = np.array(ck[f"adam_v_{k}"])
        opt.t = int(ck["adam_t"])
        stream.restore(ck)
        return int(ck["step"]), float(ck["loss"]), json.loads(str(ck["args"]))


# --- the run ------------------------------------------------------------------------------------
def effective_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "lr": args.lr,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "steps": args.steps,
        "seed": args.seed,
        "checkpoint_dir": args.checkpoint_dir,
        "checkpoint_every": args.checkpoint_every,
        "metrics_file": args.metrics_file,
        "resume": args.resume,
        "lr_range_test": args.lr_range_test,
        **({"val_every": args.val_every} if args.val_every else {}),
        **({"hidden": args.hidden} if args.hidden != N_HIDDEN else {}),
        **({"log_every": args.log_every} if args.log_every != 1 else {}),
    }


class Metrics:
    """Appends one JSON line per record and flushes it, so a sudden death loses nothing logged."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("nightshift-args: " + json.dumps(effective_args(args)), flush=True)
    faults = Faults()

    x, y = load_digits_arrays()
    split = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    train, test = split[:-N_TEST], split[-N_TEST:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]

    params = init_params(args.seed, x.shape[1], args.hidden)
    opt = Adam(params)
    stream = BatchStream(len(y_train), args.seed)
    start_step, loss = 0, float("nan")
    if args.resume:
        start_step, loss, saved = load_checkpoint(args.resume, params, opt, stream)
        if saved.get("seed") != args.seed:
            print(
                f"warning: checkpoint was written with seed {saved.get('seed')}, this run has "
                f"seed {args.seed}; the checkpoint's data order is kept",
                file=sys.stderr,
            )
        print(f"resumed from step {start_step}", flush=True)

    folder = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if folder is not None and args.lr_range_test is not None:
        print("lr range test: no checkpoints are written", flush=True)
        folder = None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    metrics = Metrics(args.metrics_file)
    end_step = args.steps
    for step in range(start_step + 1, args.steps + 1):
        faults.before_step(step, start_step, args)
        grads: dict[str, np.ndarray] = {k: np.zeros_like(v) for k, v in params.items()}
        losses = []
        for _ in range(args.grad_accum):
            idx = stream.next(args.micro_batch)
            micro_loss, micro_grads = loss_and_grads(params, x_train[idx], y_train[idx])
            losses.append(micro_loss)
            for k in grads:
                grads[k] += micro_grads[k] / args.grad_accum
        loss = float(np.mean(losses))
        if faults.nan_now(step, args):
            loss = float("nan")
        lr = lr_at(args, step)
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "micro_batch": args.micro_batch,
            "grad_accum": args.grad_accum,
        }
        if not math.isfinite(loss):
            metrics.write(record)
            if args.lr_range_test is not None:
                print(
                    f"lr range test: loss is {loss} at step {step} (lr {lr:.4g}): stopping",
                    flush=True,
                )
                end_step = step
                break
            raise FloatingPointError(f"loss is {loss} at step {step}")
        opt.update(params, grads, lr)
        if step % args.log_every == 0 or step == args.steps:
            metrics.write(record)
        if args.val_every and (step % args.val_every == 0 or step == args.steps):
            val_loss, val_accuracy = evaluate(params, x_test, y_test)
            metrics.write({"step": step, "val_loss": val_loss, "val_accuracy": val_accuracy})
        if step % 25 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
        if folder is not None and (step % args.checkpoint_every == 0 or step == args.steps):
            save_checkpoint(folder, step, loss, params, opt, stream, args)

    _, logits = forward(params, x_test)
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    metrics.write(
        {
            "event": "done",
            "step": max(end_step, start_step),
            "loss": loss,
            "eval_accuracy": accuracy,
        }
    )
    print(f"done: loss {loss:.4f} eval accuracy {accuracy:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
