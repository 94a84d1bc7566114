"""A diagnosis that reads the machine, not only the log (issue 29): the run's cgroup at exit, the
kernel log since the attempt started (the OOM killer naming its pid, `NVRM: Xid` for its GPUs),
free space on its folders' filesystems and non-finite recorded metrics, each kept with its
source — so a SIGKILL is host_oom when the kernel or the cgroup says so, and `killed` only when
nothing does.

The first test is real: a run in a cgroup with a small memory limit, killed by the kernel, and a
run killed with kill -9 by a person, through the CLI and the daemon's loop (root and the cgroup
v1 memory controller here; skipped elsewhere, a failure under CI=true). The others feed the loop
recorded kernel lines, a nearly full filesystem and non-finite metrics through the injectable
readers, with an executor that only reports how its run ended."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_run_cgroups import kernel_cgroups  # noqa: F401 - the fixture

from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.executors import supervise
from nightshift.runtime.executors.executor import RunStatus
from nightshift.runtime.store.db import Attempt, GpuSample, Job, MetricPoint, Store
from nightshift.runtime.training import machine_evidence
from nightshift.runtime.training.attempt_diagnosis import Diagnosis
from nightshift.skills.attempt_diagnosis import diagnose_attempt

from conftest import REPO, nightshift

GREEDY = "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
WAITS = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


def _spec(tmp_path: Path, name: str, command: list[str], **resources: object) -> Path:
    spec = tmp_path / f"{name}.yaml"
    body: dict = {"name": name, "command": command, "retries": 0}
    if resources:
        body["resources"] = resources
    spec.write_text(yaml.safe_dump(body))
    return spec


def test_the_kernel_s_oom_kill_is_host_oom_and_a_person_s_kill_9_stays_killed(
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kernel_cgroups: None,  # noqa: F811
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__CGROUPS", "required")
    pid_file = tmp_path / "waits.pid"
    specs = [
        _spec(tmp_path, "greedy", ["{python}", "-c", GREEDY], host_memory_gb=0.125),
        _spec(tmp_path, "waits", ["{python}", "-c", WAITS, str(pid_file)]),
    ]
    steps: list[dict] = [{"skill": "submit_job", "args": {"spec_path": str(s)}} for s in specs]
    steps += [{"watch": 1}, {"watch": 2}]
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"name": "machine", "steps": steps}))
    cli = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.entry", "run", str(goal)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert cli.poll() is None and time.monotonic() < end, cli.stdout and cli.stdout.read()
            time.sleep(0.1)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # a person's kill -9
        out, _ = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()

    shown = json.loads(nightshift("show", "1", "--json").stdout)
    oom = shown["attempts"][0]["diagnosis"]
    assert oom["category"] == "host_oom", (oom, out)
    cgroup = [m for m in oom["machine"] if m["source"] == "cgroup"]
    assert cgroup and re.match(r"memory cgroup \(v1\): oom_kill [1-9]", cgroup[0]["text"]), oom
    assert {"source": "exit_status", "line_no": 0, "text": "the process was ended by SIGKILL"} in (
        oom["machine"]
    )
    why = nightshift("why", "1")
    assert why.returncode == 0, why.stderr
    assert "host_oom" in why.stdout and "machine, cgroup: memory cgroup" in why.stdout, why.stdout

    killed = json.loads(nightshift("show", "2", "--json").stdout)["attempts"][0]["diagnosis"]
    assert killed["category"] == "killed", (killed, out)
    assert any(m["source"] == "cgroup" and "oom_kill 0" in m["text"] for m in killed["machine"]), (
        killed
    )
    assert "counted no OOM kill" in killed["summary"]
    show = nightshift("show", "2")
    assert "machine, exit_status: the process was ended by SIGKILL" in show.stdout, show.stdout


# --------------------------------------------------------------------- the loop, fed recorded
class EndsAs:
    """An executor whose run has ended as `status` says (nothing runs)."""

    kind = "local"

    def __init__(self, status: RunStatus) -> None:
        self.status = status

    def start(self, req):
        return {"kind": "local", "pid": 4100}

    def poll(self, handle):
        return self.status

    def cleanup(self, handle, grace_s=0):
        return []


KERNEL = """\
[ 9001.100] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
[ 9001.200] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=python,pid={pid},uid=1000
[ 9001.300] Out of memory: Killed process {pid} (python) total-vm:41913324kB, anon-rss:31987704kB, file-rss:4kB, shmem-rss:0kB, UID:1000 pgtables:63016kB oom_score_adj:0
[ 9002.000] NVRM: Xid (PCI:0000:3b:00): 79, pid=4321, GPU has fallen off the bus.
"""


def _loop(tmp_path: Path, status: RunStatus, before_end=None) -> Diagnosis:
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    engine = Engine(
        store,
        EndsAs(RunStatus(state="running")),  # type: ignore[arg-type]
        Settings(home=str(tmp_path)),
        diagnose=diagnose_attempt,
    )
    with store.session() as s:
        s.add(Job(name="j", spec={"name": "j", "command": ["true"]}))
    engine.tick()  # starts it
    if before_end is not None:
        before_end(store, store.attempts(1)[0])
    engine.executor = EndsAs(status)  # type: ignore[assignment]
    engine.tick()  # sees it end
    att = store.attempts(1)[0]
    assert att.outcome == "failed", att
    found = Diagnosis.stored(att.diagnosis)
    assert found is not None, att.diagnosis
    return found


def sources(d: Diagnosis) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in d.machine:
        out.setdefault(m["source"], []).append(m["text"])
    return out


def test_an_oom_killer_line_naming_the_run_s_pid_makes_a_sigkill_host_oom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[float] = []

    def kernel(since: float) -> str:
        asked.append(since)
        return KERNEL.format(pid=5151)

    monkeypatch.setattr(machine_evidence, "KERNEL_LOG_READER", kernel)
    d = _loop(tmp_path, RunStatus(state="exited", signal=9, pid=5151))
    assert (d.category, d.confidence, d.source) == ("host_oom", "high", "kernel_log")
    assert "Out of memory: Killed process 5151" in (d.evidence or "")
    assert d.where() == "kernel log line 3"
    assert any("Killed process 5151" in t for t in sources(d)["kernel_log"])
    assert sources(d)["exit_status"] == ["the process was ended by SIGKILL"]
    # read since the attempt started (a second's margin), not the whole boot
    assert len(asked) == 1 and abs(asked[0] - time.time()) < 120


def test_an_oom_kill_of_another_process_leaves_a_sigkill_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine_evidence, "KERNEL_LOG_READER", lambda since: KERNEL.format(pid=7))
    d = _loop(tmp_path, RunStatus(state="exited", signal=9, pid=5151))
    assert d.category == "killed", d
    assert "kernel_log" not in sources(d)
    assert "names none of its processes" in d.summary


def test_an_unreadable_kernel_log_leaves_a_sigkill_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(since: float) -> str:
        raise PermissionError("dmesg_restrict")

    monkeypatch.setattr(machine_evidence, "KERNEL_LOG_READER", broken)
    d = _loop(tmp_path, RunStatus(state="exited", signal=9, pid=5151))
    assert d.category == "killed", d
    assert "the kernel log could not be read (PermissionError)" in d.summary


def test_a_cgroup_that_counted_an_oom_kill_makes_a_sigkill_host_oom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(since: float) -> str:
        raise AssertionError("the cgroup said it: no kernel log is read")

    monkeypatch.setattr(machine_evidence, "KERNEL_LOG_READER", never)
    counters = {"version": 2, "oom_kills": 2, "peak_bytes": 1 << 30, "limit_bytes": 1 << 30}
    d = _loop(tmp_path, RunStatus(state="exited", signal=9, pid=5151, cgroup_memory=counters))
    assert (d.category, d.source) == ("host_oom", "cgroup")
    assert sources(d)["cgroup"] == ["memory cgroup (v2): oom_kill 2, peak 1 GiB of its limit 1 GiB"]
    assert d.where() == "the run's cgroup"


def test_an_xid_on_the_attempt_s_gpu_is_a_gpu_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine_evidence, "KERNEL_LOG_READER", lambda since: KERNEL.format(pid=1))

    def on_gpu(bus: str):
        def put(store: Store, att: Attempt) -> None:
            with store.session() as s:
                row = s.get(Attempt, att.id)
                row.gpus = [0]
                s.add(row)
                s.add(
                    GpuSample(
                        host=Settings(home=str(tmp_path)).node,
                        gpu_index=0,
                        verdict="OK",
                        data={"index": 0, "pci_bus_id": bus},
                    )
                )

        return put

    d = _loop(tmp_path, RunStatus(state="exited", exit_code=1), on_gpu("00000000:3B:00.0"))
    assert (d.category, d.source) == ("cuda_runtime_error", "gpu_xid"), d
    assert "Xid (PCI:0000:3b:00): 79" in (d.evidence or "") and d.where() == "kernel log line 4"
    assert "fallen off the bus" in d.summary

    other = tmp_path / "other"
    other.mkdir()
    d = _loop(other, RunStatus(state="exited", exit_code=1), on_gpu("00000000:AF:00.0"))
    assert d.category == "unknown" and "gpu_xid" not in sources(d), d


def test_a_nearly_full_filesystem_is_disk_full_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def statvfs(path: str):
        return SimpleNamespace(
            f_bavail=100, f_frsize=1 << 20, f_blocks=200_000, f_fsid=1
        )  # 100 MiB of 195 GiB

    monkeypatch.setattr(machine_evidence, "STATVFS", statvfs)
    d = _loop(tmp_path, RunStatus(state="exited", exit_code=1))
    assert (d.category, d.source, d.confidence) == ("disk_full", "disk", "medium"), d
    assert sources(d)["disk"] == [
        f"job folder {tmp_path / 'runs' / 'job-1'}: 100 MiB free of 195 GiB (0.05 %) at exit"
    ]

    roomy = tmp_path / "roomy"
    roomy.mkdir()
    monkeypatch.setattr(
        machine_evidence,
        "STATVFS",
        lambda p: SimpleNamespace(f_bavail=500, f_frsize=1 << 20, f_blocks=1000, f_fsid=2),
    )  # a small filesystem half free: not full, although under 1 GiB
    d = _loop(roomy, RunStatus(state="exited", exit_code=1))
    assert d.category == "unknown" and "disk" not in sources(d), d


def test_non_finite_recorded_metrics_are_nan_loss_evidence(tmp_path: Path) -> None:
    def diverged(store: Store, att: Attempt) -> None:
        with store.session() as s:
            for step, value in ((10, 2.5), (20, None), (30, None)):  # the store's NaN is NULL
                s.add(
                    MetricPoint(
                        attempt_id=att.id, job_id=att.job_id, step=step, name="loss", value=value
                    )
                )

    d = _loop(tmp_path, RunStatus(state="exited", exit_code=1), diverged)
    assert (d.category, d.source) == ("nan_loss", "metrics"), d
    assert sources(d)["metrics"] == ["loss = non-finite at step 20 (and 1 more)"]


# ----------------------------------------------------------------------------- the readers
def test_the_supervisor_reads_the_cgroup_s_memory_counters(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v1 / "memory.max_usage_in_bytes").write_text("134217728\n")
    (v1 / "memory.limit_in_bytes").write_text("134217728\n")
    (v1 / "memory.failcnt").write_text("57\n")
    assert supervise.cgroup_memory([str(tmp_path / "cpu"), str(v1)]) == {
        "version": 1,
        "oom_kills": 3,
        "peak_bytes": 134217728,
        "limit_bytes": 134217728,
        "failcnt": 57,
    }
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text(
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"
    )
    (v2 / "memory.peak").write_text("1073741824\n")
    (v2 / "memory.max").write_text("max\n")
    assert supervise.cgroup_memory([str(v2)]) == {
        "version": 2,
        "oom_kills": 1,
        "peak_bytes": 1073741824,
    }
    assert supervise.cgroup_memory([str(tmp_path / "none")]) is None


def test_the_kernel_log_is_read_with_an_argv_since_the_start_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []

    def run(argv, **kw):
        calls.append(argv)
        assert "shell" not in kw and kw["timeout"] <= 5
        return SimpleNamespace(returncode=0, stdout="x" * (1 << 20) + "\nlast line")

    monkeypatch.setattr(machine_evidence.shutil, "which", lambda name: "/usr/bin/journalctl")
    monkeypatch.setattr(machine_evidence.subprocess, "run", run)
    text = machine_evidence.read_kernel_log(1_700_000_000.7)
    assert calls == [
        [
            "/usr/bin/journalctl",
            "-k",
            "-q",
            "--no-pager",
            "-o",
            "short",
            "--since",
            "@1700000000",
            "-n",
            "5000",
        ]
    ]
    assert text is not None and len(text) <= machine_evidence.MAX_KERNEL_CHARS
    assert text.endswith("last line")
    # Only the lines that may matter are kept, numbered as read.
    kept = machine_evidence.kernel_lines("a\nb\n" + KERNEL.format(pid=3) + "usb 1-1: new device\n")
    assert [k.line_no for k in kept] == [3, 4, 5, 6]


def test_the_real_kernel_log_reader_ends_quickly_here() -> None:
    """Whatever this machine allows (journalctl, /dev/kmsg, neither): an answer, not a hang."""
    started = time.monotonic()
    text = machine_evidence.read_kernel_log(time.time() - 60)
    assert text is None or len(text) <= machine_evidence.MAX_KERNEL_CHARS
    assert time.monotonic() - started < 10
