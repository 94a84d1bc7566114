"""`nightshift run` at a terminal shows the job it watches on the live status line of `logs -f`
(job, state, attempt, step, loss), kept under the lines it prints; piped, it prints exactly what
it printed before, so what scripts parse does not change."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

from conftest import REPO, nightshift

GOAL = "examples/goals/quickstart.yaml"  # a crash at step 140, a resume, success
STATUS = re.compile(r"job 1 (running|queued) · attempt (1|2) · step \d+ · loss [\d.]+")


def _at_a_terminal(*args: str, timeout: float = 180) -> tuple[int, str]:
    """The CLI with a pseudo-terminal as its stdin, stdout and stderr: its exit code and all it
    wrote there."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", *args],
        cwd=REPO,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    out, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the terminal's other end is closed: the command has ended
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_run_at_a_terminal_shows_the_status_line_under_its_lines(home) -> None:
    code, out = _at_a_terminal("run", GOAL)
    assert code == 0, out[-3000:]
    assert STATUS.search(out), out[-3000:]
    assert "\r\x1b[2K" in out  # cleared before each printed line, drawn again after
    # run's own lines are all still there, each on a line of its own.
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", x).split("\r")[-1] for x in out.splitlines()]
    assert "→ watching job 1" in lines, lines
    assert any(x.startswith("    attempt 2: step 300 loss") for x in lines), lines
    assert any("steps lost to failures" in x for x in lines), lines


def test_run_piped_prints_no_status_line(home) -> None:
    r = nightshift("run", GOAL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "→ watching job 1" in r.stdout
    assert "· attempt" not in r.stdout + r.stderr and "\x1b[2K" not in r.stdout + r.stderr
