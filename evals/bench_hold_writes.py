"""The daemon's tick and what its hold reasons cost it: `Engine.place_queued` over a store that
`bench_scale.store_ticks` changes between ticks, timing the whole tick and the write of the hold
reasons, and counting the `job_hold` rows that write changed, from the table itself (read before
and after, outside the timing).

    python -m nightshift.evals.bench_hold_writes [--jobs 100000] [--gpus 4096] [--ticks 5]
        [--tick-s 60] [--url postgresql+psycopg://…/EMPTY_DB]

Without `--url`, a SQLite store in a temporary folder. To compare two versions, run each as
the package in turn (docs/benchmarks.md, issue 31 "Scale", stop 57)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from sqlalchemy import text

from nightshift.evals.bench_scale import NOW, NullExecutor, populate, store_ticks
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.store.db import Store


def measure(n_jobs: int, n_gpus: int, ticks: int, tick_s: float, url: str | None) -> dict[str, Any]:
    """Medians over `ticks` ticks after two warm-up ticks: the whole tick (s), the hold reasons'
    write (s), and the rows that write changed (each tick's count, sorted)."""
    with tempfile.TemporaryDirectory(prefix="ns-holds-") as tmp:
        store = Store(url or f"sqlite:///{tmp}/nightshift.db")
        populate(store, n_jobs, n_gpus)
        changes = store_ticks(store, tick_s=tick_s)
        engine = Engine(store, NullExecutor(), Settings(home=tmp), clock=lambda: NOW)
        write_s: list[float] = []
        written: list[int] = []
        record = engine._record_holds

        def rows() -> set[tuple[Any, ...]]:
            with store.session() as s:
                return set(map(tuple, s.execute(text("SELECT * FROM job_hold")).all()))

        counting: list[float] = []  # the reads that count rows, taken out of the tick's time

        def timed(*args: Any, **kw: Any) -> None:
            t0 = time.perf_counter()
            before = rows()
            t1 = time.perf_counter()
            record(*args, **kw)
            t2 = time.perf_counter()
            written.append(len(rows() - before))
            write_s.append(t2 - t1)
            counting.append((t1 - t0) + (time.perf_counter() - t2))

        engine._record_holds = timed  # type: ignore[method-assign]
        tick_times = []
        for _ in range(ticks + 2):
            now = next(changes)
            t0 = time.perf_counter()
            engine.place_queued(now)
            tick_times.append(time.perf_counter() - t0 - counting[-1])
        store.engine.dispose()
    return {
        "tick_s": statistics.median(tick_times[2:]),
        "write_s": statistics.median(write_s[2:]),
        "rows_written": sorted(written[2:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="queued jobs (100000)")
    parser.add_argument("--gpus", type=int, default=4_096, help="GPUs (4096)")
    parser.add_argument("--ticks", type=int, default=5, help="ticks timed (5)")
    parser.add_argument("--tick-s", type=float, default=60.0, help="store time between ticks")
    parser.add_argument("--url", help="an empty database's URL (default: SQLite in a temp dir)")
    args = parser.parse_args(argv)
    got = measure(args.jobs, args.gpus, args.ticks, args.tick_s, args.url)
    print(
        f"{args.jobs:,} queued x {args.gpus:,} GPUs, ticks {args.tick_s:g} s apart: tick median "
        f"{got['tick_s']:.3f} s; hold reasons written median {got['write_s']:.3f} s; rows "
        f"written a tick {got['rows_written']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
