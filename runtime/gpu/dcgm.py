"""`dcgmi diag -r 1` on one GPU, where NVIDIA's DCGM is installed: the quick (seconds-long)
deployment suite, run before a quarantined GPU goes back into placement (skills/gpu_health.py).

dcgmi prints its verdicts as a table, one row per test, grouped in sections (Deployment,
Integration, Hardware, Stress; DCGM 3 adds a Metadata section of versions, which is no test):

    | Persistence Mode          | Pass                                           |
    | PCIe                      | Fail - All                                     |
    | Warning                   | GPU 0 Error using CUDA API cudaDeviceGetByPCI  |
    |                           | BusId Check DCGM and system logs for errors.   |

A result is Pass, Fail, Skip or Warn (DCGM 3's per-GPU form adds ` - All` or ` - GPU: 0`); a row
named Warning, Info or Error (and the blank-named rows after it) says why, of the test above it.
The GPU passes when dcgmi exits 0, at least one test ran, and none says Fail; Skip and Warn do
not fail it (they are kept with the rest). Run with an argv list, never a shell, and a timeout.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from pydantic import BaseModel, Field

DIAG_LEVEL = 1  # the quick suite: deployment checks, seconds
MAX_OUTPUT = 8000  # of dcgmi's output, the last this much is kept as evidence
_ROW = re.compile(r"^\s*\|(?P<name>[^|]*)\|(?P<raw>[^|]*)\|\s*$")
_SECTION = re.compile(r"^\s*[|+]-+\s+(?P<name>[A-Za-z][A-Za-z ]*?)\s+-+[+|]")
_RESULTS = ("Pass", "Fail", "Skip", "Warn")
_DETAIL_ROWS = ("Warning", "Info", "Error")


class DiagTest(BaseModel):
    section: str | None = Field(None, description="Deployment, Integration, Hardware, Stress")
    name: str
    result: str = Field(description="Pass | Fail | Skip | Warn")
    scope: str | None = Field(None, description="DCGM 3's `All` or `GPU: 0` after the result")
    detail: str | None = Field(None, description="Its Warning / Info / Error row, joined")


class DcgmDiag(BaseModel):
    """One `dcgmi diag` run on one GPU, kept as the evidence of a quarantine's end (or not)."""

    argv: list[str]
    passed: bool = Field(description="exit 0, a test ran, and none failed")
    exit_code: int | None = Field(None, description="None: it did not end (timeout) or start")
    tests: list[DiagTest] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list, description="The tests that said Fail")
    output: str = Field("", description=f"dcgmi's output, the last {MAX_OUTPUT} characters")
    error: str | None = Field(None, description="Why it did not run or could not be read")


def available() -> str | None:
    """dcgmi's path on PATH, or None where DCGM is not installed."""
    return shutil.which("dcgmi")


def parse(text: str) -> list[DiagTest]:
    """The tests of a `dcgmi diag` result table, in order, each with its section and detail."""
    tests: list[DiagTest] = []
    section: str | None = None
    detail_of: DiagTest | None = None
    full = False  # the last detail piece filled its cell: the next one continues its word
    for line in text.splitlines():
        head = _SECTION.match(line)
        if head:
            section, detail_of = head["name"].strip(), None
            continue
        row = _ROW.match(line)
        if row is None:
            continue
        name, raw = row["name"].strip(), row["raw"]
        piece = (raw[1:] if raw.startswith(" ") else raw).rstrip()
        if name in _DETAIL_ROWS and tests:
            detail_of = tests[-1]
            detail_of.detail = f"{detail_of.detail} {piece.strip()}" if detail_of.detail else piece
        elif not name and detail_of is not None:
            joined = f"{detail_of.detail or ''}{'' if full else ' '}{piece}"
            detail_of.detail = " ".join(joined.split())
        else:
            detail_of = None
            verdict, _, scope = piece.strip().partition(" - ")
            if verdict in _RESULTS:  # not the header, a Metadata row (versions), anything else
                tests.append(
                    DiagTest(section=section, name=name, result=verdict, scope=scope or None)
                )
        full = len(piece) >= len(raw) - 3
    return tests


def run(gpu_index: int, *, timeout_s: float, exe: str | None = None) -> DcgmDiag:
    """`dcgmi diag -r 1 -i INDEX`, read. A dcgmi that is missing, times out, exits non-zero or
    prints no test is not a pass."""
    exe = exe or available()
    argv = [exe or "dcgmi", "diag", "-r", str(DIAG_LEVEL), "-i", str(int(gpu_index))]
    if exe is None:
        return DcgmDiag(argv=argv, passed=False, error="dcgmi is not on PATH")
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        return DcgmDiag(
            argv=argv,
            passed=False,
            output=out[-MAX_OUTPUT:],
            error=f"dcgmi diag did not end within {timeout_s:g} s",
        )
    except OSError as exc:
        return DcgmDiag(argv=argv, passed=False, error=f"dcgmi could not start: {exc}")
    out = (proc.stdout or "") + (f"\n{proc.stderr}" if proc.stderr and proc.stderr.strip() else "")
    tests = parse(proc.stdout or "")
    failed = [t.name for t in tests if t.result == "Fail"]
    error = None
    if proc.returncode != 0:
        error = f"dcgmi diag exited with code {proc.returncode}"
    elif not tests:
        error = "dcgmi diag printed no test result"
    return DcgmDiag(
        argv=argv,
        passed=error is None and not failed,
        exit_code=proc.returncode,
        tests=tests,
        failed=failed,
        output=out[-MAX_OUTPUT:],
        error=error,
    )


def summary(d: DcgmDiag) -> str:
    """One line: `dcgmi diag -r 1 passed (9 tests)`, or what failed and why."""
    ran = f"{len(d.tests)} test(s)"
    if d.passed:
        skipped = [t.name for t in d.tests if t.result in ("Skip", "Warn")]
        more = f"; skipped or warned: {', '.join(skipped)}" if skipped else ""
        return f"dcgmi diag -r {DIAG_LEVEL} passed ({ran}{more})"
    if d.failed:
        return f"dcgmi diag -r {DIAG_LEVEL} failed: {', '.join(d.failed)}"
    return f"dcgmi diag -r {DIAG_LEVEL} gave no pass: {d.error}"
