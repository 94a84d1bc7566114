"""Runs each launch request as a Docker container, through the `docker` SDK (`pip install
'nightshift[docker]'`).

The container is the record: its name comes from the request key, so creating it is the lock that
makes `start` idempotent across processes, and its labels (`nightshift.key`, `nightshift.log_path`)
let any later process find it again and learn where its log goes. Docker keeps the exit code and
the output of an ended container, so a restarted daemon re-attaches by label and still learns how
a run ended. Containers are never pulled, removed only by `cleanup` (before a relaunch), and get no
network unless the request (or the executor's default) names one.

The run's log file is the same as for a local run: the container's stdout and stderr, copied
incrementally (a background thread while this process watches, and on every `poll`, `logs` and
`stop`). How far the copy got is kept beside the handles under `<runs_dir>/docker/`, as the newest
copied timestamp and the timestamps of the last seconds' lines, so that any number of processes
copying in turn never write a line twice.

Images and mounts are checked against the policy before a call gets here; this module only runs
what it is given.
"""

from __future__ import annotations

import calendar
import math
import os
import re
import shlex
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.local_executor import _SECRET_RE, _read_tail
from nightshift.runtime.executors.run_state import RunStateFiles

try:
    import docker
    import docker.errors
    import docker.types
    import requests
except ImportError:  # the docker extra is optional; render() works without it
    docker = None  # type: ignore[assignment]

GIB = 1024**3
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
KEY_LABEL = "nightshift.key"
LOG_LABEL = "nightshift.log_path"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_TS_RE = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
# Docker stamps stdout and stderr lines in two goroutines, so neighbouring lines may be out of
# order by microseconds; the copy keeps the timestamps of this much of the newest output.
_WINDOW_NS = 2 * 10**9
_FOLLOW_INTERVAL_S = 0.5
_SIGNAL_EXITS = {143: 15, 137: 9}  # 128 + SIGTERM, 128 + SIGKILL


class DockerHandle(BaseModel):
    """What a Docker run's handle holds; stored as JSON with the attempt."""

    kind: Literal["docker"] = "docker"
    key: str
    container_id: str
    name: str
    image: str
    log_path: str


class _CopyState(BaseModel):
    """How far the container's output has been copied into the log file."""

    cut_ns: int = 0  # every line stamped before this was copied; Docker is asked from here on
    recent: list[int] = []  # stamps of the lines copied at or after cut_ns
    stopped_grace_s: float | None = None  # set by `stop`, so later polls can say who ended it


def container_name(key: str) -> str:
    """A valid Docker container name for a run key; distinct keys give distinct names."""
    clean = _NAME_BAD.sub("-", key)[:100]
    if clean != key:
        clean += "-" + sha256(key.encode()).hexdigest()[:10]
    return f"nightshift-{clean}"


def _ts_ns(raw: bytes) -> int | None:
    """Nanoseconds since the epoch of a Docker log timestamp (RFC 3339 with nanoseconds)."""
    m = _TS_RE.match(raw)
    if m is None:
        return None
    base = calendar.timegm(time.strptime(m.group(1).decode(), "%Y-%m-%dT%H:%M:%S"))
    frac = int((m.group(2) or b"0").ljust(9, b"0"))
    zone = m.group(3)
    offset = (
        0
        if zone == b"Z"
        else (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * (1 if zone[:1] == b"+" else -1)
    )
    return (base - offset) * 10**9 + frac


def _size(gb: float) -> str:
    """A size for the `docker run` line: whole GiB or MiB when exact, else bytes."""
    if float(gb).is_integer():
        return f"{int(gb)}g"
    mib = gb * 1024
    return f"{int(mib)}m" if float(mib).is_integer() else str(int(gb * GIB))


class DockerExecutor:
    """Runs each launch request as a container on one Docker engine."""

    kind = "docker"

    def __init__(
        self,
        runs_dir: Path | str,
        base_url: str | None = None,
        network_mode: str = "none",
        stop_grace_s: float = 10.0,
        pids_limit: int | None = None,
        init: bool = True,
        follow_logs: bool = True,
    ) -> None:
        """`base_url` is the engine's socket (`unix:///path/docker.sock`); None: `$DOCKER_HOST`,
        else the default socket. `network_mode` is used when a request names none. `init` runs
        Docker's init as PID 1, so the run gets stop signals and its zombies are reaped."""
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        self.state_dir = self.runs_dir / "docker"
        self._states = RunStateFiles(self.state_dir, _CopyState)
        self.base_url = base_url
        self.network_mode = network_mode
        self.stop_grace_s = stop_grace_s
        self.pids_limit = pids_limit
        self.init = init
        self.follow_logs = follow_logs
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._followers: dict[str, threading.Thread] = {}
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        """The engine address this executor talks to."""
        return self.base_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST

    # ---------------------------------------------------------------------------------- start
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Create and start the container, or return the handle of the one this key already has
        (starting it if an earlier start died between create and start)."""
        handle = self.create(req)
        h = DockerHandle.model_validate(handle)
        with self._errors(f"inspecting container {h.name}"):
            container = self._get(h.container_id)
            if container is not None and container.status == "created":
                self._start_created(container, req)
        if self.follow_logs:
            self._follow(h)
        return handle

    def create(self, req: LaunchRequest) -> dict[str, Any]:
        """Create the container without starting it (idempotent on the key): what `start` runs
        first, and a way to inspect what Docker would run."""
        self._validate(req)
        existing = self.find(req.key)
        if existing is not None:
            return existing
        kwargs = self._create_kwargs(req)
        log_path = Path(kwargs["labels"][LOG_LABEL])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        client = self._docker()
        with self._errors(f"creating container {kwargs['name']}"):
            try:
                container = client.containers.create(**kwargs)
            except docker.errors.ImageNotFound as exc:
                raise OperatorError(
                    f"image {req.image!r} for run {req.key} is not on the Docker engine at "
                    f"{self.url}: build or load it; images are not pulled (`docker build`, "
                    "`docker load`, or `docker pull` it yourself)"
                ) from exc
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: the name is taken, by a concurrent start
                    raise
                found = self.find(req.key)
                if found is None:
                    raise SkillFailed(
                        f"container name {kwargs['name']} is taken by a container that is not "
                        f"run {req.key}'s; remove it (`docker rm {kwargs['name']}`)"
                    ) from exc
                return found
        return self._handle_of(container)

    def _start_created(self, container: Any, req: LaunchRequest) -> None:
        try:
            container.start()
        except docker.errors.APIError as exc:
            reason = str(exc.explanation or exc)
            container.remove(force=True)  # it never ran; a later start creates it afresh
            if "device driver" in reason or "nvidia" in reason:
                raise OperatorError(
                    f"run {req.key} asks for GPUs {req.gpus}, but the Docker engine at "
                    f"{self.url} cannot give them ({reason}): install the NVIDIA Container "
                    "Toolkit, run `nvidia-ctk runtime configure --runtime=docker` and restart "
                    "dockerd, or run without GPUs"
                ) from exc
            if 'exec: "' in reason and ("not found" in reason or "no such file" in reason):
                raise OperatorError(
                    f"program {req.argv[0]!r} for run {req.key} is not in image {req.image!r} "
                    f"({reason}): fix the command or the image"
                ) from exc
            raise SkillFailed(f"Docker could not start run {req.key}: {reason}") from exc

    def _create_kwargs(self, req: LaunchRequest) -> dict[str, Any]:
        log_path = os.path.abspath(Path(req.log_path).expanduser())
        kwargs: dict[str, Any] = {
            "image": req.image,
            "command": list(req.argv),
            "name": container_name(req.key),
            "labels": {**req.labels, KEY_LABEL: req.key, LOG_LABEL: log_path},
            "environment": self._env(req),
            "working_dir": req.cwd,
            "network_mode": req.network_mode or self.network_mode,
            "init": self.init,
            "mounts": [
                docker.types.Mount(
                    target=m["target"], source=m["source"], type="bind", read_only=m["read_only"]
                )
                for m in self._mounts(req, check_host=True)
            ],
        }
        if req.user:
            kwargs["user"] = req.user
        if req.gpus:
            kwargs["device_requests"] = [
                docker.types.DeviceRequest(
                    driver="nvidia", device_ids=[str(g) for g in req.gpus], capabilities=[["gpu"]]
                )
            ]
        if req.memory_gb is not None:
            kwargs["mem_limit"] = int(req.memory_gb * GIB)
        if req.cpus is not None:
            kwargs["nano_cpus"] = int(req.cpus * 1e9)
        if req.shm_gb is not None:
            kwargs["shm_size"] = int(req.shm_gb * GIB)
        pids = req.pids_limit if req.pids_limit is not None else self.pids_limit
        if pids is not None:
            kwargs["pids_limit"] = pids
        return kwargs

    @staticmethod
    def _env(req: LaunchRequest) -> dict[str, str]:
        return {**req.env, "NIGHTSHIFT_RUN_KEY": req.key}

    @staticmethod
    def _validate(req: LaunchRequest) -> None:
        if not req.image:
            raise OperatorError(
                f"run {req.key} names no image, and the docker executor runs every request in a "
                "container: give the spec an image, or use the local executor"
            )
        if not req.cwd.startswith("/"):
            raise OperatorError(
                f"working directory {req.cwd!r} for run {req.key} must be an absolute path inside "
                "the container (e.g. /workspace)"
            )
        for name, value in (("memory_gb", req.memory_gb), ("shm_gb", req.shm_gb)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise OperatorError(f"{name} for run {req.key} must be a positive number of GiB")

    @staticmethod
    def _mounts(req: LaunchRequest, check_host: bool) -> list[dict[str, Any]]:
        """The request's mounts as {source, target, read_only}; read-only unless it says not."""
        out = []
        for i, m in enumerate(req.mounts):
            source = next((m[k] for k in ("source", "src", "host_path") if m.get(k)), None)
            target = next((m[k] for k in ("target", "dst", "container_path") if m.get(k)), None)
            if not isinstance(source, str) or not isinstance(target, str):
                raise OperatorError(
                    f"mounts[{i}] of run {req.key} needs a host `source` and a container "
                    f"`target` path, got {m!r}"
                )
            if not target.startswith("/"):
                raise OperatorError(
                    f"mounts[{i}] of run {req.key}: target {target!r} must be an absolute path "
                    "inside the container"
                )
            mode = m.get("mode")
            read_only = m.get("read_only", mode != "rw" if mode else True)
            if not isinstance(read_only, bool):
                raise OperatorError(
                    f"mounts[{i}] of run {req.key}: read_only must be true or "
                    f"false, got {read_only!r}"
                )
            host = Path(source).expanduser()
            if check_host:
                host = host.resolve()
                if not host.exists():
                    raise OperatorError(
                        f"mounts[{i}] of run {req.key}: host path {str(host)!r} does not exist; "
                        "create it or fix the mount's source"
                    )
            out.append({"source": str(host), "target": target, "read_only": read_only})
        return out

    # ------------------------------------------------------------------------------ look up
    def find(self, key: str) -> dict[str, Any] | None:
        """The handle of the container labelled with this key, or None if there is none."""
        client = self._docker()
        with self._errors(f"looking up run {key}"):
            found = client.containers.list(all=True, filters={"label": f"{KEY_LABEL}={key}"})
        found = [c for c in found if c.labels.get(KEY_LABEL) == key]
        if not found:
            return None
        found.sort(key=lambda c: c.name != container_name(key))  # its own name first
        return self._handle_of(found[0])

    def poll(self, handle: dict[str, Any]) -> RunStatus:
        """running while the container runs; exited with Docker's exit code once it ended; lost
        when the container is gone or was created but never started."""
        h = self._handle(handle)
        with self._errors(f"inspecting container {h.name}"):
            container = self._get(h.container_id)
            if container is None:
                return RunStatus(
                    state="lost",
                    detail=(
                        f"container {h.name} is gone (removed with `docker rm`, or the engine lost "
                        "it); its exit code and the output not yet copied are lost"
                    ),
                )
            self._copy_logs(h)
        return self._status(h, container.attrs["State"])

    def _status(self, h: DockerHandle, state: dict[str, Any]) -> RunStatus:
        status = state.get("Status")
        if status in ("running", "paused", "restarting"):
            if self.follow_logs:
                self._follow(h)
            return RunStatus(state="running", detail=None if status == "running" else status)
        if status == "created":
            return RunStatus(
                state="lost",
                detail=(
                    f"container {h.name} was created but never started"
                    + (f" ({state['Error']})" if state.get("Error") else "")
                ),
            )
        code = state.get("ExitCode")
        if state.get("OOMKilled"):
            return RunStatus(
                state="exited",
                exit_code=code,
                detail=(
                    "out of memory: the kernel's OOM killer ended the container at its memory limit "
                    "(raise memory_gb, or lower the batch size)"
                ),
            )
        stopped = self._read_state(h).stopped_grace_s
        if stopped is not None and code in _SIGNAL_EXITS:
            how = "SIGTERM" if code == 143 else f"SIGKILL after SIGTERM and {stopped:g} s of grace"
            return RunStatus(
                state="exited",
                exit_code=code,
                signal=_SIGNAL_EXITS[code],
                detail=f"stopped by nightshift ({how})",
            )
        detail = state.get("Error") or None
        if code == 127 and detail is None:
            detail = "command not found in the image (exit code 127); see the log"
        return RunStatus(state="exited", exit_code=code, detail=detail)

    # ---------------------------------------------------------------------------------- stop
    def stop(self, handle: dict[str, Any], grace_s: float | None = None) -> RunStatus:
        """Stop the container: its stop signal (SIGTERM), then SIGKILL after `grace_s` (the
        executor's stop_grace_s when None); safe when it already ended or is gone."""
        h = self._handle(handle)
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._errors(f"stopping container {h.name}"):
            container = self._get(h.container_id)
            if container is not None and container.status in ("running", "paused", "restarting"):
                self._update_state(h, stopped_grace_s=grace)
                container.stop(timeout=max(0, math.ceil(grace)))
        return self.poll(handle)

    def cleanup(self, handle: dict[str, Any], grace_s: float | None = None) -> list[int]:
        """Stop and remove the run's container if it still exists (its output copied first), so
        a relaunch never runs beside it; [] or the container's main pid when it was running."""
        h = self._handle(handle)
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._errors(f"cleaning up container {h.name}"):
            container = self._get(h.container_id)
            if container is None:
                return []
            pid = int(container.attrs.get("State", {}).get("Pid") or 0)
            if container.status in ("running", "paused", "restarting"):
                self._update_state(h, stopped_grace_s=grace)
                container.stop(timeout=max(0, math.ceil(grace)))
            else:
                pid = 0
            self._copy_logs(h)
            container.remove(force=True)
        return [pid] if pid else []

    # ---------------------------------------------------------------------------------- logs
    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        """The last `tail` lines of the run's log file, after copying what is new."""
        h = self._handle(handle)
        with self._errors(f"reading the output of container {h.name}"):
            if self._get(h.container_id) is not None:
                self._copy_logs(h)
        return _read_tail(Path(h.log_path), tail)

    def render(self, req: LaunchRequest) -> str:
        """The equivalent `docker run` line, for a dry run; for display only, never executed."""
        self._validate(req)
        args = ["docker"] + (["-H", self.base_url] if self.base_url else [])
        args += [
            "run",
            "--detach",
            "--name",
            container_name(req.key),
            "--label",
            f"{KEY_LABEL}={req.key}",
        ]
        args += [
            a for k, v in req.labels.items() if k != KEY_LABEL for a in ("--label", f"{k}={v}")
        ]
        if self.init:
            args.append("--init")
        args += ["--network", req.network_mode or self.network_mode]
        if req.gpus:
            args += ["--gpus", '"device=' + ",".join(str(g) for g in req.gpus) + '"']
        if req.memory_gb is not None:
            args += ["--memory", _size(req.memory_gb)]
        if req.cpus is not None:
            args += ["--cpus", f"{req.cpus:g}"]
        if req.shm_gb is not None:
            args += ["--shm-size", _size(req.shm_gb)]
        pids = req.pids_limit if req.pids_limit is not None else self.pids_limit
        if pids is not None:
            args += ["--pids-limit", str(pids)]
        if req.user:
            args += ["--user", req.user]
        args += ["--workdir", req.cwd]
        for m in self._mounts(req, check_host=False):
            args += [
                "--mount",
                f"type=bind,source={m['source']},target={m['target']}"
                + (",readonly" if m["read_only"] else ""),
            ]
        shown = []
        for k, v in req.env.items():
            shown += ["-e", f"{k}=***" if _SECRET_RE.search(k) else f"{k}={v}"]
        shown += ["-e", f"NIGHTSHIFT_RUN_KEY={req.key}"]
        args += shown + [req.image or "", *req.argv]
        return f"[docker {req.key}] {shlex.join(args)}  (output copied to {req.log_path})"

    # ------------------------------------------------------------------------ copying output
    def _copy_logs(self, h: DockerHandle) -> None:
        """Append the container's output that no process has copied yet to the log file."""
        with self._states.locked(h.name):
            state = self._read_state(h)
            since = state.cut_ns // 10**9
            stream = self._docker().api.logs(
                h.container_id,
                stdout=True,
                stderr=True,
                timestamps=True,
                stream=True,
                follow=False,
                since=since if since > 0 else None,
            )
            seen = Counter(state.recent)
            copied = list(state.recent)
            out = bytearray()
            try:
                for frame in stream:  # one frame per log message: "<timestamp> <text>"
                    raw_ts, _, text = frame.partition(b" ")
                    ts = _ts_ns(raw_ts)
                    if ts is None:  # not stamped (never seen); keep the text rather than lose it
                        out += frame
                        continue
                    if ts < state.cut_ns:
                        continue
                    if seen[ts] > 0:
                        seen[ts] -= 1
                        continue
                    out += text
                    copied.append(ts)
            finally:
                stream.close()
            if not out:
                return
            Path(h.log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(h.log_path, "ab") as f:
                f.write(out)
                f.flush()
            newest = max(copied)
            cut = (newest - _WINDOW_NS) // 10**9 * 10**9
            state.cut_ns = max(state.cut_ns, cut)
            state.recent = sorted(t for t in copied if t >= state.cut_ns)
            self._write_state(h, state)

    def _follow(self, h: DockerHandle) -> None:
        """Copy the output every half second from a background thread until the run ends."""
        thread = self._followers.get(h.container_id)
        if self._closed.is_set() or (thread is not None and thread.is_alive()):
            return
        thread = threading.Thread(
            target=self._follow_loop, args=(h,), daemon=True, name=f"nightshift-docker-logs-{h.key}"
        )
        self._followers[h.container_id] = thread
        thread.start()

    def _follow_loop(self, h: DockerHandle) -> None:
        while not self._closed.is_set():
            try:
                container = self._get(h.container_id)
                if container is None:
                    return
                self._copy_logs(h)
                if container.status not in ("running", "paused", "restarting"):
                    return
            except Exception:  # noqa: BLE001 - the engine went away; poll() will report it
                return
            self._closed.wait(_FOLLOW_INTERVAL_S)

    def close(self) -> None:
        """Stop this executor's background copying and close its connection (the runs go on)."""
        self._closed.set()
        for thread in list(self._followers.values()):
            thread.join(timeout=5)
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _read_state(self, h: DockerHandle) -> _CopyState:
        return self._states.read(h.name, _CopyState)

    def _write_state(self, h: DockerHandle, state: _CopyState) -> None:
        self._states.write(h.name, state)

    def _update_state(self, h: DockerHandle, **changes: Any) -> None:
        self._states.update(h.name, lambda: self._read_state(h), **changes)

    # ------------------------------------------------------------------------------ helpers
    def _docker(self) -> Any:
        """The SDK client, connected on first use."""
        with self._client_lock:
            if self._client is not None:
                return self._client
            if docker is None:
                raise OperatorError(
                    "the docker executor needs the Docker SDK for Python: "
                    "`pip install 'nightshift[docker]'`"
                )
            sock = self.url.removeprefix("unix://")
            if self.url.startswith("unix://") and not os.path.exists(sock):
                raise self._unreachable(FileNotFoundError(f"no socket at {sock}"))
            try:
                self._client = docker.DockerClient(base_url=self.url, version="auto")
            except docker.errors.DockerException as exc:
                raise self._unreachable(exc) from exc
            return self._client

    def _unreachable(self, exc: Exception) -> OperatorError:
        return OperatorError(
            f"cannot reach the Docker engine at {self.url} ({exc}): start dockerd (e.g. "
            "`systemctl start docker`), make sure this user may use its socket (root or the "
            "docker group), or point the executor at the right socket"
        )

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Engine down → OperatorError naming the socket; any other API error → SkillFailed."""
        self._docker()  # raises OperatorError when the SDK is missing or the engine is down
        try:
            yield
        except (requests.exceptions.ConnectionError, ConnectionError) as exc:
            raise self._unreachable(exc) from exc
        except docker.errors.APIError as exc:
            raise SkillFailed(f"Docker failed {what}: {exc.explanation or exc}") from exc

    def _get(self, container_id: str) -> Any:
        """The container, or None when Docker no longer has it."""
        try:
            return self._docker().containers.get(container_id)
        except docker.errors.NotFound:
            return None

    @staticmethod
    def _handle_of(container: Any) -> dict[str, Any]:
        labels = container.labels
        image = container.attrs.get("Config", {}).get("Image") or ""
        return DockerHandle(
            key=labels[KEY_LABEL],
            container_id=container.id,
            name=container.name,
            image=image,
            log_path=labels[LOG_LABEL],
        ).model_dump()

    @staticmethod
    def _handle(handle: dict[str, Any]) -> DockerHandle:
        kind = handle.get("kind") if isinstance(handle, dict) else None
        if kind != "docker":
            raise OperatorError(
                f"handle is for the {kind!r} executor, not 'docker'; the attempt was started by "
                "another executor: configure that one to manage it"
            )
        try:
            return DockerHandle.model_validate(handle)
        except ValidationError as exc:
            raise OperatorError(f"docker run handle is invalid: {exc.errors()[0]['msg']}") from exc
