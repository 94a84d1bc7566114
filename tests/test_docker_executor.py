"""The Docker executor against a real, private dockerd (see docker_service.py): busybox for the
plumbing, a Python image for one real training run. GPUs cannot be had here, so GPU requests are
checked in what Docker recorded for a created container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.gate import Gate
from nightshift.policies.model import Limits, load_policy
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import OperatorError, PolicyDenied
from nightshift.runtime.executors.docker_executor import DockerExecutor, container_name
from nightshift.runtime.executors.executor import LaunchRequest, RunStatus
from nightshift.runtime.store.db import Store
from nightshift.skills.base import SkillContext
from nightshift.skills.launch_container import launch_container

from conftest import REPO

if TYPE_CHECKING:
    from docker_service import DockerEngine

# One worker runs every test of the group: the service starts once (pytest-xdist, loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("docker")]
pytest_plugins = ["docker_service"]  # the private dockerd and the test images

GIB = 1024**3
T0 = datetime(2026, 12, 2, 3, 0)


@pytest.fixture
def ex(docker_engine: DockerEngine, tmp_path: Path):
    """A DockerExecutor on the private engine, with its own runs folder."""
    executor = DockerExecutor(tmp_path / "runs", base_url=docker_engine.base_url, stop_grace_s=2)
    yield executor
    executor.close()


def request(tmp_path: Path, key: str, image: str, argv: list[str], **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        key=key,
        argv=argv,
        cwd=kw.pop("cwd", "/"),
        image=image,
        log_path=str(tmp_path / "logs" / f"{key}.log"),
        **kw,
    )


def wait_ended(ex: DockerExecutor, handle: dict[str, Any], timeout_s: float = 60) -> RunStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = ex.poll(handle)
        if status.state != "running":
            return status
        assert time.monotonic() < deadline, f"{handle['key']} still running after {timeout_s} s"
        time.sleep(0.1)


def wait_for_output(ex: DockerExecutor, handle: dict[str, Any], text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in ex.logs(handle):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {handle['key']}'s log"
        time.sleep(0.1)


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_and_output_reach_the_log_file(ex, busybox_image, tmp_path, code) -> None:
    """poll reports the container's exit code; stdout and stderr land in the run's log file."""
    req = request(
        tmp_path,
        f"exit-{code}",
        busybox_image,
        ["sh", "-c", f"echo to-stdout; echo to-stderr >&2; exit {code}"],
    )
    handle = ex.start(req)
    status = wait_ended(ex, handle)
    assert (status.state, status.exit_code, status.signal) == ("exited", code, None)
    log = Path(req.log_path).read_text()
    assert sorted(log.splitlines()) == ["to-stderr", "to-stdout"]
    assert ex.logs(handle) == log


def test_long_lines_and_unterminated_output_are_copied_whole(ex, busybox_image, tmp_path) -> None:
    """Docker splits lines over 16 KiB; the log file still holds exactly what was written."""
    req = request(
        tmp_path,
        "long-lines",
        busybox_image,
        ["sh", "-c", "head -c 40000 /dev/zero | tr '\\0' x; echo; printf 'no newline'"],
    )
    assert wait_ended(ex, ex.start(req)).exit_code == 0
    assert Path(req.log_path).read_text() == "x" * 40000 + "\nno newline"


def test_env_working_dir_and_user_are_applied(ex, busybox_image, tmp_path) -> None:
    """env, cwd (the working dir inside the container) and user reach the process."""
    req = request(
        tmp_path,
        "env-cwd-user",
        busybox_image,
        ["sh", "-c", 'echo "FOO=$FOO KEY=$NIGHTSHIFT_RUN_KEY"; pwd; id -u; id -g'],
        cwd="/work/dir",
        env={"FOO": "bar baz"},
        user="1234:2345",
    )
    status = wait_ended(ex, ex.start(req))
    assert status.exit_code == 0
    assert Path(req.log_path).read_text().splitlines() == [
        "FOO=bar baz KEY=env-cwd-user",
        "/work/dir",
        "1234",
        "2345",
    ]


def test_stop_kills_a_run_that_ignores_sigterm_after_the_grace(ex, busybox_image, tmp_path) -> None:
    """A run that traps SIGTERM is killed after the grace; the status says nightshift did it."""
    req = request(
        tmp_path,
        "stop-ignores-term",
        busybox_image,
        ["sh", "-c", 'trap "" TERM; echo ready; while true; do sleep 0.2; done'],
    )
    handle = ex.start(req)
    wait_for_output(ex, handle, "ready")
    started = time.monotonic()
    status = ex.stop(handle, grace_s=2)
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 15
    assert (status.state, status.exit_code, status.signal) == ("exited", 137, 9)
    assert "SIGKILL after SIGTERM and 2 s of grace" in (status.detail or "")
    assert ex.poll(handle) == status
    assert ex.stop(handle) == status  # stopping an ended run changes nothing


def test_stop_ends_a_run_that_honours_sigterm_without_waiting(ex, busybox_image, tmp_path) -> None:
    """Docker's init forwards SIGTERM, so a plain process ends at once, not after the grace."""
    handle = ex.start(request(tmp_path, "stop-honours-term", busybox_image, ["sleep", "600"]))
    assert ex.poll(handle).state == "running"
    started = time.monotonic()
    status = ex.stop(handle, grace_s=30)
    assert time.monotonic() - started < 10
    assert (status.exit_code, status.signal, status.detail) == (
        143,
        15,
        "stopped by nightshift (SIGTERM)",
    )


def test_start_is_idempotent_on_the_key(ex, docker_engine, busybox_image, tmp_path) -> None:
    """A re-run graph node starting the same key gets the first container; nothing runs twice."""
    req = request(tmp_path, "idempotent", busybox_image, ["sh", "-c", "echo once; sleep 1"])
    first = ex.start(req)
    assert ex.start(req) == first
    assert wait_ended(ex, first).exit_code == 0
    assert ex.start(req) == first
    assert wait_ended(ex, first).exit_code == 0
    found = docker_engine.client.containers.list(
        all=True, filters={"label": "nightshift.key=idempotent"}
    )
    assert [c.id for c in found] == [first["container_id"]]
    assert Path(req.log_path).read_text() == "once\n"


def test_reattach_from_a_new_process_copies_each_line_once(
    ex, docker_engine, busybox_image, tmp_path
) -> None:
    """A restarted daemon re-attaches by label; two processes copying output never duplicate."""
    n = 60
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    req = request(
        tmp_path,
        "reattach",
        busybox_image,
        [
            "sh",
            "-c",
            f"i=0; while [ $i -lt {n} ]; do echo out-$i; echo err-$i >&2; "
            "i=$((i+1)); sleep 0.02; done; "
            "until [ -e /ctl/go ]; do sleep 0.05; done; echo after-go; exit 7",
        ],
        mounts=[{"source": str(ctl), "target": "/ctl", "read_only": False}],
    )
    handle = ex.start(req)  # this executor copies the output from a background thread
    script = (
        "import json, pathlib, sys, time\n"
        "from nightshift.runtime.executors.docker_executor import DockerExecutor\n"
        "ex = DockerExecutor(sys.argv[1], base_url=sys.argv[2], follow_logs=False)\n"
        "h = ex.find(sys.argv[3])\n"
        "first = ex.poll(h).state\n"
        "pathlib.Path(sys.argv[4], 'go').touch()  # the run waits for this before it ends\n"
        "while (s := ex.poll(h)).state == 'running':\n"
        "    ex.logs(h, tail=5)\n"
        "    time.sleep(0.05)\n"
        "print(json.dumps({'handle': h, 'first': first, 'last': s.model_dump()}))\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(ex.runs_dir),
            docker_engine.base_url,
            "reattach",
            str(ctl),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["handle"] == handle
    assert out["first"] == "running"
    assert (out["last"]["state"], out["last"]["exit_code"]) == ("exited", 7)
    assert ex.poll(handle).exit_code == 7
    lines = Path(req.log_path).read_text().splitlines()
    expected = [f"{s}-{i}" for i in range(n) for s in ("out", "err")] + ["after-go"]
    assert sorted(lines) == sorted(expected)


def test_a_removed_container_is_lost(ex, docker_engine, busybox_image, tmp_path) -> None:
    """A container removed behind nightshift's back is reported lost, not running or exited."""
    handle = ex.start(request(tmp_path, "removed", busybox_image, ["true"]))
    wait_ended(ex, handle)
    docker_engine.client.containers.get(handle["container_id"]).remove()
    status = ex.poll(handle)
    assert status.state == "lost" and "is gone" in (status.detail or "")
    assert ex.find("removed") is None


def test_gpus_limits_and_mounts_are_what_docker_records(
    ex, docker_engine, busybox_image, tmp_path
) -> None:
    """No GPUs here: check what Docker recorded, and that starting fails with the fix."""
    code, data = tmp_path / "code", tmp_path / "data"
    code.mkdir()
    data.mkdir()
    req = request(
        tmp_path,
        "gpu-request",
        busybox_image,
        ["sh", "-c", "true"],
        cwd="/code",
        gpus=[0, 2],
        memory_gb=1.5,
        shm_gb=0.25,
        pids_limit=64,
        user="1000",
        env={"A": "1"},
        labels={"nightshift.job": "7"},
        mounts=[
            {"source": str(code), "target": "/code"},
            {"source": str(data), "target": "/data", "read_only": False},
        ],
    )
    handle = ex.create(req)
    info = docker_engine.client.api.inspect_container(handle["container_id"])
    host, config = info["HostConfig"], info["Config"]
    assert host["DeviceRequests"] == [
        {
            "Driver": "nvidia",
            "Count": 0,
            "DeviceIDs": ["0", "2"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert (host["Memory"], host["ShmSize"], host["PidsLimit"]) == (
        int(1.5 * GIB),
        256 * 1024**2,
        64,
    )
    assert (host["NetworkMode"], host["Init"]) == ("none", True)
    assert [
        (m["Type"], m["Source"], m["Target"], m.get("ReadOnly", False)) for m in host["Mounts"]
    ] == [("bind", str(code), "/code", True), ("bind", str(data), "/data", False)]
    assert (config["Cmd"], config["WorkingDir"], config["User"]) == (
        ["sh", "-c", "true"],
        "/code",
        "1000",
    )
    assert "A=1" in config["Env"] and "NIGHTSHIFT_RUN_KEY=gpu-request" in config["Env"]
    assert config["Labels"] == {
        "nightshift.key": "gpu-request",
        "nightshift.job": "7",
        "nightshift.log_path": req.log_path,
    }
    assert info["Name"] == f"/{container_name('gpu-request')}"
    assert ex.poll(handle).state == "lost"  # created, never started

    with pytest.raises(OperatorError, match="NVIDIA Container Toolkit"):
        ex.start(req)
    assert ex.find("gpu-request") is None


def test_mounts_and_network_at_run_time(ex, busybox_image, tmp_path) -> None:
    """Read-only mounts stay read-only, and the default network mode leaves only loopback."""
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    out.mkdir()
    (code / "train.sh").write_text("echo from-code\n")
    req = request(
        tmp_path,
        "mounts",
        busybox_image,
        [
            "sh",
            "-c",
            (
                "sh /code/train.sh; ls /sys/class/net; "
                "if touch /code/x 2>/dev/null; then echo code-writable; else echo code-read-only; fi; "
                "echo result > /out/r.txt"
            ),
        ],
        mounts=[
            {"source": str(code), "target": "/code", "read_only": True},
            {"source": str(out), "target": "/out", "read_only": False},
        ],
    )
    assert wait_ended(ex, ex.start(req)).exit_code == 0
    assert Path(req.log_path).read_text().splitlines() == ["from-code", "lo", "code-read-only"]
    assert (out / "r.txt").read_text() == "result\n"
    assert not (code / "x").exists()


def test_out_of_memory_is_reported(ex, busybox_image, tmp_path) -> None:
    """A run that outgrows memory_gb ends with exit code 137 and a detail naming the OOM kill."""
    req = request(
        tmp_path,
        "oom",
        busybox_image,
        ["sh", "-c", 'a=xxxxxxxxxxxxxxxx; while true; do a="$a$a"; done'],
        memory_gb=1 / 32,
    )
    status = wait_ended(ex, ex.start(req))
    assert (status.exit_code, status.signal) == (137, None)
    assert "out of memory" in (status.detail or "")


def test_missing_program_exits_127(ex, busybox_image, tmp_path) -> None:
    """A command that is not in the image ends the run with 127 and says so, as locally."""
    req = request(tmp_path, "no-program", busybox_image, ["no-such-program", "--flag"])
    status = wait_ended(ex, ex.start(req))
    assert status.exit_code == 127 and "not found" in (status.detail or "")
    assert "no-such-program" in Path(req.log_path).read_text()


def test_unknown_image_is_an_operator_error(ex, tmp_path) -> None:
    """Images are never pulled: a missing one is named, with the fix, and nothing is created."""
    req = request(tmp_path, "no-image", "nightshift-test/not-built:1", ["true"])
    with pytest.raises(
        OperatorError,
        match=r"nightshift-test/not-built:1.*build or load it; "
        "images are not pulled",
    ):
        ex.start(req)
    assert ex.find("no-image") is None


def test_unreachable_engine_names_the_socket(docker_sdk, tmp_path) -> None:
    """With no engine behind the socket, the operator is told which socket and what to do."""
    sock = tmp_path / "nothing.sock"
    ex = DockerExecutor(tmp_path / "runs", base_url=f"unix://{sock}")
    with pytest.raises(OperatorError, match=rf"unix://{sock}.*start dockerd"):
        ex.find("anything")


def test_render_is_the_equivalent_docker_run_line(tmp_path) -> None:
    """A dry run shows the whole `docker run` line, secrets masked; it needs no engine."""
    ex = DockerExecutor(tmp_path / "runs", base_url="unix:///run/x/docker.sock", pids_limit=512)
    req = LaunchRequest(
        key="attempt-12",
        argv=["python", "train.py", "--lr", "0.1"],
        cwd="/workspace",
        image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        gpus=[0, 2],
        memory_gb=8,
        shm_gb=0.5,
        user="1000:1000",
        log_path="/var/log/ns/attempt-12.log",
        env={"WANDB_API_KEY": "s3cret", "SEED": "1"},
        labels={"nightshift.job": "3"},
        mounts=[
            {"source": "/srv/code", "target": "/workspace"},
            {"source": "/srv/out", "target": "/out", "read_only": False},
        ],
    )
    assert ex.render(req) == (
        "[docker attempt-12] docker -H unix:///run/x/docker.sock run --detach "
        "--name nightshift-attempt-12 --label nightshift.key=attempt-12 "
        "--label nightshift.job=3 --init --network none --gpus '\"device=0,2\"' --memory 8g "
        "--shm-size 512m --pids-limit 512 --user 1000:1000 --workdir /workspace "
        "--mount type=bind,source=/srv/code,target=/workspace,readonly "
        "--mount type=bind,source=/srv/out,target=/out "
        "-e 'WANDB_API_KEY=***' -e SEED=1 -e NIGHTSHIFT_RUN_KEY=attempt-12 "
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime python train.py --lr 0.1"
        "  (output copied to /var/log/ns/attempt-12.log)"
    )
    assert "s3cret" not in ex.render(req)
    with pytest.raises(OperatorError, match="names no image"):
        ex.render(req.model_copy(update={"image": None}))
    with pytest.raises(OperatorError, match="absolute path inside the container"):
        ex.render(req.model_copy(update={"cwd": "workspace"}))


def test_container_names_are_valid_and_distinct() -> None:
    """Keys become valid container names; keys that clean up alike still get distinct names."""
    assert container_name("attempt-12") == "nightshift-attempt-12"
    odd = [container_name(k) for k in ("job 1/a", "job-1-a", "job:1:a")]
    assert odd[1] == "nightshift-job-1-a" and len(set(odd)) == 3
    assert all(n.replace("-", "").replace("_", "").replace(".", "").isalnum() for n in odd)


def test_launch_container_skill_through_the_policy_gate(
    docker_engine, busybox_image, home, tmp_path
) -> None:
    """The skill launches through the executor; a forbidden image or mount never gets there."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("payload\n")
    policy = load_policy(None).model_copy(
        update={
            "limits": Limits(
                allowed_images=["nightshift-test/*"], allowed_mount_roots=[str(tmp_path)]
            )
        }
    )
    engine = PolicyEngine(policy)
    store = Store(f"sqlite:///{home / 'ns.db'}")
    audit = AuditLog(store, home / "audit.anchor", clock=lambda: T0)
    gate = Gate(engine, audit, Approvals(store, audit, engine=engine), store)
    settings = Settings(home=str(home))
    ex = DockerExecutor(settings.runs_dir, base_url=docker_engine.base_url)

    def call(call_id: str, **args: Any) -> Any:
        args = {
            "argv": ["cat", "/data/in.txt"],
            "cwd": "/",
            "image": busybox_image,
            "mounts": [{"source": str(data), "target": "/data"}],
            **args,
        }
        ctx_args = {
            "store": store,
            "settings": settings,
            "now": T0,
            "call_id": call_id,
            "principal": "agent",
            "executor": ex,
            "policy_limits": engine.limits(),
        }
        return gate.call(SkillContext(**ctx_args), launch_container, args)

    try:
        dry = call("c-dry", dry_run=True)
        assert dry.dry_run and dry.handle is None
        assert dry.rendered.startswith(f"[docker launch-c-dry] docker -H {docker_engine.base_url}")
        assert ex.find("launch-c-dry") is None

        result = call("c-ok")
        assert result.key == "launch-c-ok" and result.handle["kind"] == "docker"
        assert wait_ended(ex, result.handle).exit_code == 0
        assert (settings.runs_dir / "launch-c-ok.log").read_text() == "payload\n"
        assert call("c-ok").handle == result.handle  # a re-run node launches nothing new

        with pytest.raises(PolicyDenied, match="limits.allowed_images"):
            call("c-image", image="docker.io/someone/miner:latest")
        with pytest.raises(PolicyDenied, match="limits.allowed_mount_roots"):
            call("c-mount", mounts=[{"source": "/etc", "target": "/data"}])
        assert ex.find("launch-c-image") is None and ex.find("launch-c-mount") is None
    finally:
        ex.close()


@pytest.mark.timeout(1200)  # a cold cache runs debootstrap first (about a minute here)
def test_training_run_in_a_python_image(ex, python_image, digits_csv, tmp_path) -> None:
    """One real training run in a Python image: code and data read-only, outputs written."""
    # The script looks for sklearn/datasets/data/digits.csv.gz on its import path: a folder
    # holding just that file, on PYTHONPATH, is enough (no scikit-learn in the image).
    pylib, out = tmp_path / "pylib", tmp_path / "out"
    (pylib / "sklearn" / "datasets" / "data").mkdir(parents=True)
    shutil.copy(digits_csv, pylib / "sklearn" / "datasets" / "data" / "digits.csv.gz")
    out.mkdir()
    req = request(
        tmp_path,
        "train",
        python_image,
        [
            "python3",
            "/code/train_numpy.py",
            "--steps",
            "100",
            "--checkpoint-every",
            "50",
            "--checkpoint-dir",
            "/out/ckpt",
            "--metrics-file",
            "/out/metrics.jsonl",
        ],
        cwd="/out",
        env={"PYTHONPATH": "/pylib"},
        memory_gb=1,
        shm_gb=0.25,
        user=f"{os.getuid()}:{os.getgid()}",
        mounts=[
            {"source": str(REPO / "examples"), "target": "/code"},
            {"source": str(pylib), "target": "/pylib"},
            {"source": str(out), "target": "/out", "read_only": False},
        ],
    )
    status = wait_ended(ex, ex.start(req), timeout_s=180)
    log = Path(req.log_path).read_text()
    assert status.exit_code == 0, log
    assert log.count("nightshift-args: ") == 1 and "done: loss" in log
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records[:-1]] == list(range(1, 101))
    assert records[-1]["event"] == "done" and records[-1]["eval_accuracy"] > 0.8
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == [
        "step_00000050.npz",
        "step_00000100.npz",
    ]
