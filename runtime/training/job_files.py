"""Files inside a job's folder, opened without following a symbolic link and without leaving it.

In a shared install a job's folder (runs/job-N) is its submitter's and the job's program runs as
them, while the daemon that reads the run's log, metrics and checkpoints there runs as root. What
lies in the folder is the submitter's to choose: a `metrics.jsonl -> /etc/shadow` link, or a
`checkpoints` folder that links to /root, would have root read (or copy) that file and show it
back to them (`nightshift logs`, a diagnosis's evidence, a kept checkpoint).

So every component below the job folder is opened relative to the one above it (`dir_fd`) with
O_NOFOLLOW, which refuses a link at any step, even one swapped in between a check and the open;
`..` and absolute paths elsewhere are refused, and the end must be a regular file (a FIFO would
block, a device never ends). The job folder's own path is the daemon's (a root-owned runs
folder): it is followed as given. A missing file is the OSError it always was.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePath
from typing import BinaryIO

from nightshift.runtime.errors import SkillFailed

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | _CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


class JobFileRefused(SkillFailed):
    """A path in a job's folder is a symbolic link, leaves the folder, or is not a regular file:
    the daemon does not read it (the job's program, not the daemon, chose what it points to)."""


def relative_in(job_folder: Path, path: str | Path) -> PurePath | None:
    """`path` (absolute, or relative to the job folder) as a path below `job_folder`, or None
    when it is an absolute path elsewhere (a checkpoint folder a spec names outside the run).
    JobFileRefused for a `..` in it: nothing below the folder may climb out of it."""
    p = PurePath(path)
    if not p.is_absolute():
        rel: PurePath | None = p
    else:
        rel = None
        for base in _spellings(job_folder):
            if p.is_relative_to(base):
                rel = p.relative_to(base)
                break
    if rel is not None and ".." in rel.parts:
        raise JobFileRefused(f"{path}: a '..' leaves the job's folder {job_folder}; not read")
    return rel


def open_file(job_folder: Path, path: str | Path) -> BinaryIO:
    """`path` in `job_folder` opened for reading in binary, no link followed on the way: the
    folder's files are the submitter's and the daemon reading them may be root."""
    rel = _inside(job_folder, path)
    if not rel.parts:
        raise JobFileRefused(f"{path}: the job's folder itself, not a file in it")
    parent = open_dir(job_folder, rel.parent)
    try:
        try:
            fd = os.open(rel.name, FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link(job_folder, path) from None
            raise
    finally:
        os.close(parent)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise JobFileRefused(f"{_shown(job_folder, path)} is {what}; not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_dir(job_folder: Path, rel: str | PurePath, *, create: bool = False) -> int:
    """A descriptor of the folder `rel` below `job_folder`, reached without following a link
    (made, mode 0700, when `create` and missing). The caller closes it."""
    fd = os.open(job_folder, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for part in PurePath(rel).parts:
            if part in ("..", "/") or os.sep in part:
                raise JobFileRefused(f"{rel}: leaves the job's folder {job_folder}; not used")
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, fd):
                    raise _link(job_folder, PurePath(rel)) from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def create_file(job_folder: Path, path: str | Path) -> BinaryIO:
    """A new file (mode 0600) at `path` in `job_folder`, its folders made as needed, for writing:
    none of them may be a link and the file must not exist yet, so the daemon never writes
    through a link the job left there."""
    rel = _inside(job_folder, path)
    if not rel.parts:
        raise JobFileRefused(f"{path}: the job's folder itself, not a file in it")
    parent = open_dir(job_folder, rel.parent, create=True)
    try:
        fd = os.open(rel.name, NEW_FILE_FLAGS, 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    return os.fdopen(fd, "wb")


def read_range(job_folder: Path, path: str | Path, start: int, limit: int) -> bytes:
    """At most `limit` bytes of `path` from `start`."""
    with open_file(job_folder, path) as f:
        f.seek(start)
        return f.read(limit)


def read_tail(job_folder: Path, path: str | Path, max_bytes: int) -> tuple[bytes, int]:
    """The last `max_bytes` of `path` (or all of it) and the offset they start at."""
    with open_file(job_folder, path) as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        f.seek(start)
        return f.read(size - start), start


def last_lines(
    job_folder: Path, log: Path, n: int, *, ended: bool, max_bytes: int
) -> tuple[list[str], int]:
    """The last `n` lines of an attempt's log (within its last `max_bytes`) and the offset just
    past them; while the attempt runs, a line still being written is left out. A log in the
    job's folder is opened without following a link (the folder is the submitter's, the daemon
    may be root): a planted link is a JobFileRefused, never the file it points to."""
    if relative_in(job_folder, log) is not None:
        chunk, start = read_tail(job_folder, log, max_bytes)
    else:  # a log recorded elsewhere (before job folders held them)
        with open(log, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - max_bytes)
            f.seek(start)
            chunk = f.read(size - start)
    whole = chunk if ended else chunk[: chunk.rfind(b"\n") + 1]
    return whole.decode("utf-8", "replace").splitlines()[-n:], start + len(whole)


def size(job_folder: Path, path: str | Path) -> int:
    """The file's size in bytes, seen on the file itself (never a link's target)."""
    with open_file(job_folder, path) as f:
        return os.fstat(f.fileno()).st_size


def _inside(job_folder: Path, path: str | Path) -> PurePath:
    rel = relative_in(job_folder, path)
    if rel is None:
        raise JobFileRefused(f"{path}: not in the job's folder {job_folder}; not read")
    return rel


def _spellings(job_folder: Path) -> list[PurePath]:
    """The job folder as given, made absolute, and resolved (the runs folder may be reached
    through a link the operator made; job-N itself sits in a folder only the daemon writes)."""
    out: list[PurePath] = [PurePath(job_folder), PurePath(os.path.abspath(job_folder))]
    try:
        out.append(PurePath(Path(job_folder).resolve()))
    except OSError:
        pass
    return out


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _shown(job_folder: Path, path: str | PurePath) -> str:
    p = PurePath(path)
    return str(p if p.is_absolute() else PurePath(job_folder) / p)


def _link(job_folder: Path, path: str | PurePath) -> JobFileRefused:
    return JobFileRefused(
        f"{_shown(job_folder, path)}: a symbolic link in the job's folder; nightshift does not "
        "follow links there (the job's program chose where they point); write the file itself"
    )
