"""Jobs run as the people who submit them. A shared install with real OS users: the daemon starts
as root, alice and bob submit on its socket, and alice's job is hostile — it tries to read the
audit key and the store, write the store, the config and the policy, read and kill bob's run,
kill its own supervisor, and vote for alice's pending cancel of bob's job through the socket.
Every attempt fails, bob's job finishes, and what alice's job wrote is alice's.

Before this, the daemon ran every job as its own user: the same job approved alice's request as
the daemon's principal, rewrote the config to a policy of its own, and read the key."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_multi_user import SITE, Account, _add_user, _python_for, boot, readable_copy, unavailable

# What alice's job tries; each entry is "blocked: <error>" or "DONE" in the report it writes.
HOSTILE = r"""
import json, os, signal, socket, subprocess, sys, time
state, runs, policy, sock, site, python, bob_uid, bob_job, out, flag = sys.argv[1:11]
report = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": sorted(os.environ)}

def attempt(name, fn):
    try:
        fn()
        report[name] = "DONE"
    except OSError as exc:
        report[name] = f"blocked: {exc.strerror}"

attempt("read_key", lambda: open(os.path.join(state, "keys", "audit.key"), "rb").read())
attempt("read_store", lambda: open(os.path.join(state, "nightshift.db"), "rb").read(16))
attempt("write_store", lambda: open(os.path.join(state, "nightshift.db"), "ab").close())
attempt("write_config", lambda: open(os.path.join(state, "config.yaml"), "a").close())
attempt("write_policy", lambda: open(policy, "a").close())
attempt("list_runs", lambda: os.listdir(runs))
bob_ws = os.path.join(runs, f"job-{bob_job}")
attempt("read_bob_log", lambda: open(os.path.join(bob_ws, "attempt-1.log"), "rb").read())
attempt("write_bob_folder", lambda: open(os.path.join(bob_ws, "x"), "w").close())
attempt("kill_supervisor", lambda: os.kill(os.getppid(), signal.SIGKILL))
# Its own cgroup, made by root: it may neither raise its limit nor move itself out.
lines = [l.split(":", 2) for l in open("/proc/self/cgroup").read().splitlines()]
mem = next((p for _, c, p in lines if "memory" in c.split(",")), None)
cg = f"/sys/fs/cgroup/memory{mem}" if mem else "/sys/fs/cgroup" + lines[-1][2]
report["cgroup"] = cg
limit = "memory.limit_in_bytes" if mem else "memory.max"
attempt("raise_memory_limit", lambda: open(os.path.join(cg, limit), "w").write("max"))
home = os.path.dirname(os.path.dirname(cg))
attempt("leave_cgroup", lambda: open(os.path.join(home, "cgroup.procs"), "w").write(str(os.getpid())))
bob_procs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if os.stat(f"/proc/{pid}").st_uid == int(bob_uid):
                bob_procs.append(int(pid))
        except OSError:
            pass
report["bob_processes"] = len(bob_procs)
for pid in bob_procs:
    attempt(f"kill_bob_{len([k for k in report if k.startswith('kill_bob')])}",
            lambda pid=pid: os.kill(pid, signal.SIGKILL))
cli = [python, "-c", f"import site; site.addsitedir({site!r}); from nightshift.agent.doors.cli import main; main()"]
env = {"PATH": "/usr/bin:/bin", "HOME": "/", "NIGHTSHIFT_API__SOCKET": sock, "NIGHTSHIFT_HOME": os.path.dirname(out) + "/nshome"}
who = subprocess.run(cli + ["whoami", "--json"], env=env, capture_output=True, text=True)
report["whoami"] = json.loads(who.stdout) if who.returncode == 0 else who.stderr
listed = subprocess.run(cli + ["approvals", "list", "--json"], env=env, capture_output=True, text=True)
report["votes"] = []
for row in json.loads(listed.stdout or "[]"):
    r = subprocess.run(cli + ["approve", str(row["id"])], env=env, capture_output=True, text=True)
    report["votes"].append([row["id"], r.returncode, r.stderr.strip()[-200:]])
json.dump(report, open(out, "w"))
open(flag, "w").close()  # done: bob's run may finish
"""


# bob's run: training until alice's job has done its worst (at most a minute).
BOB = (
    "import os, time\n"
    "end = time.monotonic() + 60\n"
    "while not os.path.exists({flag!r}) and time.monotonic() < end:\n"
    "    time.sleep(0.2)\n"
    "print('bob finished')"
)


@dataclass
class Shared:
    root: Path
    python: str
    site: str
    alice: Account
    bob: Account
    state: Path
    runs: Path
    sock: Path
    policy: Path
    log: Path

    def run(self, who: Account, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.python, "-c", boot(self.site), *args],
            cwd=who.home,
            env=who.env(NIGHTSHIFT_API__SOCKET=str(self.sock)),
            user=who.uid,
            group=who.gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, who: Account, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [self.python, "-c", boot(self.site), *args],
            cwd=who.home,
            env=who.env(NIGHTSHIFT_API__SOCKET=str(self.sock)),
            user=who.uid,
            group=who.gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def submit(
        self,
        who: Account,
        name: str,
        command: list[str],
        *,
        code: Path | None = None,
        data: list[dict[str, Any]] | None = None,
    ) -> int:
        """`who` submits a job running `command` in `code` (default: the shared folder)."""
        spec: dict[str, Any] = {
            "name": name,
            "code": {"path": str(code or self.root / "shared")},
            "command": command,
            "parameters": {},
            "resources": {"gpus": 0, "expected_duration_min": 1},
            "retries": 0,
        }
        if data is not None:
            spec["data"] = data
        path = self.root / "shared" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        path.chmod(0o644)
        r = self.run(who, "submit", str(path), "--json")
        assert r.returncode == 0, (r.stdout, r.stderr, self.log.read_text())
        return int(json.loads(r.stdout)["job_ids"][0])

    def job(self, job_id: int) -> sqlite3.Row:
        con = sqlite3.connect(self.state / "nightshift.db")
        con.row_factory = sqlite3.Row
        return con.execute("select * from job where id = ?", (job_id,)).fetchone()

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 90) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.job(job_id)["state"]
            if state in states:
                return str(state)
            time.sleep(0.2)
        row = self.job(job_id)
        raise AssertionError(
            f"job {job_id} never reached {states}: {row['state']} ({row['reason']})\n"
            + self.log.read_text()
        )


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    if os.geteuid() != 0:
        unavailable("a daemon that runs jobs as their submitters starts as root")
    if not (shutil.which("useradd") and shutil.which("userdel")):
        unavailable("useradd/userdel are not installed (Debian: the passwd package)")
    tag = secrets.token_hex(3)
    names = {role: f"ns-{role}-{tag}" for role in ("alice", "bob")}
    made: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="ns-sub-", dir="/tmp"))
    proc: subprocess.Popen | None = None
    try:
        root.chmod(0o755)
        accounts = {}
        for role, name in names.items():
            acct = _add_user(name)
            made.append(name)
            acct.home = root / role
            acct.home.mkdir(mode=0o700)
            os.chown(acct.home, acct.uid, acct.gid)
            accounts[role] = acct
        site = SITE
        python = _python_for(accounts["alice"], site)
        if python is None:
            site = readable_copy(root / "pkgs")
            python = _python_for(accounts["alice"], site)
        if python is None:
            unavailable(f"no Python {sys.version_info[:2]} that another user can run")
        assert python is not None
        (root / "shared").mkdir(mode=0o755)
        (root / "flags").mkdir()
        (root / "flags").chmod(0o1777)
        (root / "shared" / "hostile.py").write_text(HOSTILE)
        (root / "shared" / "hostile.py").chmod(0o644)
        policy = root / "shared" / "policy.yaml"
        policy.write_text((resources.files("nightshift.policies") / "default.yaml").read_text())
        policy.chmod(0o644)
        run_dir = root / "run"
        run_dir.mkdir(mode=0o755)
        state, runs, sock, log = root / "state", root / "runs", run_dir / "api.sock", root / "d.log"
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(root),
            "NIGHTSHIFT_HOME": str(state),
            "NIGHTSHIFT_API__SOCKET": str(sock),
            "NIGHTSHIFT_POLICY__FILE": str(policy),
            "NIGHTSHIFT_EXECUTOR__RUNS_DIR": str(runs),
            "NIGHTSHIFT_GPU__PROBE": "none",
            "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.1",
            "NIGHTSHIFT_LOOP__CPU_SLOTS": "4",
            # A secret of the daemon's that no job may see.
            "NIGHTSHIFT_TEST_SECRET": "daemon-secret",
        }
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [python, "-c", boot(site), "daemon"], cwd=root, env=env, stdout=out, stderr=out
            )
        end = time.monotonic() + 90
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the daemon did not serve {sock}:\n{log.read_text()}")
            time.sleep(0.1)
        yield Shared(
            root,
            python,
            site,
            accounts["alice"],
            accounts["bob"],
            state,
            runs,
            sock,
            policy,
            log,
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_a_hostile_job_reaches_nothing_of_the_daemons_nor_bobs(shared: Shared) -> None:
    s = shared
    bob_job = s.submit(
        s.bob,
        "bob-train",
        [s.python, "-c", BOB.format(flag=str(s.root / "flags" / "alice-done"))],
    )
    assert s.wait_state(bob_job, ("running",)) == "running"
    # alice asks to cancel bob's job; the approval waits for someone other than alice.
    asker = s.popen(s.alice, "cancel", str(bob_job))
    try:
        end = time.monotonic() + 60
        while not _pending(s, bob_job):
            assert time.monotonic() < end, s.log.read_text()
            time.sleep(0.2)
        report = s.root / "alice" / "report.json"
        alice_job = s.submit(
            s.alice,
            "alice-probe",
            [
                s.python,
                "hostile.py",
                str(s.state),
                str(s.runs),
                str(s.policy),
                str(s.sock),
                s.site,
                s.python,
                str(s.bob.uid),
                str(bob_job),
                str(report),
                str(s.root / "flags" / "alice-done"),
            ],
        )
        assert s.wait_state(alice_job, ("succeeded", "failed")) == "succeeded", _log(s, alice_job)
    finally:
        asker.kill()
        asker.wait(10)
    got: dict[str, Any] = json.loads(report.read_text())
    # The job is alice, with her groups, and none of the daemon's environment.
    assert (got["uid"], got["gid"]) == (s.alice.uid, s.alice.gid)
    assert 0 not in got["groups"]
    assert "NIGHTSHIFT_TEST_SECRET" not in got["env"] and "NIGHTSHIFT_HOME" not in got["env"]
    # Nothing of the daemon's, nothing of bob's.
    for what in (
        "read_key",
        "read_store",
        "write_store",
        "write_config",
        "write_policy",
        "list_runs",
        "read_bob_log",
        "write_bob_folder",
        "kill_supervisor",
        "raise_memory_limit",
        "leave_cgroup",
    ):
        assert got[what].startswith("blocked"), (what, got[what])
    assert f"/nightshift/{_digest(s.runs)}.attempt-" in got["cgroup"], got["cgroup"]
    assert got["bob_processes"] >= 1, "bob's run was not running while alice's job looked"
    kills = [v for k, v in got.items() if k.startswith("kill_bob")]
    assert kills and all(v.startswith("blocked") for v in kills), kills
    # On the socket the job is alice and no more: her vote on her own request does not count.
    assert got["whoami"]["principal"] == s.alice.name, got["whoami"]
    assert got["votes"] and all(code == 3 for _, code, _ in got["votes"]), got["votes"]
    assert _pending(s, bob_job)
    # bob's job finished; what alice's job wrote is alice's.
    assert s.wait_state(bob_job, ("succeeded", "failed", "cancelled")) == "succeeded"
    ws = s.runs / f"job-{alice_job}"
    st = ws.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (s.alice.uid, s.alice.gid, 0o700)
    log = ws / "attempt-1.log"
    assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (s.alice.uid, 0o600)
    assert report.stat().st_uid == s.alice.uid
    assert s.runs.stat().st_mode & 0o777 == 0o711 and s.runs.stat().st_uid == 0


def test_files_a_call_names_are_read_as_its_caller(shared: Shared) -> None:
    """Why: a client pointed config_validator at the daemon's config.yaml and got its keys and
    lines back. The daemon now reads what a call names as the caller: a file only root may read
    is "permission denied" for alice, whatever the skill, and none of its text comes back; her
    own file reads as before."""
    s = shared
    secret = s.root / "shared" / "root-only.yaml"
    secret.write_text("api_key: SECRET-7f3a\nname: x\n")
    secret.chmod(0o600)
    daemon_config = s.state / "config.yaml"  # read at start only: a later copy changes nothing
    daemon_config.write_text("api_key: SECRET-7f3a\n")
    daemon_config.chmod(0o600)
    calls = [
        ("config_validator", f"path={secret}"),
        ("config_validator", f"path={daemon_config}"),
        ("gpu_health_check", f"from_file={secret}"),
        ("submit_job", f"spec_path={secret}"),
    ]
    for skill, arg in calls:
        r = s.run(s.alice, "skill", skill, "--arg", arg, "--json")
        assert "SECRET-7f3a" not in r.stdout + r.stderr, (skill, r.stdout, r.stderr)
        assert "ermission denied" in r.stdout + r.stderr, (skill, r.stdout, r.stderr)
    own = s.alice.home / "mine.yaml"
    own.write_text("name: mine\ncommand: [python3, -c, pass]\n")
    os.chown(own, s.alice.uid, s.alice.gid)
    own.chmod(0o600)  # hers alone: the daemon reads it as her
    r = s.run(s.alice, "skill", "config_validator", "--arg", f"path={own}", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["valid"] is True, (r.stdout, r.stderr)


def test_a_daemon_that_cannot_switch_users_refuses_to_serve_others() -> None:
    """A shared install whose daemon is not root would run every job with the daemon's rights:
    it does not start, and says how to fix it."""
    if os.geteuid() != 0:
        unavailable("starting the daemon as another user needs root")
    name = f"ns-svc-{secrets.token_hex(3)}"
    svc = _add_user(name)
    tmp_path = Path(tempfile.mkdtemp(prefix="ns-svc-", dir="/tmp"))
    try:
        tmp_path.chmod(0o755)
        home = tmp_path / "state"
        home.mkdir(mode=0o700)
        os.chown(home, svc.uid, svc.gid)
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o755)
        os.chown(run_dir, svc.uid, svc.gid)
        python = _python_for(svc, SITE)
        site = SITE if python else readable_copy(tmp_path / "pkgs")
        python = python or _python_for(svc, site)
        if python is None:
            unavailable("no Python that another user can run")
        assert python is not None
        r = subprocess.run(
            [python, "-c", boot(site), "daemon", "--max-ticks", "1"],
            cwd="/",
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(home),
                "NIGHTSHIFT_HOME": str(home),
                "NIGHTSHIFT_API__SOCKET": str(run_dir / "api.sock"),
                "NIGHTSHIFT_GPU__PROBE": "none",
            },
            user=svc.uid,
            group=svc.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "started as root" in r.stderr and "executor.run_as: daemon" in r.stderr
    assert "Traceback" not in r.stderr


def _digest(runs: Path) -> str:
    """The runs folder's part of a run's cgroup name (runtime/executors/local_executor.py)."""
    return hashlib.sha256(bytes(runs.resolve())).hexdigest()[:8]


def _pending(s: Shared, job_id: int) -> bool:
    con = sqlite3.connect(s.state / "nightshift.db")
    rows = con.execute("select args, state from approval").fetchall()
    return any(json.loads(a).get("job_id") == job_id and st == "pending" for a, st in rows)


def _log(s: Shared, job_id: int) -> str:
    logs = sorted((s.runs / f"job-{job_id}").glob("attempt-*.log"))
    return "\n".join(p.read_text() for p in logs) + "\n--- daemon:\n" + s.log.read_text()


def test_the_daemons_own_account_is_no_person_on_its_socket(shared: Shared) -> None:
    """Where jobs run as their submitters no job has the daemon's uid, and the daemon's account
    (root here) asking through the socket is refused: it is not a person who may request or
    vote."""
    r = subprocess.run(
        [shared.python, "-c", boot(shared.site), "whoami", "--json"],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(shared.root),
            "NIGHTSHIFT_HOME": str(shared.root / "root-client"),
            "NIGHTSHIFT_API__SOCKET": str(shared.sock),
            "NIGHTSHIFT_API__MODE": "client",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3 and "is not a person on its socket" in r.stderr, (r.stdout, r.stderr)


def test_a_checkpoint_folder_outside_the_job_folder_is_refused(shared: Shared) -> None:
    """The daemon reads and keeps a job's checkpoints and metrics as root: where jobs run as
    their submitters it reads them only in the job's own folder, so a spec naming bob's folder
    (or any other) as its checkpoint dir is refused at submit, naming the field and the fix."""
    s = shared
    for field, value in (
        ("checkpoint", {"dir": str(s.bob.home / "ckpt")}),
        ("metrics", {"file": str(s.bob.home / "metrics.jsonl")}),
    ):
        spec = {
            "name": f"alice-{field}",
            "code": {"path": str(s.root / "shared")},
            "command": [s.python, "-c", "pass"],
            field: value,
        }
        path = s.root / "shared" / f"alice-{field}.yaml"
        path.write_text(yaml.safe_dump(spec))
        path.chmod(0o644)
        r = s.run(s.alice, "submit", str(path))
        assert r.returncode != 0, (r.stdout, r.stderr)
        assert "outside the job's folder" in r.stderr and f"{field}." in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
