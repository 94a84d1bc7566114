"""A long-running daemon's heap between ticks: what outlives a tick is frozen out of the
collector's walks.

At 100,000 queued jobs one tick allocates enough for CPython's full collection to run once or
twice in it, and each walks every object the daemon holds (the waiting jobs kept between ticks,
placement's columns, the store's sessions): 0.3-0.85 s of a 4.0-4.5 s tick, measured with
`gc.callbacks`. After each tick the objects alive are frozen (`gc.freeze`), so later collections
walk only what is newer. Reference counting frees a frozen object as before; only a reference
cycle among frozen objects waits, for the full collection every `full_every` ticks or for
`release` when the daemon stops."""

from __future__ import annotations

import gc


class TickHeap:
    def __init__(self, full_every: int = 50) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1 (got {full_every})")
        self.full_every = full_every
        self.ticks = 0

    def after_tick(self) -> None:
        """Freeze what the tick left alive; every `full_every` ticks, collect everything first."""
        self.ticks += 1
        if self.ticks % self.full_every == 0:
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)  # the tick's own young cycles, before they would be frozen
        gc.freeze()

    @staticmethod
    def release() -> None:
        """Hand every frozen object back to the collector (the daemon stops; the process may
        go on, as a test's does)."""
        gc.unfreeze()
