"""What the machine says about an attempt that ended failed, beside its log: the run's cgroup at
exit, the kernel log since the attempt started (the OOM killer, `NVRM: Xid`), free space on the
run's filesystems, the non-finite values among its recorded metrics.

This module only gathers, bounded and read-only; diagnose_failure (skills/diagnose_failure.py)
reads the facts as its optional `machine` input and decides what they mean. The kernel log is
read with argv lists only (`journalctl -k --since @EPOCH`), else from /dev/kmsg without
blocking; both readers and `os.statvfs` are module attributes so tests inject their own.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, Field

MAX_KERNEL_CHARS = 256 * 1024  # of the kernel log since the attempt started, the last this much
MAX_KERNEL_LINES = 200  # the lines that may matter (the OOM killer's, the driver's), the last
MAX_KMSG_RECORDS = 50_000
MAX_METRICS = 5
MAX_PIDS = 258  # the run's process, its supervisor, and the descendants the supervisor kept
JOURNALCTL_TIMEOUT_S = 3.0
# What a kernel line must mention to be kept for the classifier (its verdict is its own).
_KEEP = ("oom", "out of memory", "killed process", "nvrm")


class CgroupMemory(BaseModel):
    """The memory counters of the run's cgroup as the supervisor read them at exit
    (runtime/executors/supervise.py `cgroup_memory`)."""

    version: int = Field(description="1 (memory.oom_control, …) or 2 (memory.events, …)")
    oom_kills: int = Field(0, description="oom_kill: processes the cgroup's OOM killer killed")
    peak_bytes: int | None = Field(None, description="v2 memory.peak, v1 memory.max_usage_in_bytes")
    limit_bytes: int | None = Field(None, description="memory.max / memory.limit_in_bytes")
    failcnt: int | None = Field(None, description="v1 memory.failcnt: times the limit was hit")


class KernelLine(BaseModel):
    line_no: int = Field(description="1-based, in the kernel log text that was read")
    text: str


class DiskFree(BaseModel):
    path: str
    role: str = Field(description="what the run keeps there: job folder, checkpoints")
    free_bytes: int
    total_bytes: int


class MetricValue(BaseModel):
    name: str
    step: int
    value: str = Field(description="nan, inf or -inf (JSON has no non-finite numbers)")


class MachineEvidence(BaseModel):
    """What was read from the machine as the attempt ended; each part None or empty when it was
    not read (no cgroup, a remote executor, nothing recorded)."""

    cgroup: CgroupMemory | None = None
    pids: list[int] = Field(
        default_factory=list,
        description="the run's pids: its process, its supervisor's, and the descendants of its "
        "process the supervisor saw while it ran (a kernel line naming any of them is the run's)",
    )
    kernel_log: list[KernelLine] | None = Field(
        None, description="kernel lines since the attempt started that may matter; None: not read"
    )
    gpu_bus_ids: list[str] = Field(default_factory=list, description="the attempt's GPUs")
    disks: list[DiskFree] = Field(default_factory=list)
    metrics: list[MetricValue] = Field(default_factory=list, description="non-finite values")
    notes: list[str] = Field(default_factory=list, description="what could not be read, and why")


# --------------------------------------------------------------------------- kernel log
KernelLogReader = Callable[[float], str | None]


def read_kernel_log(since: float) -> str | None:
    """The kernel log since `since` (seconds since the epoch): journalctl's, else /dev/kmsg's;
    None when neither can be read."""
    text = _journalctl(since)
    if text:
        return text
    return _kmsg(since)


def _journalctl(since: float) -> str | None:
    exe = shutil.which("journalctl")
    if exe is None:
        return None
    argv = [exe, "-k", "-q", "--no-pager", "-o", "short", "--since", f"@{int(since)}", "-n", "5000"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=JOURNALCTL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout if proc.returncode == 0 else ""
    return out[-MAX_KERNEL_CHARS:] if out.strip() else None


def _kmsg(since: float, path: str = "/dev/kmsg") -> str | None:
    """/dev/kmsg's records since `since`, read without blocking ([seconds] message lines)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    # kmsg stamps records with the monotonic clock: the attempt's start on that clock.
    since_mono = since - (time.time() - time.monotonic())
    lines: list[str] = []
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                rec = os.read(fd, 16384)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while reading: go on with the next
                break
            if not rec:
                break
            head, _, msg = rec.decode("utf-8", errors="replace").partition(";")
            fields = head.split(",")
            try:
                ts = int(fields[2]) / 1e6
            except (IndexError, ValueError):
                continue
            if ts >= since_mono:
                lines.append(f"[{ts:12.6f}] {msg.splitlines()[0] if msg else ''}")
    finally:
        os.close(fd)
    text = "\n".join(lines)
    return text[-MAX_KERNEL_CHARS:] if text else None


# The reader the daemon uses; tests put a function that returns recorded lines here.
KERNEL_LOG_READER: KernelLogReader = read_kernel_log


def kernel_lines(text: str) -> list[KernelLine]:
    """The lines of the kernel log that may matter to a diagnosis (the OOM killer's, the NVIDIA
    driver's), numbered as in `text`; the last MAX_KERNEL_LINES."""
    text = text[-MAX_KERNEL_CHARS:]
    kept = [
        KernelLine(line_no=n, text=line[:1000])
        for n, line in enumerate(text.splitlines(), 1)
        if any(k in line.lower() for k in _KEEP)
    ]
    return kept[-MAX_KERNEL_LINES:]


# ------------------------------------------------------------------------------- disks
STATVFS: Callable[[str], os.statvfs_result] = os.statvfs


def disk_free(paths: Iterable[tuple[str, Path]]) -> tuple[list[DiskFree], list[str]]:
    """Free and total bytes of each (role, folder)'s filesystem (the nearest folder that exists),
    each filesystem once; and notes on those that could not be read."""
    out: list[DiskFree] = []
    notes: list[str] = []
    seen: set[int] = set()
    for role, folder in paths:
        where = folder
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            st = STATVFS(str(where))
        except OSError as exc:
            notes.append(f"free space of the {role} ({folder}) not read: {exc.strerror or exc}")
            continue
        if st.f_fsid and st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        out.append(
            DiskFree(
                path=str(folder),
                role=role,
                free_bytes=st.f_bavail * st.f_frsize,
                total_bytes=st.f_blocks * st.f_frsize,
            )
        )
    return out, notes
