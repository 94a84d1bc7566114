"""Why whole GPUs stand idle while jobs wait, in one policy's run of one trace window (issue 31):
every stretch between two `place()` calls in which healthy GPUs stood idle while a job waited,
weighted by its length inside the window and classed by what that call saw. Stop 50 found that
nightshift's were fragmentation (enough GPUs free, but on no one host), which migration
(`migrate_after_s`) now moves jobs for; `nightshift-nomove` is the policy without it.

    python -m nightshift.evals.idle_while_waiting --trace pollux --seed 0
    python -m nightshift.evals.idle_while_waiting --trace philly --policy nightshift-nomove

The simulator's own `idle_waiting` (integrated at every event, not only at calls) is printed
beside the total as a check: the two differ where GPUs change between calls without one (a
quarantine while nothing could start).
"""

from __future__ import annotations

import argparse
from collections import Counter
from datetime import datetime, timedelta

from rich.console import Console
from rich.table import Table

from nightshift.evals import simulate as S
from nightshift.evals.scheduler_table import WINDOWS
from nightshift.runtime.scheduling.placement import QUARANTINED, Decision, Snapshot

FRAGMENTED = "fragmented: enough GPUs idle for the narrowest waiting job, on no one host"
TOO_FEW = "too few: fewer GPUs idle than any waiting job asks"
RESERVED = "kept for the reservation: only reserved GPUs make room on one host"
PAUSING = "pausing: the call proposed pauses, their GPUs about to be taken"
OTHER = "other: a host has room for the narrowest waiting job outside the reservation"
CLASSES = (FRAGMENTED, TOO_FEW, RESERVED, PAUSING, OTHER)
DAYS = {w.trace: w.days for w in WINDOWS}  # the goals table's window of each trace


def classify(snap: Snapshot, d: Decision) -> tuple[int, str | None]:
    """The whole healthy GPUs idle after this call while a GPU job still waits, and why."""
    healthy = {g.index: g.host for g in snap.gpus if g.verdict not in QUARANTINED}
    used = {i for r in snap.running for i in r.gpus} | {i for s in d.starts for i in s.gpus}
    idle = [i for i in healthy if i not in used]
    started = {s.job_id for s in d.starts}
    waiting = [p.gpus for p in snap.pending if p.gpus and p.id not in started]
    if not idle or not waiting:
        return 0, None
    if d.preemptions:
        return len(idle), PAUSING
    narrowest = min(waiting)
    if len(idle) < narrowest:
        return len(idle), TOO_FEW
    if max(Counter(healthy[i] for i in idle).values()) < narrowest:
        return len(idle), FRAGMENTED
    reserved = set(d.reservation.gpus) if d.reservation is not None else set()
    outside = Counter(healthy[i] for i in idle if i not in reserved)
    return len(idle), (OTHER if max(outside.values(), default=0) >= narrowest else RESERVED)


def idle_why(setup: S.Setup, policy: str) -> tuple[dict[str, float], dict[str, float]]:
    """GPU-seconds inside the window per class, and the run's metrics."""
    calls: list[tuple[datetime, int, str | None]] = []
    result = S.simulate(setup, policy, observe=lambda s, d: calls.append((s.now, *classify(s, d))))
    w0, w1 = (setup.origin + timedelta(seconds=x) for x in setup.window)
    got = dict.fromkeys(CLASSES, 0.0)
    for (t, n, why), (t_next, _, _) in zip(calls, calls[1:], strict=False):
        if why is None:
            continue
        inside = (min(t_next, w1) - max(t, w0)).total_seconds()
        if inside > 0:
            got[why] += n * inside
    return got, result.metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nightshift.evals.idle_while_waiting",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", default="pollux", choices=sorted(DAYS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--policy", default=S.NOTARIFF)
    args = parser.parse_args(argv)
    if args.policy not in S.POLICIES:
        parser.error(f"--policy: unknown {args.policy}; known: {', '.join(S.POLICIES)}")
    days = DAYS[args.trace]
    setup = S.make_setups(
        [args.trace], [args.load], {args.trace: days}, None, S.Options(seed=args.seed)
    )[0]
    got, metrics = idle_why(setup, args.policy)
    capacity = setup.gpus * (setup.window[1] - setup.window[0])
    table = Table(
        title=f"GPUs idle while jobs waited: {args.policy}, {args.trace} seed {args.seed} "
        f"(load {args.load:g}, {setup.gpus} GPUs)"
    )
    for col in ("why", "GPU-hours", "share of the window's GPU time"):
        table.add_column(col, justify="left" if col == "why" else "right")
    for why, gpu_s in sorted(got.items(), key=lambda kv: -kv[1]):
        table.add_row(why, f"{gpu_s / 3600:,.1f}", f"{gpu_s / capacity:.4f}")
    total = sum(got.values())
    table.add_row("all (at place() calls)", f"{total / 3600:,.1f}", f"{total / capacity:.4f}")
    table.add_row(
        "the simulator's idle_waiting (at every event)",
        f"{metrics['idle_waiting'] * capacity / 3600:,.1f}",
        f"{metrics['idle_waiting']:.4f}",
    )
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
