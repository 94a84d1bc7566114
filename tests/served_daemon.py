"""A real `nightshift daemon` on a fresh home serving its socket, and the real CLI as a user runs
it against it: as the daemon's client (`api.mode: client`, the shared install's path, where the
CLI cannot open the job's files) or in the single-user mode on the same home (`embedded`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nightshift.agent.doors.cli", *args]


@dataclass
class Daemon:
    home: Path
    sock: Path
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path

    def env_for(self, mode: str) -> dict[str, str]:
        return {**self.env, "NIGHTSHIFT_API__MODE": mode}

    def run(
        self,
        *args: str,
        mode: str = "client",
        cwd: Path = REPO,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            cli(*args),
            cwd=cwd,
            env={**self.env_for(mode), **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, mode: str = "client") -> subprocess.Popen:
        return subprocess.Popen(
            cli(*args),
            cwd=REPO,
            env=self.env_for(mode),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _answers(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(str(sock))
        except OSError:
            return False
        s.sendall(b'{"op": "whoami"}\n')
        return bool(s.makefile("rb").readline())


@contextlib.contextmanager
def served(root: Path) -> Iterator[Daemon]:
    """The daemon for a test module; stopped (and its socket folder removed) at the end."""
    run = Path(tempfile.mkdtemp(prefix="ns-follow-", dir="/tmp"))  # sockaddr_un is short
    home, sock, log = root / "home", run / "api.sock", root / "daemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env.update(
        NIGHTSHIFT_HOME=str(home),
        NIGHTSHIFT_API__SOCKET=str(sock),
        NIGHTSHIFT_GPU__PROBE="none",
        NIGHTSHIFT_LOOP__POLL_INTERVAL_S="0.1",
        NIGHTSHIFT_RETRY__BASE_S="1",
        NIGHTSHIFT_EXECUTOR__RUN_AS="daemon",
        COLUMNS="200",
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(cli("daemon"), cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        end = time.monotonic() + 60
        while not _answers(sock):
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the daemon did not serve {sock}:\n{log.read_text()}")
            time.sleep(0.1)
        yield Daemon(home, sock, env, proc, log)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(run, ignore_errors=True)
