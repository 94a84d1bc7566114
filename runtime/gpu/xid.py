"""Kernel `NVRM: Xid` lines (`dmesg`, `journalctl -k`, /var/log/syslog) read against NVIDIA's XID
catalogue, kept as data in `xid_catalogue.yaml` beside this file (with its attribution).

    [  123.456] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
    May 18 19:02:39 host kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.

Each line names the GPU by PCI bus id (domain:bus:device; the function is 0 for a GPU) and an Xid
number; `NVRM: GPU at PCI:0000:2b:00: GPU-…` lines give the UUID of a bus id. An Xid whose
recommended action resets or reboots (or drains) makes the GPU CRITICAL; one the application
causes or recovers from (13, 31, 43, 45 …) makes it a WARNING. An Xid the catalogue does not list
is an "unknown XID", treated conservatively (drain and diagnose). The log text is data: matched,
never interpreted further.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

from nightshift.runtime.gpu.bus import normalize_bus_id

Action = Literal["restart_app", "check_app", "ignore", "reset_gpu", "reboot", "drain"]
Severity = Literal["WARNING", "CRITICAL"]

CATALOGUE_PATH = Path(__file__).with_name("xid_catalogue.yaml")
SOURCE_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

ACTIONS: dict[str, tuple[Severity, str]] = {
    "restart_app": ("WARNING", "restart the application; the GPU itself is fine"),
    "check_app": (
        "WARNING",
        "restart the application and check its code (illegal memory access: run it under "
        "compute-sanitizer); if it repeats with unchanged code, run GPU diagnostics",
    ),
    "ignore": ("WARNING", "no action needed; watch for repeats"),
    "reset_gpu": (
        "CRITICAL",
        "drain the GPU's work and reset it (`nvidia-smi -r -i <index>`), or reboot; RMA if it repeats",
    ),
    "reboot": (
        "CRITICAL",
        "drain the node and reboot it; check power, cooling and seating if it repeats",
    ),
    "drain": (
        "CRITICAL",
        "drain the GPU's work and run diagnostics (`dcgmi diag -r 2`) before using it again",
    ),
}
UNKNOWN_ACTION: Action = "drain"

# Xid 154's recovery labels → our action.
_RECOVERY: dict[str, Action] = {
    "none": "ignore",
    "gpu reset required": "reset_gpu",
    "node reboot required": "reboot",
    "drain p2p": "drain",
    "drain and reset": "reset_gpu",
}

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\):"
    r"\s*(?P<xid>\d+)(?:,\s*(?P<rest>.*))?"
)
# "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-…" names the GPU of a bus id.
_GPU_AT = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?):"
    r"\s*(?P<uuid>GPU-[0-9a-fA-F-]+)"
)
_RECOVERY_TO = re.compile(r"recovery action changed from .*? to \S+ \((?P<label>[^)]*)\)", re.I)


class XidEntry(BaseModel):
    """One Xid of NVIDIA's catalogue, with the action nightshift recommends."""

    mnemonic: str
    meaning: str
    nvidia: str = Field(description="The catalogue's immediate-action bucket, as published")
    action: Action


class XidEvent(BaseModel):
    """One `NVRM: Xid` line."""

    xid: int
    bus_id: str = Field(description="domain:bus:device.function, as normalize_bus_id writes it")
    line: str = Field(description="The kernel log line, as logged")
    detail: str = ""


class XidFinding(BaseModel):
    """All the events of one Xid number on one GPU, judged."""

    xid: int
    bus_id: str
    uuid: str | None = None
    mnemonic: str | None = None
    meaning: str
    known: bool = True
    action: Action
    severity: Severity
    advice: str = Field(description="The recommended action, in words")
    count: int
    last_line: str


@functools.cache
def catalogue() -> dict[int, XidEntry]:
    """The catalogue file, validated (a broken catalogue is a bug in the package, not user input)."""
    raw = yaml.safe_load(CATALOGUE_PATH.read_text(encoding="utf-8"))
    return {int(k): XidEntry.model_validate(v) for k, v in raw.items()}


def find_xid_events(text: str) -> list[XidEvent]:
    """Every `NVRM: Xid (…): N, …` line in `text`, in order."""
    out = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            out.append(
                XidEvent(
                    xid=int(m["xid"]),
                    bus_id=normalize_bus_id(m["bus"]),
                    line=line.strip(),
                    detail=(m["rest"] or "").strip(),
                )
            )
    return out


def gpu_uuids(text: str) -> dict[str, str]:
    """Bus id → UUID from `NVRM: GPU at PCI:…: GPU-…` lines."""
    return {normalize_bus_id(m["bus"]): m["uuid"] for m in _GPU_AT.finditer(text)}


def looks_like_kernel_log(text: str) -> bool:
    """Kernel log lines of the NVIDIA driver, with or without an Xid among them."""
    return "NVRM:" in text


def _judge(xid: int, detail: str) -> tuple[XidEntry | None, Action]:
    entry = catalogue().get(xid)
    if xid == 154:
        m = _RECOVERY_TO.search(detail)
        label = m["label"].strip().lower() if m else ""
        return entry, _RECOVERY.get(label, "reset_gpu")
    return entry, entry.action if entry else UNKNOWN_ACTION


def findings(events: Iterable[XidEvent], uuids: dict[str, str] | None = None) -> list[XidFinding]:
    """One finding per (GPU, Xid number, action), in the order first seen; the last line is the evidence."""
    uuids = uuids or {}
    out: dict[tuple[str, int, str], XidFinding] = {}
    for e in events:
        entry, action = _judge(e.xid, e.detail)
        key = (e.bus_id, e.xid, action)
        if key in out:
            out[key].count += 1
            out[key].last_line = e.line
            continue
        severity, advice = ACTIONS[action]
        if entry is None:
            meaning = f"unknown XID {e.xid}: not in NVIDIA's catalogue as nightshift keeps it"
            advice = f"{advice}; look it up in NVIDIA's Xid catalogue ({SOURCE_URL})"
        elif e.xid == 154:
            meaning = f"{entry.meaning}: {e.detail}" if e.detail else entry.meaning
        else:
            meaning = entry.meaning
        out[key] = XidFinding(
            xid=e.xid,
            bus_id=e.bus_id,
            uuid=uuids.get(e.bus_id),
            mnemonic=entry.mnemonic if entry else None,
            meaning=meaning,
            known=entry is not None,
            action=action,
            severity=severity,
            advice=advice,
            count=1,
            last_line=e.line,
        )
    return list(out.values())
