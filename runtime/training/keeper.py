"""nightshift's own copies of the checkpoints taken while the metrics were still finite.

Many programs keep one checkpoint file and overwrite it in place (nanoGPT's `ckpt.pt`): once the
loss diverges, or a save is cut short, the only copy holds bad weights. While a run runs, the loop
copies each new checkpoint as soon as a finite metric point has measured it (the loss logged at
step c + 1 is the first measured on the weights saved at step c) into the job's folder:

    <job folder>/good-checkpoints/step-<c>/<path below the checkpoint folder>   (+ kept.json)

A copy is made at first sight because the program may overwrite the file at its next save, before
a divergence could be told from noise. It counts as confirmed once the divergence window of finite
points has followed it; `keep_good` confirmed generations are kept (one by default) and every copy
newer than the newest confirmed one, and when a run diverges at step b the copies of step b - 1
and later (measured by the diverging loss) are dropped.

Copies, not hard links: `torch.save(path)` truncates and rewrites the same inode, so a hard link
would be torn along with the original. The copy is verified after it is written (the program may
have overwritten the file while it was read), then renamed into place, so a half-made copy is
never mistaken for a good one.

Resuming from a kept copy puts its files back where the program looks for them (its fixed
`ckpt.pt`, say), after moving whatever is there aside to `<job folder>/displaced/`; nothing is
deleted.

The job's folder is its submitter's while the daemon copying may be root: inside it, every file is
read and written through job_files (no link followed, `..` refused), so a `checkpoints -> /root`
folder or a kept file swapped for a link to a secret is not copied, and no copy is written
through a link. A checkpoint folder a spec names outside the job's folder is copied as before.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from nightshift.runtime.training import job_files

if TYPE_CHECKING:
    from nightshift.runtime.training.checkpoints import Found

GOOD_DIR = "good-checkpoints"
DISPLACED_DIR = "displaced"
MANIFEST = "kept.json"


def good_dir(workspace: Path) -> Path:
    return workspace / GOOD_DIR


def signature(found: Found) -> list:
    """What identifies one save of a checkpoint: its step and its files' sizes and mtimes."""
    out: list = [str(found.path), found.step]
    for f in found.files:
        try:
            st = f.stat()
        except OSError:
            return []
        out.append([str(f), st.st_size, st.st_mtime_ns])
    return out


def keep(found: Found, root: Path, workspace: Path) -> Path | None:
    """Copy `found` (under the checkpoint folder `root`) into the good-checkpoint folder; returns
    the copy's checkpoint path, or None when the copy did not verify (a save in progress)."""
    # Here, not above: `show` lists the kept copies without the checkpoint search's NumPy.
    from nightshift.runtime.training.checkpoints import verify

    if found.step is None:
        return None
    try:
        if job_files.relative_in(workspace, root) is not None:
            return _keep_inside(found, root, workspace)
    except (OSError, job_files.JobFileRefused):
        return None  # a link, or a `..`, in the job's folder: not copied
    root = root.resolve()
    rels = []
    for f in found.files:
        try:
            rels.append(f.resolve().relative_to(root))
        except ValueError:
            return None  # a file outside the checkpoint folder: not ours to copy
    good = good_dir(workspace)
    final = good / f"step-{found.step:09d}"
    if final.exists():
        return _mapped(found.path, root, final)
    tmp = good / f".tmp-step-{found.step:09d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, src in zip(rels, found.files, strict=True):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        copy = replace(
            found, path=_mapped(found.path, root, tmp), files=tuple(tmp / r for r in rels)
        )
        if verify(copy) is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        (tmp / MANIFEST).write_text(
            json.dumps(
                {
                    "step": found.step,
                    "framework": found.framework,
                    "root": str(root),
                    "path": str(found.path),
                    "files": [str(r) for r in rels],
                },
                indent=1,
            )
        )
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return _mapped(found.path, root, final)


def _keep_inside(found: Found, root: Path, workspace: Path) -> Path | None:
    """`keep` for a checkpoint folder in the job's folder: each file read without following a
    link, each copy made new (never through a link), its folder entries handled by descriptor."""
    from nightshift.runtime.training.checkpoints import verify

    rels = []
    for f in found.files:
        try:
            rel = f.relative_to(root)
        except ValueError:
            return None  # a file outside the checkpoint folder: not ours to copy
        if ".." in rel.parts:
            return None
        rels.append(rel)
    assert found.step is not None
    good = good_dir(workspace)
    name, tmp_name = f"step-{found.step:09d}", f".tmp-step-{found.step:09d}"
    final, tmp = good / name, good / tmp_name
    gfd = job_files.open_dir(workspace, GOOD_DIR, create=True)
    try:
        if _entry(name, gfd):
            return final / found.path.relative_to(root)
        _remove(tmp_name, gfd)
        try:
            for rel, src in zip(rels, found.files, strict=True):
                _copy(workspace, src, tmp / rel)
            copy = replace(
                found, path=tmp / found.path.relative_to(root), files=tuple(tmp / r for r in rels)
            )
            if verify(copy) is not None:
                _remove(tmp_name, gfd)
                return None
            manifest = {
                "step": found.step,
                "framework": found.framework,
                "root": str(root),
                "path": str(found.path),
                "files": [str(r) for r in rels],
            }
            with job_files.create_file(workspace, tmp / MANIFEST) as out:
                out.write(json.dumps(manifest, indent=1).encode())
            os.replace(tmp_name, name, src_dir_fd=gfd, dst_dir_fd=gfd)
        except (OSError, job_files.JobFileRefused):
            _remove(tmp_name, gfd)
            return None
    finally:
        os.close(gfd)
    return final / found.path.relative_to(root)


def _copy(workspace: Path, src: Path, dst: Path) -> None:
    """`src` copied to a new file `dst`, both in the job's folder, with its mode and times (what
    shutil.copy2 keeps), no link followed on either side."""
    with job_files.open_file(workspace, src) as i, job_files.create_file(workspace, dst) as o:
        shutil.copyfileobj(i, o, 1 << 20)
        st = os.fstat(i.fileno())
        o.flush()
        os.chmod(o.fileno(), stat.S_IMODE(st.st_mode))
        os.utime(o.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))


def _entry(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def _remove(name: str, dir_fd: int) -> None:
    """Remove `name` in the folder `dir_fd` (a tree, a file or a link itself), never following a
    link out of it."""
    if not _entry(name, dir_fd):
        return
    if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _copies(workspace: Path) -> list[tuple[int, Path]]:
    out = []
    for folder in good_dir(workspace).glob("step-*"):
        try:
            out.append((int(folder.name.removeprefix("step-")), folder))
        except ValueError:
            continue
    return sorted(out)


def prune(workspace: Path, generations: int, confirmed: Callable[[int], bool]) -> list[int]:
    """Keep the newest `generations` confirmed copies and every copy newer than them; return the
    steps removed."""
    copies = _copies(workspace)
    sure = [step for step, _ in copies if confirmed(step)]
    keep = set(sure[-generations:]) if generations > 0 else set()
    newest = sure[-1] if sure else -1
    removed = []
    for step, folder in copies:
        if step not in keep and step <= newest:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(step)
    return removed


def drop_from(workspace: Path, step: int) -> list[int]:
    """Remove the copies of `step` and later (their weights are where a divergence began)."""
    removed = []
    for s, folder in _copies(workspace):
        if s >= step:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(s)
    return removed


def kept(workspace: Path) -> list[dict]:
    """The kept copies, oldest first: step, path, bytes."""
    out = []
    for folder in sorted(good_dir(workspace).glob("step-*")):
        try:
            with job_files.open_file(workspace, folder / MANIFEST) as f:
                meta = json.loads(f.read())
        except (OSError, ValueError, job_files.JobFileRefused):
            continue
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        out.append(
            {
                "step": meta["step"],
                "path": str(_mapped(Path(meta["path"]), Path(meta["root"]), folder)),
                "bytes": size,
                "original": meta["path"],
            }
        )
    return out


def _kept(checkpoint: str, workspace: Path) -> tuple[Path, dict] | None:
    """The kept copy's folder and manifest when `checkpoint` is one of them, else None."""
    path = Path(checkpoint)
    good = good_dir(workspace).resolve()
    try:
        rel = path.resolve().relative_to(good)
    except ValueError:
        return None
    folder = good / rel.parts[0]
    try:
        with job_files.open_file(workspace, folder / MANIFEST) as f:
            return folder, json.loads(f.read())
    except (OSError, ValueError, job_files.JobFileRefused):
        return None


def restored_path(checkpoint: str, workspace: Path) -> str:
    """Where `restore` puts a kept copy back (the original checkpoint path), read from its small
    manifest without copying anything; any other checkpoint path is returned unchanged."""
    kept = _kept(checkpoint, workspace)
    return checkpoint if kept is None else kept[1]["path"]


def restore(
    checkpoint: str,
    workspace: Path,
    attempt: int,
    *,
    checkpoint_dir: Path | None = None,
    outside_ok: bool = True,
) -> str:
    """For a resume from a kept copy: put its files back where the program wrote them and return
    the original checkpoint path; any other checkpoint path is returned unchanged. Copies files:
    the engine runs it outside any store transaction, before the launch.

    The manifest lies in the job's folder, which a job running as its submitter can rewrite: its
    `root` is taken only when it is the spec's `checkpoint_dir` (or inside it), and a root outside
    the job's folder only where `outside_ok` (not for a daemon that is root and a job that is
    not: that copy would write wherever the manifest says). Otherwise nothing is restored."""
    kept = _kept(checkpoint, workspace)
    if kept is None:
        return checkpoint
    folder, meta = kept
    root = Path(meta["root"])
    if checkpoint_dir is not None and not _within(root, checkpoint_dir):
        return checkpoint
    aside = workspace / DISPLACED_DIR / f"before-attempt-{attempt}"
    if job_files.relative_in(workspace, root) is not None:
        return _restore_inside(folder, meta, workspace, aside, checkpoint)
    if not outside_ok:
        return checkpoint
    for name in meta["files"]:
        dst = root / name
        if dst.exists():
            (aside / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(dst, aside / name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / name, dst)
    return meta["path"]


def _within(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or lies in it, as written or with the folder's own links
    resolved (a kept manifest records its root resolved). What is copied there is then opened
    without following links (`_restore_inside`) or only where no privilege is crossed."""
    p, f = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    if p == f or p.is_relative_to(f):
        return True
    real = f.resolve()
    return p == real or p.is_relative_to(real)


def _restore_inside(folder: Path, meta: dict, workspace: Path, aside: Path, checkpoint: str) -> str:
    """`restore` into a checkpoint folder in the job's folder: the kept files are read without
    following a link (all opened before anything moves: one refused, nothing is put back and
    the checkpoint is returned unchanged), what is there is moved aside by name, and each copy
    is a new file, never written through a link."""
    root = Path(meta["root"])
    names = [Path(n) for n in meta["files"]]
    sources = []
    try:
        for name in names:
            if name.is_absolute() or ".." in name.parts:
                raise job_files.JobFileRefused(f"{name}: leaves the checkpoint folder")
            sources.append(job_files.open_file(workspace, folder / name))
        for name, src in zip(names, sources, strict=True):
            dst = root / name
            parent = job_files.open_dir(workspace, _rel(workspace, dst.parent), create=True)
            try:
                if _entry(dst.name, parent):
                    moved = job_files.open_dir(
                        workspace, _rel(workspace, (aside / name).parent), create=True
                    )
                    try:
                        os.replace(dst.name, dst.name, src_dir_fd=parent, dst_dir_fd=moved)
                    finally:
                        os.close(moved)
            finally:
                os.close(parent)
            with job_files.create_file(workspace, dst) as out:
                shutil.copyfileobj(src, out, 1 << 20)
                st = os.fstat(src.fileno())
                out.flush()
                os.chmod(out.fileno(), stat.S_IMODE(st.st_mode))
                os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
    except job_files.JobFileRefused:
        return checkpoint  # a link where a kept file was: nothing of it is put back
    finally:
        for src in sources:
            src.close()
    return meta["path"]


def _rel(workspace: Path, path: Path) -> Path:
    rel = job_files.relative_in(workspace, path)
    if rel is None:
        raise job_files.JobFileRefused(f"{path}: not in the job's folder {workspace}")
    return Path(rel)


def _mapped(path: Path, root: Path, base: Path) -> Path:
    """Where `path` (below `root`) lies below `base`: by name first, else with links resolved."""
    for p, r in ((path, root), (path.resolve(), root.resolve())):
        try:
            return base / p.relative_to(r)
        except ValueError:
            continue
    return base
