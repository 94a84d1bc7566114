"""The default executor: runs are plain processes on this machine, in their own process group.

Each run is started under `nightshift.runtime.executors.supervise`, which records the exit status in a file,
so any later process (a restarted daemon, the CLI) can learn how a run ended from its handle, not
only the process that started it. Handles are JSON files under `<runs_dir>/handles/`, which makes
`start` idempotent on the request key even across processes, and each handle carries the process
start time and the boot id, so a recycled pid (or a reboot) is never mistaken for our run.

A launch is exactly-once even when its launcher is SIGKILLed at any moment: the executor writes an
intent (`<key>.intent.json`) before any process starts, and the supervisor claims it — writes the
handle, under a lock, only if the intent is still its own — before the program starts. A later
`start` finds the handle, or waits for the live supervisor of the intent to write it, or (nothing
of the intent alive) supersedes the intent, so a launch its dead launcher began but no one could see
yet is refused rather than run beside the new one.

A training program can outlive its supervisor: the supervisor or its group SIGKILLed, or a
descendant that started its own session (a daemonised data loader). Such a survivor keeps its GPU
and writes into the run's checkpoints, so before a relaunch it must be found and stopped. Three
pieces of evidence find it: the process group, the child pid the supervisor records next to the
exit file, and the env marker (NIGHTSHIFT_ATTEMPT_KEY and NIGHTSHIFT_ATTEMPT_ID) that every
process of the run inherits. `poll` reports survivors of a lost run as `leftovers`, `cleanup` and
`stop` stop them, and nothing is signalled unless one of these proves it belongs to the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Literal

import psutil
from pydantic import BaseModel, ValidationError

from nightshift.runtime import locks
from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executors import run_cgroup
from nightshift.runtime.executors.crashpoints import crash_point
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.run_cgroup import CgroupLimits, CgroupUnavailable, RunCgroup
from nightshift.runtime.executors.submitter import RunAs, submitter_log
from nightshift.runtime.executors.supervise import (
    MAX_TREE_PIDS,
    RESERVE_BYTES,
    child_file,
    claim_file,
    reserve_file,
    write_exit_file,
)

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_POLL_INTERVAL_S = 0.05
_RESCAN_INTERVAL_S = 0.5
_KILL_WAIT_S = 5.0
_FINISH_WAIT_S = 1.0
# A supervisor writes its handle within a Python start-up; past this, something is wrong.
_HANDLE_WAIT_S = 60.0
_HANDLE_POLL_S = 0.005
# Two reads of one process's create_time agree to float noise; a recycled pid started elsewhen.
_CTIME_TOLERANCE_S = 0.05
ATTEMPT_KEY_ENV = "NIGHTSHIFT_ATTEMPT_KEY"
ATTEMPT_ID_ENV = "NIGHTSHIFT_ATTEMPT_ID"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
LOST_DETAIL = (
    "supervisor and its process group gone without an exit record (SIGKILL of the "
    "group, or OOM killer)"
)
REBOOT_DETAIL = "the machine restarted (boot id changed)"


class LocalHandle(BaseModel):
    """What a local run's handle holds; stored as JSON with the attempt and in the handle file."""

    kind: Literal["local"] = "local"
    key: str
    pid: int
    pgid: int
    start_time: int | None  # /proc/<pid>/stat field 22 (clock ticks after boot); None off Linux
    exit_file: str
    log_path: str
    argv: list[str]
    cwd: str
    # Absent from handles written before leftovers were tracked; those still poll and stop.
    create_time: float | None = None  # the supervisor's psutil create_time
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id at launch
    attempt_id: str | None = None  # NIGHTSHIFT_ATTEMPT_ID of every process of this launch
    cgroup: RunCgroup | None = None  # the run's own cgroup (runtime/executors/run_cgroup.py)


class ExitRecord(BaseModel):
    """What the supervisor (or `stop`, when the supervisor itself was killed) wrote at the end."""

    exit_code: int | None = None
    signal: int | None = None
    detail: str | None = None
    pid: int | None = None  # the program's (the supervisor's child)
    cgroup: dict[str, int] | None = None  # its cgroup's memory counters at exit (supervise.py)
    descendants: list[int] = []  # the pids of the program's children, as the supervisor saw them

    def status(self) -> RunStatus:
        return RunStatus(
            state="exited",
            exit_code=self.exit_code,
            signal=self.signal,
            detail=self.detail,
            pid=self.pid,
            cgroup_memory=self.cgroup,
            descendants=self.descendants[-MAX_TREE_PIDS:],
        )


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start_time) of a process from /proc, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # field 3 is fields[0], so field 22 is fields[19]


def _boot_id() -> str | None:
    try:
        return Path(BOOT_ID_PATH).read_text().strip() or None
    except OSError:
        return None


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _recorded(pid: int, ticks: int | None, ctime: float | None) -> psutil.Process | None:
    """The live process `pid` if it is the one recorded (same start), else None.

    Clock ticks after boot are exact and immune to clock steps, so they win when recorded;
    create_time (wall clock) is the check where they are not.
    """
    if pid <= 1:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if ticks is not None:
            stat = _proc_stat(pid)
            return proc if stat is not None and stat[1] == ticks else None
        if ctime is not None and abs(proc.create_time() - ctime) > _CTIME_TOLERANCE_S:
            return None
    except psutil.Error:
        return None
    return proc


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _has_marker(proc: psutil.Process, key: str, attempt_id: str) -> bool:
    """Whether `proc` inherited one launch's env marker (raises psutil.Error if unreadable)."""
    env = proc.environ()
    return env.get(ATTEMPT_ID_ENV) == attempt_id and env.get(ATTEMPT_KEY_ENV) == key


def _pids(pids: list[int]) -> str:
    return ("process " if len(pids) == 1 else "processes ") + ", ".join(map(str, pids))


def _read_tail(path: Path, lines: int, block: int = 65536) -> str:
    """The last `lines` lines of a file, reading backwards from the end in blocks."""
    if lines <= 0:
        return ""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return ""
    with f:
        end = f.seek(0, os.SEEK_END)
        pos, data = end, b""
        # One newline more than asked for, since the file usually ends with one.
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    text = data.decode("utf-8", errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:])


# A supervisor for a run as its submitter gets the daemon's import path as an argument (each
# folder added as a site, so an editable install's .pth files count), not in its environment,
# which the program inherits and which holds nothing of the daemon's.
_BOOT = (
    "import json, runpy, site, sys; [site.addsitedir(p) for p in json.loads(sys.argv.pop(1))]; "
    "runpy.run_module('nightshift.runtime.executors.supervise', run_name='__main__', alter_sys=True)"
)


def _supervisor(run_as: RunAs | None) -> list[str]:
    """How the supervisor starts: `-m` with the daemon's environment, or — for a run as its
    submitter, whose environment is clean — with the daemon's import path handed over."""
    if run_as is None:
        return [sys.executable, "-P", "-m", "nightshift.runtime.executors.supervise"]
    return [sys.executable, "-P", "-c", _BOOT, json.dumps([p for p in sys.path if p])]


def _as_args(run_as: RunAs) -> list[str]:
    """The supervisor's options to start the program as the submitter (it stays the daemon's)."""
    groups = ",".join(str(g) for g in run_as.groups)
    return ["--uid", str(run_as.uid), "--gid", str(run_as.gid), "--groups", groups]


def _cgroup_args(cgroup: RunCgroup | None) -> list[str]:
    """The supervisor's options to start the program in the run's cgroup."""
    args: list[str] = []
    for folder, home in zip(cgroup.dirs, cgroup.homes, strict=True) if cgroup is not None else []:
        args += ["--cgroup", folder, "--cgroup-home", home]
    return args


def _log_file(path: Path, run_as: RunAs | None) -> BinaryIO:
    """The run's log for appending: the submitter's own file when the run is theirs."""
    if run_as is None:
        return path.open("ab")
    return os.fdopen(submitter_log(path, run_as), "ab")


class LocalExecutor:
    """Runs each launch request as a supervised process group on this machine."""

    kind = "local"

    def __init__(
        self, runs_dir: Path | str, cgroups: Literal["auto", "required", "off"] = "off"
    ) -> None:
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        self.handles_dir = self.runs_dir / "handles"
        self.exits_dir = self.runs_dir / "exits"
        self.cgroups = cgroups

    # ---------------------------------------------------------------------------------- start
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Launch the run, or return the existing handle if this key was already started."""
        self._check_key(req.key)
        self.handles_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The lock makes "look for a handle, else launch" atomic across processes.
        with locks.exclusive(self.handles_dir / f"{req.key}.lock"):
            existing = self.find(req.key) or self._adopt(req.key)
            if existing is not None:
                return existing
            return self._launch(req)

    def _adopt(self, key: str) -> dict[str, Any] | None:
        """The handle of a launch whose launcher died before it read the handle: its supervisor
        is alive and claiming (wait for the handle it writes), or None when nothing runs."""
        try:
            intent = json.loads(self._intent_file(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        marker = intent.get("attempt_id") if isinstance(intent, dict) else None
        if not isinstance(marker, str) or not self._marked(key, marker):
            return None
        return self._await_handle(key, marker)

    def _launch(self, req: LaunchRequest) -> dict[str, Any]:
        attempt_id = secrets.token_hex(8)
        env = self._env(req, attempt_id)
        self._validate(req, env)
        cwd = str(Path(req.cwd).expanduser().resolve())
        self.exits_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        exit_file = self.exits_dir / f"{req.key}.json"
        log_path = Path(os.path.abspath(Path(req.log_path).expanduser()))
        if req.run_as is None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        handle_file, intent_file = self._handle_file(req.key), self._intent_file(req.key)
        intent = {
            "kind": "local",
            "key": req.key,
            "exit_file": str(exit_file),
            "log_path": str(log_path),
            "argv": list(req.argv),
            "cwd": cwd,
            "boot_id": _boot_id(),
            "attempt_id": attempt_id,
        }
        # Under the claim lock: no supervisor can claim between "no handle" and the new intent,
        # so one that a dead launcher started (and we could not see yet) is refused, not doubled.
        with locks.exclusive(claim_file(str(handle_file))):
            existing = self.find(req.key)
            if existing is not None:
                return existing
            # Nothing claimed this key, so these are a refused or removed launch's leftovers.
            exit_file.unlink(missing_ok=True)
            Path(child_file(str(exit_file))).unlink(missing_ok=True)
            Path(reserve_file(str(exit_file))).unlink(missing_ok=True)
            cgroup = self._cgroup(req)
            if cgroup is not None:
                intent["cgroup"] = cgroup.model_dump(mode="json")
            self._write_json(intent_file, intent)
        crash_point("launch.intent")
        cmd = [
            *_supervisor(req.run_as),
            "--exit-file",
            str(exit_file),
            "--intent-file",
            str(intent_file),
            "--handle-file",
            str(handle_file),
            *(_as_args(req.run_as) if req.run_as is not None else []),
            *_cgroup_args(cgroup),
            "--",
            *req.argv,
        ]
        try:
            with _log_file(log_path, req.run_as) as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            if cgroup is not None:
                cgroup.remove()
            raise SkillFailed(f"could not start the run supervisor for {req.key}: {exc}") from exc
        # Reap the supervisor when it ends, so no zombie lingers in a long-lived daemon.
        threading.Thread(target=proc.wait, name=f"nightshift-reap-{req.key}", daemon=True).start()
        crash_point("launch.spawned")
        try:
            handle = self._await_handle(req.key, attempt_id, proc, log_path)
        except SkillFailed:
            if cgroup is not None:
                cgroup.remove()  # the supervisor ran nothing (or was stopped): empty
            raise
        crash_point("launch.handle")
        intent_file.unlink(missing_ok=True)
        return handle

    def _cgroup(self, req: LaunchRequest) -> RunCgroup | None:
        """The run's own cgroup with the request's limits; None where cgroups are off, or (auto)
        where none can be made here. Required and impossible: the run does not start."""
        if self.cgroups == "off":
            return None
        limits = CgroupLimits(
            memory_bytes=None if req.memory_gb is None else int(req.memory_gb * run_cgroup.GIB),
            cpus=req.cpus,
            pids=req.pids_limit,
        )
        # Unique per runs folder, so two daemons (or test homes) on one machine never share one.
        name = f"{hashlib.sha256(bytes(self.runs_dir)).hexdigest()[:8]}.{req.key}"
        try:
            return run_cgroup.make(name, limits)
        except CgroupUnavailable as exc:
            if self.cgroups == "required":
                raise OperatorError(
                    f"{exc}; executor.cgroups is required (always so where jobs run as their "
                    "submitters): run the daemon as root on a machine with the memory, cpu and "
                    "pids controllers, or set executor.cgroups: off"
                ) from None
            return None

    def _await_handle(
        self,
        key: str,
        marker: str,
        proc: subprocess.Popen[bytes] | None = None,
        log_path: Path | None = None,
    ) -> dict[str, Any]:
        """The handle the supervisor writes before it starts the program. A supervisor that ends
        without one ran nothing; one that takes too long is stopped, so nothing runs untracked."""
        deadline = time.monotonic() + _HANDLE_WAIT_S
        next_scan = 0.0  # without our own child, "ended" is a scan of every process: not each poll
        while True:
            found = self.find(key)
            if found is not None:
                return found
            if proc is not None:
                ended = proc.poll() is not None
            elif time.monotonic() >= next_scan:
                ended, next_scan = (
                    not self._marked(key, marker),
                    time.monotonic() + _RESCAN_INTERVAL_S,
                )
            else:
                ended = False
            if ended and self.find(key) is None:
                tail = _read_tail(log_path, 5).strip() if log_path else ""
                raise SkillFailed(
                    f"the run supervisor for {key} ended before it claimed the launch"
                    + (f": {tail}" if tail else "")
                )
            if time.monotonic() >= deadline:
                if proc is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                raise SkillFailed(
                    f"the run supervisor for {key} wrote no handle within {_HANDLE_WAIT_S:g}s "
                    "(machine overloaded?); it was stopped so that nothing runs untracked"
                )
            time.sleep(_HANDLE_POLL_S)

    def _marked(self, key: str, marker: str) -> bool:
        """Whether a live process carries this launch's env marker (a supervisor or its run)."""
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid == me or proc.pid <= 1:
                continue
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and _has_marker(proc, key, marker):
                    return True
            except (psutil.Error, OSError):
                continue
        return False

    @staticmethod
    def _env(req: LaunchRequest, attempt_id: str) -> dict[str, str]:
        # The markers are inherited by every descendant, also those that leave the group. A run
        # as its submitter gets none of the daemon's environment (its secrets, its home).
        return {
            **(req.run_as.environment() if req.run_as is not None else os.environ),
            **req.env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in req.gpus),
            "NIGHTSHIFT_RUN_KEY": req.key,
            ATTEMPT_KEY_ENV: req.key,
            ATTEMPT_ID_ENV: attempt_id,
        }

    @staticmethod
    def _validate(req: LaunchRequest, env: dict[str, str]) -> None:
        if req.image:
            raise OperatorError(
                f"run {req.key} asks for image {req.image!r}, but the local executor runs "
                "processes on this machine without containers; use the docker or kubernetes "
                "executor, or remove the image from the spec"
            )
        if req.user and req.user != pwd.getpwuid(os.getuid()).pw_name:
            raise OperatorError(
                f"run {req.key} asks to run as user {req.user!r}, but the local executor runs "
                "as the current user; remove the user from the spec or use another executor"
            )
        cwd = Path(req.cwd).expanduser()
        if not cwd.is_dir():
            raise OperatorError(
                f"working directory {str(cwd)!r} for run {req.key} does not exist or is not a "
                "directory; create it or fix the spec's working directory"
            )
        program = req.argv[0]
        if os.sep in program:
            path = cwd / Path(program).expanduser()
            if not path.is_file():
                raise OperatorError(
                    f"program {program!r} for run {req.key} not found (looked for {str(path)!r}); "
                    "fix the command's path, which is relative to the working directory"
                )
            if not os.access(path, os.X_OK):
                raise OperatorError(
                    f"program {str(path)!r} for run {req.key} is not executable; "
                    f"run `chmod +x {shlex.quote(str(path))}` or start it through its interpreter"
                )
        elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
            raise OperatorError(
                f"program {program!r} for run {req.key} not found on PATH; install it, give its "
                "full path, or add its directory to PATH in the spec's env"
            )

    # ------------------------------------------------------------------------------ look up
    def find(self, key: str) -> dict[str, Any] | None:
        """The handle stored for this key, or None if it was never started here."""
        self._check_key(key)
        path = self._handle_file(key)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return LocalHandle.model_validate_json(raw).model_dump()
        except ValidationError as exc:
            raise OperatorError(
                f"handle file {str(path)!r} is unreadable ({exc.errors()[0]['msg']}); "
                "remove it only if no run with that key is still running"
            ) from exc

    def poll(self, handle: dict[str, Any]) -> RunStatus:
        """running while the supervisor lives; exited once it recorded the exit; otherwise lost,
        with the run's processes still alive as `leftovers` and the detail saying what is left."""
        h = self._handle(handle)
        record = self._read_exit(h)
        if record is not None:
            return record
        if self._other_boot(h):
            return RunStatus(state="lost", detail=REBOOT_DETAIL)
        if self._supervisor_alive(h):
            return RunStatus(state="running")
        # It may have written the record and exited just now; on a full disk, perhaps into the
        # space it reserved at launch, with no room left to rename it (runtime/executors/supervise.py).
        record = self._read_exit(h) or self._read_reserve(h)
        if record is not None:
            return record
        return self._lost(h)

    def _lost(self, h: LocalHandle) -> RunStatus:
        found = self._survivors(h)
        left = sorted(found)
        child = self._child(h)
        if child is not None and child.pid in found:
            detail = f"supervisor killed; training process {child.pid} still running (re-parented)"
            others = [pid for pid in left if pid != child.pid]
            if others:
                detail += f"; also {_pids(others)} of the run"
        elif any(why == "group" for _, why in found.values()):
            detail = f"supervisor killed; {_pids(left)} of its process group still running"
        elif left:
            detail = f"{LOST_DETAIL}; {_pids(left)} of the run still running (left the group)"
        else:
            detail = LOST_DETAIL
        return RunStatus(state="lost", detail=detail, leftovers=left)

    # ---------------------------------------------------------------------------------- stop
    def stop(self, handle: dict[str, Any], grace_s: float = 10.0) -> RunStatus:
        """SIGTERM every process of the run, SIGKILL them after `grace_s`; safe when ended."""
        h = self._handle(handle)
        _, sent = self._terminate(h, grace_s)
        if h.cgroup is not None:
            h.cgroup.remove()
        status = self.poll(h.model_dump())
        if status.state == "lost" and sent is not None:
            # We know why it ended: record it, so later polls say "stopped" rather than "lost".
            self._record_stop(h, sent, "stopped")
            status = self.poll(h.model_dump())
        return status

    def cleanup(self, handle: dict[str, Any], grace_s: float = 10.0) -> list[int]:
        """Stop everything left of the run (group, recorded child, marked processes), running or
        lost, so that a relaunch never trains beside a survivor; the pids stopped."""
        h = self._handle(handle)
        running = (
            self._read_exit(h) is None and not self._other_boot(h) and self._supervisor_alive(h)
        )
        stopped, sent = self._terminate(h, grace_s)
        if h.cgroup is not None:
            h.cgroup.remove()
        # A lost run stays lost (that is the evidence); a running one we ended is recorded.
        if running and sent is not None and self.poll(h.model_dump()).state == "lost":
            self._record_stop(h, sent, "stopped by cleanup")
        return stopped

    @staticmethod
    def _record_stop(h: LocalHandle, sent: int, how: str) -> None:
        name = signal.Signals(sent).name
        write_exit_file(
            h.exit_file,
            {
                "exit_code": None,
                "signal": int(sent),
                "detail": f"{how} with {name}; the supervisor ended before recording the exit",
            },
        )

    def _terminate(self, h: LocalHandle, grace_s: float) -> tuple[list[int], int | None]:
        """SIGTERM each process of the run once, SIGKILL what is left after `grace_s`; the pids
        signalled and the last signal sent (None when nothing was left)."""
        stopped: set[int] = set()
        sent: int | None = None
        if self._read_exit(h) is not None:  # the supervisor recorded the exit and is ending
            deadline = time.monotonic() + _FINISH_WAIT_S
            while self._supervisor_alive(h) and time.monotonic() < deadline:
                time.sleep(_POLL_INTERVAL_S / 5)
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, _KILL_WAIT_S)):
            targets = self._survivors(h)
            if not targets:
                break
            sent = sig
            signalled: set[int] = set()
            deadline = time.monotonic() + max(0.0, wait_s)
            next_scan = 0.0
            while targets:
                # The supervisor last: it ignores SIGTERM and records how its child ended.
                for pid in sorted(targets, key=lambda p: (p == h.pid, p)):
                    if pid not in signalled:
                        try:
                            targets[pid][0].send_signal(sig)  # psutil refuses a recycled pid
                        except psutil.Error:
                            pass
                        signalled.add(pid)
                stopped |= signalled
                if time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_INTERVAL_S)
                targets = {pid: t for pid, t in targets.items() if _alive(t[0])}
                if not targets or time.monotonic() >= next_scan:
                    # Rescan: a process may have forked, or one we missed may now be visible.
                    targets = self._survivors(h)
                    next_scan = time.monotonic() + _RESCAN_INTERVAL_S
            else:
                break
        return sorted(stopped), sent

    def _survivors(self, h: LocalHandle) -> dict[int, tuple[psutil.Process, str]]:
        """The live processes of this run, each with why it is ours ("child", "group" or
        "marker"); other users' processes cannot be read and are never ours."""
        if self._other_boot(h):
            return {}  # its pids belong to processes of this boot now
        found: dict[int, tuple[psutil.Process, str]] = {}
        child = self._child(h)
        if child is not None:
            found[child.pid] = (child, "child")
        group = h.pgid if self._group_is_ours(h) else None
        me = os.getpid()
        for pid in h.cgroup.pids() if h.cgroup is not None else []:
            # The kernel's own list: a process there is the run's whatever it changed about
            # itself (its group, session, environment), and it cannot move out.
            if pid not in found and pid != me:
                with contextlib.suppress(psutil.Error):
                    found[pid] = (psutil.Process(pid), "cgroup")
        for proc in psutil.process_iter():
            if proc.pid in found or proc.pid == me or proc.pid <= 1:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if group is not None and os.getpgid(proc.pid) == group:
                    found[proc.pid] = (proc, "group")
                elif h.attempt_id is not None and _has_marker(proc, h.key, h.attempt_id):
                    found[proc.pid] = (proc, "marker")
            except (psutil.Error, OSError):
                continue
        return found

    def _child(self, h: LocalHandle) -> psutil.Process | None:
        """The child the supervisor recorded, if it still lives and is the same process."""
        try:
            rec = json.loads(Path(child_file(h.exit_file)).read_text(encoding="utf-8"))
            pid, ctime = int(rec["pid"]), rec["create_time"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if ctime is None or self._other_boot(h):
            return None  # without its start time a pid proves nothing
        return _recorded(pid, None, float(ctime))

    @staticmethod
    def _other_boot(h: LocalHandle) -> bool:
        now = _boot_id()
        return h.boot_id is not None and now is not None and now != h.boot_id

    # ---------------------------------------------------------------------------------- logs
    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        """The last `tail` lines of the run's combined stdout and stderr."""
        return _read_tail(Path(self._handle(handle).log_path), tail)

    def render(self, req: LaunchRequest) -> str:
        """One line saying what would run, for a dry run; for display only, never executed."""
        env = {
            **req.env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in req.gpus),
            "NIGHTSHIFT_RUN_KEY": req.key,
            ATTEMPT_KEY_ENV: req.key,
        }
        ours = ("NIGHTSHIFT_RUN_KEY", ATTEMPT_KEY_ENV)
        shown = " ".join(
            f"{k}={'***' if _SECRET_RE.search(k) and k not in ours else shlex.quote(v)}"
            for k, v in env.items()
        )
        gpus = ",".join(str(g) for g in req.gpus) or "none"
        return (
            f"[local {req.key}] cd {shlex.quote(req.cwd)} && {shown} {shlex.join(req.argv)}"
            f" >> {shlex.quote(req.log_path)} 2>&1  (gpus: {gpus})"
        )

    # ------------------------------------------------------------------------------ helpers
    def _handle_file(self, key: str) -> Path:
        return self.handles_dir / f"{key}.json"

    def _intent_file(self, key: str) -> Path:
        """What a launch will be, written before its process starts (see supervise.claim)."""
        return self.handles_dir / f"{key}.intent.json"

    @staticmethod
    def _check_key(key: str) -> None:
        if not _KEY_RE.match(key):
            raise OperatorError(
                f"run key {key!r} is not usable as a file name; use letters, digits, '.', '_' "
                "and '-' (at most 200 characters), starting with a letter or digit"
            )

    @staticmethod
    def _handle(handle: dict[str, Any]) -> LocalHandle:
        kind = handle.get("kind") if isinstance(handle, dict) else None
        if kind != "local":
            raise OperatorError(
                f"handle is for the {kind!r} executor, not 'local'; the attempt was started by "
                "another executor: configure that one to manage it"
            )
        try:
            return LocalHandle.model_validate(handle)
        except ValidationError as exc:
            raise OperatorError(f"local run handle is invalid: {exc.errors()[0]['msg']}") from exc

    @staticmethod
    def _read_exit(h: LocalHandle) -> RunStatus | None:
        try:
            raw = Path(h.exit_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            rec = ExitRecord.model_validate_json(raw)
        except ValidationError:
            return RunStatus(state="exited", detail=f"exit record {h.exit_file!r} is unreadable")
        return rec.status()

    @staticmethod
    def _read_reserve(h: LocalHandle) -> RunStatus | None:
        """The exit record a supervisor wrote into its reserved blocks; None while they hold
        none (zeros: it was killed before it could write one)."""
        try:
            with open(reserve_file(h.exit_file), "rb") as f:
                raw = f.read(RESERVE_BYTES).strip(b"\0 \n")
        except OSError:
            return None
        try:
            rec = ExitRecord.model_validate_json(raw) if raw else None
        except ValidationError:
            return None  # cut short as it was written: no record
        if rec is None:
            return None
        return rec.status()

    @staticmethod
    def _supervisor_alive(h: LocalHandle) -> bool:
        """True while the supervisor process of this handle (same pid and start time) lives."""
        return _recorded(h.pid, h.start_time, h.create_time) is not None

    @staticmethod
    def _group_is_ours(h: LocalHandle) -> bool:
        """False when the group id now belongs to an unrelated process that reused the pid.

        Linux never hands out a pid still in use as a process-group id, so if a process with
        that pid exists but started at another time, our group is gone.
        """
        if h.start_time is not None:
            stat = _proc_stat(h.pgid)  # a zombie leader still has its stat
            return stat is None or stat[1] == h.start_time
        ctime = _create_time(h.pgid)
        return (
            ctime is None
            or h.create_time is None
            or (abs(ctime - h.create_time) <= _CTIME_TOLERANCE_S)
        )

    @staticmethod
    def _write_json(path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
