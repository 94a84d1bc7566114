"""diagnose_failure: say why an attempt ended, with the log lines that show it, and what to do next.

The log is data, never instructions: it is only matched against fixed regular expressions; no
line is run, evaluated or followed, and quoted lines are stripped of control characters and cut
to a bounded length.

Each line is read as people paste logs (runtime/training/pasted_log.py: quote marks, colour
codes, timestamps, levels and rank labels off, a progress bar's redraws split, a wrapped message
rejoined); evidence quotes the original line with its line number in the file.

How a verdict is reached, in this order:

1. What the monitor knows wins: `monitor_says` preempted / stalled / timeout / lost is the
   category (the monitor stopped the process, saw the platform do it, or lost sight of it: its
   supervisor, process group or machine went away); `diverged` (the monitor's own metrics check
   saw a NaN / exploding loss, `monitor_detail` says what) is nan_loss. Log signatures are still
   reported.
2. Exit status 0 (and no signal) is `succeeded`, whatever the log says; lines that look like
   errors are quoted so a human can check the outputs.
3. Strong signatures (the exact text real tools print: PyTorch, NCCL, CUDA, the kernel, Python,
   argparse, Hydra, OpenCV, Slurm/PBS; not on informational lines: `NCCL INFO ...`, Python
   `...Warning: ...`, and the I / W levels of TensorFlow's, glog's, c10's and DeepSpeed's loggers,
   unless the signature is one whose warning carries the cause (on_info)), anywhere in the log,
   by category priority — the root cause first: driver_mismatch, cuda_oom, host_oom, disk_full,
   checkpoint_corrupt, nan_loss, import_or_env, config_error, cuda_runtime_error, killed,
   nccl_or_distributed, hang_or_timeout, file_missing, crashed (load_state_dict's mismatches).
   (One rank's OOM makes the other ranks report NCCL errors; a full disk makes a checkpoint
   corrupt; the OOM killer's SIGKILL is reported by the launcher as exit code -9; so the cause
   outranks its echo.) A launcher's -9 while a model or checkpoint is being loaded is host_oom.
4. Weak signatures: TensorFlow's OOM reported only at its W level; the shell's `Killed` (and its
   localised words), most often the OOM killer → host_oom; progress lines with a NaN loss (or NaN
   columns on several iterations) or a collapsed fp16 loss scale; NCCL WARN lines and error codes
   returned up NCCL's call chain; a KeyboardInterrupt; faulthandler's thread dump of a stuck
   process (not after a fatal error); Lightning's missing resume checkpoint.
5. The exit status, read as evidence rather than a verdict: SIGKILL (or exit 137) is `killed` —
   the OOM killer or a person — unless the kernel log (`kernel_log`, or the injectable
   `KERNEL_LOG_READER`; never read by default) has an OOM-killer line, which makes it host_oom;
   SIGHUP / SIGINT → killed (the terminal went away, or Ctrl-C); SIGTERM (143) → preempted;
   126/127 → import_or_env.
6. A Python traceback or exception line with a failing exit → crashed; with no exit status at
   all, an uncaught exception at the end of the log → crashed (low confidence).
7. Other signals (SIGSEGV, SIGABRT, SIGBUS) → crashed; a torchrun failure summary that names no
   error → nccl_or_distributed (low confidence). Otherwise unknown: no confident guess.

What the machine says (`machine`, which the daemon gathers as the attempt ends: see
runtime/training/machine_evidence.py; this skill reads nothing of the machine itself) is listed in
the result's `machine` with its source (exit_status, cgroup, kernel_log, disk, gpu_xid, metrics),
and outranks a verdict the log gives only as an echo (killed, crashed, unknown, …; see
_MACHINE_REPLACES): the run's memory cgroup counted an OOM kill, or a kernel OOM-killer line
names the run's pid → host_oom; a reset / reboot / drain `NVRM: Xid` on the attempt's GPU →
cuda_runtime_error; a nearly full filesystem of the run's folders → disk_full; non-finite recorded
metrics → nan_loss. A cgroup that counted no OOM kill, or a kernel log that names none of the
run's pids, says so of a SIGKILL, which stays `killed`.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import signal as signal_module
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, Field, model_validator

try:  # the regular-expression parser, to find each signature's literal keys (3.11+ names first)
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from nightshift.runtime.gpu import xid as xid_module
from nightshift.runtime.gpu.bus import normalize_bus_id
from nightshift.runtime.store.db import Store
from nightshift.runtime.training import job_files, log_classifier, pasted_log
from nightshift.runtime.training.attempt_diagnosis import Remembered
from nightshift.runtime.training.machine_evidence import MachineEvidence
from nightshift.runtime.user_files import read_as_reader
from nightshift.skills import remembered_corrections
from nightshift.skills.base import SkillContext, skill

Category = Literal[
    "cuda_oom",
    "host_oom",
    "nan_loss",
    "nccl_or_distributed",
    "cuda_runtime_error",
    "file_missing",
    "checkpoint_corrupt",
    "disk_full",
    "driver_mismatch",
    "import_or_env",
    "config_error",
    "killed",
    "lost",
    "preempted",
    "stalled",
    "timeout",
    "hang_or_timeout",
    "crashed",
    "unknown",
    "succeeded",
]
Action = Literal[
    "resume", "resume_smaller_batch", "resume_lower_lr", "resume_previous_checkpoint", "stop"
]
MonitorSays = Literal["preempted", "stalled", "timeout", "lost", "diverged"]
EvidenceSource = Literal[
    "log", "kernel_log", "monitor", "exit_status", "cgroup", "disk", "gpu_xid", "metrics"
]

MAX_LOG_BYTES = 2 * 1024 * 1024  # the tail that is examined
MAX_COUNT_BYTES = 256 * 1024 * 1024  # up to this much before the tail is counted for line numbers
MAX_KERNEL_LOG_BYTES = 256 * 1024  # the tail of the kernel log that is examined
MAX_MATCH_CHARS = 4096  # a longer line is matched on its first and last half of this
MAX_EVIDENCE = 5
TAIL_LINES = 15  # "the log ends in": within its last this many non-blank lines
_BARE_ERROR_END = 3  # without a traceback, an error "ends the log" only within its last lines
MAX_LINE_CHARS = 300
LR_FACTOR = 0.5

# How the kernel log is read when the caller gives none: None (the default) reads nothing. A
# deployment that may read it installs one, e.g. `diagnose_failure_module.KERNEL_LOG_READER =
# read_dmesg`; tests inject a function that returns fixed text.
KERNEL_LOG_READER: Callable[[], str | None] | None = None
# The learned log model consulted when no signature decides (runtime/training/log_classifier.py);
# the cross-validation of evals/diagnosis_model.py swaps in a model per fold, or None.
LOG_MODEL_LOADER: Callable[[], log_classifier.LogModel | None] = log_classifier.load
# Its reading replaces a low-confidence verdict only when its best category leads the next by at
# least this (LinearSVC score units; chosen by cross-validation on the tuning split).
LEARNED_MIN_MARGIN = 0.2
LEARNED_MIN_WORDS = 8  # … and reads at least this many distinct words it knows


def read_dmesg(timeout_s: float = 2.0) -> str | None:
    """The kernel ring buffer as `dmesg` prints it, or None where it cannot be read (containers
    and unprivileged users often cannot). Not installed by default; see KERNEL_LOG_READER."""
    try:
        proc = subprocess.run(
            ["dmesg"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            errors="replace",
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout else None


class DiagnoseFailureInput(BaseModel):
    """What is known about an attempt that ended: its log (text or file), exit status, and what
    the monitor saw. params and knobs (optional) turn the remediation into concrete values."""

    log_tail: str | None = Field(None, description="The end of the attempt's log (stdout+stderr)")
    log_path: str | None = Field(None, description="Or: a log file; its last 2 MiB are read")
    exit_code: int | None = Field(
        None,
        description="Process exit code; negative = killed by that "
        "signal (Python's convention); 128+N = signal N (the shell's)",
    )
    signal: int | None = Field(
        None, ge=0, le=64, description="The signal that ended it, if known (0 or None: none)"
    )
    monitor_says: MonitorSays | None = Field(
        None,
        description="What the monitor knows: it or the platform stopped the attempt "
        "(preempted), no progress (stalled), the spec's timeout passed (timeout), the process's "
        "supervisor, process group or machine went away (lost), its metrics diverged (diverged)",
    )
    monitor_detail: str | None = Field(
        None,
        max_length=2000,
        description="The monitor's own evidence, e.g. 'metrics diverged: loss is nan at step 412'",
    )
    kernel_log: str | None = Field(
        None,
        description="Kernel log text (dmesg) the caller read, "
        "if any: an OOM-killer line there explains a SIGKILL",
    )
    params: dict[str, Any] | None = Field(None, description="The attempt's parameter values")
    knobs: dict[str, str] | None = Field(
        None,
        description="The spec's knobs: learning_rate / micro_batch / grad_accum → parameter name",
    )
    remember: bool = Field(
        True,
        description="Use the operator's corrections (`diagnose JOB --correct`) of logs that ended "
        "the same way; false: the rules' reading alone (what `eval diagnosis --local` measures)",
    )
    machine: MachineEvidence | None = Field(
        None,
        description="What the machine said as the attempt ended (the daemon reads it): the run's "
        "cgroup memory counters, kernel log lines since it started with the run's pids and GPU "
        "bus ids, free space on its filesystems, non-finite recorded metrics",
    )

    @model_validator(mode="after")
    def _one_log(self) -> DiagnoseFailureInput:
        if self.log_tail is not None and self.log_path is not None:
            raise ValueError("give log_tail or log_path, not both")
        return self


class EvidenceLine(BaseModel):
    line_no: int = Field(
        description="1-based line number in the log (in the file for log_path); "
        "for source kernel_log, in the kernel log; 0 for the monitor's evidence"
    )
    text: str
    source: EvidenceSource = Field("log", description="Where the line is from")


class Remediation(BaseModel):
    action: Action
    changes: dict[str, Any] = Field(
        default_factory=dict,
        description="New parameter values by "
        "parameter name; empty when params/knobs were not given",
    )
    factors: dict[str, float] = Field(
        default_factory=dict,
        description="Multipliers by knob (learning_rate, micro_batch, grad_accum)",
    )
    message: str


class DiagnoseFailureResult(BaseModel):
    category: Category
    retryable: bool = Field(description="Whether resuming (with the remediation) may succeed")
    confidence: Literal["high", "medium", "low"]
    evidence: list[EvidenceLine] = Field(default_factory=list)
    reasoning: str
    remediation: Remediation
    signal: int | None = Field(None, description="The signal that ended the process, if any")
    machine: list[EvidenceLine] = Field(
        default_factory=list,
        description="What the machine said (given `machine`): each piece with its source — "
        "exit_status, cgroup, kernel_log, disk, gpu_xid, metrics",
    )
    remembered: Remembered | None = Field(
        None,
        description="Where the category is a person's: their correction of an earlier attempt "
        "whose log ended the same way, which the rules had read as they read this one (the "
        "rules' own category is kept in it)",
    )


@dataclass(frozen=True)
class Signature:
    category: str
    pattern: re.Pattern[str]
    meaning: str
    strong: bool = True
    retryable: bool | None = None  # overrides the category's default
    action: str | None = None
    on_info: bool = False  # also matches informational lines (a warning that carries the cause)
    min_lines: int = 1  # evidence only when this many lines match it (a pattern across a log)


def _sig(category: str, pattern: str, meaning: str, **kw: Any) -> Signature:
    return Signature(category, re.compile(pattern, re.IGNORECASE | re.MULTILINE), meaning, **kw)


# Where a shell's job report puts the script's line and the child's pid before what happened to
# it (`./run.sh: line 12: 4242 Killed  python …`), in English and as localised shells word it
_JOB_REPORT = r"^(?:.*(?:\bline|行|\bZeile|\bligne|\blínea) \d+ ?: +\d+ )?"

# Each pattern is text the named tool really prints (tests/fixtures/logs/SOURCES.md and the corpus's
# sources.yaml files cite where).
SIGNATURES: tuple[Signature, ...] = (
    # cudaErrorInsufficientDriver's text; torch/cuda/__init__.py's driver checks; NVML's init error.
    _sig(
        "driver_mismatch",
        # (TensorFlow's cuda_diagnostics.cc compares the kernel module's version with libcuda's)
        r"CUDA driver version is insufficient for CUDA runtime version|\bkernel version [\d.]+ "
        r"does not match DSO version|\bCUDA_ERROR_(?:"
        r"INSUFFICIENT_DRIVER|SYSTEM_DRIVER_MISMATCH|COMPAT_NOT_SUPPORTED_ON_DEVICE|UNSUPPORTED_PTX_"
        r"VERSION)\b|the provided PTX was compiled with an unsupported toolchain",
        "the NVIDIA driver is older than the CUDA runtime the code was built with",
    ),
    _sig(
        "driver_mismatch",
        r"The NVIDIA driver on your system is too old",
        "PyTorch needs a newer NVIDIA driver",
    ),
    # Isaac Gym's (PhysX's) check of the driver's CUDA version, printed as a warning
    _sig(
        "driver_mismatch",
        r"\bCUDA driver version is \d+, expected at least \d+",
        "the NVIDIA driver is older than the CUDA version the program needs",
        on_info=True,
    ),
    _sig("driver_mismatch", r"Found no NVIDIA driver on your system", "no NVIDIA driver loaded"),
    # torch's lazy CUDA init when the driver reports no device (cudaErrorNoDevice)
    _sig(
        "driver_mismatch",
        r"\bNo CUDA GPUs are available\b",
        "CUDA sees no GPU: no NVIDIA driver or GPU here, or CUDA_VISIBLE_DEVICES hides them all",
    ),
    # Docker asked for GPUs without the NVIDIA container toolkit
    _sig(
        "driver_mismatch",
        r"could not select device driver \"[^\"\n]*\" with capabilities: \[\[gpu\]\]",
        "Docker has no GPU runtime: install the NVIDIA container toolkit and restart dockerd",
    ),
    _sig(
        "driver_mismatch",
        r"Driver/library version mismatch",
        "the loaded kernel driver and the user-space NVIDIA libraries differ (reboot or reload)",
    ),
    _sig(
        "driver_mismatch",
        r"couldn't communicate with the NVIDIA driver",
        "nvidia-smi cannot reach the driver",
    ),
    _sig(
        "driver_mismatch",
        r"forward compatibility was attempted on non supported HW",
        "the CUDA forward-compatibility package does not support this GPU",
    ),
    # cudaErrorSystemDriverMismatch (803), as torch's cudaGetDeviceCount check and Caffe print it.
    _sig(
        "driver_mismatch",
        r"system has unsupported display driver / cuda driver combination",
        "the NVIDIA kernel driver does not match the CUDA driver library (cudaErrorSystemDriver"
        "Mismatch, 803)",
    ),
    # The driver's own libraries absent: no NVIDIA driver in this host or container.
    _sig(
        "driver_mismatch",
        r"\blib(?:nvidia-ml|cuda)\.so\.1: cannot open shared object file",
        "the NVIDIA driver's libraries (libcuda.so.1 / libnvidia-ml.so.1) are not there: no "
        "driver is installed here, or the container was started without the GPU runtime",
    ),
    # The same checks as torch's warning at CUDA initialization (the program then runs on the
    # CPU, or fails later for want of a GPU): weak, so a failure of its own still decides.
    _sig(
        "driver_mismatch",
        r"CUDA initialization: (?:The NVIDIA driver on your system is too old|Found no NVIDIA "
        r"driver|[^\n]*\bError 803\b)",
        "CUDA could not start on the NVIDIA driver (too old, absent, or mismatched: torch's "
        "warning); the program went on without the GPU",
        strong=False,
        on_info=True,
    ),
    # c10/cuda/CUDACachingAllocator.cpp; XLA's allocator; cuBLAS / cuDNN handles; Caffe; the driver API.
    _sig("cuda_oom", r"torch\.(?:cuda\.)?OutOfMemoryError", "PyTorch ran out of GPU memory"),
    _sig("cuda_oom", r"CUDA out of memory", "the GPU ran out of memory"),
    _sig("cuda_oom", r"CUDA error: out of memory", "the GPU ran out of memory"),
    # Lua Torch / old PyTorch's THC: `cuda runtime error (2) : out of memory at …THCStorage.cu`;
    # Apple's MPS backend (the GPU's share of unified memory)
    _sig(
        "cuda_oom",
        r"cuda runtime error \(2\) : out of memory|\bMPS backend out of memory\b",
        "the GPU ran out of memory",
    ),
    # Apple silicon's Metal as MLX reports it; a ROCm build of PyTorch (`HIP out of memory`) and
    # the HIP runtime's own code
    _sig(
        "cuda_oom",
        r"\[METAL\] Command buffer execution failed: Insufficient Memory"
        r"|\bkIOGPUCommandBufferCallbackErrorOutOfMemory\b|\bHIP out of memory\b"
        r"|\bhipErrorOutOfMemory\b",
        "the GPU ran out of memory",
    ),
    # Habana Gaudi's runtime (its device memory and its graph compiler's workspace); XLA on a TPU
    # as torch_xla reports it; Ascend's torch_npu in the words of torch's allocator
    _sig(
        "cuda_oom",
        r"\bNPU out of memory\b"
        r"|\bMODULE:(?:DEVMEM|SYNHELPER)\b[^\n]*\bAllocation\b|\bAttempting to allocate [\d.]+\s?"
        r"[KMGT]?i?B?\. That was not possible\. There are [\d.]+\s?[KMGT]?i?B? free\b"
        # Intel GPUs: the Unified Runtime / Level Zero codes that intel-extension-for-pytorch
        # passes on as "Native API returns: 39 (…)"
        r"|\b(?:UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_DEVICE_MEMORY\b",
        "the accelerator ran out of device memory",
    ),
    _sig(
        "cuda_oom",
        r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
        "XLA ran out of device memory",
    ),
    # PaddlePaddle's allocator (paddle/fluid/memory): `Out of memory error on GPU 0. Cannot allocate`
    _sig(
        "cuda_oom",
        r"\bOut of memory error on GPU \d+\.\s*Cannot allocate",
        "PaddlePaddle ran out of GPU memory",
    ),
    _sig("cuda_oom", r"CUBLAS_STATUS_ALLOC_FAILED", "cuBLAS could not allocate GPU memory"),
    _sig("cuda_oom", r"CUDNN_STATUS_ALLOC_FAILED", "cuDNN could not allocate GPU memory"),
    _sig(
        "cuda_runtime_error",
        r"\bCUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|MAPPING_ERROR|ARCH_MISMATCH"
        r"|NOT_SUPPORTED|BAD_PARAM)\b",
        "a cuDNN call failed on the GPU (its status names how)",
    ),
    _sig("cuda_oom", r"Cuda failure '?out of memory", "NCCL could not allocate GPU memory"),
    _sig(
        "cuda_oom",
        r"error == cudaSuccess \(2 vs\. 0\)\s*out of memory",
        "the GPU ran out of memory (cudaErrorMemoryAllocation, as Caffe reports it)",
    ),
    _sig(
        "cuda_oom",
        r"\bcudaErrorMemoryAllocation\b|\bCUDA_ERROR_OUT_OF_MEMORY\b",
        "the GPU ran out of memory",
    ),
    # TensorFlow's ResourceExhaustedError; on a CPU device it is host memory (host_oom below).
    _sig(
        "cuda_oom",
        r"OOM when allocating tensor(?!.*(?:device:CPU|by allocator cpu\b))",
        "TensorFlow ran out of GPU memory (ResourceExhaustedError)",
    ),
    # mm/oom_kill.c (dmesg); Slurm's cgroup plugin; Kubernetes; Python; C++; torch's DataLoader.
    _sig(
        "host_oom",
        r"Out of memory: Kill(?:ed)? process \d+",
        "the kernel OOM killer killed a process for lack of host memory",
    ),
    _sig(
        "host_oom",
        r"Memory cgroup out of memory: Kill(?:ed)? process",
        "the container's memory limit was hit and the OOM killer killed a process",
    ),
    # a platform relaying Kubernetes' OOMKilled in its own words (VESSL)
    _sig(
        "host_oom",
        r"\bcontainer [\w.-]+ is oom-killed\b",
        "the container's memory limit was hit and the OOM killer killed it",
        on_info=True,
    ),
    _sig("host_oom", r"invoked oom-killer", "the kernel OOM killer ran"),
    _sig("host_oom", r"\boom-kill:constraint=", "the kernel OOM killer chose a process to kill"),
    _sig(
        "host_oom",
        r"\bKilled process \d+ \([^)\n]*\),? total-vm:",
        "the kernel OOM killer killed a process for lack of host memory",
    ),
    _sig("host_oom", r"oom_reaper: reaped process \d+", "the kernel reaped an OOM-killed process"),
    _sig("host_oom", r"oom[-_]kill event", "the batch system saw an OOM kill"),
    # Slurm's slurmstepd polling the step's memory (no cgroup OOM), LSF's memory and swap limits
    _sig(
        "host_oom",
        r"\bexceeded memory limit \(\d+ > \d+\), being killed|\bExceeded job memory limit\b"
        r"|\bTERM_(?:MEMLIMIT|SWAP): job killed after reaching LSF (?:memory|swap)",
        "the batch system killed the job at its memory limit (host memory): ask for more, or "
        "use less",
    ),
    _sig(
        "host_oom",
        r"Your session crashed after using all available RAM",
        "Colab ended the session: it used all the host memory (RAM)",
    ),
    # Windows' ERROR_COMMITMENT_LIMIT (1455): the page file, Windows' host memory, is used up
    # (most often while DataLoader workers each load torch's DLLs)
    _sig(
        "host_oom",
        r"\[WinError 1455\]|The paging file is too small for this operation to complete",
        "Windows ran out of virtual memory (the page file is too small): host memory",
    ),
    _sig(
        "host_oom",
        r"killed by the cgroup out-of-memory handler",
        "the batch system's memory limit was hit",
    ),
    # DyNet's allocator and C trainers' malloc checks (GloVe) on host memory
    _sig(
        "host_oom",
        r"\bCPU memory allocation failed\b|^Error allocating memory for \w+",
        "host memory ran out (DyNet's allocator; GloVe's and other C trainers' malloc checks)",
    ),
    _sig("host_oom", r"\bOOMKilled\b", "the container was OOM-killed (its memory limit was hit)"),
    _sig(
        "host_oom",
        r"^(?:\[[^\]\n]*\]:?\s*)*(?:[\w.]+\.)?MemoryError\b"
        r"|Unable to allocate [\d.]+ [KMGTP]i?B for an array with shape",
        "Python (or NumPy) could not allocate host memory",
    ),
    _sig("host_oom", r"std::bad_alloc", "a C++ allocation of host memory failed"),
    # a GPU program's own words for its host-side allocations (ThunderSVM's and other CUDA
    # programs' fatal log; OpenCL's and Vulkan's status codes)
    _sig(
        "host_oom",
        r"\bout of host memory\b|\b(?:CL|VK_ERROR)_OUT_OF_HOST_MEMORY\b",
        "the program could not allocate host memory (RAM, not the GPU's)",
    ),
    _sig(
        "host_oom",
        r"\[Errno 12\] Cannot allocate memory|DefaultCPUAllocator: (?:can't allocate "
        r"memory|not enough memory)",
        "an allocation of host memory failed (ENOMEM)",
    ),
    _sig(
        "host_oom",
        r"OOM when allocating tensor.*(?:device:CPU|by allocator cpu\b)",
        "TensorFlow ran out of host memory (ResourceExhaustedError on the CPU allocator)",
    ),
    # torch/utils/data: a worker's SIGBUS on a full /dev/shm (a container's small --shm-size).
    _sig(
        "host_oom",
        r"Unexpected bus error encountered in worker\. This might be caused by "
        r"insufficient shared memory",
        "DataLoader workers ran out of shared memory (/dev/shm): "
        "raise the container's shm size, or use fewer workers",
    ),
    _sig(
        "host_oom",
        r"DataLoader worker \(pid \d+\) is killed by signal: Bus error",
        "DataLoader workers ran out of shared memory (/dev/shm): raise the container's shm size, "
        "or use fewer workers",
    ),
    _sig(
        "host_oom",
        r"DataLoader worker \(pid \d+\) is killed by signal: Killed",
        "a DataLoader worker was SIGKILLed, most often by the OOM killer",
    ),
    # errno 28 / 122 as Python, Rust (safetensors) and the C library print them; torch.save's writer.
    # Also on a library's warning line: a write that failed for want of space is the cause of
    # whatever fails after it (a checkpoint never written, a cache entry cut short).
    _sig(
        "disk_full",
        r"No space left on device",
        "a write failed: the disk is full",
        on_info=True,
    ),
    _sig(
        "disk_full",
        r"\[Errno 28\]|\bkind: StorageFull\b|\bENOSPC\b",
        "a write failed: the disk is full (ENOSPC)",
        on_info=True,
    ),
    # torch's shared-memory allocator writing a tensor for the DataLoader into /dev/shm (a
    # container's 64 MB default fills at once), its errno sometimes left off
    _sig(
        "disk_full",
        r"\bunable to write to file </torch_\d+_\d+(?:_\d+)?>",
        "the DataLoader's shared memory (/dev/shm) is full: give the container more "
        "(--shm-size, a larger /dev/shm) or use fewer workers",
    ),
    # (EDQUOT's text; a batch system or a grid refusing a job its disk quota cannot hold)
    _sig(
        "disk_full",
        r"Disk quota exceeded|\bthan (?:the )?(?:user |your )?disk quota left\b",
        "a write failed (or would): the disk quota is used up",
    ),
    # Windows' ERROR_DISK_FULL (112), SQLite's SQLITE_FULL, HF datasets' check before a download,
    # tempfile finding no directory it can write in
    _sig(
        "disk_full",
        r"\[WinError 112\]|There is not enough space on the disk|database or disk is full"
        r"|No usable temporary directory found in|\b(?:Not enough|Insufficient) (?:free )?disk "
        r"space\b",
        "a write failed (or would): the disk is full",
    ),
    # TensorFlow's file writers (checkpoint .tempstate, TFRecordWriter) report ENOSPC as
    # ResourceExhausted on the file's path (its OOM says "OOM when allocating", never a path).
    _sig(
        "disk_full",
        r"(?:ResourceExhaustedError|Resource exhausted): (?!OOM\b)\.{0,2}/?[\w.-]+(?:/[\w.-]+)+",
        "TensorFlow could not write a file (ResourceExhausted on its path): the disk is full",
    ),
    _sig(
        "disk_full",
        r"PytorchStreamWriter failed writing file|\bwrite\(\): fd \d+ failed with",
        "torch.save could not write the checkpoint (most often a full disk)",
    ),
    _sig(
        "disk_full",
        r"inline_container\.cc[:_]\d+\] \. ?unexpected pos \d+ vs \d+",
        "torch.save's writer came up short (most often a full disk or quota)",
    ),
    # torch/serialization.py (zip and legacy readers); safetensors; TensorFlow; zipfile (numpy).
    _sig(
        "checkpoint_corrupt",
        # (Caffe: a .caffemodel its protobuf reader cannot parse)
        r"Failed to parse NetParameter file: \S+\.caffemodel\b"
        r"|PytorchStreamReader failed reading (?:zip archive|file)|Expected hasRecord\(\"version\"\)"
        r" to be true|inline_container\.cc:\d+\] \. file not found: archive/"
        r"|Unable to load weights from h5 file",
        "torch.load found a truncated or corrupt checkpoint",
    ),
    # the same zip reader's message pasted without its class (a front end that prints only it)
    _sig(
        "checkpoint_corrupt",
        r"^failed reading zip archive: failed finding central directory\b",
        "a checkpoint (a zip archive) is truncated or corrupt: its central directory is missing",
        on_info=True,
    ),
    _sig(
        "checkpoint_corrupt",
        r"UnpicklingError: (?:invalid load key|pickle data was truncated)|\binvalid load key, '"
        # a file of another format (a torch zip checkpoint) read by plain pickle
        r"|UnpicklingError: A load persistent id instruction was encountered",
        "a pickled checkpoint is truncated or corrupt (or is not a checkpoint: an HTML page, a "
        "git-lfs pointer)",
    ),
    _sig(
        "checkpoint_corrupt",
        r"Error while deserializing header",
        "a safetensors file is truncated or corrupt",
    ),
    _sig(
        "checkpoint_corrupt",
        r"unexpected EOF, expected \d+ more bytes\. The file might be "
        r"corrupted",
        "torch.load found a truncated checkpoint",
    ),
    _sig("checkpoint_corrupt", r"DataLossError", "TensorFlow found a corrupt checkpoint"),
    _sig(
        "checkpoint_corrupt",
        r"Unable to open file \((?:file signature not found|truncated file)",
        "an HDF5 weights file is truncated or not HDF5 (an incomplete download)",
    ),
    _sig("checkpoint_corrupt", r"BadZipFile", "a zip-based checkpoint is truncated or corrupt"),
    # torch.hub's download check (`check_hash`): the weights file is not the one published
    _sig(
        "checkpoint_corrupt",
        r"\binvalid hash value \(expected \"[0-9a-f]+\", got \"[0-9a-f]+\"\)",
        "the downloaded weights are not the published file (a truncated or changed download): "
        "delete it from the hub cache and download it again",
    ),
    # transformers / diffusers `load_state_dict`, wrapping torch.load's failure.
    _sig(
        "checkpoint_corrupt",
        r"Unable to load weights from (?:pytorch )?checkpoint file",
        "transformers could not read a weights file (a truncated download or checkpoint)",
    ),
    # our examples/train_numpy.py and many loops; autograd anomaly mode; fairseq; Lightning;
    # torchvision's detection references; TensorFlow's check_numerics.
    _sig(
        "nan_loss",
        r"\bloss (?:is|was|became|=) ?(?:nan|inf|-inf)\b|\bloss (?:has|had|contains) (?:nan|inf)\b",
        "the loss diverged",
    ),
    _sig("nan_loss", r"\bnon-finite loss\b", "the loss diverged"),
    # a loop's own check (`if not math.isfinite(loss)`, as MAE / DeiT-style loops and verl's
    # grad-norm guard print it, typos and all)
    _sig(
        "nan_loss",
        r"\b(?:loss|grad(?:ient)?[_ ]norm)(?: value)? (?:is|in|was) not finite\b",
        "the loss (or the gradient norm) is no longer finite: the run diverged",
    ),
    _sig(
        "nan_loss",
        r"returned nan values in its \d+(?:st|nd|rd|th) output",
        "autograd found NaN in a backward pass",
    ),
    _sig(
        "nan_loss",
        r"Minimum loss scale reached|\bInvalid loss, terminating training\b",
        "fp16 loss scaling collapsed, or Keras' TerminateOnNaN stopped on it: the loss diverged",
    ),
    # deepspeed/runtime/fp16/loss_scaler.py, raised when the dynamic scale cannot go lower.
    _sig(
        "nan_loss",
        r"Current loss scale already at minimum - cannot decrease scale anymore",
        "DeepSpeed's fp16 loss scaling collapsed (overflow at the minimum scale): the loss "
        "diverged",
    ),
    _sig("nan_loss", r"Detected nan and/or inf values in", "parameters became NaN/inf"),
    _sig(
        "nan_loss",
        r"The loss returned in `?training_step`? is (?:nan|inf)",
        "Lightning stopped on a non-finite loss",
    ),
    # a loop's epoch summary with both losses gone (qlib's models: `train nan, valid nan`)
    _sig(
        "nan_loss",
        r"\btrain(?:ing)?(?: loss)?[:=]? ?nan\b[,;]? +val(?:id(?:ation)?)?(?: loss)?[:=]? ?nan\b",
        "the training and validation losses are NaN: the run diverged",
        on_info=True,
    ),
    _sig("nan_loss", r"Tensor had (?:NaN|Inf) values", "TensorFlow's check_numerics found NaN/inf"),
    # TensorBoard writers given a tensor gone NaN: TensorFlow's histogram op, tensorboardX's
    # check of what it logs
    _sig(
        "nan_loss",
        r"\bNan in summary histogram for: |\btensorboardX\.x2num - NaN or Inf found in input tensor",
        "a value the run logs to TensorBoard became NaN: the run diverged",
        on_info=True,
    ),
    _sig("nan_loss", r"^FloatingPointError\b", "a floating-point check failed"),
    # torch.distributions sampling a policy whose parameters went NaN (PPO and other RL losses)
    _sig(
        "nan_loss",
        r"normal expects all elements of std >= 0\.0|to satisfy the constraint \w+\([^)]*\), but "
        r"found invalid values",
        "a distribution's parameters became NaN (or invalid): the loss diverged",
    ),
    # TensorFlow's NanTensorHook; JAX's debug_nans.
    _sig(
        "nan_loss",
        r"\bNanLossDuringTrainingError\b|NaN loss during training",
        "TensorFlow's NanTensorHook stopped on a NaN loss",
    ),
    _sig(
        "nan_loss",
        r"invalid value \(nan\) encountered in",
        "JAX's debug_nans found a NaN in a compiled step",
    ),
    # Python's import system; the dynamic loader; the shell; a PyTorch build without this GPU's arch;
    # torch.utils.cpp_extension's JIT build (DeepSpeed's op builder) and nvcc's host-compiler check.
    _sig("import_or_env", r"ModuleNotFoundError: No module named", "a Python package is missing"),
    _sig(
        "import_or_env",
        r"^(?:\[[^\]\n]*\]:?\s*)*ImportError\b|^\W{0,3}cannot import name '[\w.]+' from '[\w.]+'",
        "an import failed",
    ),
    _sig("import_or_env", r"cannot open shared object file", "a shared library is missing"),
    # glibc's loader when a library with initial-exec TLS is loaded late (libgomp on aarch64 /
    # Jetson): preloading it (LD_PRELOAD) or importing it first is the known fix
    _sig(
        "import_or_env",
        r"cannot allocate memory in static TLS block",
        "a shared library could not be loaded this late in the process (static TLS): preload it "
        "(LD_PRELOAD) or import it first",
    ),
    _sig("import_or_env", r"undefined symbol: ", "a shared library does not match its caller"),
    # PaddlePaddle's dynamic loader (platform/dynload); jax's check of the installed jaxlib
    _sig(
        "import_or_env",
        r"\bCannot load \w+ shared library\b",
        "a shared library the framework loads at run time (cuDNN, cuBLAS, NCCL...) is missing",
    ),
    # No display or OpenGL where a simulator or renderer wants one: GLEW's and GLFW's init, X11
    # clients (Qt's xcb plugin, pyglet, freeglut), a headless server without EGL or OSMesa set up
    _sig(
        "import_or_env",
        r"\bGLEW initi?ali[sz]ation error\b|\bMissing GL version\b|\bcannot connect to X server\b"
        r"|\bqt\.qpa\.xcb: could not connect to display\b|\bNoSuchDisplayException\b"
        r"|\bfreeglut \([^)\n]*\): failed to open display\b",
        "no display or OpenGL here for what the program renders: run it headless (xvfb-run, or "
        "EGL / OSMesa) or on a machine with a display",
    ),
    # Code written for an older PyTorch run under a newer one: `loss.data[0]` (before 0.4, a loss
    # was a 1-element tensor), torch.stft without return_complex (required from 2.0)
    _sig(
        "import_or_env",
        r"\binvalid index of a 0-dim tensor\. Use `?tensor\.item\(\)|\bstft requires the "
        r"return_complex parameter be given for real inputs",
        "the code was written for an older PyTorch than the one installed (pin the version it "
        "names, or port the call)",
    ),
    # PyTorch Geometric 2's convolutions keep their weights in `lin` and dropped `GCNConv.norm`:
    # code written for PyG 1 (or a subclass of its layer) reaches for what is gone
    _sig(
        "import_or_env",
        r"'(?:GCN|Cheb|GAT|SAGE|GIN|Graph)Conv\w*' (?:object )?has no attribute '(?:weight|norm)'",
        "code written for PyTorch Geometric 1 run under version 2, whose layers moved their "
        "weights (pin torch_geometric to the version the code names, or port it)",
    ),
    # A function of an optional package whose import the code skipped quietly (try/except
    # ImportError): the package is missing or failed to import
    _sig(
        "import_or_env",
        r"\bNameError: name '(?:flash_attn\w*|xformers\w*|apex\w*|FusedLayerNorm|FusedAdam)' is "
        r"not defined",
        "a function of an optional package (flash-attn, xformers, apex) is missing: the package "
        "is not installed or failed to import, and the code skipped its import quietly",
    ),
    # Hydra older than the code: `version_base` came with Hydra 1.2
    _sig(
        "import_or_env",
        r"\bmain\(\) got an unexpected keyword argument 'version_base'",
        "the installed Hydra is older than the code (version_base needs Hydra 1.2 or later)",
    ),
    _sig(
        "import_or_env",
        r"\bjaxlib is version [\w.]+, but this version of jax requires version",
        "the installed jaxlib is older than this jax needs",
    ),
    # JAX's and TensorFlow's check of the cuDNN they load against the one they were built with
    _sig(
        "import_or_env",
        r"\bFound cuDNN version \d+, but JAX was built against version \d+"
        r"|Loaded runtime CuDNN library: [\d.]+ but source was compiled with: [\d.]+",
        "the installed cuDNN is not the version the framework was built against: install the "
        "matching cuDNN (or the framework build for this one)",
    ),
    _sig(
        "import_or_env",
        r"version `GLIBC(?:XX)?_[\d.]+' not found",
        "the C / C++ runtime library is too old",
    ),
    _sig(
        "import_or_env",
        r": command not found(?!: -)",
        "the program to run is not installed",
    ),
    # options zsh ran as commands, one after another: the lines of the command ended without
    # their `\` (bash's `-np: command not found` alone is more often an empty variable that
    # should have named the program, read above)
    _sig(
        "config_error",
        r"\bcommand not found: --?\w",
        "the shell ran options as commands: lines of the command ended without their `\\`, so the "
        "rest of the command line was never passed to the program",
        min_lines=2,
    ),
    # torchaudio with no audio backend (soundfile, sox or ffmpeg) installed; code that patches
    # transformers' model internals, run with a release whose internals moved
    _sig(
        "import_or_env",
        r"Couldn't find appropriate backend to handle uri\b|AttributeError: ?'(?:Llama|Mistral|"
        r"Mixtral|Qwen\d*|Gemma\d*|Phi\d*|Falcon|GPTNeoX|OPT|Bloom|GPT2|T5|Bert|Roberta|Whisper)"
        r"\w*(?:Attention|RotaryEmbedding|DecoderLayer|MLP|SdpaAttention|FlashAttention2)' object "
        r"has no attribute",
        "the environment is not what the code needs: no audio backend for torchaudio, or a "
        "transformers release whose model internals are not the ones this code patches (install "
        "the version it pins)",
    ),
    # TensorFlow's load_op_library on a package's compiled ops built for another platform or
    # TF; a Caffe (fork) build without the layer a prototxt names
    _sig(
        "import_or_env",
        r"\bNotFoundError: (?:NotFoundError: )?[^\n]*\.(?:so|dll|dylib)(?:\.[\d.]+)? not found\b"
        r"|Check failed: registry\.count\(type?\) == 1 \(0 vs\. 1\) Unknown layer type: \w",
        "a compiled part of the framework is missing: a package's op library built for another "
        "platform or version, or a Caffe build without this layer (build the fork's own Caffe)",
    ),
    # dash (/bin/sh on Debian and Ubuntu) says it as `script.sh: 1: srun: not found`
    _sig(
        "import_or_env",
        r"^(?:[\w./-]+: )?\d+: [^:\n]{1,200}: not found$",
        "the program to run is not installed (as /bin/sh reports it)",
    ),
    # torch_scatter / torch_sparse built for another torch: their scripted ops' signatures differ
    _sig(
        "import_or_env",
        r"\b(?:scatter|segment|spspmm|spmm)_?\w*\(\) expected at most \d+ argument\(s\) but "
        r"received \d+ argument",
        "torch_scatter / torch_sparse were built for another PyTorch: install the wheels made for "
        "this torch and CUDA",
    ),
    _sig(
        "import_or_env",
        r"Error building extension '[\w.]+'|\bcould not compile (?:the )?[\w ]{0,40}"
        r"\bextensions?\b",
        "a C++/CUDA extension could not "
        "be compiled (a compiler, the CUDA toolkit or headers are missing or do not match)",
    ),
    _sig(
        "import_or_env",
        r"Command '\['ninja', '-v'[^\]]*\]' returned non-zero exit status",
        "a C++/CUDA extension could not be compiled (ninja failed)",
    ),
    _sig(
        "import_or_env",
        r"CUDA_HOME environment variable is not set",
        "the CUDA toolkit is not installed or CUDA_HOME is not set",
    ),
    _sig(
        "import_or_env",
        r"#error -- unsupported GNU version",
        "nvcc cannot build with this host compiler (the CUDA toolkit and gcc do not match)",
    ),
    _sig(
        "import_or_env",
        # setuptools' report, with the quotes a shell, a forum or Windows gives it
        r"error:? command [\'\"\u201c\u2018][^\n]*?\bnvcc(?:\.exe)?[\'\"\u201d\u2019] failed",
        "a CUDA extension could not be compiled (nvcc failed): its build errors are above",
    ),
    _sig(
        "import_or_env",
        r"compiled with different CUDA (?:major )?versions|The detected CUDA "
        r"version \([\d.]+\) mismatches the version that was used to compile PyTorch",
        "the installed packages were built for different CUDA versions",
    ),
    # An extension built against another NumPy (its C API version, its dtype size, NumPy 2's
    # warning); torch.utils.cpp_extension without ninja or failing to compile; a CPU-only torch.
    _sig(
        "import_or_env",
        r"compiled against API version \w+ but this version of numpy is|numpy\.dtype size "
        r"changed, may indicate binary incompatibility|compiled using NumPy 1\.x cannot be run in"
        r" NumPy 2|numpy\.core\.multiarray failed to import|Ninja is required to load C\+\+ "
        r"extensions|Error compiling objects for extension|Torch not compiled with CUDA enabled",
        "the installed packages do not fit together (an extension built for another NumPy or "
        "torch, no compiler tools for an extension, or a CPU-only torch)",
    ),
    # pip could not install what the run needs; Windows' shell for a program not on PATH
    _sig(
        "import_or_env",
        r"Could not build wheels for|Failed building wheel for|No matching distribution found for"
        r"|Could not find a version that satisfies the requirement|\bResolutionImpossible\b"
        r"|Microsoft Visual C\+\+ [\d.]+ (?:or greater )?is required"
        r"|is not recognized as an internal or external command",
        "the environment could not be set up: a package did not install (or a program is not on "
        "the PATH)",
    ),
    _sig(
        "import_or_env",
        r"AttributeError: (?:(?:partially initialized )?module '[\w.]+'|'module' object) has no "
        r"attribute",
        "a package lacks a name the code uses: the installed version is not the one the code "
        "was written for (or a circular import)",
    ),
    _sig(
        "import_or_env",
        r"Failed to import [\w.]+ because of the following error",
        "an import failed",
    ),
    # transformers' TrainingArguments given a keyword its version no longer (or not yet) has
    # (`evaluation_strategy`, removed in 4.46): code written for another version
    _sig(
        "import_or_env",
        r"TrainingArguments\.(?:__)?init(?:__)?\(\) got an unexpected keyword argument",
        "the installed transformers does not take an argument the code passes: it was written "
        "for another version (pin the one it names, or rename the argument)",
    ),
    # A name the code binds only when an optional import succeeds (`try: import selective_scan_cuda
    # except ImportError: pass`; apex's amp): the compiled extension or package is not there
    _sig(
        "import_or_env",
        r"NameError: name '(?:amp|apex|\w+_(?:cuda|cpp|ext|C))' is not defined",
        "the code uses a package or compiled extension whose import failed quietly earlier (an "
        "optional import): install the package, or build the extension",
    ),
    # ChatGLM's remote tokenizer code under transformers >= 4.34, which calls `_add_tokens` from
    # the base class's __init__ before the subclass has set its own sentencepiece model
    _sig(
        "import_or_env",
        r"'ChatGLM\d*Tokenizer' object has no attribute '(?:sp_)?tokenizer'",
        "ChatGLM's tokenizer code does not run on this transformers (4.34 and later changed the "
        "order it initialises in): pin the transformers version the model names",
    ),
    # stable-baselines3 refusing a space of the very class it supports: the environment's space
    # comes from the other package (gym against gymnasium), not a setting
    _sig(
        "import_or_env",
        r"only supports \([^)\n]*?<class '(?:gym|gymnasium)\.spaces\.\w+\.(\w+)'>[^)\n]*\) as "
        r"(?:action|observation) spaces? but \1\(",
        "the environment's spaces come from the other gym package than the library's (gym "
        "against gymnasium): install the versions that go together",
    ),
    # DGL's CPU-only build asked for a GPU
    _sig(
        "import_or_env",
        r"\bDevice API (?:gpu|cuda) is not enabled\. Please install the cuda version of dgl",
        "the installed package is its CPU-only build: install the CUDA build",
    ),
    # A build that cannot find its toolkit: gcc on a missing header, nvcc older than the GPU's
    # architecture, ld on a library that is not installed
    _sig(
        "import_or_env",
        r"fatal error: [\w./+-]+\.(?:h|hh|hpp|cuh|hxx): No such file or directory"
        r"|^nvcc fatal\s*: Unsupported gpu architecture|\bld(?:\.\w+)?: cannot find -l\w",
        "a C++/CUDA extension could not be compiled: a header, a library or the CUDA toolkit "
        "it needs is missing or too old",
    ),
    # Package metadata lookups (setuptools' pkg_resources, importlib.metadata) for a package
    # that is not installed; protobuf 4 on code generated for protobuf 3; torchvision's ops
    # built for another torch; torch built against another NumPy
    _sig(
        "import_or_env",
        r"\bDistributionNotFound: The '[^'\n]+' distribution was not found"
        r"|\bPackageNotFoundError: No package metadata was found for"
        r"|Descriptors cannot not? be created directly"
        r"|operator torchvision::\w+ does not exist|^(?:\[[^\]\n]*\]:?\s*)*RuntimeError: Numpy is "
        r"not available|\[WinError 12[67]\] The specified (?:module|procedure) could not be found",
        "the installed packages do not fit together (one missing, or built for another version "
        "of its dependency)",
    ),
    # transformers older than the model it loads; torch's cuDNN check; a DLL whose start-up
    # failed; a spaCy language model not installed; pip, conda and setuptools failing to set
    # the environment up; bitsandbytes without its CUDA library; apex built with another toolkit
    _sig(
        "import_or_env",
        r"Tokenizer class \w+ does not exist or is not currently imported|Transformers does not "
        r"recognize this architecture|\bcuDNN version incompatibility: PyTorch was compiled"
        r"|\[WinError 1114\]|\[E050\] Can't find model '|\berror: subprocess-exited-with-error"
        r"|\bPackagesNotFoundError: The following packages are not available|\bUnsatisfiableError: "
        r"|\bResolvePackageNotFound:|invalid command 'bdist_wheel'"
        r"|\bCUDA Setup failed despite GPU being available|Cuda extensions are being compiled with a"
        r" version of Cuda that does not match",
        "the environment is not what the code needs: a package too old for the model, a "
        "library or a toolkit of another version, or one that did not install",
    ),
    # argparse's parser.error; nanoGPT's configurator; yacs; Hydra / OmegaConf; transformers.
    _sig(
        "config_error",
        r"(?:^|: )error: (?:unrecognized arguments|the following arguments are "
        r"required|argument [^:\n]+: (?:invalid|expected|ambiguous|not allowed)|invalid choice"
        r"|argument [^:\n]+ is required$)|^(?:\S+: )?error: \w+ [^:\n]+: invalid choice: '",
        "the command line is wrong: argparse rejected it",
    ),
    # PyYAML's parse errors (a config file that is not valid YAML)
    _sig(
        "config_error",
        r"\byaml\.(?:scanner|parser|composer|constructor)\.\w*Error\b|^\s*while (?:scanning|"
        r"parsing) a (?:simple key|block mapping|block collection|flow mapping|quoted scalar)\b",
        "a YAML file (most often the config) does not parse",
    ),
    # click's, python-fire's, absl's and jsonargparse's (LightningCLI) rejections of a command line
    _sig(
        "config_error",
        r"^Error: (?:Invalid value for|No such option|Missing option|Missing argument|Got "
        r"unexpected extra argument)|\bCould not consume arg: "
        r"|Flags parsing error: (?!.*Unable to open flagfile)"
        r"|(?:^|: )error: Parser key \"",
        "the command line is wrong: its parser rejected it",
    ),
    # Weights & Biases asked to log with no key set up on a machine it cannot prompt on
    _sig(
        "config_error",
        r"\bwandb: ERROR api_key not configured\b|\bUsageError: api_key not configured \(no-tty\)",
        "Weights & Biases has no API key here: run `wandb login`, set WANDB_API_KEY, or turn it "
        "off (WANDB_MODE=offline or disabled)",
    ),
    # mmcv / mmengine: the config names a type no module registered
    _sig(
        "config_error",
        r"\bis not in the [\w ]{1,40} registry\b",
        "the config names a type that is not registered (a typo, or its module not imported)",
    ),
    _sig(
        "config_error",
        r"\bargparse\.Argument(?:Type)?Error\b",
        "the command line is wrong: argparse rejected it",
    ),
    _sig(
        "config_error",
        r"^\s*exec\(open\(['\"]configurator\.py['\"]\)\.read\(\)\)",
        "nanoGPT's configurator rejected an override (a value of the wrong type, or a malformed "
        "--key=value)",
    ),
    # torch.nn.MultiheadAttention's check of its sizes: a model config's width and heads
    _sig(
        "config_error",
        r"\bembed_dim must be divisible by num_heads\b",
        "the model's width is not a multiple of its number of attention heads: change one of "
        "them in the config",
        retryable=False,
        action="stop",
    ),
    _sig(
        "config_error",
        r"AssertionError: Invalid type .* for key|Non-existent config key",
        "the config (yacs) has a key or a value of the wrong type",
    ),
    _sig(
        "config_error",
        r"Could not override '[^'\n]+'|\bConfigCompositionException\b"
        r"|Error merging override|Key '[^'\n]+' (?:is )?not in struct|\bMissingConfigException\b"
        r"|omegaconf\.errors\.(?:ConfigAttributeError|ConfigKeyError|MissingMandatoryValue|"
        r"ValidationError|ConfigTypeError)",
        "the Hydra / OmegaConf config or an override of it is invalid",
    ),
    _sig(
        "config_error",
        r"^(?:\[[^\]\n]*\]:?\s*)*ValueError: --\w[\w-]* "
        # a config's own check naming the argument it needs (LeRobot's draccus configs)
        r"|^(?:\[[^\]\n]*\]:?\s*)*ValueError: '[\w.-]+' argument (?:is )?missing\b",
        "an argument's value is invalid or missing (the program names it)",
    ),
    _sig(
        "config_error",
        r"Some specified arguments are not used by the HfArgumentParser",
        "the command line has arguments the training script does not define",
    ),
    # DeepSpeed's check of its batch sizes against the world size; gin-config on a binding no
    # configurable matches
    _sig(
        "config_error",
        r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size"
        r"|\bNo configurable matching '[^'\n]+'|\bMisconfigurationException\b"
        r"|\bConfigurable '[^'\n]+' doesn't have a parameter named\b"
        # spaCy's (thinc's) config checks
        r"|\bInvalid config override '|^\W{0,3}Config validation error\b"
        # a GPU index this machine does not have; BatchNorm given a batch of one (a batch size,
        # or a last batch of one: drop_last); a batch size of 0 (torch's BatchSampler)
        r"|\binvalid device ordinal\b|Expected more than 1 value per channel when training"
        r"|\bbut got batch_size=0\b"
        # a path the command line or the config left unset, handed to open() or os.path; bf16
        # asked of a GPU (or a torch) that has none
        r"|expected str, bytes or os\.PathLike object, not NoneType|Your setup doesn't support "
        r"bf16",
        "the config's values do not fit this machine or each other (a GPU index it does not have, "
        "a batch size of 0 or of 1 with BatchNorm, DeepSpeed's batch sizes and the number of "
        "GPUs, bf16 where there is none, Lightning's checks of its Trainer's arguments), a "
        "path it leaves unset, or it binds a name nothing defines (gin)",
    ),
    # a jsonnet config (AllenNLP, jsonnet-driven trainers) that does not parse or evaluate
    _sig(
        "config_error",
        r"\b(?:STATIC|RUNTIME) ERROR: [^\n]*\.(?:jsonnet|libsonnet|json):\d+:\d+",
        "the jsonnet config does not parse or evaluate: fix it at the line and column named",
    ),
    # PEFT's LoRA config naming modules the model does not have (another architecture's names)
    _sig(
        "config_error",
        r"\bTarget modules? \{?[^\n]{0,200}\}? not found in the base model\b",
        "the LoRA config's target_modules are not in this model (names from another "
        "architecture): list this model's module names",
    ),
    # mmdetection's check that a head's num_classes is the dataset's number of classes
    _sig(
        "config_error",
        r"The `num_classes` \(\d+\) in \w+ of [\w<>'. ]{1,80} does not matches? the length of "
        r"`CLASSES`",
        "the model config's num_classes is not the dataset's number of classes: set it to "
        "len(CLASSES), or give the dataset the classes the model was built for",
    ),
    # torch's NLLLoss / CrossEntropyLoss given class weights of another length than the classes;
    # guided-diffusion's UNet (and its many forks) asked for an image size it has no layout for
    _sig(
        "config_error",
        r"\bweight tensor should be defined either for all or no classes\b"
        r"|^(?:\[[^\]\n]*\]:?\s*)*ValueError: unsupported image size: \d+\s*$",
        "the config's values do not fit the model: class weights of another length than the "
        "number of classes, or an image size the model has no layout for (guided-diffusion's "
        "channel_mult)",
    ),
    # the HF / PaddleNLP Trainer: metric_for_best_model names a metric evaluation never returns
    # (the KeyError's traceback line in older versions, the Trainer's own message in newer ones)
    _sig(
        "config_error",
        r"^\s*[\w. =(]*\bmetrics\[metric_to_check\]\)?$|The `metric_for_best_model` training "
        r"argument is set to",
        "metric_for_best_model names a metric the evaluation does not return",
    ),
    # the CUDA runtime's error strings, as PyTorch, Caffe, thrust, Kaldi raise them; kernel asserts;
    # the NVIDIA kernel module (dmesg).
    _sig(
        "cuda_runtime_error",
        r"device-side assert triggered",
        "a kernel assertion failed, most often an index out of range (e.g. a label >= the number "
        "of classes): a bug in the code or data",
        retryable=False,
        action="stop",
    ),
    _sig(
        "cuda_runtime_error",
        r"\.cu:\d+: .*block: \[[\d,]+\], thread: \[[\d,]+\] Assertion .* "
        r"failed",
        "a kernel assertion failed, most often an index out of range (e.g. a label >= "
        "the number of classes): a bug in the code or data",
        retryable=False,
        action="stop",
    ),
    _sig(
        "cuda_runtime_error",
        r"an illegal memory access was encountered",
        "a kernel accessed memory it must not (a bug, or a failing GPU)",
    ),
    # cudaErrorNoKernelImageForDevice: a build without this GPU's compute capability (too new or
    # too old a GPU for the wheel); retrying on the same GPU fails the same way.
    _sig(
        "cuda_runtime_error",
        r"no kernel image is available for execution on the device",
        "the installed PyTorch (or extension) was not built for this GPU's compute capability: "
        "install a build for it, or run on a supported GPU",
        retryable=False,
        action="stop",
    ),
    # ROCm's counterparts: the HIP runtime finds no code object for this GPU's architecture
    # (gfx…), or rocBLAS has no kernels for it
    _sig(
        "cuda_runtime_error",
        r"\bhipErrorNoBinaryForGpu\b|rocBLAS error: Cannot read [^\n]*TensileLibrary[^\n]*\bfor "
        r"GPU arch\b",
        "the installed ROCm build has no kernels for this GPU's architecture (gfx…): install a "
        "build for it, or run on a supported GPU",
        retryable=False,
        action="stop",
    ),
    # Intel's Arc GPUs have no 64-bit floating point: a kernel that uses it cannot run there
    _sig(
        "cuda_runtime_error",
        r"\binvalid_kernel\(\"uses-fp64-math\"\)|\bRequired aspect fp64 is not supported on the "
        r"device\b",
        "the GPU has no 64-bit floating point and a kernel uses it: compute in float32 (the "
        "model's or the loss's dtype), or run on a GPU that has it",
        retryable=False,
        action="stop",
    ),
    _sig("cuda_runtime_error", r"CUDA error: (?!out of memory)[a-z]", "a CUDA call failed"),
    _sig("cuda_runtime_error", r"\bHIP error: (?!out of memory)[a-z]", "a HIP (ROCm) call failed"),
    _sig(
        "cuda_runtime_error",
        r"unspecified launch failure|\bmisaligned address\b",
        "a CUDA kernel failed (a bug, or a failing GPU)",
    ),
    _sig(
        "cuda_runtime_error",
        r"\bcudaError(?!MemoryAllocation)[A-Z]\w+|\bCUDA error \d+ \[",
        "a CUDA call failed",
    ),
    # ROCm's names for the same failures: the HIP runtime's error codes and MIOpen (cuDNN's
    # counterpart)
    _sig(
        "cuda_runtime_error",
        r"\bhipError(?!OutOfMemory\b|Success\b)[A-Z]\w+|\bMIOpen Error:"
        r"|\bmiopenStatus(?!Success\b)[A-Z]\w+",
        "a ROCm call failed (the HIP runtime or MIOpen)",
    ),
    _sig("cuda_runtime_error", r"error == cudaSuccess \(\d+ vs\. 0\)", "a CUDA call failed"),
    _sig(
        "cuda_runtime_error",
        r"\bcuda runtime error \((?!2\))\d+\) : ",
        "a CUDA call failed (THC, in Lua Torch and old PyTorch)",
    ),
    # The driver API's CUresult names (cuda.h), as XLA, CuPy, Triton and numba print them; those
    # that mean a driver too old or absent are driver_mismatch's, out of memory cuda_oom's.
    _sig(
        "cuda_runtime_error",
        r"\bCUDA_ERROR_(?!OUT_OF_MEMORY|NO_DEVICE\b|INSUFFICIENT_DRIVER|SYSTEM_DRIVER_MISMATCH"
        r"|COMPAT_NOT_SUPPORTED_ON_DEVICE|UNSUPPORTED_PTX_VERSION|NOT_INITIALIZED)[A-Z_]+\b",
        "a CUDA call failed (the driver's error code names how)",
    ),
    # torch's warning at start-up for a GPU its build has no kernels for (torch/cuda/__init__.py)
    _sig(
        "cuda_runtime_error",
        r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
        "the installed PyTorch was not built for this GPU's compute capability: install a build "
        "for it, or run on a supported GPU",
        retryable=False,
        action="stop",
        on_info=True,
    ),
    _sig("cuda_runtime_error", r"CUBLAS_STATUS_EXECUTION_FAILED", "a cuBLAS kernel failed"),
    # torch.fft's cuFFT plan or execution failing (most often a torch build without support for
    # this GPU or CUDA, else a size cuFFT cannot plan)
    _sig("cuda_runtime_error", r"\bcuFFT error: CUFFT_\w+", "a cuFFT call failed on the GPU"),
    _sig("cuda_runtime_error", r"NVRM: Xid \(", "the driver reported an Xid (GPU) error"),
    _sig("cuda_runtime_error", r"fallen off the bus", "the GPU dropped off the PCIe bus"),
    _sig("cuda_runtime_error", r"uncorrectable ECC error", "the GPU reported an ECC error"),
    # A SIGKILL as the launchers report it: torchrun's elastic agent, torch.multiprocessing, the
    # DeepSpeed launcher. Evidence of a kill, not of who sent it (host_oom outranks it).
    _sig(
        "killed",
        r"failed \(exitcode: -9\)|\bexitcode\s*: -9\b|Signal 9 \(SIGKILL\) received by "
        r"PID|terminated with signal SIGKILL|exits with return code = -9|got signal: 9\b",
        "a worker was SIGKILLed (as its launcher reports it): the kernel OOM killer or a person",
    ),
    # A signal sent to the run from outside (a person, a closed terminal, the batch system): torch
    # elastic's agent (at its warning level), its SignalException, Slurm's scancel.
    _sig(
        "killed",
        r"Received \d+ death signal, shutting down workers|\bSignalException: Process \d+ got "
        r"signal: \d+|\bmultiprocessing\.api\.SignalException\s*$",
        "the launcher received a signal (a hangup, a terminate or an interrupt) and stopped the "
        "workers: a person, a closed terminal (nohup/tmux next time) or the platform",
        on_info=True,
    ),
    _sig(
        "killed",
        r"\*\*\* (?:JOB|STEP) [\w.]+ ON \S+ CANCELLED AT [\w:.+-]+"
        r"(?: DUE TO (?!TIME LIMIT)[A-Z][A-Z ,]*)? \*\*\*"
        # LSF's termination reasons for a job killed by a person, a preemption or a limit other
        # than memory and time (bacct's TERM_* keywords, printed in the job's report)
        r"|\bTERM_(?:ADMIN|BUCKET_KILL|EXTERNAL_SIGNAL|FORCE_ADMIN|FORCE_OWNER|LOAD|PREEMPT"
        r"|PROCESSLIMIT|REQUEUE_ADMIN|REQUEUE_OWNER|THREADLIMIT|WINDOW): job killed\b"
        # Snakemake on Ctrl-C
        r"|^\^?C?Terminating processes on user request\b"
        r"|^srun: forcing job termination|exited on signal (?:1|2|15) \((?:Hangup|Interrupt"
        r"|Terminated)\)"
        # srun when Slurm takes the allocation back (a failed prolog, an administrator)
        r"|^srun: Force Terminated job \d+|\bJob allocation \d+ has been revoked\b",
        "the batch system cancelled the job (scancel, a preemption, a limit, or the session that "
        "started it ended)",
    ),
    # A run that hung, or that a time limit stopped: Slurm, PBS/Torque, LSF, Kubernetes; torch's
    # and MXNet's DataLoader timeouts; faulthandler's dump_traceback_later and py-spy's dump of a
    # stuck process; pytest-timeout. (A collective's timeout is nccl_or_distributed.)
    _sig(
        "hang_or_timeout",
        r"CANCELLED AT \S+ DUE TO TIME LIMIT|\bDUE TO TIME LIMIT \*\*\*",
        "Slurm stopped the job at its time limit",
    ),
    _sig(
        "hang_or_timeout",
        r"\bwalltime \d+ exceeded limit \d+|TERM_RUNLIMIT: job killed after reaching LSF run time"
        r"|\bTERM_(?:CPULIMIT|DEADLINE): job killed after"
        r"|Terminated due to wall ?(?:clock |time )?limit"
        r"|exceeded (?:hard|soft) wallclock time|Job was active longer than specified deadline"
        r"|\bJob exceeded its walltime limit\b"
        r"|\bDeadlineExceeded\b",
        "the batch system stopped the job at its time limit (walltime / run limit / deadline)",
    ),
    # CARLA's Python client, when the simulator it drives never answers
    _sig(
        "hang_or_timeout",
        r"\btime-out of \d+ ?ms while waiting for the simulator\b",
        "the CARLA client timed out waiting for the simulator (not started, still loading, on "
        "another port, or stuck)",
    ),
    _sig(
        "hang_or_timeout",
        r"DataLoader timed out after \d+ seconds|\bWorker timed out after \d+ seconds",
        "DataLoader workers stopped delivering batches (they hung or are too slow)",
    ),
    _sig(
        "hang_or_timeout",
        r"^Timeout \(\d+:\d\d:\d\d\)!|^Thread \d+ \((?:idle|active)\): \"|^\+{5,} Timeout \+{5,}",
        "a stack dump of a stuck process (faulthandler's timeout, py-spy, pytest-timeout)",
    ),
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp and NCCL's ncclGetErrorString; gloo; store.
    _sig("nccl_or_distributed", r"NCCL error", "a NCCL collective failed"),
    # JAX's coordination service (XLA's distributed runtime): a host that never arrived
    _sig(
        "nccl_or_distributed",
        r"\bBarrier timed out\. Barrier_id:",
        "JAX's coordination service timed out waiting for every host (one never started or died)",
    ),
    _sig(
        "nccl_or_distributed",
        r"\bnccl(?:System|Internal|UnhandledCuda|Remote)Error\b",
        "a NCCL collective failed",
    ),
    _sig(
        "nccl_or_distributed",
        r"unhandled (?:system|cuda) error \(run with NCCL_DEBUG=INFO"
        r"|NCCL failure [^\n]*'unhandled (?:system|cuda) error'",
        "a NCCL collective failed",
    ),
    _sig(
        "nccl_or_distributed",
        r"NCCL communicator was aborted|ProcessGroupNCCL's watchdog got "
        r"stuck",
        "a NCCL communicator was torn down (a collective failed or hung)",
    ),
    _sig(
        "nccl_or_distributed",
        r"remote process exited or there was a network error",
        "a peer rank died or the network failed",
    ),
    _sig(
        "nccl_or_distributed",
        r"Watchdog caught collective operation timeout"
        r"|ProcessGroupNCCL::WorkNCCL::checkTimeout|Exception raised from ncclCommWatchdog",
        "a collective hung until the NCCL watchdog timed out",
    ),
    _sig(
        "nccl_or_distributed",
        r"NCCL WARN NET/\w+ ?: Got completion from peer .* with (?:status=|error \d)"
        r"|\bWARN Call to \w+ failed|Gloo connectFullMesh failed",
        "NCCL's network transport failed",
    ),
    _sig(
        "nccl_or_distributed",
        r"\bDist(?:Backend|Network|Store)Error\b"
        r"|\bRendezvous(?:Connection|Timeout|Closed)Error\b",
        "torch.distributed failed",
    ),
    _sig(
        "nccl_or_distributed",
        r"\[c10d\] The client socket has timed out|TCP client failed to "
        r"connect|connect\(\) timed out\. Original timeout was|Timed out initializing process "
        r"group",
        "a rank could not reach the rendezvous / TCPStore in time",
    ),
    _sig(
        "nccl_or_distributed",
        r"^(?:\[[^\]\n]*\]:?\s*)*RuntimeError: (?:Connection reset by peer|Address already in use)"
        r"|errno: 98 - Address already in use|The server socket has failed to (?:listen|bind)",
        "a peer rank's connection dropped",
    ),
    # DGL's distributed RPC (src/rpc/network): its server's socket on an address or port it
    # cannot have
    _sig(
        "nccl_or_distributed",
        r"\bsocket_communicator\.cc:\d+: Cannot bind to\b|\btcp_socket\.cc:\d+: Failed bind on\b",
        "DGL's distributed RPC could not bind its socket (an address that is not this machine's "
        "in the ip config, or a port in use)",
    ),
    # c10d's TCPStore client that never reached the master (MASTER_ADDR/PORT, a firewall, a
    # master that never started)
    _sig(
        "nccl_or_distributed",
        r"The client socket has timed out after \d+m?s while trying to connect to",
        "a rank could not reach the rendezvous store (MASTER_ADDR / MASTER_PORT, a firewall, or "
        "a master that never started)",
    ),
    _sig(
        "nccl_or_distributed",
        r"gloo/transport/tcp/pair\.cc.*Connection (?:closed|reset) by peer",
        "a peer rank's connection dropped",
    ),
    # FileNotFoundError / errno 2 (not a debugger's missing source file); transformers' hub lookup.
    _sig("file_missing", r"FileNotFoundError", "a file or folder the run needs does not exist"),
    # a dataset folder checked before the run (torchreid / fast-reid's `'x' is not available`),
    # a path printed as NOT EXIST, a dataset the loader says to download by hand
    _sig(
        "file_missing",
        r"^(?:\W{0,3}RuntimeError: )'[^'\n]*[/\\][^'\n]*' is not available\b"
        r"|^\S*[/\\]\S* NOT EXISTS?\s*$|\bPlease download the dataset manually\b",
        "the dataset (or a folder of its files) is not where the config points: download it or "
        "fix the path",
    ),
    # glog / Caffe's CHECK on a file it opens (`Check failed: fd != -1 … File not found: x`)
    _sig(
        "file_missing",
        r"Check failed: [^\n]*\bFile not found: \S",
        "a file the run needs does not exist",
    ),
    # A path the program checked for itself; huggingface_hub's answer for a repository or file
    # that is not on the Hub (a typo in a model id, or a private one)
    _sig(
        "file_missing",
        r"['\"]?(?:\.{0,2}/|~/|[A-Za-z]:[\\/])?[\w.~-]+(?:[\\/][\w.~-]+)+(?:['\"] ?| ['\"]?)"
        r"(?:does not|doesn't|did not) exist\b|\b(?:Repository|Entry|Revision)NotFoundError\b"
        r"|(?:does not|doesn't) exist: ['\"]?(?:\.{0,2}/|~/|/|[A-Za-z]:[\\/])"
        r"|Error no file named [\w.]+(?:, [\w.]+)*"
        r"(?: or [\w.]+)? found in directory",
        "a file, folder or model the run needs does not exist",
    ),
    # transformers' from_pretrained on a path or model id that holds no such files
    _sig(
        "file_missing",
        r"Can't load (?:the )?(?:config(?:uration)?|tokenizer|model|weights|feature extractor"
        r"|processor|image processor)(?: of| for)? '[^'\n]+'",
        "the model or tokenizer to load is not at that path or model id",
    ),
    _sig(
        "file_missing",
        r"\[Errno 2\] No such file or directory|No such file or directory: ['\"]",
        "a file or folder the run needs does not exist",
    ),
    # OpenCV's imread warning (an image it cannot open) and the empty image it then hands on; a
    # script Python cannot open; TensorFlow's file-system NotFoundError; DeepSpeed's config path.
    _sig(
        "file_missing",
        r"can't open/read file: check file path/integrity|\(-215(?::Assertion failed)?\) "
        r"!_?(?:src|ssize|img)\.empty\(\)|\bpython[\d.]*: can't open file",
        "an input file (an image, the script) cannot be opened: the path is wrong or the data "
        "is not there",
        on_info=True,
    ),
    _sig(
        "file_missing",
        r"NotFoundError: [^\n]*; No such file or directory"
        r"|Expected a string path to an existing deepspeed config|^OSError: file \S+ not found"
        # mmcv's load_checkpoint on a path that is no file; a checkpoint search that found none
        r"|\bis not a checkpoint file\b"
        r"|^(?:Exception|RuntimeError|OSError): No (?:matching )?checkpoint(?: file)? found\b"
        # a program's own check of a path it was given, raised as an OSError
        r"|^(?:OSError|IOError): ['\"]?\S*[\\/]\S+?['\"]? (?:is )?not found\.?\s*$",
        "a file or folder the run needs does not exist",
    ),
    # An empty dataset (the data path holds none of what the loader looks for: torch's
    # RandomSampler, or its ConcatDataset of no datasets); an input it cannot open (PIL,
    # libsndfile, darknet, a folder where a file was meant); a model folder without its files
    # (transformers); a script the shell cannot find
    _sig(
        "file_missing",
        r"num_samples should be a positive integer value, but got num_samples=0"
        r"|\bdatasets should not be an empty iterable\b|^Cannot load image \S"
        r"|\bError in load\(\): cannot load \S|\bUnable to open flagfile: \[Errno 2\]"
        r"|\bwandb: ERROR Couldn't open sweep file\b"
        r"|\b(?:UnidentifiedImageError|IOError|OSError): cannot identify image file"
        r"|\bError opening '[^'\n]+': (?:System error|Format not recognised)"
        r"|\bIsADirectoryError: \[Errno 21\]|\berror reading the file: Is a directory$"
        r"|\bNotADirectoryError: \[Errno 20\]|\bdoes not appear to have a file named [\w.-]+"
        r"|^(?:ba|z|da)?sh: (?:line \d+: )?[^:\n]+: No such file or directory$"
        # torchvision's ImageFolder before 0.9; TensorFlow's checkpoint reader on a prefix
        r"|\bFound 0 files in subfolders of:|Failed to find any matching files for \S"
        # huggingface_hub taking a path that does not exist for a Hub id; h5py's errno 2; the
        # program's own assertion that its input exists; a download whose address is gone
        r"|\bHFValidationError: Repo id must be in the form|\bIncorrect path_or_model_id: "
        # diffusers' loaders; a program's own check of a folder argument
        r"|\bis neither a valid local path nor a valid repo id\b"
        # a trainer that found no input images (instant-ngp, nerfstudio and others)
        r"|\bNo (?:training |input )?images (?:were )?found\b"
        # KenLM's util/file.cc; a Perl training script's (Moses) check of a file it needs
        r"|\bNo such file or directory while opening\b"
        r"|^(?:ERROR: )?Cannot find [\w.~-]*/[\w./~-]+ at [\w./-]+ line \d+"
        r"|\bInvalid (?:folder|directory|dir|file) path\b"
        r"|errno = 2, error message = 'No such file or directory'"
        r"|^\s*assert (?:not )?(?:os\.path|osp|path)\.(?:exists|isfile|isdir)\("
        r"|(?:^|[\s:'\"])\.{0,2}/?[\w.~-]+(?:/[\w.~-]+)+: No such file or directory\b"
        r"|\bHTTP Error 404: Not Found|\bERROR 404: Not Found|You are trying to access a gated "
        r"repo\b|\bGatedRepoError\b",
        "the data or a file the run reads is not there (an empty or wrong data path, a file "
        "that is not what it should be)",
    ),
    _sig(
        "file_missing",
        r"is not a local folder and is not a valid model identifier",
        "the model path or Hub id does not exist (or is a private repository and no token was "
        "given)",
    ),
    # torch.nn.Module.load_state_dict: a checkpoint that does not fit the model (keys or shapes
    # differ): the code, the config or the checkpoint is the wrong one. A crash, not corruption.
    _sig(
        "crashed",
        r"Error\(s\) in loading state_dict for|Missing key\(s\) in state_dict:"
        r"|Unexpected key\(s\) in state_dict:|\bsize mismatch for [\w.]+: copying a param"
        r"|While copying the parameter named [\w.]+, whose dimensions in the model are",
        "the checkpoint does not fit the model (missing, unexpected or differently shaped "
        "weights): the code, its config or the checkpoint is not the one meant",
    ),
    # Weak: TensorFlow's OOM when only its W-level lines report it; what a shell prints for any
    # SIGKILLed child; a NaN in a metrics line.
    _sig(
        "cuda_oom",
        r"OOM when allocating tensor(?!.*(?:device:CPU|by allocator cpu\b))",
        "TensorFlow ran out of GPU memory (reported at its warning level)",
        strong=False,
        on_info=True,
    ),
    _sig(
        "host_oom",
        r"OOM when allocating tensor.*(?:device:CPU|by allocator cpu\b)",
        "TensorFlow ran out of host memory (reported at its warning level)",
        strong=False,
        on_info=True,
    ),
    # The shell's word for a SIGKILLed child, in English and as localised shells print it
    # (German, Chinese, French, Spanish, Japanese): on a training run most often the OOM killer.
    _sig(
        "host_oom",
        _JOB_REPORT + r"(?:Killed\b(?!\s+process)|Getötet|已杀死|已殺死|Processus arrêté"
        r"|zsh: killed\b|\[\d+\] +\d+ killed +\S"
        r"|Terminado \(killed\)|強制終了)"
        # the same word glued to the progress line it cut short (Keras' bar, tqdm's)
        r"|(?<=[\d\]])Killed\s*$",
        "the shell reports the process SIGKILLed with no other error: on a training run most "
        "often the kernel OOM killer (host memory)",
        strong=False,
    ),
    _sig(
        "killed",
        _JOB_REPORT + r"(?:Terminated|Beendet|已终止)(?:\s+\S.*)?$|\bTERM_OWNER: job "
        r"killed by owner|\bReceived SIGTERM: 15\b",
        "the shell reports the process ended by SIGTERM (the platform, the batch system or a "
        "person)",
        strong=False,
    ),
    # A bare bus error: in a training run most often shared memory (/dev/shm) too small for the
    # DataLoader's workers (a container's 64 MB default), else a file mapped and then truncated
    _sig(
        "host_oom",
        r"^Bus error\b|\bBus error \(core dumped\)",
        "a bus error: most often shared memory (/dev/shm) too small for the DataLoader's workers "
        "(give the container more with --shm-size, or use fewer workers)",
        strong=False,
    ),
    # SIGILL as the shells report it: a binary built for instructions this CPU lacks (most often
    # TensorFlow's prebuilt wheels, which need AVX)
    _sig(
        "import_or_env",
        r"^(?:.*\bline \d+: +\d+ |\[\d+\] +\d+ )?(?:Illegal instruction\b|illegal hardware "
        r"instruction\b)",
        "an illegal instruction: a package built for instructions this CPU lacks (TensorFlow's "
        "prebuilt wheels need AVX): install a build for this CPU",
        strong=False,
    ),
    # Intel's Fortran runtime (NumPy/SciPy's MKL on Windows) on Ctrl-C
    _sig(
        "killed",
        r"forrtl: error \(200\): program aborting due to control-C event",
        "the run was interrupted (Ctrl-C) by a person",
        strong=False,
    ),
    _sig(
        "killed",
        # or only the terminal's echo of the key, after the line it cut short
        r"^KeyboardInterrupt\b|\^C\s*$",
        "the run was interrupted (Ctrl-C) by a person",
        strong=False,
    ),
    _sig(
        "nan_loss",
        r"[\"']?\b(?:[A-Za-z]\w*_)?loss(?!_?scale)(?:_\w+)?[\"'\]]?\s*[:=]?\s*\[?-?(?:nan|inf)\b",
        "a logged loss is NaN/inf",
        strong=False,
        on_info=True,
    ),
    # A loop's own words for it: `Finding Nan in gaussian loss`, `NaN detected in the total loss`
    _sig(
        "nan_loss",
        r"\b(?:nan|inf)s? (?:values? )?(?:(?:found|detected) )?in (?:the |your )?(?:\w+ ){0,2}"
        r"loss(?:es)?\b",
        "the program reports NaN/inf in its loss",
        strong=False,
        on_info=True,
    ),
    # Progress with several named values NaN on one line (a tqdm postfix `D=nan, G=nan`, a
    # trainer's `D_loss: nan ... G_loss: nan`); before the columns below, so that such a line
    # counts here when it is the only one.
    _sig(
        "nan_loss",
        r"\b[A-Za-z]\w{0,30}\s*[=:]\s*nan\b[^\n]{0,300}?\b[A-Za-z]\w{0,30}\s*[=:]\s*nan\b",
        "progress lines show several values NaN",
        strong=False,
        on_info=True,
    ),
    # Progress lines (a metrics table) with NaN columns on several iterations, no traceback.
    _sig(
        "nan_loss",
        # (a line may begin with its NaN once its iteration counter is read as a prefix:
        # darknet's ` 182: -nan, -nan avg loss, …`; or with a logger's own words before its
        # first number: `INFO:name, 2022-03-11 14:18:54,833, epoch, 0198, nan, nan`)
        r"^(?:[^\n]{0,120}?(?<![\w.]))?(?=\d|nan\b)[^\n]{0,200}?(?<![\w.])\[?nan\]?(?![\w.])"
        r"[^\n]{0,200}?(?<![\w.])\[?nan\]?(?![\w.])",
        "progress lines show NaN values on several iterations",
        strong=False,
        on_info=True,
        min_lines=2,
    ),
    # A loop that prints its step and its one loss, bare (`76980 nan`), NaN on several lines
    _sig(
        "nan_loss",
        r"^\s*\[?\d+\]?[\s,:|]+-?nan\s*$",
        "progress lines show the loss NaN on several iterations",
        strong=False,
        on_info=True,
        min_lines=3,
    ),
    # fp16 loss scaling that cannot find a scale at which the loss is finite (fairseq, DeepSpeed).
    _sig(
        "nan_loss",
        r"overflow detected, setting loss scale to: 0\.0|Attempted loss scale: 1(?:\.0)?, "
        r"reducing to 1\b|reducing loss scale to (?:0\.\d+|\d(?:\.\d+)?e-\d+)\b",
        "fp16 loss scaling has collapsed (every step overflows): the loss diverged",
        strong=False,
        on_info=True,
    ),
    # NCCL's init finding two ranks on one GPU (a launcher without --nproc / CUDA_VISIBLE_DEVICES)
    _sig(
        "nccl_or_distributed",
        r"\bDuplicate GPU detected : rank \d+ and rank \d+ both on CUDA device",
        "two ranks were given the same GPU: each process must select its own (LOCAL_RANK)",
    ),
    # torch.distributed used before init_process_group; DDP's unused-parameter reduction error
    _sig(
        "nccl_or_distributed",
        r"Default process group has not been initialized|Expected to have finished reduction in "
        r"the prior iteration before starting a new one",
        "the distributed setup is wrong (no process group initialised, or DDP finding parameters "
        "that took no part in the loss: find_unused_parameters)",
    ),
    # NCCL's warnings and its error code propagating up (`NCCL INFO x.cc:12 -> 2`).
    _sig(
        "nccl_or_distributed",
        r"\bNCCL WARN\b|NCCL INFO [\w/.]+\.(?:cc|h):\d+ -> [1-9]\d*\b",
        "NCCL reported a failure (its WARN lines, an error code returned up its call chain)",
        strong=False,
        on_info=True,
    ),
    # faulthandler's dump of every thread (a hang, unless a fatal error caused the dump).
    _sig(
        "hang_or_timeout",
        r"^(?:Current )?[Tt]hread 0x[0-9a-f]+ \(most recent call first\):",
        "a dump of every thread's stack, as taken of a stuck process (faulthandler)",
        strong=False,
    ),
    _sig(
        "nan_loss",
        r"\bgrad(?:ient)?[_ ]norm[\"']?\s*[:=]?\s*(?:nan|inf)\b",
        "a logged gradient norm is NaN/inf",
        strong=False,
    ),
    # Lightning's warning that the checkpoint to resume from is not there (it starts over).
    _sig(
        "file_missing",
        r"No checkpoint file exists at `?resume_from_checkpoint",
        "the checkpoint to resume from does not exist: the run started from scratch",
        strong=False,
        on_info=True,
    ),
)

STRONG_PRIORITY = (
    "driver_mismatch",
    "cuda_oom",
    "host_oom",
    "disk_full",
    "checkpoint_corrupt",
    "nan_loss",
    "import_or_env",
    "config_error",
    "cuda_runtime_error",
    "killed",
    "nccl_or_distributed",
    "hang_or_timeout",
    "file_missing",
    "crashed",
)
WEAK_PRIORITY = (
    "driver_mismatch",
    "cuda_oom",
    "host_oom",
    "nan_loss",
    "nccl_or_distributed",
    "killed",
    "import_or_env",
    "hang_or_timeout",
    "file_missing",
)
# The signatures that report a SIGKILL (the launchers'), and what a log prints while it reads a model
# or checkpoint into host memory: a SIGKILL then is most often the OOM killer (host_oom).
_SIGKILL_REPORTS = tuple(
    s for s in SIGNATURES if s.category == "killed" and "-9" in s.pattern.pattern
)
_LOADING_INTO_RAM = re.compile(
    r"Loading checkpoint shards|initializing model parallel with size|Loading pipeline components"
    r"|\bloading (?:the )?(?:model|checkpoint|weights|state dict)\b",
    re.IGNORECASE,
)
# What the kernel logs when its OOM killer acts (mm/oom_kill.c), looked for in the kernel log.
_KERNEL_OOM = re.compile(
    r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory"
    r"|invoked oom-killer|oom-kill:constraint=|oom_reaper: reaped process"
    r"|\bKilled process \d+ \([^)\n]*\),? total-vm:",
    re.IGNORECASE,
)

# An exception line (optionally behind torchrun's "[rank0]:" prefixes) or a fatal C-level report.
_EXCEPTION_LINE = re.compile(
    r"^(?:\[[^\]\n]*\]:?\s*)*(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|"
    r"Interrupt|Exit)|Stop(?:Async)?Iteration)(?::.*)?$"
)
_TRACEBACK = re.compile(r"^(?:\[[^\]\n]*\]:?\s*)*Traceback \(most recent call last\):")
# A native crash that says where it failed: Python's fault handler (with the stack); libstdc++'s
# uncaught C++ exception; glog's fatal CHECK; a fatal signal handler's banner; glibc's assert().
_NATIVE_WHERE = re.compile(
    r"Fatal Python error|terminate called after throwing an instance of|^\s*what\(\):"
    r"|\bCheck failed: |\*\*\* Check failure stack trace|^\*\*\* Aborted at"
    r"|\bAssertion `[^`'\n]*' failed"
)
# Every native crash: those, and the bare signals and access violations that say nothing of where.
_FATAL_C = re.compile(
    r"Segmentation fault|core dumped|^Aborted\b|Bus error|^\*\*\* SIG[A-Z]+ "
    # zsh: `zsh: segmentation fault  python x.py`, `[1]    4242 segmentation fault  python …`
    r"|^(?:zsh: |\[\d+\] +\d+ )(?:segmentation fault|bus error|abort)\b"
    # the shell's words for them in other languages (zh_CN, de, fr, ru, ja)
    r"|段错误|核心已转储|总线错误|Speicherzugriffsfehler|Erreur de segmentation"
    r"|Ошибка сегментирования|セグメンテーション違反"
    # Windows' NTSTATUS for an access violation, a stack overflow, a stack buffer overrun
    r"|exit code -?(?:1073741819|1073741571|1073740791)\b|0xC0000005|0xC00000FD|0xC0000409"
    rf"|{_NATIVE_WHERE.pattern}"
)
# What training frameworks print when a run is over (Lightning, the HF Trainer, Ultralytics,
# maskrcnn-benchmark/detectron2's hooks) and the plain words scripts use for it.
_COMPLETED = re.compile(
    r"`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached|Training completed\. Do not forget"
    r"|'train_runtime':|\bepochs? completed in [\d.]+ hours|EarlyStopping: Training stopped early"
    r"|Total training time:|\btraining (?:is )?(?:finished|completed?|done)\b|\bfinished training\b"
    r"|\bdone training\b"
    # DeepSpeed's launcher and torchrun's agent when the workers returned 0; TensorFlow's
    # tutorials' last line
    r"|\bProcess \d+ exits successfully\b|worker group successfully finished"
    r"|\bWorkerState\.SUCCEEDED\b|\bOptimization Finished!"
    r"|W&B process to finish\.{3} \(success\)|(?:\] |^\s*)Optimization Done\.\s*$"
    # the HF Trainer's summary, detectron2's last hook, TensorFlow Estimator's train() return
    r"|\*{5} train metrics \*{5}|Overall training speed: \d+ iterations in"
    r"|\bLoss for final step: |^\s*Early stopping\.?\s*$"
    r"|\bEarly stopping (?:reached|triggered)(?: at epoch \d+)?\b"
    # BERT's run_classifier and the HF example scripts, their evaluation after training ends
    r"|\*{5} Eval results \*{5}|\*{5} eval metrics \*{5}"
    # Vowpal Wabbit's summary after its last pass; LSF's job report when the job exited 0
    r"|^total feature number = \d+\s*$|^Successfully completed\.\s*$"
    # tf_cnn_benchmarks' summary after its last step
    r"|^total images/sec: [\d.]+\s*$"
    # MCMC samplers once their chains are drawn: PyMC's summary and its checks of the draws,
    # rstan's and CmdStan's of the fit they return
    r"|^Sampling \d+ chains? for [\d_,]+ tune and [\d_,]+ draw iterations .* took "
    r"|\bThere (?:were \d+ divergences|was 1 divergence) after tuning\b"
    r"|\bThe estimated number of effective samples is smaller than \d+"
    r"|\bThere were \d+ divergent transitions after warmup\b"
    r"|\btransitions ended with a divergence\b",
    re.IGNORECASE,
)
# torchrun's report that a worker failed, which says nothing of why (the rank's own log does).
_LAUNCHER = re.compile(
    r"\bChildFailedError\b|Root Cause \(first observed failure\)"
    # (its summary before torch 1.10: `Root Cause:`, each rank's `msg: "Process failed with …"`)
    r"|^\s*msg: \"Process failed with exitcode -?\d+\""
    r"|elastic\.multiprocessing\.api:\s*failed \(exitcode: -?\d+\)"
    r"|multiprocessing\.api: \[ERROR\] failed \(exitcode: -?\d+\)"
)


# Lines that inform rather than fail: NCCL's INFO chatter (it reports, e.g., an optional plugin
# that "cannot open shared object file"), Python warnings, and the INFO / WARNING levels of the
# C++ loggers and launchers (TensorFlow reports a missing optional CUDA library, or an allocation
# that "is not a failure", at W). They are never strong evidence; the error they foreshadow, if
# any, is raised again on a line of its own.
def _logger_levels(letters: str, names: str) -> str:
    """A line at one of these levels as the loggers print it (`letters` their one-letter levels,
    `names` the spelled-out ones)."""
    return (
        # absl / TensorFlow / XLA: `2024-02-25 18:52:47.991396: W tensorflow/...] ...`
        rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [{letters}] "
        # the same with its date taken off (pasted_log.as_logged)
        rf"|^[{letters}] [\w./-]{{1,200}}:\d+\] "
        # glog (torch.distributed.elastic, XLA): `W0302 19:39:39.186000 22436 file.py:27] ...`
        rf"|^(?:\[[^\]\n]*\]:?\s*)*[{letters}]\d{{4}} \d\d:\d\d:\d\d\.\d+\s+\d+ "
        # c10 logging: `[W socket.cpp:558] ...`, `[W926 21:34:49.000000000 socket.cpp:697] ...`
        rf"|^(?:\[[^\]\n]*\]:?\s*)*\[[{letters}](?:\d{{3,4}} [\d:.]+)? [^\]\s]+:\d+\]"
        # DeepSpeed and the Hugging Face trainers: `[INFO] [launch.py:315:...]`, `[WARNING|...]`
        rf"|\[(?:{names})[\]|]"
    )


_INFORMATIONAL = re.compile(
    r"\bNCCL INFO\b|\b[A-Z]\w*Warning: |" + _logger_levels("IW", "INFO|WARNING|WARN|DEBUG")
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# category -> (retryable, action, what to do)
DEFAULTS: dict[str, tuple[bool, str, str]] = {
    "cuda_oom": (
        True,
        "resume_smaller_batch",
        (
            "resume from the last checkpoint with half the micro-batch and twice the "
            "gradient accumulation (same effective batch)"
        ),
    ),
    "host_oom": (
        True,
        "resume",
        (
            "resume from the last checkpoint; if it is killed again, lower host memory use "
            "(fewer DataLoader workers, smaller prefetch or host-side batch) or ask for "
            "more host memory"
        ),
    ),
    "killed": (
        True,
        "resume",
        (
            "resume from the last checkpoint: the process was SIGKILLed by the kernel OOM killer "
            "(check dmesg) or by a person or the platform; if it is killed again at the same "
            "place, treat it as host memory (fewer DataLoader workers, more host memory)"
        ),
    ),
    "nan_loss": (
        True,
        "resume_lower_lr",
        (
            "resume from the last checkpoint written before the loss went NaN with a lower "
            "learning rate (tune_lr can pick it); checkpoints written after the divergence "
            "hold bad weights"
        ),
    ),
    "nccl_or_distributed": (
        True,
        "resume",
        (
            "resume from the last checkpoint: NCCL and network failures are often transient "
            "or an echo of one rank dying; if it repeats, check every rank's log and rerun "
            "with NCCL_DEBUG=INFO"
        ),
    ),
    "cuda_runtime_error": (
        True,
        "resume",
        (
            "run gpu_health_check (Xid, ECC) and resume on a healthy GPU; if it fails the "
            "same way at the same step, it is a bug: rerun with CUDA_LAUNCH_BLOCKING=1"
        ),
    ),
    "file_missing": (
        False,
        "stop",
        (
            "a path the run needs does not exist: fix the path, the mount or the working "
            "directory, then resubmit"
        ),
    ),
    "checkpoint_corrupt": (
        True,
        "resume_previous_checkpoint",
        ("resume from the newest checkpoint that verifies (auto_resume skips the corrupt one)"),
    ),
    "disk_full": (
        False,
        "stop",
        (
            "free disk space (or raise the quota), e.g. by deleting old checkpoints "
            "(delete_checkpoints, approved), then resume"
        ),
    ),
    "driver_mismatch": (
        False,
        "stop",
        (
            "the NVIDIA driver and the CUDA user space do not match: update the driver or "
            "use an image built for it; retrying cannot help"
        ),
    ),
    "import_or_env": (
        False,
        "stop",
        (
            "the environment is broken (missing package, library or program): fix the image "
            "or virtual environment, then resubmit"
        ),
    ),
    "config_error": (
        False,
        "stop",
        (
            "the run's command line or config is invalid (an unknown or missing argument, a "
            "value of the wrong type): fix the spec's command or config, then resubmit; "
            "retrying unchanged fails the same way"
        ),
    ),
    "lost": (
        True,
        "resume",
        (
            "resume from the last checkpoint: the process's supervisor, process group or "
            "machine went away, so its end was not seen; check the machine before resuming "
            "there"
        ),
    ),
    "preempted": (True, "resume", ("resume from the last checkpoint when resources allow")),
    "stalled": (
        True,
        "resume",
        (
            "resume from the last checkpoint; if it stalls again at the same place, suspect "
            "a deadlock (collectives, DataLoader workers)"
        ),
    ),
    "timeout": (
        False,
        "stop",
        ("the spec's timeout was reached: raise timeout_min, or resume if the remaining steps fit"),
    ),
    "hang_or_timeout": (
        True,
        "resume",
        (
            "the run hung or a time limit stopped it (the log says so): resume from the last "
            "checkpoint; if it hangs at the same place again, suspect a deadlock (DataLoader "
            "workers, collectives); if a scheduler's time limit stopped it, ask for more time"
        ),
    ),
    "crashed": (
        True,
        "resume",
        (
            "resume once from the last checkpoint; if it crashes the same way, stop and "
            "read the traceback"
        ),
    ),
    "unknown": (
        False,
        "stop",
        (
            "nothing in the log or the exit status explains the failure: read the full log "
            "(job_logs) before retrying"
        ),
    ),
    "succeeded": (False, "stop", ("nothing to recover: the run finished")),
}

_MONITOR_WHY = {
    "preempted": "the monitor reports that the attempt was preempted (stopped by nightshift or by "
    "the platform)",
    "stalled": "the monitor saw no progress for longer than the stall limit and stopped the attempt",
    "timeout": "the attempt ran past the spec's timeout and was stopped",
    "lost": "the monitor lost the attempt: its supervisor, process group or machine went away, so "
    "how it ended was not seen",
    "diverged": "the monitor's metrics check saw the training diverge",
}


@skill("diagnose_failure", capability="read")
def diagnose_failure(ctx: SkillContext, inp: DiagnoseFailureInput) -> DiagnoseFailureResult:
    """Classify why a training attempt ended — cuda_oom, host_oom, killed, nan_loss,
    nccl_or_distributed, cuda_runtime_error, file_missing, checkpoint_corrupt, disk_full,
    driver_mismatch, import_or_env, config_error, lost, preempted, stalled, timeout, crashed,
    unknown or succeeded — from its log tail (or log file), exit code, signal, what the monitor saw
    and (optionally) the kernel log. Returns the log lines that show it, the reasoning, whether a
    retry can help, and a remediation: resume, resume_smaller_batch, resume_lower_lr,
    resume_previous_checkpoint or stop, with concrete parameter changes when the attempt's params
    and the spec's knobs are given; with `machine` (what the daemon read from the machine as the
    attempt ended) the cgroup's or kernel's word on an OOM kill, a GPU's Xid, a full disk and
    non-finite metrics are evidence too, each with its source. Log text is treated as data only."""
    sig = _signal_of(inp.exit_code, inp.signal)
    facts = _machine_facts(inp, sig)
    found = _classify(ctx, inp, sig, facts)
    if inp.machine is not None:
        found.machine = facts.lines
    if ctx is not None and ctx.store is not None and inp.remember:
        found = remember(
            ctx.store,
            found,
            lambda: "\n".join(_read_log(inp, ctx.settings.runs_dir)[0]),
            params=inp.params,
            knobs=inp.knobs,
            log_path=inp.log_path,
            asker=ctx.principal,
        )
    return found


def _classify(
    ctx: SkillContext | None, inp: DiagnoseFailureInput, sig: int | None, facts: _MachineFacts
) -> DiagnoseFailureResult:
    settings = ctx.settings if ctx is not None else None  # None: offline evals, unit tests
    runs_dir = settings.runs_dir if settings is not None else None
    raw_lines, first_line_no, log_note = _read_log(inp, runs_dir)
    # What each line says as pasted_log reads it (quote marks, colour codes, timestamps, levels
    # and rank labels off; a progress bar's last redraw); evidence quotes the original line.
    lines = [pasted_log.primary(line) for line in raw_lines]
    if inp.exit_code is None and sig is None:
        reported = _reported_exit_code(lines)
        if reported is not None:  # the IDE or shell that ran it printed how it ended
            inp = inp.model_copy(update={"exit_code": reported})
            sig = _signal_of(reported, None)
    failed_exit = (inp.exit_code not in (None, 0)) or sig is not None
    hits = _enough(_match(raw_lines), lines)
    strong = {c: h for c, h in hits.items() if any(s.strong for s, _ in h)}
    weak = {c: [p for p in h if not p[0].strong] for c, h in hits.items() if c not in strong}

    def ev(pairs: Sequence[tuple[Signature | None, int]]) -> list[EvidenceLine]:
        seen: set[int] = set()
        out: list[EvidenceLine] = []
        for _, i in pairs:
            if i not in seen and len(out) < MAX_EVIDENCE:
                seen.add(i)
                out.append(EvidenceLine(line_no=first_line_no + i, text=_clean(raw_lines[i])))
        return out

    status = _describe_status(inp.exit_code, sig)
    notes = [n for n in (log_note,) if n]

    def result(
        cat: str,
        confidence: str,
        evidence: list[EvidenceLine],
        reasoning: str,
        override: Signature | None = None,
    ) -> DiagnoseFailureResult:
        # What the machine says outranks a log that only shows the echo of it (or nothing).
        said = _machine_verdict(cat, facts)
        if said is not None:
            mcat, line, why = said
            if mcat == cat:  # the machine agrees: the log's line first, the machine's beside it
                shown, mconf = [*evidence[: MAX_EVIDENCE - 1], line], "high"
                why = f"{why}; {reasoning}"
            else:
                shown, mconf = [line, *evidence][:MAX_EVIDENCE], _MACHINE_CONFIDENCE[mcat]
                why += (
                    f"; {status}"
                    if cat in ("killed", "unknown")
                    else (f"; the log alone reads as {cat}: {reasoning}")
                )
            return _result(mcat, mconf, shown, why, inp, sig, notes)
        if confidence == "low":  # nothing decides (log, machine): what the log's words point to
            exited = inp.exit_code is not None and sig is None  # it ended on its own
            learned = _learned(cat, lines, raw_lines, failed_exit, exited)
            if learned is not None:
                (cat, reading), override = learned, None
                evidence = ev([(None, i) for i in sorted(reading.lines)])
                reasoning = (
                    f"no signature decides; by its words the log reads most like {cat} "
                    f"({_LEARNED_FROM}, lead {reading.margin:.2f}); the signatures alone: "
                    f"{reasoning}"
                )
        if cat == "killed" and facts.no_oom:
            reasoning += f"; {facts.no_oom}: not the OOM killer"
        elif cat == "killed" and inp.machine is not None and inp.machine.notes:
            reasoning += "; " + "; ".join(inp.machine.notes[:3])
        # a SIGKILL (or a kill read as host memory): the kernel log may say it was the OOM killer
        if cat == "killed" or (cat == "host_oom" and confidence != "high"):
            oom = _kernel_oom(inp, notes)
            if oom:
                kev = [EvidenceLine(line_no=n, text=_clean(t), source="kernel_log") for n, t in oom]
                return _result(
                    "host_oom",
                    "high",
                    (evidence + kev)[:MAX_EVIDENCE],
                    f"the kernel log shows the OOM killer at work ({_clean(oom[-1][1])})"
                    f"; {reasoning}",
                    inp,
                    sig,
                    notes,
                )
        return _result(cat, confidence, evidence, reasoning, inp, sig, notes, override=override)

    if inp.monitor_says:
        says = inp.monitor_says
        monitor_cat = "nan_loss" if says == "diverged" else says
        why = _MONITOR_WHY[says]
        detail = (
            [EvidenceLine(line_no=0, text=_clean(inp.monitor_detail), source="monitor")]
            if inp.monitor_detail and inp.monitor_detail.strip()
            else []
        )
        if detail:
            why += f" ({detail[0].text})"
        if says == "diverged":
            pairs = strong.get("nan_loss") or weak.get("nan_loss") or []
            extra = f"; the log agrees: {_most_specific(pairs).meaning}" if pairs else ""
        else:
            also = _first_category(strong) or _first_category(weak, WEAK_PRIORITY)
            pairs = (strong.get(also) or weak.get(also) or []) if also else []
            extra = (
                f"; the log also shows {also} ({_most_specific(pairs).meaning})" if pairs else ""
            )
        return _result(
            monitor_cat,
            "high",
            (detail + ev(pairs))[:MAX_EVIDENCE],
            why + extra + f"; {status}",
            inp,
            sig,
            notes,
        )

    if inp.exit_code == 0 and sig is None:
        errorish: list[tuple[Signature | None, int]] = [
            (None, i)
            for i, line in enumerate(lines)
            if _EXCEPTION_LINE.match(line.strip()) or _TRACEBACK.match(line)
        ]
        reasoning = "the process exited with status 0"
        if strong or errorish:
            reasoning += (
                "; the log has lines that look like errors (quoted), but the run "
                "completed: check its outputs if in doubt"
            )
        shown: list[tuple[Signature | None, int]] = [
            p for h in strong.values() for p in h if not p[0].on_info
        ] + errorish
        return _result(
            "succeeded", "high", ev(sorted(shown, key=lambda p: p[1])), reasoning, inp, sig, notes
        )

    cat = _first_category(strong)
    if cat:
        # a weak signature's W-level line is no evidence here
        pairs = [p for p in strong[cat] if p[0].strong or not p[0].on_info]
        others = [c for c in STRONG_PRIORITY if c in strong and c != cat]
        reasoning = f"{_most_specific(pairs).meaning}; {status}"
        loading = _LOADING_INTO_RAM.search("\n".join(lines[: pairs[0][1]])) if pairs else None
        if cat == "killed" and loading and any(s in _SIGKILL_REPORTS for s, _ in pairs):
            # SIGKILLed while a model or its checkpoint was being read into host memory
            return result(
                "host_oom",
                "medium",
                ev(pairs),
                f"{reasoning}; it was killed while loading a model or checkpoint into host "
                f"memory ({loading.group(0)!r}): most often the kernel OOM killer",
            )
        stuck = (
            _stuck(lines)
            if cat == "killed" and not any(s in _SIGKILL_REPORTS for s, _ in pairs)
            else None
        )
        if stuck is not None:  # interrupted (Ctrl-C, the launcher's SIGINT) while it waited
            at, why = stuck
            return result(
                "hang_or_timeout",
                "medium",
                ev([*pairs, *((None, i) for i in at)]),
                f"{why}; {reasoning}",
            )
        if others:
            reasoning += f"; the log also shows {', '.join(others)}, read as consequences of {cat}"
        return result(cat, "high", ev(pairs), reasoning, override=_override(pairs))

    if "driver_mismatch" in weak and _own_error(lines):
        del weak["driver_mismatch"]  # torch's CUDA warning, then an error of the program's own
    cat = _first_category(weak, WEAK_PRIORITY)
    stuck = _stuck(lines) if cat in (None, "killed") else None
    if stuck is not None:
        at, why = stuck
        return result("hang_or_timeout", "medium", ev([(None, i) for i in at]), f"{why}; {status}")
    if cat:
        pairs = weak[cat]
        return result(cat, "medium", ev(pairs), f"{_most_specific(pairs).meaning}; {status}")

    if sig == signal_module.SIGKILL:
        return result(
            "killed",
            "medium",
            [],
            f"{status}, and the log shows no other cause: the "
            "kernel OOM killer (no OOM-killer line was seen; check dmesg or the "
            "container's memory events) or a kill -9 by a person or the platform",
        )
    # (exit code -1 alone is too common a generic failure code to be read as SIGHUP)
    if sig in (signal_module.SIGHUP, signal_module.SIGINT) and inp.exit_code != -sig:
        return result(
            "killed",
            "medium",
            [],
            f"{status}: the terminal or session that started it went away (SIGHUP: run it under "
            "nohup, tmux or the batch system), or a person interrupted it (SIGINT)",
        )
    if sig == signal_module.SIGTERM:
        return result(
            "preempted",
            "medium",
            [],
            f"{status}: something asked the process to "
            "stop (the platform, the batch system, or a person), and the log shows no "
            "error",
        )
    if inp.exit_code in (126, 127) and sig is None:
        return result(
            "import_or_env",
            "medium",
            [],
            f"{status}: the shell's code for a command that was not found or not executable",
        )

    exc_lines = [
        i
        for i, line in enumerate(lines)
        if _EXCEPTION_LINE.match(line.strip()) and not _LAUNCHER.search(line)
    ]
    tb_lines = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    fatal = [i for i, line in enumerate(lines) if _FATAL_C.search(line)]
    launcher = [i for i, line in enumerate(lines) if _LAUNCHER.search(line)]
    config_read = _config_read_error(lines, exc_lines)
    if config_read is not None:
        at, what = config_read
        return result(
            "config_error",
            "medium" if failed_exit else "low",
            ev([(None, i) for i in sorted(at)]),
            f"{what} ({_clean(lines[at[-1]])}); {status}",
        )
    if failed_exit and (exc_lines or fatal):
        picked = (exc_lines[-2:] if exc_lines else []) + fatal[-1:]
        last = _clean(lines[picked[-1]])
        return result(
            "crashed",
            "medium",
            ev([(None, i) for i in sorted(picked)]),
            f"{status}, after an error that matches no known signature: {last}",
        )
    if failed_exit and launcher:
        return result(
            "nccl_or_distributed",
            "low",
            ev([(None, i) for i in launcher[-2:]]),
            f"{status}: the distributed launcher reports that a worker failed, without "
            "its error (read each rank's own log)",
        )
    if failed_exit and tb_lines:
        return result(
            "crashed",
            "medium",
            ev([(None, tb_lines[-1])]),
            f"{status}, after an error that matches no known signature: a traceback",
        )
    if sig in (signal_module.SIGSEGV, signal_module.SIGABRT, signal_module.SIGBUS):
        return result(
            "crashed",
            "medium",
            [],
            f"{status}: a native crash (a bug in an extension, or a broken installation)",
        )

    # A pasted traceback often starts at a frame (its header cut off with the lines above it).
    tb_lines = tb_lines or [i for i, line in enumerate(lines) if _FRAME.match(line)][:1]
    unstated = inp.exit_code is None and sig is None  # no exit status: the log must say it
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if unstated and tb_lines and exc_lines:
        # No exit status, but the log ends in an uncaught exception: that says it crashed.
        tail = nonblank[-TAIL_LINES:]
        if tail and exc_lines[-1] >= tail[0] and exc_lines[-1] > tb_lines[0]:
            return result(
                "crashed",
                "low",
                ev([(None, i) for i in exc_lines[-2:]]),
                "no exit status was given, but the log ends in an uncaught exception "
                f"that matches no known signature: {_clean(lines[exc_lines[-1]])}",
            )
    if (
        unstated
        and exc_lines
        and exc_lines[-1] in nonblank[-_BARE_ERROR_END:]
        and not lines[exc_lines[-1]].strip().startswith("KeyboardInterrupt")
    ):
        # No exit status and no traceback pasted, but the log ends in an error of the program's
        return result(
            "crashed",
            "low",
            ev([(None, exc_lines[-1])]),
            "no exit status was given, but the log ends in an error that matches no known "
            f"signature: {_clean(lines[exc_lines[-1]])}",
        )
    if unstated and fatal:
        # No exit status, but the shell or the interpreter reported a native crash: a crash where
        # the log says where (a C++ exception's what(), a failed CHECK, Python's fault handler
        # with its stack); else only a signal or an access violation, which says nothing of why
        # (the corpus's threads mostly never found out: 10 of 16 such tuning logs are unknown).
        where = [i for i in fatal if _NATIVE_WHERE.search(lines[i])]
        if where:
            return result(
                "crashed",
                "low",
                ev([(None, i) for i in where[-2:]]),
                "no exit status was given, but the log reports a native crash (a bug in an "
                f"extension, or a broken installation): {_clean(lines[where[-1]])}",
            )
        return result(
            "unknown",
            "low",
            ev([(None, fatal[-1])]),
            "no exit status was given; the log reports a native crash and nothing of where or "
            f"why ({_clean(lines[fatal[-1]])}): run it again under faulthandler "
            "(python -X faulthandler) or gdb to see the failing library",
        )
    done = [i for i, line in enumerate(lines) if _COMPLETED.search(line)]
    if unstated and done and not [i for i in exc_lines if i > done[-1]]:
        return result(
            "succeeded",
            "low",
            ev([(None, done[-1])]),
            "no exit status was given, and the training framework reported the run complete "
            f"with no error after it: {_clean(lines[done[-1]])}",
        )
    quiet = _only_warnings(raw_lines, lines) if unstated else []
    if quiet and not exc_lines:
        return result(
            "succeeded",
            "low",
            ev([(None, i) for i in quiet[:2]]),
            "no exit status was given, and the log holds only warnings (no error, no traceback, "
            "no sign the run stopped): a warning is not a failure",
        )
    # No exit status and no error: what the log's written lines say of how it ended
    no_error = unstated and not (exc_lines or tb_lines or fatal or launcher)
    written = [i for i in nonblank if not _FENCE.match(lines[i])] if no_error else []
    if written and not any(
        _PROCESS_ENDED.search(lines[i])
        or _ERROR_LEVEL.search(_as_logged(raw_lines[i]))
        or _ERROR_LEVEL.match(lines[i])  # behind a rank label or another prefix
        for i in written
    ):
        finished = _last_epoch_done(lines, written)
        results = None if finished is not None else _final_results(lines, written)
        end = finished if finished is not None else results
        if end is not None:
            said = (
                f"its last epoch complete ({_clean(lines[end])}) and no error after it"
                if finished is not None
                else f"the run's test or final results ({_clean(lines[end])}): the program "
                "reached its end"
            )
            return result(
                "succeeded",
                "low",
                ev([(None, end)]),
                f"no exit status was given, and the log ends with {said}",
            )
        return result(
            "hang_or_timeout",
            "low",
            ev([(None, written[-1])]),
            "no exit status was given, and the log just stops, with no error and nothing "
            "that says the process ended: in reports like this most often a run that stopped "
            "making progress (a hang), else one that died silently. If it is still running, "
            "dump its stacks (py-spy dump --pid PID); if it is gone, look for the OOM killer "
            "(dmesg)",
        )
    if failed_exit:
        reasoning = f"{status}, and nothing in the log explains it"
    elif unstated and launcher and not exc_lines:
        reasoning = (
            "no exit status was given; the distributed launcher reports that a worker failed, "
            "without its error (read each rank's own log)"
        )
    elif unstated:
        reasoning = "no exit status was given and the log shows no recognised failure" + (
            "; it has an error line that matches no signature" if exc_lines else ""
        )
    else:
        reasoning = status
    lines_shown = exc_lines[-2:] or (launcher[-2:] if unstated else [])
    return result("unknown", "low", ev([(None, i) for i in lines_shown]), reasoning)


# How PyCharm and other IDEs' run consoles end a run: `Process finished with exit code 137
# (interrupted by signal 9: SIGKILL)`. (Windows' NTSTATUS codes, far outside a byte, are read as
# native crashes instead: _FATAL_C.)
_REPORTED_EXIT = re.compile(r"^Process finished with exit code (-?\d{1,3})\b")


def _reported_exit_code(lines: list[str]) -> int | None:
    """The exit code the log's own last lines report, if they do."""
    for line in [line for line in lines if line.strip()][-3:]:
        m = _REPORTED_EXIT.match(line.strip())
        if m and -255 <= int(m.group(1)) <= 255:
            return int(m.group(1))
    return None


def _learned(
    cat: str, lines: list[str], raw_lines: list[str], failed_exit: bool, exited: bool = False
) -> tuple[str, log_classifier.Reading] | None:
    """The log model's category where it differs from a low-confidence verdict and leads clearly,
    read from enough words (LEARNED_MIN_WORDS); never `succeeded` for a run that exited failing or
    whose log ends in an error, never `hang_or_timeout` for one that exited on its own (with a
    status, no signal: a hung process is stopped from outside), never over a run the framework
    reported complete, never `unknown` over a guess."""
    model = LOG_MODEL_LOADER()
    reading = log_classifier.read(model_lines(raw_lines, lines), model) if model else None
    if reading is None or reading.category in (cat, "unknown") or reading.words < LEARNED_MIN_WORDS:
        return None
    if reading.margin < LEARNED_MIN_MARGIN:
        return None
    if reading.category == "succeeded" and (failed_exit or _ends_in_error(lines)):
        return None
    if reading.category == "hang_or_timeout" and exited:
        return None
    if cat == "succeeded" and any(_COMPLETED.search(line) for line in lines):
        return None  # the framework's own word that the run completed, no error after it
    return reading.category, reading


def _ends_in_error(lines: list[str]) -> bool:
    """Whether an exception line is among the log's last lines (a run that ended in an error did
    not succeed, whatever else its words say)."""
    tail = [line for line in lines if line.strip()][-TAIL_LINES:]
    return any(_EXCEPTION_LINE.match(line.strip()) for line in tail)


def model_lines(raw_lines: Sequence[str], lines: Sequence[str]) -> list[str]:
    """The lines the log model reads (as it was fitted, evals/diagnosis_model.py): each as
    pasted_log reads it, an informational line (Python warnings, NCCL INFO, the I / W levels of
    TF's, glog's and c10's loggers) blank: a log of start-up warnings is not a failure's words."""
    return [
        "" if _INFORMATIONAL.search(_cap(_as_logged(raw))) or _INFORMATIONAL.search(text) else text
        for raw, text in zip(raw_lines, lines, strict=True)
    ]


_LEARNED_FROM = "a linear model over words, learned from public training logs"

# A warning as Python, absl / TensorFlow, glog, c10 and the trainers' loggers print one (not their
# INFO lines: a log of INFO lines that just ends is a run that stopped or hangs, not one that
# finished).
_WARNING_LINE = re.compile(
    r"\b[A-Z]\w*Warning: |^WARNING:|"
    + _logger_levels("W", "WARNING|WARN")
    # glog's W level without its date, as old TensorFlow printed it (`W tensorflow/…/x.cc:302] …`)
    + r"|(?:^|:\s)W [\w.-]+(?:/[\w.-]+)*\.(?:cc|cpp|h|py):\d+\]"
)
# What follows a Python warning's line: the source line it quotes, `warnings.warn(`, torch's
# "(Triggered internally at …)", and the wrapped rest of its message.
_WARNING_TAIL = re.compile(r"^\s+\S|^\s*warnings\.warn\(|^\s*\(Triggered internally at ")
# Words that say a run stopped, whatever the level of the line they are on.
# (Not "error" or "failure": warnings say those of what might happen — "Failure to do this will
# result in …" — and an error line of the log's own is found as one.)
_STOPPED_WORDS = re.compile(
    r"\b(?:died|dead|restart(?:ed|ing)|killed|crashed|aborted|terminated|core dumped)\b",
    re.IGNORECASE,
)
# What is printed once a process has ended: a shell's prompt back (`root@host:/dir# `, `(env)
# user@host:~$ `, `PS C:\dir> `), a notebook's empty cell prompt, a kernel that died or restarted.
_PROCESS_ENDED = re.compile(
    r"^(?:\([\w.-]+\) )?[\w.-]+@[\w.-]+(?::| )[^\n]*[#$%]\s*$|^PS [A-Za-z]:\\[^\n]*>\s*$"
    r"|^In \[ ?\]:|kernel (?:appears to have )?died|\bkernel [\w-]+ restarted\b|Restarting kernel"
    r"|\bsession crashed\b"
    # a process that is gone, as torch's CUDA IPC and psutil (wandb's sampler) notice it
    r"|Producer process has been terminated before all shared CUDA tensors released"
    r"|\bNoSuchProcess\b[^\n]*\bprocess no longer exists",
    re.IGNORECASE,
)


def _last_epoch_done(lines: Sequence[str], written: Sequence[int]) -> int | None:
    """The line of the log's last epoch counter when it reads N of N and every step counter after
    it is full too (Keras' `Epoch 3/3` then `1500/1500 [====…]`): the loop ran to its end."""
    epochs = [i for i in written if _EPOCH_OF.search(lines[i])]
    if not epochs:
        return None
    m = _EPOCH_OF.search(lines[epochs[-1]])
    assert m is not None
    if int(m.group(1)) != int(m.group(2)) or int(m.group(2)) == 0:
        return None
    steps = [
        (int(a), int(b))
        for i in written
        if i >= epochs[-1]
        for a, b in _STEP_OF.findall(_EPOCH_OF.sub("", lines[i]))
    ]
    if steps and steps[-1][0] != steps[-1][1]:
        return None
    return epochs[-1]


# A test or final result as programs print it at their end (`Test set results: loss 0.903, acc
# 0.765`, `testing accuracy = 0.7773`, `Final test mAP: 41.2`, a last `Done.`, `Total time:
# 3:02:11`), not a validation line an epoch prints on the way (a log that stops after one may
# stop in the next epoch).
_RESULT_METRIC = (
    r"acc(?:uracy)?|loss|f1|m?iou|m?ap|auc|bleu|rouge\w*|score|err(?:or)?|precision|recall"
    r"|psnr|ssim|perplexity|ppl"
)
_FINAL_RESULT = re.compile(
    rf"\b(?:test(?:ing)?|final|overall)\b[^\n]{{0,40}}?\b(?:{_RESULT_METRIC})\b[^\n]{{0,20}}?"
    r"[=:]?\s*-?\d"
    # a program's last word on its own line, and the total time it reports at its end
    r"|^\W{0,3}(?:all )?(?:done|finished|completed?)\W{0,3}$|\btotal (?:training |run |elapsed )?"
    r"time\b[^\n]{0,20}?[=:]?\s*\d"
    # a test or eval metric by its logged name (`eval_accuracy = 0.05`, `Accuracy/Test: 49.6`);
    # a workflow manager's last word (Nextflow's `Execution complete -- Goodbye`)
    rf"|\b(?:eval|test)_(?:{_RESULT_METRIC})\b\s*[=:]\s*-?\d"
    rf"|\b(?:{_RESULT_METRIC})[/_](?:test|eval)\b\s*[=:]?\s*-?\d"
    r"|\bexecution complete\b[^\n]{0,10}\bgoodbye\b",
    re.IGNORECASE,
)
_RESULT_LINES = 3  # the result is among the log's last this many written lines


def _final_results(lines: Sequence[str], written: Sequence[int]) -> int | None:
    """The line of a test or final result among the log's last _RESULT_LINES written lines (at
    most two lines after it, none an error: the caller has found none), the latest first: the
    program ran through its training to its evaluation."""
    for i in reversed(written[-_RESULT_LINES:]):
        if _FINAL_RESULT.search(lines[i]):
            return i
    return None


def _only_warnings(raw_lines: Sequence[str], lines: Sequence[str]) -> list[int]:
    """The warning lines of a log that holds nothing else (each line a warning of a library's
    logger or Python's (_WARNING_LINE), or the quoted source and wrapped text that follows one), none of them
    saying that something stopped: [] for any other log."""
    warned: list[int] = []
    after = 0
    for i, (raw, text) in enumerate(zip(raw_lines, lines, strict=True)):
        if not text.strip():
            continue
        if _STOPPED_WORDS.search(text):
            return []
        if _WARNING_LINE.search(_cap(_as_logged(raw))) or _WARNING_LINE.search(text):
            warned.append(i)
            after = 0
        elif _FENCE.match(text):
            continue
        elif warned and (
            _WARNING_TAIL.match(text) or (after < _WARNING_WRAP and not _LOG_RECORD.search(text))
        ):
            after += 1  # its quoted source, or the wrapped rest of a warning's message
        else:
            return []
    return warned


# A line a logger wrote at its error level (an error with no traceback: the run did not just stop)
_ERROR_LEVEL = re.compile(
    r"\[ERROR\]|\]\[ERROR\]|\bERROR(?::| -| \|)|^E\d{4} |^Error\b|\] ERROR\b|\bFATAL\b"
)
# A line that is a record of its own (a timestamp, an INFO level, a training loop's counters),
# never the wrapped rest of a warning's message
_LOG_RECORD = re.compile(
    r"^\[?\d{4}[-/]\d\d[-/]\d\d|\bINFO\b|^\[?I\d{4} |\b(?:epoch|step|iter(?:ation)?|loss)\b",
    re.IGNORECASE,
)
# A training loop's epoch counter (`Epoch 3/3`, `epoch [10/10]`, `Epoch 5 of 5`) and a step
# counter (`1500/1500`)
_EPOCH_OF = re.compile(r"\bepoch\s*[:\[(]?\s*(\d+)\s*(?:/|of)\s*(\d+)\b", re.IGNORECASE)
_STEP_OF = re.compile(r"(?<![\d./])(\d+)/(\d+)(?![\d./])")
_FENCE = re.compile(r"^\s*(?:`{3}\w*|~{3})\s*$")  # a markdown code fence around the pasted log
_WARNING_WRAP = 3  # unindented lines after a warning read as the rest of its message


_GPU_WORDS = re.compile(r"cuda|gpu|nvidia|driver|nccl|cudnn|device", re.IGNORECASE)


def _own_error(lines: list[str]) -> bool:
    """Whether the log has an exception line that is not about the GPU (the program's own)."""
    return any(
        _EXCEPTION_LINE.match(line.strip())
        and not _GPU_WORDS.search(line)
        and not line.strip().startswith("KeyboardInterrupt")
        for line in lines
    )


# The names code gives its settings
_CONFIG_NAME = (
    r"(?:cfg|conf|config|configs|opts?|args|h?params|hparams|hyper_?params|hyp|hps|settings)"
)
# A config object read by key (`cfg["training"]["n_workers"]`, `self.params.pop(key)`,
# `conf.load(path)["Experiment"]`, `hparams.get(...)`, a registry's `_HPARAMS[name]`) on the line a
# KeyError was raised from
_CONFIG_READ = re.compile(
    # its name may say what it configures: `data_config['n_samples']`, `model_cfg["depth"]`
    rf"\b(?:[a-z]\w*_)?_*{_CONFIG_NAME}"
    r"\w*\s*(?:\[|\.(?:get|pop)\()|\b(?:conf|config|cfg)\w*\.load\([^\n]*\)\s*\[",
    re.IGNORECASE,
)
_KEY_ERROR = re.compile(r"^(?:\[[^\]\n]*\]:?\s*)*KeyError: ['\"][^'\"]+['\"]\s*$")
# An assert on the run's own settings (`assert args.batch_size % len(devices) == 0`,
# `assert len(opt.select_data) == len(opt.batch_ratio)`): the settings do not fit each other
_CONFIG_ASSERT = re.compile(rf"^\s*assert\b[^\n]*\b{_CONFIG_NAME}\.\w", re.IGNORECASE)
_ASSERTION_ERROR = re.compile(r"^(?:\[[^\]\n]*\]:?\s*)*AssertionError\b")
# A config object asked for a field it does not have (mmcv's ConfigDict, argparse's Namespace,
# OmegaConf's DictConfig, yacs' CfgNode, EasyDict)
_CONFIG_ATTRIBUTE = re.compile(
    r"^(?:\[[^\]\n]*\]:?\s*)*AttributeError: '(?:ConfigDict|Namespace|DictConfig|EasyDict|"
    r"AttrDict|CfgNode|edict)' object has no attribute '"
)


def _config_read_error(lines: list[str], exc_lines: list[int]) -> tuple[list[int], str] | None:
    """The lines of an error raised where the code reads its config (the line to quote last), and
    what it says: a KeyError where the code reads a config by key, or an assert on the settings
    (the code line the traceback quotes above it), or a config object without the field asked
    of it."""
    if not exc_lines:
        return None
    at = exc_lines[-1]
    last = lines[at].strip()
    if _CONFIG_ATTRIBUTE.match(last):
        return [at], "the config has no field the code reads"
    key = _KEY_ERROR.match(last)
    if not key and not _ASSERTION_ERROR.match(last):
        return None
    code = next((i for i in range(at - 1, max(at - 3, -1), -1) if lines[i].strip()), None)
    if code is None or _FRAME.match(lines[code]):
        return None
    if key and _CONFIG_READ.search(lines[code]):
        return [code, at], "the config lacks a key the code reads"
    if not key and _CONFIG_ASSERT.search(lines[code]):
        return [at, code], "the settings fail the code's own check of them"
    return None


# Where a stuck process waits: the innermost frame of a traceback printed when it was
# interrupted (Ctrl-C, a dump), in a queue's get, a lock, a poll, a join or a sleep.
_WAITING_FRAME = re.compile(
    r'^\s*File "[^"]*", line \d+, in (?:get|_poll|poll|wait|_wait|acquire|join|select|recv'
    r"|recv_into|_recv|_recv_bytes|recv_bytes|sleep|_wait_for_tstate_lock|readinto|read"
    # PyTorch's DataLoader waiting for its workers' next batch
    r"|_get_data|_try_get_data|_get_batch|_try_get_batch)\s*$"
)
_WAITING_CODE = re.compile(
    r"\.(?:wait|acquire|poll|_poll|select|recv|sleep)\(|^\s*with self\._[rw]?lock\b"
    # a thread's or process's join and a queue's get, not os.path.join, str.join or dict.get
    r"|(?<!path)(?<![\"'])\.join\((?!\s*\[)"
    r"|\.get\((?:\s*\)|\s*(?:timeout|block)\b|\s*(?:True|False|\d))"
)
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+, in \S+')


def _stuck(lines: list[str]) -> tuple[list[int], str] | None:
    """Evidence that the run stopped making progress rather than failing: a traceback whose
    innermost frame waits (the person who interrupted it saw it stuck). (A pasted log that merely
    ends mid-progress is not: on the tuning split that was as often a silent death, a run still
    going, or a NaN run, as a hang.)"""
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if frames:
        last = frames[-1]
        after = [line.strip() for line in lines[last + 2 :] if line.strip()]
        code = lines[last + 1] if last + 1 < len(lines) else ""
        ends_quiet = all(
            not _EXCEPTION_LINE.match(a) or a.startswith("KeyboardInterrupt") for a in after
        )
        if ends_quiet and (_WAITING_FRAME.match(lines[last]) or _WAITING_CODE.search(code)):
            return [last], (
                "the process was stopped while it waited (its innermost frame is a wait on a "
                "queue, lock or poll, and no error followed): it was stuck — a hang, often a "
                "DataLoader worker or a collective that never answered"
            )
    return None


# --- the machine's evidence ---------------------------------------------------------------------
GIB = 1 << 30
DISK_FULL_FRACTION = 0.01  # less free than this share of a filesystem is a full disk …
DISK_FULL_BYTES = GIB  # … and so is less than this, on a filesystem where it is under a tenth
# The base verdicts that the machine's word replaces, by what the machine says (the others —
# an import error, a bad config, a GPU OOM — are causes of their own the log shows).
_MACHINE_REPLACES: dict[str, frozenset[str]] = {
    "host_oom": frozenset(
        {"killed", "unknown", "crashed", "host_oom", "nccl_or_distributed", "hang_or_timeout"}
    ),
    "cuda_runtime_error": frozenset(
        {
            "killed",
            "unknown",
            "crashed",
            "nccl_or_distributed",
            "hang_or_timeout",
            "cuda_runtime_error",
        }
    ),
    "disk_full": frozenset(
        {"unknown", "crashed", "checkpoint_corrupt", "file_missing", "disk_full"}
    ),
    "nan_loss": frozenset({"unknown", "crashed", "hang_or_timeout", "nan_loss"}),
}
_MACHINE_CONFIDENCE = {
    "host_oom": "high",  # the kernel counted the kill
    "cuda_runtime_error": "high",  # the driver logged the fault on the attempt's GPU
    "disk_full": "medium",  # the disk is full now; the log does not say a write failed
    "nan_loss": "high",  # the recorded metrics hold the value
}
# The OOM killer's lines that name the killed process: mm/oom_kill.c's "Out of memory: Killed
# process <pid> (<comm>)" (and "Memory cgroup out of memory: …"), its "oom-kill:…,task=<comm>,
# pid=<pid>,…" summary, and the reaper's line.
_OOM_PID = re.compile(
    r"(?:Kill(?:ed)? process|oom_reaper: reaped process) (?P<a>\d+)\b|\boom-kill:.*?\bpid=(?P<b>\d+)"
)


@dataclass
class _MachineFacts:
    """The machine's evidence lines (with sources, for the result), what each category it
    points to has as its line and reason, and a note when it says there was no OOM kill."""

    lines: list[EvidenceLine]
    points: dict[str, tuple[EvidenceLine, str]]
    no_oom: str | None = None


def _machine_facts(inp: DiagnoseFailureInput, sig: int | None) -> _MachineFacts:
    facts = _MachineFacts([], {})
    m = inp.machine
    if m is None:
        return facts
    if inp.exit_code is not None or sig is not None:
        status = _describe_status(inp.exit_code, sig)
        facts.lines.append(EvidenceLine(line_no=0, text=status, source="exit_status"))

    def point(cat: str, line: EvidenceLine, why: str) -> None:
        facts.points.setdefault(cat, (line, why))

    cg = m.cgroup
    if cg is not None:
        text = f"memory cgroup (v{cg.version}): oom_kill {cg.oom_kills}"
        if cg.peak_bytes is not None:
            text += f", peak {_size(cg.peak_bytes)}"
        if cg.limit_bytes is not None:
            text += f" of its limit {_size(cg.limit_bytes)}"
        if cg.failcnt is not None:
            text += f", limit hit {cg.failcnt} times"
        line = EvidenceLine(line_no=0, text=text, source="cgroup")
        facts.lines.append(line)
        if cg.oom_kills > 0:
            point(
                "host_oom",
                line,
                f"the run's memory cgroup counted {cg.oom_kills} OOM kill(s): its memory limit "
                "was hit and the kernel killed the run",
            )
        else:
            facts.no_oom = "the run's memory cgroup counted no OOM kill"
    pids = set(m.pids)
    kernel = m.kernel_log or []
    # the OOM killer's own "Killed process <pid>" line says it best: it is looked at first
    for k in sorted(kernel, key=lambda k: "Killed process" not in k.text):
        text = k.text[:MAX_MATCH_CHARS]
        hit = _OOM_PID.search(text) if _KERNEL_OOM.search(text) else None
        pid = int(hit["a"] or hit["b"]) if hit else None
        if pid is not None and pid in pids:
            line = EvidenceLine(line_no=k.line_no, text=_clean(k.text), source="kernel_log")
            facts.lines.append(line)
            point(
                "host_oom",
                line,
                f"the kernel log shows the OOM killer killing the run's process {pid}",
            )
    if m.kernel_log is not None and pids and "host_oom" not in facts.points and not facts.no_oom:
        facts.no_oom = "the kernel log since the attempt started names none of its processes"
    buses = {normalize_bus_id(b) for b in m.gpu_bus_ids}
    if buses and kernel:
        events = [
            e
            for e in xid_module.find_xid_events("\n".join(k.text for k in kernel))
            if e.bus_id in buses
        ]
        by_line = {k.text.strip(): k.line_no for k in kernel}
        for f in xid_module.findings(events):
            line = EvidenceLine(
                line_no=by_line.get(f.last_line, 0), text=_clean(f.last_line), source="gpu_xid"
            )
            facts.lines.append(line)
            if f.severity == "CRITICAL":
                point(
                    "cuda_runtime_error",
                    line,
                    f"the NVIDIA driver logged Xid {f.xid} on the attempt's GPU {f.bus_id} "
                    f"({f.meaning}; {f.advice})",
                )
    for d in m.disks:
        full = d.total_bytes > 0 and (
            d.free_bytes < d.total_bytes * DISK_FULL_FRACTION
            or (d.free_bytes < DISK_FULL_BYTES and d.free_bytes < d.total_bytes * 0.1)
        )
        if not full:
            continue
        share = 100 * d.free_bytes / d.total_bytes
        line = EvidenceLine(
            line_no=0,
            text=f"{d.role} {d.path}: {_size(d.free_bytes)} free of {_size(d.total_bytes)} "
            f"({share:.2g} %) at exit",
            source="disk",
        )
        facts.lines.append(line)
        point("disk_full", line, f"the filesystem of the run's {d.role} was nearly full at exit")
    if m.metrics:
        first = m.metrics[0]
        line = EvidenceLine(
            line_no=0,
            text=f"{first.name} = {first.value} at step {first.step}"
            + (f" (and {len(m.metrics) - 1} more)" if len(m.metrics) > 1 else ""),
            source="metrics",
        )
        facts.lines.append(line)
        point("nan_loss", line, f"the recorded metrics went non-finite ({line.text})")
    facts.lines = facts.lines[: 2 * MAX_EVIDENCE]
    return facts


def _machine_verdict(cat: str, facts: _MachineFacts) -> tuple[str, EvidenceLine, str] | None:
    """The category the machine's evidence gives a verdict of `cat`, with its line and why;
    None when it says nothing that outranks the log."""
    for mcat in ("host_oom", "cuda_runtime_error", "disk_full", "nan_loss"):
        if mcat in facts.points and cat in _MACHINE_REPLACES[mcat]:
            line, why = facts.points[mcat]
            return mcat, line, why
    return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


# --- helpers ------------------------------------------------------------------------------------
def _read_log(
    inp: DiagnoseFailureInput, runs_dir: Path | None
) -> tuple[list[str], int, str | None]:
    """The lines to examine, the line number of the first one, and a note on what was read."""
    if inp.log_path is not None:
        path = Path(inp.log_path).expanduser()
        try:  # a caller of the daemon's socket: the log as they may read it, or nothing
            tail = read_as_reader(path, MAX_LOG_BYTES, tail=True)
        except OSError as exc:
            return [], 1, f"the log file {path} could not be read ({exc})"
        if tail is not None:
            return pasted_log.split_lines(tail.decode("utf-8", errors="replace")), 1, None
        try:
            with _open_log(path, runs_dir) as f:
                size = os.fstat(f.fileno()).st_size
                start = max(0, size - MAX_LOG_BYTES)
                counted = start <= MAX_COUNT_BYTES
                skipped_newlines = 0
                if counted:  # count the lines before the tail, for the file's own line numbers
                    while f.tell() < start:
                        chunk = f.read(min(1 << 20, start - f.tell()))
                        if not chunk:
                            break
                        skipped_newlines += chunk.count(b"\n")
                f.seek(start)
                data = f.read()
        except OSError as exc:
            return [], 1, f"the log file {path} could not be read ({exc.strerror or exc})"
        except job_files.JobFileRefused as exc:
            return [], 1, f"the log file was not read: {exc}"
        lines = pasted_log.split_lines(data.decode("utf-8", errors="replace"))
        if start == 0:
            return lines, 1, None
        note = f"read the last {MAX_LOG_BYTES} bytes of {path}"
        if not counted:
            note += "; line numbers count from the start of that tail"
        # The tail's first line is partial: drop it.
        return lines[1:], (skipped_newlines + 2) if counted else 1, note
    text = inp.log_tail or ""
    if len(text) > MAX_LOG_BYTES:
        text = text[-MAX_LOG_BYTES:]
    return pasted_log.split_lines(text), 1, None


def _open_log(path: Path, runs_dir: Path | None) -> BinaryIO:
    """A run's log in its job's folder (runs/job-N/...) is opened without following a link: the
    folder is the submitter's and the daemon reading it may be root, so a log the job replaced
    with a link to another file is refused (JobFileRefused), not read into the evidence. Any
    other log file is opened as before."""
    rel = None if runs_dir is None else job_files.relative_in(runs_dir, path)
    if runs_dir is not None and rel is not None and len(rel.parts) > 1:
        return job_files.open_file(runs_dir / rel.parts[0], path)
    return open(path, "rb")


def _signal_of(exit_code: int | None, sig: int | None) -> int | None:
    if sig:
        return sig
    if exit_code is not None and exit_code < 0:
        return -exit_code
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        return exit_code - 128
    return None


def _signal_name(sig: int) -> str:
    try:
        return signal_module.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _describe_status(exit_code: int | None, sig: int | None) -> str:
    if sig is not None:
        code = f" (exit code {exit_code})" if exit_code is not None else ""
        return f"the process was ended by {_signal_name(sig)}{code}"
    if exit_code is None:
        return "no exit status was given"
    return f"the process exited with status {exit_code}"


def _match(lines: list[str]) -> dict[str, list[tuple[Signature, int]]]:
    """Per category, the (signature, line index) pairs found: each line is claimed by the first
    signature in table order that matches one of its readings (pasted_log.views: its main reading
    first, then the others; informational readings only by on_info signatures). Only the
    signatures whose literal keys occur in a reading are tried on it; `_match_naive` is the
    reference this must equal (on ASCII text: Unicode case folding aside)."""
    views = pasted_log.views(lines)
    capped = [_cap(v.text) for v in views]
    lowered = "\n".join(text.lower() for text in capped)
    starts, pos = [], 0
    for text in capped:  # lower() keeps the length of ASCII; recount from the lowered texts
        starts.append(pos)
        pos += len(text.lower()) + 1
    candidates: dict[int, set[int]] = {}
    for key, sig_indices in _KEYS:
        at = lowered.find(key)
        while at != -1:
            vi = bisect.bisect_right(starts, at) - 1
            candidates.setdefault(vi, set()).update(sig_indices)
            at = lowered.find(key, starts[vi + 1]) if vi + 1 < len(starts) else -1
    for j in _UNKEYED:
        for vi in range(len(capped)):
            candidates.setdefault(vi, set()).add(j)
    hits: dict[str, list[tuple[Signature, int]]] = {}
    claimed: set[int] = set()
    for vi in sorted(candidates):  # views are in line order, each line's main reading first
        view = views[vi]
        if view.index in claimed:
            continue
        info = _informational(view, capped[vi])
        for j in sorted(candidates[vi]):
            s = SIGNATURES[j]
            if info and not s.on_info:
                continue
            if s.pattern.search(capped[vi]):
                hits.setdefault(s.category, []).append((s, view.index))
                claimed.add(view.index)
                break
    # Within a category, strong evidence first, then by line.
    return {c: sorted(h, key=lambda p: (not p[0].strong, p[1])) for c, h in hits.items()}


def _match_naive(lines: list[str]) -> dict[str, list[tuple[Signature, int]]]:
    """Every signature on every reading of every line, in table order: what `_match` computes,
    slowly."""
    hits: dict[str, list[tuple[Signature, int]]] = {}
    claimed: set[int] = set()
    for view in pasted_log.views(lines):
        if view.index in claimed:
            continue
        text = _cap(view.text)
        info = _informational(view, text)
        for s in SIGNATURES:
            if info and not s.on_info:
                continue
            if s.pattern.search(text):
                hits.setdefault(s.category, []).append((s, view.index))
                claimed.add(view.index)
                break
    return {c: sorted(h, key=lambda p: (not p[0].strong, p[1])) for c, h in hits.items()}


def _informational(view: pasted_log.View, text: str) -> bool:
    """Whether a reading is an informational line: judged on it with its prefixes (levels, glog
    headers) still on but the times before them off, and on what it says once they are off."""
    return bool(
        _INFORMATIONAL.search(_cap(pasted_log.as_logged(view.surface)))
        or _INFORMATIONAL.search(text)
    )


def _as_logged(raw: str) -> str:
    """A raw line as its logger wrote it (pasted_log.as_logged of its surface): where its level
    and header say whether it is informational, a warning or an error."""
    return pasted_log.as_logged(pasted_log.surface(raw))


def _cap(line: str) -> str:
    """A line longer than MAX_MATCH_CHARS is matched on its head and tail (bounded work)."""
    if len(line) <= MAX_MATCH_CHARS:
        return line
    half = MAX_MATCH_CHARS // 2
    return line[:half] + " … " + line[-half:]


def _literal_keys(pattern: re.Pattern[str]) -> set[str] | None:
    """Lower-case literal strings of which every match of `pattern` contains at least one (the
    longest mandatory literal run of each top-level alternative), or None if none is found."""

    def needed(seq: Any) -> set[str] | None:
        run: list[str] = []
        best, groups = "", []
        for op, av in list(seq) + [(None, None)]:
            if op is _sre_constants.LITERAL:
                run.append(chr(av))
                continue
            if len(run) > len(best):
                best = "".join(run)
            run = []
            if op is _sre_constants.BRANCH:
                groups.append(av[1])
            elif op is _sre_constants.SUBPATTERN:
                groups.append([av[-1]])
        if len(best) >= 3:
            return {best.lower()}
        for alternatives in groups:  # a mandatory group: one key from each of its alternatives
            keys: set[str] = set()
            for alt in alternatives:
                k = needed(alt)
                if k is None:
                    break
                keys |= k
            else:
                return keys
        return None

    return needed(_sre_parse.parse(pattern.pattern, pattern.flags))


def _index_keys() -> tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[int, ...]]:
    by_key: dict[str, list[int]] = {}
    unkeyed = []
    for j, s in enumerate(SIGNATURES):
        keys = _literal_keys(s.pattern)
        if keys is None:
            unkeyed.append(j)
            continue
        for k in keys:
            by_key.setdefault(k, []).append(j)
    return tuple((k, tuple(v)) for k, v in sorted(by_key.items())), tuple(unkeyed)


def _kernel_oom(inp: DiagnoseFailureInput, notes: list[str]) -> list[tuple[int, str]]:
    """The kernel log's OOM-killer lines (line number, text), the last three; [] when the kernel
    log was not given and no reader is installed, could not be read, or shows none."""
    text = inp.kernel_log
    if text is None and KERNEL_LOG_READER is not None:
        try:
            text = KERNEL_LOG_READER()
        except Exception as exc:  # noqa: BLE001 - a reader's failure is a note, not a crash
            notes.append(f"the kernel log could not be read ({type(exc).__name__})")
            text = None
    if not text:
        return []
    start_line = 1
    if len(text) > MAX_KERNEL_LOG_BYTES:
        start_line = text.count("\n", 0, len(text) - MAX_KERNEL_LOG_BYTES) + 2
        text = text[-MAX_KERNEL_LOG_BYTES:].split("\n", 1)[-1]
    found = [
        (start_line + n, line)
        for n, line in enumerate(text.splitlines())
        if _KERNEL_OOM.search(line[:MAX_MATCH_CHARS])
    ]
    return found[-3:]


def _enough(
    hits: dict[str, list[tuple[Signature, int]]], lines: list[str]
) -> dict[str, list[tuple[Signature, int]]]:
    """The hits without those of signatures seen on fewer lines than their min_lines, and
    without a thread dump (faulthandler's) that a fatal error printed: then it is a crash."""
    count: dict[int, int] = {}
    for pairs in hits.values():
        for sig, _ in pairs:
            count[id(sig)] = count.get(id(sig), 0) + 1
    fatal = any(_FATAL_C.search(line) for line in lines)
    out: dict[str, list[tuple[Signature, int]]] = {}
    for cat, pairs in hits.items():
        kept = [
            p
            for p in pairs
            if count[id(p[0])] >= p[0].min_lines
            and not (fatal and p[0].category == "hang_or_timeout" and not p[0].strong)
        ]
        if kept:
            out[cat] = kept
    return out


def _most_specific(pairs: list[tuple[Signature, int]]) -> Signature:
    """The matched signature listed first in SIGNATURES (the table runs specific → general)."""
    return min((sig for sig, _ in pairs), key=SIGNATURES.index)


def _first_category(hits: dict[str, Any], order: tuple[str, ...] = STRONG_PRIORITY) -> str | None:
    return next((c for c in order if c in hits), None)


def _override(pairs: list[tuple[Signature, int]]) -> Signature | None:
    """A matched signature that changes the category's default retry advice, if any."""
    return next((sig for sig, _ in pairs if sig.retryable is not None and sig.action), None)


def _clean(line: str) -> str:
    text = _CONTROL.sub("", _ANSI.sub("", line)).strip()
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def _result(
    category: str,
    confidence: str,
    evidence: list[EvidenceLine],
    reasoning: str,
    inp: DiagnoseFailureInput,
    sig: int | None,
    notes: list[str],
    override: Signature | None = None,
) -> DiagnoseFailureResult:
    retryable, action, message = DEFAULTS[category]
    if override is not None:
        retryable, action = bool(override.retryable), str(override.action)
        message = f"do not retry unchanged: {override.meaning}; fix it, then resubmit"
    retryable, remediation = _remedy(category, retryable, action, message, inp)
    if notes:
        reasoning += "; " + "; ".join(notes)
    return DiagnoseFailureResult(
        category=category,
        retryable=retryable,
        confidence=confidence,
        evidence=evidence,
        reasoning=reasoning,
        remediation=remediation,
        signal=sig,
    )


def _remedy(
    category: str, retryable: bool, action: str, message: str, inp: DiagnoseFailureInput
) -> tuple[bool, Remediation]:
    """The action made concrete with the attempt's parameters, and whether a retry can still
    help (not when a CUDA OOM's micro-batch cannot shrink any further)."""
    remediation = _remediation(category, action, message, inp)
    return retryable and not (remediation.action == "stop" and category == "cuda_oom"), remediation


def remember(
    store: Store,
    result: DiagnoseFailureResult,
    text: Callable[[], str],
    *,
    params: dict[str, Any] | None = None,
    knobs: dict[str, str] | None = None,
    attempt_id: int | None = None,
    log_path: str | None = None,
    asker: str | None = None,
) -> DiagnoseFailureResult:
    """`result`, or the person's category where they corrected a log that ended as this one
    (skills/remembered_corrections.py `find`: whose word counts, which endings): its
    remediation made concrete with the attempt's parameters, the rules' reading kept in
    `remembered`."""
    got = remembered_corrections.find(
        store,
        result.category,
        text,
        attempt_id=attempt_id,
        log_path=log_path,
        asker=asker,
    )
    if got is None:
        return result
    row, said = got
    retryable, action, message = DEFAULTS[row.category]
    retryable, fix = _remedy(
        row.category, retryable, action, message, DiagnoseFailureInput(params=params, knobs=knobs)
    )
    return result.model_copy(
        update={
            "category": row.category,
            "confidence": "medium",
            "retryable": retryable,
            "remediation": fix,
            "reasoning": (
                f"{row.corrected_by} corrected job {row.job_id} attempt {row.attempt_number}, "
                f"whose log ended the same way, to {row.category}; the rules read "
                f"{result.category}: {result.reasoning}"
            ),
            "remembered": Remembered(
                rules_category=result.category,
                job_id=row.job_id,
                attempt=row.attempt_number,
                corrected_by=row.corrected_by,
                ending=said,
            ),
        }
    )


def _remediation(
    category: str, action: str, message: str, inp: DiagnoseFailureInput
) -> Remediation:
    knobs, params = inp.knobs or {}, inp.params or {}

    def current(knob: str) -> tuple[str | None, Any]:
        name = knobs.get(knob)
        return name, params.get(name) if name else None

    if action == "resume_smaller_batch":
        factors = {"micro_batch": 0.5, "grad_accum": 2.0}
        mb_name, mb = current("micro_batch")
        ga_name, ga = current("grad_accum")
        if mb_name is not None and isinstance(mb, int) and not isinstance(mb, bool):
            if mb <= 1:
                return Remediation(
                    action="stop",
                    factors={},
                    message="the micro-batch is already "
                    "1: each example needs less memory (shorter sequences, "
                    "activation checkpointing, mixed precision) or a larger GPU",
                )
            changes: dict[str, Any] = {mb_name: mb // 2}
            if ga_name and isinstance(ga, int) and not isinstance(ga, bool):
                changes[ga_name] = ga * 2
                message = (
                    f"resume from the last checkpoint with {mb_name} {mb} → {mb // 2} and "
                    f"{ga_name} {ga} → {ga * 2} (same effective batch)"
                )
            else:
                message = (
                    f"resume from the last checkpoint with {mb_name} {mb} → {mb // 2}; no "
                    "grad_accum knob is declared, so the effective batch halves"
                )
            return Remediation(
                action="resume_smaller_batch", changes=changes, factors=factors, message=message
            )
        return Remediation(
            action="resume_smaller_batch",
            factors=factors,
            message=message + " (declare the spec's knobs to get concrete values)",
        )
    if action == "resume_lower_lr":
        factors = {"learning_rate": LR_FACTOR}
        lr_name, lr = current("learning_rate")
        if (
            isinstance(lr, (int, float))
            and not isinstance(lr, bool)
            and math.isfinite(lr)
            and lr > 0
        ):
            new = float(f"{lr * LR_FACTOR:.6g}")
            return Remediation(
                action="resume_lower_lr",
                changes={lr_name: new},
                factors=factors,
                message=f"{message}: {lr_name} {lr} → {new}",
            )
        return Remediation(action="resume_lower_lr", factors=factors, message=message)
    return Remediation(action=action, message=message)


_KEYS, _UNKEYED = _index_keys()
