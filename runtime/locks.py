"""Inter-process locks on files, held by the kernel (flock, through `filelock`).

Several processes share one NIGHTSHIFT_HOME (the daemon, every CLI command, the runs' supervisors),
and a few steps must not interleave between them: migrating the store, "look for a handle, else
launch", copying a container's output, a read-modify-write of the audit anchor, one daemon per
home. A flock belongs to an open file, so the kernel drops it when its holder exits, even by
SIGKILL: a lock file left behind by a killed process locks nothing, and there is nothing to
clean up. (`filelock.SoftFileLock`, which treats the file's existence as the lock, would leave a
killed holder's lock standing; its fallback to that is turned off.)

Locks exclude open files, not threads or processes: two threads of one process exclude each
other too, and taking a lock a second time in the thread that holds it waits forever.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from filelock import FileLock, Timeout

from nightshift.runtime.errors import OperatorError

# Newer filelock falls back to a soft lock where a filesystem has no flock; we want an error there.
_NATIVE_ONLY: dict[str, Any] = (
    {"fallback_to_soft": False}
    if "fallback_to_soft" in inspect.signature(FileLock.__init__).parameters
    else {}
)


class Held:
    """An exclusive lock this process holds until `release` (or the end of a `with` block)."""

    def __init__(self, path: Path, lock: FileLock):
        self.path = path
        self._lock = lock

    def write_note(self, text: str) -> None:
        """Say who holds the lock in the lock file (a daemon's pid), for `note` to read.

        Readers see it while the lock is held. (filelock before 3.30 truncated the file on every
        attempt to take it, so there a waiter that gave up may have erased the note.)"""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def release(self) -> None:
        """Release the lock; releasing twice is harmless."""
        if self._lock.is_locked:
            self._lock.release()

    def __enter__(self) -> Held:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _lock(path: Path) -> FileLock:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not thread-local: a Held may be released from another thread than the one that took it.
    return FileLock(str(path), thread_local=False, **_NATIVE_ONLY)


@contextmanager
def exclusive(
    path: str | os.PathLike[str],
    *,
    timeout: float | None = None,
    error: type[OperatorError] = OperatorError,
) -> Iterator[Held]:
    """Hold the exclusive lock on `path` (created if missing) for the `with` block.

    Waits for as long as it takes, or at most `timeout` seconds and then raises `error` (an
    OperatorError; StoreError from the store) naming the file and how to find its holder."""
    path = Path(path)
    lock = _lock(path)
    try:
        lock.acquire(timeout=-1 if timeout is None else timeout)
    except Timeout:
        raise error(
            f"another process held the lock {path} for more than {timeout:g}s; find it "
            f"with `fuser {path}` and wait for it or stop it"
        ) from None
    held = Held(path, lock)
    try:
        yield held
    finally:
        held.release()


def try_exclusive(path: str | os.PathLike[str]) -> Held | None:
    """Take the exclusive lock on `path` now, or return None if a live process holds it.

    For a lock held as long as the process lives (one daemon per home): keep the result and
    call `release` at the end; exiting, in any way, releases it too."""
    path = Path(path)
    lock = _lock(path)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return None
    return Held(path, lock)


def is_held(path: str | os.PathLike[str]) -> bool:
    """Whether a live process holds the lock on `path`; a file left by a killed holder is not.

    Probing takes the lock for an instant, so a `try_exclusive` racing this probe can miss."""
    path = Path(path)
    if not path.exists():
        return False
    held = try_exclusive(path)
    if held is None:
        return True
    held.release()
    return False


def note(path: str | os.PathLike[str]) -> str | None:
    """What the holder wrote with `Held.write_note`, if the file exists and says anything."""
    with suppress(OSError):
        return Path(path).read_text().strip() or None
    return None
