"""The daemon's API on its Unix socket: JSON lines in and out, the caller named by the kernel.

Two ways in: the server object in this process on a temporary socket (the protocol: garbage,
floods, silent clients, fields that try to name the caller, a skill that raises), and a real
`nightshift daemon` with the real CLI as its client (`api.mode: client`, since here both run as
one uid; tests/test_multi_user.py runs them as different OS users)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api_server import ApiServer
from nightshift.runtime.config import ApiSettings, ExecutorSettings, GpuSettings, Settings
from nightshift.skills.base import SkillContext, skill

from conftest import REPO, write_spec

ME = pwd.getpwuid(os.geteuid()).pw_name


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nightshift.agent.doors.cli", *args]


def short_dir() -> Path:
    """A folder for a socket: sockaddr_un paths end at 107 bytes, pytest's can be longer."""
    return Path(tempfile.mkdtemp(prefix="ns-api-", dir="/tmp"))


def talk(path: Path, *messages: bytes | dict, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Send each message on one connection and read one reply line for each."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        f = s.makefile("rb")
        out = []
        for m in messages:
            s.sendall(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n")
            out.append(json.loads(f.readline()))
        return out


def queued_spec(tmp_path: Path, name: str = "waits-for-gpu") -> Path:
    """The quickstart asking for a GPU this machine has not got: it stays queued."""
    return write_spec(tmp_path, steps=50, name=name, resources={"gpus": 1}, file=f"{name}.yaml")


class NoInput(BaseModel):
    pass


class Nothing(BaseModel):
    pass


@skill("boom", capability="read")
def boom(ctx: SkillContext, inp: NoInput) -> Nothing:
    """Fails the way a bug does."""
    raise ZeroDivisionError("division by zero")


# In-process server ---------------------------------------------------------------------------


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    run = short_dir()
    w = Wiring(
        Settings(
            home=str(home),
            gpu=GpuSettings(probe="none"),
            api=ApiSettings(socket=str(run / "api.sock"), idle_timeout_s=1.0),
            # The test process connects as the daemon's own uid: jobs run as the daemon's.
            executor=ExecutorSettings(run_as="daemon"),
        ),
        server=True,
    )
    api = ApiServer(w)
    assert api.start()
    yield api
    api.stop()
    shutil.rmtree(run)


def test_list_jobs_and_submit_answer_as_the_peer(server: ApiServer, tmp_path: Path) -> None:
    spec = queued_spec(tmp_path)
    submitted, listed, me = talk(
        server.path,
        {"op": "call", "skill": "submit_job", "args": {"spec_path": str(spec)}},
        {"op": "call", "skill": "list_jobs", "args": {}},
        {"op": "whoami"},
    )
    assert submitted["kind"] == "result", submitted
    job_id = submitted["result"]["job_id"]
    (job,) = listed["result"]["jobs"]
    assert job["id"] == job_id and job["owner"] == ME and job["state"] == "queued"
    assert me["result"]["principal"] == ME and me["result"]["uid"] == os.geteuid()
    start = server.w.audit.events(action="skill.start")
    assert {e.actor for e in start} == {ME}


def test_garbage_floods_and_names_are_refused_one_line_each(server: ApiServer) -> None:
    """Not JSON, not an object, an unknown op, a field naming the caller: each one error reply
    on a connection that goes on working; the audit names the peer, never the claimed name."""
    replies = talk(
        server.path,
        b"this is not json\n",
        b"\xff\xfe\n",
        b"[1, 2]\n",
        {"op": "format_disk"},
        {"op": "call", "skill": "list_jobs", "args": {}, "principal": "bob"},
        {"op": "approvals.vote", "approval_id": 1, "approve": True, "user": "bob"},
        {"op": "confirm", "approval_id": 1, "yes": True},
        {"op": "whoami"},
    )
    *errors, last = replies
    assert all(r["kind"] == "error" and r["error"]["exit_code"] == 2 for r in errors), errors
    assert "not a JSON request" in errors[0]["error"]["message"]
    assert "unknown op" in errors[3]["error"]["message"]
    assert (
        "'principal' is not accepted: who asks is the peer's uid" in errors[4]["error"]["message"]
    )
    assert "'user' is not accepted" in errors[5]["error"]["message"]
    assert "no call asks one here" in errors[6]["error"]["message"]
    assert last["result"]["principal"] == ME
    refused = server.w.audit.events(action="api.refused")
    assert len(refused) == 6 and {e.actor for e in refused} == {ME}
    assert any('"principal": "bob"' in e.payload["request"] for e in refused)
    assert not server.w.audit.events(action="approval.vote")


def test_an_oversized_request_is_refused_and_the_server_goes_on(server: ApiServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(server.path))
        flood = threading.Thread(
            target=lambda: _send_quietly(s, b"{" + b" " * (2 << 20) + b"}\n"), daemon=True
        )
        flood.start()
        reply = json.loads(s.makefile("rb").readline())
        flood.join(10)
    assert reply["kind"] == "error" and "longer than 1048576 bytes" in reply["error"]["message"]
    assert talk(server.path, {"op": "whoami"})[0]["kind"] == "result"


def _send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:
        pass


def test_silent_and_trickling_clients_do_not_hold_up_others(server: ApiServer) -> None:
    """One client connects and says nothing, another sends a byte at a time: a third is
    answered at once, and the first two are hung up on after the idle timeout (1 s here)."""
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(server.path))
    trickle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    trickle.connect(str(server.path))
    try:
        t0 = time.monotonic()
        assert talk(server.path, {"op": "whoami"})[0]["kind"] == "result"
        assert time.monotonic() - t0 < 1.0
        for ch in b'{"op": ':  # slower than the whole-request deadline
            try:
                trickle.send(bytes([ch]))
            except OSError:
                break
            time.sleep(0.2)
        for s in (silent, trickle):
            s.settimeout(5)
            assert s.recv(100) == b""  # closed by the server
    finally:
        silent.close()
        trickle.close()


def test_a_skill_that_raises_is_one_error_reply(server: ApiServer, monkeypatch) -> None:
    """Anything a skill raises reaches the client as one line (SkillFailed, exit 1), the
    traceback stays in the daemon's log, and the next request is served."""
    from nightshift.skills import builtin

    monkeypatch.setitem(builtin.BUILTINS, "boom", boom)
    said: list[str] = []
    server.say = said.append
    failed, unknown, fine = talk(
        server.path,
        {"op": "call", "skill": "boom"},
        {"op": "call", "skill": "no_such_skill"},
        {"op": "whoami"},
    )
    assert failed["error"] == {
        "type": "SkillFailed",
        "message": "ZeroDivisionError: division by zero",
        "exit_code": 1,
        "job_ids": [],
    }
    assert unknown["error"]["type"] == "UnknownSkill" and unknown["error"]["exit_code"] == 2
    assert fine["kind"] == "result"
    assert any("Traceback" in s for s in said)
    result = server.w.audit.events(action="skill.result")
    assert result[-1].actor == ME and result[-1].payload["ok"] is False


def test_a_call_that_needs_approval_comes_back_with_the_request(
    server: ApiServer, tmp_path: Path
) -> None:
    (sub,) = talk(
        server.path,
        {"op": "call", "skill": "submit_job", "args": {"spec_path": str(queued_spec(tmp_path))}},
    )
    job_id = sub["result"]["job_id"]
    (reply,) = talk(server.path, {"op": "call", "skill": "cancel_job", "args": {"job_id": job_id}})
    err = reply["error"]
    assert err["type"] == "ApprovalRequired" and err["exit_code"] == 4
    assert err["approval"]["args"]["job_id"] == job_id and err["approval"]["requester"] == ME
    assert err["call_id"].startswith(f"{ME}/")  # call ids are each user's own
    # The requester may not approve it, whatever it puts in the request.
    (vote,) = talk(
        server.path, {"op": "approvals.vote", "approval_id": err["approval_id"], "approve": True}
    )
    assert vote["error"]["type"] == "PolicyDenied" and "requester never counts" in str(vote)


def test_the_library_client_goes_through_the_socket(server: ApiServer, tmp_path: Path) -> None:
    """`nightshift.agent.doors.api.Client` in a shared install: the daemon's gate, as this uid; it
    cannot name another principal."""
    from nightshift.agent.doors.api import Client
    from nightshift.runtime.errors import ApprovalRequired, BadArguments

    w = Wiring(Settings(api=ApiSettings(socket=str(server.path), mode="client")))
    client = Client(w)
    job_id = client.submit(str(queued_spec(tmp_path)))
    assert server.w.store.job(job_id).owner == ME
    with pytest.raises(ApprovalRequired) as info:
        client.call("cancel_job", {"job_id": job_id})
    assert server.w.approvals.get(info.value.approval_id).requester == ME
    with pytest.raises(BadArguments, match="names no one"):
        Client(w, principal="bob")


# A real daemon, the real CLI -----------------------------------------------------------------


@dataclass
class Served:
    home: Path
    sock: Path
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            cli(*args),
            cwd=REPO,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _base_env(home: Path, sock: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env.update(
        NIGHTSHIFT_HOME=str(home),
        NIGHTSHIFT_API__SOCKET=str(sock),
        NIGHTSHIFT_GPU__PROBE="none",
        NIGHTSHIFT_LOOP__POLL_INTERVAL_S="0.1",
        COLUMNS="200",
        # A root daemon serving a socket outside its home runs jobs as their submitters (the
        # OS accounts of test_jobs_as_submitters.py); these tests are about the socket.
        NIGHTSHIFT_EXECUTOR__RUN_AS="daemon",
    )
    return env


def wait_for_socket(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon ended:\n{log.read_text()}")
        try:
            talk(path, {"op": "whoami"}, timeout=2)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no API on {path}:\n{log.read_text()}")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Served]:
    """`nightshift daemon` on a fresh home, serving a socket where a killed daemon left one."""
    root = tmp_path_factory.mktemp("served")
    run = short_dir()
    home, sock, log = root / "home", run / "api.sock", root / "daemon.log"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # bound, never listened on, closed: what a SIGKILL leaves
    stale.close()
    env = _base_env(home, sock)
    with open(log, "w") as out:
        proc = subprocess.Popen(cli("daemon"), cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        wait_for_socket(sock, proc, log)
        # Same uid as the daemon here, so the CLI is its client only when asked to be.
        yield Served(home, sock, {**env, "NIGHTSHIFT_API__MODE": "client"}, proc, log)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(run, ignore_errors=True)


def test_the_daemon_owns_its_home_and_serves_the_socket(daemon: Served) -> None:
    assert daemon.home.stat().st_mode & 0o777 == 0o700
    assert daemon.sock.stat().st_mode & 0o777 == 0o666
    assert (daemon.home / "keys").stat().st_mode & 0o777 == 0o700
    for name in ("nightshift.db", "audit.anchor"):
        assert not (daemon.home / name).stat().st_mode & 0o022, name
    assert f"API on {daemon.sock}" in daemon.log.read_text()


def test_a_second_daemon_on_a_served_socket_is_refused(daemon: Served, tmp_path: Path) -> None:
    env = {**daemon.env, "NIGHTSHIFT_HOME": str(tmp_path / "other")}
    r = subprocess.run(
        cli("daemon", "--max-ticks", "1"), cwd=REPO, env=env, capture_output=True, text=True
    )
    assert r.returncode == 5 and "another process serves" in r.stderr, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert talk(daemon.sock, {"op": "whoami"})[0]["kind"] == "result"  # still serving


def test_cli_commands_go_through_the_socket(daemon: Served, tmp_path: Path) -> None:
    spec = queued_spec(tmp_path, "cli-through-socket")
    r = daemon.run("submit", str(spec), "--json")
    assert r.returncode == 0, r.stderr
    (job_id,) = json.loads(r.stdout)["job_ids"]
    r = daemon.run("jobs", "--json")
    row = next(j for j in json.loads(r.stdout) if j["id"] == job_id)
    assert row["state"] == "queued" and row["attempts"] == 0 and row["why"]
    r = daemon.run("show", str(job_id), "--json")
    assert json.loads(r.stdout)["owner"] == ME
    r = daemon.run("status")
    assert r.returncode == 0 and "cli-through-socket" in r.stdout
    r = daemon.run("logs", str(job_id))
    assert r.returncode == 0 and "no attempt yet" in r.stdout
    r = daemon.run("whoami", "--json")
    assert json.loads(r.stdout)["mode"] == "client" and json.loads(r.stdout)["principal"] == ME
    # A command the daemon does not serve says so, and what to do, in one line.
    r = daemon.run("audit", "verify")
    assert r.returncode == 5 and "the daemon serves: skill, submit" in r.stderr, r.stderr
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.stderr


def test_a_sweep_starts_through_the_socket_and_the_daemon_queues_its_trials(
    daemon: Served, tmp_path: Path
) -> None:
    """`nightshift sweep` in a shared install: start_sweep runs in the daemon as the caller,
    and the daemon's loop queues the trials (they wait for a GPU here) under the caller."""
    spec = queued_spec(tmp_path, "sweep-through-socket")
    text = yaml.safe_load(spec.read_text())
    text["search"] = {"lr": {"type": "log_uniform", "low": 0.001, "high": 0.1}}
    text["sweep"] = {"trials": 4, "max_parallel": 2, "pruner": "none"}
    spec.write_text(yaml.safe_dump(text))
    r = daemon.run("sweep", str(spec), "--name", "remote-lr", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sweep"] == "remote-lr"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = json.loads(daemon.run("jobs", "--json").stdout)
        trials = [j for j in rows if j["name"] == "sweep-through-socket"]
        if len(trials) == 2:
            break
        time.sleep(0.3)
    assert len(trials) == 2, rows
    shown = json.loads(daemon.run("show", str(trials[0]["id"]), "--json").stdout)
    assert shown["owner"] == ME and shown["group"] == "remote-lr"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["skill", "no_such_skill"], 2, "no skill named 'no_such_skill'"),
        (["skill", "list_jobs", "--arg", "limit=abc"], 2, "limit"),
        (["skill", "list_jobs", "--arg", "bogus=1"], 2, "unknown argument(s) bogus"),
        (["show", "999"], 2, "no job 999"),
        (["cancel", "999"], 2, "no job 999"),
        (["retry", "999"], 2, "no job 999"),
        (["approvals", "show", "999"], 2, "no approval with id 999"),
        (["approve", "999"], 2, "no approval with id 999"),
    ],
)
def test_errors_through_the_socket_are_one_line_and_their_exit_code(
    daemon: Served, argv: list[str], code: int, says: str
) -> None:
    r = daemon.run(*argv)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert says in r.stderr and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_a_failing_skill_through_the_socket_is_exit_1(daemon: Served, tmp_path: Path) -> None:
    r = daemon.run("submit", str(queued_spec(tmp_path, "not-failed")), "--json")
    (job_id,) = json.loads(r.stdout)["job_ids"]
    r = daemon.run("retry", str(job_id))  # it is queued, not failed: retry_job fails
    assert r.returncode == 1 and "not failed" in r.stderr, r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_no_daemon_is_exit_5_naming_the_socket(tmp_path: Path) -> None:
    sock = tmp_path / "nobody.sock"
    env = {**_base_env(tmp_path / "home", sock), "NIGHTSHIFT_API__MODE": "client"}
    r = subprocess.run(cli("jobs"), cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 5 and f"no nightshift daemon answers on {sock}" in r.stderr, r.stderr


def test_the_requester_confirms_at_a_terminal_through_the_socket(
    daemon: Served, tmp_path: Path
) -> None:
    """`nightshift cancel N` at a terminal, as a client: the daemon asks on the same connection,
    the requester answers y there, and the job is cancelled; the vote is the peer's own."""
    r = daemon.run("submit", str(queued_spec(tmp_path, "confirm-me")), "--json")
    (job_id,) = json.loads(r.stdout)["job_ids"]
    master, slave = os.openpty()
    proc = subprocess.Popen(
        cli("cancel", str(job_id)),
        cwd=REPO,
        env=daemon.env,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            (listed,) = talk(daemon.sock, {"op": "approvals.list"})
            mine = [a for a in listed["result"] if a["args"].get("job_id") == job_id]
            if mine:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("no approval appeared")
        # Another connection cannot answer for the requester.
        (other,) = talk(daemon.sock, {"op": "confirm", "approval_id": mine[0]["id"], "yes": True})
        assert other["error"]["exit_code"] == 2
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert "[y/N]" in out and f"job {job_id}: queued → cancelled" in out
    (shown,) = talk(daemon.sock, {"op": "approvals.show", "approval_id": mine[0]["id"]})
    row = shown["result"]
    assert row["state"] == "executed" and row["requested_via"] == "terminal"
    assert row["votes"] == [
        {**row["votes"][0], "principal": ME, "approve": True, "confirmation": True}
    ]


def test_policy_principal_is_refused_wherever_it_is_set(home: Path, tmp_path: Path) -> None:
    """The old override of who you are: refused from the environment and from a config file,
    naming the field, where it came from and the fix; embedded mode is the kernel's user."""
    from conftest import nightshift

    r = nightshift("approvals", "list", env={"NIGHTSHIFT_POLICY__PRINCIPAL": "bob"})
    assert r.returncode == 5, r.stderr
    assert "policy.principal is no longer a setting (from env NIGHTSHIFT_POLICY__PRINCIPAL)" in (
        r.stderr.replace("\n", " ")
    )
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policy:\n  principal: bob\n")
    r = nightshift("whoami", "--config", str(cfg))
    assert r.returncode == 5 and f"(from {cfg})" in r.stderr.replace("\n", ""), r.stderr
    r = nightshift("whoami", "--json", env={"USER": "bob", "LOGNAME": "bob", "LNAME": "bob"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) | {"principal": ME, "mode": "embedded"} == json.loads(r.stdout)


def test_logs_follow_streams_through_the_socket(daemon: Served, tmp_path: Path) -> None:
    """`nightshift logs -f` as a client: the daemon reads the log (its user's file) and sends
    the lines as the run writes them; the follow ends with the job."""
    spec = write_spec(
        tmp_path,
        steps=200,
        name="followed",
        file="followed.yaml",
        env={"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.04"},
    )
    (job_id,) = json.loads(daemon.run("submit", str(spec), "--json").stdout)["job_ids"]
    proc = subprocess.Popen(
        cli("logs", str(job_id), "-f", "-n", "1000"),
        cwd=REPO,
        env=daemon.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)  # it ends with the job
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    steps = [x for x in lines if x.startswith("step ")]
    assert lines[0] == "── attempt 1 ──", lines
    assert len(steps) >= 3 and lines[-1].startswith("done:"), lines


def test_the_daemon_takes_its_state_back_and_refuses_a_policy_others_can_write(
    tmp_path: Path,
) -> None:
    from nightshift.agent.doors.daemon import own_state
    from nightshift.runtime.config import PolicySettings
    from nightshift.runtime.errors import OperatorError

    home = tmp_path / "state"
    home.mkdir(mode=0o755)
    (home / "nightshift.db").write_text("")
    (home / "nightshift.db").chmod(0o666)
    own_state(Settings(home=str(home)))
    assert home.stat().st_mode & 0o777 == 0o700
    assert (home / "nightshift.db").stat().st_mode & 0o777 == 0o644
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    policy.chmod(0o666)
    with pytest.raises(OperatorError, match="can be changed by others"):
        own_state(Settings(home=str(home), policy=PolicySettings(file=str(policy))))
    policy.chmod(0o644)
    own_state(Settings(home=str(home), policy=PolicySettings(file=str(policy))))


def test_a_web_token_through_the_socket_is_the_peers_own(server: ApiServer) -> None:
    """`nightshift web token` in a shared install: the daemon makes the token for the uid the
    kernel reports, keeps its digest, audits it without the secret; a request cannot name
    another user, and --revoke ends it."""
    from nightshift.agent.doors.web import tokens

    made, forged = talk(
        server.path,
        {"op": "web.token", "action": "issue"},
        {"op": "web.token", "action": "issue", "user": "someone-else"},
    )
    assert made["kind"] == "result", made
    secret = made["result"]["token"]
    assert made["result"]["user"] == ME and tokens.user_of(server.w.store, secret) == ME
    assert forged["kind"] == "error"
    (event,) = server.w.audit.events(action="web.token.issue")
    assert event.actor == ME and secret not in json.dumps(event.payload)
    (revoked,) = talk(server.path, {"op": "web.token", "action": "revoke"})
    assert revoked["result"]["revoked"] == [made["result"]["id"]]
    assert tokens.user_of(server.w.store, secret) is None
