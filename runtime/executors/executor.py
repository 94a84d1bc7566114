"""One interface for every place a run can execute: local process, Docker, Kubernetes, Ray.

A handle is plain JSON stored with the attempt, so a process that did not start the run can
poll, stop or re-attach to it. `start` is idempotent on `key`: starting the same key twice
returns the first run's handle instead of launching again.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from nightshift.runtime.executors.submitter import RunAs

GANG_SEP = "+"  # between the hosts of a run placed across hosts: "ray:10.0.0.5/4+ray:10.0.0.6/2"


class HostGpus(BaseModel):
    """One host of a run placed across hosts (a gang), and its own GPU indices."""

    host: str
    gpus: list[int]


def gang_host(ranks: list[HostGpus]) -> str:
    """The one host text an attempt keeps for a gang: each host with its GPU count, in rank
    order ("ray:10.0.0.5/4+ray:10.0.0.6/2"); the GPU indices follow in `gpus`, in that order.
    One host: its name, as for any run."""
    if len(ranks) == 1:
        return ranks[0].host
    return GANG_SEP.join(f"{r.host}/{len(r.gpus)}" for r in ranks)


def gang_ranks(host: str, gpus: list[int]) -> list[HostGpus]:
    """`gang_host` read back: the hosts in rank order, each with its GPUs ([] for a run on one
    host or none: `host` and `gpus` say it all)."""
    if GANG_SEP not in host:
        return []
    out, at = [], 0
    for item in host.split(GANG_SEP):
        name, _, count = item.rpartition("/")
        if not name or not count.isdigit():
            return []  # not a gang's text: a host name of its own
        n = int(count)
        out.append(HostGpus(host=name, gpus=list(gpus[at : at + n])))
        at += n
    return out


class LaunchRequest(BaseModel):
    """What to run. argv is a list: nothing is ever passed through a shell."""

    key: str = Field(
        description="Idempotency key, unique per launch in any store: the attempt's key "
        "('attempt-<uuid hex>'; 'attempt-<row id>' for attempts from before schema 0009)"
    )
    argv: list[str] = Field(min_length=1)
    cwd: str
    env: dict[str, str] = Field(default_factory=dict)
    gpus: list[int] = Field(default_factory=list, description="GPU indices; [] hides all GPUs")
    log_path: str
    host: str = Field(
        "",
        description="The cluster host placement chose for the GPUs ('ray:10.0.0.5'); '' for "
        "the daemon's own node",
    )
    ranks: list[HostGpus] = Field(
        default_factory=list,
        description="A gang's hosts in rank order (rank 0 hosts the rendezvous), each with its "
        "GPUs; [] for a run on one host (`host`, `gpus`)",
    )
    image: str | None = None
    user: str | None = None
    run_as: RunAs | None = Field(
        None,
        description="The submitter's account the program starts as (a shared install); None: "
        "the daemon's own user",
    )
    memory_gb: float | None = None
    cpus: float | None = Field(None, description="CPU cores the run may use; None: no limit")
    shm_gb: float | None = None
    mounts: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    network_mode: str | None = Field(
        None,
        description="Container network mode ('none', 'host', 'bridge', ...); None: the "
        "executor's default (none for Docker)",
    )
    pids_limit: int | None = Field(
        None,
        description="Most processes and threads in the container; None: the executor's default",
    )


class RunStatus(BaseModel):
    # running: alive; exited: ended and we know the exit code; lost: gone without an exit record
    state: Literal["running", "exited", "lost"]
    exit_code: int | None = None
    signal: int | None = None
    detail: str | None = None
    pid: int | None = None  # the program's pid, where the executor knows it
    # The run's cgroup memory counters at exit, where it had one (supervise.cgroup_memory):
    # version, oom_kills, peak_bytes, limit_bytes, failcnt.
    cgroup_memory: dict[str, int] | None = None
    descendants: list[int] = Field(
        default_factory=list,
        description="pids of the program's descendants its supervisor saw while it ran (a "
        "wrapper shell's child, torchrun's workers): the OOM killer may name one of them",
    )
    leftovers: list[int] = Field(
        default_factory=list,
        description="pids of the run's processes still alive although the "
        "run is lost (e.g. re-parented after its supervisor was killed); `cleanup` stops them",
    )


class Executor(Protocol):
    kind: str

    def start(self, req: LaunchRequest) -> dict[str, Any]: ...

    def find(self, key: str) -> dict[str, Any] | None: ...

    def poll(self, handle: dict[str, Any]) -> RunStatus: ...

    def stop(self, handle: dict[str, Any], grace_s: float = 10.0) -> RunStatus: ...

    def cleanup(self, handle: dict[str, Any], grace_s: float = 10.0) -> list[int]:
        """Stop whatever is left of the run (SIGTERM, then SIGKILL after grace_s), running or
        lost, so a relaunch never trains beside a survivor; the pids stopped, [] if none."""
        ...

    def logs(self, handle: dict[str, Any], tail: int = 200) -> str: ...

    def render(self, req: LaunchRequest) -> str:
        """What would run, for a dry run."""
        ...
