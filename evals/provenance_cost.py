"""Provenance: what recording it costs each launch (issue 30).

`nightshift eval provenance [--launches N] [--quick] [--out DIR]`

1. **Per launch.** `Engine.start_attempt` end to end (claim, attempt row, audit event, the
   launch request, the executor's start), with an executor that returns at once so that only the
   engine's own work is timed, N launches each way, interleaved launch by launch:

   * `off` — the engine with its provenance capture removed (the launch as it was before);
   * `warm` — provenance on, a clean git tree, the interpreter's package list already read once
     (the cache keyed on its site-packages' mtimes answers);
   * `cold` — provenance on, the package cache deleted before each launch: the launch records
     the package list as pending and `pip freeze` runs on the engine's worker thread after it
     (waited for between launches, untimed; its own cost is the `pip freeze` part below);
   * `dirty + data` — warm, but the tree is dirty (a diff kept, untracked files listed) and the
     spec names a data folder of 1,000 small files (stat'ed for the fingerprint).

   The table gives the median, min and max launch time, and the median's extra over `off`.
2. **Parts.** Each part of one capture timed alone: the git reading (clean, dirty), the package
   list (cold, cached), the data fingerprint (1,000 files), a content hash of 64 MB; run as root
   (as a shared install's daemon is), also git and the data fingerprint read as the submitter
   (git with the submitter's uid, gid and groups; the data by a child that drops to them).

Everything runs in a temporary NIGHTSHIFT_HOME and git repository; nothing reaches the network.
The interpreter is the one running the eval (its venv's `pip freeze`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.evals.output import write_csv


class _Instant:
    """An executor that starts nothing and answers at once: only the engine's work is timed."""

    kind = "local"

    def start(self, req: Any) -> dict[str, Any]:
        return {"pid": 0, "key": req.key}

    def find(self, key: str) -> dict[str, Any] | None:
        return None


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=e", "-c", "user.email=e@example.com", *args],
        check=True,
        capture_output=True,
    )


def _repo(root: Path) -> Path:
    repo = root / "code"
    repo.mkdir(parents=True)
    for i in range(50):
        (repo / f"mod_{i}.py").write_text(f"X = {i}\n" * 40)
    (repo / "train.py").write_text("print('hi')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "bench")
    return repo


def _data(root: Path, files: int = 1000) -> Path:
    d = root / "data"
    d.mkdir()
    for i in range(files):
        (d / f"shard_{i:05d}.bin").write_bytes(os.urandom(256))
    return d


def launches(root: Path, n: int) -> dict[str, list[float]]:
    """Seconds per `start_attempt`, each way, interleaved."""
    os.environ["NIGHTSHIFT_HOME"] = str(root / "home")
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client

    repo = _repo(root)
    dirty = root / "dirty"
    shutil.copytree(repo, dirty)
    (dirty / "train.py").write_text("print('changed')\n")
    (dirty / "scratch.txt").write_text("x\n")
    data = _data(root)
    w = Wiring.load(None)
    w.engine.executor = _Instant()  # type: ignore[assignment]
    client = Client(w)
    home = w.settings.home_path
    from nightshift.runtime.training.provenance import pythons_cache

    cache = pythons_cache(home)
    real_record = w.engine._record_provenance

    def spec(name: str, code: Path, with_data: bool) -> dict[str, Any]:
        s: dict[str, Any] = {
            "name": name,
            "code": {"path": str(code)},
            "command": ["{python}", "train.py"],
            "seed": 1,
        }
        if with_data:
            s["data"] = [{"path": str(data)}]
        return s

    ways: dict[str, tuple[Path, bool, Callable[[], None]]] = {
        "off": (repo, False, lambda: None),
        "warm": (repo, False, lambda: None),
        "cold": (repo, False, lambda: cache.unlink(missing_ok=True)),
        "dirty + data": (dirty, True, lambda: None),
    }
    out: dict[str, list[float]] = {k: [] for k in ways}
    now = datetime(2026, 12, 5, 3, 0)
    for i in range(n + 1):  # the first round warms up and is not counted
        for way, (code, with_data, before) in ways.items():
            job = client.submit(spec=spec(f"b{i}-{way.replace(' + ', '-')}", code, with_data))
            before()
            w.engine._record_provenance = (  # type: ignore[method-assign]
                (lambda att, job: None) if way == "off" else real_record
            )
            t0 = time.perf_counter()
            att = w.engine.start_attempt(job, [], now)
            dt = time.perf_counter() - t0
            assert att is not None
            w.engine.drain_provenance()  # a package list read after the launch: not timed
            if i:
                out[way].append(dt)
    return out


def parts(root: Path) -> dict[str, float]:
    """Each part of a capture alone (median of 5)."""
    from nightshift.runtime.training import provenance as p

    blobs = p.blobs_of(root / "home2")
    repo = _repo(root / "p")
    data = _data(root / "p", 1000)
    big = root / "p" / "big.bin"
    big.write_bytes(os.urandom(64 << 20))
    cache = root / "home2" / "pythons.json"

    def med(fn: Callable[[], Any], before: Callable[[], None] = lambda: None) -> float:
        times = []
        for _ in range(5):
            before()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    got = {
        "git, clean tree": med(lambda: p.git_info(repo, p.Budget(), blobs)),
        "package list, pip freeze": med(
            lambda: p.python_info(sys.executable, p.Budget(), blobs, cache),
            lambda: cache.unlink(missing_ok=True),
        ),
        "package list, cached": med(
            lambda: p.python_info(sys.executable, p.Budget(), blobs, cache)
        ),
        "data, 1,000 files (stat)": med(
            lambda: p.data_info([{"path": str(data)}], repo, p.Budget())
        ),
        "data, 64 MB (sha256)": med(
            lambda: p.data_info([{"path": str(big), "hash": True}], repo, p.Budget())
        ),
    }
    me = _me()
    if me is not None:  # the reads a shared install makes as each job's submitter
        got["git, clean tree, as the submitter"] = med(
            lambda: p.git_info(repo, p.Budget(), blobs, me)
        )
        got["data, 1,000 files (stat), as the submitter"] = med(
            lambda: p.data_info_as([{"path": str(data)}], repo, p.Budget(), me)
        )
    (repo / "train.py").write_text("print('changed')\n")
    (repo / "scratch.txt").write_text("x\n")
    got["git, dirty tree (diff kept)"] = med(lambda: p.git_info(repo, p.Budget(), blobs))
    if me is not None:
        got["git, dirty tree (diff kept), as the submitter"] = med(
            lambda: p.git_info(repo, p.Budget(), blobs, me)
        )
    return got


def _me() -> Any:
    """This account as a run's submitter, for timing the reads made as one (the same drop of
    uid, gid and groups, to the same account); None where this process may not set its groups
    (not root), as a daemon that runs jobs as their submitters always may."""
    if os.geteuid() != 0:
        return None
    import pwd

    from nightshift.runtime.executors.submitter import RunAs

    pw = pwd.getpwuid(os.getuid())
    return RunAs(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir or "/")


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for k in rows[0]:
        t.add_column(k, justify="left" if k in ("benchmark", "variant") else "right")
    for r in rows:
        t.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()])
    Console(width=130).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval provenance", description=__doc__)
    ap.add_argument("--launches", type=int, default=20, help="timed launches per way (20)")
    ap.add_argument("--quick", action="store_true", help="5 launches per way")
    ap.add_argument("--out", default="evals/out", help="folder for the CSV (default evals/out)")
    args = ap.parse_args(argv)
    n = 5 if args.quick else args.launches
    if n < 1:
        print("error: --launches must be at least 1", file=sys.stderr)
        return 2
    keep = os.environ.get("NIGHTSHIFT_HOME")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ns-prov-") as tmp:
        try:
            got = launches(Path(tmp), n)
        finally:
            if keep is None:
                os.environ.pop("NIGHTSHIFT_HOME", None)
            else:
                os.environ["NIGHTSHIFT_HOME"] = keep
        base = statistics.median(got["off"])
        for way, times in got.items():
            med = statistics.median(times)
            rows.append(
                {
                    "benchmark": "launch",
                    "variant": way,
                    "n": len(times),
                    "median_ms": med * 1000,
                    "min_ms": min(times) * 1000,
                    "max_ms": max(times) * 1000,
                    "extra_ms": (med - base) * 1000,
                }
            )
        for part, t in parts(Path(tmp)).items():
            rows.append(
                {
                    "benchmark": "part",
                    "variant": part,
                    "n": 5,
                    "median_ms": t * 1000,
                    "min_ms": "",
                    "max_ms": "",
                    "extra_ms": "",
                }
            )
    out = Path(args.out)
    write_csv(out / "provenance.csv", rows)
    print_table(rows, f"provenance capture per launch ({n} launches per way, interleaved)")
    print(f"wrote {out / 'provenance.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
