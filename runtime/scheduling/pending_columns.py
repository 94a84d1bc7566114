"""Waiting jobs as numpy columns, kept from one `place()` call to the next.

At 100,000 waiting jobs, reading each job's fields off its pydantic model costs more than all of
placement's decisions (about 1 µs a job), and almost nothing about a waiting job changes between
two calls: only the clock moves. So the fields placement reads are copied once per job object
into columns, and a later call finds each job's row by the object's identity and computes what
depends on the clock (waits, aged priorities, backoffs, deadlines) for all rows at once. The
daemon's load says where each job it kept sat in its last list (`Snapshot._kept_from`): a row
is taken from there, as arrays, wherever the object there is the same one (its id, while the last
call's list holds every object it had), and only the rest are looked up one by one.

Safe as a cache: a row is a pure function of its job's field values; assigning any field of a
`PendingJob` drops its row (`PendingColumns.forget`, called from the model's `__setattr__`); a
new learned estimate set in place (`PendingJob.renew_estimate`, as the daemon's load sets it) is
written into the row (`renew`) and its penalty computed again; and the one list field
(`blocked_by`), when it named a dependency as its job was added, is read through the job's own
list object at every call, so a dependency removed in place is seen (one is added by assigning
the field, as the store's load does with a new object). A copy (`model_copy`) is a new object
and gets a new row. The cache holds the objects it has rows for; it is compacted to the latest
call's jobs when it grows past twice their number.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np

_EPOCH = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)
NONE_US = np.iinfo(np.int64).min  # a datetime field that is None


class Unsupported(Exception):
    """A job this representation cannot hold exactly (a timezone-aware time): use the slow path."""


def micros(t: datetime) -> int:
    """Microseconds since 1970 of a naive time: differences are exact, like timedelta's."""
    if t.tzinfo is not None:
        raise Unsupported("timezone-aware time")
    return (t - _EPOCH) // _US


_FLOATS = ("prio", "exp", "gpus", "att", "pen")
_INTS = ("jid", "sub", "dl", "nb", "attempt", "code")
_OBJECTS = ("job", "blocked", "dl_obj", "nb_obj")
_BOOLS = ("cs", "deps")


class PendingColumns:
    """Rows of waiting jobs: `rows_of(pending)` gives each job's row, adding the ones not seen.

    Columns: jid, prio, sub (submitted, µs), exp (expected seconds, NaN when unset or 0), gpus,
    att (attained GPU-seconds), dl and nb (deadline and not_before in µs, NONE_US when unset),
    attempt, cs (cost_sensitive), code (the request, as an index into `raws`); and the job, its
    blocked_by list, deadline and not_before as objects."""

    jid: np.ndarray
    prio: np.ndarray
    sub: np.ndarray
    exp: np.ndarray
    gpus: np.ndarray
    att: np.ndarray
    pen: np.ndarray
    dl: np.ndarray
    nb: np.ndarray
    attempt: np.ndarray
    cs: np.ndarray
    deps: np.ndarray
    code: np.ndarray
    job: np.ndarray
    blocked: np.ndarray
    dl_obj: np.ndarray
    nb_obj: np.ndarray

    def __init__(self, cpu: tuple, backoff: str):
        # A job's request is keyed (gpus, memory, share, cap, span), or `cpu` when it asks no
        # GPU, as placement keys them (`backoff`: the tag of a backoff stand-in's key)
        self.cpu, self.backoff = cpu, backoff
        self.rows: dict[int, int] = {}  # id(job) -> row
        self.codes: dict[tuple, int] = {}
        self.raws: list[tuple] = []
        self.n = 0
        self.forgotten = 0  # bumped by every `forget`: the last call's rows may be stale
        self.dropped: set[int] = set()  # id() of the jobs forgotten since the last call
        # A caller whose lists would not walk in step (`_aligned` gave up: ≈ 5 ms wasted at
        # 100,000 jobs) is not walked for its next 1, 3, 7 ... 63 calls, then tried again.
        self.unaligned = self.not_walking = 0
        # `pen`: what the queue order takes off each row's priority, for the rows below
        # `pen_n`, under the order settings `pen_key` (a row's fields never change)
        self.pen_key: tuple | None = None
        self.pen_n = 0
        self.repen: list[int] = []  # rows below `pen_n` whose estimate moved since
        self.seen: list[Any] = []  # the jobs of the last call, columns or not
        # the last call's (jobs, rows, `forgotten`, the jobs' ids); the jobs are held so that no
        # new object can take one of their ids
        self.last: tuple[list[Any], np.ndarray, int, np.ndarray] | None = None
        self._alloc(1024)

    def n_codes(self) -> int:
        """How many distinct requests have a code."""
        return len(self.raws)

    def _alloc(self, cap: int) -> None:
        old = {name: getattr(self, name, None) for name in (*_FLOATS, *_INTS, *_OBJECTS, *_BOOLS)}
        for name in _FLOATS:
            setattr(self, name, np.empty(cap, dtype=np.float64))
        for name in _INTS:
            setattr(self, name, np.empty(cap, dtype=np.int64))
        for name in _OBJECTS:
            setattr(self, name, np.empty(cap, dtype=object))
        for name in _BOOLS:
            setattr(self, name, np.empty(cap, dtype=bool))
        for name, arr in old.items():
            if arr is not None:
                getattr(self, name)[: self.n] = arr[: self.n]
        self.cap = cap

    def forget(self, job: object) -> None:
        self.forgotten += 1
        self.rows.pop(id(job), None)
        if len(self.dropped) <= _MOST_DROPPED:
            self.dropped.add(id(job))

    def renew(self, job: Any) -> None:
        """The job's learned estimate moved, nothing else: its row takes the new value (its
        penalty is computed again at the next call)."""
        row = self.rows.get(id(job))
        if row is None:
            return
        # the row stays the job's (the last call's rows hold): only its value moves
        self.exp[row] = job.__dict__["expected_duration_s"] or np.nan
        if row < self.pen_n:
            self.repen.append(row)
            if len(self.repen) > self.n:  # never consumed (an order without penalties)
                self.pen_n, self.repen = 0, []

    def _code(self, raw: tuple) -> int:
        got = self.codes.get(raw)
        if got is None:
            got = self.codes[raw] = len(self.raws)
            self.raws.append(raw)
        return got

    def _add(self, jobs: list[Any]) -> list[int]:
        """Rows for `jobs`, a column at a time (a daemon that reloads its queue brings every
        job as a new object at every call)."""
        fs = [j.__dict__ for j in jobs]
        dls = [f["deadline"] for f in fs]
        nbs = [f["not_before"] for f in fs]
        try:  # a timezone-aware time cannot be taken from the naive epoch
            subs = [(f["submitted_at"] - _EPOCH) // _US for f in fs]
            dl_us = [NONE_US if t is None else (t - _EPOCH) // _US for t in dls]
            nb_us = [NONE_US if t is None else (t - _EPOCH) // _US for t in nbs]
        except TypeError as e:
            raise Unsupported(str(e)) from e
        keys = [
            (f["gpus"], f["gpu_memory_gb"], f["share_gpu"], f["gpu_memory_cap_gb"], f["span_hosts"])
            for f in fs
        ]
        cpu = self.cpu
        r0, r1 = self.n, self.n + len(jobs)
        if r1 > self.cap:
            self._alloc(max(2 * self.cap, r1))
        self.n = r1
        sl, n = slice(r0, r1), len(jobs)
        self.jid[sl] = [f["id"] for f in fs]
        self.prio[sl] = [f["priority"] for f in fs]
        self.sub[sl] = subs
        self.exp[sl] = [f["expected_duration_s"] or np.nan for f in fs]
        self.gpus[sl] = [k[0] for k in keys]
        self.att[sl] = [f["attained_gpu_s"] for f in fs]
        self.dl[sl], self.nb[sl] = dl_us, nb_us
        self.attempt[sl] = [f["attempt"] for f in fs]
        self.cs[sl] = [f["cost_class"] == "cost_sensitive" for f in fs]
        reqs = [k if k[0] else cpu for k in keys]
        codes = list(map(self.codes.get, reqs))
        if None in codes:  # a request not seen before
            codes = list(map(self._code, reqs))
        self.code[sl] = codes
        self.job[sl] = np.fromiter(jobs, dtype=object, count=n)
        self.blocked[sl] = np.fromiter((f["blocked_by"] for f in fs), dtype=object, count=n)
        self.deps[sl] = [bool(f["blocked_by"]) for f in fs]
        self.dl_obj[sl] = np.fromiter(dls, dtype=object, count=n)
        self.nb_obj[sl] = np.fromiter(nbs, dtype=object, count=n)
        rows = list(range(r0, r1))
        self.rows.update(zip(map(id, jobs), rows, strict=True))
        return rows

    def rows_of(
        self, pending: Sequence[Any], kept_from: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Each job's row, in order; None when most jobs are objects this process has not
        seen before (a caller that rebuilds its queue at every call: copying them into columns
        would cost more than the loop it saves); raises Unsupported (adding nothing more) on a
        job it cannot hold exactly. `kept_from` (Snapshot's, optional): where each job sat in
        the last call's list, -1 for the others; used where it holds, checked job by job.
        Without it, where the two lists run alike (`_aligned`)."""
        last = self.last
        if (
            last is not None
            and last[2] == self.forgotten
            and len(last[0]) == len(pending)
            and all(map(operator.is_, pending, last[0]))
        ):
            return last[1]  # the very same job objects as last time, none changed since
        # the last call's list tells where a job's row is, but for the jobs changed since
        hinted = last is not None and len(self.dropped) <= _MOST_DROPPED
        if not hinted or kept_from is None:
            head = list(map(id, pending[:64]))
            if head and not any(map(self.rows.__contains__, head)):
                # a queue rebuilt as new objects at every call, told from its head: not looked
                # up job by job (objects it held last time are copied in at the next call)
                before = set(map(id, self.seen))
                if not any(map(before.__contains__, head)):
                    self.seen = list(pending)
                    return None
        ids = np.fromiter(map(id, pending), dtype=np.int64, count=len(pending))
        rows = None
        if hinted:
            assert last is not None
            if kept_from is None and self.not_walking:
                self.not_walking -= 1
            elif kept_from is None:
                kept_from = _aligned(ids, last[3])
                self.unaligned = 0 if kept_from is not None else min(2 * self.unaligned + 1, 63)
                self.not_walking = self.unaligned
            if kept_from is not None:
                rows = _by_position(ids, kept_from, last[3], last[1])
                if self.dropped:
                    rows[np.isin(ids, np.fromiter(self.dropped, dtype=np.int64))] = -1
                miss = np.flatnonzero(rows < 0)
                if 2 * len(miss) < len(rows):
                    # jobs the hint calls new, or places wrongly: looked up (the columns may
                    # hold them)
                    rows[miss] = [self.rows.get(i, -1) for i in ids[miss].tolist()]
                else:
                    rows = None  # the hint is not this list's
        if rows is None:
            rows = np.fromiter(
                map(self.rows.get, ids.tolist(), repeat(-1)), dtype=np.int64, count=len(ids)
            )
        seen, self.seen = self.seen, list(pending)
        new = np.flatnonzero(rows < 0)
        if len(new):
            if 2 * len(new) > len(rows):
                # Worth copying only once the caller passes the same objects again: then they
                # were in the last call.
                before = set(map(id, seen))
                if 2 * sum(1 for i in new.tolist() if id(pending[i]) in before) <= len(new):
                    return None
            rows[new] = self._add([pending[i] for i in new.tolist()])
        if self.n > 2 * len(rows) + 1024:
            rows = self._compact(rows)
        self.last = (self.seen, rows, self.forgotten, ids)
        self.dropped = set()  # (kept until a call sets `last`: they may sit in the one before)
        return rows

    def _compact(self, rows: np.ndarray) -> np.ndarray:
        """Keep only `rows` (this call's jobs): the objects of jobs gone are let go."""
        self.pen_n, self.repen = 0, []
        keep, new = np.unique(rows, return_inverse=True)
        for name in (*_FLOATS, *_INTS, *_OBJECTS, *_BOOLS):
            arr = getattr(self, name)
            arr[: len(keep)] = arr[keep]
            arr[len(keep) : self.n] = None if arr.dtype == object else 0
        self.n = len(keep)
        self.rows = {id(j): i for i, j in enumerate(self.job[: self.n])}
        return new.astype(np.int64)


_MOST_DROPPED = 1024  # jobs changed between two calls past which the last call's list is not used
_RUN = 2048  # ids compared at a time while the two lists run alike
_AHEAD = 4096  # how far ahead in the last call's list a job is looked for where a run breaks


def _aligned(ids: np.ndarray, ids_then: np.ndarray) -> np.ndarray | None:
    """Where each job sat in the last call's list (-1: not found), from the ids of both lists
    walked in step: a caller that drops the jobs that started and adds new ones (the simulator,
    a loop over its own queue) keeps the rest in order, so the lists run alike between a few
    breaks. None after one break per 100 jobs: the lists are not alike enough to be worth it
    (a dict lookup per job is the fallback)."""
    n, m = len(ids), len(ids_then)
    out = np.full(n, -1, dtype=np.int64)
    most = n // 100 + 16
    i = j = 0
    while i < n and j < m:
        k = min(_RUN, n - i, m - j)
        same = ids[i : i + k] == ids_then[j : j + k]
        run = int(same.argmin())
        if same[run]:
            run = k
        out[i : i + run] = np.arange(j, j + run)
        i, j = i + run, j + run
        if run == k:
            continue
        most -= 1
        if most < 0:
            return None
        ahead = np.flatnonzero(ids_then[j : j + _AHEAD] == ids[i])
        if len(ahead):
            j += int(ahead[0])  # the jobs between left the list
        else:
            i += 1  # a job the last list did not have here (new, or moved)
    return out


def _by_position(
    ids: np.ndarray, kept_from: np.ndarray, ids_then: np.ndarray, rows_then: np.ndarray
) -> np.ndarray:
    """Rows from where each job sat in the last call's list, wherever the object there was this
    very one (the same id: the last call's list holds its objects, so no other can have taken
    an id); -1 for the rest."""
    rows = np.full(len(ids), -1, dtype=np.int64)
    if len(kept_from) != len(ids):
        return rows
    at = np.flatnonzero((kept_from >= 0) & (kept_from < len(ids_then)))
    was = kept_from[at]
    same = ids_then[was] == ids[at]
    rows[at[same]] = rows_then[was[same]]
    return rows


# The process's columns, one set per placement module (keyed by the identity of its `cpu` key:
# a benchmark may load a second copy of the module, whose requests are other objects).
_SHARED: dict[int, PendingColumns] = {}
_LOCK = threading.Lock()


def forget(job: object) -> None:
    """A job's fields changed: its row (if any) no longer describes it."""
    for cols in list(_SHARED.values()):
        cols.forget(job)


def renewed(job: object) -> None:
    """A job's learned estimate (alone) changed in place: rows keep the job, with the new value."""
    for cols in list(_SHARED.values()):
        cols.renew(job)


@contextmanager
def columns(cpu: tuple, backoff: str) -> Iterator[PendingColumns]:
    """The process's shared columns, or, while another thread is using them, fresh ones."""
    if not _LOCK.acquire(blocking=False):
        yield PendingColumns(cpu, backoff)
        return
    try:
        got = _SHARED.get(id(cpu))
        if got is None or got.cpu is not cpu or got.backoff != backoff:
            got = _SHARED[id(cpu)] = PendingColumns(cpu, backoff)
        yield got
    finally:
        _LOCK.release()


SORT_CHUNK = 64  # jobs a bucket puts in order at a time: most buckets need a few of theirs


class ArrayBucket:
    """The eligible jobs of one request, as columns: the counterpart of placement's list bucket
    for the column path, with the same operations (see `placement._ListBucket`). Once sorted,
    only a prefix is in order (`ready`), every job in it before every job after it: put in
    order `SORT_CHUNK` at a time, as the visits reach them."""

    __slots__ = (
        "raw",
        "ne",
        "nw",
        "jid",
        "dur",
        "row",
        "jobs",
        "pos",
        "sorted",
        "short_only",
        "ready",
    )

    def __init__(
        self,
        raw: tuple,
        ne: np.ndarray,
        nw: np.ndarray,
        jid: np.ndarray,
        dur: np.ndarray,
        row: np.ndarray,
        jobs: np.ndarray,
    ):
        self.raw = raw
        self.ne, self.nw, self.jid, self.dur, self.row, self.jobs = ne, nw, jid, dur, row, jobs
        self.pos = -1
        self.sorted = False
        self.short_only = False
        self.ready = 0  # once sorted: the jobs before this index are in order

    def _entry(self, i: int) -> tuple:
        return (
            float(self.ne[i]),
            float(self.nw[i]),
            int(self.jid[i]),
            float(self.dur[i]),
            self.jobs[int(self.row[i])],
        )

    def _argmin(self) -> int:
        """The index of the smallest (−priority, −wait, id), as min() over the tuples."""
        ne = self.ne
        c = np.flatnonzero(ne == ne.min())
        if len(c) > 1:
            nw = self.nw[c]
            c = c[nw == nw.min()]
        if len(c) > 1:
            c = c[[int(self.jid[c].argmin())]]
        return int(c[0])

    def first(self) -> tuple:
        return self._entry(self._argmin())

    def visited(self, entry: tuple) -> None:
        if not self.sorted:
            keep = self.jid != entry[2]
            self._take(keep)
            self.pos = -1

    def _take(self, sel: Any) -> None:
        self.ne, self.nw, self.jid = self.ne[sel], self.nw[sel], self.jid[sel]
        self.dur, self.row = self.dur[sel], self.row[sel]

    def left(self) -> int:
        return len(self.jid) - self.pos - 1

    def rest_ids(self) -> list[int]:
        return self.jid[self.pos + 1 :].tolist()

    def split_long(self, left: float) -> list[int]:
        self._take(slice(self.pos + 1, None))
        long = self.dur > left
        ids = self.jid[long].tolist()
        self._take(~long)
        self.pos, self.sorted, self.short_only = -1, False, True
        return ids

    def take_promoted(
        self, ne_max: float, left: float, short_too: bool
    ) -> tuple[list[int], list[int]]:
        """Take out the jobs still to visit whose −priority is at most `ne_max`: those that
        would run past `left` seconds, and (`short_too`) the others; their ids (the jobs put
        in order stay in order, ahead of the rest)."""
        start = self.pos + 1
        sel = self.ne[start:] <= ne_max
        if not sel.any():
            return [], []
        long = self.dur[start:] > left
        out = sel if short_too else sel & long
        jid = self.jid[start:]
        ids_long, ids_short = jid[out & long].tolist(), jid[out & ~long].tolist()
        if self.sorted:
            self.ready -= int(out[: max(0, self.ready - start)].sum())
        self._take(np.concatenate([np.ones(start, dtype=bool), ~out]))
        return ids_long, ids_short

    def advance(self) -> tuple:
        if not self.sorted:
            self.sorted, self.ready = True, 0
        self.pos += 1
        if self.pos >= self.ready:
            self._order_more()
        return self._entry(self.pos)

    def _order_more(self) -> None:
        """Put the next jobs in order: the visited ones dropped, the `SORT_CHUNK` best (and
        any tied with the last of them on priority) sorted as (−priority, −wait, id), ahead of
        the rest, left as they are."""
        self._take(slice(self.pos, None))
        self.pos = 0
        ne = self.ne
        if len(ne) <= 2 * SORT_CHUNK:
            self._take(np.lexsort((self.jid, self.nw, ne)))
            self.ready = len(ne)
            return
        cut = np.partition(ne, SORT_CHUNK)[SORT_CHUNK]
        best = np.flatnonzero(ne <= cut)
        best = best[np.lexsort((self.jid[best], self.nw[best], ne[best]))]
        self._take(np.concatenate([best, np.flatnonzero(ne > cut)]))
        self.ready = len(best)
