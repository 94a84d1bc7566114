"""Runs each launch request as a job of an existing Ray cluster, through its Jobs API
(`ray.job_submission.JobSubmissionClient`; `pip install 'nightshift[ray]'`).

The cluster is the record. A job's submission id comes from the request key (and this executor's
runs folder, so two nightshift homes on one cluster never share an id), and Ray refuses a second
job with an id it already has, so `start` is idempotent across processes: a second start finds
the first job. Its metadata (`nightshift.key`, `nightshift.log_path`) lets any later process, a
restarted daemon included, re-attach by key and learn where its log goes; Ray keeps the status
and the driver's exit code of an ended job for as long as the head runs.

The entrypoint is a shell command (Ray runs it with `/bin/sh -c` on the node it picks), built
only from `shlex.quote`d words: `cd -- <cwd> && exec <argv...>`. The program replaces the shell
(`exec`), so Ray's stop signal reaches it and the exit code Ray reports is the program's own
(negative for a signal). A shared filesystem is assumed: the working directory, the program and
the job's folder are at the same paths on every node; nothing is uploaded.

A run placed across hosts (a gang: `LaunchRequest.ranks`) is one Ray job per host, each pinned
to its node with that host's GPUs: rank 0 under the run's own submission id (its metadata names
the others), rank r under that id + `-rank<r>`. Each gets the rendezvous in its environment —
MASTER_ADDR (rank 0's node), MASTER_PORT (from the key), WORLD_SIZE (hosts) and RANK = NODE_RANK,
and torchrun's own variables (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT,
PET_NPROC_PER_NODE), so `torchrun train.py` runs unchanged as one worker per host. The gang is
running while every rank is; the first rank to fail ends it (the loop's cleanup stops the rest);
it succeeds when every rank has; stop and cleanup stop every rank. Rank 0's output is the run's
log; rank r's goes beside it (`<log>.rank<r>`).

The run's log file is the same as for a local run: Ray's job log (the driver's stdout and
stderr, after a line or two of Ray's own), copied incrementally on `poll`, `logs`, `stop` and
`cleanup`. How much of it was copied is kept beside the handles under `<runs_dir>/ray/`, so any
number of processes copying in turn never write a line twice. Ray serves a job's log only whole,
so while a run is going a poll copies at most every `_COPY_EVERY_S` seconds, and less often as
the log grows (one second per MiB, up to `_COPY_EVERY_MAX_S`); an ended run's log is copied in
full at once.

How a Ray job maps onto a run's status (the local executor's outcomes):

    PENDING, RUNNING             running
    SUCCEEDED                    exited, exit code 0
    FAILED, driver exit code N   exited with code N; a negative N (a signal) as signal -N
    FAILED, never started        exited without an exit code; the detail says why (runtime env,
                                 no node with the resources in time, the command not startable)
    FAILED, supervisor died      lost (its node went away: how the run ended was not seen)
    STOPPED                      exited with SIGTERM (Ray's stop signal, SIGKILL after the grace);
                                 the detail says whether nightshift stopped it
    unknown to the cluster       lost (the head restarted without its state, or it was deleted)
    head unreachable             OperatorError naming the address (the run is not given up)
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import re
import shlex
import signal
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from hashlib import sha256
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.local_executor import _SECRET_RE, ATTEMPT_KEY_ENV, _read_tail
from nightshift.runtime.executors.run_state import RunStateFiles
from nightshift.runtime.gpu.ray_census import HOST_PREFIX

try:
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobStatus, JobSubmissionClient
except ImportError:  # the ray extra is optional; render() works without it
    JobSubmissionClient = None  # type: ignore[assignment,misc]
    JobStatus = None  # type: ignore[assignment,misc]
    AuthenticationError = None  # type: ignore[assignment,misc]

GIB = 1024**3
KEY_META = "nightshift.key"
CENSUS_PREFIX = "nightshift-census-"
LOG_META = "nightshift.log_path"
WAIT_META = "nightshift.stop_wait_s"
RANKS_META = "nightshift.ranks"  # rank 0's metadata: the submission ids of ranks 1…n-1
RENDEZVOUS_PORTS = (29500, 500)  # MASTER_PORT: 29500 + a number from the key below 500
_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")
_EXIT_SAID = re.compile(r"^Job entrypoint command failed with exit code (-?\d+)")
_REQUEST_TIMEOUT_S = 30.0
_STOP_POLL_S = 0.2
_STOP_MARGIN_S = 10.0  # past Ray's own SIGKILL, for the supervisor to record the end
_COPY_EVERY_S = 0.5
_COPY_EVERY_MAX_S = 30.0
_COPY_BYTES_PER_S = 1024**2
# Why a job that Ray never started (no driver exit code) failed, by Ray's error type.
_START_ERRORS = {
    "RUNTIME_ENV_SETUP_FAILURE": "the job's runtime environment could not be set up",
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": "no node could start the job in time (are the "
    "resources it asks for, CPUs, GPUs or memory, free anywhere in the cluster?)",
    "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE": "no node of the cluster has the resources it asks for",
    "JOB_SUPERVISOR_ACTOR_START_FAILURE": "Ray could not start the job's supervisor",
    "JOB_ENTRYPOINT_COMMAND_START_ERROR": "Ray could not start the command",
    "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE": "the job's supervisor failed",
}
_T = TypeVar("_T")


class RayHandle(BaseModel):
    """What a Ray run's handle holds; stored as JSON with the attempt."""

    kind: Literal["ray"] = "ray"
    key: str
    submission_id: str
    log_path: str
    stop_wait_s: int | None = None  # Ray's SIGTERM-to-SIGKILL wait for this job, set at submit
    ranks: list[str] = []  # a gang's other ranks' submission ids, rank 1 first


class _CopyState(BaseModel):
    """How far the job's log has been copied, and whether nightshift stopped the job."""

    copied: int = 0  # characters of Ray's job log already appended to the log file
    stopped: str | None = None  # "stopped" or "stopped by cleanup", set when nightshift stops it


if JobSubmissionClient is not None:

    class _Client(JobSubmissionClient):  # type: ignore[misc,valid-type]
        """The SDK's client, with a timeout on every request, always at the configured address:
        the SDK takes $RAY_API_SERVER_ADDRESS or $RAY_ADDRESS over the one it is given (only its
        constructor still looks them up)."""

        def __init__(self, address: str, timeout_s: float) -> None:
            self._ns_address, self._ns_timeout_s = address, timeout_s
            super().__init__(address)

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            self._address = self._ns_address
            kwargs.setdefault("timeout", self._ns_timeout_s)
            return super()._do_request(method, endpoint, **kwargs)


def _address(address: str) -> str:
    """The dashboard URL: http:// unless a scheme is given, without a trailing slash."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def _missing(exc: Exception) -> bool:
    """Whether the Jobs API said the job does not exist (404)."""
    return "status code 404" in str(exc)


def _reason(text: str | None) -> str:
    """One line of an error text: the first, or the last of a traceback (the exception)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip().strip(".")]
    if not lines:
        return ""
    return (lines[-1] if "Traceback (most recent call last)" in (text or "") else lines[0])[:500]


class RayExecutor:
    """Runs each launch request as a job on one Ray cluster, through its Jobs API."""

    kind = "ray"

    def __init__(
        self,
        runs_dir: Path | str,
        address: str = "http://127.0.0.1:8265",
        stop_grace_s: float = 10.0,
        num_cpus: float = 1.0,
        timeout_s: float = _REQUEST_TIMEOUT_S,
    ) -> None:
        """`address` is the Ray dashboard's (the Jobs API), e.g. `http://head:8265`.
        `stop_grace_s` becomes each job's SIGTERM-to-SIGKILL wait when it is submitted.
        `num_cpus` is reserved for every run's command (0: none; a run that reserves nothing
        runs on the head node, where Ray puts such jobs). `timeout_s` bounds each request."""
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        self.state_dir = self.runs_dir / "ray"
        self._states = RunStateFiles(self.state_dir, _CopyState)
        self.address = _address(address)
        self.stop_grace_s = stop_grace_s
        self.num_cpus = num_cpus
        self.timeout_s = timeout_s
        self._jobs: Any = None
        self._client_lock = threading.Lock()
        self._copied_at: dict[str, tuple[float, int]] = {}  # this process's last copy, its size

    def submission_id(self, key: str) -> str:
        """The Ray submission id of a run key: readable, and distinct for each key and home."""
        digest = sha256(f"{self.runs_dir}\0{key}".encode()).hexdigest()[:10]
        return f"nightshift-{_ID_BAD.sub('-', key)[:100]}-{digest}"

    # ---------------------------------------------------------------------------------- start
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Submit the job, or return the handle of the one this key already has."""
        self._validate(req)
        existing = self.find(req.key)
        if existing is not None and len(req.ranks) < 2:
            return existing
        jobs = self._rank_kwargs(req)
        # Rank 0 first: its metadata names the others, so `find` sees them all. A gang's ranks
        # are all submitted again after a start that stopped part-way (Ray refuses a second job
        # with an id it has, so a rank already there is not started twice).
        for kwargs in jobs:
            log_path = Path(kwargs["metadata"][LOG_META])
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.touch()
            self._submit(req.key, kwargs)
        return RayHandle(
            key=req.key,
            submission_id=jobs[0]["submission_id"],
            log_path=jobs[0]["metadata"][LOG_META],
            stop_wait_s=int(jobs[0]["metadata"][WAIT_META]),
            ranks=[k["submission_id"] for k in jobs[1:]],
        ).model_dump()

    def _submit(self, key: str, kwargs: dict[str, Any]) -> None:
        """Submit one Ray job; one that already has this id (a concurrent or earlier start of
        the same run) is the same job."""
        sid = kwargs["submission_id"]
        try:
            self._request(f"submitting run {key}", lambda c: c.submit_job(**kwargs))
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise SkillFailed(
                    f"the Ray cluster at {self.address} refused run {key}: {_reason(str(exc))}"
                ) from exc
            info = self._info(sid, f"looking up run {key}")
            if info is None or (info.metadata or {}).get(KEY_META) != key:
                raise SkillFailed(f"Ray job {sid} exists but is not run {key}'s") from exc

    def _rank_kwargs(self, req: LaunchRequest) -> list[dict[str, Any]]:
        """The Ray job of each rank: one for a run on one host; for a gang, one per host, pinned
        to it with its GPUs and the rendezvous in its environment."""
        if len(req.ranks) < 2:
            return [self._submit_kwargs(req)]
        sid = self.submission_id(req.key)
        log = os.path.abspath(Path(req.log_path).expanduser())
        master = _node_ip(req.ranks[0].host)
        digest = int(sha256(req.key.encode()).hexdigest()[:8], 16)
        port = RENDEZVOUS_PORTS[0] + digest % RENDEZVOUS_PORTS[1]
        ids = [sid] + [f"{sid}-rank{r}" for r in range(1, len(req.ranks))]
        out = []
        for r, rank in enumerate(req.ranks):
            one = self._submit_kwargs(req.model_copy(update={"host": rank.host, "gpus": rank.gpus}))
            n = str(len(req.ranks))
            rendezvous = {
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
                "WORLD_SIZE": n,
                "RANK": str(r),
                "NODE_RANK": str(r),
                "PET_NNODES": n,
                "PET_NODE_RANK": str(r),
                "PET_MASTER_ADDR": master,
                "PET_MASTER_PORT": str(port),
                "PET_NPROC_PER_NODE": str(len(rank.gpus)),
            }
            one["submission_id"] = ids[r]
            one["runtime_env"]["env_vars"].update(rendezvous)
            one["metadata"][LOG_META] = log if r == 0 else f"{log}.rank{r}"
            if r == 0:
                one["metadata"][RANKS_META] = json.dumps(ids[1:])
            else:
                one["metadata"]["nightshift.rank"] = str(r)
            out.append(one)
        return out

    def entrypoint(self, req: LaunchRequest) -> str:
        """The shell command Ray runs: into the working directory, then the program in the
        shell's place. Every word is quoted; nothing of the request is read by the shell."""
        cwd = os.path.abspath(Path(req.cwd).expanduser())
        return f"cd -- {shlex.quote(cwd)} && exec {shlex.join(req.argv)}"

    def _submit_kwargs(self, req: LaunchRequest) -> dict[str, Any]:
        wait = self._stop_wait_s()
        kwargs: dict[str, Any] = {
            "entrypoint": self.entrypoint(req),
            "submission_id": self.submission_id(req.key),
            "runtime_env": {"env_vars": self._env(req, wait)},
            "metadata": {
                **req.labels,
                KEY_META: req.key,
                LOG_META: os.path.abspath(Path(req.log_path).expanduser()),
                WAIT_META: str(wait),
            },
        }
        if self.num_cpus > 0:
            kwargs["entrypoint_num_cpus"] = self.num_cpus
        if req.gpus:
            kwargs["entrypoint_num_gpus"] = len(req.gpus)
        if req.memory_gb is not None:
            kwargs["entrypoint_memory"] = int(req.memory_gb * GIB)
        if req.host:
            # Pinned to the node placement chose from the census: Ray gives every node a
            # resource named after its address, of which this takes a sliver.
            kwargs["entrypoint_resources"] = {f"node:{_node_ip(req.host)}": 0.001}
        return kwargs

    def _stop_wait_s(self) -> int:
        return max(1, math.ceil(self.stop_grace_s))

    @staticmethod
    def _env(req: LaunchRequest, stop_wait_s: int) -> dict[str, str]:
        env = {
            **req.env,
            "NIGHTSHIFT_RUN_KEY": req.key,
            ATTEMPT_KEY_ENV: req.key,
            # Read by the job's Ray supervisor: how long SIGTERM has before SIGKILL on a stop.
            "RAY_JOB_STOP_WAIT_TIME_S": str(stop_wait_s),
        }
        if req.gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray sets it to the GPUs it gives the job
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a run without GPUs sees none, as a local one
        return env

    @staticmethod
    def _validate(req: LaunchRequest) -> None:
        if req.image:
            raise OperatorError(
                f"run {req.key} asks for image {req.image!r}, but the ray executor runs the "
                "command on the cluster's nodes as they are; use the docker or kubernetes "
                "executor, or remove the image from the spec"
            )
        if req.user or req.run_as is not None:
            who = req.user or (req.run_as.name if req.run_as is not None else "")
            raise OperatorError(
                f"run {req.key} asks to run as user {who!r}, but a Ray job runs as the user of "
                "the Ray cluster; remove the user from the spec, use another executor, or set "
                "executor.run_as: daemon if every submitter may act as the cluster's user"
            )
        if req.argv[0].startswith("-"):
            raise OperatorError(
                f"program {req.argv[0]!r} of run {req.key} starts with '-'; give its path "
                "(e.g. ./name)"
            )
        if req.memory_gb is not None and not (req.memory_gb > 0 and math.isfinite(req.memory_gb)):
            raise OperatorError(f"memory_gb for run {req.key} must be a positive number of GiB")

    # ------------------------------------------------------------------------------ look up
    def find(self, key: str) -> dict[str, Any] | None:
        """The handle of the cluster's job for this key, or None if the cluster has none."""
        sid = self.submission_id(key)
        info = self._info(sid, f"looking up run {key}")
        if info is None:
            return None
        meta = info.metadata or {}
        if meta.get(KEY_META) != key or not meta.get(LOG_META):
            raise SkillFailed(
                f"Ray job {sid} on {self.address} is not run {key}'s (its metadata names "
                f"{meta.get(KEY_META)!r}); stop and delete it (`ray job delete {sid}`)"
            )
        wait = meta.get(WAIT_META)
        try:
            ranks = [str(r) for r in json.loads(meta.get(RANKS_META) or "[]")]
        except ValueError:
            ranks = []
        return RayHandle(
            key=key,
            submission_id=sid,
            log_path=meta[LOG_META],
            stop_wait_s=int(wait) if wait and wait.isdigit() else None,
            ranks=ranks,
        ).model_dump()

    def poll(self, handle: dict[str, Any]) -> RunStatus:
        """running while Ray has the job pending or running; exited once it ended (see the
        module's table); lost when the cluster no longer knows it."""
        h = self._handle(handle)
        members = _members(h)
        if len(members) == 1:
            return self._poll_one(h)
        seen = [self._poll_one(m) for m in members]
        for r, st in enumerate(seen):  # the first rank that ended otherwise than well ends it
            if st.state != "running" and not (st.state == "exited" and st.exit_code == 0):
                where = f"rank {r} of {len(seen)} (Ray job {members[r].submission_id})"
                return st.model_copy(update={"detail": f"{where}: {st.detail or 'ended'}"})
        if all(st.state == "exited" for st in seen):
            return RunStatus(state="exited", exit_code=0)
        return RunStatus(
            state="running", detail=next((st.detail for st in seen if st.detail), None)
        )

    def _poll_one(self, h: RayHandle) -> RunStatus:
        info = self._info(h.submission_id, f"polling run {h.key}")
        if info is None:
            return self._gone(h)
        try:
            self._copy_logs(h, force=info.status.is_terminal())
        except SkillFailed:  # the output waits for a later copy; the status matters more
            pass
        return self._status(h, info)

    def _gone(self, h: RayHandle) -> RunStatus:
        return RunStatus(
            state="lost",
            detail=(
                f"Ray job {h.submission_id} is gone from the cluster at {self.address} (the "
                "head restarted without its state, or the job was deleted); its exit status "
                "and the output not yet copied are lost"
            ),
        )

    def _status(self, h: RayHandle, info: Any) -> RunStatus:
        status = info.status
        if status == JobStatus.PENDING:
            return RunStatus(state="running", detail=f"pending on Ray: {_reason(info.message)}")
        if status == JobStatus.RUNNING:
            return RunStatus(state="running")
        if status == JobStatus.SUCCEEDED:
            return RunStatus(state="exited", exit_code=0)
        if status == JobStatus.STOPPED:
            how = self._read_state(h).stopped
            wait = f", SIGKILL after {h.stop_wait_s} s" if h.stop_wait_s else ", then SIGKILL"
            who = (
                f"{how} by nightshift through the Ray Jobs API"
                if how
                else "stopped through the Ray Jobs API, not by nightshift (`ray job stop`, the "
                "dashboard, or another client)"
            )
            return RunStatus(
                state="exited",
                exit_code=None,
                signal=int(signal.SIGTERM),
                detail=f"{who} (SIGTERM{wait})",
            )
        code = getattr(info, "driver_exit_code", None)  # Ray before 2.10 only says it in words
        said = _EXIT_SAID.search(info.message or "")
        if code is None and said is not None:
            code = int(said.group(1))
        if code is not None:  # the command ran and ended with this code
            if code < 0:
                return RunStatus(state="exited", exit_code=None, signal=-code)
            detail = None
            if code == 127:
                detail = "command not found on the Ray node (exit code 127); see the log"
            return RunStatus(state="exited", exit_code=code, detail=detail)
        error = str(getattr(info, "error_type", None) or "")
        message = _reason(info.message)
        if error == "JOB_SUPERVISOR_ACTOR_DIED" or message.startswith("Job supervisor actor died"):
            return RunStatus(
                state="lost",
                detail=(
                    f"Ray job {h.submission_id}'s supervisor died (its node went away or it was "
                    f"killed), so how the run ended was not seen: {message}"
                ),
            )
        why = _START_ERRORS.get(error, "Ray gave no exit code")
        return RunStatus(
            state="exited",
            exit_code=None,
            detail=f"could not run on Ray: {why}" + (f" ({message})" if message else ""),
        )

    # ---------------------------------------------------------------------------------- stop
    def stop(self, handle: dict[str, Any], grace_s: float | None = None) -> RunStatus:
        """Stop the job (SIGTERM, SIGKILL after the job's stop wait, which is the executor's
        stop_grace_s when it was submitted) and wait for Ray to record the end, up to the
        longer of `grace_s` and that wait, plus a margin; safe when it already ended or is
        gone."""
        for m in _members(self._handle(handle)):
            self._stop(m, grace_s, "stopped")
        return self.poll(handle)

    def cleanup(self, handle: dict[str, Any], grace_s: float | None = None) -> list[int]:
        """Stop the job if it still runs, so a relaunch never trains beside it, and copy the
        rest of its output. Ray owns the processes: no pids are known here, so always []."""
        for h in _members(self._handle(handle)):
            if not self._stop(h, grace_s, "stopped by cleanup"):
                info = self._info(h.submission_id, f"looking up run {h.key}")
                if info is not None:
                    self._copy_logs(h, force=True)
        return []

    def _stop(self, h: RayHandle, grace_s: float | None, how: str) -> bool:
        """Ask Ray to stop the job and wait for its end; False when it was not running."""
        info = self._info(h.submission_id, f"looking up run {h.key}")
        if info is None or info.status.is_terminal():
            return False
        self._update_state(h, stopped=how)
        try:
            self._request(f"stopping run {h.key}", lambda c: c.stop_job(h.submission_id))
        except RuntimeError as exc:
            if not _missing(exc):
                raise SkillFailed(f"Ray could not stop run {h.key}: {_reason(str(exc))}") from exc
        grace = self.stop_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + max(grace, h.stop_wait_s or 0) + _STOP_MARGIN_S
        while time.monotonic() < deadline:
            info = self._info(h.submission_id, f"stopping run {h.key}")
            if info is None or info.status.is_terminal():
                break
            time.sleep(_STOP_POLL_S)
        return True

    # ---------------------------------------------------------------------------------- logs
    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        """The last `tail` lines of the run's log file, after copying what is new."""
        h = self._handle(handle)
        if self._info(h.submission_id, f"looking up run {h.key}") is not None:
            self._copy_logs(h, force=True)
        return _read_tail(Path(h.log_path), tail)

    def render(self, req: LaunchRequest) -> str:
        """The entrypoint Ray would run and the job's options, for a dry run; for display only,
        never run. Secret-looking variables are masked."""
        self._validate(req)
        return "\n".join(self._render_one(req, kw) for kw in self._rank_kwargs(req))

    def _render_one(self, req: LaunchRequest, kwargs: dict[str, Any]) -> str:
        ours = ("NIGHTSHIFT_RUN_KEY", ATTEMPT_KEY_ENV)
        env = " ".join(
            f"{k}={'***' if _SECRET_RE.search(k) and k not in ours else shlex.quote(v)}"
            for k, v in kwargs["runtime_env"]["env_vars"].items()
        )
        options = [f"submission id {kwargs['submission_id']} at {self.address}"]
        for opt in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory"):
            if opt in kwargs:
                v = kwargs[opt]
                options.append(f"{opt}={v:g}" if isinstance(v, float) else f"{opt}={v}")
        if "entrypoint_resources" in kwargs:
            node = next(iter(kwargs["entrypoint_resources"])).removeprefix("node:")
            options.append(f"on node {node}")
        options += [f"env: {env}", f"metadata: {_json(kwargs['metadata'])}"]
        return (
            f"[ray {req.key}] {kwargs['entrypoint']}  ({'; '.join(options)}; output copied to "
            f"{req.log_path if 'nightshift.rank' not in kwargs['metadata'] else kwargs['metadata'][LOG_META]})"
        )

    # ---------------------------------------------------------------------------- census
    def run_driver(self, argv: list[str], wait_s: float) -> str:
        """Run a short driver program as a Ray job on the head and return its log (the GPU
        census, `runtime/gpu/ray_census.py`); it reserves nothing, is waited for at most `wait_s`,
        and is deleted from the cluster by the next one."""
        self._forget_censuses()
        sid = f"{CENSUS_PREFIX}{uuid.uuid4().hex[:12]}"
        self._request(
            "starting the GPU census",
            lambda c: c.submit_job(
                entrypoint=shlex.join(argv), submission_id=sid, entrypoint_num_cpus=0
            ),
        )
        deadline = time.monotonic() + wait_s
        while True:
            status = self._request("waiting for the GPU census", lambda c: c.get_job_status(sid))
            if status.is_terminal():
                break
            if time.monotonic() > deadline:
                self._request("stopping the GPU census", lambda c: c.stop_job(sid))
                raise SkillFailed(
                    f"the GPU census on the Ray cluster at {self.address} took over {wait_s:.0f} s"
                )
            time.sleep(_STOP_POLL_S)
        log = str(self._request("reading the GPU census", lambda c: c.get_job_logs(sid)))
        if status != "SUCCEEDED":
            info = self._info(sid, "reading the GPU census")
            why = _reason(getattr(info, "message", None)) or _reason(log)
            raise SkillFailed(f"the GPU census on the Ray cluster ended {status}: {why}")
        return log

    def _forget_censuses(self) -> None:
        """Delete the ended census jobs of earlier checks. Not each one as it ends: deleted at
        once, Ray records it again as failed when its supervisor exits a moment later."""
        jobs = self._request("listing the cluster's jobs", lambda c: c.list_jobs())
        for job in jobs:
            sid = job.submission_id or ""
            if sid.startswith(CENSUS_PREFIX) and job.status.is_terminal():
                with contextlib.suppress(RuntimeError):
                    self._request("deleting an old GPU census", partial(_delete, sid))

    # ------------------------------------------------------------------------ copying output
    def _copy_logs(self, h: RayHandle, force: bool) -> None:
        """Append the part of the job's log that no process has copied yet to the log file;
        unless `force`, not sooner than the interval for a log of its size after this process
        last did."""
        now = time.monotonic()
        last = self._copied_at.get(h.submission_id)
        if not force and last is not None:
            every = min(_COPY_EVERY_MAX_S, max(_COPY_EVERY_S, last[1] / _COPY_BYTES_PER_S))
            if now - last[0] < every:
                return
        with self._states.locked(h.submission_id):
            state = self._read_state(h)
            try:
                text = self._request(
                    f"reading the output of run {h.key}",
                    lambda c: c.get_job_logs(h.submission_id),
                )
            except RuntimeError as exc:
                if _missing(exc):
                    return
                raise SkillFailed(
                    f"Ray could not give the output of run {h.key}: {_reason(str(exc))}"
                ) from exc
            self._copied_at[h.submission_id] = (now, len(text))
            new = text[state.copied :]
            if not new:
                return
            Path(h.log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(h.log_path, "ab") as f:
                f.write(new.encode("utf-8", errors="replace"))
                f.flush()
            state.copied = len(text)
            self._write_state(h, state)

    def _read_state(self, h: RayHandle) -> _CopyState:
        return self._states.read(h.submission_id, _CopyState)

    def _write_state(self, h: RayHandle, state: _CopyState) -> None:
        self._states.write(h.submission_id, state)

    def _update_state(self, h: RayHandle, **changes: Any) -> None:
        self._states.update(h.submission_id, lambda: self._read_state(h), **changes)

    # ------------------------------------------------------------------------------ helpers
    def _client(self) -> Any:
        """The SDK client, connected (and the cluster's Ray version checked) on first use."""
        with self._client_lock:
            if self._jobs is not None:
                return self._jobs
            if JobSubmissionClient is None:
                raise OperatorError(
                    "the ray executor needs Ray's job SDK: `pip install 'nightshift[ray]'`"
                )
            try:
                self._jobs = _Client(self.address, self.timeout_s)
            except OSError as exc:  # requests' errors and the SDK's ConnectionError
                raise self._unreachable(exc) from exc
            except (RuntimeError, ValueError) as exc:
                raise OperatorError(
                    f"{self.address} does not answer as a Ray Jobs API "
                    f"({_reason(str(exc))}): set executor.ray_address to the Ray "
                    "dashboard's address (http://<head>:8265)"
                ) from exc
            return self._jobs

    def _unreachable(self, exc: Exception) -> OperatorError:
        return OperatorError(
            f"cannot reach the Ray Jobs API at {self.address} ({_reason(str(exc))}): start "
            "the Ray head (`ray start --head`, with the dashboard), or set executor.ray_address "
            "(NIGHTSHIFT_EXECUTOR__RAY_ADDRESS) to its dashboard's address"
        )

    def _request(self, what: str, call: Callable[[Any], _T]) -> _T:
        """One call of the Jobs API. The head down or not answering → OperatorError naming
        the address; the API's own errors (RuntimeError) are the caller's to read."""
        client = self._client()
        try:
            return call(client)
        except OSError as exc:  # connection refused or reset, timed out
            raise self._unreachable(exc) from exc
        except RuntimeError:
            raise
        except Exception as exc:
            if AuthenticationError is not None and isinstance(exc, AuthenticationError):
                raise OperatorError(
                    f"the Ray Jobs API at {self.address} refused nightshift's credentials "
                    f"while {what}: {_reason(str(exc))}"
                ) from exc
            raise SkillFailed(f"the Ray Jobs API failed {what}: {_reason(str(exc))}") from exc

    def _info(self, sid: str, what: str) -> Any:
        """The job's details, or None when the cluster has no such job."""
        try:
            return self._request(what, lambda c: c.get_job_info(sid))
        except RuntimeError as exc:
            if _missing(exc):
                return None
            raise SkillFailed(f"the Ray Jobs API failed {what}: {_reason(str(exc))}") from exc

    @staticmethod
    def _handle(handle: dict[str, Any]) -> RayHandle:
        kind = handle.get("kind") if isinstance(handle, dict) else None
        if kind != "ray":
            raise OperatorError(
                f"handle is for the {kind!r} executor, not 'ray'; the attempt was started by "
                "another executor: configure that one to manage it"
            )
        try:
            return RayHandle.model_validate(handle)
        except ValidationError as exc:
            raise OperatorError(f"ray run handle is invalid: {exc.errors()[0]['msg']}") from exc


def _members(h: RayHandle) -> list[RayHandle]:
    """A run's Ray jobs, rank 0 (the run's own) first; one for a run on one host."""
    return [h] + [
        RayHandle(
            key=h.key,
            submission_id=sid,
            log_path=f"{h.log_path}.rank{r}",
            stop_wait_s=h.stop_wait_s,
        )
        for r, sid in enumerate(h.ranks, 1)
    ]


def _delete(sid: str, client: Any) -> Any:
    return client.delete_job(sid)


def _node_ip(host: str) -> str:
    """The address of a census host ("ray:10.0.0.5"), checked: it becomes a resource name."""
    ip = host.removeprefix(HOST_PREFIX)
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise OperatorError(
            f"GPU host {host!r} is not a Ray node ('{HOST_PREFIX}<IP>', as the GPU census "
            "records them): run gpu_health_check again with executor.kind: ray"
        ) from None
    return ip


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)
