"""diagnose_failure on realistic logs: each category, its evidence and remediation, and logs that
are not failures (warnings, a clean exit) coming back succeeded/unknown rather than a wrong guess.
Fixture origins are listed in tests/fixtures/logs/SOURCES.md."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import BadArguments
from nightshift.runtime.store.db import AuditEvent, Store
from nightshift.runtime.training import pasted_log
from nightshift.skills import diagnose_failure as skill_module
from nightshift.skills.base import SkillContext
from nightshift.skills.diagnose_failure import DiagnoseFailureResult, diagnose_failure

from conftest import empty_store, nightshift, run_skill

LOGS = Path(__file__).parent / "fixtures" / "logs"
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train_numpy.py"
KNOBS = {"learning_rate": "lr", "micro_batch": "micro_batch", "grad_accum": "grad_accum"}
PARAMS = {"lr": 0.01, "micro_batch": 32, "grad_accum": 1, "steps": 300}


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 2, 3, 0),
    )


def diagnose(ctx, name: str | None = None, **kw):
    if name is not None:
        kw["log_path"] = str(LOGS / name)
    return run_skill(diagnose_failure, ctx, kw)


@pytest.mark.parametrize(
    ("fixture", "exit_code", "category", "action", "retryable", "quote"),
    [
        # PyTorch's allocator message (c10/cuda/CUDACachingAllocator.cpp) under the HF Trainer.
        (
            "cuda_oom_hf_trainer.log",
            1,
            "cuda_oom",
            "resume_smaller_batch",
            True,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB",
        ),
        # The kernel's oom_kill.c report; the process died by SIGKILL (128 + 9).
        (
            "host_oom_dmesg.log",
            137,
            "host_oom",
            "resume",
            True,
            "Out of memory: Killed process 48213 (python)",
        ),
        # fairseq's dynamic loss scaler giving up.
        ("nan_fairseq.log", 1, "nan_loss", "resume_lower_lr", True, "Minimum loss scale reached"),
        # NCCL's ncclSystemError through ProcessGroupNCCL.
        (
            "nccl_unhandled_system_error.log",
            1,
            "nccl_or_distributed",
            "resume",
            True,
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ),
        # ProcessGroupNCCL's watchdog tearing the process down (SIGABRT, 134).
        (
            "nccl_watchdog_timeout.log",
            134,
            "nccl_or_distributed",
            "resume",
            True,
            "Watchdog caught collective operation timeout",
        ),
        # cudaErrorIllegalAddress as PyTorch raises it.
        (
            "cuda_illegal_memory_access.log",
            1,
            "cuda_runtime_error",
            "resume",
            True,
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ),
        # torch.load on a truncated zip checkpoint (torch/serialization.py).
        (
            "checkpoint_corrupt_torch_load.log",
            1,
            "checkpoint_corrupt",
            "resume_previous_checkpoint",
            True,
            "PytorchStreamReader failed reading zip archive: failed finding central directory",
        ),
        # torch.save's writer failing, then Python's ENOSPC.
        ("disk_full_torch_save.log", 1, "disk_full", "stop", False, "No space left on device"),
        # torch/cuda/__init__.py's driver check.
        (
            "driver_too_old.log",
            1,
            "driver_mismatch",
            "stop",
            False,
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)",
        ),
        # torchvision ImageFolder on a missing folder.
        (
            "file_missing_dataset.log",
            1,
            "file_missing",
            "stop",
            False,
            "FileNotFoundError: [Errno 2] No such file or directory: '/data/imagenet/train'",
        ),
        # Python's import system.
        (
            "import_missing_module.log",
            1,
            "import_or_env",
            "stop",
            False,
            "ModuleNotFoundError: No module named 'transformers'",
        ),
        # A missing shared library says "No such file or directory" too: it is the environment.
        (
            "import_missing_shared_library.log",
            1,
            "import_or_env",
            "stop",
            False,
            "ImportError: libcudnn.so.8: cannot open shared object file",
        ),
        # A DataLoader worker's KeyError matches no known signature: a generic crash.
        ("crashed_dataloader_keyerror.log", 1, "crashed", "resume", True, "KeyError: 'input_ids'"),
    ],
)
def test_each_category_from_a_realistic_log(
    ctx, fixture, exit_code, category, action, retryable, quote
):
    """Every category is recognised from the text its real source prints, quoting that line."""
    r = diagnose(ctx, fixture, exit_code=exit_code)
    assert r.category == category, r.reasoning
    assert r.remediation.action == action
    assert r.retryable is retryable
    assert any(quote in e.text for e in r.evidence), r.evidence
    lines = (LOGS / fixture).read_text().splitlines()
    for e in r.evidence:  # line numbers point at the quoted lines of the file
        assert lines[e.line_no - 1].strip().startswith(e.text[:40])


@pytest.mark.parametrize(
    ("fixture", "exit_code", "category", "action", "quote"),
    [
        # TensorFlow on a GPU: keras-team/keras#9643, tensorflow/models#7142, Azure/MachineLearningNotebooks#880.
        (
            "tf_oom_gpu.log",
            1,
            "cuda_oom",
            "resume_smaller_batch",
            "OOM when allocating tensor with shape[128,128,109,109] and type float on "
            "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        ),
        # TensorFlow on the CPU allocator is host memory: thtrieu/darkflow#873.
        ("tf_oom_cpu.log", 1, "host_oom", "resume", "device:CPU:0 by allocator cpu"),
        # DeepSpeed's fp16 loss scaler giving up: hiyouga/LlamaFactory#251, DeepSpeedExamples#418.
        (
            "deepspeed_loss_scale_minimum.log",
            1,
            "nan_loss",
            "resume_lower_lr",
            "Exception: Current loss scale already at minimum - cannot decrease scale anymore.",
        ),
        # The pre-2.4 allocator text under ZeRO-3: deepspeedai/DeepSpeed#3869.
        (
            "deepspeed_cuda_oom.log",
            1,
            "cuda_oom",
            "resume_smaller_batch",
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 978.00 MiB (GPU 0;",
        ),
        # DeepSpeed's JIT op build, whose compiler line says "No such file or directory":
        # deepspeedai/DeepSpeed#3094, #1846, #1127.
        (
            "deepspeed_build_extension.log",
            1,
            "import_or_env",
            "stop",
            "RuntimeError: Error building extension 'cpu_adam'",
        ),
        # DataLoader workers on a small /dev/shm: pytorch/pytorch#5040, hkchengrex/STCN#132.
        (
            "dataloader_shm_bus_error.log",
            1,
            "host_oom",
            "resume",
            "ERROR: Unexpected bus error encountered in worker.",
        ),
        # cudaErrorSystemDriverMismatch: CompVis/stable-diffusion#439, yhlleo/DeepSegmentor#31.
        (
            "driver_803_unsupported.log",
            1,
            "driver_mismatch",
            "stop",
            "Error 803: system has unsupported display driver / cuda driver combination",
        ),
        # A damaged shard of a download: project-baize/baize-chatbot#31, UKPLab/EasyNMT#46.
        (
            "hf_unable_to_load_weights.log",
            1,
            "checkpoint_corrupt",
            "resume_previous_checkpoint",
            "OSError: Unable to load weights from pytorch checkpoint file for",
        ),
        # A model path that does not exist: EleutherAI/lm-evaluation-harness#995.
        (
            "hf_model_identifier_missing.log",
            1,
            "file_missing",
            "stop",
            "OSError: model is not a local folder and is not a valid model identifier",
        ),
        # A size mismatch is a code/config difference, not a corrupt file: mbrossar/ai-imu-dr#75.
        (
            "state_dict_size_mismatch.log",
            1,
            "crashed",
            "resume",
            "RuntimeError: Error(s) in loading state_dict for TORCHIEKF:",
        ),
    ],
)
def test_real_tracker_messages(ctx, fixture, exit_code, category, action, quote):
    """Messages users reported on public trackers land in the right category (SOURCES.md cites each)."""
    r = diagnose(ctx, fixture, exit_code=exit_code)
    assert r.category == category, r.reasoning
    assert r.remediation.action == action
    assert any(quote in e.text for e in r.evidence), r.evidence
    lines = (LOGS / fixture).read_text().splitlines()
    for e in r.evidence:
        assert lines[e.line_no - 1].strip().startswith(e.text[:40])


def test_tensorflow_warning_lines_are_not_the_evidence(ctx):
    """TF's W-level OOM lines are informational; the evidence is the exception TF raises after them."""
    r = diagnose(ctx, "tf_oom_gpu.log", exit_code=1)
    assert [e.line_no for e in r.evidence] == [14]


@pytest.mark.parametrize(
    "fixture",
    ["tf_startup_warnings.log", "torchrun_socket_warnings.log", "clean_run_with_warnings.log"],
)
def test_noisy_healthy_logs_get_no_confident_category(ctx, fixture):
    """Start-up noise (TF's dlerror for an optional CUDA library, c10d connect retries, DeepSpeed
    WARNINGs) is not a failure: without an exit status, succeeded where the loop ran to its end
    (Keras' last epoch complete, the HF Trainer's train_runtime), else a log that just stops
    (a hang, at low confidence); succeeded with 0."""
    stops = fixture == "torchrun_socket_warnings.log"
    assert diagnose(ctx, fixture).category == ("hang_or_timeout" if stops else "succeeded")
    assert diagnose(ctx, fixture).confidence == "low"
    assert diagnose(ctx, fixture, exit_code=0).category == "succeeded"


def test_short_real_messages(ctx):
    """One-line messages from public trackers (SOURCES.md lists them) and a warning that is not one."""
    # huggingface/diffusers#5520
    r = diagnose(
        ctx,
        log_tail='    with safe_open(checkpoint_file, framework="pt") as f:\n'
        "safetensors_rust.SafetensorError: Error while deserializing header: "
        "HeaderTooLarge\n",
        exit_code=1,
    )
    assert r.category == "checkpoint_corrupt"
    # verl-project/verl#3346, YuanGongND/ast#30
    r = diagnose(
        ctx,
        log_tail="    self.file_like.write_end_of_file()\nRuntimeError: [enforce fail "
        "at inline_container.cc:659] . unexpected pos 2387758464 vs 2387758376\n",
        exit_code=1,
    )
    assert r.category == "disk_full"
    # NVIDIA/nccl#934
    r = diagnose(
        ctx,
        log_tail="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:1347, remote process exited or there was a "
        "network error, NCCL version 2.18.5\nncclRemoteError: A call failed possibly due to "
        "a network error or a remote process exiting prematurely.\n",
        exit_code=1,
    )
    assert r.category == "nccl_or_distributed"
    # easydiffusion/easydiffusion#379: error 803 as a warning; the program went on on the CPU.
    r = diagnose(
        ctx,
        log_tail="/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py:82: "
        "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did "
        "you run some cuda functions before calling NumCudaDevices() that might have "
        "already set an error? Error 803: system has unsupported display driver / cuda "
        "driver combination (Triggered internally at  /opt/conda/conda-bld/pytorch_"
        "1646755903507/work/c10/cuda/CUDAFunctions.cpp:112.)\n  return "
        "torch._C._cuda_getDeviceCount() > 0\nWARNING: No compatible GPU found. Using the "
        "CPU, but this will be very slow!\n",
    )
    # torch's warning at CUDA initialization carries the cause (the thread's: the driver), read
    # as a weak signature: a failure of the program's own would still decide
    assert r.category == "driver_mismatch" and r.confidence == "medium"
    r = diagnose(
        ctx,
        log_tail="/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py:82: "
        "UserWarning: CUDA initialization: Found no NVIDIA driver on your system.\n"
        'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
        "KeyError: 'label'\n",
        exit_code=1,
    )
    assert r.category == "crashed"


def test_oom_outranks_the_nccl_errors_it_causes(ctx):
    """One rank's OOM makes the others print NCCL errors; the root cause is the OOM."""
    r = diagnose(ctx, "cuda_oom_with_nccl_echo.log", exit_code=1)
    assert r.category == "cuda_oom"
    assert "nccl_or_distributed" in r.reasoning


def test_oom_remediation_halves_the_batch_through_the_knobs(ctx):
    """With the spec's knobs and the attempt's params, the fix is concrete and keeps the effective batch."""
    r = diagnose(ctx, "cuda_oom_hf_trainer.log", exit_code=1, params=PARAMS, knobs=KNOBS)
    assert r.remediation.changes == {"micro_batch": 16, "grad_accum": 2}
    assert r.remediation.factors == {"micro_batch": 0.5, "grad_accum": 2.0}
    one = diagnose(
        ctx,
        "cuda_oom_hf_trainer.log",
        exit_code=1,
        knobs=KNOBS,
        params={**PARAMS, "micro_batch": 1},
    )
    assert one.remediation.action == "stop" and one.retryable is False


def test_nan_remediation_lowers_the_learning_rate(ctx):
    """A diverged loss resumes with half the learning rate, named by the learning_rate knob."""
    r = diagnose(ctx, "nan_fairseq.log", exit_code=1, params=PARAMS, knobs=KNOBS)
    assert r.remediation.changes == {"lr": 0.005}


def test_device_side_assert_is_not_retried(ctx):
    """A kernel assertion is a bug in code or data: resuming would fail the same way."""
    r = diagnose(ctx, "cuda_device_side_assert.log", exit_code=1)
    assert r.category == "cuda_runtime_error"
    assert r.retryable is False and r.remediation.action == "stop"


def test_sigkill_without_evidence_is_killed(ctx):
    """A bare SIGKILL is evidence of a kill, not of who sent it: the OOM killer or a person."""
    for kw in ({"exit_code": -9}, {"exit_code": 137}, {"signal": 9}):
        r = diagnose(ctx, log_tail="step 100 loss 0.42\nstep 200 loss 0.31\n", **kw)
        assert r.category == "killed" and r.signal == 9
        assert "OOM killer" in r.reasoning and r.confidence == "medium"
        assert r.retryable and r.remediation.action == "resume"


def test_shell_killed_line_is_host_oom_at_medium_confidence(ctx):
    """bash's `Killed` report on a training run with no other error is, in the real logs, the
    kernel OOM killer (the maintainers' answer in every such thread of the corpus): host_oom, at
    medium confidence (the kernel log, when given, makes it high)."""
    r = diagnose(ctx, "host_oom_shell_killed.log", exit_code=137)
    assert r.category == "host_oom" and r.confidence == "medium"
    assert r.evidence[0].line_no == 4 and "OOM killer" in r.reasoning
    assert r.retryable and r.remediation.action == "resume"


def test_sigkill_with_an_oom_line_in_the_log_is_host_oom(ctx):
    """The kernel's OOM-killer line in the log itself turns the kill into host_oom."""
    log = (
        "Killed\n[2059991.491542] Out of memory: Killed process 25315 (python3) total-vm:"
        "53312244kB, anon-rss:31451456kB\n"
    )
    r = diagnose(ctx, log_tail=log, exit_code=137)
    assert r.category == "host_oom" and r.confidence == "high"
    assert "Out of memory: Killed process 25315" in r.evidence[0].text


def test_kernel_log_given_by_the_caller_explains_a_sigkill(ctx):
    """An OOM-killer line in the kernel log the caller read makes a SIGKILL host_oom; other kernel
    lines do not."""
    kmsg = (
        "[1.0] usb 1-1: new high-speed USB device\n"
        "[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB\n"
    )
    for kw in (
        {"log_tail": "step 10\n"},
        {"log_tail": "step 10\nKilled\n"},
        {
            "log_tail": "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: "
            "-9) local_rank: 0 (pid: 6914) of binary: /usr/bin/python3\n"
        },
    ):
        r = diagnose(ctx, exit_code=-9, kernel_log=kmsg, **kw)
        assert r.category == "host_oom", r.reasoning
        k = [e for e in r.evidence if e.source == "kernel_log"]
        assert k and k[0].line_no == 2 and "Killed process 698405" in k[0].text
    r = diagnose(ctx, log_tail="step 10\n", exit_code=-9, kernel_log="[1.0] usb 1-1: new device\n")
    assert r.category == "killed"


def test_kernel_log_reader_is_injectable_and_off_by_default(ctx, monkeypatch):
    """Nothing reads the kernel log unless a reader is installed; a failing reader is a note."""
    import nightshift.skills.diagnose_failure as mod

    assert mod.KERNEL_LOG_READER is None
    monkeypatch.setattr(
        mod,
        "KERNEL_LOG_READER",
        lambda: (
            "[5.1] Memory cgroup out of memory: Killed process 4182 (python) total-vm:812044kB\n"
        ),
    )
    assert diagnose(ctx, log_tail="step 1\n", signal=9).category == "host_oom"
    assert diagnose(ctx, log_tail="step 1\n", exit_code=1).category == "unknown"  # not a kill

    def broken() -> str:
        raise PermissionError("dmesg: read kernel buffer failed: Operation not permitted")

    monkeypatch.setattr(mod, "KERNEL_LOG_READER", broken)
    r = diagnose(ctx, log_tail="step 1\n", signal=9)
    assert r.category == "killed" and "kernel log could not be read" in r.reasoning


def test_launcher_exit_minus_9_is_killed(ctx):
    """torchrun reporting a worker's exit code -9 is a SIGKILL, whatever torchrun itself exits with."""
    log = (
        "step 120 loss 2.31\n"
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 "
        "(pid: 6914) of binary: /usr/bin/python3\nTraceback (most recent call last):\n"
        '  File "/usr/local/bin/torchrun", line 8, in <module>\n    sys.exit(main())\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    r = diagnose(ctx, log_tail=log, exit_code=1)
    assert r.category == "killed" and r.confidence == "high" and r.evidence[0].line_no == 2


def test_launcher_exit_minus_9_while_loading_the_model_is_host_oom(ctx):
    """The same -9 while the model is being read into host memory (fairscale's model-parallel
    setup, transformers' checkpoint shards) is most often the OOM killer."""
    for first in (
        "> initializing model parallel with size 1",
        "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]",
    ):
        log = (
            f"{first}\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
            "local_rank: 0 (pid: 6914) of binary: /usr/bin/python3\n"
        )
        r = diagnose(ctx, log_tail=log, exit_code=1)
        assert r.category == "host_oom" and r.confidence == "medium", first
        assert r.evidence[0].line_no == 2 and r.remediation.action == "resume"


def test_config_errors_are_not_retried(ctx):
    """argparse, nanoGPT's configurator and Hydra rejecting the run's arguments: stop and fix."""
    for log, code in (
        (
            "usage: train.py [-h] --name NAME\ntrain.py: error: the following arguments are "
            "required: --name\n",
            2,
        ),
        ("train.py: error: unrecognized arguments: --local_rank=0\n", 2),
        (
            'Traceback (most recent call last):\n  File "train.py", line 23, in <module>\n'
            "    exec(open('configurator.py').read()) # overrides from command line or config file\n"
            '  File "<string>", line 31, in <module>\nAssertionError\n',
            1,
        ),
        (
            "Could not override 'trainer.gpus'.\nTo append to your config use +trainer.gpus=0\n"
            "Key 'gpus' is not in struct\n    full_key: trainer.gpus\n",
            1,
        ),
    ):
        r = diagnose(ctx, log_tail=log, exit_code=code)
        assert r.category == "config_error", (log, r.reasoning)
        assert r.retryable is False and r.remediation.action == "stop" and r.evidence


def test_monitor_lost_and_diverged(ctx):
    """lost: the supervisor or machine went away (resume); diverged: the monitor's own NaN check,
    quoted from monitor_detail, with a lower learning rate."""
    lost = diagnose(ctx, log_tail="step 5 loss 1.0\n", monitor_says="lost")
    assert lost.category == "lost" and lost.retryable and lost.remediation.action == "resume"
    div = diagnose(
        ctx,
        log_tail="step 411 loss 2.1\n",
        exit_code=-15,
        monitor_says="diverged",
        monitor_detail="metrics diverged: loss is nan at step 412",
        params=PARAMS,
        knobs=KNOBS,
    )
    assert div.category == "nan_loss" and div.remediation.action == "resume_lower_lr"
    assert div.remediation.changes == {"lr": 0.005}
    assert div.evidence[0].source == "monitor" and div.evidence[0].line_no == 0
    assert "loss is nan at step 412" in div.evidence[0].text and "step 412" in div.reasoning
    # A preemption with the monitor's own words keeps its category and quotes them.
    pre = diagnose(
        ctx,
        log_tail="step 5\n",
        exit_code=-15,
        monitor_says="preempted",
        monitor_detail="spot instance reclaimed",
    )
    assert pre.category == "preempted" and pre.evidence[0].text == "spot instance reclaimed"


def test_clean_exit_is_succeeded_even_with_warnings(ctx):
    """Warnings, NCCL INFO chatter and a DeepSpeed overflow skip are not failures."""
    r = diagnose(ctx, "clean_run_with_warnings.log", exit_code=0)
    assert r.category == "succeeded" and r.retryable is False
    assert r.evidence == []


def test_warnings_without_an_exit_status_get_no_confident_category(ctx, tmp_path):
    """With no exit status, a log of warnings gets no confident (wrong) category; the trainer's
    own report that it finished makes it succeeded, at low confidence, unless an error follows."""
    r = diagnose(ctx, "clean_run_with_warnings.log")
    assert r.category == "succeeded" and r.confidence == "low"
    assert "train_runtime" in r.evidence[0].text
    lines = (LOGS / "clean_run_with_warnings.log").read_text().splitlines()
    cut = [line for line in lines if "train_runtime" not in line]
    (tmp_path / "cut.log").write_text("\n".join(cut) + "\n")
    # its end cut off: the log just stops (a hang by the rules; the log model, which may
    # overrule a low-confidence verdict, reads its words as a finished run's), low either way
    r = diagnose(ctx, str(tmp_path / "cut.log"))
    assert r.category in ("hang_or_timeout", "succeeded") and r.confidence == "low"
    after = lines + ["RuntimeError: something the trainer raised after its summary"]
    (tmp_path / "after.log").write_text("\n".join(after) + "\n")
    assert diagnose(ctx, str(tmp_path / "after.log")).category != "succeeded"


def test_nonzero_exit_with_nothing_in_the_log_is_unknown(ctx):
    """An unexplained failure is reported as unknown and not retried blindly."""
    r = diagnose(ctx, log_tail="step 10 loss 1.2\nstep 20 loss 1.1\n", exit_code=3)
    assert r.category == "unknown" and r.retryable is False


def test_monitor_verdicts_win(ctx):
    """preempted / stalled / timeout come from the monitor, and log evidence is still quoted."""
    assert (
        diagnose(ctx, log_tail="step 5\n", exit_code=-15, monitor_says="preempted").category
        == "preempted"
    )
    stalled = diagnose(ctx, "nccl_watchdog_timeout.log", exit_code=-9, monitor_says="stalled")
    assert stalled.category == "stalled" and stalled.retryable
    assert "nccl_or_distributed" in stalled.reasoning and stalled.evidence
    timeout = diagnose(ctx, log_tail="step 5\n", exit_code=-15, monitor_says="timeout")
    assert timeout.category == "timeout" and timeout.remediation.action == "stop"


def test_sigterm_without_monitor_is_preempted(ctx):
    """SIGTERM means someone asked the process to stop; with no error it is a preemption."""
    r = diagnose(ctx, log_tail="step 5 loss 1.0\n", exit_code=143)
    assert r.category == "preempted" and r.signal == 15


def test_driver_and_dmesg_one_liners(ctx):
    """Short real messages: cudaErrorInsufficientDriver, a cgroup OOM kill, NCCL's CUDA OOM."""
    # cuda-samples deviceQuery / any CUDA runtime call on an old driver.
    r = diagnose(
        ctx,
        log_tail="cudaGetDeviceCount returned 35\n-> CUDA driver version is "
        "insufficient for CUDA runtime version\nResult = FAIL\n",
        exit_code=1,
    )
    assert r.category == "driver_mismatch"
    # mm/oom_kill.c inside a memory cgroup (a container limit).
    r = diagnose(
        ctx,
        log_tail="[18492.104] Memory cgroup out of memory: Killed process 4182 "
        "(python) total-vm:812044kB, anon-rss:518420kB\n",
        exit_code=-9,
    )
    assert r.category == "host_oom" and r.confidence == "high"
    # NCCL reporting a CUDA allocation failure is an OOM, not a network problem.
    r = diagnose(
        ctx,
        log_tail="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/"
        "distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO "
        "for details), NCCL version 2.19.3\nncclUnhandledCudaError: Call to CUDA function "
        "failed.\nLast error:\nCuda failure 'out of memory'\n",
        exit_code=1,
    )
    assert r.category == "cuda_oom"


def test_log_text_is_data(ctx):
    """Text in the log that addresses the agent changes nothing: it is quoted, cleaned, and ignored."""
    r = diagnose(ctx, "crashed_with_instructions_in_log.log", exit_code=1)
    assert r.category == "crashed" and r.remediation.action == "resume"
    assert r.remediation.changes == {}
    assert all("\x1b" not in e.text for e in r.evidence)
    assert r.evidence[0].text.startswith("RuntimeError: stage failed.")


def test_log_tail_and_log_path_together_are_refused(ctx):
    """One log source per call, so evidence line numbers are unambiguous."""
    with pytest.raises(BadArguments):
        diagnose(ctx, "import_missing_module.log", log_tail="x", exit_code=1)


def test_missing_log_file_is_reported_not_raised(ctx, tmp_path):
    """A log that was never written still gets a verdict from the exit status."""
    r = run_skill(diagnose_failure, ctx, {"log_path": str(tmp_path / "nope.log"), "exit_code": -9})
    assert r.category == "killed" and "could not be read" in r.reasoning


def test_long_log_line_numbers_count_the_whole_file(ctx, tmp_path):
    """Only the tail of a big log is read, but evidence line numbers are the file's."""
    big = tmp_path / "big.log"
    with open(big, "w") as f:
        f.writelines(f"step {i} loss 0.5 lr 3e-4 tokens/s 81234.5\n" for i in range(300_000))
        f.write("ModuleNotFoundError: No module named 'flash_attn'\n")
    r = run_skill(diagnose_failure, ctx, {"log_path": str(big), "exit_code": 1})
    assert r.category == "import_or_env"
    assert r.evidence[0].line_no == 300_001


def _run_example(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAULT_")}
    return subprocess.run(
        [sys.executable, str(TRAIN), "--steps", "40", *args],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "category"),
    [
        (
            {"NIGHTSHIFT_FAULT_OOM_AT_STEP": "5", "NIGHTSHIFT_FAULT_OOM_ABOVE_BATCH": "16"},
            "cuda_oom",
        ),
        (
            {"NIGHTSHIFT_FAULT_NAN_AT_STEP": "5", "NIGHTSHIFT_FAULT_NAN_ABOVE_LR": "0.001"},
            "nan_loss",
        ),
        ({"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "5"}, "crashed"),
        ({"NIGHTSHIFT_FAULT_KILL_AT_STEP": "5"}, "killed"),
    ],
)
def test_the_example_faults_are_diagnosed(ctx, tmp_path, env, category):
    """The quickstart's injected faults, from a real process, land in the category recovery expects."""
    proc = _run_example(tmp_path, env)
    assert proc.returncode != 0
    r = diagnose(
        ctx,
        log_tail=proc.stdout + proc.stderr,
        exit_code=proc.returncode,
        params=PARAMS,
        knobs=KNOBS,
    )
    assert r.category == category, r.reasoning


# --- `nightshift diagnose LOGFILE` ----------------------------------------------------------------
def _audited_calls(home: Path, skill: str) -> list[AuditEvent]:
    with Store(f"sqlite:///{home / 'nightshift.db'}").session() as s:
        return list(
            s.exec(
                select(AuditEvent).where(
                    AuditEvent.skill == skill, AuditEvent.action == "skill.start"
                )
            )
        )


def test_cli_prints_the_verdict_with_numbered_evidence(home):
    """The command shows category, confidence, retryability, evidence with line numbers and the fix."""
    proc = nightshift("diagnose", str(LOGS / "cuda_oom_with_nccl_echo.log"), "--exit-code", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].startswith("cuda_oom  confidence high, retryable yes")
    assert "why: PyTorch ran out of GPU memory" in out
    assert "  6: [rank0]: torch.OutOfMemoryError: CUDA out of memory." in out  # rich markup escaped
    assert "remediation: resume_smaller_batch" in out
    calls = _audited_calls(home, "diagnose_failure")
    assert len(calls) == 1 and calls[0].call_id.startswith("cli-")
    assert calls[0].payload["args"]["exit_code"] == 1


def test_cli_json_is_the_result_model(home):
    """--json prints the skill's result model, with signals given as a negative exit code."""
    proc = nightshift(
        "diagnose", str(LOGS / "host_oom_shell_killed.log"), "--exit-code", "-9", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    r = DiagnoseFailureResult.model_validate_json(proc.stdout)
    assert r.category == "host_oom" and r.signal == 9 and r.evidence[0].line_no == 4


def test_cli_unknown_is_still_exit_zero(home):
    """A log with no recognised failure is reported as unknown, and that is not an error of the command."""
    proc = nightshift("diagnose", str(LOGS / "tf_startup_warnings.log"), "--exit-code", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("unknown  confidence low, retryable no")


def test_cli_missing_or_unreadable_file_exits_2_naming_it(home, tmp_path):
    """A log that is not there (or is a folder) is an operator error: exit 2 and the path."""
    missing = tmp_path / "nope.log"
    proc = nightshift("diagnose", str(missing), "--exit-code", "1")
    assert proc.returncode == 2 and str(missing) in proc.stderr
    proc = nightshift("diagnose", str(tmp_path))
    assert proc.returncode == 2 and str(tmp_path) in proc.stderr
    assert _audited_calls(home, "diagnose_failure") == []


# --- logs as people paste them (runtime/training/pasted_log.py) ---------------------------------
def test_pasted_quote_marks_are_read_through(ctx):
    """A log pasted behind markdown quote marks is matched on what it says."""
    r = diagnose(
        ctx,
        log_tail="> > ModuleNotFoundError: No module named 'apex'\n>> \n",
        exit_code=1,
    )
    assert r.category == "import_or_env"
    assert r.evidence[0].text == "> > ModuleNotFoundError: No module named 'apex'"


def test_pasted_colour_codes_and_their_remnants_are_dropped():
    assert pasted_log.normalise("\x1b[31mMemoryError\x1b[0m") == "MemoryError"
    assert pasted_log.normalise("[1;31mMemoryError[0m") == "MemoryError"
    assert pasted_log.normalise("^[[D^[[DKilled") == "Killed"
    assert pasted_log.normalise("[1mEpoch 3[m done") == "Epoch 3 done"
    # code that indexes with an `m...` name is not a colour code's remnant
    assert pasted_log.normalise("metric_value = metrics[metric_to_check]") == (
        "metric_value = metrics[metric_to_check]"
    )
    assert pasted_log.normalise("x = rows[m]") == "x = rows[m]"
    # a line pasted in Markdown bold reads as its words; bold inside a line stays
    assert pasted_log.normalise("**RuntimeError: out of memory**") == "RuntimeError: out of memory"
    assert pasted_log.normalise("x = a**2 + b**2") == "x = a**2 + b**2"


def test_pasted_timestamps_levels_and_rank_labels_are_taken_off():
    for line in (
        "2024-01-02 03:04:05,678 - ERROR - MemoryError",
        "[rank0]: MemoryError",
        "[default0]:MemoryError",
        "0: MemoryError",
        "E0302 19:39:39.186000 1 f.py:2] MemoryError",
        "2020-02-01 11:57:36.437688: E tensorflow/core/x.cc:81] MemoryError",
        "2023-01-25 00:21:09.074 | ERROR    | trainers.base:train:256 - MemoryError",
        "ERROR:root:MemoryError",
        "[1,0]<stderr>:MemoryError",
    ):
        assert pasted_log.normalise(line) == "MemoryError", line


def test_a_timestamp_takes_off_only_a_named_zone_after_it():
    """A platform's timestamp before a line (`docker logs -t`, `kubectl logs --timestamps`) comes
    off with a time zone's name after it, but never with the start of what follows: an
    exception (`OSError`), a level (`ERROR`) or a library's tag (`NCCL`)."""
    assert pasted_log.normalise("2024-05-01T12:00:00.123456789Z OSError: x not found.") == (
        "OSError: x not found."
    )
    assert pasted_log.normalise("2024-05-01 12:00:00,123 EOFError: Ran out of input") == (
        "EOFError: Ran out of input"
    )
    assert pasted_log.normalise("2024-05-01 12:00:00 NCCL WARN Call to connect failed") == (
        "NCCL WARN Call to connect failed"
    )
    assert pasted_log.normalise("[2024-05-01 12:00:00,123 CEST] NCCL WARN x") == "NCCL WARN x"
    assert pasted_log.normalise("2024-05-01 12:00:00 UTC+8 Killed") == "Killed"
    assert pasted_log.normalise("2024-05-01 12:00:00 ERROR:torch.x:failed") == "failed"
    # a glog line behind a timestamp or an indent is still at its level (informational)
    assert pasted_log.as_logged("  2024-05-01T12:00:00Z I0627 03:28:14.7 1 a.cpp:3] x") == (
        "I0627 03:28:14.7 1 a.cpp:3] x"
    )


def test_odd_blanks_entities_and_folds_read_as_the_plain_log(ctx):
    """What a web page, a chat or a forum leaves in a paste: no-break and ideographic spaces,
    tabs, HTML entities, a `<details>` fold around the log."""
    plain = "Epoch 3/50\n./train.sh: line 12: 40213 Killed                  python train.py\n"
    for pasted in (
        plain.replace("  ", "\u00a0 "),
        plain.replace(" Killed", "\tKilled"),
        plain.replace(" ", "\u3000", 1),
        "<details><summary>log</summary>\n\n```\n" + plain + "```\n</details>\n",
    ):
        assert diagnose(ctx, log_tail=pasted).category == "host_oom", repr(pasted)
    assert pasted_log.normalise("TypeError: &lt;class &#39;int&#39;&gt; is not iterable") == (
        "TypeError: <class 'int'> is not iterable"
    )
    assert pasted_log.normalise("</details>") == ""
    # an escaped quote mark is a quote mark; a coloured bar's closing reset is no reading of its own
    assert pasted_log.normalise("&gt; &gt; MemoryError") == "MemoryError"
    bar = "\x1b[32m 50%|#####     | 5/10 [00:01<00:01, 4.20it/s]\x1b[0m"
    assert pasted_log.primary(bar) == "50%|#####     | 5/10 [00:01<00:01, 4.20it/s]"


def test_pasted_timestamped_error_line_is_diagnosed(ctx):
    """An exception behind a logging prefix is still the exception (here: host memory)."""
    r = diagnose(ctx, log_tail="2024-01-02 03:04:05,678 - ERROR - MemoryError\n", exit_code=1)
    assert r.category == "host_oom" and r.evidence[0].line_no == 1


def test_pasted_progress_bar_redraws_are_all_read(ctx):
    """A tqdm line redrawn with carriage returns is one line of the file; its last segment is
    its reading, the earlier ones are scanned too, and a bar that runs into text is split."""
    assert pasted_log.segments("a 1%\rb 2%\rc 3%") == ["a 1%", "b 2%", "c 3%"]
    assert pasted_log.primary("x\r 50%|##  | 1/2 [00:01<00:01, 1.00it/s]Killed") == "Killed"
    r = diagnose(
        ctx,
        log_tail="start\nstep 1\rOSError: [Errno 28] No space left on device\rstep 3\ndone?\n",
        exit_code=1,
    )
    assert r.category == "disk_full" and r.evidence[0].line_no == 2


def test_pasted_wrapped_message_is_rejoined(ctx):
    """A long message a terminal broke over two lines is matched as one."""
    r = diagnose(
        ctx,
        log_tail="RuntimeError: Expected all tensors to be on the same device, CUDA out of mem\n"
        "ory. Tried to allocate 20.00 MiB\n",
        exit_code=1,
    )
    assert r.category == "cuda_oom" and r.evidence[0].line_no == 1


def test_pasted_windows_paths_read_with_forward_slashes():
    assert (
        pasted_log.normalise(r"  File C:\Users\me\torch\utils\data\dataloader.py, line 1")
        == "File C:/Users/me/torch/utils/data/dataloader.py, line 1"
    )
    assert pasted_log.windows_paths("a\\nb") == "a\\nb"  # no Windows path on the line: as is


# --- evidence across the whole log, and warnings that carry the cause ----------------------------
def test_no_space_left_in_a_warning_is_disk_full(ctx):
    """ENOSPC reported only in a logged warning is still a full disk."""
    r = diagnose(
        ctx,
        log_tail="step 900 loss 0.41\n2024-01-02 03:04:05,678 - WARNING - could not save "
        "checkpoint: [Errno 28] No space left on device\nstep 910 loss 0.40\n",
        exit_code=1,
    )
    assert r.category == "disk_full" and r.evidence[0].line_no == 2


def test_nan_loss_in_progress_lines_without_a_traceback_is_nan_loss(ctx):
    """A training loop's progress lines whose loss reads nan (insightface's, yolov7's NaN
    columns, both from the corpus's tuning logs), with no traceback."""
    r = diagnose(
        ctx,
        log_tail="Training: 2023-03-14 09:08:43,293-Speed 2178.40 samples/sec   Loss nan   "
        "LearningRate 0.001000\n",
    )
    assert r.category == "nan_loss" and r.confidence == "medium"
    rows = (
        "     41/299     65.1G       nan   0.01516         0       nan      1869       320\n"
        "     42/299     65.1G       nan    0.0151         0       nan      1963       320\n"
    )
    assert diagnose(ctx, log_tail=rows).category == "nan_loss"
    assert diagnose(ctx, log_tail=rows.split("\n")[0]).category != "nan_loss"  # one row: no


def test_nccl_warn_and_error_codes_are_nccl(ctx):
    """NCCL's WARN line and its error code returned up the call chain (`-> 2`), from the
    corpus's tuning logs, with no other error."""
    log = (
        "node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to "
        "10.0.0.4<56849> returned 113(No route to host) errno 115(Operation now in progress)\n"
        "node5:240:240 [6] NCCL INFO misc/socket.cc:570 -> 2\n"
        "node5:240:240 [6] NCCL INFO bootstrap.cc:285 -> 2\n"
    )
    r = diagnose(ctx, log_tail=log)
    assert r.category == "nccl_or_distributed" and r.evidence[0].line_no == 1
    r = diagnose(ctx, log_tail="x:1:1 [1] NCCL INFO init.cc:1089 -> 6\n")
    assert r.category == "nccl_or_distributed"


def test_image_library_cannot_read_file_before_a_crash_is_file_missing(ctx):
    """OpenCV's warning that it cannot read an image (then an empty image crashes the loader)."""
    log = (
        "[ WARN:0@3594.568] global /io/opencv/modules/imgcodecs/src/loadsave.cpp (239) "
        "findDecoder imread_('/data/seq//im1.png'): can't open/read file: check file "
        'path/integrity\nTraceback (most recent call last):\n  File "train.py", line 3\n'
        "AttributeError: 'NoneType' object has no attribute 'shape'\n"
    )
    r = diagnose(ctx, log_tail=log, exit_code=1)
    assert r.category == "file_missing" and r.evidence[0].line_no == 1


@pytest.mark.parametrize(
    "word", ["Killed", "Getötet", "已杀死", "Processus arrêté", "Terminado (killed)", "強制終了"]
)
def test_localised_shell_killed_is_host_oom(ctx, word):
    """The shell's word for a SIGKILLed child, as localised shells print it."""
    r = diagnose(ctx, log_tail=f"Writing metrics: /tmp/m.jsonl\n{word}\n")
    assert r.category == "host_oom" and r.evidence[0].line_no == 2


def test_state_dict_mismatch_is_crashed(ctx):
    """load_state_dict's missing / unexpected keys or shapes: the checkpoint does not fit."""
    for line in (
        "RuntimeError: Error(s) in loading state_dict for Net:",
        '\tMissing key(s) in state_dict: "fc.weight", "fc.bias".',
        '\tUnexpected key(s) in state_dict: "head.weight".',
        "\tsize mismatch for fc.weight: copying a param with shape torch.Size([10, 5]) from "
        "checkpoint, the shape in current model is torch.Size([2, 5]).",
    ):
        r = diagnose(ctx, log_tail=line + "\n")
        assert r.category == "crashed" and r.confidence == "high", line


@pytest.mark.parametrize(
    "log",
    [
        "slurmstepd: error: *** JOB 48213 ON gpu07 CANCELLED AT 2024-03-01T10:00:02 DUE TO TIME "
        "LIMIT ***",
        "=>> PBS: job killed: walltime 259217 exceeded limit 259200",
        "RuntimeError: DataLoader timed out after 5 seconds",
        "Timeout (0:30:00)!\nThread 0x00007f57caf71740 (most recent call first):\n"
        '  File "train.py", line 95 in synchronize',
        'Thread 46930 (idle): "MainThread"\n    wait (torch/utils/file_baton.py:42)',
        "Thread 0x00007f57caf71740 (most recent call first):\n"
        '  File "x/stage3.py", line 490 in _synchronize_communication',
    ],
)
def test_hang_or_timeout_from_what_the_tools_print(ctx, log):
    r = diagnose(ctx, log_tail=log + "\n")
    assert r.category == "hang_or_timeout", r.reasoning


def test_a_segfaults_thread_dump_is_not_a_hang(ctx):
    """faulthandler also dumps the threads on a fatal error: that is a crash."""
    log = (
        "Fatal Python error: Segmentation fault\n\n"
        'Thread 0x00007f57caf71740 (most recent call first):\n  File "x.py", line 9 in f\n'
    )
    assert diagnose(ctx, log_tail=log, exit_code=-11).category == "crashed"


def test_scancel_and_death_signals_are_killed(ctx):
    """A job the batch system cancelled (not at its time limit), and a launcher's death signal."""
    r = diagnose(
        ctx,
        log_tail="slurmstepd-localhost: error: *** STEP 204.0 ON localhost CANCELLED AT "
        "2021-02-13T16:38:01 ***\n",
    )
    assert r.category == "killed"
    r = diagnose(
        ctx,
        log_tail="W1130 12:13:49.388000 124326 torch/distributed/elastic/agent/server/api.py:723]"
        " Received 15 death signal, shutting down workers\n",
        signal=15,
    )
    assert r.category == "killed" and r.evidence[0].line_no == 1
    r = diagnose(ctx, log_tail="step 5\n", signal=1)
    assert r.category == "killed" and "SIGHUP" in r.reasoning


def test_a_paste_cut_at_a_frame_or_a_native_crash_that_says_where_reads_as_crashed(
    ctx, tmp_path, monkeypatch
):
    """No exit status: a traceback pasted from its first frame (header cut off) ending in an
    uncaught exception, or a native crash that says where (Python's fault handler), says it
    crashed (low); the shell's bare "Segmentation fault (core dumped)" says nothing of where or
    why: unknown, with how to find out."""
    frame = tmp_path / "frame.log"
    frame.write_text(
        '  File "/home/u/det/datasets/augmentation.py", line 113, in __call__\n'
        "    annots[:, :4] *= scale\n"
        "IndexError: too many indices for array: array is 1-dimensional, but 2 were indexed\n"
    )
    r = diagnose(ctx, str(frame))
    assert (r.category, r.confidence) == ("crashed", "low")
    native = tmp_path / "native.log"
    native.write_text("$ ./train --steps 100\nstep 1 loss 2.3\nSegmentation fault (core dumped)\n")
    # the rules' verdict (the log model may read such a log as a broken install: its reasoning
    # then quotes this one as "the signatures alone")
    monkeypatch.setattr(skill_module, "LOG_MODEL_LOADER", lambda: None)
    r = diagnose(ctx, str(native))
    assert (r.category, r.confidence) == ("unknown", "low")
    assert "Segmentation fault" in r.evidence[0].text and "faulthandler" in r.reasoning
    says_where = {
        # Python's fault handler, with the stack
        "Fatal Python error": "step 1 loss 2.3\nFatal Python error: Segmentation fault\n\n"
        'Current thread 0x7f (most recent call first):\n  File "/opt/lib/python3.10/site-'
        'packages/ext/ops.py", line 8 in knn\nSegmentation fault (core dumped)\n',
        # glibc's assert(): the file, the line and the function
        "Assertion `_data' failed": "0.170   Loading corpus corpus.txt...\nestimate-ngram: "
        "src/vector/DenseVector.tcc:406: void DenseVector<T>::_allocate() [with T = int]: "
        "Assertion `_data' failed.\n",
    }
    for where, text in says_where.items():
        native.write_text(text)
        r = diagnose(ctx, str(native))
        assert (r.category, r.confidence) == ("crashed", "low"), where
        assert where in r.evidence[0].text


@pytest.mark.parametrize(
    "line",
    [
        "error command \u201c/usr/bin/nvcc\u201d failed with exit status1",
        "error: command 'C:\\\\Program Files\\\\CUDA\\\\v10.0\\\\bin\\\\nvcc.exe' failed with exit "
        "status 2",
        "error: command '/usr/local/cuda/bin/nvcc' failed with exit status 1",
    ],
)
def test_nvcc_failing_in_any_quotes_is_an_extension_build(ctx, tmp_path, line):
    log = tmp_path / "build.log"
    log.write_text(f"running build_ext\nbuilding 'ext._C' extension\n{line}\n")
    assert diagnose(ctx, str(log), exit_code=1).category == "import_or_env"
