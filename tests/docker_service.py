"""A private Docker engine for the tests marked `service`, and the images they run; nothing pulled.

`dockerd` (Debian's docker.io; .ci/docker.sh installs it in CI) is started for the test session
with its own data root (on a tmpfs where it can mount one), exec root, socket, pid file and
containerd namespace, without iptables or a bridge, and stopped by its PID at the end. Images are made here:

* busybox: `FROM scratch` plus the statically linked /bin/busybox of Debian's busybox-static, its
  applets linked into /bin — enough for the executor's plumbing;
* python: a `debootstrap --variant=minbase` root file system with python3 and python3-numpy,
  trimmed, packed into a tar and `docker import`ed. The tar is cached under
  `$NIGHTSHIFT_TEST_IMAGE_CACHE` (default `~/.cache/nightshift-test-images/`), keyed by a hash of
  the recipe, so only the first run pays for debootstrap.

Whatever cannot be had (not root, no dockerd, no busybox-static, no debootstrap or mirror) skips
the tests that need it with the reason, except under CI=true, where it fails them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

IMAGE_CACHE = Path(
    os.environ.get("NIGHTSHIFT_TEST_IMAGE_CACHE")
    or Path.home() / ".cache" / "nightshift-test-images"
)
PYTHON_PACKAGES = ["python3", "python3-numpy"]
# Left out of the python image: package caches, indexes, docs, manuals and translations.
PYTHON_TRIM = [
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
]
RECIPE_VERSION = 1
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_DEBOOTSTRAP_TIMEOUT_S = 900.0
_TMPFS_SIZE = "4g"


def unavailable(reason: str) -> None:
    """Skip with the reason; under CI=true, where .ci/docker.sh provides everything, fail."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (required in CI: .ci/docker.sh installs it)", pytrace=False)
    pytest.skip(reason)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no output)"


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class DockerEngine:
    """A running private dockerd: its socket URL, an SDK client on it, and its folder."""

    base_url: str
    client: Any
    root: Path


class Dockerd:
    """One dockerd process with everything of its own under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.base_url = f"unix://{self.sock}"
        self.pidfile = root / "dockerd.pid"
        self.log = root / "dockerd.log"
        self.exec_root = root / "exec"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DockerEngine:
        dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/usr/bin")
        if dockerd is None:
            unavailable(
                "dockerd is not installed (Debian: `apt-get install docker.io`; CI runs "
                ".ci/docker.sh)"
            )
        if os.geteuid() != 0:
            unavailable("starting a private dockerd needs root")
        try:
            import docker
        except ImportError:
            unavailable(
                "the Docker SDK for Python is not installed (`pip install 'nightshift[docker]'`)"
            )
        assert dockerd is not None
        help_text = subprocess.run([dockerd, "--help"], capture_output=True, text=True).stdout
        config = self.root / "daemon.json"
        config.write_text("{}\n")  # ignore /etc/docker/daemon.json
        namespace = f"nightshift-test-{os.getpid()}"
        cmd = [
            dockerd,
            "--config-file",
            str(config),
            "--data-root",
            str(self.root / "data"),
            "--exec-root",
            str(self.exec_root),
            "-H",
            self.base_url,
            "--pidfile",
            str(self.pidfile),
            "--iptables=false",
            "--bridge=none",
            # a system containerd, if one runs, is shared: keep our containers apart in it
            "--containerd-namespace",
            namespace,
            "--containerd-plugins-namespace",
            f"{namespace}-plugins",
        ]
        if "--ip6tables" in help_text:
            cmd.append("--ip6tables=false")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                unavailable(
                    f"dockerd exited with code {self.proc.returncode} at start:\n" + _tail(self.log)
                )
            if self.sock.exists():
                client = None
                try:
                    client = docker.DockerClient(base_url=self.base_url, version="auto")
                    client.ping()
                    return DockerEngine(base_url=self.base_url, client=client, root=self.root)
                except docker.errors.DockerException as exc:
                    last = exc
                    if client is not None:
                        client.close()
            time.sleep(0.2)
        self.stop()
        unavailable(
            f"dockerd did not answer on {self.sock} within {_START_TIMEOUT_S:.0f} s "
            f"({last}):\n" + _tail(self.log)
        )
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM dockerd by its PID, SIGKILL it after a grace; then anything it left running
        from our exec root (its containerd and shims, only after a SIGKILL), by PID."""
        pid = self.proc.pid if self.proc is not None else None
        if pid is None and self.pidfile.exists():
            pid = int(self.pidfile.read_text().strip() or 0) or None
        if pid is not None:
            self._end(pid, _STOP_TIMEOUT_S)
        if self.proc is not None:
            self.proc.wait(timeout=5)
        marker = str(self.exec_root)
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and marker in _cmdline(int(entry.name)):
                self._end(int(entry.name), 5.0)

    def _end(self, pid: int, grace_s: float) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.pid == pid:
                if self.proc.poll() is not None:
                    return
            elif not _alive(pid):
                return
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cleanup(self) -> None:
        """Unmount what dockerd left mounted under our folder, then remove the folder."""
        _remove_tree(self.root)


def _remove_tree(root: Path) -> None:
    """Lazily unmount anything mounted under `root` (deepest first), then delete it."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target == str(root) or target.startswith(f"{root}/"):
            mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_sdk() -> Any:
    """The `docker` SDK module (the `docker` extra)."""
    try:
        import docker
    except ImportError:
        unavailable(
            "the Docker SDK for Python is not installed (`pip install 'nightshift[docker]'`)"
        )
    return docker


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """A private dockerd for the whole session, stopped by PID and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="ns-dockerd-"))
    # On a tmpfs: images import in a second and the data root goes in an instant at the end,
    # where unlinking its thousands of files from disk took 15 s here. Plain disk if not allowed.
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={_TMPFS_SIZE},mode=0700", "ns-dockerd", str(root)],
        capture_output=True,
    )
    daemon = Dockerd(root)
    try:
        engine = daemon.start()
        try:
            yield engine
        finally:
            engine.client.close()
    finally:
        daemon.stop()
        daemon.cleanup()


# --------------------------------------------------------------------------------- busybox image
def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (PT_INTERP)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only; the machines here are
            return False
        endian = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(endian + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from(endian + "I", table, i * phentsize)[0] != 3 for i in range(phnum))


def build_busybox_image(client: Any, workdir: Path) -> str:
    """Build `nightshift-test/busybox:<hash>` from the static busybox; returns the tag."""
    busybox = next(
        (p for p in (Path("/bin/busybox"), Path("/usr/bin/busybox")) if p.is_file()), None
    )
    if busybox is None or not _is_static_elf(busybox):
        unavailable(
            "a statically linked busybox is needed for the test image (Debian: "
            "`apt-get install busybox-static`)"
        )
    assert busybox is not None
    data = busybox.read_bytes()
    tag = f"nightshift-test/busybox:{hashlib.sha256(data).hexdigest()[:12]}"
    context = workdir / "busybox-image"
    context.mkdir(parents=True, exist_ok=True)
    (context / "busybox").write_bytes(data)
    (context / "busybox").chmod(0o755)
    (context / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        'RUN ["/bin/mkdir", "-p", "/tmp", "/etc"]\n'
        "ENV PATH=/bin\n"
    )
    client.images.build(path=str(context), tag=tag, rm=True, forcerm=True)
    return tag


@pytest.fixture(scope="session")
def busybox_image(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tag of the busybox image, built once per session (about a second)."""
    return build_busybox_image(docker_engine.client, tmp_path_factory.mktemp("images"))


# ---------------------------------------------------------------------------------- python image
@pytest.fixture(scope="session")
def digits_csv() -> Path:
    """scikit-learn's digits data file, which the example training script reads."""
    spec = importlib.util.find_spec("sklearn")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    unavailable("scikit-learn (the `examples` extra) ships the digits data the training run reads")
    raise AssertionError("unreachable")


def _codename() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"') or "bookworm"
    except FileNotFoundError:
        pass
    return "bookworm"


def _mirror(suite: str) -> str:
    """The Debian mirror apt uses here (NIGHTSHIFT_TEST_DEBIAN_MIRROR overrides it)."""
    if os.environ.get("NIGHTSHIFT_TEST_DEBIAN_MIRROR"):
        return os.environ["NIGHTSHIFT_TEST_DEBIAN_MIRROR"]
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1)
                for line in stanza.splitlines()
                if ":" in line and not line.startswith("#")
            )
            suites = fields.get("Suites", "").split()
            if suite in suites and "main" in fields.get("Components", "").split():
                return fields.get("URIs", "").split()[0]
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == suite:
                return parts[1] if not parts[1].startswith("[") else parts[2]
    return "http://deb.debian.org/debian"


def python_rootfs_tar() -> tuple[Path, str]:
    """The cached tar of the python root file system, built with debootstrap if missing;
    returns (path, recipe hash)."""
    suite = _codename()
    arch = (
        subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True
        ).stdout.strip()
        or "amd64"
    )
    recipe = {
        "version": RECIPE_VERSION,
        "suite": suite,
        "arch": arch,
        "variant": "minbase",
        "packages": PYTHON_PACKAGES,
        "trim": PYTHON_TRIM,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    tar = IMAGE_CACHE / f"python-{suite}-{key}.tar"
    if tar.exists():
        return tar, key
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if debootstrap is None:
        unavailable(
            "debootstrap is needed to build the python test image (Debian: "
            "`apt-get install debootstrap`)"
        )
    assert debootstrap is not None
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    with (IMAGE_CACHE / f"{tar.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it right now
        if tar.exists():
            return tar, key
        # Built on a tmpfs where one can be mounted: dpkg's many fsyncs cost nothing there, and
        # the tree is gone in an instant afterwards.
        work = Path(tempfile.mkdtemp(prefix="ns-debootstrap-"))
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={_TMPFS_SIZE},mode=0700",
                "ns-debootstrap",
                str(work),
            ],
            capture_output=True,
        )
        part = IMAGE_CACHE / f"{tar.name}.{os.getpid()}.part"
        try:
            root, log = work / "root", work / "debootstrap.log"
            started = time.monotonic()
            with log.open("wb") as out:
                try:
                    done = subprocess.run(
                        [
                            debootstrap,
                            "--variant=minbase",
                            f"--arch={arch}",
                            "--include=" + ",".join(PYTHON_PACKAGES),
                            suite,
                            str(root),
                            _mirror(suite),
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=_DEBOOTSTRAP_TIMEOUT_S,
                    )
                except subprocess.TimeoutExpired:
                    unavailable(
                        f"debootstrap took over {_DEBOOTSTRAP_TIMEOUT_S:.0f} s:\n" + _tail(log)
                    )
            if done.returncode != 0:
                unavailable(
                    f"debootstrap of the python test image failed "
                    f"(exit code {done.returncode}):\n" + _tail(log)
                )
            for rel in PYTHON_TRIM:
                shutil.rmtree(root / rel, ignore_errors=True)
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(root), "-cf", str(part), "."], check=True
            )
            os.replace(part, tar)
            print(f"built {tar} in {time.monotonic() - started:.0f} s")
        finally:
            part.unlink(missing_ok=True)
            _remove_tree(work)
    return tar, key


@pytest.fixture(scope="session")
def python_image(docker_engine: DockerEngine) -> str:
    """The tag of the python image: the cached root file system, imported (a few seconds; a
    minute or so more when debootstrap must build it first)."""
    tar, key = python_rootfs_tar()
    tag = f"nightshift-test/python:{key}"
    docker_engine.client.api.import_image(
        src=str(tar),
        repository="nightshift-test/python",
        tag=key,
        changes=[
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["python3"]',
        ],
    )
    docker_engine.client.images.get(tag)  # raises ImageNotFound if the import went wrong
    return tag
