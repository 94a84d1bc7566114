"""Metric points from whatever a training program writes, read a little at a time.

One interface over several sources, all giving the same points (step, name, value):

| source             | what is read                                                  | found as            |
| ------------------ | ------------------------------------------------------------- | ------------------- |
| `jsonl`            | nightshift's JSONL file: `{"step": N, "loss": ...}` per line  | `metrics.file`      |
| `log`              | the attempt's stdout/stderr, by `metrics.regex` (named groups)| the attempt's log   |
| `lightning_csv`    | Lightning `CSVLogger`'s `metrics.csv`                         | `metrics.csv`       |
| `hf_trainer_state` | Hugging Face `trainer_state.json` `log_history`               | `trainer_state.json`|
| `tensorboard`      | TensorBoard event files, through tensorboard's record reader  | `events.out.tfevents.*` |

`auto` takes the JSONL file when it appears, the log when regexes are given, and otherwise the first
of Lightning CSV, TensorBoard and trainer state found below the job's folder; it then sticks to it.

Reading is incremental: the cursor (plain JSON, stored with the attempt, so it survives a daemon
restart) holds each file's offset, and a tick reads only what was appended since, a bounded amount
at a time, and only whole lines or records. Files already present when an attempt starts belong to
earlier attempts and are read from their end. Lightning rewrites its CSV when a new column appears:
a changed header is noticed and the rows already read are skipped. `trainer_state.json` is
rewritten at every save: entries past the steps already read are taken. `nan`, `inf` and `-inf`
are values like any other (the divergence rule needs them). Text read is data, never instructions.

A point carries the source's own time where the source has one: a TensorBoard event's
`wall_time`, and a JSONL line's `time` or `timestamp` when it reads as a moment (seconds or
milliseconds since the epoch, after 2000, or an ISO 8601 text; a naive one is local time) — that
field is then the line's time, not a metric; one that does not (`"time": 0.23`, a step's
duration) stays a metric as before.

The first search root is the job's folder (engine.metric_roots puts it first). Every file in it is
opened through runtime/training/job_files.py, no link followed: in a shared install the folder is
the submitter's and the daemon reading it is root, so a `metrics.jsonl -> /etc/shadow` the job
planted reads as nothing (skipped like an unreadable file), never as the file it points to. A
file a spec names outside the job's folder is read as before.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.runtime.errors import OperatorError
from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.training import job_files
from nightshift.runtime.user_regex import PatternError, compile_pattern

# A JSONL line's own time, in this order (TensorBoard events carry theirs as wall_time).
TIME_KEYS = ("time", "timestamp")
EPOCH_2000 = 946_684_800.0  # seconds: a time field before this is a duration, not a moment
MAX_READ = 8 * 1024 * 1024  # bytes read from one file in one tick
MATCH_BUDGET_S = 0.5  # time one tick spends matching one log's new lines; the rest waits
MAX_LINE = (
    64 * 1024
)  # longer lines are cut before matching (a binary blob, a progress bar run wild)
MAX_DEPTH = 5  # how far below the job's folder metric files are looked for
MAX_ENTRIES = 20_000  # folder entries looked at per search, so a huge tree cannot stall a tick
FILE_NAMES = {"lightning_csv": "metrics.csv", "hf_trainer_state": "trainer_state.json"}
TB_PREFIX = "events.out.tfevents."
AUTO_ORDER = ("lightning_csv", "tensorboard", "hf_trainer_state")
SKIP_DIRS = {"good-checkpoints", "displaced", ".git", "__pycache__", "node_modules"}
# The job's folder while a cursor is made or read: files in it open without following links.
_JOB: ContextVar[Path | None] = ContextVar("nightshift_metric_job_folder", default=None)


@dataclass(frozen=True, slots=True)
class Point:
    step: int
    name: str
    value: float
    where: str | None = None  # file and line or record, for evidence
    # The source's own time for the point, in seconds since the epoch (a TensorBoard event's
    # wall_time, a JSONL line's `time`/`timestamp`); None where the source has none.
    wall_time: float | None = None


@dataclass
class Read:
    points: list[Point] = field(default_factory=list)
    output_bytes: int = 0  # new bytes in the attempt's log since the last read
    cursor: dict[str, Any] = field(default_factory=dict)


def start_cursor(
    spec: MetricSpec,
    *,
    log_path: Path,
    metrics_file: Path,
    search_roots: list[Path],
    min_step: int = 0,
) -> dict[str, Any]:
    """The cursor of an attempt about to start: every file already there is read from its end."""
    token = _JOB.set(search_roots[0] if search_roots else None)
    try:
        return _start_cursor(spec, log_path, metrics_file, search_roots, min_step)
    finally:
        _JOB.reset(token)


def _start_cursor(
    spec: MetricSpec, log_path: Path, metrics_file: Path, search_roots: list[Path], min_step: int
) -> dict[str, Any]:
    cursor: dict[str, Any] = {
        "log": _size(log_path),
        "log_line": 0,
        "min_step": min_step,
        "files": {},
        "kind": None if spec.source == "auto" else spec.source,
    }
    if metrics_file.is_file() and _kinds(spec) & {"jsonl"}:
        cursor["files"][str(metrics_file)] = {"offset": _size(metrics_file), "line": 0}
    for kind, path in _discover(spec, metrics_file, search_roots):
        cursor["files"][str(path)] = _at_end(kind, path)
    return cursor


def read_new(
    spec: MetricSpec,
    *,
    log_path: Path,
    metrics_file: Path,
    search_roots: list[Path],
    cursor: dict[str, Any],
) -> Read:
    """The points written since `cursor`, the log output's growth, and the cursor to keep."""
    token = _JOB.set(search_roots[0] if search_roots else None)
    try:
        return _read_new(spec, log_path, metrics_file, search_roots, cursor)
    finally:
        _JOB.reset(token)


def _read_new(
    spec: MetricSpec,
    log_path: Path,
    metrics_file: Path,
    search_roots: list[Path],
    cursor: dict[str, Any],
) -> Read:
    cur = json.loads(json.dumps(cursor))  # a private copy: the caller's stays as it was
    cur.setdefault("files", {})
    out = Read(cursor=cur)
    kind = cur.get("kind") or _detect(spec, metrics_file, search_roots, cur)
    cur["kind"] = kind

    chunk, start = _new_bytes(log_path, cur.get("log", 0))
    out.output_bytes = len(chunk)
    used = len(chunk)
    if kind == "log":
        points, used = _from_log(spec, chunk[: chunk.rfind(b"\n") + 1], log_path.name, cur)
        out.points += points
    cur["log"] = start + used

    if kind == "jsonl":
        out.points += _from_jsonl(
            metrics_file, cur["files"].setdefault(str(metrics_file), {"offset": 0, "line": 0})
        )
    elif kind in FILE_NAMES or kind == "tensorboard":
        for found_kind, path in _discover(spec, metrics_file, search_roots):
            if found_kind != kind:
                continue
            state = cur["files"].setdefault(str(path), {})
            if kind == "lightning_csv":
                out.points += _from_csv(path, state)
            elif kind == "tensorboard":
                out.points += _from_tensorboard(path, state)
            else:
                out.points += _from_trainer_state(path, state, cur)
    return out


# --- which source -------------------------------------------------------------------------------
def _kinds(spec: MetricSpec) -> set[str]:
    if spec.source != "auto":
        return {spec.source}
    return {"jsonl", *AUTO_ORDER} | ({"log"} if spec.regexes() else set())


def _detect(
    spec: MetricSpec, metrics_file: Path, roots: list[Path], cur: dict[str, Any]
) -> str | None:
    """For source auto: the JSONL file, else the log (regexes given), else a framework's file that
    this attempt has written (one already there at the start and unchanged does not count)."""
    if spec.source != "auto":
        return spec.source
    if spec.regexes():
        return "log"
    if metrics_file.is_file() and _size(metrics_file) > cur["files"].get(str(metrics_file), {}).get(
        "offset", 0
    ):
        return "jsonl"
    found = _discover(spec, metrics_file, roots)
    for kind in AUTO_ORDER:
        for k, path in found:
            if k == kind and _changed(kind, path, cur["files"].get(str(path))):
                return kind
    return None


def _changed(kind: str, path: Path, state: dict[str, Any] | None) -> bool:
    if state is None:
        return True
    if kind == "hf_trainer_state":
        return _signature(path) != state.get("sig")
    return _size(path) > state.get("offset", 0)


def _discover(spec: MetricSpec, metrics_file: Path, roots: list[Path]) -> list[tuple[str, Path]]:
    """The framework metric files below the spec's `metrics.file` (a file or a folder) or, when it
    names nothing that exists, below the search roots; sorted, so the order is stable."""
    kinds = _kinds(spec) - {"jsonl", "log"}
    if not kinds:
        return []
    if metrics_file.is_file():
        kind = _kind_of(metrics_file.name)
        return [(kind, metrics_file)] if kind in kinds else []
    bases = [metrics_file] if metrics_file.is_dir() else roots
    found: dict[Path, str] = {}
    for base in bases:
        for path in _walk(base):
            kind = _kind_of(path.name)
            if kind in kinds:
                found.setdefault(path, kind)
    return sorted(((k, p) for p, k in found.items()), key=lambda kp: str(kp[1]))


def event_folders(roots: list[Path]) -> list[Path]:
    """The folders below `roots` that hold TensorBoard event files, found the way the metrics are
    (no link followed, bounded), whatever the spec's metric source: what TensorBoard shows of a
    job (agent/doors/web/tensorboard.py)."""
    found = {p.parent for base in roots for p in _walk(base) if _kind_of(p.name) == "tensorboard"}
    return sorted(found)


def _kind_of(name: str) -> str | None:
    if name.startswith(TB_PREFIX):
        return "tensorboard"
    return next((k for k, n in FILE_NAMES.items() if n == name), None)


def _walk(base: Path) -> Iterator[Path]:
    """Files below `base`, breadth first, to MAX_DEPTH, without following symlinked folders."""
    level, seen = [base], 0
    for _ in range(MAX_DEPTH + 1):
        nxt = []
        for folder in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > MAX_ENTRIES:
                    return
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in SKIP_DIRS:
                            nxt.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        yield Path(entry.path)
                except OSError:
                    continue
        level = nxt


def _at_end(kind: str, path: Path) -> dict[str, Any]:
    """A file's state as if everything in it had been read (it belongs to an earlier attempt)."""
    if kind == "hf_trainer_state":
        return {"sig": _signature(path)}
    state: dict[str, Any] = {"offset": _size(path)}
    if kind == "lightning_csv":
        rows = _read_range(path, 0, MAX_READ * 4).splitlines()
        state.update(
            header=rows[0].decode("utf-8", "replace") if rows else None, rows=max(0, len(rows) - 1)
        )
    return state


# --- the sources --------------------------------------------------------------------------------
def _from_log(
    spec: MetricSpec, chunk: bytes, name: str, cur: dict[str, Any]
) -> tuple[list[Point], int]:
    """The points in the whole lines of `chunk`, matched on RE2 (runtime/user_regex.py: linear
    time, whatever the pattern), and how many bytes were read: past MATCH_BUDGET_S the rest is
    left for the next tick, so a flood of output never holds the loop."""
    patterns = []
    for p in spec.regexes():
        try:
            patterns.append(compile_pattern(p))
        except PatternError:
            continue  # a job stored before RE2: its spec fails validation when it is loaded
    points: list[Point] = []
    used = 0
    deadline = time.monotonic() + MATCH_BUDGET_S
    for raw in chunk.splitlines(keepends=True):
        if used and time.monotonic() > deadline:
            break
        used += len(raw)
        raw = raw.rstrip(b"\r\n")
        cur["log_line"] = cur.get("log_line", 0) + 1
        # A progress bar redraws one line with carriage returns: each redraw is a line of its own.
        for line in raw[:MAX_LINE].decode("utf-8", "replace").split("\r"):
            for rx in patterns:
                m = rx.search(line)
                if m is None:
                    continue
                step = _int(m.group("step"))
                if step is None:
                    continue
                for group, text in m.groupdict().items():
                    value = _float(text)
                    if group != "step" and value is not None:
                        points.append(
                            Point(
                                step,
                                spec.name if group == "value" else group,
                                value,
                                f"{name} line {cur['log_line']}",
                            )
                        )
    return points, used


def _from_jsonl(path: Path, state: dict[str, Any]) -> list[Point]:
    chunk, start = _new_bytes(path, state.get("offset", 0))
    end = chunk.rfind(b"\n") + 1
    state["offset"] = start + end
    points = []
    for raw in chunk[:end].splitlines():
        state["line"] = state.get("line", 0) + 1
        try:
            rec = json.loads(raw[:MAX_LINE])
        except ValueError:
            continue  # a torn or foreign line is data we skip
        if not isinstance(rec, dict) or type(rec.get("step")) is not int:
            continue
        time_key = next((k for k in TIME_KEYS if wall_time(rec.get(k)) is not None), None)
        when = wall_time(rec[time_key]) if time_key else None
        for key, value in rec.items():
            if key not in ("step", time_key) and type(value) in (int, float):
                points.append(
                    Point(rec["step"], key, float(value), f"{path.name} line {state['line']}", when)
                )
    return points


def wall_time(value: Any) -> float | None:
    """A JSONL line's time field as seconds since the epoch, or None when it is not a moment:
    a number of seconds or milliseconds after 2000 (`time.time()`, `Date.now()`), or an ISO 8601
    text (`datetime.now().isoformat()`: a naive one is local time, as Python reads it)."""
    if type(value) in (int, float):
        v = float(value)
        if EPOCH_2000 <= v < EPOCH_2000 * 100:
            return v
        if EPOCH_2000 * 1000 <= v < EPOCH_2000 * 100_000:
            return v / 1000
        return None
    if isinstance(value, str) and 10 <= len(value) <= 40:
        try:
            t = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        return t.timestamp() if t.year >= 2000 else None
    return None


def _from_csv(path: Path, state: dict[str, Any]) -> list[Point]:
    """Lightning appends rows, and rewrites the whole file with a wider header when a metric first
    appears: then the rows already read are skipped by count."""
    head = _read_range(path, 0, MAX_LINE).split(b"\n", 1)[0].decode("utf-8", "replace")
    size = _size(path)
    skip = 0
    if state.get("header") is not None and (head != state["header"] or size < state["offset"]):
        state["offset"], skip = 0, state.get("rows", 0)
    chunk, start = _new_bytes(path, state.get("offset", 0))
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].decode("utf-8", "replace").splitlines()
    if start == 0:
        if not lines:
            return []
        lines = lines[1:]  # the header
        state["rows"] = 0
    state.update(offset=start + end, header=head)
    columns = next(csv.reader([head]))
    points = []
    for row in csv.reader(lines):
        state["rows"] = state.get("rows", 0) + 1
        if skip > 0:
            skip -= 1
            continue
        rec = dict(zip(columns, row, strict=False))
        step = _int(rec.get("step", ""))
        if step is None:
            continue
        for key, text in rec.items():
            value = _float(text)
            if key not in ("step", "epoch") and value is not None:
                points.append(
                    Point(step, key, value, f"{path.parent.name}/{path.name} row {state['rows']}")
                )
    return points


def _from_trainer_state(path: Path, state: dict[str, Any], cur: dict[str, Any]) -> list[Point]:
    """`log_history` entries past the newest step already read, per metric (a resumed run logs the
    steps after its checkpoint again; those are new points of this attempt)."""
    sig = _signature(path)
    if sig == state.get("sig"):
        return []
    try:
        history = json.loads(_read_range(path, 0, MAX_READ)).get("log_history") or []
    except (ValueError, AttributeError):
        return []  # being rewritten: next tick
    state["sig"] = sig
    seen = cur.setdefault("hf_seen", {})
    floor = cur.get("min_step", 0)
    points = []
    for entry in history if isinstance(history, list) else []:
        step = entry.get("step") if isinstance(entry, dict) else None
        if type(step) is not int:
            continue
        for key, value in entry.items():
            if key in ("step", "epoch") or type(value) not in (int, float):
                continue
            if step > seen.get(key, floor):
                points.append(Point(step, key, float(value), f"{path.parent.name}/{path.name}"))
    for p in points:
        seen[p.name] = max(seen.get(p.name, floor), p.step)
    return points


def _from_tensorboard(path: Path, state: dict[str, Any]) -> list[Point]:
    """Scalars from an event file, from its offset: tensorboard's own record reader (length, CRCs)
    reads the records and its protobuf classes parse them; a record still being written is left
    for the next tick."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
        from tensorboard.util import tensor_util
    except ImportError:
        raise OperatorError(
            "metrics.source is tensorboard, but the tensorboard package is not "
            "installed: pip install 'nightshift[tensorboard]'"
        ) from None
    offset = state.get("offset", 0)
    if _size(path) <= offset:
        return []
    reader = pywrap_tensorflow.PyRecordReader_New(str(path))
    # The compat reader cannot start at an offset itself; its file reads from this token.
    reader.file_handle.continuation_token = {"opaque_offset": offset}
    points: list[Point] = []
    try:
        while offset - state.get("offset", 0) < MAX_READ:
            try:
                reader.GetNext()
            except (errors.OutOfRangeError, errors.DataLossError):
                break  # the end, or a record cut short that a later write completes
            record = reader.curr_event
            offset += 16 + len(record)  # length (8), its CRC (4), the record, its CRC (4)
            event = event_pb2.Event.FromString(record)
            for v in event.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":
                    value = float(v.simple_value)
                elif kind == "tensor" and v.tensor.dtype in (1, 2, 19):  # float, double, half
                    arr = tensor_util.make_ndarray(v.tensor)
                    if arr.size != 1:
                        continue
                    value = float(arr.reshape(-1)[0])
                else:
                    continue
                points.append(
                    Point(int(event.step), v.tag, value, f"{path.name}", event.wall_time or None)
                )
    finally:
        reader.file_handle.close()
    state["offset"] = offset
    return points


# --- small readers ------------------------------------------------------------------------------
def _stat(path: Path) -> os.stat_result | None:
    """The file's own status; None when it cannot be read or is refused (a link in the job's
    folder): such a file counts as empty, like one that is not there yet."""
    job = _JOB.get()
    try:
        if job is not None and job_files.relative_in(job, path) is not None:
            with job_files.open_file(job, path) as f:
                return os.fstat(f.fileno())
        return path.stat()
    except (OSError, job_files.JobFileRefused):
        return None


def _size(path: Path) -> int:
    st = _stat(path)
    return 0 if st is None else st.st_size


def _signature(path: Path) -> list[int] | None:
    st = _stat(path)
    return None if st is None else [st.st_mtime_ns, st.st_size, st.st_ino]


def _read_range(path: Path, start: int, limit: int) -> bytes:
    job = _JOB.get()
    try:
        if job is not None and job_files.relative_in(job, path) is not None:
            return job_files.read_range(job, path, start, limit)
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(limit)
    except (OSError, job_files.JobFileRefused):
        return b""


def _new_bytes(path: Path, offset: int) -> tuple[bytes, int]:
    """What was appended after `offset` (at most MAX_READ), and where it starts; a file that
    shrank (truncated and rewritten) is read from its start."""
    size = _size(path)
    if size < offset:
        offset = 0
    return (_read_range(path, offset, MAX_READ) if size > offset else b""), offset


def _int(text: str | None) -> int | None:
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _float(text: str | None) -> float | None:
    """A number as programs print it: `1.25`, `nan`, `inf`, `-inf`, `1.2e-3,` (trailing comma)."""
    if text is None:
        return None
    try:
        return float(text.strip().rstrip(",;"))
    except ValueError:
        return None
