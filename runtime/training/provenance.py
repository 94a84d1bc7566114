"""What makes an attempt reproducible, read as it starts: the code's git commit, branch and dirty
diff, the interpreter and its exact package list, the container image's digest, the seed, argv,
the environment the spec names, the data it names with a cheap fingerprint, the GPUs as the
health probe last read them, and the host.

Capture never fails a launch and never holds it up for long: every command is an argv list run
with a timeout taken from one budget for the whole capture, and whatever could not be read is a
note in the record, not an exception. Big texts (the diff, the package list) are kept once per
distinct sha256 under `$NIGHTSHIFT_HOME/provenance/` and the record names them by hash.

Where jobs run as their submitters (`Inputs.run_as`), what the capture reads of the code, the data
and the interpreter it reads as the submitter — git and the package list run with their uid, gid
and groups, and the data is walked by a small child that drops to them before it looks — so a
job's record holds what its submitter can read, never what only the daemon can ("not readable by
alice" instead). Only `docker image inspect`, which asks the engine, stays the daemon's.

`reproduce` checks a recorded commit out, and reads today's package list and data, with the same
helpers as the person who asks for it (`run`, `python_info`, `data_info_as` with their account).

Plain functions on plain values: the engine calls `capture`, `nightshift show` flags `changes`
between attempts, `compare` lists `differences`, and `reproduce` checks `drift` against now.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic stays out of a capture that runs as the daemon's own user
    from nightshift.runtime.executors.submitter import RunAs

VERSION = 1
BUDGET_S = 10.0  # the whole capture, at most (settings: loop.provenance_budget_s)
COMMAND_S = 5.0  # one command, at most
MAX_UNTRACKED = 200  # untracked files listed by name (the count is always kept)
MAX_DATA_FILES = 10_000  # files stat'ed per data path for its fingerprint
HASH_CHUNK = 1 << 20


@dataclass
class Budget:
    """Time left for one capture, on the monotonic clock."""

    seconds: float = BUDGET_S
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def timeout(self, cap: float = COMMAND_S) -> float:
        return max(0.0, min(cap, self.left()))

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Blobs:
    """Texts kept once per distinct sha256 (`<root>/<2 hex>/<sha256>`), written atomically."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha

    def put(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        target = self.path(sha)
        if target.exists():
            return sha
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{sha}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return sha

    def get(self, sha: str | None) -> bytes | None:
        if not sha or not all(c in "0123456789abcdef" for c in sha) or len(sha) != 64:
            return None
        try:
            return self.path(sha).read_bytes()
        except OSError:
            return None


def blobs_of(home: Path) -> Blobs:
    return Blobs(Path(home) / "provenance")


@dataclass
class Ran:
    """One command's result; `note` says why there is no output (missing, timeout, failure)."""

    out: str = ""
    err: str = ""
    rc: int | None = None
    note: str | None = None
    raw: bytes = b""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.note is None


QUIET = {"GIT_OPTIONAL_LOCKS": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run(
    argv: Sequence[str],
    budget: Budget,
    *,
    cwd: str | Path | None = None,
    as_user: RunAs | None = None,
    stdin: bytes | None = None,
) -> Ran:
    """Run an argv list (never a shell) within the budget; never raises. `as_user`: with that
    account's uid, gid and groups and a login's environment (the launch's drop), from `/`.
    `stdin`: bytes fed to it (a blob of the daemon's that the account itself may not open)."""
    timeout = budget.timeout()
    if timeout <= 0:
        return Ran(note=f"{argv[0]}: not run, the capture's {budget.seconds:g} s were spent")
    options: dict[str, Any] = {"cwd": cwd, "env": {**os.environ, **QUIET}}
    if as_user is not None:
        options = {
            "user": as_user.uid,
            "group": as_user.gid,
            "extra_groups": list(as_user.groups),
            "env": {**as_user.environment(), **QUIET},
            "cwd": cwd or "/",
        }
    try:
        proc = subprocess.run(
            list(argv),
            **options,
            capture_output=True,
            timeout=timeout,
            check=False,
            **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
        )
    except FileNotFoundError:
        return Ran(note=f"{argv[0]}: not found")
    except subprocess.TimeoutExpired:
        return Ran(note=f"{' '.join(argv[:3])}: timed out after {timeout:.1f} s")
    except OSError as exc:
        return Ran(note=f"{argv[0]}: {exc.strerror or exc}")
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["no message"])[-1][:300]
        note = f"{' '.join(argv[:3])}: exit {proc.returncode}: {last}"
        return Ran(out, err, proc.returncode, note, proc.stdout)
    return Ran(out, err, proc.returncode, raw=proc.stdout)


_run = run  # for the readers below whose own argument is named `run`


# ------------------------------------------------------------------------------ git
def denied(ran: Ran) -> bool:
    """Whether a command run as another account failed for want of that account's rights."""
    return "permission denied" in (ran.err + (ran.note or "")).lower()


def git_info(
    folder: Path, budget: Budget, blobs: Blobs, as_user: RunAs | None = None
) -> dict[str, Any]:
    """The commit, branch and dirty state of the git tree holding `folder`; the diff against HEAD
    (staged and not, binary-safe) kept as a blob, untracked files listed. `as_user`: git runs as
    that account (its repository is theirs: no "dubious ownership"; a folder they cannot read
    is "not readable by" them, nothing of it is read)."""

    def run(argv: list[str], budget: Budget) -> Ran:
        return _run(argv, budget, as_user=as_user)

    top = run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], budget)
    if not top.ok:
        if as_user is not None and denied(top):
            return {"repo": None, "note": f"{folder}: not readable by {as_user.name}"}
        return {"repo": None, "note": f"not in a git work tree ({top.note})"}
    root = Path(top.out.strip())
    out: dict[str, Any] = {"repo": str(root)}
    with contextlib.suppress(ValueError):
        out["subdir"] = str(Path(folder).resolve().relative_to(root.resolve()))
    head = run(["git", "-C", str(root), "rev-parse", "HEAD"], budget)
    if not head.ok:
        out["commit"], out["note"] = None, f"no commit ({head.note})"
        return out
    out["commit"] = head.out.strip()
    branch = run(["git", "-C", str(root), "symbolic-ref", "--short", "-q", "HEAD"], budget)
    out["branch"] = branch.out.strip() or None  # None: a detached HEAD
    remote = run(["git", "-C", str(root), "config", "--get", "remote.origin.url"], budget)
    out["remote"] = remote.out.strip() or None
    # A repository's own config must not run commands here (an fsmonitor hook, an external diff
    # driver): the reading is the loop's, not the program's.
    status = run(
        [
            "git",
            "-C",
            str(root),
            "-c",
            "core.fsmonitor=false",
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
        ],
        budget,
    )
    if not status.ok:
        out["dirty"], out["note"] = None, f"status unknown ({status.note})"
        return out
    entries = [e for e in status.out.split("\0") if e]
    untracked = sorted(e[3:] for e in entries if e.startswith("?? "))
    changed = [e for e in entries if not e.startswith("?? ")]
    out["untracked"] = untracked[:MAX_UNTRACKED]
    out["untracked_count"] = len(untracked)
    out["dirty"] = bool(changed or untracked)
    if changed:
        diff = run(
            [
                "git",
                "-C",
                str(root),
                "-c",
                "core.fsmonitor=false",
                "diff",
                "--no-ext-diff",
                "--no-textconv",
                "--binary",
                "HEAD",
            ],
            budget,
        )
        if diff.ok and diff.raw:
            data = diff.raw
            out["diff_sha256"] = blobs.put(data)
            out["diff_bytes"] = len(data)
            out["diff_files"] = len([e for e in changed if e])
        else:
            out["note"] = f"dirty, but the diff was not kept ({diff.note or 'empty'})"
    return out


# ------------------------------------------------------------------------------ python
def _prefix(interpreter: Path) -> Path:
    return interpreter.parent.parent


def manager_of(interpreter: Path) -> str:
    """How the environment is managed: conda, uv (a uv-made venv) or pip."""
    prefix = _prefix(interpreter)
    if (prefix / "conda-meta").is_dir():
        return "conda"
    cfg = prefix / "pyvenv.cfg"
    with contextlib.suppress(OSError):
        if any(line.split("=")[0].strip() == "uv" for line in cfg.read_text().splitlines()):
            return "uv"
    return "pip"


def _site_stamp(interpreter: Path) -> str | None:
    """A cheap stamp that changes when packages are installed or removed: the mtimes of the
    environment's site-packages folders and of the folders its .pth files add. None where the
    environment's layout is not known (no venv, no conda): then the list is always read."""
    prefix = _prefix(interpreter)
    if (prefix / "conda-meta").is_dir():
        return _stamp([prefix / "conda-meta"])
    if not (prefix / "pyvenv.cfg").is_file():
        return None
    sites = sorted(prefix.glob("lib/python*/site-packages")) + sorted(
        prefix.glob("Lib/site-packages")
    )
    extra: list[Path] = []
    for site in sites:
        for pth in sorted(site.glob("*.pth")):
            with contextlib.suppress(OSError):
                for line in pth.read_text(errors="replace").splitlines():
                    line = line.strip()
                    if line and not line.startswith(("#", "import")) and Path(line).is_dir():
                        extra.append(Path(line))
    return _stamp([prefix / "pyvenv.cfg", *sites, *extra])


def _stamp(paths: Iterable[Path]) -> str | None:
    parts = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            return None
        parts.append(f"{p}:{st.st_mtime_ns}:{st.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def package_argv(interpreter: Path, manager: str) -> list[str]:
    if manager == "uv" and shutil.which("uv"):
        return ["uv", "pip", "freeze", "--python", str(interpreter)]
    if manager == "conda" and shutil.which("conda"):
        return ["conda", "list", "--export", "-p", str(_prefix(interpreter))]
    return [str(interpreter), "-m", "pip", "freeze"]


def _cache_key(
    interpreter: str | None, as_user: RunAs | None = None
) -> tuple[Path, str | None, str] | None:
    """The interpreter's path, its environment's stamp and the cache key: a list read as one
    account is never another's answer (bob's list is not alice's, whose read may be refused)."""
    found = shutil.which(interpreter) if interpreter else None
    if not found:
        return None
    path = Path(found).absolute()
    stamp = _site_stamp(path)
    reader = f"uid {as_user.uid}|" if as_user is not None else ""
    return path, stamp, f"{reader}{path}|{path.resolve()}|{manager_of(path)}|{stamp}"


def python_cached(
    interpreter: str | None, blobs: Blobs, cache: Path | None, as_user: RunAs | None = None
) -> dict[str, Any] | None:
    """python_info's answer from the cache alone (a few stat calls), or None when the package
    list must be read (a new or changed environment)."""
    got = _cache_key(interpreter, as_user)
    if got is None:
        return None
    _, stamp, key = got
    known = _read_cache(cache)
    if stamp is not None and key in known and blobs.get(known[key].get("packages_sha256")):
        return {**known[key], "cached": True}
    return None


def python_info(
    interpreter: str | None,
    budget: Budget,
    blobs: Blobs,
    cache: Path | None = None,
    as_user: RunAs | None = None,
) -> dict[str, Any]:
    """The interpreter (resolved), its version and its exact package list, the list kept as a
    blob. The list is read again only when the environment's stamp changed since the last read
    (`cache`: a small JSON file), so an unchanged venv costs a few stat calls. `as_user`: the
    interpreter and the package tool run as that account."""
    got = _cache_key(interpreter, as_user)
    if got is None:
        return {"interpreter": interpreter, "note": f"interpreter {interpreter!r} not found"}
    path, stamp, key = got
    real = path.resolve()
    manager = manager_of(path)
    known = _read_cache(cache)
    if stamp is not None and key in known and blobs.get(known[key].get("packages_sha256")):
        return {**known[key], "cached": True}
    out: dict[str, Any] = {"interpreter": str(path), "real": str(real), "manager": manager}
    version = run(
        [str(path), "-c", "import sys; print(sys.version.split()[0]); print(sys.prefix)"],
        budget,
        as_user=as_user,
    )
    if version.ok:
        lines = version.out.splitlines()
        out["version"] = lines[0] if lines else None
        out["prefix"] = lines[1] if len(lines) > 1 else None
    argv = package_argv(path, manager)
    listed = run(argv, budget, as_user=as_user)
    out["packages_argv"] = argv
    if listed.ok:
        text = "\n".join(sorted(line for line in listed.out.splitlines() if line.strip())) + "\n"
        out["packages_sha256"] = blobs.put(text.encode())
        out["packages_count"] = text.count("\n")
        if stamp is not None and cache is not None:
            _write_cache(cache, {**known, key: out})
    elif as_user is not None and (denied(listed) or denied(version)):
        out["note"] = f"package list not read: not readable by {as_user.name} ({listed.note})"
    else:
        out["note"] = f"package list not read: {listed.note}"
    return out


def _read_cache(cache: Path | None) -> dict[str, dict[str, Any]]:
    if cache is None:
        return {}
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: Path, data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(list(data.items())[-64:])))
        os.replace(tmp, cache)


def packages_text(blobs: Blobs, sha: str | None) -> str | None:
    data = blobs.get(sha)
    return None if data is None else data.decode("utf-8", "replace")


def package_drift(before: str, after: str) -> list[str]:
    """`name: old → new` for each package added, removed or at another version."""

    def parse(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            for sep in ("==", " @ ", "="):
                if sep in line:
                    name, _, ver = line.partition(sep)
                    out[name.strip().lower()] = ver.strip()
                    break
            else:
                out[line.lower()] = ""
        return out

    a, b = parse(before), parse(after)
    lines = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            lines.append(f"{name}: {a.get(name, '(absent)')} → {b.get(name, '(absent)')}")
    return lines


# ------------------------------------------------------------------------------ image
def image_info(image: str, budget: Budget, docker_host: str | None = None) -> dict[str, Any]:
    """The image's digest, resolved by `docker image inspect` (a repo digest, else the local image
    id), never its tag, from the engine at `docker_host` (the executor's; None: the docker CLI's
    default). An image named by digest is its own answer."""
    out: dict[str, Any] = {"ref": image}
    if "@sha256:" in image:
        out["digest"] = image.split("@", 1)[1]
        out["pinned"] = image
        return out
    host = ["-H", docker_host] if docker_host else []
    ran = run(
        ["docker", *host, "image", "inspect", "--format", "{{json .RepoDigests}} {{.Id}}", image],
        budget,
    )
    if not ran.ok:
        out["digest"], out["note"] = None, f"digest not resolved: {ran.note}"
        return out
    repo_digests, _, image_id = ran.out.strip().partition(" ")
    try:
        digests = [d for d in json.loads(repo_digests) or [] if isinstance(d, str)]
    except ValueError:
        digests = []
    name = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    same = [d for d in digests if d.split("@", 1)[0] in (name, f"docker.io/{name}")]
    if same or digests:
        chosen = (same or digests)[0]
        out["digest"], out["pinned"] = chosen.split("@", 1)[1], chosen
    else:  # built here, never pushed: the image id is its digest on this machine only
        out["digest"], out["pinned"] = image_id, None
        out["note"] = "a local image with no registry digest: its id pins it on this host only"
    return out


# ------------------------------------------------------------------------------ data
def data_info(
    refs: Sequence[Mapping[str, Any]], base: Path, budget: Budget, reader: str | None = None
) -> list[dict[str, Any]]:
    """A fingerprint of each data path the spec names: size and mtime of its files (at most
    MAX_DATA_FILES per path), and a content sha256 where the spec asks (`hash: true`), while the
    budget lasts. What this process may not read is left out and named "not readable" (by
    `reader`, the account it runs as): a path it cannot read records no fingerprint at all."""
    by = f" by {reader}" if reader else ""
    out = []
    for ref in refs:
        raw = str(ref.get("path", ""))
        p = Path(os.path.expanduser(raw))
        p = p if p.is_absolute() else base / p
        item: dict[str, Any] = {"path": raw, "resolved": str(p)}
        files = _files(p)
        if isinstance(files, str):
            item["note"] = "not found" if files == "missing" else f"not readable{by}"
            out.append(item)
            continue
        listed, truncated, skipped = files
        item["files"] = len(listed)
        item["truncated"] = truncated
        item["bytes"] = sum(size for _, size, _ in listed)
        item["newest_mtime"] = max((m for _, _, m in listed), default=None)
        item["fingerprint"] = hashlib.sha256(
            "\n".join(f"{r}\t{s}\t{m}" for r, s, m in listed).encode()
        ).hexdigest()
        if skipped:
            item["unreadable"] = skipped
            item["note"] = f"{skipped} file(s) or folder(s) not readable{by}, left out"
        if ref.get("hash"):
            item["sha256"], note = _content_hash(p, [r for r, _, _ in listed], budget)
            if note:
                item["note"] = note
        out.append(item)
    return out


def _readable(p: Path, folder: bool = False) -> bool:
    return os.access(p, os.R_OK | (os.X_OK if folder else 0))


def _files(p: Path) -> tuple[list[tuple[str, int, int]], bool, int] | str:
    """(relative name, size, mtime) of each readable file at `p`, whether the list was cut, and
    how many files or folders could not be read; or "missing", or "unreadable" for a path this
    process may not read (its size and mtime are not recorded either)."""
    try:
        st = p.stat()
    except PermissionError:
        return "unreadable"
    except OSError:
        return "missing"
    if not p.is_dir():
        return ([(p.name, st.st_size, st.st_mtime_ns)], False, 0) if _readable(p) else "unreadable"
    if not _readable(p, folder=True):
        return "unreadable"
    listed: list[tuple[str, int, int]] = []
    skipped = 0

    def refused(_: OSError) -> None:
        nonlocal skipped
        skipped += 1

    for dirpath, dirs, names in os.walk(p, onerror=refused):
        dirs.sort()
        for name in sorted(names):
            f = Path(dirpath) / name
            with contextlib.suppress(OSError):
                fs = f.stat()
                if not _readable(f):
                    skipped += 1
                    continue
                listed.append((str(f.relative_to(p)), fs.st_size, fs.st_mtime_ns))
            if len(listed) >= MAX_DATA_FILES:
                return listed, True, skipped
    return listed, False, skipped


# The data reader as the submitter: started by the daemon (it can always run its own interpreter
# and import its own packages, which the submitter may not), it drops to the submitter — setgroups,
# setgid, then setuid, as the launcher does — before it looks at anything the spec names.
_DATA_AS = (
    "import json, os, site, sys; [site.addsitedir(p) for p in json.loads(sys.argv[1])]; "
    "from nightshift.runtime.training import provenance as p; a = json.load(sys.stdin); "
    "os.setgroups(a['groups']); os.setgid(a['gid']); os.setuid(a['uid']); "
    "json.dump(p.data_info(a['refs'], p.Path(a['base']), p.Budget(a['seconds']), a['reader']), "
    "sys.stdout)"
)


def data_info_as(
    refs: Sequence[Mapping[str, Any]], base: Path, budget: Budget, as_user: RunAs
) -> list[dict[str, Any]]:
    """data_info read with `as_user`'s rights, in a child that drops to them first; bounded by
    the budget (a FIFO a job planted in its data cannot hold the capture up)."""
    if not refs:
        return []
    seconds = budget.timeout(cap=budget.left())
    asked = {
        "uid": as_user.uid,
        "gid": as_user.gid,
        "groups": list(as_user.groups),
        "refs": [dict(r) for r in refs],
        "base": str(base),
        "seconds": seconds,
        "reader": as_user.name,
    }
    why: str
    try:
        proc = subprocess.run(
            [sys.executable, "-P", "-c", _DATA_AS, json.dumps([p for p in sys.path if p])],
            input=json.dumps(asked).encode(),
            capture_output=True,
            timeout=seconds + 2.0,  # the child's own budget, and its start
            check=False,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": os.environ.get("LANG", "C.UTF-8")},
        )
        if proc.returncode == 0:
            got = json.loads(proc.stdout)
            if isinstance(got, list):
                return got
        why = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired:
        why = f"timed out after {seconds + 2.0:.1f} s"
    except (OSError, ValueError) as exc:
        why = str(exc)
    return [
        {"path": str(r.get("path", "")), "note": f"not read as {as_user.name}: {why[:300]}"}
        for r in refs
    ]


def _content_hash(p: Path, rels: list[str], budget: Budget) -> tuple[str | None, str | None]:
    h = hashlib.sha256()
    for rel in rels:
        f = p if not p.is_dir() else p / rel
        h.update(rel.encode() + b"\0")
        try:
            with f.open("rb") as fh:
                while chunk := fh.read(HASH_CHUNK):
                    h.update(chunk)
                    if budget.left() <= 0:
                        return None, "content hash not finished within the capture's budget"
        except OSError as exc:
            return None, f"content hash failed: {exc.strerror or exc}"
    return h.hexdigest(), None


# ------------------------------------------------------------------------------ GPUs
GPU_NOTE = "from the health probe's latest reading of each GPU"


def _why_not_read(data: Mapping[str, Any], name: str) -> str:
    """Why a reading holds no value for `name`, in the probe's own words."""
    if name in (data.get("unreadable") or []):
        return f"unreadable: {(data.get('errors') or {}).get(name) or 'error'}"
    if name in (data.get("unsupported") or []):
        return "not supported by this driver"
    return (
        "not read by this probe (a reading from before it read versions, or a declared inventory)"
    )


def gpu_info(gpus: Sequence[int], samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The GPUs' model (and driver and CUDA versions where the probe's reading has them) from
    the health probe's latest recorded reading of each; nothing is invented: a GPU with no
    reading says so, and a run without GPUs records none."""
    if not gpus:
        return {"devices": [], "note": "the run uses no GPU"}
    latest: dict[int, Mapping[str, Any]] = {}
    for s in samples:  # newest first
        latest.setdefault(int(s["gpu_index"]), s)
    devices = []
    for g in gpus:
        read = latest.get(int(g))
        if read is None:
            devices.append({"index": g, "note": "no health probe reading recorded"})
            continue
        data = read.get("data") or {}
        device = {
            "index": g,
            "name": data.get("name"),
            "uuid": data.get("uuid") or read.get("uuid"),
            "driver_version": data.get("driver_version"),
            "cuda_version": data.get("cuda_version"),
            "verdict": read.get("verdict"),
            "read_at": str(read.get("taken_at")) if read.get("taken_at") else None,
        }
        for name in ("driver_version", "cuda_version"):
            if device[name] is None:  # never invented: the record says why there is none
                device[f"{name}_note"] = _why_not_read(data, name)
        devices.append(device)
    return {"devices": devices, "note": GPU_NOTE}


# ------------------------------------------------------------------------------ one capture
@dataclass
class Inputs:
    """What the engine knows of an attempt as it starts."""

    code_dir: Path
    argv: list[str]
    params: dict[str, Any]
    spec_seed: int | None
    env: dict[str, str]
    data: list[dict[str, Any]]
    image: str | None = None
    docker_host: str | None = None  # the docker executor's engine, where the image is
    interpreter: str | None = None  # None in an image: its packages are the image's
    gpus: list[int] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    host: str = ""
    # The submitter, where jobs run as their submitters: the code, data and interpreter are read
    # as them. None: as this process (the embedded mode, or a daemon that runs jobs as itself).
    run_as: RunAs | None = None


LATER_S = 120.0  # a package list read after the launch, at most
PENDING_NOTE = "the package list is read after the launch (a new or changed environment)"


def pythons_cache(home: Path) -> Path:
    return Path(home) / "provenance" / "pythons.json"


def capture(
    inp: Inputs, home: Path, budget_s: float = BUDGET_S, *, packages_later: bool = False
) -> dict[str, Any]:
    """The attempt's provenance record. Never raises: what could not be read is a note.
    `packages_later`: a package list that is not cached is not read here (`pip freeze` takes a
    second or more): the record's python part says `pending`, and the caller reads it with
    `python_info` after the launch."""
    budget = Budget(budget_s)
    blobs = blobs_of(home)

    def python() -> dict[str, Any]:
        if not inp.interpreter:
            return {"note": "the run's interpreter is the image's: the image digest pins it"}
        if packages_later:
            cached = python_cached(inp.interpreter, blobs, pythons_cache(home), inp.run_as)
            if cached is not None:
                return cached
            return {"interpreter": inp.interpreter, "pending": True, "note": PENDING_NOTE}
        return python_info(inp.interpreter, budget, blobs, pythons_cache(home), inp.run_as)

    def data() -> list[dict[str, Any]]:
        if inp.run_as is not None:
            return data_info_as(inp.data, inp.code_dir, budget, inp.run_as)
        return data_info(inp.data, inp.code_dir, budget)

    seed, seed_from = (
        (inp.params["seed"], "params.seed") if "seed" in inp.params else (inp.spec_seed, "spec")
    )
    record: dict[str, Any] = {
        "version": VERSION,
        "host": inp.host or socket.gethostname(),
        "argv": list(inp.argv),
        "params": dict(inp.params),
        "seed": seed,
        "seed_from": seed_from if seed is not None else None,
        "env": dict(inp.env),
        "code_dir": str(inp.code_dir),
        **({"read_as": inp.run_as.name} if inp.run_as is not None else {}),
    }
    parts: list[tuple[str, Any]] = [
        ("git", lambda: git_info(inp.code_dir, budget, blobs, inp.run_as)),
        ("python", python),
        ("image", lambda: image_info(inp.image, budget, inp.docker_host) if inp.image else None),
        ("data", data),
        ("gpu", lambda: gpu_info(inp.gpus, inp.samples)),
    ]
    for name, read in parts:
        try:
            record[name] = read()
        except Exception as exc:  # a capture must never stop a launch
            record[name] = {"note": f"not captured: {type(exc).__name__}: {exc}"}
    record["capture_s"] = round(budget.elapsed(), 4)
    record["nightshift_python"] = sys.version.split()[0]
    return record


# ------------------------------------------------------------------------------ reading records
def _get(record: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = record
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def _gpu_field(record: Mapping[str, Any] | None, name: str) -> list[Any]:
    return [d.get(name) for d in _get(record, "gpu", "devices") or [] if isinstance(d, Mapping)]


def _data_prints(record: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        str(d.get("path")): d.get("sha256") or d.get("fingerprint")
        for d in _get(record, "data") or []
        if isinstance(d, Mapping)
    }


# (label, how a record's value is read) — what `changes` and `differences` compare
FIELDS: list[tuple[str, Any]] = [
    ("commit", lambda r: _get(r, "git", "commit")),
    ("branch", lambda r: _get(r, "git", "branch")),
    ("dirty tree", lambda r: _get(r, "git", "dirty")),
    ("diff", lambda r: _get(r, "git", "diff_sha256")),
    ("untracked files", lambda r: _get(r, "git", "untracked_count")),
    ("interpreter", lambda r: _get(r, "python", "interpreter")),
    ("python", lambda r: _get(r, "python", "version")),
    ("packages", lambda r: _get(r, "python", "packages_sha256")),
    ("image digest", lambda r: _get(r, "image", "digest")),
    ("seed", lambda r: _get(r, "seed")),
    ("env", lambda r: _get(r, "env")),
    ("data", _data_prints),
    ("GPU model", lambda r: _gpu_field(r, "name")),
    ("driver", lambda r: _gpu_field(r, "driver_version")),
    ("CUDA", lambda r: _gpu_field(r, "cuda_version")),
    ("host", lambda r: _get(r, "host")),
]


def short(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    if isinstance(value, str) and len(value) >= 40 and value.startswith("sha256:"):
        return value[:19]
    if isinstance(value, str) and len(value) == 40:
        return value[:10]
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)[:80]
    return str(value)


def differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Each compared field whose value differs between two records: {field, a, b}."""
    return [
        {"field": label, "a": read(a), "b": read(b)} for label, read in FIELDS if read(a) != read(b)
    ]


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """What changed since the previous attempt of the same job, flagged for `show`: another
    commit, a dirty tree, other packages, another driver or image, ... (parameters are shown
    apart). Also a dirty tree in the first attempt."""
    if after is None:
        return []
    flags = []
    if _get(after, "git", "dirty"):
        n = _get(after, "git", "untracked_count") or 0
        flags.append(
            "dirty tree"
            + (
                f" (diff {short(_get(after, 'git', 'diff_sha256'))})"
                if _get(after, "git", "diff_sha256")
                else ""
            )
            + (f", {n} untracked" if n else "")
        )
    if before is None:
        return flags
    for d in differences(before, after):
        if d["field"] in ("dirty tree", "untracked files"):
            continue
        flags.append(f"{d['field']}: {short(d['a'])} → {short(d['b'])}")
    return flags


def drift(recorded: Mapping[str, Any], now: Mapping[str, Any], blobs: Blobs) -> list[str]:
    """Why a reproduction may not match: the package list and the data fingerprints now against
    those recorded (one line each, with the packages that differ)."""
    out = []
    before, after = (
        _get(recorded, "python", "packages_sha256"),
        _get(now, "python", "packages_sha256"),
    )
    if before and before != after:
        a, b = packages_text(blobs, before), packages_text(blobs, after)
        detail = package_drift(a, b) if a is not None and b is not None else []
        shown = "; ".join(detail[:8]) + (f"; … {len(detail) - 8} more" if len(detail) > 8 else "")
        out.append(
            f"the package list differs from the recorded one ({short(before)} → {short(after)})"
            + (f": {shown}" if shown else "")
        )
    elif before is None and _get(recorded, "python", "interpreter"):
        out.append("no package list was recorded for the attempt: it cannot be compared")
    recorded_data, now_data = _data_prints(recorded), _data_prints(now)
    for path, value in recorded_data.items():
        if now_data.get(path) != value:
            out.append(f"data {path}: its fingerprint differs from the recorded one")
    return out
