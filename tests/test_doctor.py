"""`nightshift doctor` as a user runs it (a subprocess): it names the endpoint and model, checks
that they answer (`/models`, one chat completion with a tool) and that the tool call comes back
parsed, reports the GPU probe, dockerd, the daemon and the approval channels with the fix, never
prints the key or a traceback, and exits 0 when nothing failed and 5 when something must be
fixed. The model is the scripted server on loopback; dockerd and the daemon are stand-ins on Unix
sockets."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from nightshift.agent.doors.daemon import DaemonLock
from nightshift.evals.openai_stub import StubServer, http_error, reply_text, reply_tools, tool_call

from conftest import nightshift

KEY = "sk-doctor-5d41402abc"


@pytest.fixture
def env(home: Path, tmp_path: Path) -> dict[str, str]:
    """Two declared GPUs, and no dockerd where the doctor looks."""
    inventory = home / "inventory.yaml"
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "memory_used_mib": 10}
    inventory.write_text(yaml.safe_dump({"gpus": [gpu, dict(gpu)]}))
    return {
        "NIGHTSHIFT_GPU__PROBE": "inventory",
        "NIGHTSHIFT_GPU__INVENTORY": str(inventory),
        "DOCKER_HOST": f"unix://{tmp_path / 'no-docker.sock'}",
    }


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    r = nightshift("doctor", "--json", *args, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    checks = {c["area"]: c for c in json.loads(r.stdout)}
    return r.returncode, checks, r.stdout + r.stderr


def ping(req: dict[str, Any]) -> dict[str, Any]:
    if "response_format" in req:  # the constrained-output probe: not offered by this server
        return http_error(400, "response_format is not supported")
    assert [t["function"]["name"] for t in req["tools"]] == ["doctor_ping"]
    return reply_tools(tool_call("doctor_ping", {"word": "pong"}))


def with_model(env: dict[str, str], srv: StubServer, model: str = "stub-model") -> dict[str, str]:
    return {
        **env,
        "OPENAI_BASE_URL": srv.base_url,
        "NIGHTSHIFT_MODEL": model,
        "OPENAI_API_KEY": KEY,
    }


def test_without_an_endpoint_it_says_what_works_and_what_to_set(env):
    rc, checks, _ = doctor(env)
    assert rc == 0
    model = checks["model endpoint"]
    assert model["status"] == "warn" and "OPENAI_BASE_URL" in model["fix"]
    assert "NIGHTSHIFT_MODEL" in model["fix"] and "goal files" in model["detail"]
    assert checks["GPU probe"]["status"] == "ok", checks["GPU probe"]
    assert checks["GPU probe"]["detail"].startswith("inventory: 2 GPU(s)")
    assert checks["dockerd"]["status"] == "info" and "not reachable" in checks["dockerd"]["detail"]
    assert checks["daemon"]["status"] == "info" and "not running" in checks["daemon"]["detail"]
    assert checks["approval channels"]["detail"].startswith("none configured")


def test_a_working_endpoint_answers_and_its_tool_calls_parse(env):
    with StubServer(ping) as srv:
        rc, checks, out = doctor(with_model(env, srv))
        table = nightshift("doctor", env=with_model(env, srv))
    assert rc == 0, out
    assert checks["model endpoint"]["detail"].startswith(f"stub-model at {srv.base_url}")
    assert "API key set (env OPENAI_API_KEY)" in checks["model endpoint"]["detail"]
    assert checks["GET /models"]["status"] == "ok"
    assert checks["chat completion"]["status"] == "ok"
    assert checks["tool calls"] == {
        "area": "tool calls",
        "status": "ok",
        "detail": 'parsed: doctor_ping({"word": "pong"}); mode: tool calls parsed by the server',
        "fix": "",
    }
    paths = [r.path for r in srv.requests]
    assert paths == ["/v1/models", *["/v1/chat/completions"] * 3] * 2  # ping, 2 forms
    assert checks["constrained output"]["status"] == "info"
    assert "not offered" in checks["constrained output"]["detail"]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in srv.requests)
    assert KEY not in out + table.stdout + table.stderr
    assert table.returncode == 0 and "nothing failed" in table.stdout


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (reply_text("pong"), "no tool call came back (text instead: 'pong')"),
        (reply_tools(tool_call("doctor_ping", '{"word": "po')), "not a JSON object"),
        ({"content": None, "finish_reason": "stop"}, "no tool call came back (content null)"),
    ],
    ids=["text", "cut-json", "null"],
)
def test_tool_calls_that_do_not_come_back_parsed_fail_with_the_fix(env, reply, says):
    with StubServer(lambda req: reply) as srv:
        rc, checks, _ = doctor(with_model(env, srv))
    assert rc == 5
    assert checks["chat completion"]["status"] == "ok"
    assert checks["tool calls"]["status"] == "fail" and says in checks["tool calls"]["detail"]
    assert "--jinja" in checks["tool calls"]["fix"]


def test_an_endpoint_that_does_not_answer_fails_without_a_traceback(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, checks, _ = doctor(
        {**env, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "NIGHTSHIFT_MODEL": "m"}
    )
    assert rc == 5
    assert checks["GET /models"]["status"] == "fail"
    assert "cannot reach" in checks["GET /models"]["detail"]
    assert checks["tool calls"]["detail"].startswith("not tried")


def test_a_model_the_server_does_not_list_is_a_warning(env):
    with StubServer(ping, model="other-model") as srv:
        rc, checks, _ = doctor(with_model(env, srv, model="stub-model"))
    assert rc == 0
    assert checks["GET /models"]["status"] == "warn"
    assert "other-model" in checks["GET /models"]["detail"]


def test_a_500_from_the_chat_endpoint_fails(env):

    with StubServer(lambda req: http_error(500, "boom")) as srv:
        rc, checks, _ = doctor(with_model(env, srv))
    assert rc == 5 and "HTTP 500" in checks["chat completion"]["detail"]


@contextmanager
def unix_server(path: Path, answer: bytes) -> Iterator[None]:
    """A Unix socket that answers every connection with `answer`."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(4096)
                    conn.sendall(answer)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        srv.close()


def test_dockerd_and_the_daemon_when_they_are_there(env, home, tmp_path):
    """A dockerd that answers /_ping and a daemon holding its lock and serving its socket."""
    docker_sock = tmp_path / "docker.sock"
    lock = DaemonLock(home)
    lock.acquire()
    try:
        with (
            unix_server(docker_sock, b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK"),
            unix_server(home / "api.sock", b""),
        ):
            rc, checks, _ = doctor({**env, "DOCKER_HOST": f"unix://{docker_sock}"})
    finally:
        lock.release()
    assert rc == 0
    assert checks["dockerd"]["status"] == "ok" and str(docker_sock) in checks["dockerd"]["detail"]
    assert checks["daemon"]["status"] == "ok"
    assert "accepts connections" in checks["daemon"]["detail"]


def test_no_dockerd_fails_when_the_docker_executor_is_configured(env):
    rc, checks, _ = doctor({**env, "NIGHTSHIFT_EXECUTOR__KIND": "docker"})
    assert rc == 5
    assert (
        checks["dockerd"]["status"] == "fail"
        and "systemctl start docker" in checks["dockerd"]["fix"]
    )


def test_a_bad_configuration_is_a_failed_check_not_a_traceback(env, home):
    (home / "config.yaml").write_text("llm: {timeout_s: -1}\n")
    rc, checks, _ = doctor(env)
    assert rc == 5 and list(checks) == ["config"]
    assert "llm.timeout_s" in checks["config"]["detail"]
