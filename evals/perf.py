"""Performance: what the agent costs per skill call, and how fast the audit log appends and verifies.

`nightshift eval perf [--calls N] [--events N] [--repeats R] [--quick]`

1. **Agent step overhead.** One read skill, `gpu_health_check` against a declared two-GPU
   inventory (the probe a machine without GPUs uses; it records one GpuSample per GPU), called
   four ways, interleaved call by call so that every way sees the same store size:

   * `direct` — the skill function with a context, nothing around it;
   * `gate` — policy verdict and the skill through the gate, as `Client.call` does (kill-switch
     check, policy evaluation, three hash-chained audit appends: verdict, start, result);
   * `graph (memory)` — a one-call goal (`goal: health`) through the compiled LangGraph graph with
     the deterministic planner: plan → guard → act → plan → report, with LangGraph's in-memory
     checkpointer;
   * `graph (sqlite)` — the same with the SQLite checkpointer the daemon uses (`graph.db`).

   Each call is timed on its own after a warm-up; the table gives the median, min and max per call,
   the median's ratio to `direct`, and the hash-chained audit events each way appends per call
   (each append commits a write transaction and fsyncs the anchor file, so they dominate).
2. **Audit throughput.** In a fresh store, N events (10,000; `--quick`: 1,000) appended one by one
   from one process (each append is its own write transaction, plus the anchor file's atomic
   replace with fsync), then the whole chain verified. Repeated R times (fresh store each);
   events per second as median, min and max over the repeats.

Everything runs in a temporary NIGHTSHIFT_HOME; nothing reaches the network or a GPU.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightshift.evals.output import write_csv

INVENTORY = """\
gpus:
  - name: NVIDIA A100-SXM4-80GB
    uuid: GPU-perf-0
    memory_total_mib: 81920
    memory_used_mib: 1024
    temperature_c: 41
    utilization_gpu_pct: 0
  - name: NVIDIA A100-SXM4-80GB
    uuid: GPU-perf-1
    memory_total_mib: 81920
    memory_used_mib: 2048
    temperature_c: 44
    utilization_gpu_pct: 3
"""
PAYLOAD = {
    "skill": "gpu_health_check",
    "capability": "read",
    "args": {"gpus": [0, 1]},
    "decision": "allow",
    "rule": "role:agent",
    "reasons": [],
    "quorum": 1,
}


def _wiring(home: Path) -> Any:
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.config import GpuSettings, Settings

    home.mkdir(parents=True, exist_ok=True)
    (home / "inventory.yaml").write_text(INVENTORY)
    return Wiring(
        Settings(home=str(home), gpu=GpuSettings(probe="inventory", inventory="inventory.yaml"))
    )


# ---------------------------------------------------------------------------------- agent step
def agent_step(
    home: Path, calls: int, warmup: int = 5
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per call of gpu_health_check for each way of calling it (see the docstring), and
    the audit events each way appends per call."""
    from langgraph.checkpoint.memory import InMemorySaver

    from nightshift.agent.brain.goals import Goal
    from nightshift.agent.brain.graph import build_graph, sqlite_checkpointer
    from nightshift.agent.brain.planner import DeterministicPlanner
    from nightshift.skills.registry import get_skill

    w = _wiring(home)
    skill = get_skill("gpu_health_check")
    goal = Goal(name="perf-health", goal="health").model_dump(mode="json")
    sqlite_saver = sqlite_checkpointer(w)
    graphs = {
        "graph (memory)": build_graph(w, DeterministicPlanner(), checkpointer=InMemorySaver()),
        "graph (sqlite)": build_graph(w, DeterministicPlanner(), checkpointer=sqlite_saver),
    }
    counter = iter(range(10**9))

    def direct() -> None:
        skill.fn(w.context("agent", f"direct-{next(counter)}"), skill.parse({}))  # gate's baseline

    def gate() -> None:
        w.gate.call(w.context("agent", f"gate-{next(counter)}"), skill, {})

    def through(graph: Any) -> Callable[[], None]:
        def call() -> None:
            cfg = {"configurable": {"thread_id": f"perf-{next(counter)}"}}
            out = graph.invoke({"goal": goal, "history": [], "on_behalf_of": "perf"}, cfg)
            obs = out["history"][-1]
            assert obs["status"] == "ok" and out["finish"]["ok"], out

        return call

    ways: dict[str, Callable[[], None]] = {
        "direct": direct,
        "gate": gate,
        **{k: through(g) for k, g in graphs.items()},
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    appended: dict[str, int] = dict.fromkeys(ways, 0)

    def head_id() -> int:
        head = w.audit.head()
        return head.id if head is not None else 0

    try:
        for i in range(warmup + calls):
            for name, fn in ways.items():
                before = head_id()
                t = time.perf_counter()
                fn()
                dt = time.perf_counter() - t
                if i >= warmup:
                    times[name].append(dt)
                    appended[name] += head_id() - before
    finally:
        sqlite_saver.conn.close()
        w.store.engine.dispose()
    return times, {k: v / calls for k, v in appended.items()}


# ---------------------------------------------------------------------------------- audit
def audit_throughput(root: Path, events: int, repeats: int) -> dict[str, list[float]]:
    """Events per second for append (one process, one by one) and verify, per repeat."""
    from nightshift.policies.audit import AuditLog
    from nightshift.runtime.store.db import Store

    out: dict[str, list[float]] = {"append": [], "verify": []}
    for r in range(repeats):
        home = root / f"audit-{r}"
        home.mkdir(parents=True)
        store = Store(f"sqlite:///{home / 'nightshift.db'}")
        log = AuditLog(store, home / "audit.anchor")
        try:
            t = time.perf_counter()
            for i in range(events):
                log.append(
                    "agent",
                    "policy.verdict",
                    skill="gpu_health_check",
                    call_id=f"perf/{i}",
                    payload=PAYLOAD,
                )
            out["append"].append(events / (time.perf_counter() - t))
            t = time.perf_counter()
            result = log.verify()
            out["verify"].append(events / (time.perf_counter() - t))
            if not (result.ok and result.count == events):
                raise RuntimeError(f"audit verify failed on an untouched log: {result}")
        finally:
            store.engine.dispose()
    return out


# ---------------------------------------------------------------------------------- output
def rows_for(
    step: dict[str, list[float]],
    per_call: dict[str, float],
    audit: dict[str, list[float]],
    events: int,
) -> list[dict[str, Any]]:
    rows = []
    base = statistics.median(step["direct"]) if step.get("direct") else None
    for name, xs in step.items():
        med = statistics.median(xs)
        rows.append(
            {
                "benchmark": "agent_step",
                "variant": name,
                "unit": "ms/call",
                "n": len(xs),
                "median": round(med * 1e3, 3),
                "min": round(min(xs) * 1e3, 3),
                "max": round(max(xs) * 1e3, 3),
                "ratio_to_direct": round(med / base, 2) if base else None,
                "audit_events_per_call": round(per_call.get(name, 0.0), 2),
            }
        )
    for name, xs in audit.items():
        rows.append(
            {
                "benchmark": "audit",
                "variant": f"{name} ({events} events)",
                "unit": "events/s",
                "n": len(xs),
                "median": round(statistics.median(xs), 1),
                "min": round(min(xs), 1),
                "max": round(max(xs), 1),
                "ratio_to_direct": None,
                "audit_events_per_call": None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in (
        "benchmark",
        "variant",
        "unit",
        "n",
        "median",
        "min",
        "max",
        "× direct",
        "audit events/call",
    ):
        t.add_column(col, justify="left" if col in ("benchmark", "variant", "unit") else "right")
    last = None
    for r in rows:
        if last is not None and r["benchmark"] != last:
            t.add_section()
        last = r["benchmark"]
        ratio, per_call = r["ratio_to_direct"], r["audit_events_per_call"]
        t.add_row(
            r["benchmark"],
            r["variant"],
            r["unit"],
            str(r["n"]),
            f"{r['median']:,.2f}",
            f"{r['min']:,.2f}",
            f"{r['max']:,.2f}",
            "" if ratio is None else f"{ratio:g}×",
            "" if per_call is None else f"{per_call:g}",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(t)


def plot(step: dict[str, list[float]], path: Path) -> bool:
    """Per-call latency of each way of calling the skill (box plot, log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = list(step)
    ax.boxplot([[x * 1e3 for x in step[n]] for n in names], whis=(0, 100))
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_yscale("log")
    ax.set_ylabel("ms per gpu_health_check call")
    ax.set_title("Agent step overhead (whiskers: min–max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightshift eval perf", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and 1,000 audit events (CI)")
    ap.add_argument(
        "--calls", type=int, default=None, help="timed calls per way (default 200; quick 30)"
    )
    ap.add_argument(
        "--events",
        type=int,
        default=None,
        help="audit events per repeat (default 10000; quick 1000)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="audit repeats (default 3)")
    ap.add_argument("--out", default="evals/out", help="folder for CSV and PNG (default evals/out)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    calls = args.calls or (30 if args.quick else 200)
    events = args.events or (1000 if args.quick else 10_000)
    if min(calls, events, args.repeats) < 1:
        print("error: --calls, --events and --repeats must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="nightshift-perf-"))
    t0 = time.time()
    try:
        step, per_call = agent_step(tmp / "agent", calls)
        audit = audit_throughput(tmp, events, args.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = rows_for(step, per_call, audit, events)
    write_csv(out / "perf.csv", rows)
    print_table(
        rows,
        f"Agent step overhead and audit throughput ({calls} calls per way, "
        f"{events} events × {args.repeats}, {time.time() - t0:.0f} s)",
    )
    written = [out / "perf.csv"]
    if not args.no_plot and plot(step, out / "perf_agent_step.png"):
        written.append(out / "perf_agent_step.png")
    print("wrote " + ", ".join(str(x) for x in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
