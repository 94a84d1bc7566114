"""The default executor: runs are plain processes on this machine, in their own process group.

Each run is started under `nightshift.runtime.supervise`, which records the exit status in a file,
so any later process (a restarted daemon, the CLI) can learn how a run ended from its handle, not
only the process that started it. Handles are JSON files under `<runs_dir>/handles/`, which makes
`start` idempotent on the request key even across processes, and each handle carries the process
start time, so a recycled pid is never mistaken for our run.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executor import LaunchRequest, RunStatus
from nightshift.runtime.supervise import write_exit_file

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_POLL_INTERVAL_S = 0.05
_KILL_WAIT_S = 5.0
LOST_DETAIL = "process gone without an exit record (killed with SIGKILL, or the machine restarted)"


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


class ExitRecord(BaseModel):
    """What the supervisor (or `stop`, when the supervisor itself was killed) wrote at the end."""

    exit_code: int | None = None
    signal: int | None = None
    detail: str | None = None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start_time) of a process from /proc, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])  # field 3 is fields[0], so field 22 is fields[19]


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


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


class LocalExecutor:
    """Runs each launch request as a supervised process group on this machine."""

    kind = "local"

    def __init__(self, runs_dir: Path | str) -> None:
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        self.handles_dir = self.runs_dir / "handles"
        self.exits_dir = self.runs_dir / "exits"

    # ---------------------------------------------------------------------------------- start
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Launch the run, or return the existing handle if this key was already started."""
        self._check_key(req.key)
        self.handles_dir.mkdir(parents=True, exist_ok=True)
        # The lock makes "look for a handle, else launch" atomic across processes.
        with (self.handles_dir / f"{req.key}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            existing = self.find(req.key)
            if existing is not None:
                return existing
            return self._launch(req)

    def _launch(self, req: LaunchRequest) -> dict[str, Any]:
        env = self._env(req)
        self._validate(req, env)
        cwd = str(Path(req.cwd).expanduser().resolve())
        self.exits_dir.mkdir(parents=True, exist_ok=True)
        exit_file = self.exits_dir / f"{req.key}.json"
        exit_file.unlink(missing_ok=True)  # a stale record from a launch whose handle was removed
        log_path = Path(os.path.abspath(Path(req.log_path).expanduser()))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-P", "-m", "nightshift.runtime.supervise",
               "--exit-file", str(exit_file), "--", *req.argv]
        try:
            with log_path.open("ab") as log:
                proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, close_fds=True)
        except OSError as exc:
            raise SkillFailed(f"could not start the run supervisor for {req.key}: {exc}") from exc
        # Read the start time before anything can reap the child: a zombie still has its stat.
        stat = _proc_stat(proc.pid)
        # Reap the supervisor when it ends, so no zombie lingers in a long-lived daemon.
        threading.Thread(target=proc.wait, name=f"nightshift-reap-{req.key}", daemon=True).start()
        handle = LocalHandle(key=req.key, pid=proc.pid, pgid=proc.pid,
                             start_time=stat[1] if stat else None, exit_file=str(exit_file),
                             log_path=str(log_path), argv=list(req.argv), cwd=cwd)
        data = handle.model_dump()
        self._write_json(self._handle_file(req.key), data)
        return data

    @staticmethod
    def _env(req: LaunchRequest) -> dict[str, str]:
        return {**os.environ, **req.env,
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in req.gpus),
                "NIGHTSHIFT_RUN_KEY": req.key}

    @staticmethod
    def _validate(req: LaunchRequest, env: dict[str, str]) -> None:
        if req.image:
            raise OperatorError(
                f"run {req.key} asks for image {req.image!r}, but the local executor runs "
                "processes on this machine without containers; use the docker or kubernetes "
                "executor, or remove the image from the spec")
        if req.user and req.user != pwd.getpwuid(os.getuid()).pw_name:
            raise OperatorError(
                f"run {req.key} asks to run as user {req.user!r}, but the local executor runs "
                "as the current user; remove the user from the spec or use another executor")
        cwd = Path(req.cwd).expanduser()
        if not cwd.is_dir():
            raise OperatorError(
                f"working directory {str(cwd)!r} for run {req.key} does not exist or is not a "
                "directory; create it or fix the spec's working directory")
        program = req.argv[0]
        if os.sep in program:
            path = cwd / Path(program).expanduser()
            if not path.is_file():
                raise OperatorError(
                    f"program {program!r} for run {req.key} not found (looked for {str(path)!r}); "
                    "fix the command's path, which is relative to the working directory")
            if not os.access(path, os.X_OK):
                raise OperatorError(
                    f"program {str(path)!r} for run {req.key} is not executable; "
                    f"run `chmod +x {shlex.quote(str(path))}` or start it through its interpreter")
        elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
            raise OperatorError(
                f"program {program!r} for run {req.key} not found on PATH; install it, give its "
                "full path, or add its directory to PATH in the spec's env")

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
                "remove it only if no run with that key is still running") from exc

    def poll(self, handle: dict[str, Any]) -> RunStatus:
        """running while the supervisor lives; exited once it recorded the exit; otherwise lost."""
        h = self._handle(handle)
        record = self._read_exit(h)
        if record is not None:
            return record
        if self._supervisor_alive(h):
            return RunStatus(state="running")
        record = self._read_exit(h)  # it may have written the record and exited just now
        if record is not None:
            return record
        return RunStatus(state="lost", detail=LOST_DETAIL)

    # ---------------------------------------------------------------------------------- stop
    def stop(self, handle: dict[str, Any], grace_s: float = 10.0) -> RunStatus:
        """SIGTERM the process group, SIGKILL it after `grace_s`; safe when already ended."""
        h = self._handle(handle)
        sent: int | None = None
        if not self._ended(h):
            sent = signal.SIGTERM
            self._killpg(h, signal.SIGTERM)
            if not self._wait_ended(h, grace_s):
                sent = signal.SIGKILL
                self._killpg(h, signal.SIGKILL)
                self._wait_ended(h, _KILL_WAIT_S)
        status = self.poll(h.model_dump())
        if status.state == "lost" and sent is not None:
            # We know why it ended: record it, so later polls say "stopped" rather than "lost".
            name = signal.Signals(sent).name
            write_exit_file(h.exit_file, {
                "exit_code": None, "signal": int(sent),
                "detail": f"stopped with {name}; the supervisor ended before recording the exit"})
            status = self.poll(h.model_dump())
        return status

    def _ended(self, h: LocalHandle) -> bool:
        return not self._supervisor_alive(h) and not self._group_has_live_members(h)

    def _wait_ended(self, h: LocalHandle, timeout_s: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._ended(h):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_INTERVAL_S)

    def _killpg(self, h: LocalHandle, sig: int) -> None:
        if not self._group_is_ours(h):
            return
        try:
            os.killpg(h.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # ---------------------------------------------------------------------------------- logs
    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        """The last `tail` lines of the run's combined stdout and stderr."""
        return _read_tail(Path(self._handle(handle).log_path), tail)

    def render(self, req: LaunchRequest) -> str:
        """One line saying what would run, for a dry run; for display only, never executed."""
        env = {**req.env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in req.gpus),
               "NIGHTSHIFT_RUN_KEY": req.key}
        shown = " ".join(
            f"{k}={'***' if _SECRET_RE.search(k) and k != 'NIGHTSHIFT_RUN_KEY' else shlex.quote(v)}" for k, v in env.items())
        gpus = ",".join(str(g) for g in req.gpus) or "none"
        return (f"[local {req.key}] cd {shlex.quote(req.cwd)} && {shown} {shlex.join(req.argv)}"
                f" >> {shlex.quote(req.log_path)} 2>&1  (gpus: {gpus})")

    # ------------------------------------------------------------------------------ helpers
    def _handle_file(self, key: str) -> Path:
        return self.handles_dir / f"{key}.json"

    @staticmethod
    def _check_key(key: str) -> None:
        if not _KEY_RE.match(key):
            raise OperatorError(
                f"run key {key!r} is not usable as a file name; use letters, digits, '.', '_' "
                "and '-' (at most 200 characters), starting with a letter or digit")

    @staticmethod
    def _handle(handle: dict[str, Any]) -> LocalHandle:
        kind = handle.get("kind") if isinstance(handle, dict) else None
        if kind != "local":
            raise OperatorError(
                f"handle is for the {kind!r} executor, not 'local'; the attempt was started by "
                "another executor: configure that one to manage it")
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
        return RunStatus(state="exited", exit_code=rec.exit_code, signal=rec.signal,
                         detail=rec.detail)

    @staticmethod
    def _supervisor_alive(h: LocalHandle) -> bool:
        """True while the supervisor process of this handle (same pid and start time) lives."""
        if not _has_proc():
            try:
                os.kill(h.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        stat = _proc_stat(h.pid)
        if stat is None:
            return False
        state, start_time = stat
        if state in ("Z", "X", "x"):  # a zombie has ended; its parent has not reaped it yet
            return False
        return h.start_time is None or start_time == h.start_time

    @staticmethod
    def _group_is_ours(h: LocalHandle) -> bool:
        """False when the group id now belongs to an unrelated process that reused the pid.

        Linux never hands out a pid still in use as a process-group id, so if a process with
        that pid exists but started at another time, our group is gone.
        """
        stat = _proc_stat(h.pgid)
        return stat is None or h.start_time is None or stat[1] == h.start_time

    def _group_has_live_members(self, h: LocalHandle) -> bool:
        """True while any non-zombie process of the run's group lives (e.g. data-loader workers)."""
        if not self._group_is_ours(h):
            return False
        if not _has_proc():
            try:
                os.killpg(h.pgid, 0)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                raw = Path(entry.path, "stat").read_text()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            fields = raw[raw.rindex(")") + 2:].split()
            if int(fields[2]) == h.pgid and fields[0] not in ("Z", "X", "x"):
                return True
        return False

    @staticmethod
    def _write_json(path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
