"""GPU health on a Ray cluster: nvidia-smi run on every GPU node, judged here like a local probe.

The daemon of a Ray cluster does not sit on the GPUs' machines. One Ray job (through the same
Jobs API the executor uses) runs a small driver on the head; the driver starts one task per alive
node that has GPUs, pinned to that node (`NodeAffinitySchedulingStrategy`, not soft, no CPU or GPU
reserved, so it runs beside training), and each task runs the nvidia-smi commands it is given, as
argv lists with a timeout, and sends back their exit codes and output. The driver prints one
marked JSON line per node; nothing else of its output is read.

The outputs are replayed through `NvidiaSmiProbe`, the probe a local daemon uses, so a node's GPUs
are read, fall back for an older driver and are reported lost exactly as local ones. When the
probe asks for a command the task did not run (an older driver refused a field), the census runs
again with it, a bounded number of rounds. Nodes are named `ray:<node IP>`, the address Ray pins
work to (`node:<IP>`). Only nvidia-smi runs on the nodes: nightshift need not be installed there.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable

from pydantic import BaseModel

from nightshift.runtime.gpu.gpu import QUERY_GPU_FIELDS, NvidiaSmiProbe, ProbeResult

HOST_PREFIX = "ray:"  # hosts of a Ray cluster in GPU samples and attempts: "ray:10.0.0.5"
MARK = "nightshift-census "
MAX_ROUNDS = 3

# Run by the cluster's Python on the head, as the Ray job's driver. It reads one JSON argument:
# the commands (argv lists) and the timeout of each. Constant: nothing of it comes from input.
DRIVER = r"""
import json, subprocess, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

def run_all(argvs, timeout_s):
    out = []
    for argv in argvs:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
            out.append([p.returncode, p.stdout, p.stderr])
        except subprocess.TimeoutExpired:
            out.append([124, "", "timed out after %s s" % timeout_s])
        except OSError as exc:
            out.append([127, "", str(exc)])
    return out

args = json.loads(sys.argv[1])
ray.init(logging_level="ERROR", log_to_driver=False)
task = ray.remote(num_cpus=0)(run_all)
refs = {}
for n in ray.nodes():
    if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0:
        where = NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
        refs[n["NodeManagerAddress"]] = task.options(scheduling_strategy=where).remote(
            args["argvs"], args["timeout_s"]
        )
for ip, ref in sorted(refs.items()):
    try:
        line = {"ip": ip, "results": ray.get(ref, timeout=args["wait_s"])}
    except Exception as exc:
        line = {"ip": ip, "error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}
    print("nightshift-census " + json.dumps(line), flush=True)
"""


class NodeOutput(BaseModel):
    """What one node's task sent back: each command's (exit code, stdout, stderr), or why not."""

    ip: str
    results: list[tuple[int, str, str]] | None = None
    error: str | None = None


def driver_argv(python: str, argvs: list[list[str]], timeout_s: float) -> list[str]:
    """The census job's command: the constant driver and one JSON argument."""
    arg = {"argvs": argvs, "timeout_s": timeout_s, "wait_s": timeout_s * len(argvs) + 60}
    return [python, "-c", DRIVER, json.dumps(arg)]


def parse_output(log: str) -> list[NodeOutput]:
    """The marked lines of the driver's log; any other line (Ray's own) is ignored."""
    out = []
    for line in log.splitlines():
        if line.startswith(MARK):
            try:
                out.append(NodeOutput.model_validate(json.loads(line[len(MARK) :])))
            except ValueError:
                continue
    return out


class _Replay:
    """A runner for NvidiaSmiProbe that answers from what a node's task ran; an argv it did not
    run is noted for the next round and fails like a command that could not start."""

    def __init__(self, ran: dict[str, tuple[int, str, str]]):
        self.ran = ran
        self.missed: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        got = self.ran.get(shlex.join(argv))
        if got is None:
            self.missed.append(argv)
            raise OSError("not run on the node yet")
        return got


class RayGpuCensus:
    """Reads every GPU node of a Ray cluster: `read_hosts()` → {"ray:<IP>": ProbeResult}."""

    name = "ray-census"

    def __init__(
        self,
        run: Callable[[list[str], float], str],
        executable: str = "nvidia-smi",
        timeout_s: float = 15.0,
        python: str = sys.executable,
    ):
        """`run(argv, timeout_s)` runs the driver as a Ray job and returns its log (the Ray
        executor's `run_driver`); `executable` is nvidia-smi's name on the nodes."""
        self.run = run
        self.executable = executable
        self.timeout_s = timeout_s
        self.python = python

    def read_hosts(self) -> dict[str, ProbeResult]:
        probe = NvidiaSmiProbe(self.executable, self.timeout_s)
        # the default table too: its header has the CUDA version the node's driver supports
        argvs = [probe.query_argv(list(QUERY_GPU_FIELDS)), probe.apps_argv(), [self.executable]]
        ran: dict[str, dict[str, tuple[int, str, str]]] = {}
        errors: dict[str, str] = {}
        results: dict[str, ProbeResult] = {}
        for _ in range(MAX_ROUNDS):
            log = self.run(driver_argv(self.python, argvs, self.timeout_s), self._job_wait_s(argvs))
            for node in parse_output(log):
                if node.results is None:
                    errors[node.ip] = node.error or "no answer"
                    continue
                errors.pop(node.ip, None)
                got = ran.setdefault(node.ip, {})
                for argv, res in zip(argvs, node.results, strict=False):
                    got[shlex.join(argv)] = res
            missed: list[list[str]] = []
            for ip, got in ran.items():
                replay = _Replay(got)
                results[HOST_PREFIX + ip] = NvidiaSmiProbe(
                    self.executable, self.timeout_s, runner=replay
                ).read()
                missed += [a for a in replay.missed if a not in missed]
            if not missed:
                break
            argvs = missed
        for ip, why in errors.items():
            results.setdefault(
                HOST_PREFIX + ip,
                ProbeResult(backend="nvidia-smi", error=f"the node's census task failed: {why}"),
            )
        return results

    def _job_wait_s(self, argvs: list[list[str]]) -> float:
        return self.timeout_s * len(argvs) + 120.0
