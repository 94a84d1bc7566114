"""A gang on a real two-node Ray cluster on this one machine: the check the tests cannot make.

    python -m nightshift.evals.ray_gang_check     # needs `ray[default]` and torch (CPU is enough)

Ray joins a second node only at a cluster address that is not loopback (`ray start --address`
rewrites 127.0.0.1 to the interface's address), and the tests may talk to loopback only
(tests/loopback_guard.py), so tests/test_gang_placement.py runs its gang on the test head's one
node. This script starts a head and a second node on the machine's interface address (one CPU,
two logical GPUs each; usage statistics off), runs a 4-GPU gang of two ranks x 2 GPUs through
`RayExecutor` as the daemon would, and prints what each rank saw: its rank, the rendezvous and
its GPUs, the all-reduced sum (3 when both met), and the Ray node each ran on (two different
ones: one worker per node). Every process it started is stopped by PID at the end (a marker in
their environment), never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nightshift.runtime.executors.executor import HostGpus, LaunchRequest, gang_host
from nightshift.runtime.executors.ray_executor import RayExecutor

MARK = "NIGHTSHIFT_GANG_CHECK"
RANK_PROGRAM = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
x = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(x)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "master",
      os.environ["MASTER_ADDR"] + ":" + os.environ["MASTER_PORT"], "GPUs",
      os.environ.get("CUDA_VISIBLE_DEVICES"), "sum", int(x.item()), flush=True)
"""


def interface_ip() -> str:
    """This machine's address on its network interface (a UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.254.254.254", 9))  # any routable address: the route picks the interface
        return str(s.getsockname()[0])


def free_port() -> int:
    """A free port above Ray's worker range (10002-19999)."""
    while True:
        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if port >= 20000:
            return port


def marked(marker: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{MARK}={marker}".encode() in env:
            out.append(int(pid))
    return out


def main() -> int:
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        print("the `ray` command is not on PATH: pip install 'nightshift[ray]'")
        return 2
    from ray.job_submission import JobSubmissionClient

    ip = interface_ip()
    temp = Path(tempfile.mkdtemp(prefix="nsgang-", dir="/tmp"))
    home = temp / "home"
    home.mkdir()
    (home / "ray_bootstrap_config.yaml").write_text("{}\n")  # no cloud metadata lookups
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env |= {MARK: temp.name, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}  # else `ray start` refuses a second node
    ports = {
        "--port": free_port(),
        "--dashboard-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--ray-client-server-port": free_port(),
    }
    node = [f"--node-ip-address={ip}", "--num-cpus=1", "--num-gpus=2", "--disable-usage-stats"]
    node.append("--object-store-memory=100000000")
    head = [ray, "start", "--head", f"--dashboard-host={ip}", "--include-dashboard=true"]
    head += [f"--temp-dir={temp}", *(f"{k}={v}" for k, v in ports.items()), *node]
    try:
        for cmd in (head, [ray, "start", f"--address={ip}:{ports['--port']}", *node]):
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=180, start_new_session=True
            )
            if done.returncode != 0:
                print(f"`{' '.join(cmd[:3])}` failed:\n{done.stderr[-2000:]}")
                return 1
        address = f"http://{ip}:{ports['--dashboard-port']}"
        for _ in range(120):  # the Jobs API answers a little after `ray start` returns
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(1)
        work = temp / "work"
        work.mkdir()
        (work / "rank.py").write_text(RANK_PROGRAM)
        ranks = [HostGpus(host=f"ray:{ip}", gpus=[0, 1]), HostGpus(host=f"ray:{ip}", gpus=[0, 1])]
        req = LaunchRequest(
            key="attempt-gang-check",
            argv=[sys.executable, str(work / "rank.py")],
            cwd=str(work),
            log_path=str(work / "attempt.log"),
            gpus=[0, 1, 0, 1],
            host=gang_host(ranks),
            ranks=ranks,
        )
        ex = RayExecutor(work / "runs", address=address, num_cpus=0)
        started = time.monotonic()
        handle = ex.start(req)
        while (status := ex.poll(handle)).state == "running":
            if time.monotonic() - started > 300:
                ex.stop(handle)
                break
            time.sleep(1)
        print(
            f"gang: {status.state}, exit code {status.exit_code}, "
            f"{time.monotonic() - started:.0f} s; attempt host {req.host}"
        )
        client = JobSubmissionClient(address)
        for r, sid in enumerate([handle["submission_id"], *handle["ranks"]]):
            log = work / ("attempt.log" if r == 0 else f"attempt.log.rank{r}")
            said = [line for line in log.read_text().splitlines() if line.startswith("rank ")]
            info = client.get_job_info(sid)
            print(f"rank {r}: Ray job {sid} on node {str(info.driver_node_id)[:12]}: {said}")
        return 0 if (status.state, status.exit_code) == ("exited", 0) else 1
    finally:
        for pid in marked(temp.name):
            try:
                os.kill(pid, signal.SIGKILL)  # what `ray stop --force` sends, to ours only
            except OSError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
