"""The daemon's heap between ticks (agent/brain/tick_heap.py): what a tick leaves alive is frozen
out of the collector's walks, a cycle frozen with it is still reclaimed at the full collection,
and a stopped daemon hands everything back to the collector."""

from __future__ import annotations

import gc
import weakref

import pytest

from nightshift.agent.brain.tick_heap import TickHeap
from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.daemon import Daemon
from nightshift.runtime.config import Settings


class _Node:
    other: _Node | None = None


def test_a_cycle_frozen_after_a_tick_waits_for_the_full_collection():
    heap = TickHeap(full_every=3)
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        heap.after_tick()  # alive at the tick's end: frozen
        del a, b  # now a cycle nothing refers to
        gc.collect()
        assert ref() is not None  # the collector no longer walks it
        heap.after_tick()
        assert ref() is not None and gc.get_freeze_count() > 0
        heap.after_tick()  # the third: everything unfrozen and collected first
        assert ref() is None
    finally:
        TickHeap.release()
    assert gc.get_freeze_count() == 0


def test_every_tick_is_at_least_one(tmp_path):
    with pytest.raises(ValueError, match="full_every must be at least 1"):
        TickHeap(full_every=0)


def test_a_daemon_freezes_its_heap_between_ticks_and_releases_it_when_it_stops(tmp_path):
    settings = Settings(
        home=str(tmp_path),
        store={"url": f"sqlite:///{tmp_path}/nightshift.db"},
        gpu={"probe": "none"},
        api={"serve": False},
        channels={"listen": None},
        loop={"poll_interval_s": 0.05},
    )
    frozen: list[int] = []
    w = Wiring(settings, server=True)
    d = Daemon(w, say=lambda *_: None)
    assert isinstance(w.loop.heap, TickHeap)
    after = w.loop.heap.after_tick

    def counted() -> None:
        after()
        frozen.append(gc.get_freeze_count())

    w.loop.heap.after_tick = counted  # type: ignore[method-assign]
    d.run(max_ticks=2)
    assert len(frozen) == 2 and all(n > 0 for n in frozen)
    assert gc.get_freeze_count() == 0
