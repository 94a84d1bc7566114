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
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nightshift.runtime.training.checkpoints import Found, verify

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
    if found.step is None:
        return None
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
            meta = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
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
        return folder, json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def restored_path(checkpoint: str, workspace: Path) -> str:
    """Where `restore` puts a kept copy back (the original checkpoint path), read from its small
    manifest without copying anything; any other checkpoint path is returned unchanged."""
    kept = _kept(checkpoint, workspace)
    return checkpoint if kept is None else kept[1]["path"]


def restore(checkpoint: str, workspace: Path, attempt: int) -> str:
    """For a resume from a kept copy: put its files back where the program wrote them and return
    the original checkpoint path; any other checkpoint path is returned unchanged. Copies files:
    the engine runs it outside any store transaction, before the launch."""
    kept = _kept(checkpoint, workspace)
    if kept is None:
        return checkpoint
    folder, meta = kept
    root = Path(meta["root"])
    aside = workspace / DISPLACED_DIR / f"before-attempt-{attempt}"
    for name in meta["files"]:
        dst = root / name
        if dst.exists():
            (aside / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(dst, aside / name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / name, dst)
    return meta["path"]


def _mapped(path: Path, root: Path, base: Path) -> Path:
    try:
        return base / path.resolve().relative_to(root)
    except ValueError:
        return base
