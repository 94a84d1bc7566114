"""Per-call costs: what one library call, one graph step, one audit event and one CLI start cost.

    python -m nightshift.evals.bench_calls                      # the sizes in docs/benchmarks.md
    python -m nightshift.evals.bench_calls --quick              # small sizes: a smoke test
    python -m nightshift.evals.bench_calls --json calls.json    # also write the numbers

Each measure runs in its own fresh NIGHTSHIFT_HOME (a temporary folder) with the embedded default
store (SQLite):

1. `Client().submit(spec=..., params=...)` calls/s from 1 process and from 4 processes at once
   (multiprocessing, spawn; each process builds its own Client and makes one untimed warm-up
   submission, then all wait on a barrier and make K timed calls, each with its own call_id).
   Rate = timed calls / (last process's end - first process's start). Afterwards: Job rows ==
   calls made, no `submitted_by_call` twice, every call_id present, and the audit chain verifies
   (`AuditLog.verify().ok`, what `nightshift audit verify` runs). A call that raised (e.g. a
   SQLite lock error) is counted and its first messages are kept, never hidden.
2. Graph one-call overhead: a one-step goal (`steps: [{skill: list_jobs}]`) through
   `build_graph(w, DeterministicPlanner(), checkpointer=sqlite_checkpointer(w))`, as the CLI
   runs goals, minus the direct call `get_skill("list_jobs")(w.context(user), args)`; median
   over N interleaved runs after a warm-up.
3. `AuditLog.append` events/s, one process, small payload.
4. `AuditLog.verify()` events/s over a log of V events (the log of 3, topped up untimed).
5. Wall time of `nightshift --help` and `nightshift jobs` (subprocess; the console script next to
   this Python, else `python -m nightshift.agent.doors.cli`), median of R runs after one untimed run
   (`--quick`: one run, no warm-up).
6. Raw SQLite baseline: transactions of 4 row inserts per second (sqlite3 module, WAL,
   synchronous=NORMAL, BEGIN IMMEDIATE) on the same disk: what the machine allows.

Only public APIs are used (Client, Wiring.load, AuditLog.append/verify, build_graph,
DeterministicPlanner, get_skill); a measure whose API is missing or fails reports "n/a" and why.
Exit status: 0, or 1 when a submission was lost or doubled or the audit chain did not verify.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = {
    "name": "bench-calls",
    "command": ["{python}", "-c", "pass"],
    "resources": {"gpus": 0},
    "parameters": {"lr": 0.001},
}
PARAMS: dict[str, Any] = {"lr": 0.01}
PAYLOAD: dict[str, Any] = {"skill": "list_jobs", "decision": "allow", "rule": "bench", "n": 1}

FULL = {
    "submit_k": 250,
    "graph_n": 100,
    "append_n": 5_000,
    "verify_n": 20_000,
    "cli_runs": 5,
    "cli_warmup": 1,
    "sqlite_n": 2_000,
}
QUICK = {
    "submit_k": 10,
    "graph_n": 8,
    "append_n": 200,
    "verify_n": 1_000,
    "cli_runs": 1,
    "cli_warmup": 0,
    "sqlite_n": 200,
}

MEASURES = (
    "submit_1proc",
    "submit_4proc",
    "graph_overhead",
    "audit_append",
    "audit_verify",
    "cli_help",
    "cli_jobs",
    "sqlite_raw",
)


def _m(
    what: str,
    value: float | None,
    unit: str,
    goal: str = "",
    met: bool | None = None,
    detail: str = "",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "what": what,
        "value": value,
        "unit": unit,
        "goal": goal,
        "met": met,
        "detail": detail,
        **extra,
    }


def _na(what: str, unit: str, goal: str, exc: BaseException) -> dict[str, Any]:
    return _m(what, None, unit, goal, None, f"n/a: {type(exc).__name__}: {exc}"[:300])


@contextmanager
def fresh_home(root: Path, name: str) -> Iterator[Path]:
    """A new NIGHTSHIFT_HOME under root, set in os.environ for the block (children inherit it)."""
    home = root / name
    home.mkdir(parents=True)
    saved = {k: v for k, v in os.environ.items() if k.startswith("NIGHTSHIFT_")}
    for k in saved:
        del os.environ[k]
    os.environ["NIGHTSHIFT_HOME"] = str(home)
    try:
        yield home
    finally:
        for k in [k for k in os.environ if k.startswith("NIGHTSHIFT_")]:
            del os.environ[k]
        os.environ.update(saved)


def _dispose(w: Any) -> None:
    store = w.__dict__.get("store")  # only if it was built (cached_property)
    engine = getattr(store, "engine", None)
    if engine is not None and hasattr(engine, "dispose"):
        engine.dispose()


# ------------------------------------------------------------------------------ 1. submissions
def submit_worker(proc: int, k: int, barrier: Any, results: Any) -> None:
    """One submitting process (spawned): own Client, one warm-up submission, barrier, K calls."""
    out: dict[str, Any] = {"proc": proc, "ok": [], "errors": [], "start": None, "end": None}
    try:
        from nightshift.agent.doors.api import Client

        client = Client()
        warm = f"bench-{proc}-warm"
        client.submit(spec=SPEC, params=PARAMS, call_id=warm)
        out["ok"].append(warm)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which says n/a
        out["setup_error"] = f"{type(exc).__name__}: {exc}"
        try:
            barrier.abort()
        finally:
            results.put(out)
        return
    try:
        barrier.wait(timeout=300)
    except Exception as exc:  # noqa: BLE001 - a sibling failed to start
        out["setup_error"] = f"barrier: {type(exc).__name__}: {exc}"
        results.put(out)
        return
    out["start"] = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    for i in range(k):
        cid = f"bench-{proc}-{i}"
        try:
            client.submit(spec=SPEC, params=PARAMS, call_id=cid)
            out["ok"].append(cid)
        except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
            out["errors"].append(f"{cid}: {type(exc).__name__}: {exc}"[:300])
    out["end"] = time.perf_counter()
    _dispose(client.w)
    results.put(out)


def _stored_calls(w: Any) -> list[str | None]:
    """submitted_by_call of every Job row: through the store's model, else raw SQLite."""
    try:
        from sqlalchemy import select

        from nightshift.runtime.store.db import Job

        with w.store.session() as s:
            return list(s.execute(select(Job.submitted_by_call)).scalars())
    except (ImportError, AttributeError):
        url = str(getattr(w.settings, "store_url", ""))
        if not url.startswith("sqlite:///"):
            raise
        con = sqlite3.connect(url[len("sqlite:///") :])
        try:
            return [r[0] for r in con.execute("SELECT submitted_by_call FROM job")]
        finally:
            con.close()


def bench_submit(root: Path, procs: int, k: int) -> dict[str, Any]:
    what = f"Client().submit, {procs} process{'es' if procs > 1 else ''} × {k} calls"
    goal = "≥ 1,000/s" if procs == 4 else ""
    with fresh_home(root, f"submit-{procs}"):
        from nightshift.agent.brain.wiring import Wiring

        w = Wiring.load()
        w.store  # noqa: B018 - the schema, created once before the processes race for it
        ctx = mp.get_context("spawn")
        barrier, results = ctx.Barrier(procs), ctx.Queue()
        kids = [
            ctx.Process(target=submit_worker, args=(p, k, barrier, results), daemon=True)
            for p in range(procs)
        ]
        for kid in kids:
            kid.start()
        outs = []
        try:
            for _ in kids:
                outs.append(results.get(timeout=600))
        finally:
            for kid in kids:
                kid.join(timeout=30)
                if kid.is_alive():
                    kid.kill()
        setup = [o["setup_error"] for o in outs if o.get("setup_error")]
        if setup:
            _dispose(w)
            return _m(what, None, "calls/s", goal, None, "n/a: " + "; ".join(setup)[:300])
        rows = _stored_calls(w)
        try:
            verified = w.audit.verify()
            verify_ok, audit_events = bool(verified.ok), int(verified.count)
            verify_reason = str(verified.reason)
        except Exception as exc:  # noqa: BLE001
            verify_ok, audit_events, verify_reason = False, 0, f"{type(exc).__name__}: {exc}"
        _dispose(w)
    ok = [c for o in outs for c in o["ok"]]
    errors = [e for o in outs for e in o["errors"]]
    present = set(rows)
    lost = len([c for c in ok if c not in present])
    doubled = len(rows) - len(present)
    made = procs * (k + 1)  # + one warm-up each
    timed = sum(len(o["ok"]) for o in outs) - procs
    span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    rate = timed / span if span > 0 else None
    detail = (
        f"lost/doubled: {lost}/{doubled}; rows {len(rows)} for {made} calls "
        f"({procs} warm-up); errors {len(errors)}; audit verify "
        f"{'ok' if verify_ok else 'FAILED: ' + verify_reason} ({audit_events} events)"
    )
    if errors:
        detail += "; first error: " + errors[0]
    met = None if not goal or rate is None else rate >= 1000
    return _m(
        what,
        rate,
        "calls/s",
        goal,
        met,
        detail,
        calls=made,
        rows=len(rows),
        lost=lost,
        doubled=doubled,
        errors=len(errors),
        error_samples=errors[:5],
        verify_ok=verify_ok,
        audit_events=audit_events,
        seconds=span,
    )


# ------------------------------------------------------------------------------ 2. graph step
def bench_graph(root: Path, n: int, warmup: int = 3) -> dict[str, Any]:
    what, goal = "graph one-call overhead (list_jobs goal − direct call)", "≤ 5 ms"
    with fresh_home(root, "graph"):
        from nightshift.agent.brain.graph import build_graph, sqlite_checkpointer
        from nightshift.agent.brain.planner import DeterministicPlanner
        from nightshift.agent.brain.wiring import Wiring
        from nightshift.agent.doors.api import Client
        from nightshift.skills.registry import get_skill

        w = Wiring.load()
        client = Client(w)
        for i in range(5):  # something for list_jobs to read
            client.submit(spec=SPEC, params=PARAMS, call_id=f"graph-seed-{i}")
        args: dict[str, Any] = {"limit": 5}
        goal_doc = {"name": "bench-list", "steps": [{"skill": "list_jobs", "args": args}]}
        saver = sqlite_checkpointer(w)
        graph = build_graph(w, DeterministicPlanner(), checkpointer=saver)
        user = w.user
        seq = iter(range(10**9))

        def direct() -> None:
            get_skill("list_jobs")(w.context(user), dict(args))

        def through_graph() -> None:
            cfg = {"configurable": {"thread_id": f"bench-calls-{next(seq)}"}}
            out = graph.invoke({"goal": goal_doc, "history": [], "on_behalf_of": user}, cfg)
            fin = out.get("finish") or {}
            hist = out.get("history") or []
            if not (fin.get("ok") and hist and hist[-1].get("status") == "ok"):
                raise RuntimeError(f"the one-step goal did not finish ok: {fin or out}")

        times: dict[str, list[float]] = {"direct": [], "graph": []}
        try:
            for i in range(warmup + n):
                for name, fn in (("direct", direct), ("graph", through_graph)):
                    t = time.perf_counter()
                    fn()
                    if i >= warmup:
                        times[name].append(time.perf_counter() - t)
        finally:
            conn = getattr(saver, "conn", None)
            if conn is not None:
                conn.close()
            _dispose(w)
    g, d = statistics.median(times["graph"]) * 1e3, statistics.median(times["direct"]) * 1e3
    over = g - d
    return _m(
        what,
        over,
        "ms",
        goal,
        over <= 5.0,
        f"median of {n}: graph {g:.2f} ms, direct {d:.2f} ms (graph min "
        f"{min(times['graph']) * 1e3:.2f}, max {max(times['graph']) * 1e3:.2f} ms)",
        graph_ms=g,
        direct_ms=d,
        n=n,
    )


# ------------------------------------------------------------------------------ 3-4. audit
def _audit_log(w: Any, home: Path) -> Any:
    log = getattr(w, "audit", None)
    if log is None:
        from nightshift.policies.audit import AuditLog

        log = AuditLog(w.store, home / "audit.anchor")
    return log


def bench_audit(root: Path, append_n: int, verify_n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    a_what, a_goal = f"AuditLog.append, 1 process ({append_n:,} events)", "≥ 5,000/s"
    v_what, v_goal = f"AuditLog.verify() over {verify_n:,} events", "≥ 100,000/s"
    with fresh_home(root, "audit") as home:
        from nightshift.agent.brain.wiring import Wiring

        w = Wiring.load()
        try:
            log = _audit_log(w, home)
            log.append("bench", "bench.warmup", payload=PAYLOAD)  # schema, statement cache
            t = time.perf_counter()
            for i in range(append_n):
                log.append(
                    "bench", "bench.event", skill="list_jobs", call_id=f"bench/{i}", payload=PAYLOAD
                )
            took = time.perf_counter() - t
            rate = append_n / took
            appended = _m(
                a_what,
                rate,
                "events/s",
                a_goal,
                rate >= 5000,
                f"{append_n:,} in {took:.2f} s; payload {len(json.dumps(PAYLOAD))} B",
                n=append_n,
                seconds=took,
            )
        except Exception as exc:  # noqa: BLE001
            _dispose(w)
            return _na(a_what, "events/s", a_goal, exc), _na(v_what, "events/s", v_goal, exc)
        try:
            have = append_n + 1
            batch = getattr(log, "batch", None)
            t = time.perf_counter()
            with batch() if callable(batch) else _nothing():
                for i in range(have, verify_n):
                    log.append("bench", "bench.fill", call_id=f"fill/{i}", payload=PAYLOAD)
            fill_s = time.perf_counter() - t
            t = time.perf_counter()
            result = log.verify()
            took = time.perf_counter() - t
            count = int(result.count)
            rate = count / took
            detail = (
                f"{count:,} events in {took:.2f} s; "
                f"{'ok' if result.ok else 'FAILED: ' + str(result.reason)} "
                f"(filled untimed in {fill_s:.0f} s)"
            )
            verified = _m(
                v_what,
                rate,
                "events/s",
                v_goal,
                rate >= 100_000,
                detail,
                n=count,
                seconds=took,
                verify_ok=bool(result.ok),
            )
        except Exception as exc:  # noqa: BLE001
            verified = _na(v_what, "events/s", v_goal, exc)
        _dispose(w)
    return appended, verified


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# ------------------------------------------------------------------------------ 5. CLI
def _cli() -> tuple[list[str], str]:
    script = Path(sys.executable).parent / "nightshift"
    if script.exists():
        return [str(script)], "console script"
    return [
        sys.executable,
        "-m",
        "nightshift.agent.doors.cli",
    ], "python -m nightshift.agent.doors.cli"


def bench_cli(root: Path, runs: int, warmup: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    cmd, how = _cli()
    out = []
    with fresh_home(root, "cli"):
        env = dict(os.environ)
        for name, argv in (("--help", ["--help"]), ("jobs", ["jobs"])):
            what, goal = f"nightshift {name} wall time ({how})", "< 0.5 s"
            try:
                times = []
                for i in range(warmup + runs):  # a warm-up writes .pyc files and the store
                    t = time.perf_counter()
                    done = subprocess.run(
                        [*cmd, *argv], env=env, capture_output=True, text=True, timeout=120
                    )
                    dt = time.perf_counter() - t
                    if done.returncode != 0:
                        raise RuntimeError(
                            f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-200:]}"
                        )
                    if i >= warmup:
                        times.append(dt)
                med = statistics.median(times)
                out.append(
                    _m(
                        what,
                        med,
                        "s",
                        goal,
                        med < 0.5,
                        f"median of {runs} after {warmup} untimed: min {min(times):.3f}, "
                        f"max {max(times):.3f} s",
                        n=runs,
                    )
                )
            except Exception as exc:  # noqa: BLE001
                out.append(_na(what, "s", goal, exc))
    return out[0], out[1]


# ------------------------------------------------------------------------------ 6. raw SQLite
def bench_sqlite(root: Path, n: int) -> dict[str, Any]:
    what = "raw SQLite: 4-row transactions (WAL, synchronous=NORMAL), same disk"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "raw.db"
    con = sqlite3.connect(str(path), isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, call_id TEXT UNIQUE, body TEXT)")
        body = json.dumps(PAYLOAD)
        t = time.perf_counter()
        for i in range(n):
            con.execute("BEGIN IMMEDIATE")
            con.executemany(
                "INSERT INTO t (call_id, body) VALUES (?, ?)",
                [(f"{i}/{j}", body) for j in range(4)],
            )
            con.execute("COMMIT")
        took = time.perf_counter() - t
        rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    finally:
        con.close()
    return _m(
        what,
        n / took,
        "tx/s",
        "",
        None,
        f"{n:,} transactions ({rows:,} rows) in {took:.2f} s; SQLite {sqlite3.sqlite_version}",
        n=n,
        seconds=took,
    )


# ------------------------------------------------------------------------------ run and print
def _commit() -> str | None:
    try:
        import nightshift

        where = Path(nightshift.__file__).resolve().parent
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return head.stdout.strip() + (" + working tree" if dirty.stdout.strip() else "")
    except Exception:  # noqa: BLE001 - not a git checkout
        return None


def run(quick: bool, workdir: str | None = None) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    root = Path(tempfile.mkdtemp(prefix="ns-bench-calls-", dir=workdir))
    steps: list[tuple[tuple[str, ...], Callable[[], Any], list[tuple[str, str, str]]]] = [
        (
            ("submit_1proc",),
            lambda: bench_submit(root, 1, sizes["submit_k"]),
            [("Client().submit, 1 process", "calls/s", "")],
        ),
        (
            ("submit_4proc",),
            lambda: bench_submit(root, 4, sizes["submit_k"]),
            [("Client().submit, 4 processes", "calls/s", "≥ 1,000/s")],
        ),
        (
            ("graph_overhead",),
            lambda: bench_graph(root, sizes["graph_n"]),
            [("graph one-call overhead", "ms", "≤ 5 ms")],
        ),
        (
            ("audit_append", "audit_verify"),
            lambda: bench_audit(root, sizes["append_n"], sizes["verify_n"]),
            [
                ("AuditLog.append", "events/s", "≥ 5,000/s"),
                ("AuditLog.verify()", "events/s", "≥ 100,000/s"),
            ],
        ),
        (
            ("cli_help", "cli_jobs"),
            lambda: bench_cli(root, sizes["cli_runs"], sizes["cli_warmup"]),
            [("nightshift --help", "s", "< 0.5 s"), ("nightshift jobs", "s", "< 0.5 s")],
        ),
        (
            ("sqlite_raw",),
            lambda: bench_sqlite(root / "raw", sizes["sqlite_n"]),
            [("raw SQLite 4-row transactions", "tx/s", "")],
        ),
    ]
    measures: dict[str, Any] = {}
    t0 = time.time()
    try:
        for keys, fn, labels in steps:
            try:
                got = fn()
                got = got if isinstance(got, tuple) else (got,)
            except Exception as exc:  # noqa: BLE001 - one measure's failure is its n/a
                traceback.print_exc(file=sys.stderr)
                got = tuple(_na(w, u, g, exc) for w, u, g in labels)
            measures.update(zip(keys, got, strict=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    meta = {
        "commit": _commit(),
        "quick": quick,
        "sizes": sizes,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "seconds": round(time.time() - t0, 1),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "argv": sys.argv,
    }
    return {"meta": meta, "measures": measures}


def _fmt(m: dict[str, Any]) -> str:
    v = m["value"]
    if v is None:
        return "n/a"
    unit = m["unit"]
    num = f"{v:,.0f}" if v >= 100 else f"{v:,.3f}" if unit == "s" else f"{v:,.2f}"
    return f"{num} {unit}"


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console, JustifyMethod
    from rich.table import Table

    meta = result["meta"]
    table = Table(
        title=f"nightshift per-call costs ({'quick' if meta['quick'] else 'full'}; "
        f"commit {meta['commit'] or '?'}; {meta['cpus']} CPUs, Python "
        f"{meta['python']}, SQLite {meta['sqlite']}; {meta['seconds']:.0f} s)"
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("measure", "left"),
        ("value", "right"),
        ("goal", "left"),
        ("met?", "left"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, overflow="fold")
    for m in result["measures"].values():
        met = "" if m["met"] is None else ("yes" if m["met"] else "no")
        table.add_row(m["what"], _fmt(m), m["goal"], met)
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    console.print(table)
    for key, m in result["measures"].items():
        if m["detail"]:
            console.print(f"  {key}: {m['detail']}", highlight=False, soft_wrap=True)


def integrity_failures(result: dict[str, Any]) -> list[str]:
    bad = []
    for key in ("submit_1proc", "submit_4proc"):
        m = result["measures"].get(key) or {}
        if m.get("value") is None:
            continue
        if (
            m.get("lost")
            or m.get("doubled")
            or m.get("rows") != m.get("calls")
            or not m.get("verify_ok")
        ):
            bad.append(f"{key}: {m.get('detail')}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nightshift.evals.bench_calls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test (seconds)")
    ap.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    ap.add_argument(
        "--workdir",
        metavar="DIR",
        default=None,
        help="where the temporary homes go (default: the system temp folder)",
    )
    args = ap.parse_args(argv)
    result = run(args.quick, args.workdir)
    print_table(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    bad = integrity_failures(result)
    for line in bad:
        print(f"INTEGRITY: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
