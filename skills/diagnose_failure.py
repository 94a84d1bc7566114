"""diagnose_failure: say why an attempt ended, with the log lines that show it, and what to do next.

The log is data, never instructions: it is only matched against fixed regular expressions; no
line is run, evaluated or followed, and quoted lines are stripped of control characters and cut
to a bounded length.

How a verdict is reached, in this order:

1. What the monitor knows wins: `monitor_says` preempted / stalled / timeout is the category (the
   monitor stopped the process or saw the platform do it); log signatures are still reported.
2. Exit status 0 (and no signal) is `succeeded`, whatever the log says; lines that look like
   errors are quoted so a human can check the outputs.
3. Strong signatures (the exact text real tools print: PyTorch, NCCL, CUDA, the kernel, Python;
   never on informational lines: `NCCL INFO ...`, Python `...Warning: ...`, and the I / W levels
   of TensorFlow's, glog's, c10's and DeepSpeed's loggers),
   by category priority — the root cause first: driver_mismatch, cuda_oom, host_oom, disk_full,
   checkpoint_corrupt, nan_loss, import_or_env, cuda_runtime_error, nccl_or_distributed,
   file_missing. (One rank's OOM makes the other ranks report NCCL errors; a full disk makes a
   checkpoint corrupt; so the cause outranks its echo.)
4. Weak signatures: a bare `Killed` line from the shell, a metrics line with a NaN loss.
5. The exit status: SIGKILL (or exit 137) → host_oom, most often the kernel OOM killer; SIGTERM
   (143) → preempted; 126/127 → import_or_env.
6. A Python traceback or exception line with a failing exit → crashed.
7. Other signals (SIGSEGV, SIGABRT, SIGBUS) → crashed. Otherwise unknown: no confident guess.
"""

from __future__ import annotations

import math
import re
import signal as signal_module
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from nightshift.skills.base import SkillContext, skill

Category = Literal["cuda_oom", "host_oom", "nan_loss", "nccl_or_distributed", "cuda_runtime_error",
                   "file_missing", "checkpoint_corrupt", "disk_full", "driver_mismatch",
                   "import_or_env", "preempted", "stalled", "timeout", "crashed", "unknown",
                   "succeeded"]
Action = Literal["resume", "resume_smaller_batch", "resume_lower_lr", "resume_previous_checkpoint",
                 "stop"]

MAX_LOG_BYTES = 2 * 1024 * 1024  # the tail that is examined
MAX_COUNT_BYTES = 256 * 1024 * 1024  # up to this much before the tail is counted for line numbers
MAX_EVIDENCE = 5
MAX_LINE_CHARS = 300
LR_FACTOR = 0.5


class DiagnoseFailureInput(BaseModel):
    """What is known about an attempt that ended: its log (text or file), exit status, and what
    the monitor saw. params and knobs (optional) turn the remediation into concrete values."""

    log_tail: str | None = Field(None, description="The end of the attempt's log (stdout+stderr)")
    log_path: str | None = Field(None, description="Or: a log file; its last 2 MiB are read")
    exit_code: int | None = Field(None, description="Process exit code; negative = killed by that "
                                  "signal (Python's convention); 128+N = signal N (the shell's)")
    signal: int | None = Field(None, ge=0, le=64, description="The signal that ended it, if known "
                               "(0 or None: none)")
    monitor_says: Literal["preempted", "stalled", "timeout"] | None = Field(
        None, description="What the monitor knows: it or the platform stopped the attempt "
        "(preempted), no progress (stalled), the spec's timeout passed (timeout)")
    params: dict[str, Any] | None = Field(None, description="The attempt's parameter values")
    knobs: dict[str, str] | None = Field(None, description="The spec's knobs: learning_rate / "
                                         "micro_batch / grad_accum → parameter name")

    @model_validator(mode="after")
    def _one_log(self) -> DiagnoseFailureInput:
        if self.log_tail is not None and self.log_path is not None:
            raise ValueError("give log_tail or log_path, not both")
        return self


class EvidenceLine(BaseModel):
    line_no: int = Field(description="1-based line number in the log (in the file for log_path)")
    text: str


class Remediation(BaseModel):
    action: Action
    changes: dict[str, Any] = Field(default_factory=dict, description="New parameter values by "
                                    "parameter name; empty when params/knobs were not given")
    factors: dict[str, float] = Field(default_factory=dict, description="Multipliers by knob "
                                      "(learning_rate, micro_batch, grad_accum)")
    message: str


class DiagnoseFailureResult(BaseModel):
    category: Category
    retryable: bool = Field(description="Whether resuming (with the remediation) may succeed")
    confidence: Literal["high", "medium", "low"]
    evidence: list[EvidenceLine] = Field(default_factory=list)
    reasoning: str
    remediation: Remediation
    signal: int | None = Field(None, description="The signal that ended the process, if any")


@dataclass(frozen=True)
class Signature:
    category: str
    pattern: re.Pattern[str]
    meaning: str
    strong: bool = True
    retryable: bool | None = None  # overrides the category's default
    action: str | None = None


def _sig(category: str, pattern: str, meaning: str, **kw: Any) -> Signature:
    return Signature(category, re.compile(pattern, re.IGNORECASE | re.MULTILINE), meaning, **kw)


# Each pattern is text the named tool really prints (tests/fixtures/logs/SOURCES.md cites them).
SIGNATURES: tuple[Signature, ...] = (
    # cudaErrorInsufficientDriver's text; torch/cuda/__init__.py's driver checks; NVML's init error.
    _sig("driver_mismatch", r"CUDA driver version is insufficient for CUDA runtime version",
         "the NVIDIA driver is older than the CUDA runtime the code was built with"),
    _sig("driver_mismatch", r"The NVIDIA driver on your system is too old",
         "PyTorch needs a newer NVIDIA driver"),
    _sig("driver_mismatch", r"Found no NVIDIA driver on your system", "no NVIDIA driver loaded"),
    _sig("driver_mismatch", r"Driver/library version mismatch",
         "the loaded kernel driver and the user-space NVIDIA libraries differ (reboot or reload)"),
    _sig("driver_mismatch", r"couldn't communicate with the NVIDIA driver",
         "nvidia-smi cannot reach the driver"),
    _sig("driver_mismatch", r"forward compatibility was attempted on non supported HW",
         "the CUDA forward-compatibility package does not support this GPU"),
    # cudaErrorSystemDriverMismatch (803), as torch's cudaGetDeviceCount check and Caffe print it.
    _sig("driver_mismatch", r"system has unsupported display driver / cuda driver combination",
         "the NVIDIA kernel driver does not match the CUDA driver library (cudaErrorSystemDriver"
         "Mismatch, 803)"),
    # c10/cuda/CUDACachingAllocator.cpp; XLA's allocator; cuBLAS handle creation.
    _sig("cuda_oom", r"torch\.(?:cuda\.)?OutOfMemoryError", "PyTorch ran out of GPU memory"),
    _sig("cuda_oom", r"CUDA out of memory", "the GPU ran out of memory"),
    _sig("cuda_oom", r"CUDA error: out of memory", "the GPU ran out of memory"),
    _sig("cuda_oom", r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
         "XLA ran out of device memory"),
    _sig("cuda_oom", r"CUBLAS_STATUS_ALLOC_FAILED", "cuBLAS could not allocate GPU memory"),
    _sig("cuda_oom", r"Cuda failure '?out of memory", "NCCL could not allocate GPU memory"),
    # TensorFlow's ResourceExhaustedError; on a CPU device it is host memory (host_oom below).
    _sig("cuda_oom", r"OOM when allocating tensor(?!.*(?:device:CPU|by allocator cpu\b))",
         "TensorFlow ran out of GPU memory (ResourceExhaustedError)"),
    # mm/oom_kill.c (dmesg); Slurm's cgroup plugin; Python; C++; torch's DataLoader.
    _sig("host_oom", r"Out of memory: Kill(?:ed)? process \d+",
         "the kernel OOM killer killed a process for lack of host memory"),
    _sig("host_oom", r"Memory cgroup out of memory: Kill(?:ed)? process",
         "the container's memory limit was hit and the OOM killer killed a process"),
    _sig("host_oom", r"invoked oom-killer", "the kernel OOM killer ran"),
    _sig("host_oom", r"oom[-_]kill event", "the batch system saw an OOM kill"),
    _sig("host_oom", r"^(?:\[[^\]\n]*\]:?\s*)*MemoryError\b", "Python could not allocate host memory"),
    _sig("host_oom", r"std::bad_alloc", "a C++ allocation of host memory failed"),
    _sig("host_oom", r"OOM when allocating tensor.*(?:device:CPU|by allocator cpu\b)",
         "TensorFlow ran out of host memory (ResourceExhaustedError on the CPU allocator)"),
    # torch/utils/data: a worker's SIGBUS on a full /dev/shm (a container's small --shm-size).
    _sig("host_oom", r"Unexpected bus error encountered in worker\. This might be caused by "
         r"insufficient shared memory", "DataLoader workers ran out of shared memory (/dev/shm): "
         "raise the container's shm size, or use fewer workers"),
    _sig("host_oom", r"DataLoader worker \(pid \d+\) is killed by signal: Bus error",
         "DataLoader workers ran out of shared memory (/dev/shm): raise the container's shm size, "
         "or use fewer workers"),
    _sig("host_oom", r"DataLoader worker \(pid \d+\) is killed by signal: Killed",
         "a DataLoader worker was SIGKILLed, most often by the OOM killer"),
    # errno 28 / 122 as Python and the C library print them; torch.save's writer.
    _sig("disk_full", r"No space left on device", "a write failed: the disk is full"),
    _sig("disk_full", r"\[Errno 28\]", "a write failed: the disk is full (ENOSPC)"),
    _sig("disk_full", r"Disk quota exceeded", "a write failed: the disk quota is used up"),
    _sig("disk_full", r"PytorchStreamWriter failed writing file",
         "torch.save could not write the checkpoint (most often a full disk)"),
    _sig("disk_full", r"inline_container\.cc:\d+\] \. ?unexpected pos \d+ vs \d+",
         "torch.save's writer came up short (most often a full disk or quota)"),
    # torch/serialization.py (zip and legacy readers); safetensors; TensorFlow; zipfile (numpy).
    _sig("checkpoint_corrupt", r"PytorchStreamReader failed reading (?:zip archive|file)",
         "torch.load found a truncated or corrupt checkpoint"),
    _sig("checkpoint_corrupt", r"UnpicklingError: (?:invalid load key|pickle data was truncated)",
         "a pickled checkpoint is truncated or corrupt"),
    _sig("checkpoint_corrupt", r"SafetensorError: Error while deserializing header",
         "a safetensors file is truncated or corrupt"),
    _sig("checkpoint_corrupt", r"DataLossError", "TensorFlow found a corrupt checkpoint"),
    _sig("checkpoint_corrupt", r"BadZipFile", "a zip-based checkpoint is truncated or corrupt"),
    # transformers / diffusers `load_state_dict`, wrapping torch.load's failure.
    _sig("checkpoint_corrupt", r"Unable to load weights from (?:pytorch )?checkpoint file",
         "transformers could not read a weights file (a truncated download or checkpoint)"),
    # our examples/train_numpy.py and many loops; autograd anomaly mode; fairseq; Lightning.
    _sig("nan_loss", r"\bloss (?:is|became|=) ?(?:nan|inf|-inf)\b", "the loss diverged"),
    _sig("nan_loss", r"\bnon-finite loss\b", "the loss diverged"),
    _sig("nan_loss", r"returned nan values in its \d+(?:st|nd|rd|th) output",
         "autograd found NaN in a backward pass"),
    _sig("nan_loss", r"Minimum loss scale reached", "fp16 loss scaling collapsed: the loss diverged"),
    # deepspeed/runtime/fp16/loss_scaler.py, raised when the dynamic scale cannot go lower.
    _sig("nan_loss", r"Current loss scale already at minimum - cannot decrease scale anymore",
         "DeepSpeed's fp16 loss scaling collapsed (overflow at the minimum scale): the loss "
         "diverged"),
    _sig("nan_loss", r"Detected nan and/or inf values in", "parameters became NaN/inf"),
    _sig("nan_loss", r"^FloatingPointError\b", "a floating-point check failed"),
    # Python's import system; the dynamic loader; the shell; a PyTorch build without this GPU's arch.
    _sig("import_or_env", r"ModuleNotFoundError: No module named", "a Python package is missing"),
    _sig("import_or_env", r"^(?:\[[^\]\n]*\]:?\s*)*ImportError\b", "an import failed"),
    _sig("import_or_env", r"cannot open shared object file", "a shared library is missing"),
    _sig("import_or_env", r"undefined symbol: ", "a shared library does not match its caller"),
    _sig("import_or_env", r"version `GLIBC_[\d.]+' not found", "the C library is too old"),
    _sig("import_or_env", r": command not found", "the program to run is not installed"),
    # torch.utils.cpp_extension's JIT build, as DeepSpeed's op builder (cpu_adam, fused_adam) uses it.
    _sig("import_or_env", r"Error building extension '[\w.]+'", "a C++/CUDA extension could not "
         "be compiled (a compiler, the CUDA toolkit or headers are missing or do not match)"),
    _sig("import_or_env", r"no kernel image is available for execution on the device",
         "the installed PyTorch was not built for this GPU's architecture"),
    # the CUDA runtime's error strings, as PyTorch raises them; the NVIDIA kernel module (dmesg).
    _sig("cuda_runtime_error", r"device-side assert triggered",
         "a kernel assertion failed, most often an index out of range (e.g. a label >= the number "
         "of classes): a bug in the code or data", retryable=False, action="stop"),
    _sig("cuda_runtime_error", r"CUDA error: an illegal memory access was encountered",
         "a kernel accessed memory it must not (a bug, or a failing GPU)"),
    _sig("cuda_runtime_error", r"CUDA error: (?!out of memory)[a-z]", "a CUDA call failed"),
    _sig("cuda_runtime_error", r"CUBLAS_STATUS_EXECUTION_FAILED", "a cuBLAS kernel failed"),
    _sig("cuda_runtime_error", r"NVRM: Xid \(", "the driver reported an Xid (GPU) error"),
    _sig("cuda_runtime_error", r"GPU has fallen off the bus", "the GPU dropped off the PCIe bus"),
    _sig("cuda_runtime_error", r"uncorrectable ECC error", "the GPU reported an ECC error"),
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp and NCCL's ncclGetErrorString; gloo; store.
    _sig("nccl_or_distributed", r"NCCL error", "a NCCL collective failed"),
    _sig("nccl_or_distributed", r"\bnccl(?:System|Internal|UnhandledCuda|Remote)Error\b",
         "a NCCL collective failed"),
    _sig("nccl_or_distributed", r"unhandled (?:system|cuda) error \(run with NCCL_DEBUG=INFO",
         "a NCCL collective failed"),
    _sig("nccl_or_distributed", r"remote process exited or there was a network error",
         "a peer rank died or the network failed"),
    _sig("nccl_or_distributed", r"Watchdog caught collective operation timeout",
         "a collective hung until the NCCL watchdog timed out"),
    _sig("nccl_or_distributed", r"\bDist(?:Backend|Network|Store)Error\b",
         "torch.distributed failed"),
    _sig("nccl_or_distributed", r"gloo/transport/tcp/pair\.cc.*Connection (?:closed|reset) by peer",
         "a peer rank's connection dropped"),
    # FileNotFoundError / errno 2.
    _sig("file_missing", r"FileNotFoundError", "a file or folder the run needs does not exist"),
    _sig("file_missing", r"No such file or directory", "a file or folder the run needs does not exist"),
    # transformers' hub resolution of `from_pretrained(name_or_path)`.
    _sig("file_missing", r"is not a local folder and is not a valid model identifier",
         "the model path or Hub id does not exist (or is a private repository and no token was "
         "given)"),
    # Weak: what a shell prints for any SIGKILLed child; a NaN in a metrics line.
    _sig("host_oom", r"^(?:.*\bline \d+: +\d+ )?Killed\b(?!\s+process)", "the process was SIGKILLed "
         "(the shell's report), most often by the kernel OOM killer", strong=False),
    _sig("nan_loss", r"[\"']?loss[\"']?\s*[:=]\s*(?:nan|inf)\b", "a logged loss is NaN/inf",
         strong=False),
)

STRONG_PRIORITY = ("driver_mismatch", "cuda_oom", "host_oom", "disk_full", "checkpoint_corrupt",
                   "nan_loss", "import_or_env", "cuda_runtime_error", "nccl_or_distributed",
                   "file_missing")
WEAK_PRIORITY = ("host_oom", "nan_loss")

# An exception line (optionally behind torchrun's "[rank0]:" prefixes) or a fatal C-level report.
_EXCEPTION_LINE = re.compile(r"^(?:\[[^\]\n]*\]:?\s*)*(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|"
                             r"Interrupt|Exit)(?::.*)?$")
_TRACEBACK = re.compile(r"^(?:\[[^\]\n]*\]:?\s*)*Traceback \(most recent call last\):")
_FATAL_C = re.compile(r"Segmentation fault|core dumped|Fatal Python error|^Aborted\b|Bus error")
# Lines that inform rather than fail: NCCL's INFO chatter (it reports, e.g., an optional plugin
# that "cannot open shared object file"), Python warnings, and the INFO / WARNING levels of the
# C++ loggers and launchers (TensorFlow reports a missing optional CUDA library, or an allocation
# that "is not a failure", at W). They are never evidence; the error they foreshadow, if any, is
# raised again on a line of its own.
_INFORMATIONAL = re.compile(
    r"\bNCCL INFO\b|\b[A-Z]\w*Warning: "
    # absl / TensorFlow / XLA: `2024-02-25 18:52:47.991396: W tensorflow/...] ...` (I and W only)
    r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "
    # glog (torch.distributed.elastic, XLA): `W0302 19:39:39.186000 22436 file.py:27] ...`
    r"|^(?:\[[^\]\n]*\]:?\s*)*[IW]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ "
    # c10 logging: `[W socket.cpp:558] ...`, `[W926 21:34:49.000000000 socket.cpp:697] ...`
    r"|^(?:\[[^\]\n]*\]:?\s*)*\[[IW](?:\d{3,4} [\d:.]+)? [^\]\s]+:\d+\]"
    # DeepSpeed and the Hugging Face trainers: `[INFO] [launch.py:315:...]`, `[WARNING|trainer.py:...]`
    r"|\[(?:INFO|WARNING|WARN|DEBUG)[\]|]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# category -> (retryable, action, what to do)
DEFAULTS: dict[str, tuple[bool, str, str]] = {
    "cuda_oom": (True, "resume_smaller_batch",
        ("resume from the last checkpoint with half the micro-batch and twice the "
         "gradient accumulation (same effective batch)")),
    "host_oom": (True, "resume",
        ("resume from the last checkpoint; if it is killed again, lower host memory use "
         "(fewer DataLoader workers, smaller prefetch or host-side batch) or ask for "
         "more host memory")),
    "nan_loss": (True, "resume_lower_lr",
        ("resume from the last checkpoint written before the loss went NaN with a lower "
         "learning rate (tune_lr can pick it); checkpoints written after the divergence "
         "hold bad weights")),
    "nccl_or_distributed": (True, "resume",
        ("resume from the last checkpoint: NCCL and network failures are often transient "
         "or an echo of one rank dying; if it repeats, check every rank's log and rerun "
         "with NCCL_DEBUG=INFO")),
    "cuda_runtime_error": (True, "resume",
        ("run gpu_health_check (Xid, ECC) and resume on a healthy GPU; if it fails the "
         "same way at the same step, it is a bug: rerun with CUDA_LAUNCH_BLOCKING=1")),
    "file_missing": (False, "stop",
        ("a path the run needs does not exist: fix the path, the mount or the working "
         "directory, then resubmit")),
    "checkpoint_corrupt": (True, "resume_previous_checkpoint",
        ("resume from the newest checkpoint that verifies (auto_resume skips the corrupt "
         "one)")),
    "disk_full": (False, "stop",
        ("free disk space (or raise the quota), e.g. by deleting old checkpoints "
         "(delete_checkpoints, approved), then resume")),
    "driver_mismatch": (False, "stop",
        ("the NVIDIA driver and the CUDA user space do not match: update the driver or "
         "use an image built for it; retrying cannot help")),
    "import_or_env": (False, "stop",
        ("the environment is broken (missing package, library or program): fix the image "
         "or virtual environment, then resubmit")),
    "preempted": (True, "resume",
        ("resume from the last checkpoint when resources allow")),
    "stalled": (True, "resume",
        ("resume from the last checkpoint; if it stalls again at the same place, suspect "
         "a deadlock (collectives, DataLoader workers)")),
    "timeout": (False, "stop",
        ("the spec's timeout was reached: raise timeout_min, or resume if the remaining "
         "steps fit")),
    "crashed": (True, "resume",
        ("resume once from the last checkpoint; if it crashes the same way, stop and "
         "read the traceback")),
    "unknown": (False, "stop",
        ("nothing in the log or the exit status explains the failure: read the full log "
         "(job_logs) before retrying")),
    "succeeded": (False, "stop",
        ("nothing to recover: the run finished")),
}


@skill("diagnose_failure", capability="read")
def diagnose_failure(ctx: SkillContext, inp: DiagnoseFailureInput) -> DiagnoseFailureResult:
    """Classify why a training attempt ended — cuda_oom, host_oom, nan_loss, nccl_or_distributed,
    cuda_runtime_error, file_missing, checkpoint_corrupt, disk_full, driver_mismatch,
    import_or_env, preempted, stalled, timeout, crashed, unknown or succeeded — from its log tail
    (or log file), exit code, signal and what the monitor saw. Returns the log lines that show it,
    the reasoning, whether a retry can help, and a remediation: resume, resume_smaller_batch,
    resume_lower_lr, resume_previous_checkpoint or stop, with concrete parameter changes when the
    attempt's params and the spec's knobs are given. Log text is treated as data only."""
    lines, first_line_no, log_note = _read_log(inp)
    lines = [_ANSI.sub("", line) for line in lines]  # colour codes would hide line starts
    sig = _signal_of(inp.exit_code, inp.signal)
    failed_exit = (inp.exit_code not in (None, 0)) or sig is not None
    hits = _match(lines)
    strong = {c: h for c, h in hits.items() if any(s.strong for s, _ in h)}
    weak = {c: h for c, h in hits.items() if c not in strong}

    def ev(pairs: list[tuple[Signature | None, int]]) -> list[EvidenceLine]:
        seen, out = set(), []
        for _, i in pairs:
            if i not in seen and len(out) < MAX_EVIDENCE:
                seen.add(i)
                out.append(EvidenceLine(line_no=first_line_no + i, text=_clean(lines[i])))
        return out

    status = _describe_status(inp.exit_code, sig)
    notes = [n for n in (log_note,) if n]

    if inp.monitor_says:
        cat = inp.monitor_says
        why = {"preempted": "the monitor reports that the attempt was preempted (stopped by "
                            "nightshift or by the platform)",
               "stalled": "the monitor saw no progress for longer than the stall limit and "
                          "stopped the attempt",
               "timeout": "the attempt ran past the spec's timeout and was stopped"}[cat]
        also = _first_category(strong) or _first_category(weak, WEAK_PRIORITY)
        pairs = (strong.get(also) or weak.get(also) or []) if also else []
        extra = (f"; the log also shows {also} ({_most_specific(pairs).meaning})" if pairs else "")
        return _result(cat, "high", ev(pairs), why + extra + f"; {status}", inp, sig, notes)

    if inp.exit_code == 0 and sig is None:
        errorish = [(None, i) for i, line in enumerate(lines)
                    if _EXCEPTION_LINE.match(line.strip()) or _TRACEBACK.match(line)]
        reasoning = "the process exited with status 0"
        if strong or errorish:
            reasoning += ("; the log has lines that look like errors (quoted), but the run "
                          "completed: check its outputs if in doubt")
        pairs = [p for h in strong.values() for p in h] + errorish
        return _result("succeeded", "high", ev(sorted(pairs, key=lambda p: p[1])), reasoning, inp,
                       sig, notes)

    cat = _first_category(strong)
    if cat:
        pairs = strong[cat]
        others = [c for c in STRONG_PRIORITY if c in strong and c != cat]
        reasoning = f"{_most_specific(pairs).meaning}; {status}"
        if others:
            reasoning += (f"; the log also shows {', '.join(others)}, read as consequences of "
                          f"{cat}")
        return _result(cat, "high", ev(pairs), reasoning, inp, sig, notes,
                       override=_override(pairs))

    cat = _first_category(weak, WEAK_PRIORITY)
    if cat:
        pairs = weak[cat]
        return _result(cat, "medium", ev(pairs), f"{_most_specific(pairs).meaning}; {status}", inp,
                       sig, notes)

    if sig == signal_module.SIGKILL:
        return _result("host_oom", "medium", [], f"{status}, and the log shows no other cause; "
                       "a SIGKILL with no error is most often the kernel OOM killer (check dmesg "
                       "or the container's memory events); kill -9 by a person or the platform "
                       "looks the same", inp, sig, notes)
    if sig == signal_module.SIGTERM:
        return _result("preempted", "medium", [], f"{status}: something asked the process to "
                       "stop (the platform, the batch system, or a person), and the log shows no "
                       "error", inp, sig, notes)
    if inp.exit_code in (126, 127) and sig is None:
        return _result("import_or_env", "medium", [], f"{status}: the shell's code for a command "
                       "that was not found or not executable", inp, sig, notes)

    exc_lines = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line.strip())]
    tb_lines = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    fatal = [i for i, line in enumerate(lines) if _FATAL_C.search(line)]
    if failed_exit and (exc_lines or tb_lines or fatal):
        picked = (exc_lines[-2:] if exc_lines else []) + fatal[-1:] or tb_lines[-1:]
        last = _clean(lines[picked[-1]]) if picked else "a traceback"
        return _result("crashed", "medium", ev([(None, i) for i in sorted(picked)]),
                       f"{status}, after an error that matches no known signature: {last}", inp,
                       sig, notes)
    if sig in (signal_module.SIGSEGV, signal_module.SIGABRT, signal_module.SIGBUS):
        return _result("crashed", "medium", [], f"{status}: a native crash (a bug in an extension, "
                       "or a broken installation)", inp, sig, notes)

    if failed_exit:
        reasoning = f"{status}, and nothing in the log explains it"
    elif inp.exit_code is None and sig is None:
        reasoning = ("no exit status was given and the log shows no recognised failure"
                     + ("; it has an error line that matches no signature" if exc_lines else ""))
    else:
        reasoning = status
    return _result("unknown", "low", ev([(None, i) for i in exc_lines[-2:]]), reasoning, inp, sig,
                   notes)


# --- helpers ------------------------------------------------------------------------------------
def _read_log(inp: DiagnoseFailureInput) -> tuple[list[str], int, str | None]:
    """The lines to examine, the line number of the first one, and a note on what was read."""
    if inp.log_path is not None:
        path = Path(inp.log_path).expanduser()
        try:
            size = path.stat().st_size
            start = max(0, size - MAX_LOG_BYTES)
            counted = start <= MAX_COUNT_BYTES
            with open(path, "rb") as f:
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
        lines = data.decode("utf-8", errors="replace").splitlines()
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
    return text.splitlines(), 1, None


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
    hits: dict[str, list[tuple[Signature, int]]] = {}
    for i, line in enumerate(lines):
        if _INFORMATIONAL.search(line):
            continue
        for s in SIGNATURES:
            if s.pattern.search(line):
                hits.setdefault(s.category, []).append((s, i))
                break
    # Within a category, strong evidence first, then by line.
    return {c: sorted(h, key=lambda p: (not p[0].strong, p[1])) for c, h in hits.items()}


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


def _result(category: str, confidence: str, evidence: list[EvidenceLine], reasoning: str,
            inp: DiagnoseFailureInput, sig: int | None, notes: list[str],
            override: Signature | None = None) -> DiagnoseFailureResult:
    retryable, action, message = DEFAULTS[category]
    if override is not None:
        retryable, action = bool(override.retryable), str(override.action)
        message = f"do not retry unchanged: {override.meaning}; fix it, then resubmit"
    remediation = _remediation(category, action, message, inp)
    if remediation.action == "stop" and category == "cuda_oom":
        retryable = False
    if notes:
        reasoning += "; " + "; ".join(notes)
    return DiagnoseFailureResult(category=category, retryable=retryable, confidence=confidence,
                                 evidence=evidence, reasoning=reasoning, remediation=remediation,
                                 signal=sig)


def _remediation(category: str, action: str, message: str,
                 inp: DiagnoseFailureInput) -> Remediation:
    knobs, params = inp.knobs or {}, inp.params or {}

    def current(knob: str) -> tuple[str | None, Any]:
        name = knobs.get(knob)
        return name, params.get(name) if name else None

    if action == "resume_smaller_batch":
        factors = {"micro_batch": 0.5, "grad_accum": 2.0}
        mb_name, mb = current("micro_batch")
        ga_name, ga = current("grad_accum")
        if isinstance(mb, int) and not isinstance(mb, bool):
            if mb <= 1:
                return Remediation(action="stop", factors={}, message="the micro-batch is already "
                                   "1: each example needs less memory (shorter sequences, "
                                   "activation checkpointing, mixed precision) or a larger GPU")
            changes: dict[str, Any] = {mb_name: mb // 2}
            if ga_name and isinstance(ga, int) and not isinstance(ga, bool):
                changes[ga_name] = ga * 2
                message = (f"resume from the last checkpoint with {mb_name} {mb} → {mb // 2} and "
                           f"{ga_name} {ga} → {ga * 2} (same effective batch)")
            else:
                message = (f"resume from the last checkpoint with {mb_name} {mb} → {mb // 2}; no "
                           "grad_accum knob is declared, so the effective batch halves")
            return Remediation(action="resume_smaller_batch", changes=changes, factors=factors,
                               message=message)
        return Remediation(action="resume_smaller_batch", factors=factors, message=message
                           + " (declare the spec's knobs to get concrete values)")
    if action == "resume_lower_lr":
        factors = {"learning_rate": LR_FACTOR}
        lr_name, lr = current("learning_rate")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0:
            new = float(f"{lr * LR_FACTOR:.6g}")
            return Remediation(action="resume_lower_lr", changes={lr_name: new}, factors=factors,
                               message=f"{message}: {lr_name} {lr} → {new}")
        return Remediation(action="resume_lower_lr", factors=factors, message=message)
    return Remediation(action=action, message=message)
