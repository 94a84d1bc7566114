"""Run one command and record how it ended, so that a process that did not start it can know.

Only a parent can `waitpid` its child, so a daemon that restarted (or a CLI that merely looks)
could otherwise never learn a run's exit code. The local executor therefore launches every run as

    python -m nightshift.runtime.executors.supervise --exit-file PATH -- argv...

This supervisor starts argv as its child in the same process group, ignores SIGTERM and SIGINT
itself (so a `killpg` reaches the child while the supervisor stays to record the outcome), waits,
and writes `{"exit_code": int|null, "signal": int|null}` atomically to PATH. It exits with the
child's code, or 128+N when the child died from signal N. Right after starting the child it writes
`{"pid": int, "create_time": float|null}` to PATH.child, so that if the supervisor itself is
killed, the child it leaves behind can still be found (and told apart from a recycled pid). Only
the standard library is imported before the child starts, so start-up stays fast.

With `--cgroup DIR --cgroup-home HOME` (one pair per hierarchy) the child starts inside the run's
own cgroup (runtime/executors/run_cgroup.py): the supervisor joins it, starts the child, and goes
back to HOME at once. A child its cgroup's memory limit killed is recorded, and said in the log,
in the kernel's own words for it; the record also keeps the cgroup's memory counters as they were
at exit (`cgroup`: oom_kills, peak_bytes, limit_bytes, failcnt) and the child's pid (`pid`), which
diagnose_failure reads as the machine's evidence.

The program is often a wrapper (`bash -c "python train.py; ..."`, torchrun and its workers): the
process the kernel's OOM killer names is then one of its children. While the child runs, the
supervisor samples its process tree from /proc (`/proc/PID/task/TID/children`, else a scan of
/proc) and records the pids it saw (`descendants`: the last MAX_TREE_PIDS seen, newest kept),
so that a kernel line naming any of them counts as the run's.

A full disk does not hide how a run ended. Before the child starts, the supervisor reserves
RESERVE_BYTES next to the exit file (PATH.reserve, allocated, not merely sized). When the exit
record cannot be written for lack of space (a training program that filled the disk usually
ends just then), the record is written into the reserved blocks, the rest of them is freed for a
line in the run's log that names the full disk (what diagnose_failure reads as disk_full), and
the reserve becomes PATH. A reader takes PATH.reserve as the record when the rename itself
found no space. The run ends as an exit with its code, never as a lost (SIGKILLed) run.

With `--intent-file I --handle-file H` (what the local executor passes) the supervisor claims the
launch before anything runs: under the flock on `H.claim` it checks that the intent the executor
wrote is still its own (the same NIGHTSHIFT_ATTEMPT_ID) and that no handle exists, then writes the
handle (the intent plus its own pid, process group and start time) durably, and only then starts
the child. A launcher killed at any moment therefore leaves either a handle a later process finds,
or no run at all: a supervisor whose intent was superseded by a relaunch exits without running.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import Any

from nightshift.runtime.executors.crashpoints import crash_point

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_CLAIMED = 125  # the launch was superseded or already claimed: nothing ran
ATTEMPT_ID_ENV = "NIGHTSHIFT_ATTEMPT_ID"
# Room kept for the exit record on a disk the run fills: the record, and a line in the log.
RESERVE_BYTES = 64 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
MAX_TREE_PIDS = 256  # of the run's descendants, the last this many seen
TREE_FAST_S = 0.05  # sampled this often for the first TREE_FAST_SAMPLES (wrappers start fast)
TREE_FAST_SAMPLES = 40
TREE_SLOW_S = 0.5  # then this often


def child_file(exit_file: str) -> str:
    """Where the supervisor records which process it started."""
    return f"{exit_file}.child"


def reserve_file(exit_file: str) -> str:
    """The blocks reserved at launch for the exit record on a disk that fills up."""
    return f"{exit_file}.reserve"


def reserve(exit_file: str) -> None:
    """Allocate RESERVE_BYTES for the exit record (best effort: a disk already this full
    leaves none, and the run starts anyway)."""
    path = reserve_file(exit_file)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        os.fsync(fd)
    except OSError:
        _unlink(path)
    finally:
        os.close(fd)


def record_exit(exit_file: str, record: dict[str, Any]) -> None:
    """Write the exit record; on a full disk (or quota) write it into the reserved blocks
    instead, saying so in the record and, space allowing, in the run's log (stderr)."""
    try:
        write_exit_file(exit_file, record)
    except OSError as exc:
        if exc.errno not in _NO_SPACE or not os.path.exists(reserve_file(exit_file)):
            raise
        _record_in_reserve(exit_file, record, exc)
    else:
        _unlink(reserve_file(exit_file))


def _record_in_reserve(exit_file: str, record: dict[str, Any], exc: OSError) -> None:
    code = record.get("exit_code")
    how = f"exited with code {code}" if code is not None else f"ended by signal {record['signal']}"
    detail = (
        f"the run {how} on a full disk: [Errno {exc.errno}] {exc.strerror} writing its exit "
        f"record {exit_file}; recorded in the space reserved at launch"
    )
    data = json.dumps({**record, "detail": detail}).encode()[:RESERVE_BYTES]
    path = reserve_file(exit_file)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)  # into blocks allocated at launch: needs no new space
        os.ftruncate(fd, len(data))  # frees the rest, for the line below
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.write(2, f"nightshift supervise: {detail}\n".encode())
    except OSError:
        pass  # the log's disk is full too, and the freed blocks went elsewhere
    try:
        os.replace(path, exit_file)
    except OSError:
        pass  # the directory has no room for the new name: readers look at the reserve too


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _create_time(pid: int) -> float | None:
    """psutil's create_time, imported only after the child has started."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - no psutil, or no such process: the env marker still finds it
        return None


def write_exit_file(path: str, record: dict[str, Any]) -> None:
    """Write the record with write-to-temp + rename, so a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)  # a full disk leaves no empty temp file behind
        raise


def claim_file(handle_file: str) -> str:
    """The lock file that makes "is the intent still mine, is there no handle" one step."""
    return f"{handle_file}.claim"


def _own_start() -> tuple[int | None, float | None]:
    """(start time in clock ticks after boot, create time) of this process, as the executor's
    handle check reads them (psutil's create_time is boot time + ticks / CLK_TCK)."""
    try:
        raw = open("/proc/self/stat", encoding="utf-8").read()
        ticks = int(raw[raw.rindex(")") + 2 :].split()[19])
        with open("/proc/stat", encoding="utf-8") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return ticks, btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return None, None


def claim(intent_file: str, handle_file: str) -> str | None:
    """Write the handle if the intent is still this process's; otherwise say why not."""
    fd = os.open(claim_file(handle_file), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the same kernel lock runtime/locks.py (filelock) takes
        try:
            with open(intent_file, encoding="utf-8") as f:
                intent = json.load(f)
        except (OSError, ValueError) as exc:
            return f"cannot read the launch intent {intent_file}: {exc}"
        if intent.get("attempt_id") != os.environ.get(ATTEMPT_ID_ENV):
            return "the launch was superseded by a relaunch under the same key"
        if os.path.exists(handle_file):
            return "the launch was already claimed"
        ticks, ctime = _own_start()
        write_exit_file(
            handle_file,
            {
                **intent,
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "start_time": ticks,
                "create_time": ctime,
            },
        )
        return None
    finally:
        os.close(fd)  # closing drops the flock


def _ignore(signum: int, frame: object) -> None:
    """A no-op handler rather than SIG_IGN: handlers reset to default on exec, SIG_IGN would not."""


def _parse(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m nightshift.runtime.executors.supervise",
        description="Run a command and record its exit status in a JSON file.",
    )
    parser.add_argument("--exit-file", required=True, help="where to write the exit status")
    parser.add_argument("--intent-file", help="the launch intent to claim before running")
    parser.add_argument("--handle-file", help="where to write the handle when claimed")
    parser.add_argument("--uid", type=int, help="start the command as this user (needs root)")
    parser.add_argument("--gid", type=int, help="… with this group")
    parser.add_argument("--groups", default="", help="… and these supplementary groups (a,b)")
    parser.add_argument(
        "--cgroup", action="append", default=[], help="a folder of the run's own cgroup"
    )
    parser.add_argument(
        "--cgroup-home",
        action="append",
        default=[],
        help="where the supervisor goes back to in that hierarchy once the command started",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- command and its arguments")
    ns = parser.parse_args(args)
    argv = list(ns.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        parser.error("no command given after --")
    if (ns.intent_file is None) != (ns.handle_file is None):
        parser.error("--intent-file and --handle-file go together")
    if (ns.uid is None) != (ns.gid is None):
        parser.error("--uid and --gid go together")
    if len(ns.cgroup) != len(ns.cgroup_home):
        parser.error("each --cgroup needs its --cgroup-home")
    return ns, argv


def main(args: list[str] | None = None) -> int:
    # Install the handlers first: a stop that arrives while the child starts must not kill us.
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    ns, argv = _parse(sys.argv[1:] if args is None else args)
    exit_file = ns.exit_file
    if ns.intent_file is not None:
        why = claim(ns.intent_file, ns.handle_file)
        if why is not None:
            # Not ours to run; the exit file (if any) belongs to the launch that claimed the key.
            print(f"nightshift supervise: not started: {why}", file=sys.stderr, flush=True)
            return EXIT_NOT_CLAIMED
        crash_point("supervise.claimed")
    reserve(exit_file)
    try:
        _move_self(ns.cgroup)  # the program starts inside the run's cgroup, and stays there
    except OSError as exc:
        _go_home(ns.cgroup_home)
        detail = f"cannot enter the run's cgroup {ns.cgroup}: {exc.strerror or exc}"
        _say(f"nightshift supervise: not started: {detail}")
        record_exit(exit_file, {"exit_code": EXIT_NOT_EXECUTABLE, "signal": None, "detail": detail})
        return EXIT_NOT_EXECUTABLE

    try:
        child = subprocess.Popen(argv, **_as_user(ns))
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT
        code = EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE
        detail = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        _say(f"nightshift supervise: {detail}")
        record_exit(exit_file, {"exit_code": code, "signal": None, "detail": detail})
        return code
    finally:
        _go_home(ns.cgroup_home)

    try:
        write_exit_file(
            child_file(exit_file), {"pid": child.pid, "create_time": _create_time(child.pid)}
        )
    except OSError as exc:  # the run matters more than the record; the env marker still finds it
        _say(f"nightshift supervise: cannot record the child: {exc}")
    tree = ProcessTree(child.pid)
    tree.start()
    returncode = child.wait()  # PEP 475: retried after our no-op signal handlers run
    tree.stop()
    if returncode < 0:
        record: dict[str, Any] = {"exit_code": None, "signal": -returncode}
        status = 128 - returncode
    else:
        record = {"exit_code": returncode, "signal": None}
        status = returncode
    record["pid"] = child.pid
    if tree.seen:
        record["descendants"] = tree.pids()
    memory = cgroup_memory(ns.cgroup)  # read now: the cgroup is removed below
    if memory is not None:
        record["cgroup"] = memory
    oom = _cgroup_oom(memory)
    if oom:
        record["detail"] = oom
        _say(f"nightshift supervise: {oom}")  # in the log, where diagnose_failure reads it
    record_exit(exit_file, record)
    for folder in ns.cgroup:  # empty now unless something of the run outlived it (cleanup's)
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return status


class ProcessTree:
    """The pids of `root`'s descendants, sampled from /proc in a thread while it runs; bounded
    (MAX_TREE_PIDS, the least recently seen dropped first)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: OrderedDict[int, None] = OrderedDict()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-tree", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def pids(self) -> list[int]:
        return sorted(self.seen)

    def sample(self) -> None:
        for pid in descendants(self.root):
            self.seen[pid] = None
            self.seen.move_to_end(pid)
        while len(self.seen) > MAX_TREE_PIDS:
            self.seen.popitem(last=False)

    def _run(self) -> None:
        n = 0
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a record of the tree is a nicety; the run is not
                pass
            n += 1
            if self._stop.wait(TREE_FAST_S if n < TREE_FAST_SAMPLES else TREE_SLOW_S):
                return


def descendants(root: int, proc: str = "/proc") -> set[int]:
    """The pids of `root`'s living descendants (not `root`): through each thread's `children`
    file where the kernel has them (CONFIG_PROC_CHILDREN), else from every process's parent."""
    if not os.path.exists(f"{proc}/{os.getpid()}/task/{os.getpid()}/children"):
        return _by_parent(root, proc)
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue  # it ended meanwhile
        for tid in tasks:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in found and k != root:
                    found.add(k)
                    todo.append(k)
    return found


def _by_parent(root: int, proc: str) -> set[int]:
    parent: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat") as f:
                raw = f.read()
            ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parent.setdefault(ppid, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for k in parent.get(todo.pop(), []):
            if k not in found:
                found.add(k)
                todo.append(k)
    return found


def _move_self(folders: list[str]) -> None:
    for folder in folders:
        with open(os.path.join(folder, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(os.getpid()))


def _go_home(homes: list[str]) -> None:
    """Out of the run's cgroup again: the supervisor's own memory is not the run's to count, and
    an out-of-memory kill there must not pick the process that records how the run ended."""
    for home in homes:
        try:
            _move_self([home])
        except OSError as exc:
            _say(f"nightshift supervise: cannot leave the run's cgroup for {home}: {exc}")


def _cgroup_oom(memory: dict[str, int] | None) -> str | None:
    """What the kernel's out-of-memory killer did in the run's cgroup (cgroup_memory's reading),
    in the words its own log line uses ("Memory cgroup out of memory: Killed process"), or None."""
    kills = (memory or {}).get("oom_kills", 0)
    if not kills:
        return None
    limit = (memory or {}).get("limit_bytes")
    shown = f"{limit / (1 << 30):.3g} GiB" if limit is not None else "max"
    return (
        f"Memory cgroup out of memory: Killed process of the run ({kills} killed): "
        f"it used more host memory than its limit of {shown} "
        "(resources.host_memory_gb); raise it, or lower the batch size"
    )


def cgroup_memory(folders: list[str]) -> dict[str, int] | None:
    """The run's memory counters as its cgroup holds them at exit (what diagnose_failure reads
    as the machine's word on an OOM kill): version, oom_kills, and where the kernel keeps them
    peak_bytes (v2 memory.peak, v1 memory.max_usage_in_bytes), limit_bytes and v1's failcnt.
    None when no memory controller is in `folders`."""
    for folder in folders:

        def number(name: str, d: str = folder) -> int | None:
            try:
                with open(os.path.join(d, name), encoding="ascii") as f:
                    text = f.read(64).strip()
            except (OSError, ValueError):
                return None
            return int(text) if text.isdigit() else None  # "max": no limit

        for version, events in ((2, "memory.events"), (1, "memory.oom_control")):
            try:
                with open(os.path.join(folder, events), encoding="ascii") as f:
                    counts = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
            except (OSError, ValueError):
                continue
            kills = counts.get("oom_kill", "0")
            out: dict[str, int] = {
                "version": version,
                "oom_kills": int(kills) if kills.isdigit() else 0,
            }
            names: tuple[tuple[str, str], ...] = (
                ("peak_bytes", "memory.peak"),
                ("limit_bytes", "memory.max"),
            )
            if version == 1:
                names = (
                    ("peak_bytes", "memory.max_usage_in_bytes"),
                    ("limit_bytes", "memory.limit_in_bytes"),
                    ("failcnt", "memory.failcnt"),
                )
            for key, name in names:
                value = number(name)
                if value is not None:
                    out[key] = value
            return out
    return None


def _as_user(ns: argparse.Namespace) -> dict[str, Any]:
    """Popen's options to start the command as the submitter: the supervisor stays root, so the
    program can neither signal it nor touch the exit record; setgroups, setgid, then setuid run
    between fork and exec, and moving every uid off 0 clears all capabilities."""
    if ns.uid is None:
        return {}
    groups = [int(g) for g in ns.groups.split(",") if g]
    return {"user": ns.uid, "group": ns.gid, "extra_groups": groups}


def _say(line: str) -> None:
    """A line in the run's log, unless its disk is full."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
