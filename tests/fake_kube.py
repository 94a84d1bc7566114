"""A fake Kubernetes API server on loopback, for tests that drive the official `kubernetes` client
over real HTTP.

`FakeKube` answers the calls the Kubernetes executor makes — create, read, list (by label selector)
and delete `batch/v1` Jobs; list pods by label selector; read a pod's log (timestamps,
sinceSeconds, tailLines) — with JSON shaped like the real API's: objects with kind, apiVersion
and metadata (uid, creationTimestamp, resourceVersion), the Job controller's defaults and pod
labels, and `Status` objects (AlreadyExists 409, NotFound 404, Invalid 422, Forbidden 403,
ServiceUnavailable 503) for errors.

Every Job it receives is validated as the API server would: against the Kubernetes OpenAPI schema
of the newest version kubernetes-validate ships (strict: no unknown fields), and for the rules the
schema cannot say (DNS-1123 names, label keys and values, quantities, volume references). An
invalid Job is answered 422 and kept in `rejected`; a valid one is kept, as received, in `created`.
`invalid_job` is that check on its own, for manifests a test renders without sending.

No controller runs: the test moves each Job along, as the Job controller and the kubelet would.

    with FakeKube() as kube:
        handle = executor.start(request)        # settings.api_url = kube.url
        kube.set_pod_running(handle["name"])
        kube.append_log(handle["name"], ["step 1"])
        kube.finish(handle["name"], exit_code=0)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_ENV_NAME = re.compile(r"^[\x21-\x3c\x3e-\x7e]+$")
_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?$")
_CONTAINER = "main"


def rfc3339(ns: int) -> str:
    """A time as the API writes it in log lines (RFC 3339, nanoseconds, trailing zeros cut)."""
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9))
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, joined by commas."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKube:
    """The few Job, Pod and log endpoints of a Kubernetes API server, on 127.0.0.1.

    State, all in memory: `jobs` and `pods` map (namespace, name) to the object; logs are lines
    with the nanosecond they were "written". Records: `created` (each Job accepted, as received),
    `rejected` ((Job, why) for each 422), `deletions` (namespace, name and the DeleteOptions of
    each DELETE), `requests` ((method, path, query) of each call). Switches: `down = True` answers
    503 to everything; `forbidden` holds verbs (create, get, list, delete) answered 403;
    `kueue = True` suspends a Job that carries the Kueue queue label until `admit`, as Kueue's
    webhook does; `gc_after_s` is how long a foreground deletion keeps the Job (with its
    deletionTimestamp) before it is gone.
    """

    def __init__(self, *, kueue: bool = False, gc_after_s: float = 0.0) -> None:
        import kubernetes_validate  # the published schemas, offline

        self.version = kubernetes_validate.latest_version()
        self.kueue = kueue
        self.gc_after_s = gc_after_s
        self.namespaces = {"default"}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.rejected: list[tuple[dict[str, Any], str]] = []
        self.deletions: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.down = False
        self.forbidden: set[str] = set()
        self._logs: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self._gone_at: dict[tuple[str, str], float] = {}
        self._rv = itertools.count(1000)
        self._last_ns = 0
        self._conns: set[socket.socket] = set()
        self._lock = threading.RLock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """What to give the executor as `executor.kubernetes.api_url`."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def stop(self) -> None:
        """Stop answering, as a dead server does: open connections are cut, and later calls find
        nothing listening."""
        self._http.shutdown()
        self._http.server_close()
        with self._lock:
            for conn in list(self._conns):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeKube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------- what the controllers do
    def job(self, name: str, ns: str = "default") -> dict[str, Any]:
        """The Job as the API holds it now."""
        with self._lock:
            self._collect()
            return self.jobs[(ns, name)]

    def pods_of(self, name: str, ns: str = "default") -> list[dict[str, Any]]:
        """The Job's pods, oldest first."""
        with self._lock:
            uid = self.jobs[(ns, name)]["metadata"]["uid"]
            return [
                p
                for (pns, _), p in sorted(self.pods.items())
                if pns == ns and p["metadata"]["labels"].get("controller-uid") == uid
            ]

    def admit(self, name: str, ns: str = "default") -> None:
        """Kueue admitted the Job: it is no longer suspended."""
        with self._lock:
            job = self.jobs[(ns, name)]
            job["spec"]["suspend"] = False
            job["status"]["conditions"] = [
                c for c in job["status"].get("conditions", []) if c["type"] != "Suspended"
            ]
            self._touch(job)

    def set_pod_pending(self, name: str, ns: str = "default", *, reason: str = "") -> None:
        """The Job controller created the pod; it waits (unscheduled, or `reason`, e.g.
        ImagePullBackOff)."""
        with self._lock:
            pod = self._pod(name, ns)
            pod["status"] = {"phase": "Pending", "conditions": []}
            if reason:
                pod["status"]["containerStatuses"] = [
                    {
                        "name": _CONTAINER,
                        "ready": False,
                        "restartCount": 0,
                        "image": pod["spec"]["containers"][0]["image"],
                        "imageID": "",
                        "state": {"waiting": {"reason": reason, "message": f"{reason} (fake)"}},
                    }
                ]
            else:
                pod["status"]["conditions"].append(
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                )
            job = self.jobs[(ns, name)]
            job["status"].update(
                active=1, ready=0, startTime=job["status"].get("startTime") or _now()
            )
            self._touch(job)

    def set_pod_running(self, name: str, ns: str = "default") -> dict[str, Any]:
        """The pod was scheduled to a node and its container runs; returns the pod."""
        with self._lock:
            pod = self._pod(name, ns)
            pod["spec"]["nodeName"] = "gpu-node-1"
            pod["status"] = {
                "phase": "Running",
                "hostIP": "10.0.0.7",
                "podIP": "10.244.1.9",
                "startTime": _now(),
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": _CONTAINER,
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": pod["spec"]["containers"][0]["image"],
                        "imageID": "sha256:0",
                        "containerID": "containerd://" + uuid.uuid4().hex,
                        "state": {"running": {"startedAt": _now()}},
                    }
                ],
            }
            job = self.jobs[(ns, name)]
            job["status"].update(
                active=1, ready=1, startTime=job["status"].get("startTime") or _now()
            )
            self._touch(job)
            return pod

    def append_log(self, name: str, lines: list[str], ns: str = "default") -> None:
        """The container printed these lines (newest pod of the Job)."""
        with self._lock:
            pod = self.pods_of(name, ns)[-1]
            log = self._logs.setdefault((ns, pod["metadata"]["name"]), [])
            for line in lines:
                ts = max(time.time_ns(), self._last_ns + 1)
                self._last_ns = ts
                log.append((ts, line))

    def finish(
        self,
        name: str,
        exit_code: int,
        ns: str = "default",
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """The container exited with this code; the Job completed (0) or failed (backoffLimit 0)."""
        with self._lock:
            pod = self.pods_of(name, ns)[-1]
            term: dict[str, Any] = {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": _now(),
                "finishedAt": _now(),
            }
            if message:
                term["message"] = message
            self._terminate(pod, term, "Succeeded" if exit_code == 0 else "Failed")
            job = self.jobs[(ns, name)]
            if exit_code == 0:
                job["status"].update(active=0, ready=0, succeeded=1, completionTime=_now())
                self._conditions(job, ("SuccessCriteriaMet", "CompletionsReached", ""))
                self._conditions(job, ("Complete", "CompletionsReached", ""))
            else:
                self._failed(
                    job, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )

    def evict(self, name: str, ns: str = "default") -> None:
        """The kubelet evicted the pod (node memory pressure); the Job failed with it."""
        with self._lock:
            pod = self.pods_of(name, ns)[-1]
            self._terminate(
                pod, {"exitCode": 137, "reason": "Error", "finishedAt": _now()}, "Failed"
            )
            pod["status"]["reason"] = "Evicted"
            pod["status"]["message"] = "The node was low on resource: memory."
            pod["status"]["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": "The node was low on resource: memory.",
                }
            )
            job = self.jobs[(ns, name)]
            self._failed(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")

    def lose_pod(self, name: str, ns: str = "default") -> None:
        """The node vanished and the pod garbage collector removed its pod; the Job failed."""
        with self._lock:
            for pod in self.pods_of(name, ns):
                del self.pods[(ns, pod["metadata"]["name"])]
            self._failed(
                self.jobs[(ns, name)],
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )

    def deadline_exceeded(self, name: str, ns: str = "default") -> None:
        """activeDeadlineSeconds passed: the controller deleted the pod and failed the Job."""
        with self._lock:
            for pod in self.pods_of(name, ns):
                del self.pods[(ns, pod["metadata"]["name"])]
            self._failed(
                self.jobs[(ns, name)],
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )

    # --------------------------------------------------------------------------- internals
    def _touch(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def _pod(self, name: str, ns: str) -> dict[str, Any]:
        """The Job's newest pod, created from its template if it has none."""
        pods = self.pods_of(name, ns)
        if pods:
            return pods[-1]
        job = self.jobs[(ns, name)]
        template = json.loads(json.dumps(job["spec"]["template"]))
        pod_name = (name + "-")[:58] + uuid.uuid4().hex[:5]
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                **template.get("metadata", {}),
                "name": pod_name,
                "generateName": name + "-",
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending"},
        }
        self._touch(pod)
        self.pods[(ns, pod_name)] = pod
        return pod

    def _terminate(self, pod: dict[str, Any], term: dict[str, Any], phase: str) -> None:
        statuses = pod["status"].setdefault("containerStatuses", [])
        if not statuses:
            statuses.append({"name": _CONTAINER, "restartCount": 0, "image": "", "imageID": ""})
        statuses[0].update(ready=False, started=False, state={"terminated": term})
        pod["status"]["phase"] = phase
        pod["status"].setdefault("conditions", [])
        self._touch(pod)

    def _conditions(self, job: dict[str, Any], *conds: tuple[str, str, str]) -> None:
        for kind, reason, message in conds:
            job["status"].setdefault("conditions", []).append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastProbeTime": _now(),
                    "lastTransitionTime": _now(),
                }
            )
        self._touch(job)

    def _failed(self, job: dict[str, Any], reason: str, message: str) -> None:
        job["status"].update(active=0, ready=0, failed=1)
        self._conditions(job, ("FailureTarget", reason, message), ("Failed", reason, message))

    def _collect(self) -> None:
        """Finish the foreground deletions that are due: the Job and its pods are gone."""
        now = time.monotonic()
        for key, when in list(self._gone_at.items()):
            if now >= when:
                del self._gone_at[key]
                self._remove(key, pods=True)

    def _remove(self, key: tuple[str, str], pods: bool) -> None:
        job = self.jobs.pop(key, None)
        if job is None or not pods:
            return
        uid = job["metadata"]["uid"]
        for pkey, pod in list(self.pods.items()):
            if pod["metadata"]["labels"].get("controller-uid") == uid:
                del self.pods[pkey]
                self._logs.pop(pkey, None)

    def _create(self, ns: str, body: Any) -> tuple[int, dict[str, Any]]:
        if ns not in self.namespaces:
            return 404, _status(
                404, "NotFound", f'namespaces "{ns}" not found', name=ns, kind="namespaces"
            )
        why = invalid_job(body)
        name = (body.get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
        if why is not None:
            self.rejected.append((body, why))
            return 422, _status(
                422,
                "Invalid",
                f'Job.batch "{name}" is invalid: {why}',
                name=name,
                group="batch",
                kind="Job",
            )
        if (ns, name) in self.jobs:
            return 409, _status(
                409,
                "AlreadyExists",
                f'jobs.batch "{name}" already exists',
                name=name,
                group="batch",
                kind="jobs",
            )
        self.created.append(json.loads(json.dumps(body)))
        job = json.loads(json.dumps(body))
        uid = str(uuid.uuid4())
        meta = job["metadata"]
        meta.update(namespace=ns, uid=uid, creationTimestamp=_now(), generation=1)
        meta.setdefault("labels", {})
        meta["labels"].update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid})
        meta["labels"].update({"batch.kubernetes.io/job-name": name, "job-name": name})
        spec = job["spec"]
        for k, v in (
            ("backoffLimit", 6),
            ("completions", 1),
            ("parallelism", 1),
            ("completionMode", "NonIndexed"),
            ("suspend", False),
            ("manualSelector", False),
            ("podReplacementPolicy", "TerminatingOrFailed"),
        ):
            spec.setdefault(k, v)
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        tmeta = spec["template"].setdefault("metadata", {})
        tmeta.setdefault("labels", {})
        tmeta["labels"].update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
        job["status"] = {}
        if self.kueue and "kueue.x-k8s.io/queue-name" in meta["labels"]:
            spec["suspend"] = True  # Kueue's webhook: suspended until admitted
            self._conditions(job, ("Suspended", "JobSuspended", "Job suspended"))
        self._touch(job)
        self.jobs[(ns, name)] = job
        return 201, job

    def _delete(self, ns: str, name: str, options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.deletions.append({"namespace": ns, "name": name, **options})
        job = self.jobs.get((ns, name))
        if job is None:
            return 404, _status(
                404,
                "NotFound",
                f'jobs.batch "{name}" not found',
                name=name,
                group="batch",
                kind="jobs",
            )
        policy = options.get("propagationPolicy") or "Background"
        if policy == "Foreground":
            if "deletionTimestamp" not in job["metadata"]:
                job["metadata"].update(deletionTimestamp=_now(), finalizers=["foregroundDeletion"])
                job["metadata"]["deletionGracePeriodSeconds"] = 0
                self._gone_at[(ns, name)] = time.monotonic() + self.gc_after_s
                self._touch(job)
            return 200, job
        self._remove((ns, name), pods=policy == "Background")
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": "batch",
                "kind": "jobs",
                "uid": job["metadata"]["uid"],
            },
        }

    def _log(self, ns: str, pod_name: str, query: dict[str, str]) -> tuple[int, Any]:
        pod = self.pods.get((ns, pod_name))
        if pod is None:
            return 404, _status(
                404, "NotFound", f'pods "{pod_name}" not found', name=pod_name, kind="pods"
            )
        state = ((pod["status"].get("containerStatuses") or [{}])[0]).get("state") or {}
        if not (state.get("running") or state.get("terminated")):
            return 400, _status(
                400,
                "BadRequest",
                f'container "{_CONTAINER}" in pod "{pod_name}" is waiting to start: ContainerCreating',
            )
        lines = list(self._logs.get((ns, pod_name), []))
        if "sinceSeconds" in query:
            since = time.time_ns() - int(query["sinceSeconds"]) * 10**9
            lines = [(ts, text) for ts, text in lines if ts >= since]
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]) :] if int(query["tailLines"]) > 0 else []
        stamps = query.get("timestamps") == "true"
        return 200, "".join(
            (f"{rfc3339(ts)} " if stamps else "") + text + "\n" for ts, text in lines
        )

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """Answer one request: (HTTP status, JSON object or log text)."""
        with self._lock:
            self.requests.append((method, path, query))
            if self.down:
                return 503, _status(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                )
            self._collect()
            verb = {"POST": "create", "DELETE": "delete"}.get(method, "get")
            m = _JOBS.match(path)
            if m:
                ns, name = m.groups()
                if method == "GET" and name is None:
                    verb = "list"
                if verb in self.forbidden:
                    return 403, _status(
                        403,
                        "Forbidden",
                        f'jobs.batch is forbidden: User "system:serviceaccount:{ns}:nightshift" '
                        f'cannot {verb} resource "jobs" in API group "batch" in the namespace "{ns}"',
                    )
                if method == "POST" and name is None:
                    return self._create(ns, body)
                if method == "GET" and name is None:
                    items = [
                        j
                        for (jns, _), j in sorted(self.jobs.items())
                        if jns == ns
                        and _matches(
                            j["metadata"].get("labels") or {}, query.get("labelSelector", "")
                        )
                    ]
                    return 200, _list("JobList", "batch/v1", items)
                if method == "GET":
                    job = self.jobs.get((ns, name))
                    if job is None:
                        return 404, _status(
                            404,
                            "NotFound",
                            f'jobs.batch "{name}" not found',
                            name=name,
                            group="batch",
                            kind="jobs",
                        )
                    return 200, job
                if method == "DELETE":
                    options = dict(body) if isinstance(body, dict) else {}
                    for q, k in (
                        ("propagationPolicy", "propagationPolicy"),
                        ("gracePeriodSeconds", "gracePeriodSeconds"),
                    ):
                        if q in query:
                            options[k] = int(query[q]) if k == "gracePeriodSeconds" else query[q]
                    options.pop("kind", None)
                    options.pop("apiVersion", None)
                    return self._delete(ns, name, options)
            m = _PODS.match(path)
            if m and method == "GET":
                ns, name, log = m.groups()
                if name is None:
                    items = [
                        p
                        for (pns, _), p in sorted(self.pods.items())
                        if pns == ns
                        and _matches(
                            p["metadata"].get("labels") or {}, query.get("labelSelector", "")
                        )
                    ]
                    return 200, _list("PodList", "v1", items)
                if log:
                    return self._log(ns, name, query)
                pod = self.pods.get((ns, name))
                if pod is None:
                    return 404, _status(
                        404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"
                    )
                return 200, pod
            return 404, _status(404, "NotFound", "the server could not find the requested resource")


def invalid_job(job: Any) -> str | None:
    """Why an API server would refuse this Job (422), or None when it would take it: the OpenAPI
    schema of the newest version kubernetes-validate ships (strict), and the rules the schema
    cannot say (names, labels, quantities, references)."""
    import kubernetes_validate

    if not isinstance(job, dict):
        return "the body is not a JSON object"
    try:
        kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return f"{where}: {exc.message}"
    meta = job.get("metadata") or {}
    name = meta.get("name") or ""
    problems = []
    if len(name) > 63 or not _DNS_LABEL.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: must be a DNS-1123 label")
    template = job["spec"]["template"]
    for where, labels in (
        ("metadata.labels", meta.get("labels") or {}),
        ("spec.template.metadata.labels", (template.get("metadata") or {}).get("labels") or {}),
    ):
        for k, v in labels.items():
            if not _qualified(k):
                problems.append(f"{where}: Invalid value: {k!r}: not a qualified name")
            if len(v) > 63 or not _LABEL_VALUE.match(v):
                problems.append(f"{where}: Invalid value: {v!r}: not a valid label value")
    for k in meta.get("annotations") or {}:
        if not _qualified(k):
            problems.append(f"metadata.annotations: Invalid value: {k!r}: not a qualified name")
    pod = template["spec"]
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        problems.append("spec.template.spec.restartPolicy: Unsupported value")
    volumes = [v["name"] for v in pod.get("volumes") or []]
    if len(set(volumes)) != len(volumes):
        problems.append("spec.template.spec.volumes: Duplicate value")
    for v in pod.get("volumes") or []:
        if not _DNS_LABEL.match(v["name"]):
            problems.append(f"volumes: Invalid value: {v['name']!r}")
        size = (v.get("emptyDir") or {}).get("sizeLimit")
        if size is not None and not _QUANTITY.match(str(size)):
            problems.append(f"volumes.emptyDir.sizeLimit: Invalid value: {size!r}")
    for c in pod["containers"]:
        if not _DNS_LABEL.match(c["name"]):
            problems.append(f"containers.name: Invalid value: {c['name']!r}")
        if not c.get("image"):
            problems.append("containers.image: Required value")
        for e in c.get("env") or []:
            if not _ENV_NAME.match(e["name"]):
                problems.append(f"containers.env.name: Invalid value: {e['name']!r}")
        for m in c.get("volumeMounts") or []:
            if m["name"] not in volumes:
                problems.append(f"volumeMounts.name: Not found: {m['name']!r}")
        for kind in ("limits", "requests"):
            for res, q in ((c.get("resources") or {}).get(kind) or {}).items():
                if not _QUANTITY.match(str(q)):
                    problems.append(f"resources.{kind}[{res}]: Invalid value: {q!r}")
    for field in ("serviceAccountName", "priorityClassName"):
        value = pod.get(field)
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            problems.append(f"spec.template.spec.{field}: Invalid value: {value!r}")
    spec = job["spec"]
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        problems.append("spec.activeDeadlineSeconds: must be greater than 0")
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        problems.append("spec.backoffLimit: must be greater than or equal to 0")
    return "; ".join(problems) or None


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def _list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": "1"},
        "items": items,
    }


def _handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes: without this, each answer waits 40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with kube._lock:
                kube._conns.add(self.connection)

        def finish(self) -> None:
            with kube._lock:
                kube._conns.discard(self.connection)
            super().finish()

        def _serve(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            status, answer = kube.handle(self.command, url.path, query, body)
            if isinstance(answer, str):
                data, ctype = answer.encode(), "text/plain"
            else:
                data, ctype = json.dumps(answer).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    return Handler
