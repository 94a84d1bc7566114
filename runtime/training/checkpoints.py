"""Checkpoints where frameworks put them: find them below a run root, say their step, check they
are whole and that their weights are finite.

Layouts recognised, anywhere below the folder given (to `max_depth`, symlinks not followed out of
it or the allowed roots):

| framework     | entry                                            | step from                           |
| ------------- | ------------------------------------------------ | ----------------------------------- |
| `nightshift`  | `step_<N>.npz` (examples/train_numpy.py)         | the file's `step` array, = N        |
| `pytorch`     | `*.pt`, `*.pth`, `*.pth.tar`                     | the name, else the pickled dict     |
| `lightning`   | `*.ckpt` (`epoch=3-step=1200.ckpt`, `last.ckpt`) | the name, else pickled global_step  |
| `huggingface` | `checkpoint-<N>/` folders                        | `trainer_state.json` global_step    |
| `safetensors` | `*.safetensors`                                  | the name, else header `__metadata__`|
| `tensorflow`  | the `checkpoint` index file's listed prefixes    | the prefix's `-N` suffix            |
| `orbax`       | numeric step folders `<N>/`                      | the folder name                     |

Lightning's `lightning_logs/version_K/checkpoints/` of a run resumed into a new version are all
found and compared by step. A pickled step is read without unpickling (opcodes scanned with
`pickletools`, nothing executed) under the keys frameworks use: `global_step`, `step`,
`iteration`, nanoGPT's `iter_num`, and `epoch` x `steps_per_epoch` when that is given. The name's
step (`step=N`, `iter_N`, a trailing `_N`) counts only when the file records none.

Order: by step, newest first, never by file time; unknown steps last. Completeness is checked on the
data: zip CRCs and torch's data.pkl, safetensors byte coverage, HF folders (trainer_state.json is
written last), TF `.index` tables against their data shards (every tensor's bytes inside its
shard, see tf_bundle), orbax commit markers.
"""

from __future__ import annotations

import json
import math
import os
import pickletools
import re
import struct
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from nightshift.runtime.training import tf_bundle

# Tie-break order at equal steps (the order of the table above).
FRAMEWORK_ORDER = (
    "nightshift",
    "huggingface",
    "lightning",
    "pytorch",
    "safetensors",
    "tensorflow",
    "orbax",
)
MAX_DEPTH = 6
SKIP_DIRS = {".git", "__pycache__", "node_modules", "runs", "displaced"}

NPZ_REQUIRED = ("step.npy",)
HF_WEIGHTS = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")
# torch/serialization.py: the first pickle of a legacy (non-zip) torch.save file.
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# leveldb table footer (TensorFlow's .index files are such tables): kTableMagicNumber, little-endian.
TF_TABLE_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
STEP_KEYS = ("global_step", "step", "iteration", "iter_num")  # iter_num: nanoGPT

_NAME_STEP = re.compile(
    r"(?:^|[^a-z])(?:global_step|step|iteration|iter)[=_-]?(\d+)", re.IGNORECASE
)
_TRAILING_NUMBER = re.compile(r"[_.\-](\d+)$")
_TMP_NAME = re.compile(
    r"(\.tmp|\.temp|\.partial|\.incomplete)$|^tmp-checkpoint-|"
    r"\.orbax-checkpoint-tmp-|^\.step_\d+\.npz\.",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Found:
    path: Path  # the checkpoint: a file, a checkpoint-N or orbax folder, a TF prefix
    framework: str
    step: int | None
    files: tuple[Path, ...]  # every file it is made of (copied together by the keeper)
    step_from: str = "none"  # metadata | name | trainer_state | folder | epoch | none

    def sort_key(self) -> tuple:
        known = self.step is not None
        return (
            0 if known else 1,
            -(self.step or 0),
            FRAMEWORK_ORDER.index(self.framework),
            0 if self.path.name == "last.ckpt" else 1,
            str(self.path),
        )


@dataclass(frozen=True)
class Leftover:
    path: Path
    reason: str


def scan(
    root: Path,
    *,
    steps_per_epoch: int | None = None,
    max_depth: int = MAX_DEPTH,
    allowed_roots: Sequence[Path] = (),
) -> list[Found]:
    """Every checkpoint below `root`, newest first; nothing is verified (that is `verify`)."""
    return search(
        root, steps_per_epoch=steps_per_epoch, max_depth=max_depth, allowed_roots=allowed_roots
    )[0]


def search(
    root: Path,
    *,
    steps_per_epoch: int | None = None,
    max_depth: int = MAX_DEPTH,
    allowed_roots: Sequence[Path] = (),
) -> tuple[list[Found], list[Leftover]]:
    """`scan`, and the leftovers of unfinished saves it passed over."""
    found: list[Found] = []
    leftovers: list[Leftover] = []
    for folder in _folders(root, max_depth, [root, *allowed_roots]):
        f, left = _scan_folder(folder, steps_per_epoch)
        found += f
        leftovers += left
    unique = {c.path: c for c in found}
    return sorted(unique.values(), key=Found.sort_key), leftovers


def verify(found: Found) -> str | None:
    """None when the checkpoint is complete and readable, else the reason it is not."""
    path = found.path
    if found.framework == "nightshift":
        return _verify_npz(path, found.step if found.step is not None else -1)
    if found.framework in ("lightning", "pytorch"):
        return _verify_torch(path)
    if found.framework == "safetensors":
        return _verify_safetensors(path)
    if found.framework == "huggingface":
        return _verify_hf_folder(path)
    if found.framework == "orbax":
        return _verify_orbax(path)
    return _verify_tf_prefix(path)


def nonfinite(found: Found) -> str | None:
    """Which floating tensor of the checkpoint holds NaN or inf, read on the CPU without building a
    model; None when all are finite (or the format is not one read here: TF, orbax)."""
    for f in found.files:
        name = f.name
        if name.endswith(".safetensors"):
            bad = _safetensors_nonfinite(f)
        elif name.endswith(".npz"):
            bad = _npz_nonfinite(f)
        elif (
            name.endswith((".pt", ".pth", ".pth.tar", ".ckpt", ".bin")) and "optimizer" not in name
        ):
            bad = _torch_nonfinite(f)
        else:
            continue
        if bad:
            return f"{name}: {bad}"
    return None


# --- discovery ----------------------------------------------------------------------------------
def _folders(root: Path, max_depth: int, allowed: list[Path]) -> Iterator[Path]:
    """root and the folders below it, breadth first, not into recognised checkpoint folders, and
    through a symlink only when it resolves inside an allowed root."""
    allowed_real = [a.resolve() for a in allowed]
    level = [root]
    for _ in range(max_depth + 1):
        nxt = []
        for folder in level:
            yield folder
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                try:
                    if not e.is_dir() or e.name in SKIP_DIRS or _is_checkpoint_folder(e.name):
                        continue
                    p = Path(e.path)
                    if e.is_symlink() and not any(
                        p.resolve().is_relative_to(a) for a in allowed_real
                    ):
                        continue
                    nxt.append(p)
                except OSError:
                    continue
        level = nxt


def _is_checkpoint_folder(name: str) -> bool:
    return bool(re.fullmatch(r"checkpoint-\d+|\d+|tmp-checkpoint-\d+", name)) or bool(
        _TMP_NAME.search(name)
    )


def _files_of(folder: Path) -> tuple[Path, ...]:
    return tuple(sorted(p for p in folder.rglob("*") if p.is_file()))


def _scan_folder(folder: Path, steps_per_epoch: int | None) -> tuple[list[Found], list[Leftover]]:
    found: list[Found] = []
    leftovers: list[Leftover] = []
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError:
        return found, leftovers
    for entry in entries:
        name = entry.name
        if _TMP_NAME.search(name):
            leftovers.append(Leftover(entry, "leftover of an unfinished save (temporary name)"))
            continue
        if entry.is_dir():
            m = re.fullmatch(r"checkpoint-(\d+)", name)
            if m:
                step = _hf_global_step(entry)
                found.append(
                    Found(
                        entry,
                        "huggingface",
                        int(m.group(1)) if step is None else step,
                        _files_of(entry),
                        "name" if step is None else "trainer_state",
                    )
                )
            elif re.fullmatch(r"\d+", name) or (
                re.fullmatch(r"[A-Za-z]\w*_\d+", name)
                and any((entry / mk).exists() for mk in ORBAX_MARKERS)
            ):
                digits = re.search(r"(\d+)$", name)
                assert digits is not None  # both patterns above end in digits
                step = int(digits.group(1))
                found.append(Found(entry, "orbax", step, _files_of(entry), "folder"))
            continue
        if name == "checkpoint":
            found.extend(_tf_candidates(entry))
            continue
        m = re.fullmatch(r"step_(\d+)\.npz", name)
        if m:
            found.append(Found(entry, "nightshift", int(m.group(1)), (entry,), "name"))
            continue
        kind = (
            "lightning"
            if name.endswith(".ckpt")
            else "pytorch"
            if name.endswith((".pt", ".pth", ".pth.tar"))
            else "safetensors"
            if name.endswith(".safetensors")
            else None
        )
        if kind is None or (folder / "trainer_state.json").exists():
            continue  # an HF output_dir's final weights belong to the run, not a checkpoint
        meta = (
            _safetensors_meta_step
            if kind == "safetensors"
            else (lambda p: _torch_meta_step(p, steps_per_epoch))
        )
        step, source = meta(entry), "metadata"
        if step is None:
            step, source = _name_step(name), "name"
        found.append(Found(entry, kind, step, (entry,), source if step is not None else "none"))
    return found, leftovers


def _tf_candidates(index_file: Path) -> list[Found]:
    """Every prefix the TensorFlow `checkpoint` file lists (text proto)."""
    try:
        text = index_file.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    prefixes = re.findall(
        r'^\s*(?:all_)?model_checkpoint_paths?:\s*"((?:[^"\\]|\\.)*)"', text, re.MULTILINE
    )
    seen, out = set(), []
    for raw in prefixes:
        prefix = Path(raw) if Path(raw).is_absolute() else index_file.parent / raw
        if prefix in seen:
            continue
        seen.add(prefix)
        m = re.search(r"-(\d+)$", prefix.name)
        files = tuple(sorted(prefix.parent.glob(prefix.name + ".*")))
        out.append(
            Found(
                prefix, "tensorflow", int(m.group(1)) if m else None, files, "name" if m else "none"
            )
        )
    return out


def _name_step(name: str) -> int | None:
    stem = name
    for suffix in (".pth.tar", ".safetensors", ".ckpt", ".pth", ".pt", ".npz"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    m = _NAME_STEP.search(stem)
    if m:
        return int(m.group(1))
    m = _TRAILING_NUMBER.search(stem)
    if m and not re.search(r"epoch[=_-]?\d+$", stem, re.IGNORECASE):
        return int(m.group(1))
    return None


# --- verification: zip archives (torch.save, Lightning, .npz) ---------------------------------------
def _empty(path: Path) -> str | None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return "empty file (0 bytes)" if size == 0 else None


def _check_zip(path: Path) -> str | None:
    """CRC-check every member of a zip archive; None when it is whole."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except zipfile.BadZipFile as exc:
        return f"not a complete zip archive ({exc}): truncated or corrupt"
    except (OSError, EOFError, zlib.error, NotImplementedError, ValueError) as exc:
        return f"zip archive cannot be read ({type(exc).__name__}: {exc}): truncated or corrupt"
    if bad is not None:
        return f"CRC check failed for member {bad}: corrupt"
    return None


def _verify_npz(path: Path, name_step: int) -> str | None:
    reason = _empty(path) or _check_zip(path)
    if reason:
        return reason
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
    missing = [k for k in NPZ_REQUIRED if k not in names]
    if missing:
        return f"missing required array(s) {', '.join(k[:-4] for k in missing)}"
    if len(names) < 2:
        return "holds a step but no training state"
    try:
        with np.load(path, allow_pickle=False) as data:
            recorded = int(data["step"])
    except (ValueError, OSError, TypeError) as exc:
        return f"the step array cannot be read: {exc}"
    if recorded != name_step:
        return f"records step {recorded} but is named for step {name_step}"
    return None


def _torch_data_pkl(zf: zipfile.ZipFile) -> str | None:
    return next((n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")), None)


def _verify_torch(path: Path) -> str | None:
    reason = _empty(path)
    if reason:
        return reason
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":
        reason = _check_zip(path)
        if reason:
            return reason
        with zipfile.ZipFile(path) as zf:
            if _torch_data_pkl(zf) is None:
                return "zip archive without data.pkl: not a torch.save file"
        return None
    return _verify_legacy_torch(path)


def _verify_legacy_torch(path: Path) -> str | None:
    with open(path, "rb") as f:
        try:
            magic = _pickle_ops(f)
        except ValueError:
            return "neither a zip archive nor a legacy torch pickle (no readable pickle header)"
        ints = [arg for name, arg in magic if name in ("LONG1", "LONG4", "LONG", "INT")]
        if ints != [TORCH_LEGACY_MAGIC]:
            return "neither a zip archive nor a legacy torch pickle (wrong magic number)"
        try:
            for _ in range(3):  # protocol version, sys_info, the saved object
                _pickle_ops(f)
        except ValueError:
            return "legacy torch pickle ends early: truncated"
    return None


# --- pickle metadata, read without unpickling ------------------------------------------------------
_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_STR_OPS = {
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "UNICODE",
    "BINUNICODE8",
    "SHORT_BINSTRING",
    "BINSTRING",
    "STRING",
}
_MEMO_OPS = {"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"}
_MAX_OPS = 500_000


def _pickle_ops(f: IO[bytes]) -> list[tuple[str, object]]:
    """The opcodes of one pickle up to its STOP; ValueError when it ends early or is not a pickle."""
    ops = []
    for op, arg, _ in pickletools.genops(f):
        ops.append((op.name, arg))
        if op.name == "STOP":
            return ops
        if len(ops) > _MAX_OPS:
            return ops
    raise ValueError("pickle ended before STOP")


def _pickled_step(f: IO[bytes], steps_per_epoch: int | None = None) -> int | None:
    """The first integer stored under one of STEP_KEYS in one pickle, scanning opcodes only;
    else `epoch` x steps_per_epoch when that is given."""
    found: dict[str, int] = {}
    pending: str | None = None
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(f)):
            if count > _MAX_OPS or op.name == "STOP":
                break
            if op.name in _MEMO_OPS:
                continue
            if (
                pending is not None
                and op.name in _INT_OPS
                and isinstance(arg, int)
                and not isinstance(arg, bool)
            ):
                found.setdefault(pending, arg)
            pending = arg if op.name in _STR_OPS and arg in (*STEP_KEYS, "epoch") else None
            if "global_step" in found:
                break
    except (ValueError, EOFError):
        pass
    step = next((found[k] for k in STEP_KEYS if k in found and found[k] >= 0), None)
    if step is None and steps_per_epoch and found.get("epoch", -1) >= 0:
        step = found["epoch"] * steps_per_epoch
    return step


def _torch_meta_step(path: Path, steps_per_epoch: int | None = None) -> int | None:
    """global_step/step/iteration from a torch.save file's pickle, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head == b"PK\x03\x04":
                with zipfile.ZipFile(path) as zf:
                    member = _torch_data_pkl(zf)
                    if member is None:
                        return None
                    with zf.open(member) as pkl:
                        return _pickled_step(pkl, steps_per_epoch)
            f.seek(0)
            for _ in range(3):  # magic number, protocol version, sys_info
                _pickle_ops(f)
            return _pickled_step(f, steps_per_epoch)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        return None


# --- verification: safetensors ----------------------------------------------------------------------
def _safetensors_header(path: Path) -> tuple[dict | None, str | None]:
    """Parse and check a safetensors file's header; (header, None) or (None, reason)."""
    reason = _empty(path)
    if reason:
        return None, reason
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return None, "shorter than the 8-byte header length: truncated"
        (n,) = struct.unpack("<Q", raw)
        if n == 0 or n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            return (
                None,
                f"header length {n} does not fit the file ({size} bytes): truncated or corrupt",
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None, "header is not valid JSON: corrupt"
    if not isinstance(header, dict):
        return None, "header is not a JSON object: corrupt"
    data_len = size - 8 - n
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            begin, end = int(begin), int(end)
        except (KeyError, TypeError, ValueError):
            return None, f"tensor {name!r} has no valid dtype/shape/data_offsets: corrupt"
        width = SAFETENSORS_DTYPE_BYTES.get(dtype)
        if width is not None and end - begin != width * math.prod(int(d) for d in shape):
            return None, f"tensor {name!r}: byte range does not match {dtype}{list(shape)}: corrupt"
        if not 0 <= begin <= end:
            return None, f"tensor {name!r} has an invalid byte range: corrupt"
        end_max = max(end_max, end)
    if end_max > data_len:
        return None, (
            f"header promises {end_max} bytes of tensor data, the file holds {data_len}: truncated"
        )
    if end_max < data_len:
        return None, f"{data_len - end_max} bytes after the last tensor: corrupt"
    return header, None


def _verify_safetensors(path: Path) -> str | None:
    return _safetensors_header(path)[1]


def _safetensors_meta_step(path: Path) -> int | None:
    header, _ = _safetensors_header(path)
    meta = (header or {}).get("__metadata__") or {}
    for key in STEP_KEYS:
        value = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


# --- verification: Hugging Face, orbax, TensorFlow ---------------------------------------------------
def _hf_global_step(folder: Path) -> int | None:
    try:
        step = json.loads((folder / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def _verify_hf_folder(folder: Path) -> str | None:
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json: the save did not finish"
    if _hf_global_step(folder) is None:
        return "trainer_state.json is unreadable or has no global_step"
    weights = [w for w in HF_WEIGHTS if (folder / w).is_file()]
    if not weights:
        return "no weights file (" + ", ".join(HF_WEIGHTS[:3]) + " or a sharded index)"
    for index_name in (w for w in weights if w.endswith(".index.json")):
        try:
            shards = set(json.loads((folder / index_name).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{index_name} is unreadable or has no weight_map"
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            return f"{index_name} names missing shard(s): {', '.join(missing)}"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.is_file():
            continue
        if item.name.endswith(".safetensors"):
            reason = _verify_safetensors(item)
        elif item.name.endswith((".bin", ".pt", ".pth")):
            reason = _verify_torch(item)
        else:
            continue
        if reason:
            return f"{item.name}: {reason}"
    return None


def _verify_orbax(folder: Path) -> str | None:
    markers = [m for m in ORBAX_MARKERS if (folder / m).is_file()]
    if not markers:
        return "no _CHECKPOINT_METADATA or commit_success.txt: the save did not finish"
    if markers[0] == "_CHECKPOINT_METADATA":
        try:
            json.loads((folder / "_CHECKPOINT_METADATA").read_text())
        except (OSError, ValueError):
            return "_CHECKPOINT_METADATA is not valid JSON: corrupt"
    if not any(p.name not in ORBAX_MARKERS for p in folder.iterdir()):
        return "holds only the commit marker, no checkpoint items"
    return None


def _verify_tf_prefix(prefix: Path) -> str | None:
    index = prefix.parent / (prefix.name + ".index")
    if not index.is_file():
        return f"{index.name} is missing"
    reason = _empty(index)
    if reason:
        return f"{index.name}: {reason}"
    with open(index, "rb") as f:
        f.seek(max(0, index.stat().st_size - 8))
        if f.read(8) != TF_TABLE_MAGIC:
            return f"{index.name} does not end with the table magic number: truncated or corrupt"
    shards = sorted(prefix.parent.glob(prefix.name + ".data-*-of-*"))
    if not shards:
        return "no .data-NNNNN-of-MMMMM shard"
    totals = set()
    present = set()
    for shard in shards:
        m = re.search(r"\.data-(\d+)-of-(\d+)$", shard.name)
        if not m:
            continue
        if shard.stat().st_size == 0:
            return f"{shard.name}: empty file (0 bytes)"
        present.add(int(m.group(1)))
        totals.add(int(m.group(2)))
    if len(totals) != 1:
        return "data shards disagree on their count"
    total = totals.pop()
    missing = sorted(set(range(total)) - present)
    if missing:
        return f"data shard(s) {missing} of {total} missing"
    return _tf_extents(prefix, index, total)


def _tf_extents(prefix: Path, index: Path, total: int) -> str | None:
    """Every tensor the index lists lies inside its shard: a shard cut short is caught here."""
    try:
        read = tf_bundle.extents(index)
    except (OSError, tf_bundle.BadIndex) as exc:
        return f"{index.name}: {exc}"
    if read is None:
        return None  # protobuf is not installed: the index is not read (footer and shards only)
    num_shards, tensors = read
    if num_shards != total:
        return f"{index.name} names {num_shards} data shard(s), the files {total}"
    sizes: dict[int, int] = {}
    for t in tensors:
        if t.shard not in sizes:
            shard = prefix.parent / f"{prefix.name}.data-{t.shard:05d}-of-{total:05d}"
            sizes[t.shard] = shard.stat().st_size if shard.is_file() else -1
        if t.offset + t.size > sizes[t.shard]:
            return (
                f"data shard {t.shard} is cut short: tensor {t.tensor!r} needs bytes up to "
                f"{t.offset + t.size}, the file has {max(sizes[t.shard], 0)}"
            )
    return None


# --- finite weights -------------------------------------------------------------------------------
def _safetensors_nonfinite(path: Path) -> str | None:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        return None
    try:
        tensors = load_file(str(path))
    except Exception:  # noqa: BLE001 (bf16 and other dtypes numpy lacks, or a torn file)
        return _torch_nonfinite_safetensors(path)
    return _first_bad(tensors.items())


def _torch_nonfinite_safetensors(path: Path) -> str | None:
    try:
        from safetensors.torch import load_file
    except ImportError:
        return None
    try:
        return _first_bad_torch(load_file(str(path), device="cpu").items())
    except Exception:  # noqa: BLE001 (unreadable: verify says why)
        return None


def _npz_nonfinite(path: Path) -> str | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            return _first_bad((k, data[k]) for k in data.files)
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def _torch_nonfinite(path: Path) -> str | None:
    """torch.load with weights_only (no code runs) onto the CPU; optimizer state is skipped."""
    try:
        import torch
    except ImportError:
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 (not loadable without code, or torn: verify says why)
        return None
    if isinstance(obj, dict) and any(k in obj for k in WEIGHT_KEYS):
        obj = {k: obj[k] for k in WEIGHT_KEYS if k in obj}  # the model's weights, nothing else
    return _first_bad_torch(_tensors(obj, ""))


# Where the model's weights are in a checkpoint dict: Lightning's state_dict, nanoGPT's model...
# The rest is trainer state with legitimate infinities (ModelCheckpoint's kth_value starts at inf).
WEIGHT_KEYS = ("state_dict", "model", "model_state_dict", "module", "ema", "net")
# Trainer state skipped where the weights are not under one of those keys.
NOT_WEIGHTS = ("optim", "scheduler", "callback", "loops", "hyper_parameters")


def _tensors(obj: object, prefix: str) -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if any(word in str(k).lower() for word in NOT_WEIGHTS):
                continue  # the weights decide; optimizer moments, callbacks are not weights
            yield from _tensors(v, f"{prefix}{k}.")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), obj


def _first_bad(items) -> str | None:  # noqa: ANN001
    for name, arr in items:
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            what = "NaN" if np.isnan(arr).any() else "inf"
            return f"tensor {name!r} holds {what}"
    return None


def _first_bad_torch(items) -> str | None:  # noqa: ANN001
    import torch

    for name, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all():
            what = "NaN" if torch.isnan(t).any() else "inf"
            return f"tensor {name!r} holds {what}"
    return None
