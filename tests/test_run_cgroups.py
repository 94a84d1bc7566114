"""Each local run in a cgroup of its own, on this machine's real kernel (root, cgroup v1): the
memory limit a spec declares kills the run, not the machine, and the run's record and log say so
in the words diagnose_failure reads; a CPU limit holds a busy run to its share; a process that
left the run's group, started its own session and dropped the env marker is still found and
stopped — which, without the cgroup, it is not. The v2 layout is checked on a stand-in folder
(no v2 memory controller can be had here)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_multi_user import unavailable

from nightshift.runtime.executors import run_cgroup
from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.runtime.executors.local_executor import LocalExecutor
from nightshift.skills.diagnose_failure import DiagnoseFailureInput, diagnose_failure


@pytest.fixture
def kernel_cgroups() -> None:
    if os.geteuid() != 0:
        unavailable("making a run's cgroup needs root")
    try:
        run_cgroup.make(f"probe.{os.getpid()}", run_cgroup.CgroupLimits()).remove()
    except run_cgroup.CgroupUnavailable as exc:
        unavailable(f"no cgroup can be made here: {exc}")


def _request(tmp_path: Path, key: str, code: str, **kw: object) -> LaunchRequest:
    return LaunchRequest(
        key=key,
        argv=[sys.executable, "-c", code],
        cwd=str(tmp_path),
        log_path=str(tmp_path / f"{key}.log"),
        **kw,
    )


def _wait_exit(ex: LocalExecutor, handle: dict, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while (status := ex.poll(handle)).state == "running":
        assert time.monotonic() < end, "the run did not end"
        time.sleep(0.1)
    return status


def test_the_memory_limit_kills_the_run_and_says_so(tmp_path: Path, kernel_cgroups: None) -> None:
    ex = LocalExecutor(tmp_path / "runs", cgroups="required")
    # 128 MiB allowed; the run touches 512 MiB.
    code = "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
    handle = ex.start(_request(tmp_path, "greedy", code, memory_gb=0.125))
    assert handle["cgroup"]["dirs"], handle
    status = _wait_exit(ex, handle)
    assert status.signal == 9, status
    assert "Memory cgroup out of memory" in (status.detail or ""), status
    log = (tmp_path / "greedy.log").read_text()
    assert "survived" not in log
    found = diagnose_failure.fn(None, DiagnoseFailureInput(log_tail=log, signal=status.signal))
    assert found.category == "host_oom", (found, log)
    # The supervisor removed the emptied cgroup on its way out.
    assert not any(Path(d).exists() for d in handle["cgroup"]["dirs"])


def test_a_cpu_limit_holds_a_busy_run_to_its_share(tmp_path: Path, kernel_cgroups: None) -> None:
    ex = LocalExecutor(tmp_path / "runs", cgroups="required")
    # Spins for 3 s of wall time and prints the CPU time it got (its own count, from the kernel).
    code = (
        "import time\nend = time.monotonic() + 3\n"
        "while time.monotonic() < end: pass\n"
        "print(time.process_time())"
    )
    handle = ex.start(_request(tmp_path, "busy", code, cpus=0.25))
    assert _wait_exit(ex, handle).exit_code == 0
    cpu_s = float((tmp_path / "busy.log").read_text().split()[-1])
    assert cpu_s < 1.2, f"{cpu_s:.2f} s of CPU in 3 s under a quarter-core limit"


ESCAPEE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # No group, no session, no marker: a sleeper only the kernel's cgroup list still knows.
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], {})
    os._exit(0)
open(sys.argv[1], "w").write("forked")
time.sleep(600)
"""


@pytest.mark.parametrize("cgroups", ["required", "off"])
def test_a_run_that_left_its_session_is_still_stopped(
    tmp_path: Path, kernel_cgroups: None, cgroups: str
) -> None:
    ex = LocalExecutor(tmp_path / "runs", cgroups=cgroups)  # type: ignore[arg-type]
    flag = tmp_path / "forked"
    req = _request(tmp_path, f"escape-{cgroups}", ESCAPEE)
    req.argv += [str(flag)]
    handle = ex.start(req)
    end = time.monotonic() + 30
    while not flag.exists():
        assert time.monotonic() < end
        time.sleep(0.05)
    time.sleep(0.3)  # the grandchild has exec'd
    sleepers = [
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if p.info["cmdline"]
        and "time.sleep(600)" in p.info["cmdline"][-1]
        and not p.info["environ"]
    ]
    assert len(sleepers) == 1, sleepers
    ex.stop(handle, grace_s=1)
    time.sleep(0.2)
    escaped = sleepers[0].is_running() and sleepers[0].status() != psutil.STATUS_ZOMBIE
    try:
        # With its cgroup the run is stopped whole; without it, this one is never found.
        assert escaped == (cgroups == "off")
    finally:
        if sleepers[0].is_running():
            sleepers[0].kill()
    if cgroups == "required":
        assert not any(Path(d).exists() for d in handle["cgroup"]["dirs"])


def test_the_v2_layout_moves_the_daemon_to_a_leaf_and_writes_the_limits(tmp_path: Path) -> None:
    """A stand-in for a v2 mount: the daemon's service cgroup holds processes, so it moves them
    to `daemon/` before handing its controllers down, and the run's folder gets its limits."""
    fs = tmp_path / "cgroup"
    service = fs / "system.slice" / "nightshift.service"
    service.mkdir(parents=True)
    (fs / "cgroup.controllers").write_text("cpu memory pids\n")
    (service / "cgroup.procs").write_text("4242\n")
    proc_self = tmp_path / "self-cgroup"
    proc_self.write_text("0::/system.slice/nightshift.service\n")
    cg = run_cgroup.make(
        "abc.attempt-1",
        run_cgroup.CgroupLimits(memory_bytes=1 << 30, cpus=1.5, pids=512),
        fs_root=fs,
        proc_self=proc_self,
    )
    run = service / "nightshift" / "abc.attempt-1"
    assert cg.version == 2 and cg.dirs == (str(run),) and cg.homes == (str(service / "daemon"),)
    assert (service / "daemon" / "cgroup.procs").read_text() == "4242"
    assert (service / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (run / "memory.max").read_text() == str(1 << 30)
    assert (run / "cpu.max").read_text() == "150000 100000"
    assert (run / "pids.max").read_text() == "512"
