"""A runs folder belongs to one store: the store's instance id, recorded in `<runs>/.store-instance`.

A recreated store hands out job and attempt ids from 1 again; beside the old runs folder its new
jobs met the old runs' workspaces and exit files, and two `sleep 30` jobs were reported
`succeeded, exit 0` after 0.6 s. Attempt keys are UUIDs now (store.Attempt.key); this is the
second guard. Work starts only where the runs folder records the store it works for (written by
the first process that starts work there), and a store file that vanished from a home whose runs
folder shows it existed is reported, never made again, empty.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlmodel import select

from nightshift.runtime.errors import OperatorError, StoreGone
from nightshift.runtime.store.db import Job, Store, sqlite_file

MARKER = ".store-instance"


def shown_url(url: str) -> str:
    """A store URL fit to print: a SQLite file's path, any other URL without its password."""
    path = sqlite_file(url)
    if path is not None:
        return str(path)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  # an unparsable URL fails where the store is opened
        return url.split("@")[-1]


def recorded(runs_dir: Path) -> dict[str, str] | None:
    """What the runs folder records of its store ({"instance", "store"}), or None if nothing."""
    marker = runs_dir / MARKER
    try:
        raw = marker.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperatorError(
            f"cannot read {marker}: {exc.strerror or exc}; make {runs_dir} readable by this user"
        ) from exc
    try:
        got = json.loads(raw)
        if not isinstance(got, dict) or not isinstance(got.get("instance"), str):
            raise ValueError("no instance")
    except ValueError:
        raise OperatorError(
            f"{marker}, which names the store that the runs in {runs_dir} belong to, is "
            "damaged; if those runs are this store's, delete the file and nightshift records "
            "the store again"
        ) from None
    return {"instance": got["instance"], "store": str(got.get("store", "?"))}


def _job_folders(runs_dir: Path) -> bool:
    try:
        return any(p.is_dir() for p in runs_dir.glob("job-*"))
    except OSError:
        return False


def check_store_present(store_url: str, runs_dir: Path) -> None:
    """Refuse to open a SQLite store whose file is missing when the runs folder shows that it
    existed (it records a store, or holds job folders): StoreGone naming the path and the fix.
    A fresh home (no runs) passes, and its store is made."""
    path = sqlite_file(store_url)
    if path is None or path.exists():
        return
    rec = recorded(runs_dir)
    if rec is None and not _job_folders(runs_dir):
        return
    evidence = (
        f"it records store instance {rec['instance']}"
        if rec is not None
        else "it holds the folders of earlier jobs"
    )
    raise StoreGone(
        f"the store {path} is missing, but the runs folder {runs_dir} shows that it existed "
        f"({evidence}); nightshift does not make a new, empty store in its place, whose job and "
        f"attempt ids would start again beside those runs. Restore {path} from a backup (with "
        f"its -wal file, if there is one); or, to start afresh on purpose, move the runs "
        f"folder aside (`mv {runs_dir} {runs_dir}.old`) and run the command again"
    )


def bind_runs(store: Store, runs_dir: Path) -> None:
    """Record the store's instance id in the runs folder, or check the one recorded there: an
    OperatorError when the runs were made for another store, before any work starts."""
    mine, shown = store.instance_id(), shown_url(store.url)
    fix = (
        "Nothing was started. Restore the store those runs belong to from a backup; or, to "
        f"start afresh on purpose, move {runs_dir} aside (or set executor.runs_dir to another "
        "folder)"
    )
    rec = recorded(runs_dir)
    if rec is None:
        if _job_folders(runs_dir) and not _has_jobs(store):
            raise OperatorError(
                f"the runs folder {runs_dir} holds the runs of earlier jobs but records no "
                f"store, and the store {shown} has no jobs: it was made afresh beside another "
                f"store's runs, and its jobs must not meet their files. {fix}"
            )
        rec = _record(runs_dir, {"instance": mine, "store": shown})
    if rec["instance"] != mine:
        raise OperatorError(
            f"the runs folder {runs_dir} belongs to store instance {rec['instance']} "
            f"({rec['store']}), but the store {shown} is instance {mine}: the store was "
            f"recreated or replaced since those runs were made, and its jobs must not meet "
            f"their files. {fix}"
        )


def _has_jobs(store: Store) -> bool:
    with store.session() as s:
        return s.exec(select(Job.id).limit(1)).first() is not None


def _record(runs_dir: Path, rec: dict[str, str]) -> dict[str, str]:
    """Write the record unless another process was first (a link never replaces a file); what
    the folder records afterwards."""
    marker = runs_dir / MARKER
    tmp = runs_dir / f"{MARKER}.{uuid.uuid4().hex}.tmp"
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(rec) + "\n", encoding="utf-8")
        try:
            os.link(tmp, marker)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: create it exclusively instead
            _create_exclusive(marker, tmp.read_bytes())
    except OSError as exc:
        raise OperatorError(
            f"cannot record the store in {marker}: {exc.strerror or exc}; make {runs_dir} "
            "writable by this user, or set executor.runs_dir to a folder that is"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    got = recorded(runs_dir)
    if got is None:
        raise OperatorError(f"{marker} vanished as it was written; run the command again")
    return got


def _create_exclusive(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
