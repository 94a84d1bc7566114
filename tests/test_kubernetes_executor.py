"""The Kubernetes executor through the official client, against a fake API server on loopback
(fake_kube.py): no cluster can run here. Every manifest it renders or sends is checked against the
Kubernetes OpenAPI schema (kubernetes-validate, strict) and the rules the API server adds."""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nightshift.runtime.config import KubernetesSettings, PvcMount
from nightshift.runtime.errors import OperatorError, SkillFailed
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.executors.kubernetes_executor import (
    KEY_LABEL,
    KubernetesExecutor,
    job_name,
    key_label,
)

from conftest import need

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def _deps() -> Any:
    need("kubernetes", "the Kubernetes executor's client (pip install 'nightshift[kubernetes]')")
    return need("kubernetes_validate", "validating manifests against the Kubernetes schema")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client would send loopback calls through a proxy from the environment."""
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def kube():
    _deps()
    from fake_kube import FakeKube

    with FakeKube() as fake:
        yield fake


def settings_for(url: str | None, **kw: Any) -> KubernetesSettings:
    base: dict[str, Any] = {
        "api_url": url,
        "image": "registry.local/train:1",
        "mounts": [
            PvcMount(claim="code", mount_path="/srv/code", read_only=True),
            PvcMount(claim="work", mount_path="/srv/work"),
        ],
    }
    return KubernetesSettings(**{**base, **kw})


def executor(tmp_path: Path, url: str | None, **kw: Any) -> KubernetesExecutor:
    return KubernetesExecutor(tmp_path / "runs", settings=settings_for(url, **kw), stop_grace_s=3)


def request(tmp_path: Path, key: str = "attempt-1", **kw: Any) -> LaunchRequest:
    base: dict[str, Any] = {
        "key": key,
        "argv": ["python", "train.py", "--lr", "0.1"],
        "cwd": "/srv/code/exp",
        "log_path": str(tmp_path / "logs" / f"{key}.log"),
        "labels": {"nightshift.job": "7", "nightshift.attempt": "1"},
    }
    return LaunchRequest(**{**base, **kw})


def valid(manifest: dict[str, Any]) -> None:
    """The schema (strict) and the API server's own rules both accept it."""
    kv = _deps()
    from fake_kube import invalid_job

    kv.validate(manifest, kv.latest_version(), strict=True)
    assert invalid_job(manifest) is None, invalid_job(manifest)


def pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]


# --------------------------------------------------------------------------- rendered manifests
def test_manifest_carries_resources_mounts_labels_and_retry_policy(tmp_path: Path) -> None:
    """What the issue asks of a Job, checked field by field, then against the schema."""
    ex = executor(
        tmp_path,
        "http://127.0.0.1:1",
        priority_classes={0: "batch", 5: "urgent"},
        kueue_queue="team-a",
        service_account="trainer",
    )
    req = request(
        tmp_path,
        gpus=[2, 3],
        memory_gb=1.5,
        shm_gb=8,
        env={"WANDB_API_KEY": "s3cret", "SEED": "1"},
        labels={
            "nightshift.job": "7",
            "nightshift.attempt": "2",
            "nightshift.priority": "6",
            "nightshift.timeout_s": "5400.5",
        },
        mounts=[{"source": "/srv/work/job-7", "target": "/srv/work/job-7", "read_only": False}],
    )
    m = ex.render(req)
    assert "s3cret" not in m  # secret-looking env values are masked in a dry run
    manifest = yaml.safe_load(m)
    valid(manifest)
    meta, spec, pod = manifest["metadata"], manifest["spec"], pod_spec(manifest)
    assert meta["name"] == "nightshift-attempt-1"
    assert meta["labels"] == {
        "nightshift.io/job": "7",
        "nightshift.io/attempt": "2",
        KEY_LABEL: "attempt-1",
        "app.kubernetes.io/managed-by": "nightshift",
        "kueue.x-k8s.io/queue-name": "team-a",
    }
    assert meta["annotations"]["nightshift.io/key"] == "attempt-1"
    assert spec["backoffLimit"] == 0 and spec["completions"] == 1
    assert spec["activeDeadlineSeconds"] == 5401
    assert "ttlSecondsAfterFinished" not in spec and "suspend" not in spec  # Kueue's webhook
    assert "kueue.x-k8s.io/queue-name" not in spec["template"]["metadata"]["labels"]
    assert pod["restartPolicy"] == "Never"
    assert pod["priorityClassName"] == "urgent"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["terminationGracePeriodSeconds"] == 3
    (c,) = pod["containers"]
    assert c["name"] == "main" and c["image"] == "registry.local/train:1"
    assert c["command"] == ["python", "train.py", "--lr", "0.1"] and "args" not in c
    assert c["workingDir"] == "/srv/code/exp"
    assert c["resources"] == {
        "limits": {"nvidia.com/gpu": "2", "memory": "1536Mi"},
        "requests": {"memory": "1536Mi"},
    }
    assert {"name": "SEED", "value": "1"} in c["env"]
    assert {"name": "NIGHTSHIFT_RUN_KEY", "value": "attempt-1"} in c["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["pvc-0"]["persistentVolumeClaim"] == {"claimName": "code", "readOnly": True}
    assert volumes["pvc-1"]["persistentVolumeClaim"] == {"claimName": "work"}
    mounts = {v["mountPath"]: v for v in c["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == "dshm"
    assert mounts["/srv/code"] == {"name": "pvc-0", "mountPath": "/srv/code", "readOnly": True}
    assert mounts["/srv/work"] == {"name": "pvc-1", "mountPath": "/srv/work"}


@pytest.mark.parametrize(
    ("labels", "gpus", "cls"),
    [
        ({}, [], "batch"),  # no priority given: 0
        ({"nightshift.priority": "4"}, [0], "batch"),
        ({"nightshift.priority": "5"}, [0, 1, 2, 3, 4, 5, 6, 7], "urgent"),
        ({"nightshift.priority": "-3"}, [], None),  # below every threshold: no class
    ],
)
def test_priority_class_and_gpu_count(tmp_path: Path, labels, gpus, cls) -> None:
    """The class of the highest threshold at or below the job's priority; a GPU count, not ids;
    no GPUs at all hides them even in images that expose every GPU by default."""
    ex = executor(tmp_path, None, priority_classes={0: "batch", 5: "urgent"})
    manifest = yaml.safe_load(ex.render(request(tmp_path, gpus=gpus, labels=labels)))
    valid(manifest)
    pod = pod_spec(manifest)
    assert pod.get("priorityClassName") == cls
    limits = pod["containers"][0].get("resources", {}).get("limits", {})
    assert limits.get("nvidia.com/gpu") == (str(len(gpus)) if gpus else None)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == (None if gpus else "void")
    assert "activeDeadlineSeconds" not in manifest["spec"]  # no timeout label: no deadline
    assert pod["automountServiceAccountToken"] is False


_ENV_NAMES = st.text(string.ascii_letters + "_", min_size=1, max_size=12).map(str.upper)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.text(min_size=1, max_size=120),
    argv=st.lists(st.text(max_size=40), min_size=1, max_size=5),
    env=st.dictionaries(_ENV_NAMES, st.text(max_size=40), max_size=4),
    job=st.integers(min_value=1, max_value=10**9),
    memory=st.none() | st.floats(min_value=0.01, max_value=4096),
)
@example(key="\x85", argv=["\x85", "\u2028"], env={"A": "é\x00"}, job=1, memory=None)  # YAML breaks
def test_fuzzed_requests_render_valid_jobs(tmp_path: Path, key, argv, env, job, memory) -> None:
    """Whatever key, argv and env a request has, the Job is valid and its name a DNS-1123
    label; the key survives whole in the annotation and the label finds it."""
    ex = executor(tmp_path, None)
    req = request(
        tmp_path,
        key=key,
        argv=argv,
        env=env,
        memory_gb=memory,
        log_path=str(tmp_path / "x.log"),
        labels={"nightshift.job": str(job), "nightshift.attempt": "1"},
    )
    manifest = yaml.safe_load(ex.render(req))
    valid(manifest)
    assert manifest["metadata"]["name"] == job_name(key)
    assert len(job_name(key)) <= 63
    assert manifest["metadata"]["labels"][KEY_LABEL] == key_label(key)
    assert manifest["metadata"]["annotations"]["nightshift.io/key"] == key
    assert pod_spec(manifest)["containers"][0]["command"] == argv


def test_distinct_keys_get_distinct_names() -> None:
    """Keys that clean to the same text are told apart by a hash."""
    keys = ["attempt-1", "Attempt-1", "attempt_1", "attempt 1", "a" * 80, "a" * 81, "ß", "-"]
    assert len({job_name(k) for k in keys}) == len(keys)
    assert len({key_label(k) for k in keys}) == len(keys)


def test_no_image_names_the_setting(tmp_path: Path) -> None:
    """A pod always runs an image: the operator learns which setting gives one."""
    ex = executor(tmp_path, None, image=None)
    with pytest.raises(OperatorError, match=r"executor\.kubernetes\.image"):
        ex.render(request(tmp_path))


def test_a_host_path_off_every_pvc_is_refused(tmp_path: Path) -> None:
    """A pod sees no host folders: a path the run needs must be on one of the PVCs."""
    ex = executor(tmp_path, None)
    req = request(tmp_path, mounts=[{"source": "/home/me/data", "target": "/home/me/data"}])
    with pytest.raises(OperatorError, match=r"/home/me/data.*executor\.kubernetes\.mounts"):
        ex.render(req)


def test_bad_env_name_and_user_are_refused(tmp_path: Path) -> None:
    """What Kubernetes cannot express is an operator error before any call."""
    ex = executor(tmp_path, None)
    with pytest.raises(OperatorError, match="environment variable name"):
        ex.render(request(tmp_path, env={"A=B": "1"}))
    with pytest.raises(OperatorError, match="numeric uid"):
        ex.render(request(tmp_path, user="alice"))
    pod = pod_spec(yaml.safe_load(ex.render(request(tmp_path, user="1000:100"))))
    assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 100}


# ----------------------------------------------------------------------------- the life of a run
def read(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def test_run_lifecycle_copies_logs_once_across_a_restart(kube, tmp_path: Path) -> None:
    """start → pending → running (output copied as it comes, never twice, also by a restarted
    executor that asks the API for more than it needs) → exited with the container's code."""
    ex = executor(tmp_path, kube.url)
    req = request(tmp_path, gpus=[0])
    handle = ex.start(req)
    assert handle["kind"] == "kubernetes" and handle["name"] == "nightshift-attempt-1"
    (sent,) = kube.created
    valid(sent)
    assert ex.poll(handle) == RunStatus(state="running", detail="pending: no pod yet")
    kube.set_pod_pending(handle["name"])
    status = ex.poll(handle)
    assert status.state == "running" and "not scheduled (Unschedulable" in (status.detail or "")

    kube.set_pod_running(handle["name"])
    kube.append_log(handle["name"], ["epoch 0", "loss 1.0"])
    assert ex.poll(handle) == RunStatus(state="running")
    kube.append_log(handle["name"], ["loss 0.9"])
    assert "loss 0.9" in ex.logs(handle, tail=1)
    assert read(req.log_path) == ["epoch 0", "loss 1.0", "loss 0.9"]

    restarted = executor(tmp_path, kube.url)  # a new process: only the runs folder is shared
    assert restarted.find(req.key) == handle
    kube.append_log(handle["name"], ["loss 0.8"])
    assert restarted.poll(handle).state == "running"
    assert ex.poll(handle).state == "running"  # the old one polls too: nothing twice
    kube.append_log(handle["name"], ["done"])
    kube.finish(handle["name"], exit_code=3)
    assert restarted.poll(handle) == RunStatus(state="exited", exit_code=3)
    assert read(req.log_path) == ["epoch 0", "loss 1.0", "loss 0.9", "loss 0.8", "done"]
    asked = [q for m, p, q in kube.requests if p.endswith("/log")]
    assert all(q["timestamps"] == "true" and q["container"] == "main" for q in asked)
    assert "sinceSeconds" not in asked[0] and all("sinceSeconds" in q for q in asked[1:])


def test_start_is_idempotent_on_the_key(kube, tmp_path: Path, monkeypatch) -> None:
    """Two starts of one key make one Job, also when the second races past the lookup (409)."""
    ex = executor(tmp_path, kube.url)
    req = request(tmp_path)
    first = ex.start(req)
    assert ex.start(req) == first
    other = executor(tmp_path, kube.url)
    monkeypatch.setattr(other, "find", lambda key: None)  # it looked before the first created
    assert other.start(req) == first
    assert len(kube.created) == 1 and len(kube.jobs) == 1


def test_a_foreign_job_with_the_name_is_not_taken_over(kube, tmp_path: Path) -> None:
    """A Job of the same name that is not this key's is reported, never adopted."""
    ex = executor(tmp_path, kube.url)
    foreign = ex.manifest(request(tmp_path))
    foreign["metadata"]["annotations"]["nightshift.io/key"] = "someone-else"
    foreign["metadata"]["labels"][KEY_LABEL] = "someone-else"
    assert kube.handle("POST", "/apis/batch/v1/namespaces/default/jobs", {}, foreign)[0] == 201
    with pytest.raises(SkillFailed, match="kubectl delete job"):
        ex.start(request(tmp_path))


def test_find_reattaches_by_label(kube, tmp_path: Path) -> None:
    """A restarted agent finds each run's Job by its key, whatever the key looks like."""
    ex = executor(tmp_path, kube.url)
    odd = "Attempt 12 / retry:" + "x" * 70
    h1 = ex.start(request(tmp_path))
    h2 = ex.start(request(tmp_path, key=odd))
    again = executor(tmp_path, kube.url)
    assert again.find("attempt-1") == h1
    assert again.find(odd) == h2 and h2["key"] == odd
    assert again.find("attempt-2") is None


def test_stop_deletes_with_propagation_and_remembers_why(kube, tmp_path: Path) -> None:
    """stop copies the output, deletes the Job (foreground: its pod goes first) and says it was
    stopped; later polls, by any process, say the same although the Job is gone."""
    ex = executor(tmp_path, kube.url)
    req = request(tmp_path)
    handle = ex.start(req)
    kube.set_pod_running(handle["name"])
    kube.append_log(handle["name"], ["last words"])
    status = ex.stop(handle, grace_s=2)
    assert status.state == "exited" and status.signal == 15
    assert "stopped by nightshift" in (status.detail or "")
    (deletion,) = kube.deletions
    assert deletion["propagationPolicy"] == "Foreground" and deletion["gracePeriodSeconds"] == 2
    assert read(req.log_path) == ["last words"]
    assert executor(tmp_path, kube.url).poll(handle) == status
    assert ex.stop(handle) == status  # safe when gone
    assert ex.cleanup(handle) == []


def test_stop_leaves_an_ended_job_and_cleanup_removes_it(kube, tmp_path: Path) -> None:
    """An ended Job keeps its exit code for later polls; cleanup deletes it and the exit code is
    still known afterwards."""
    ex = executor(tmp_path, kube.url)
    handle = ex.start(request(tmp_path))
    kube.set_pod_running(handle["name"])
    kube.finish(handle["name"], exit_code=0)
    done = RunStatus(state="exited", exit_code=0)
    assert ex.stop(handle) == done and kube.deletions == []
    assert ex.cleanup(handle) == []
    assert [d["propagationPolicy"] for d in kube.deletions] == ["Foreground"]
    assert not kube.jobs
    assert ex.poll(handle) == done


def test_cleanup_waits_for_a_foreground_deletion(tmp_path: Path) -> None:
    """cleanup returns once the Job (and so its pod) is gone; meanwhile a poll says stopped."""
    _deps()
    from fake_kube import FakeKube

    with FakeKube(gc_after_s=1.0) as kube:
        ex = executor(tmp_path, kube.url)
        handle = ex.start(request(tmp_path))
        kube.set_pod_running(handle["name"])
        t0 = time.monotonic()
        assert ex.cleanup(handle, grace_s=1) == []
        assert time.monotonic() - t0 >= 0.9 and not kube.jobs
        assert ex.poll(handle).signal == 15


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ("deadline_exceeded", "deadline exceeded"),
        ("evict", "evicted (Evicted: The node was low on resource: memory.)"),
        ("lose_pod", "its pod is gone"),
    ],
)
def test_deadline_eviction_and_node_loss_are_lost(kube, tmp_path: Path, event, expected) -> None:
    """What the cluster did to the run, not what the program did: lost, with the reason, so
    recovery relaunches it as it would a local run whose supervisor vanished."""
    ex = executor(tmp_path, kube.url)
    handle = ex.start(request(tmp_path, labels={"nightshift.timeout_s": "60"}))
    kube.set_pod_running(handle["name"])
    getattr(kube, event)(handle["name"])
    status = ex.poll(handle)
    assert status.state == "lost", status
    assert expected in (status.detail or "")
    if event == "deadline_exceeded":
        assert "activeDeadlineSeconds (60 s" in (status.detail or "")


def test_a_job_deleted_behind_our_back_is_lost(kube, tmp_path: Path) -> None:
    """Gone without a record (kubectl delete): lost, as when a local run's supervisor vanishes."""
    ex = executor(tmp_path, kube.url)
    handle = ex.start(request(tmp_path))
    kube.set_pod_running(handle["name"])
    kube.handle("DELETE", f"/apis/batch/v1/namespaces/default/jobs/{handle['name']}", {}, None)
    status = ex.poll(handle)
    assert status.state == "lost" and "is gone" in (status.detail or "")


@pytest.mark.parametrize(
    ("code", "reason", "message", "expected"),
    [
        (137, "OOMKilled", None, RunStatus(state="exited", exit_code=137, signal=9)),
        (
            128,
            "StartError",
            'exec: "trian.py": executable file not found in $PATH',
            RunStatus(state="exited", exit_code=127),
        ),
        (1, "Error", None, RunStatus(state="exited", exit_code=1)),
    ],
)
def test_container_end_reasons(kube, tmp_path: Path, code, reason, message, expected) -> None:
    """The kubelet's reasons read like the local and Docker executors' outcomes: OOM is SIGKILL
    with a detail that says so; a missing program is 127 (diagnosed as import_or_env)."""
    ex = executor(tmp_path, kube.url)
    handle = ex.start(request(tmp_path))
    kube.set_pod_running(handle["name"])
    kube.finish(handle["name"], exit_code=code, reason=reason, message=message)
    status = ex.poll(handle)
    assert (status.state, status.exit_code, status.signal) == (
        expected.state,
        expected.exit_code,
        expected.signal,
    )
    if reason == "OOMKilled":
        assert "out of memory" in (status.detail or "")
    if reason == "StartError":
        assert "command not found" in (status.detail or "")


def test_kueue_queue_label_and_admission(tmp_path: Path) -> None:
    """With a queue configured the Job carries Kueue's label; while Kueue keeps it suspended the
    run is running-but-queued, and it runs once admitted."""
    _deps()
    from fake_kube import FakeKube

    with FakeKube(kueue=True) as kube:
        ex = executor(tmp_path, kube.url, kueue_queue="team-a")
        handle = ex.start(request(tmp_path))
        assert kube.created[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        status = ex.poll(handle)
        assert status.state == "running" and "waiting for Kueue" in (status.detail or "")
        kube.admit(handle["name"])
        kube.set_pod_running(handle["name"])
        assert ex.poll(handle) == RunStatus(state="running")


# ----------------------------------------------------------------------------------- failures
def test_api_down_is_an_operator_error_naming_the_url(kube, tmp_path: Path) -> None:
    """503 from the API server, or nothing listening: one line for the operator, no client
    traceback."""
    ex = executor(tmp_path, kube.url)
    handle = ex.start(request(tmp_path))
    kube.down = True
    for call in (lambda: ex.poll(handle), lambda: ex.find("attempt-1"), lambda: ex.stop(handle)):
        with pytest.raises(OperatorError, match=f"{kube.url}.*unavailable"):
            call()
    kube.down = False
    kube.stop()
    t0 = time.monotonic()
    with pytest.raises(
        OperatorError, match=f"cannot reach the Kubernetes API server at {kube.url}"
    ):
        ex.poll(handle)
    with pytest.raises(OperatorError, match="cannot reach"):
        executor(tmp_path, kube.url).start(request(tmp_path, key="attempt-2"))
    assert time.monotonic() - t0 < 10


def test_forbidden_says_which_permissions(kube, tmp_path: Path) -> None:
    """403 names the RBAC rules the executor needs."""
    ex = executor(tmp_path, kube.url)
    kube.forbidden = {"create"}
    with pytest.raises(OperatorError, match=r"403 Forbidden.*pods/log get"):
        ex.start(request(tmp_path))


def test_rejected_job_and_missing_namespace(kube, tmp_path: Path) -> None:
    """The API server's 422 (here a service account name it refuses) and a namespace that does
    not exist both speak to the operator."""
    ex = executor(tmp_path, kube.url, service_account="Not_A_Name")
    with pytest.raises(OperatorError, match="422 Invalid.*serviceAccountName"):
        ex.start(request(tmp_path))
    assert kube.rejected and not kube.created
    ex = executor(tmp_path, kube.url, namespace="ml")
    with pytest.raises(OperatorError, match="namespace 'ml' does not exist"):
        ex.start(request(tmp_path))


def test_handle_of_another_executor_is_refused(tmp_path: Path) -> None:
    """An attempt started by Docker cannot be polled as a Kubernetes Job."""
    ex = executor(tmp_path, None)
    with pytest.raises(OperatorError, match="'docker' executor"):
        ex.poll({"kind": "docker", "key": "attempt-1"})


def test_unloadable_kubeconfig_is_an_operator_error(tmp_path: Path) -> None:
    """No api_url and a kubeconfig that is not there: the setting to fix, not a traceback."""
    _deps()
    ex = KubernetesExecutor(
        tmp_path / "runs",
        settings=settings_for(None, kubeconfig=str(tmp_path / "missing.yaml")),
    )
    with pytest.raises(OperatorError, match=r"executor\.kubernetes\.kubeconfig"):
        ex.find("attempt-1")


def test_a_queued_job_becomes_a_kubernetes_job_through_the_loop(
    kube, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """executor.kind: kubernetes end to end up to the API: the loop claims the job and creates a
    Job whose pod runs the image's python3 in the code folder, mounts the code and job folders
    from the PVCs that hold them, takes its priority class and a deadline past timeout_min."""
    import json

    import yaml

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client

    from conftest import REPO, write_spec

    spec_path = write_spec(tmp_path, steps=20)
    spec = yaml.safe_load(spec_path.read_text())
    spec["timeout_min"] = 30
    spec_path.write_text(yaml.safe_dump(spec))
    for key, value in {
        "KIND": "kubernetes",
        "KUBERNETES__API_URL": kube.url,
        "KUBERNETES__IMAGE": "registry.local/train:1",
        "KUBERNETES__MOUNTS": json.dumps(
            [
                {"claim": "scratch", "mount_path": str(tmp_path)},
                {"claim": "home", "mount_path": str(home)},
                {"claim": "code", "mount_path": str(REPO), "read_only": True},
            ]
        ),
        "KUBERNETES__PRIORITY_CLASSES": json.dumps({"0": "batch", "5": "urgent"}),
    }.items():
        monkeypatch.setenv(f"NIGHTSHIFT_EXECUTOR__{key}", value)
    w = Wiring.load()
    job_id = Client(w).submit(str(spec_path), priority=5)
    w.engine.tick()
    att = w.store.attempts(job_id)[0]
    assert att.state == "running", (att.state, att.outcome, att.handle, w.store.job(job_id).reason)
    manifest = kube.job(att.handle["name"])
    pod = pod_spec(manifest)
    main = pod["containers"][0]
    assert main["command"][0] == "python3" and main["image"] == "registry.local/train:1"
    mounted = {m["mountPath"] for m in main.get("volumeMounts", [])}
    assert {str(tmp_path), str(home), str(REPO)} <= mounted
    assert pod["priorityClassName"] == "urgent"
    assert manifest["spec"]["activeDeadlineSeconds"] == 30 * 60 + 300
    assert manifest["spec"]["backoffLimit"] == 0


def test_doctor_checks_the_cluster(kube, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`nightshift doctor` asks the API server what the executor will (a list of Jobs by label),
    and fails with the address when it does not answer."""
    import json

    from conftest import nightshift

    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__KIND", "kubernetes")
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__KUBERNETES__API_URL", kube.url)
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__KUBERNETES__IMAGE", "registry.local/train:1")
    checks = {c["area"]: c for c in json.loads(nightshift("doctor", "--json").stdout)}
    assert checks["cluster: kubernetes"]["status"] == "ok", checks["cluster: kubernetes"]
    assert checks["store"]["status"] == "ok" and checks["store"]["detail"].startswith("sqlite")
    kube.down = True
    done = nightshift("doctor", "--json")
    checks = {c["area"]: c for c in json.loads(done.stdout)}
    assert checks["cluster: kubernetes"]["status"] == "fail" and done.returncode == 5
    assert kube.url in checks["cluster: kubernetes"]["detail"]
