"""A file a person names (a log, a metrics file, a spec, a saved nvidia-smi output) is checked to be
a regular file before anything opens it, and a file read whole is read within a stated limit.

Opening a named pipe blocks until something writes to it, and a device (/dev/zero, /dev/urandom)
never ends: a command handed either would hang or fill memory. Each refusal is a BadArguments
that names the argument, the path and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, NoReturn

from nightshift.runtime.errors import BadArguments

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
    and `fix` (what to give instead)."""
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
