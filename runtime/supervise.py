"""Run one command and record how it ended, so that a process that did not start it can know.

Only a parent can `waitpid` its child, so a daemon that restarted (or a CLI that merely looks)
could otherwise never learn a run's exit code. The local executor therefore launches every run as

    python -m nightshift.runtime.supervise --exit-file PATH -- argv...

This supervisor starts argv as its child in the same process group, ignores SIGTERM and SIGINT
itself (so a `killpg` reaches the child while the supervisor stays to record the outcome), waits,
and writes `{"exit_code": int|null, "signal": int|null}` atomically to PATH. It exits with the
child's code, or 128+N when the child died from signal N. Right after starting the child it writes
`{"pid": int, "create_time": float|null}` to PATH.child, so that if the supervisor itself is
killed, the child it leaves behind can still be found (and told apart from a recycled pid). Only
the standard library is imported before the child starts, so start-up stays fast.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
from typing import Any

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


def child_file(exit_file: str) -> str:
    """Where the supervisor records which process it started."""
    return f"{exit_file}.child"


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
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ignore(signum: int, frame: object) -> None:
    """A no-op handler rather than SIG_IGN: handlers reset to default on exec, SIG_IGN would not."""


def _parse(args: list[str]) -> tuple[str, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m nightshift.runtime.supervise",
        description="Run a command and record its exit status in a JSON file.",
    )
    parser.add_argument("--exit-file", required=True, help="where to write the exit status")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- command and its arguments")
    ns = parser.parse_args(args)
    argv = list(ns.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        parser.error("no command given after --")
    return ns.exit_file, argv


def main(args: list[str] | None = None) -> int:
    # Install the handlers first: a stop that arrives while the child starts must not kill us.
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    exit_file, argv = _parse(sys.argv[1:] if args is None else args)

    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT
        code = EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE
        detail = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        print(f"nightshift supervise: {detail}", file=sys.stderr, flush=True)
        write_exit_file(exit_file, {"exit_code": code, "signal": None, "detail": detail})
        return code

    try:
        write_exit_file(
            child_file(exit_file), {"pid": child.pid, "create_time": _create_time(child.pid)}
        )
    except OSError as exc:  # the run matters more than the record; the env marker still finds it
        print(f"nightshift supervise: cannot record the child: {exc}", file=sys.stderr, flush=True)
    returncode = child.wait()  # PEP 475: retried after our no-op signal handlers run
    if returncode < 0:
        record: dict[str, Any] = {"exit_code": None, "signal": -returncode}
        status = 128 - returncode
    else:
        record = {"exit_code": returncode, "signal": None}
        status = returncode
    write_exit_file(exit_file, record)
    return status


if __name__ == "__main__":
    sys.exit(main())
