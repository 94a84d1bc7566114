"""A file a person names (a log, a metrics file, a spec, a saved nvidia-smi output) is checked to be
a regular file before anything opens it, and a file read whole is read within a stated limit.

A file a caller of the daemon's socket names is read as that caller (`reading_as`): the daemon
starts `head` with the caller's uid, gid and groups and takes what it prints, so a call gets the
bytes its caller could read and nothing else — not the daemon's config, key or store, not another
person's files, whatever links the caller planted (checking first and reading as the daemon would
leave a moment to swap the file).

Opening a named pipe blocks until something writes to it, and a device (/dev/zero, /dev/urandom)
never ends: a command handed either would hang or fill memory. Each refusal is a BadArguments
that names the argument, the path and the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NoReturn

from nightshift.runtime.errors import BadArguments

if TYPE_CHECKING:  # pydantic, which RunAs brings, is not imported by a command that reads no
    # user file as another user (the CLI's start)
    from nightshift.runtime.executors.submitter import RunAs

# Whose rights the files a call names are read with; None: this process's own.
_READER: ContextVar[RunAs | None] = ContextVar("nightshift_file_reader", default=None)
# A file read as another account that takes longer than this (a FIFO swapped in) is refused.
READ_AS_TIMEOUT_S = 10.0


@contextlib.contextmanager
def reading_as(reader: RunAs | None) -> Iterator[None]:
    """Within this block, files a call names are read as `reader` (the daemon serving a peer)."""
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def reader() -> RunAs | None:
    return _READER.get()


def read_as_reader(path: str | Path, limit: int, *, tail: bool = False) -> bytes | None:
    """At most `limit + 1` bytes of `path` (its first, or with `tail` its last `limit`) read
    with the current reader's rights, or None when there is no reader (the caller reads it
    itself). OSError with the reader's reason (permission denied, no such file) when they
    cannot read it."""
    who = _READER.get()
    if who is None:
        return None
    from nightshift.runtime.executors.submitter import as_submitter

    tool = ["tail", "-c", str(limit)] if tail else ["head", "-c", str(limit + 1)]
    try:
        got = as_submitter(
            who,
            [*tool, "--", str(Path(path).expanduser())],
            timeout_s=READ_AS_TIMEOUT_S,
            text=False,
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"reading it as {who.name} did not finish (a pipe or a device?)") from None
    if got.returncode != 0:
        why = bytes(got.stderr).decode("utf-8", "replace").strip().rpartition(": ")[2]
        raise OSError(f"{why or 'unreadable'} (read as {who.name})")
    return bytes(got.stdout)


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def regular_file(path: str | Path, argument: str, limit: int | None = None, fix: str = "") -> Path:
    """The path, expanded and resolved, if it names a regular file (or a link to one) of at most
    `limit` bytes; else BadArguments (with `fix`, what to give instead, for a file too large). It
    only looks (stat): nothing is opened, so a FIFO cannot block it."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise BadArguments(f"{argument}: cannot read {p}: no such file; check the path") from None
    except OSError as exc:  # permission denied on a folder above it, a name too long
        raise BadArguments(f"{argument}: cannot read {p}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the name
        raise BadArguments(f"{argument}: {str(p)!r} is not a usable path (NUL byte)") from None
    _refuse_unless_regular(st.st_mode, p, argument)
    if limit is not None and st.st_size > limit:
        _too_large(p, argument, limit, fix)
    return p.resolve()


def open_regular(path: str | Path, argument: str) -> BinaryIO:
    """The file opened for reading in binary, once `regular_file` passed it. It is opened without
    blocking and checked again on the open descriptor, so a FIFO swapped in after the check is
    refused too, never waited on."""
    p = regular_file(path, argument)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BadArguments(f"{argument}: cannot read {p}: {exc.strerror or exc}") from None
    try:
        _refuse_unless_regular(os.fstat(fd).st_mode, p, argument)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | Path, argument: str, limit: int, fix: str) -> bytes:
    """The whole file if it is at most `limit` bytes; else BadArguments that states the limit
    and `fix` (what to give instead). Read as the current reader where there is one."""
    try:
        data = read_as_reader(path, limit)
    except OSError as exc:
        raise BadArguments(f"{argument}: cannot read {path}: {exc}") from None
    if data is not None:
        if len(data) > limit:
            _too_large(Path(path).expanduser(), argument, limit, fix)
        return data
    with open_regular(path, argument) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise BadArguments(f"{argument}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        _too_large(Path(path).expanduser(), argument, limit, fix)
    return data


def size_text(n: int) -> str:
    """A byte count as people say it (64 MiB, 512 KiB)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _too_large(p: Path, argument: str, limit: int, fix: str) -> NoReturn:
    raise BadArguments(
        f"{argument}: {p} is larger than {size_text(limit)}, the most it may be"
        + (f"; {fix}" if fix else "")
    )


def _refuse_unless_regular(mode: int, p: Path, argument: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise BadArguments(f"{argument}: {p} is a folder, not a file; give the path of a file")
    kind = next((name for test, name in _KINDS if test(mode)), "something other than a file")
    raise BadArguments(
        f"{argument}: {p} is {kind}, not a regular file; save what it carries to a file "
        "and give that file's path"
    )
