"""auto_resume: find the newest complete, readable checkpoint and say how to resume from it.

Layouts recognised, among the entries directly inside `checkpoint_dir`:

| framework     | entry                                            | step from                           |
| ------------- | ------------------------------------------------ | ----------------------------------- |
| `nightshift`  | `step_<N>.npz` (examples/train_numpy.py)         | the file's `step` array, = N        |
| `pytorch`     | `*.pt`, `*.pth`, `*.pth.tar`                     | the name, else the pickled dict     |
| `lightning`   | `*.ckpt` (`epoch=3-step=1200.ckpt`, `last.ckpt`) | the name, else pickled global_step  |
| `huggingface` | `checkpoint-<N>/` folders                        | `trainer_state.json` global_step    |
| `safetensors` | `*.safetensors`                                  | the name, else header `__metadata__`|
| `tensorflow`  | the `checkpoint` index file's listed prefixes    | the prefix's `-N` suffix            |
| `orbax`       | numeric step folders `<N>/`                      | the folder name                     |

Rules, kept explicit because a resume from the wrong checkpoint silently loses work:

1. Order by step, newest (highest) first — never by modification time, which copies, restores and
   clock skew make meaningless. Ties go to the framework order in the table, then the name.
2. A name step comes from `step=N`, `stepN`, `step_N`, `global_step_N`, `iter_N`, or a trailing
   `_N`/`-N`/`.N` (`ckpt_1000.pt`, `model_step1000.pth`). A name with only an epoch (`epoch=3.ckpt`)
   or no number (`last.ckpt`) takes its step from metadata read without unpickling: the pickle is
   scanned opcode by opcode (`pickletools`, nothing executed) for `global_step`, then `step`, then
   `iteration`. A checkpoint whose step still cannot be known ranks after every checkpoint with a
   known step (`last.ckpt` first among them, then by name) and is resumed with no step.
3. Verify newest first and choose the first that passes; every newer one that fails is listed in
   `skipped` with its reason; older ones are not opened. Checks: zip archives (`torch.save`'s
   format, Lightning, our `.npz`) pass a CRC check of every member (`ZipFile.testzip`) and hold
   their required members (`*/data.pkl`; `step.npy` plus state); legacy (non-zip) torch pickles
   start with torch's magic number and their pickles parse to the end; safetensors have an 8-byte
   little-endian header length, a JSON header whose tensors' byte ranges match their dtypes and
   shapes, and exactly the data the header promises; Hugging Face folders need `trainer_state.json`
   and a weights file (`model.safetensors`, `pytorch_model.bin`, `adapter_model.safetensors`, or a
   sharded index with every shard present), and every weight/optimiser file in them is checked as
   above; TensorFlow prefixes need a `.index` file that ends with the table magic number and every
   `.data-NNNNN-of-MMMMM` shard; orbax step folders need `_CHECKPOINT_METADATA` (or
   `commit_success.txt`). Empty files, and leftovers of unfinished saves (`*.tmp`, `*.partial`,
   `tmp-checkpoint-N/`, `*.orbax-checkpoint-tmp-*`), are skipped.
4. The resume command: the caller's `resume_arg` template when given (`{checkpoint}` and `{step}`
   filled), else the framework's convention — Hugging Face `--resume_from_checkpoint PATH`,
   Lightning `--ckpt_path PATH`, everything else the spec default `--resume PATH`. A flag of the
   template already in the command is replaced, never duplicated.
"""

from __future__ import annotations

import json
import math
import pickletools
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from pydantic import BaseModel, Field

from nightshift.skills.base import SkillContext, skill

Framework = Literal["auto", "nightshift", "pytorch", "lightning", "huggingface", "safetensors",
                    "tensorflow", "orbax"]

# Tie-break order at equal steps (the order of the table above).
FRAMEWORK_ORDER = ("nightshift", "huggingface", "lightning", "pytorch", "safetensors",
                   "tensorflow", "orbax")
DEFAULT_RESUME_ARGS: dict[str, list[str]] = {
    "huggingface": ["--resume_from_checkpoint", "{checkpoint}"],
    "lightning": ["--ckpt_path", "{checkpoint}"],
}
SPEC_RESUME_ARG = ["--resume", "{checkpoint}"]

NPZ_REQUIRED = ("step.npy",)
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
              "adapter_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")
# torch/serialization.py: the first pickle of a legacy (non-zip) torch.save file.
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# leveldb table footer (TensorFlow's .index files are such tables): kTableMagicNumber, little-endian.
TF_TABLE_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)
SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2,
                           "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8,
                           "I64": 8, "U64": 8}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
STEP_KEYS = ("global_step", "step", "iteration")

_NAME_STEP = re.compile(r"(?:^|[^a-z])(?:global_step|step|iteration|iter)[=_-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"[_.\-](\d+)$")
_TMP_NAME = re.compile(r"(\.tmp|\.temp|\.partial|\.incomplete)$|^tmp-checkpoint-|"
                       r"\.orbax-checkpoint-tmp-|^\.step_\d+\.npz\.", re.IGNORECASE)


class AutoResumeInput(BaseModel):
    """Where the checkpoints are, and (optionally) the command to inject a resume argument into."""

    checkpoint_dir: str = Field(description="The folder that holds the checkpoints (not one checkpoint)")
    command: list[str] | None = Field(None, description="argv of the run; returned with the resume "
                                      "argument injected")
    resume_arg: list[str] | None = Field(None, description="resume argv template with {checkpoint} "
                                         "and {step}, e.g. the spec's ['--resume', '{checkpoint}']; "
                                         "default: the framework's convention")
    framework: Framework = Field("auto", description="Only consider this layout; auto: all of them")
    max_step: int | None = Field(None, ge=0, description="Only checkpoints at or before this step "
                                 "(e.g. before a divergence began); checkpoints of unknown step "
                                 "are then left out")
    current_step: int | None = Field(None, ge=0, description="The step the run had reached, to say "
                                     "how many steps a resume recomputes")


class SkippedCheckpoint(BaseModel):
    path: str
    reason: str


class AutoResumeResult(BaseModel):
    """The resume plan. found is False (not an error) when there is nothing usable to resume from."""

    found: bool
    path: str | None = Field(None, description="The checkpoint to resume from (file or folder)")
    step: int | None = Field(None, description="Its step; None when it records none")
    framework: str | None = None
    command: list[str] | None = Field(None, description="The input command with the resume argument")
    skipped: list[SkippedCheckpoint] = Field(default_factory=list,
                                             description="Newer checkpoints passed over, and why")
    candidates: int = Field(0, description="Checkpoints recognised in the folder")
    steps_to_recompute: int | None = Field(None, description="current_step minus step, when both known")
    message: str


@dataclass
class _Candidate:
    path: Path
    framework: str
    step: int | None
    verify: Callable[[], str | None]  # None when usable, else the reason it is not

    def sort_key(self) -> tuple:
        known = self.step is not None
        return (0 if known else 1, -(self.step or 0), FRAMEWORK_ORDER.index(self.framework),
                0 if self.path.name == "last.ckpt" else 1, self.path.name)


@skill("auto_resume", capability="read")
def auto_resume(ctx: SkillContext, inp: AutoResumeInput) -> AutoResumeResult:
    """Find the newest complete and readable checkpoint in a folder and return a resume plan: its
    path and step, and the run's command with the resume argument injected (the given resume_arg
    template, else --resume_from_checkpoint for Hugging Face, --ckpt_path for Lightning, --resume
    for the rest). Knows nightshift step_N.npz, PyTorch .pt/.pth, Lightning .ckpt, Hugging Face
    checkpoint-N folders, safetensors, TensorFlow checkpoint index files and orbax step folders.
    Orders by step, never by file time; a truncated or corrupt newest checkpoint is skipped for the
    one before, and each skip is listed with its reason. found=False means start from scratch."""
    folder = Path(inp.checkpoint_dir).expanduser().absolute()
    if not folder.exists():
        return AutoResumeResult(found=False, message=f"checkpoint folder {folder} does not exist: "
                                "there is nothing to resume from; start from scratch")
    if not folder.is_dir():
        return AutoResumeResult(found=False, message=f"{folder} is a file, not a folder; pass the "
                                "folder that holds the checkpoints")

    candidates, skipped = _scan(folder)
    if inp.framework != "auto":
        candidates = [c for c in candidates if c.framework == inp.framework]
    if inp.max_step is not None:
        candidates = [c for c in candidates if c.step is not None and c.step <= inp.max_step]
    candidates.sort(key=_Candidate.sort_key)
    which = "" if inp.framework == "auto" else f"{inp.framework} "
    if inp.max_step is not None:
        which += f"(at or before step {inp.max_step}) "
    if not candidates:
        return AutoResumeResult(found=False, skipped=skipped, candidates=0,
                                message=f"no {which}checkpoint in {folder}: start from scratch")

    chosen = None
    for cand in candidates:
        reason = cand.verify()
        if reason is None:
            chosen = cand
            break
        skipped.append(SkippedCheckpoint(path=str(cand.path), reason=reason))
    if chosen is None:
        return AutoResumeResult(
            found=False, skipped=skipped, candidates=len(candidates),
            message=f"none of the {len(candidates)} {which}checkpoints in {folder} is complete and "
                    "readable (see skipped): start from scratch")

    parts = [f"resume from {chosen.framework} checkpoint {chosen.path}"
             + (f" at step {chosen.step}" if chosen.step is not None
                else " (it records no step: the run decides where it continues)")]
    recompute = None
    if inp.current_step is not None and chosen.step is not None:
        recompute = max(0, inp.current_step - chosen.step)
        parts.append(f"{recompute} steps to recompute (the run had reached step {inp.current_step})")
        if inp.current_step < chosen.step:
            parts.append(f"note: the checkpoint is ahead of the reported current step {inp.current_step}")
    if skipped:
        parts.append(f"skipped {len(skipped)}: " + "; ".join(f"{Path(s.path).name}: {s.reason}"
                                                            for s in skipped))

    command = None
    if inp.command is not None:
        template = inp.resume_arg or DEFAULT_RESUME_ARGS.get(chosen.framework, SPEC_RESUME_ARG)
        if chosen.step is None and any("{step}" in t for t in template):
            parts.append("the resume template needs {step}, which this checkpoint does not record: "
                         "no command returned")
        else:
            command = inject_resume_args(inp.command, template, str(chosen.path), chosen.step)

    return AutoResumeResult(found=True, path=str(chosen.path), step=chosen.step,
                            framework=chosen.framework, command=command, skipped=skipped,
                            candidates=len(candidates), steps_to_recompute=recompute,
                            message="; ".join(parts))


# --- command injection --------------------------------------------------------------------------
def inject_resume_args(command: list[str], template: list[str], checkpoint: str,
                       step: int | None) -> list[str]:
    """Append the rendered template to `command`, first removing any flag of the template that is
    already there (`--flag VALUE` or `--flag=VALUE`), so a resume argument is replaced, not doubled."""
    rendered = [t.replace("{checkpoint}", checkpoint).replace("{step}", "" if step is None else str(step))
                for t in template]
    flags: dict[str, int] = {}  # flag -> number of values that follow it in the template
    current = None
    for token in template:
        if token.startswith("-") and "{" not in token:
            current = token.split("=", 1)[0]
            flags[current] = 0 if "=" not in token else -1
        elif current is not None and flags[current] >= 0:
            flags[current] += 1
    out: list[str] = []
    i = 0
    while i < len(command):
        token = command[i]
        if token in flags:
            i += 1 + max(flags[token], 0)
            continue
        if "=" in token and token.split("=", 1)[0] in flags:
            i += 1
            continue
        out.append(token)
        i += 1
    return out + rendered


# --- discovery ----------------------------------------------------------------------------------
def _scan(folder: Path) -> tuple[list[_Candidate], list[SkippedCheckpoint]]:
    found: list[_Candidate] = []
    skipped: list[SkippedCheckpoint] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        name = entry.name
        if _TMP_NAME.search(name):
            skipped.append(SkippedCheckpoint(path=str(entry), reason="leftover of an unfinished "
                                             "save (temporary name)"))
            continue
        if entry.is_dir():
            m = re.fullmatch(r"checkpoint-(\d+)", name)
            if m:
                step = _hf_global_step(entry)
                found.append(_Candidate(entry, "huggingface", int(m.group(1)) if step is None else step,
                                        lambda e=entry: _verify_hf_folder(e)))
            elif re.fullmatch(r"\d+", name) or (
                    re.fullmatch(r"[A-Za-z]\w*_\d+", name)
                    and any((entry / mk).exists() for mk in ORBAX_MARKERS)):
                step = int(re.search(r"(\d+)$", name).group(1))
                found.append(_Candidate(entry, "orbax", step, lambda e=entry: _verify_orbax(e)))
            continue
        if name == "checkpoint":
            found.extend(_tf_candidates(entry))
            continue
        m = re.fullmatch(r"step_(\d+)\.npz", name)
        if m:
            step = int(m.group(1))
            found.append(_Candidate(entry, "nightshift", step,
                                    lambda e=entry, s=step: _verify_npz(e, s)))
        elif name.endswith(".ckpt"):
            found.append(_Candidate(entry, "lightning", _step_of(name, entry, _torch_meta_step),
                                    lambda e=entry: _verify_torch(e)))
        elif name.endswith((".pt", ".pth", ".pth.tar")):
            found.append(_Candidate(entry, "pytorch", _step_of(name, entry, _torch_meta_step),
                                    lambda e=entry: _verify_torch(e)))
        elif name.endswith(".safetensors"):
            found.append(_Candidate(entry, "safetensors",
                                    _step_of(name, entry, _safetensors_meta_step),
                                    lambda e=entry: _verify_safetensors(e)))
    return found, skipped


def _step_of(name: str, path: Path, from_metadata: Callable[[Path], int | None]) -> int | None:
    step = _name_step(name)
    return from_metadata(path) if step is None else step


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
_STR_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING",
            "BINSTRING", "STRING"}
_MEMO_OPS = {"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"}
_MAX_OPS = 500_000


def _pickle_ops(f: BinaryIO) -> list[tuple[str, object]]:
    """The opcodes of one pickle up to its STOP; ValueError when it ends early or is not a pickle."""
    ops = []
    for op, arg, _ in pickletools.genops(f):
        ops.append((op.name, arg))
        if op.name == "STOP":
            return ops
        if len(ops) > _MAX_OPS:
            return ops
    raise ValueError("pickle ended before STOP")


def _pickled_step(f: BinaryIO) -> int | None:
    """The first integer stored under one of STEP_KEYS in one pickle, scanning opcodes only."""
    found: dict[str, int] = {}
    pending: str | None = None
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(f)):
            if count > _MAX_OPS or op.name == "STOP":
                break
            if op.name in _MEMO_OPS:
                continue
            if (pending is not None and op.name in _INT_OPS and isinstance(arg, int)
                    and not isinstance(arg, bool)):
                found.setdefault(pending, arg)
            pending = arg if op.name in _STR_OPS and arg in STEP_KEYS else None
            if "global_step" in found:
                break
    except (ValueError, EOFError):
        pass
    return next((found[k] for k in STEP_KEYS if k in found and found[k] >= 0), None)


def _torch_meta_step(path: Path) -> int | None:
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
                        return _pickled_step(pkl)
            f.seek(0)
            for _ in range(3):  # magic number, protocol version, sys_info
                _pickle_ops(f)
            return _pickled_step(f)
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
            return None, f"header length {n} does not fit the file ({size} bytes): truncated or corrupt"
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
        return None, (f"header promises {end_max} bytes of tensor data, the file holds {data_len}: "
                      "truncated")
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


def _tf_candidates(index_file: Path) -> list[_Candidate]:
    """Every prefix the TensorFlow `checkpoint` file lists (text proto), newest by step."""
    try:
        text = index_file.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    prefixes = re.findall(r'^\s*(?:all_)?model_checkpoint_paths?:\s*"((?:[^"\\]|\\.)*)"', text, re.MULTILINE)
    seen, out = set(), []
    for raw in prefixes:
        prefix = Path(raw) if Path(raw).is_absolute() else index_file.parent / raw
        if prefix in seen:
            continue
        seen.add(prefix)
        m = re.search(r"-(\d+)$", prefix.name)
        out.append(_Candidate(prefix, "tensorflow", int(m.group(1)) if m else None,
                              lambda p=prefix: _verify_tf_prefix(p)))
    return out


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
    return None
