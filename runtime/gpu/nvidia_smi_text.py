"""Readers for the nvidia-smi outputs people save and paste into tickets: the `nvidia-smi -q` report,
the default table (`nvidia-smi` with no arguments) and the `--query-gpu … --format=csv` CSV.

Pure functions, text in and `GpuReading`s out, under the field value convention of
`nightshift.runtime.gpu.gpu`: a field holds a value only when the output printed one; `N/A` or
`[Not Supported]` makes it unsupported; `ERR!`, `[Unknown Error]` or `GPU is lost` makes it
unreadable (and the last marks the GPU lost); a field the format does not print at all is absent.
The default table prints far fewer fields than `-q`: what it lacks (throttle reasons, retired pages,
remapped rows, the UUID …) is absent, never unsupported and never zero.

`-q` and the table do not print the NVML index; a GPU's index is its position in the output, which
is the index nvidia-smi itself uses when it lists every GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from nightshift.runtime.gpu.driver_messages import find_driver_messages, machine_wide
from nightshift.runtime.gpu.gpu import (
    ERROR_CELLS,
    UNSUPPORTED_CELLS,
    GpuProcess,
    GpuReading,
    ProbeResult,
    lost_in_output,
    parse_query_compute_apps_csv,
    parse_query_gpu_csv,
    versions_in_header,
)
from nightshift.runtime.gpu.xid import (
    find_xid_events,
    findings,
    gpu_uuids,
    looks_like_kernel_log,
)

Format = Literal["csv", "q", "table"]
# What a saved or pasted text can hold: one of nvidia-smi's outputs, only nvidia-smi's own error
# messages, or a kernel log with `NVRM: Xid` lines.
Source = Literal["csv", "q", "table", "driver", "kernel"]
FORMAT_NAMES: dict[str, str] = {
    "csv": "nvidia-smi --query-gpu CSV",
    "q": "nvidia-smi -q report",
    "table": "nvidia-smi default table",
    "driver": "nvidia-smi error message",
    "kernel": "kernel log (NVRM Xid lines)",
}

# Words nvidia-smi prints instead of a value, compared without brackets and in lower case.
_UNSUPPORTED = {c.strip("[]") for c in UNSUPPORTED_CELLS} | {"not available", "unsupported"}
_ERRORS = {c.strip("[]") for c in ERROR_CELLS} | {"err", "error", "gpu is lost"}

# `-q` labels of the clock-event (formerly "throttle") reasons → the names NVML's bits have.
_REASON_LABELS: dict[str, str] = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}

# Header cells that mark `--query-gpu` CSV, and the ones of `--query-compute-apps`.
_QUERY_GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "temperature.gpu",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "power.draw",
    "fan.speed",
}
_QUERY_APPS_KEYS = {"gpu_uuid", "pid"}

_NUMBER = re.compile(
    r"^\s*(?P<num>[-+]?\d+(?:\.\d+)?)\s*(?P<unit>MiB|GiB|KiB|W|%|C|MHz|mJ|kJ|J|us|ms)?\s*$",
    re.IGNORECASE,
)
_GPU_HEADER = re.compile(
    r"^(?P<indent>[ \t]*)GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$"
)


def cell_kind(raw: str) -> Literal["value", "unsupported", "unreadable"]:
    """Whether a printed value is a value, says the card lacks the field, or says the read failed."""
    low = " ".join(raw.strip().lower().split())
    core = low.strip("[]").strip()
    if core in _ERRORS or "err!" in low or "gpu is lost" in low or core.startswith("unknown error"):
        return "unreadable"
    if core in _UNSUPPORTED or core == "" or core.startswith("requested functionality"):
        return "unsupported"
    return "value"


def _number(raw: str) -> float:
    """'81559 MiB', '59 C', '629.45 W', '100 %', '59C', '629W' → the number; anything else raises."""
    m = _NUMBER.match(raw)
    if m is None:
        raise ValueError(raw)
    return float(m["num"])


def _int(raw: str) -> int:
    return int(_number(raw))


def _energy_mj(raw: str) -> int:
    """'123456.789 J' → 123456789 mJ (the unit NVML's energy counter uses)."""
    m = _NUMBER.match(raw)
    if m is None:
        raise ValueError(raw)
    scale = {"mj": 1, "j": 1000, "kj": 1_000_000}.get((m["unit"] or "mj").lower())
    if scale is None:
        raise ValueError(raw)
    return round(float(m["num"]) * scale)


def _flag(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"yes", "true", "active", "enabled"}:
        return True
    if low in {"no", "false", "not active", "disabled", "none"}:
        return False
    raise ValueError(raw)


class _Fields:
    """Collects one GPU's fields; the first report of a field wins, each lands in one place."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.unsupported: list[str] = []
        self.unreadable: list[str] = []
        self.errors: dict[str, str] = {}
        self.lost = False

    def has(self, name: str) -> bool:
        return name in self.values or name in self.unsupported or name in self.unreadable

    def put(self, name: str, raw: str | None, convert: Callable[[str], Any] = _number) -> None:
        """Record `raw` for `name`; None means the output does not print the field (absent).
        `convert` returns None for a printed word that carries no value for this field."""
        if raw is None or self.has(name):
            return
        kind = cell_kind(raw)
        if kind == "unsupported":
            self.unsupported.append(name)
        elif kind == "unreadable":
            self.fail(name, raw.strip())
        else:
            try:
                value = convert(raw)
            except ValueError:
                self.fail(name, f"cannot parse {raw.strip()!r}")
                return
            if value is not None:
                self.values[name] = value

    def set(self, name: str, value: Any) -> None:
        if not self.has(name):
            self.values[name] = value

    def mark(self, name: str, kind: str, raw: str = "") -> None:
        if self.has(name):
            return
        if kind == "unsupported":
            self.unsupported.append(name)
        elif kind == "unreadable":
            self.fail(name, raw)

    def fail(self, name: str, text: str) -> None:
        self.unreadable.append(name)
        self.errors[name] = text
        if "gpu is lost" in text.lower():
            self.lost = True

    def reading(self, index: int, **meta: Any) -> GpuReading:
        return GpuReading(
            index=index,
            **{k: v for k, v in meta.items() if v is not None},
            **self.values,
            unsupported=self.unsupported,
            unreadable=self.unreadable,
            errors=self.errors,
            lost=self.lost,
        )


def _counts(nodes: list[_Node]) -> tuple[str, Any]:
    """Sum of counter nodes: ('value', n), ('unsupported', None), ('unreadable', raw) or ('absent', None)."""
    values: list[int] = []
    unsupported = False
    for node in nodes:
        if node.value is None:
            continue
        kind = cell_kind(node.value)
        if kind == "unreadable":
            return "unreadable", node.value
        if kind == "unsupported":
            unsupported = True
            continue
        try:
            values.append(_int(node.value))
        except ValueError:
            return "unreadable", f"cannot parse {node.value!r}"
    if values:
        return "value", sum(values)
    return ("unsupported", None) if unsupported else ("absent", None)


def _put_counts(f: _Fields, name: str, nodes: list[_Node]) -> None:
    kind, value = _counts(nodes)
    if kind == "value":
        f.set(name, value)
    elif kind != "absent":
        f.mark(name, kind, value or "")


# ------------------------------------------------------------------------------------------ -q
def _norm(key: str) -> str:
    return " ".join(key.lower().split())


@dataclass
class _Node:
    """One `Key : value` line of `nvidia-smi -q`; lines indented under it are its children."""

    key: str
    value: str | None = None
    children: list[_Node] = field(default_factory=list)

    def get(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for part in path:
            want = _norm(part)
            node = next((c for c in node.children if _norm(c.key) == want), None) if node else None
        return node

    def value_at(self, *path: str) -> str | None:
        node = self.get(*path)
        return node.value if node is not None else None

    def walk(self) -> Iterator[_Node]:
        for c in self.children:
            yield c
            yield from c.walk()


def _q_blocks(text: str) -> list[_Node]:
    """One tree per `GPU 00000000:00:09.0` block, whatever the paste's own indentation."""
    blocks: list[_Node] = []
    stack: list[tuple[int, _Node]] = []
    base = 0
    for line in text.replace("\t", "    ").splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        header = _GPU_HEADER.match(line)
        if header:
            root = _Node("GPU", header["bus"])
            blocks.append(root)
            base, stack = indent, [(indent, root)]
            continue
        if not stack:
            continue
        if indent <= base:  # back at the top level: the GPU block has ended
            stack = []
            continue
        key, sep, value = line.strip().partition(":")
        node = _Node(key.strip(), value.strip() if sep else None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return blocks


def _first(section: _Node | None, *keys: str) -> str | None:
    """The first of `keys` that holds a value; else the first printed at all (N/A, ERR!); else None."""
    if section is None:
        return None
    printed = [v for v in (section.value_at(k) for k in keys) if v is not None]
    return next((v for v in printed if cell_kind(v) == "value"), printed[0] if printed else None)


def _section_word(f: _Fields, section: _Node, *names: str) -> bool:
    """`Remapped Rows : N/A`: a section printed as one word stands for all its fields."""
    if section.value is None or section.children:
        return False
    for name in names:
        f.put(name, section.value, lambda _raw: None)
    return True


def _q_reading(block: _Node, position: int) -> GpuReading:
    f = _Fields()
    temp = block.get("Temperature")
    if temp is not None:
        f.put("temperature_c", temp.value_at("GPU Current Temp"))
        # Absolute thresholds only: the 'T.Limit' variants are offsets from the T.Limit, not °C.
        f.put("temp_slowdown_c", temp.value_at("GPU Slowdown Temp"))
        f.put("temp_shutdown_c", temp.value_at("GPU Shutdown Temp"))
    fb = block.get("FB Memory Usage")
    if fb is not None:
        f.put("memory_total_mib", fb.value_at("Total"), _int)
        f.put("memory_used_mib", fb.value_at("Used"), _int)
    util = block.get("Utilization")
    if util is not None:
        f.put("utilization_pct", util.value_at("GPU"))
    power = block.get("GPU Power Readings") or block.get("Power Readings")
    f.put("power_w", _first(power, "Power Draw", "Average Power Draw", "Instantaneous Power Draw"))
    f.put(
        "power_limit_w",
        _first(power, "Enforced Power Limit", "Current Power Limit", "Power Limit"),
    )
    energy = next((n for n in block.walk() if _norm(n.key) == "total energy consumption"), None)
    if energy is not None:
        f.put("energy_mj", energy.value, _energy_mj)
    f.put("fan_pct", block.value_at("Fan Speed"))

    ecc = block.get("ECC Errors")
    if ecc is not None and not _section_word(
        f, ecc, "ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"
    ):
        for name, scope in (
            ("ecc_volatile_uncorrected", "Volatile"),
            ("ecc_aggregate_uncorrected", "Aggregate"),
        ):
            section = ecc.get(scope)
            if section is None:
                continue
            double = section.get("Double Bit")  # drivers before Ampere: Single/Double Bit → Total
            nodes = (
                [double.get("Total") or double]
                if double is not None
                else [c for c in section.children if "uncorrectable" in _norm(c.key)]
            )
            _put_counts(f, name, nodes)

    retired = block.get("Retired Pages")
    if retired is not None and not _section_word(f, retired, "retired_pages"):
        nodes = []
        for key in ("Single Bit ECC", "Double Bit ECC"):
            node = retired.get(key)
            if node is not None:
                nodes.append(node if node.value is not None else (node.get("Count") or node))
        _put_counts(f, "retired_pages", nodes)

    remap = block.get("Remapped Rows")
    if remap is not None and not _section_word(
        f, remap, "remapped_rows_pending", "remapped_rows_failed"
    ):
        f.put("remapped_rows_pending", remap.value_at("Pending"), _flag)
        f.put("remapped_rows_failed", remap.value_at("Remapping Failure Occurred"), _flag)

    reasons = block.get("Clocks Event Reasons") or block.get("Clocks Throttle Reasons")
    if reasons is not None and not _section_word(f, reasons, "throttle_reasons"):
        active: list[str] = []
        kinds: list[str] = []
        for node in reasons.walk():
            reason = _REASON_LABELS.get(_norm(node.key))
            if reason is None or node.value is None:
                continue
            kind = cell_kind(node.value)
            kinds.append(kind)
            if kind == "unreadable":
                f.mark("throttle_reasons", "unreadable", node.value)
            elif kind == "value" and _norm(node.value) == "active":
                active.append(reason)
        if "value" in kinds:
            f.set("throttle_reasons", active)
        elif kinds:
            f.mark("throttle_reasons", "unsupported")

    mig = block.get("MIG Mode")
    if mig is not None:
        f.put("mig_mode", mig.value if mig.value else mig.value_at("Current"), str.strip)

    procs = block.get("Processes")
    if procs is not None:
        if procs.children:
            f.set("processes", _q_processes(procs))
        elif procs.value is not None:
            f.put("processes", procs.value, lambda raw: [] if _norm(raw) == "none" else None)

    if any(n.value and "gpu is lost" in n.value.lower() for n in block.walk()):
        f.lost = True
    return f.reading(
        position,
        uuid=_plain(block.value_at("GPU UUID")),
        name=_plain(block.value_at("Product Name")),
        pci_bus_id=_plain(block.value_at("PCI", "Bus Id")) or block.value,
    )


def _plain(raw: str | None) -> str | None:
    return raw.strip() if raw is not None and cell_kind(raw) == "value" else None


def _process(pid: str, kind: str | None, name: str | None, memory: str | None) -> GpuProcess | None:
    """A compute process (graphics-only 'G' ones are not); WDDM's 'N/A' memory is None."""
    if kind is not None and kind.strip().upper() == "G":
        return None
    used = None
    if memory is not None and cell_kind(memory) == "value":
        try:
            used = _int(memory)
        except ValueError:
            used = None  # "Not available in WDDM driver model"
    return GpuProcess(pid=int(pid), name=name.strip() if name else None, used_memory_mib=used)


def _q_processes(section: _Node) -> list[GpuProcess]:
    out = []
    for node in section.children:
        if _norm(node.key) != "process id" or not (node.value or "").strip().isdigit():
            continue
        p = _process(
            node.value or "",
            node.value_at("Type"),
            node.value_at("Name"),
            node.value_at("Used GPU Memory"),
        )
        if p is not None:
            out.append(p)
    return out


def parse_q_text(text: str) -> list[GpuReading]:
    """Parse `nvidia-smi -q` output: one reading per `GPU <bus id>` block, in the order printed."""
    return [_q_reading(block, i) for i, block in enumerate(_q_blocks(text))]


# --------------------------------------------------------------------------------------- table
def _box_rows(lines: list[str], start: int) -> list[list[list[str]]]:
    """The rows of one table box after its `|===|` line, grouped between `+---+` lines; each row is
    its cells (split on '|'). Stops at the first line that is not part of the box."""
    i = start
    while i < len(lines) and not lines[i].strip().startswith("|="):
        if not lines[i].strip():
            return []
        i += 1
    groups: list[list[list[str]]] = [[]]
    for line in lines[i + 1 :]:
        s = line.strip()
        if s.startswith("+"):
            groups.append([])
        elif s.startswith("|"):
            groups[-1].append(s.strip("|").split("|"))
        else:
            break
    return [g for g in groups if g]


def _find(lines: list[str], test: Callable[[str], bool]) -> int | None:
    return next((i for i, line in enumerate(lines) if test(line)), None)


def _table_gpu(rows: list[list[str]]) -> tuple[int, dict[str, str | None], _Fields] | None:
    """Index, name and bus id, and the fields of one GPU's two or three lines in the GPU box."""
    first = rows[0]
    head = re.match(r"^\s*(?P<index>\d+)\s+(?P<rest>.*?)\s*$", first[0])
    if head is None:
        return None
    named = re.match(r"^(?P<name>.*?)\s{2,}\S+$", head["rest"])  # the name, then Persistence-M
    name = (named["name"] if named else head["rest"]).strip() or None
    bus = first[1].split()[0] if len(first) > 1 and first[1].split() else None
    f = _Fields()
    if len(first) > 2:
        # Volatile Uncorr. ECC: a count, N/A without ECC, or 'On' under MIG (counts are per instance).
        f.put("ecc_volatile_uncorrected", first[2], _count_or_none)
    if len(rows) > 1:
        second = rows[1]
        tokens = second[0].split()  # Fan Temp Perf Pwr:Usage/Cap
        if len(tokens) >= 3:
            f.put("fan_pct", tokens[0])
            f.put("temperature_c", tokens[1])
            usage, slash, cap = " ".join(tokens[3:]).partition("/")
            f.put("power_w", usage.strip() or None)
            if slash:
                f.put("power_limit_w", cap.strip() or None)
        if len(second) > 1:  # Memory-Usage
            used, slash, total = second[1].partition("/")
            f.put("memory_used_mib", used.strip() or None, _int)
            if slash:
                f.put("memory_total_mib", total.strip() or None, _int)
        if len(second) > 2 and second[2].split():  # GPU-Util Compute M.
            f.put("utilization_pct", second[2].split()[0])
    if len(rows) > 2 and len(rows[2]) > 2 and rows[2][2].strip():  # MIG M.
        f.put("mig_mode", rows[2][2], str.strip)
    return int(head["index"]), {"name": name, "pci_bus_id": bus}, f


def _count_or_none(raw: str) -> int | None:
    return _int(raw) if raw.strip()[:1].isdigit() else None


def _table_mig_ecc(lines: list[str]) -> dict[int, list[_Node]]:
    """Volatile uncorrected ECC counters per GPU from the 'MIG devices' box, one per GPU instance:
    the compute instances of a GPU instance share its memory and print the same count."""
    at = _find(lines, lambda ln: "MIG devices:" in ln)
    if at is None:
        return {}
    per_gi: dict[tuple[int, int], _Node] = {}
    for rows in _box_rows(lines, at + 1):
        ids = rows[0][0].split()  # GPU GI CI MIG-Dev
        if len(ids) != 4 or not all(x.isdigit() for x in ids) or len(rows[0]) < 3:
            continue
        cells = rows[0][2].split()  # SM, Vol Unc ECC
        if len(cells) >= 2:
            per_gi.setdefault((int(ids[0]), int(ids[1])), _Node("Unc ECC", cells[1]))
    out: dict[int, list[_Node]] = {}
    for (gpu, _gi), node in sorted(per_gi.items()):
        out.setdefault(gpu, []).append(node)
    return out


_PROC_GI = re.compile(
    r"^\s*(?P<gpu>\d+)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+"
    r"(?P<name>.*?)\s+(?P<mem>\d+\s*MiB|N/A|\[N/A\])\s*$"
)
_PROC_OLD = re.compile(
    r"^\s*(?P<gpu>\d+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+(?P<name>.*?)\s+"
    r"(?P<mem>\d+\s*MiB|N/A|\[N/A\])\s*$"
)


def _table_processes(lines: list[str]) -> dict[int, list[GpuProcess]] | None:
    """Compute processes per GPU index from the 'Processes:' box; None when the paste has no such box."""
    at = _find(lines, lambda ln: "Processes:" in ln and "|" in ln)
    if at is None:
        return None
    header_end = _find(lines[at:], lambda ln: ln.strip().startswith("|="))
    if header_end is None:
        return None
    with_gi = any(" GI " in ln for ln in lines[at : at + header_end])
    pattern = _PROC_GI if with_gi else _PROC_OLD
    out: dict[int, list[GpuProcess]] = {}
    for rows in _box_rows(lines, at + 1):
        for cells in rows:
            m = pattern.match("|".join(cells))
            if m is None:
                continue
            p = _process(m["pid"], m["type"], m["name"], m["mem"])
            if p is not None:
                out.setdefault(int(m["gpu"]), []).append(p)
    return out


def parse_table(text: str) -> list[GpuReading]:
    """Parse the default `nvidia-smi` table: the GPU box (two or three lines per GPU), the
    'MIG devices' box (per-instance ECC counts) and the 'Processes' box."""
    lines = text.splitlines()
    at = _find(lines, lambda ln: "Bus-Id" in ln and "|" in ln)
    if at is None:
        return []
    mig_ecc = _table_mig_ecc(lines)
    processes = _table_processes(lines)
    out = []
    for rows in _box_rows(lines, at):
        parsed = _table_gpu(rows)
        if parsed is None:
            continue
        index, meta, f = parsed
        if index in mig_ecc:
            _put_counts(f, "ecc_volatile_uncorrected", mig_ecc[index])
        if processes is not None:
            f.set("processes", processes.get(index, []))
        out.append(f.reading(index, **meta))
    return out


# --------------------------------------------------------------------------------------- detect
def _csv_keys(line: str) -> set[str]:
    return {c.split("[", 1)[0].strip().lower() for c in line.split(",")}


def detect_format(text: str) -> Format | None:
    """Which nvidia-smi output `text` holds, or None when it is none of the three."""
    lines = text.splitlines()
    if "NVSMI LOG" in text or any(_GPU_HEADER.match(ln) for ln in lines):
        return "q"
    if any("|" in ln and ("Bus-Id" in ln or "NVIDIA-SMI" in ln) for ln in lines):
        return "table"
    if any("," in ln and _csv_keys(ln) & _QUERY_GPU_KEYS for ln in lines):
        return "csv"
    return None


def _parse_csv(text: str) -> list[GpuReading]:
    """`--query-gpu` CSV from its header line on; a `--query-compute-apps` CSV pasted after it
    attaches each GPU's processes."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not lost_in_output(ln)]
    start = next(i for i, ln in enumerate(lines) if "," in ln and _csv_keys(ln) & _QUERY_GPU_KEYS)
    apps_at = next(
        (i for i, ln in enumerate(lines) if i > start and _QUERY_APPS_KEYS <= _csv_keys(ln)),
        None,
    )
    gpu_lines = lines[start:apps_at]
    gpus = parse_query_gpu_csv("\n".join(gpu_lines))
    if apps_at is not None:
        by_uuid = parse_query_compute_apps_csv("\n".join(lines[apps_at:]))
        for g in gpus:
            g.processes = by_uuid.get(g.uuid or "", [])
    return gpus


def parse_any(text: str) -> tuple[Format, list[GpuReading]]:
    """Detect the format (CSV with its header line, `-q`, or the default table) and parse it.
    Raises ValueError, saying what was expected, for anything else."""
    fmt = detect_format(text)
    if fmt in ("q", "table"):
        readings = parse_q_text(text) if fmt == "q" else parse_table(text)
        driver, cuda = versions_in_header(text)  # printed once, for every GPU
        for r in readings:
            r.driver_version = r.driver_version or driver
            r.cuda_version = r.cuda_version or cuda
        return fmt, readings
    if fmt == "csv":
        return fmt, _parse_csv(text)
    if any("," in ln and _QUERY_APPS_KEYS <= _csv_keys(ln) for ln in text.splitlines()):
        raise ValueError(
            "this is `nvidia-smi --query-compute-apps` output: it lists processes but no GPU "
            "readings; paste `nvidia-smi -q`, the default `nvidia-smi` table, or "
            "`--query-gpu=… --format=csv` output too"
        )
    raise ValueError(
        "not recognised as nvidia-smi output or a kernel log: expected the default `nvidia-smi` "
        "table, `nvidia-smi -q`, `nvidia-smi --query-gpu=… --format=csv` with its header line, "
        "one of nvidia-smi's error messages, or kernel log lines with `NVRM: Xid` "
        "(`journalctl -k` or `dmesg`)"
    )


class TextProbe:
    """Saved or pasted nvidia-smi output, or a kernel log, read like a probe, so the same verdict
    rules judge it. The text is parsed when the probe is made: a ValueError then says it is
    neither. nvidia-smi's own error messages and `NVRM: Xid` lines are read from any of them."""

    name = "paste"

    def __init__(self, text: str, source: str = "pasted text"):
        self.text = text
        self.source = source
        self.driver = find_driver_messages(text)
        self.xids = findings(find_xid_events(text), gpu_uuids(text))
        self.format: Source
        self.gpus: list[GpuReading]
        kernel = bool(self.xids) or looks_like_kernel_log(text)
        if detect_format(text) is None and (self.driver or kernel):
            self.format, self.gpus = ("kernel" if kernel else "driver"), []
        else:
            self.format, self.gpus = parse_any(text)

    def read(self) -> ProbeResult:
        lost = lost_in_output(self.text)
        what = f"{FORMAT_NAMES[self.format]} from {self.source}"
        whole = machine_wide(self.driver)
        error = None
        if lost:
            error = f"{len(lost)} GPU(s) lost"
        elif whole and not self.gpus:
            error = "; ".join(m.text.replace("\n", " ") for m in whole)
        listed = self.gpus or lost or self.driver or self.format == "kernel"
        return ProbeResult(
            backend=f"paste:{self.format}",
            gpus=[g.model_copy(deep=True) for g in self.gpus],
            lost=lost,
            error=error,
            message=what if listed else f"the {what} lists no GPUs",
            driver=list(self.driver),
            xids=list(self.xids),
            complete=self.format != "kernel",
        )
