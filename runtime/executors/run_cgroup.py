"""Each local run in a cgroup of its own, as Slurm's task/cgroup plugin puts each job in one: the
kernel then holds the run to the memory, CPU and process count its spec declares, says when its
own limit killed it (not some other program's), and lists every process of the run — also one
that left the process group, started its own session and cleared its environment, which nothing
else would find.

The cgroup is made under the daemon's own (as systemd's `Delegate=yes` hands a service its
subtree), named `nightshift/<run>`, and owned by root, so a job running as its submitter can
neither raise its limits nor move a process out. cgroup v1 (one hierarchy per controller) and v2
(one unified hierarchy) are both handled; under v2 the daemon's own processes move into a leaf
`daemon/` first, since v2 gives controllers only to cgroups without processes of their own.

The run's supervisor joins the cgroup just before it starts the program (which inherits it) and
moves itself back home at once (runtime/executors/supervise.py), so what the limit counts is the
program and everything it starts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from nightshift.runtime.errors import OperatorError

FS_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
GIB = 1 << 30
_WITHOUT_SWAP = ("memory.memsw.limit_in_bytes", "memory.swap.max")


class CgroupLimits(BaseModel):
    """What a run may use; None: no limit of that kind."""

    model_config = ConfigDict(frozen=True)

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None


class RunCgroup(BaseModel):
    """Where a run's cgroup lies: one folder per hierarchy, and for each the folder its
    supervisor came from (where it goes back once the program started)."""

    model_config = ConfigDict(frozen=True)

    version: int
    dirs: tuple[str, ...]
    homes: tuple[str, ...]

    def pids(self) -> list[int]:
        """Every live process of the run, from the kernel's list (empty once all ended)."""
        found: set[int] = set()
        for d in self.dirs:
            try:
                text = (Path(d) / "cgroup.procs").read_text()
            except OSError:
                continue
            found.update(int(p) for p in text.split())
        return sorted(found)

    def remove(self) -> bool:
        """Remove the run's folders once no process is left in them; whether all are gone."""
        gone = True
        for d in self.dirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        return gone


class CgroupUnavailable(OperatorError):
    """No cgroup can be made for a run here (not root, no controllers, a read-only mount)."""


def _own_paths(proc_self: Path) -> dict[str, str]:
    """This process's cgroup per controller ('' for the v2 hierarchy), from /proc/self/cgroup."""
    out: dict[str, str] = {}
    for line in proc_self.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
        if controllers:
            out[f"mount:{controllers}"] = path
    return out


def make(
    name: str, limits: CgroupLimits, *, fs_root: Path = FS_ROOT, proc_self: Path = PROC_SELF_CGROUP
) -> RunCgroup:
    """Make the run's cgroup `nightshift/<name>` under this process's own and write its limits.
    CgroupUnavailable saying why when it cannot be made (nothing is left half made)."""
    try:
        own = _own_paths(proc_self)
    except (OSError, ValueError) as exc:
        raise CgroupUnavailable(f"cannot read {proc_self}: {exc}") from None
    v2 = (fs_root / "cgroup.controllers").exists() and "" in own
    try:
        cg = _make_v2(name, own[""], fs_root) if v2 else _make_v1(name, own, fs_root)
    except OSError as exc:
        raise CgroupUnavailable(
            f"cannot make a cgroup for run {name} under {fs_root}: {exc.strerror or exc}"
        ) from None
    try:
        _write_limits(cg, limits)
    except OSError as exc:
        cg.remove()
        raise CgroupUnavailable(
            f"cannot set the limits of run {name}'s cgroup: {exc.strerror or exc}"
        ) from None
    return cg


def _make_v1(name: str, own: dict[str, str], fs_root: Path) -> RunCgroup:
    dirs: list[str] = []
    homes: list[str] = []
    try:
        _make_each_v1(name, own, fs_root, dirs, homes)
    except OSError:
        RunCgroup(version=1, dirs=tuple(dirs), homes=tuple(homes)).remove()
        raise
    return RunCgroup(version=1, dirs=tuple(dirs), homes=tuple(homes))


def _make_each_v1(
    name: str, own: dict[str, str], fs_root: Path, dirs: list[str], homes: list[str]
) -> None:
    for controller in CONTROLLERS:
        if controller not in own:
            raise OSError(errno.ENOENT, f"no {controller} controller is mounted")
        mount = next(
            (
                fs_root / k[6:]
                for k in own
                if k.startswith("mount:") and controller in k[6:].split(",")
            ),
            fs_root / controller,
        )
        home = mount / own[controller].lstrip("/")
        run = home / "nightshift" / name
        run.mkdir(parents=True, exist_ok=True)
        dirs.append(str(run))
        homes.append(str(home))


def _make_v2(name: str, own: str, fs_root: Path) -> RunCgroup:
    base = fs_root / own.lstrip("/")
    home = base
    if base != fs_root and (base / "cgroup.procs").read_text().split():
        # v2's rule: a cgroup that hands controllers to children holds no processes itself.
        home = base / "daemon"
        home.mkdir(exist_ok=True)
        for pid in (base / "cgroup.procs").read_text().split():
            try:
                (home / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                continue
    wanted = " ".join(f"+{c}" for c in CONTROLLERS)
    (base / "cgroup.subtree_control").write_text(wanted)
    runs = base / "nightshift"
    runs.mkdir(exist_ok=True)
    (runs / "cgroup.subtree_control").write_text(wanted)
    run = runs / name
    run.mkdir(exist_ok=True)
    return RunCgroup(version=2, dirs=(str(run),), homes=(str(home),))


def _write_limits(cg: RunCgroup, limits: CgroupLimits) -> None:
    quota = None if limits.cpus is None else max(1000, round(limits.cpus * CPU_PERIOD_US))
    # v1: one folder per controller, in CONTROLLERS order; v2: one folder for all.
    each = [(Path(d), c) for d, c in zip(cg.dirs, CONTROLLERS, strict=False)]
    for d, controller in each if cg.version == 1 else [(Path(cg.dirs[0]), "")]:
        if cg.version == 2:
            files = {
                "memory.max": limits.memory_bytes,
                "memory.swap.max": 0 if limits.memory_bytes is not None else None,
                "cpu.max": None if quota is None else f"{quota} {CPU_PERIOD_US}",
                "pids.max": limits.pids,
            }
        else:
            files = {
                "memory.limit_in_bytes": limits.memory_bytes,
                "memory.memsw.limit_in_bytes": limits.memory_bytes,  # no way round it by swap
                "cpu.cfs_period_us": None if quota is None else CPU_PERIOD_US,
                "cpu.cfs_quota_us": quota,
                "pids.max": limits.pids,
            }
        for file, value in files.items():
            if not file.startswith(controller):
                continue  # another hierarchy's file
            if value is None or (file in _WITHOUT_SWAP and not (d / file).exists()):
                continue  # absent where the kernel keeps no swap accounting
            (d / file).write_text(str(value))
