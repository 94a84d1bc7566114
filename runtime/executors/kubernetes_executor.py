"""Runs each launch request as a Kubernetes `batch/v1` Job, through the official client
(`pip install 'nightshift[kubernetes]'`).

The Job is the record. Its name comes from the request key, so creating it is the lock that makes
`start` idempotent across processes, and its labels (`nightshift.io/key`, the job id and attempt)
let any later process find it again; the full key and the log path ride in annotations, since a
label value holds at most 63 characters. Nightshift owns retries and reads exit codes after its own
restarts, so a Job has `backoffLimit: 0` (one pod, no retry by Kubernetes) and no
`ttlSecondsAfterFinished`: an ended Job stays until `cleanup` deletes it before a relaunch.

What the pod gets: one container `main` running the request's argv (never a shell), `nvidia.com/gpu`
limits for the number of GPUs asked for (Kubernetes picks which), memory requests equal to limits,
a memory-backed /dev/shm, the executor's PersistentVolumeClaims (`executor.kubernetes.mounts`,
mounted at the paths the host sees, so the rendered argv means the same in the pod), a priority
class by the job's priority, and the Kueue queue label when one is configured (Kueue's webhook then
suspends the Job until it is admitted; see https://kueue.sigs.k8s.io/docs/tasks/run/jobs/).

The run's log file is the same as for a local run: the pod's output, copied incrementally on every
`poll`, `logs`, `stop` and `cleanup`. How far the copy got is kept beside the state under
`<runs_dir>/kubernetes/`, as the newest copied timestamp and the timestamps of the last seconds'
lines per pod, so that any number of processes copying in turn never write a line twice. The final
status is kept there too, so a Job deleted after it ended (by `stop`, `cleanup` or a person) still
reports how it ended.

Two numbers are read from the request's labels, which the engine sets: `nightshift.priority` (the
job's priority; default 0) and `nightshift.timeout_s` (the spec's timeout_min, as
`activeDeadlineSeconds`; none when absent).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from nightshift.runtime.config import KubernetesSettings
from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executors.docker_executor import _ts_ns
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.local_executor import _SECRET_RE, _read_tail
from nightshift.runtime.executors.run_state import RunStateFiles

try:
    import kubernetes.client
    import kubernetes.config
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
except ImportError:  # the kubernetes extra is optional; render() works without it
    kubernetes = None  # type: ignore[assignment]

MANAGED_BY = "app.kubernetes.io/managed-by"
KEY_LABEL = "nightshift.io/key"  # the key, or a hash of it when it is no valid label value
KEY_ANNOTATION = "nightshift.io/key"  # the full key
LOG_ANNOTATION = "nightshift.io/log-path"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "nightshift.priority"  # read from LaunchRequest.labels
TIMEOUT_LABEL = "nightshift.timeout_s"  # read from LaunchRequest.labels
CONTAINER = "main"
NAME_PREFIX = "nightshift-"
GIB = 1024**3
MIB = 1024**2
_DNS_LABEL_MAX = 63
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME_RE = re.compile(r"^[\x21-\x3c\x3e-\x7e]+$")  # printable ASCII but '=' and space
# Kubelet stamps lines as it reads them; keep the stamps of this much of the newest output.
_WINDOW_NS = 2 * 10**9
# Ask for this much more than the time since the last copied line: the API server's clock and
# ours may differ; the stamps kept drop what was copied already.
_SKEW_S = 120
_TIMEOUT = (5.0, 60.0)  # connect, read; per API call
_CLEANUP_WAIT_S = 30.0  # after the grace: how long cleanup waits for the pods to go
_SIGNAL_EXITS = {143: signal.SIGTERM, 137: signal.SIGKILL}
_DISRUPTION_REASONS = {
    "Evicted",
    "NodeLost",
    "NodeShutdown",
    "Shutdown",
    "Terminated",
    "Preempting",
}
_RBAC = (
    "grant it a Role in the namespace with: jobs (batch) create, get, list, delete; pods get, "
    "list; pods/log get"
)


class KubernetesHandle(BaseModel):
    """What a Kubernetes run's handle holds; stored as JSON with the attempt."""

    kind: Literal["kubernetes"] = "kubernetes"
    key: str
    namespace: str
    name: str
    uid: str
    log_path: str


class _PodCopy(BaseModel):
    """How far one pod's output has been copied into the log file."""

    cut_ns: int = 0  # every line stamped before this was copied; the API is asked from here on
    recent: list[int] = []  # stamps of the lines copied at or after cut_ns


class _State(BaseModel):
    """What this executor keeps about one Job between processes."""

    uid: str = ""
    pods: dict[str, _PodCopy] = {}
    stopped_grace_s: float | None = None  # set by stop/cleanup while it ran
    final: RunStatus | None = Field(None, description="How it ended, once seen")


def job_name(key: str) -> str:
    """A DNS-1123 label (the Job's name) for a run key; distinct keys give distinct names."""
    clean = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    if clean == key and len(NAME_PREFIX) + len(clean) <= _DNS_LABEL_MAX:
        return NAME_PREFIX + clean
    digest = sha256(key.encode()).hexdigest()[:10]
    room = _DNS_LABEL_MAX - len(NAME_PREFIX) - len(digest) - 1
    clean = clean[:room].rstrip("-")
    return f"{NAME_PREFIX}{clean}-{digest}" if clean else NAME_PREFIX + digest


def key_label(key: str) -> str:
    """The value of the key label: the key itself when it is a valid label value, else a readable
    prefix and a hash (the full key is in the annotation)."""
    if len(key) <= _DNS_LABEL_MAX and _LABEL_VALUE_RE.match(key):
        return key
    digest = sha256(key.encode()).hexdigest()[:16]
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", key)[:40].strip("-_.")
    return f"{clean}-{digest}" if clean else digest


def _quantity(gb: float) -> str:
    """A Kubernetes quantity for a size in GiB: whole Gi or Mi when exact, else bytes."""
    if float(gb).is_integer():
        return f"{int(gb)}Gi"
    mib = gb * 1024
    return f"{int(mib)}Mi" if float(mib).is_integer() else str(max(1, int(gb * GIB)))


def _is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        return False
    return len(name) <= _DNS_LABEL_MAX and bool(_QUALIFIED_NAME_RE.match(name))


def _ours(label: str) -> bool:
    return label.startswith("nightshift.")


def _under(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


class KubernetesExecutor:
    """Runs each launch request as a `batch/v1` Job in one namespace of one cluster."""

    kind = "kubernetes"

    def __init__(
        self,
        runs_dir: Path | str,
        settings: KubernetesSettings | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        """`settings` says where (API server, namespace) and how (PVCs, priority classes, Kueue
        queue, service account, default image); `stop_grace_s` becomes the pod's
        terminationGracePeriodSeconds: SIGTERM, then SIGKILL that long after a stop."""
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        self.state_dir = self.runs_dir / "kubernetes"
        self._states = RunStateFiles(self.state_dir, _State)
        self.settings = settings or KubernetesSettings()
        self.namespace = self.settings.namespace
        self.stop_grace_s = stop_grace_s
        self._apis: tuple[Any, Any] | None = None
        self._host: str | None = self.settings.api_url
        self._client_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The API server this executor talks to, as far as it is known yet."""
        return self._host or "the API server of the kubeconfig's current context"

    # ---------------------------------------------------------------------------------- start
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Create the run's Job, or return the handle of the one this key already has."""
        manifest = self.manifest(req)
        existing = self.find(req.key)
        if existing is not None:
            return existing
        log_path = Path(manifest["metadata"]["annotations"][LOG_ANNOTATION])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        name = manifest["metadata"]["name"]
        batch, _ = self._api()
        with self._errors(f"creating Job {name}"):
            try:
                job = self._json(batch.create_namespaced_job(self.namespace, manifest, **_RAW))
            except ApiException as exc:
                if exc.status == 404:
                    raise OperatorError(
                        f"namespace {self.namespace!r} does not exist on the Kubernetes API server "
                        f"at {self.url} ({_message(exc)}): create it, or set "
                        "executor.kubernetes.namespace"
                    ) from exc
                if exc.status != 409:  # 409: the name is taken, by a concurrent start
                    raise
                found = self._read_job_by_name(name, self.namespace)
                owner = ((found or {}).get("metadata", {}).get("annotations") or {}).get(
                    KEY_ANNOTATION
                )
                if found is None or owner != req.key:
                    raise SkillFailed(
                        f"Job name {name} in namespace {self.namespace} is taken by a Job that is "
                        f"not run {req.key}'s; delete it (`kubectl delete job -n {self.namespace} "
                        f"{name}`)"
                    ) from exc
                job = found
        return self._handle_of(job)

    def manifest(self, req: LaunchRequest) -> dict[str, Any]:
        """The Job this request becomes: what `start` creates and `render` shows."""
        image = req.image or self.settings.image
        if not image:
            raise OperatorError(
                f"run {req.key} names no image, and a Kubernetes pod always runs one: give the "
                "spec an image, or set executor.kubernetes.image"
            )
        if not req.cwd.startswith("/"):
            raise OperatorError(
                f"working directory {req.cwd!r} for run {req.key} must be an absolute path inside "
                "the container"
            )
        for what, value in (("memory_gb", req.memory_gb), ("shm_gb", req.shm_gb)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise OperatorError(f"{what} for run {req.key} must be a positive number of GiB")
        self._check_mounts(req)
        name = job_name(req.key)
        log_path = os.path.abspath(Path(req.log_path).expanduser())
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        for k, v in req.labels.items():
            k8s_key = "nightshift.io/" + k.removeprefix("nightshift.") if _ours(k) else k
            if not _is_label_key(k8s_key):
                continue  # informational only; a key Kubernetes refuses is dropped
            annotations[k8s_key] = v
            if k in (PRIORITY_LABEL, TIMEOUT_LABEL):
                continue  # settings for the executor, visible in the spec; not for selecting
            if len(v) <= _DNS_LABEL_MAX and _LABEL_VALUE_RE.match(v):
                labels[k8s_key] = v
        labels.update({KEY_LABEL: key_label(req.key), MANAGED_BY: "nightshift"})
        annotations.update({KEY_ANNOTATION: req.key, LOG_ANNOTATION: log_path})
        job_labels = dict(labels)
        if self.settings.kueue_queue:
            job_labels[KUEUE_QUEUE_LABEL] = self.settings.kueue_queue

        resources: dict[str, Any] = {}
        if req.gpus:
            resources["limits"] = {"nvidia.com/gpu": str(len(req.gpus))}
        if req.memory_gb is not None:
            memory = _quantity(req.memory_gb)
            resources.setdefault("limits", {})["memory"] = memory
            resources["requests"] = {"memory": memory}
        if req.cpus is not None:
            resources.setdefault("limits", {})["cpu"] = f"{round(req.cpus * 1000)}m"
        env = [{"name": k, "value": v} for k, v in self._env(req).items()]
        shm: dict[str, Any] = {"medium": "Memory"}
        if req.shm_gb is not None:
            shm["sizeLimit"] = _quantity(req.shm_gb)
        volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
        mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        for i, m in enumerate(self.settings.mounts):
            claim: dict[str, Any] = {"claimName": m.claim}
            if m.read_only:
                claim["readOnly"] = True
            volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": claim})
            mount: dict[str, Any] = {"name": f"pvc-{i}", "mountPath": m.mount_path}
            if m.sub_path:
                mount["subPath"] = m.sub_path
            if m.read_only:
                mount["readOnly"] = True
            mounts.append(mount)
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": image,
            "command": list(req.argv),
            "workingDir": req.cwd,
            "env": env,
            "volumeMounts": mounts,
        }
        if resources:
            container["resources"] = resources
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": max(0, math.ceil(self.stop_grace_s)),
            "containers": [container],
            "volumes": volumes,
        }
        if req.user:
            pod["securityContext"] = self._user(req)
        if self.settings.service_account:
            pod["serviceAccountName"] = self.settings.service_account
        else:  # a training program has no business with the API; mount no token
            pod["automountServiceAccountToken"] = False
        priority_class = self._priority_class(req)
        if priority_class:
            pod["priorityClassName"] = priority_class
        spec: dict[str, Any] = {
            "backoffLimit": 0,  # nightshift owns retries
            "completions": 1,
            "parallelism": 1,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        }
        deadline = self._deadline_s(req)
        if deadline is not None:
            spec["activeDeadlineSeconds"] = deadline
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": job_labels,
                "annotations": annotations,
            },
            "spec": spec,
        }

    @staticmethod
    def _env(req: LaunchRequest) -> dict[str, str]:
        for name in req.env:
            if not _ENV_NAME_RE.match(name):
                raise OperatorError(
                    f"environment variable name {name!r} of run {req.key} cannot be given to a "
                    "Kubernetes pod (printable ASCII without '=' or spaces)"
                )
        env = {**req.env, "NIGHTSHIFT_RUN_KEY": req.key}
        if not req.gpus:  # [] hides all GPUs, also in images that set NVIDIA_VISIBLE_DEVICES=all
            env.setdefault("NVIDIA_VISIBLE_DEVICES", "void")
        return env

    @staticmethod
    def _user(req: LaunchRequest) -> dict[str, int]:
        uid, _, gid = (req.user or "").partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise OperatorError(
                f"user {req.user!r} of run {req.key}: a Kubernetes pod runs as a numeric uid[:gid]"
            )
        context = {"runAsUser": int(uid)}
        if gid:
            context["runAsGroup"] = int(gid)
        return context

    def _check_mounts(self, req: LaunchRequest) -> None:
        """A host path the run needs must be on one of the executor's PVCs: pods see no host."""
        roots = [m.mount_path for m in self.settings.mounts]
        for i, m in enumerate(req.mounts):
            target = next((m[k] for k in ("target", "dst", "container_path") if m.get(k)), None)
            if not isinstance(target, str):
                raise OperatorError(
                    f"mounts[{i}] of run {req.key} needs a `target` path, got {m!r}"
                )
            if not any(_under(target, root) for root in roots):
                raise OperatorError(
                    f"run {req.key} needs {target!r} in its pod, but no PersistentVolumeClaim in "
                    "executor.kubernetes.mounts is mounted there: add one (claim, mount_path) "
                    "whose mount_path holds that path"
                )

    def _priority_class(self, req: LaunchRequest) -> str | None:
        """The class of the highest threshold at or below the job's priority, if any."""
        priority = self._number(req, PRIORITY_LABEL, 0.0)
        below = [t for t in self.settings.priority_classes if t <= priority]
        return self.settings.priority_classes[max(below)] if below else None

    def _deadline_s(self, req: LaunchRequest) -> int | None:
        timeout = self._number(req, TIMEOUT_LABEL, None)
        if timeout is None:
            return None
        if timeout <= 0:
            raise OperatorError(f"{TIMEOUT_LABEL} of run {req.key} must be positive")
        return max(1, math.ceil(timeout))

    @staticmethod
    def _number(req: LaunchRequest, label: str, default: float | None) -> float | None:
        raw = req.labels.get(label)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise OperatorError(f"label {label} of run {req.key} must be a number, got {raw!r}")
        return value

    # ------------------------------------------------------------------------------ look up
    def find(self, key: str) -> dict[str, Any] | None:
        """The handle of the Job labelled with this key, or None if there is none."""
        batch, _ = self._api()
        selector = f"{KEY_LABEL}={key_label(key)},{MANAGED_BY}=nightshift"
        with self._errors(f"looking up run {key}"):
            found = self._json(
                batch.list_namespaced_job(self.namespace, label_selector=selector, **_RAW)
            )
        jobs = [
            j
            for j in found.get("items") or []
            if (j["metadata"].get("annotations") or {}).get(KEY_ANNOTATION) == key
        ]
        if not jobs:
            return None
        jobs.sort(key=lambda j: j["metadata"]["name"] != job_name(key))  # its own name first
        return self._handle_of(jobs[0])

    def poll(self, handle: dict[str, Any]) -> RunStatus:
        """running while the Job is pending or active; exited with the container's exit code once
        it ended; lost when the Job is gone, ran past its deadline, or its pod was evicted."""
        h = self._handle(handle)
        with self._errors(f"reading Job {h.name}"):
            job = self._read_job(h)
            if job is None:
                return self._gone(h)
            pods = self._pods(h)
            self._copy_logs(h, pods)
            return self._remember(h, self._status(h, job, pods))

    def _status(self, h: KubernetesHandle, job: dict[str, Any], pods: list[dict]) -> RunStatus:
        state = self._read_state(h)
        if job["metadata"].get("deletionTimestamp"):
            if state.final is not None:
                return state.final
            return RunStatus(
                state="lost",
                detail=f"Job {h.name} is being deleted, not by nightshift; its pod is stopping",
            )
        status = job.get("status") or {}
        conditions = {
            c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
        }
        failed = conditions.get("Failed") or conditions.get("FailureTarget")
        succeeded = conditions.get("Complete") or conditions.get("SuccessCriteriaMet")
        pod = pods[-1] if pods else None
        if failed is not None and failed.get("reason") == "DeadlineExceeded":
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            return RunStatus(
                state="lost",
                detail=(
                    f"deadline exceeded: Kubernetes stopped Job {h.name} after its "
                    f"activeDeadlineSeconds ({deadline} s, the spec's timeout)"
                    + (f": {failed['message']}" if failed.get("message") else "")
                ),
            )
        terminated = _terminated(pod) if pod is not None else None
        ended = failed is not None or succeeded is not None
        pod_phase = ((pod or {}).get("status") or {}).get("phase")
        if pod is not None and (ended or pod_phase in ("Succeeded", "Failed")):
            disrupted = _disruption(pod)
            if disrupted is not None:
                code = f" (exit code {terminated['exitCode']})" if terminated else ""
                return RunStatus(state="lost", detail=f"{disrupted}{code}")
        if terminated is not None and (ended or pod_phase in ("Succeeded", "Failed")):
            return self._exited(terminated, state)
        if succeeded is not None:  # its pod is gone, but a Job completes only when it exited 0
            return RunStatus(state="exited", exit_code=0)
        if failed is not None:
            return RunStatus(
                state="lost",
                detail=(
                    f"Job {h.name} failed ({failed.get('reason')}: {failed.get('message')}) and "
                    "its pod is gone (node lost, or deleted): its exit code is unknown"
                ),
            )
        if (job.get("spec") or {}).get("suspend"):
            queue = (job["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
            why = f"waiting for Kueue to admit it (queue {queue})" if queue else "suspended"
            return RunStatus(state="running", detail=f"queued: Job {h.name} is {why}")
        if pod is None:
            return RunStatus(state="running", detail="pending: no pod yet")
        if pod_phase == "Pending":
            return RunStatus(state="running", detail=f"pending: {_pending_reason(pod)}")
        return RunStatus(state="running")

    def _exited(self, term: dict[str, Any], state: _State) -> RunStatus:
        code = term.get("exitCode")
        reason = term.get("reason") or ""
        message = (term.get("message") or "").strip()
        sig = term.get("signal") or None
        if reason == "OOMKilled":
            return RunStatus(
                state="exited",
                exit_code=code,
                signal=int(signal.SIGKILL),
                detail=(
                    "out of memory: the kernel's OOM killer ended the container at its memory limit "
                    "(raise memory_gb, or lower the batch size)"
                ),
            )
        if state.stopped_grace_s is not None and code in _SIGNAL_EXITS:
            return self._stopped_status(state.stopped_grace_s, code)
        if reason in ("StartError", "ContainerCannotRun") and (
            "not found" in message or "no such file" in message
        ):
            return RunStatus(
                state="exited",
                exit_code=127,
                detail=f"command not found in the image (exit code 127): {message}",
            )
        detail = message or (reason if reason not in ("", "Completed", "Error") else None)
        return RunStatus(state="exited", exit_code=code, signal=sig, detail=detail)

    @staticmethod
    def _stopped_status(grace: float, code: int | None = None) -> RunStatus:
        if code == 137:
            how, sig = f"SIGKILL after SIGTERM and {grace:g} s of grace", signal.SIGKILL
        else:
            how, sig = f"SIGTERM; SIGKILL after {grace:g} s", signal.SIGTERM
        return RunStatus(
            state="exited",
            exit_code=code,
            signal=int(sig),
            detail=f"stopped by nightshift (Job deleted: {how})",
        )

    def _gone(self, h: KubernetesHandle) -> RunStatus:
        final = self._read_state(h).final
        if final is not None:
            return final
        return RunStatus(
            state="lost",
            detail=(
                f"Job {h.name} in namespace {h.namespace} is gone (deleted outside nightshift); "
                "its exit code and the output not yet copied are lost"
            ),
        )

    # ---------------------------------------------------------------------------------- stop
    def stop(self, handle: dict[str, Any], grace_s: float | None = None) -> RunStatus:
        """Delete a running Job (its pod gets SIGTERM, then SIGKILL after the pod's grace); an
        ended Job is left for `cleanup`, so its exit code stays readable. Safe when gone."""
        h = self._handle(handle)
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._errors(f"stopping Job {h.name}"):
            job = self._read_job(h)
            if job is None:
                return self._gone(h)
            pods = self._pods(h)
            self._copy_logs(h, pods)
            status = self._status(h, job, pods)
            if status.state == "running":
                status = self._stopped_status(grace)
                self._update_state(h, stopped_grace_s=grace, final=status)
                self._delete(h, grace)
            else:
                self._remember(h, status)
        return status

    def cleanup(self, handle: dict[str, Any], grace_s: float | None = None) -> list[int]:
        """Delete the run's Job (its output copied and its end recorded first) and wait until its
        pod is gone, so a relaunch never trains beside it; [] since no local process is left."""
        h = self._handle(handle)
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._errors(f"cleaning up Job {h.name}"):
            job = self._read_job(h)
            if job is None:
                return []
            pods = self._pods(h)
            self._copy_logs(h, pods)
            status = self._status(h, job, pods)
            if status.state == "running":
                self._update_state(h, stopped_grace_s=grace, final=self._stopped_status(grace))
            else:
                self._remember(h, status)
            self._delete(h, grace)
            deadline = time.monotonic() + grace + _CLEANUP_WAIT_S
            while self._read_job(h) is not None and time.monotonic() < deadline:
                time.sleep(0.5)
        return []

    def _delete(self, h: KubernetesHandle, grace: float) -> None:
        """Delete the Job and, before it goes, its pods (foreground propagation)."""
        batch, _ = self._api()
        try:
            batch.delete_namespaced_job(
                h.name,
                h.namespace,
                grace_period_seconds=max(0, math.ceil(grace)),
                propagation_policy="Foreground",
                **_RAW,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ---------------------------------------------------------------------------------- logs
    def logs(self, handle: dict[str, Any], tail: int = 200) -> str:
        """The last `tail` lines of the run's log file, after copying what is new."""
        h = self._handle(handle)
        with self._errors(f"reading the output of Job {h.name}"):
            if self._read_job(h) is not None:
                self._copy_logs(h, self._pods(h))
        return _read_tail(Path(h.log_path), tail)

    def render(self, req: LaunchRequest) -> str:
        """The Job manifest as YAML, for a dry run; secret-looking env values are masked."""
        manifest = self.manifest(req)
        for c in manifest["spec"]["template"]["spec"]["containers"]:
            for e in c["env"]:
                if _SECRET_RE.search(e["name"]) and e["name"] != "NIGHTSHIFT_RUN_KEY":
                    e["value"] = "***"
        where = self.settings.api_url or "the kubeconfig's cluster"
        return (
            f"# [kubernetes {req.key!r}] Job {manifest['metadata']['name']} in namespace "
            f"{self.namespace} at {where} (output copied to {req.log_path!r})\n"
            + yaml.safe_dump(manifest, sort_keys=False, width=1000)
        )

    # ------------------------------------------------------------------------ copying output
    def _copy_logs(self, h: KubernetesHandle, pods: list[dict[str, Any]]) -> None:
        """Append the pods' output that no process has copied yet to the log file."""
        _, core = self._api()
        with self._states.locked(self._state_name(h)):
            state = self._read_state(h)
            before = state.model_copy(deep=True)
            out = bytearray()
            for pod in pods:
                name = pod["metadata"]["name"]
                if not _started(pod):
                    continue
                copy = state.pods.get(name, _PodCopy())
                since = None
                if copy.cut_ns:
                    since = max(1, math.ceil(time.time() - copy.cut_ns / 1e9) + _SKEW_S)
                try:
                    raw = core.read_namespaced_pod_log(
                        name,
                        h.namespace,
                        container=CONTAINER,
                        timestamps=True,
                        since_seconds=since,
                        **_RAW,
                    ).data
                except ApiException as exc:
                    if exc.status in (400, 404):  # not started yet, or gone meanwhile
                        continue
                    raise
                seen = Counter(copy.recent)
                copied = list(copy.recent)
                for line in bytes(raw).splitlines(keepends=True):
                    raw_ts, _, text = line.partition(b" ")
                    ts = _ts_ns(raw_ts)
                    if ts is None:  # not stamped (never seen); keep the text rather than lose it
                        out += line
                        continue
                    if ts < copy.cut_ns:
                        continue
                    if seen[ts] > 0:
                        seen[ts] -= 1
                        continue
                    out += text if text.endswith(b"\n") else text + b"\n"
                    copied.append(ts)
                if copied:
                    cut = (max(copied) - _WINDOW_NS) // 10**9 * 10**9
                    copy.cut_ns = max(copy.cut_ns, cut)
                    copy.recent = sorted(t for t in copied if t >= copy.cut_ns)
                state.pods[name] = copy
            if out:
                Path(h.log_path).parent.mkdir(parents=True, exist_ok=True)
                with open(h.log_path, "ab") as f:
                    f.write(out)
                    f.flush()
            if state != before:
                self._write_state(h, state)

    def _remember(self, h: KubernetesHandle, status: RunStatus) -> RunStatus:
        """Keep how the run ended, for when its Job is deleted later."""
        if status.state != "running" and self._read_state(h).final != status:
            self._update_state(h, final=status)
        return status

    @staticmethod
    def _state_name(h: KubernetesHandle) -> str:
        return f"{h.namespace}.{h.name}"

    def _read_state(self, h: KubernetesHandle) -> _State:
        state = self._states.read(self._state_name(h), lambda: _State(uid=h.uid))
        # A Job of the same name created later (a relaunch of the key) starts afresh.
        return state if state.uid == h.uid else _State(uid=h.uid)

    def _write_state(self, h: KubernetesHandle, state: _State) -> None:
        self._states.write(self._state_name(h), state)

    def _update_state(self, h: KubernetesHandle, **changes: Any) -> None:
        self._states.update(self._state_name(h), lambda: self._read_state(h), **changes)

    # ------------------------------------------------------------------------------ helpers
    def _api(self) -> tuple[Any, Any]:
        """The BatchV1Api and CoreV1Api clients, configured on first use."""
        with self._client_lock:
            if self._apis is not None:
                return self._apis
            if kubernetes is None:
                raise OperatorError(
                    "the kubernetes executor needs the Kubernetes client: "
                    "`pip install 'nightshift[kubernetes]'`"
                )
            s = self.settings
            cfg = kubernetes.client.Configuration()
            try:
                if s.kubeconfig or (not s.api_url and "KUBERNETES_SERVICE_HOST" not in os.environ):
                    kubernetes.config.load_kube_config(
                        config_file=s.kubeconfig,
                        context=s.context,
                        client_configuration=cfg,
                        persist_config=False,
                    )
                elif not s.api_url:  # inside a pod: its service account
                    kubernetes.config.load_incluster_config(client_configuration=cfg)
            except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
                raise OperatorError(
                    f"cannot load the Kubernetes client configuration ({exc}): set "
                    "executor.kubernetes.kubeconfig (and context) to a valid kubeconfig, or "
                    "executor.kubernetes.api_url (e.g. `kubectl proxy`'s http://127.0.0.1:8001)"
                ) from exc
            if s.api_url:
                cfg.host = s.api_url.rstrip("/")
            cfg.retries = 1
            self._host = cfg.host
            api = kubernetes.client.ApiClient(cfg)
            self._apis = (kubernetes.client.BatchV1Api(api), kubernetes.client.CoreV1Api(api))
            return self._apis

    def close(self) -> None:
        """Close this executor's connections (the runs go on)."""
        with self._client_lock:
            if self._apis is not None:
                self._apis[0].api_client.close()
                self._apis = None

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """API unreachable or refusing us → OperatorError naming the URL and the fix; any other
        API error → SkillFailed."""
        self._api()  # raises OperatorError when the client is missing or misconfigured
        try:
            yield
        except ApiException as exc:
            message = _message(exc)
            if exc.status == 0:
                raise self._unreachable(exc.reason) from exc
            if exc.status == 401:
                raise OperatorError(
                    f"the Kubernetes API server at {self.url} refused nightshift's credentials "
                    f"while {what} (401 Unauthorized: {message}): renew the token or certificate "
                    "of executor.kubernetes.kubeconfig / context"
                ) from exc
            if exc.status == 403:
                raise OperatorError(
                    f"the Kubernetes API server at {self.url} forbids {what} in namespace "
                    f"{self.namespace} (403 Forbidden: {message}): {_RBAC}"
                ) from exc
            if exc.status == 422:
                raise OperatorError(
                    f"the Kubernetes API server at {self.url} rejected the Job while {what} "
                    f"(422 Invalid: {message}): check executor.kubernetes (image, mounts, "
                    "priority_classes, kueue_queue)"
                ) from exc
            if exc.status is not None and exc.status >= 500:
                raise OperatorError(
                    f"the Kubernetes API server at {self.url} is unavailable while {what} "
                    f"({exc.status} {exc.reason}: {message}): check the cluster, or "
                    "executor.kubernetes.api_url"
                ) from exc
            raise SkillFailed(
                f"Kubernetes failed {what} ({exc.status} {exc.reason}: {message})"
            ) from exc
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
            raise self._unreachable(str(exc)) from exc

    def _unreachable(self, why: object) -> OperatorError:
        return OperatorError(
            f"cannot reach the Kubernetes API server at {self.url} ({why}): check that the "
            "cluster is up and executor.kubernetes.api_url (or the kubeconfig's server) is right"
        )

    def _json(self, response: Any) -> dict[str, Any]:
        """The decoded body of a raw (`_preload_content=False`) response."""
        try:
            data = json.loads(response.data)
        except ValueError as exc:
            raise SkillFailed(
                f"the Kubernetes API server at {self.url} answered with something that is not "
                f"JSON: {bytes(response.data[:200])!r}"
            ) from exc
        if not isinstance(data, dict):
            raise SkillFailed(f"the Kubernetes API server at {self.url} answered {data!r}")
        return data

    def _read_job_by_name(self, name: str, namespace: str) -> dict[str, Any] | None:
        batch, _ = self._api()
        try:
            return self._json(batch.read_namespaced_job(name, namespace, **_RAW))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _read_job(self, h: KubernetesHandle) -> dict[str, Any] | None:
        """The handle's Job, or None when it is gone (or replaced by one of the same name)."""
        job = self._read_job_by_name(h.name, h.namespace)
        if job is None or job["metadata"].get("uid") != h.uid:
            return None
        return job

    def _pods(self, h: KubernetesHandle) -> list[dict[str, Any]]:
        """The Job's pods, oldest first."""
        _, core = self._api()
        found = self._json(
            core.list_namespaced_pod(h.namespace, label_selector=f"controller-uid={h.uid}", **_RAW)
        )
        pods = list(found.get("items") or [])
        pods.sort(
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"])
        )
        return pods

    def _handle_of(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        annotations = meta.get("annotations") or {}
        return KubernetesHandle(
            key=annotations[KEY_ANNOTATION],
            namespace=meta.get("namespace") or self.namespace,
            name=meta["name"],
            uid=meta["uid"],
            log_path=annotations[LOG_ANNOTATION],
        ).model_dump()

    @staticmethod
    def _handle(handle: dict[str, Any]) -> KubernetesHandle:
        kind = handle.get("kind") if isinstance(handle, dict) else None
        if kind != "kubernetes":
            raise OperatorError(
                f"handle is for the {kind!r} executor, not 'kubernetes'; the attempt was started "
                "by another executor: configure that one to manage it"
            )
        try:
            return KubernetesHandle.model_validate(handle)
        except ValidationError as exc:
            raise OperatorError(
                f"kubernetes run handle is invalid: {exc.errors()[0]['msg']}"
            ) from exc


_RAW: dict[str, Any] = {"_preload_content": False, "_request_timeout": _TIMEOUT}


def _message(exc: Any) -> str:
    """The `message` of the API's Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(exc.reason or "no reason given")


def _main_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((c for c in statuses if c.get("name") == CONTAINER), {})


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The main container's terminated state (its last one when it was restarted)."""
    cs = _main_status(pod)
    return ((cs.get("state") or {}).get("terminated")) or (
        (cs.get("lastState") or {}).get("terminated")
    )


def _started(pod: dict[str, Any]) -> bool:
    """Whether the main container ever ran, so the pod has a log to read."""
    cs = _main_status(pod)
    state = cs.get("state") or {}
    return bool(state.get("running") or state.get("terminated") or cs.get("lastState"))


def _disruption(pod: dict[str, Any]) -> str | None:
    """What took the pod away from under the run (eviction, node loss, preemption), if anything."""
    status = pod.get("status") or {}
    where = f"node {(pod.get('spec') or {}).get('nodeName') or 'unknown'}"
    name = pod["metadata"]["name"]
    if status.get("reason") in _DISRUPTION_REASONS:
        return f"pod {name} was evicted ({_reason(status)}) from {where}"
    for c in status.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return f"pod {name} was disrupted ({_reason(c)}) on {where}"
    return None


def _pending_reason(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet, in the API's words (unschedulable, pulling an image, ...)."""
    waiting = (_main_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason"):
        return _reason(waiting)
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"not scheduled ({_reason(c)})"
    return f"pod {pod['metadata']['name']} is starting"


def _reason(obj: dict[str, Any]) -> str:
    """ "Reason: message", or the one of them there is."""
    parts = [str(obj[k]) for k in ("reason", "message") if obj.get(k)]
    return ": ".join(parts) or "no reason given"
