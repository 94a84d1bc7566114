"""A shared install with real OS users: the daemon runs as its own user and owns the state; alice
and bob are clients on its socket, each known by the uid the kernel reports for the connection.
Neither can approve their own request or pose as the other, one person counts once toward a
quorum, and neither can read or write the store.

Needs root (to create the users with `useradd` and start processes as them); without it, or
without useradd, it skips with the reason — except under CI=true, where it fails. The throwaway
users are removed with `userdel` at the end. The clients run the venv's packages with a Python
the users can execute (the venv's own interpreter may live under a folder they cannot read,
such as /root; then the system's python of the same version, with the venv's site-packages)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import write_spec

pytestmark = pytest.mark.service

SITE = sysconfig.get_paths()["purelib"]
REPO = Path(__file__).resolve().parents[1]
# What neither the daemon (whose job never starts: no GPU) nor a client imports; left out of the
# readable copy below.
HEAVY = (
    "torch", "transformers", "scipy", "sympy", "sklearn", "scikit_learn", "matplotlib",
    "fontTools", "mypy", "tensorboard", "networkx", "grpc", "PIL", "pillow", "pip", "tokenizers",
    "hf_xet", "torchmetrics", "lightning", "pytorch_lightning", "hypothesis", "_pytest",
    "pytest", "6ec57f84c680d3a3778b__mypyc", "accelerate", "safetensors", "huggingface_hub",
)  # fmt: skip


def boot(site: str) -> str:
    """The CLI, run by a Python that may not be the venv's: `site`'s packages added first."""
    return f"import site; site.addsitedir({site!r}); from nightshift.agent.doors.cli import main; main()"


def _link_or_copy(src: str, dst: str) -> None:
    if os.path.exists(dst):
        return  # a package folder inside another one's (agent/doors/commands in agent/doors): copied once
    try:
        os.link(src, dst)  # a hard link is reached by its own path: no folder above src matters
    except OSError:
        shutil.copy2(src, dst)


def readable_copy(dest: Path) -> str:
    """The venv's packages (less HEAVY) and nightshift's folders laid out as its package-dir
    mapping installs them, under `dest`, readable by all: for a checkout or venv below a folder
    that only root may enter (a CI clone under /root, say). Returns the site folder."""
    import tomllib

    site = dest / "site"

    def skip(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == Path(SITE)
        return [
            n
            for n in names
            if n == "__pycache__"
            or (top and (n.startswith(HEAVY) or n.startswith(("__editable__", "nightshift"))))
        ]

    shutil.copytree(SITE, site, ignore=skip, copy_function=_link_or_copy, symlinks=True)
    layout = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in sorted(layout["package-dir"].items()):
        target = site.joinpath(*package.split("."))
        shutil.copytree(
            REPO / folder,
            target,
            ignore=shutil.ignore_patterns("__pycache__"),
            copy_function=_link_or_copy,
            dirs_exist_ok=True,
        )
    for folder, dirs, files in os.walk(dest):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    return str(site)


def unavailable(reason: str) -> None:
    """Skip with the reason; under CI=true (root, useradd present) a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (required in CI)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Account:
    name: str
    uid: int
    gid: int
    home: Path  # a folder of its own under the test's root, 0700

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "COLUMNS": "200",
            "LANG": "C.UTF-8",
            **extra,
        }


@dataclass
class Install:
    root: Path
    python: str
    site: str  # where the processes of other users import nightshift and its packages from
    daemon: Account
    alice: Account
    bob: Account
    carol: Account
    sock: Path
    state: Path  # the daemon's NIGHTSHIFT_HOME
    log: Path

    def popen(
        self, who: Account, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        return subprocess.Popen(
            [self.python, "-c", boot(self.site), *args],
            cwd=who.home,
            env=who.env(NIGHTSHIFT_API__SOCKET=str(self.sock), **(env or {})),
            user=who.uid,
            group=who.gid,
            extra_groups=[],  # not root's groups
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, who: Account, *args: str, **env: str) -> subprocess.CompletedProcess:
        proc = self.popen(who, *args, env=env)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def python_as(self, who: Account, code: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.python, "-c", f"import site; site.addsitedir({self.site!r})\n{code}"],
            cwd=who.home,
            env=who.env(),
            user=who.uid,
            group=who.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )


def _add_user(name: str) -> Account:
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/false", name],
        check=True,
        capture_output=True,
    )
    pw = pwd.getpwnam(name)
    return Account(name, pw.pw_uid, pw.pw_gid, Path("/nonexistent"))


def _python_for(who: Account, site: str) -> str | None:
    """An interpreter `who` can run that imports nightshift from `site`, or None."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [
        sys.executable,
        os.path.realpath(sys.executable),
        shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin:/bin"),
    ]
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            r = subprocess.run(
                [
                    exe,
                    "-c",
                    f"import site; site.addsitedir({site!r}); import nightshift.agent.doors.cli",
                ],
                cwd="/",
                env=who.env(),
                user=who.uid,
                group=who.gid,
                extra_groups=[],
                capture_output=True,
            )
        except OSError:  # cannot execute it (a folder above it is not theirs to enter)
            continue
        if r.returncode == 0:
            return exe
    return None


def _policy(path: Path) -> None:
    """The shipped policy plus the two-person rule for high-priority victims."""
    text = (resources.files("nightshift.policies") / "default.yaml").read_text()
    policy = yaml.safe_load(text)
    policy["approvals"].append(
        {
            "id": "destroy-high-priority-two-person",
            "capabilities": ["destroy"],
            "when": ["claims.max_job_priority >= 5"],
            "quorum": 2,
            "from_others": True,
            "expires_min": 120,
        }
    )
    path.write_text(yaml.safe_dump(policy))
    path.chmod(0o644)  # root's, readable by the daemon, writable by nobody else


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    if os.geteuid() != 0:
        unavailable("creating OS users and starting processes as them needs root")
    if not (shutil.which("useradd") and shutil.which("userdel")):
        unavailable("useradd/userdel are not installed (Debian: the passwd package)")
    tag = secrets.token_hex(3)
    names = {role: f"ns-{role}-{tag}" for role in ("daemon", "alice", "bob", "carol")}
    accounts: dict[str, Account] = {}
    root = Path(tempfile.mkdtemp(prefix="ns-mu-", dir="/tmp"))
    proc: subprocess.Popen | None = None
    try:
        root.chmod(0o755)  # traversable: the socket's folder and the shared spec are under it
        for role, name in names.items():
            acct = _add_user(name)
            acct.home = root / role
            acct.home.mkdir(mode=0o700)
            os.chown(acct.home, acct.uid, acct.gid)
            accounts[role] = acct
        site = SITE
        python = _python_for(accounts["alice"], site)
        if python is None:  # the venv or the checkout lies where other users cannot read it
            site = readable_copy(root / "pkgs")
            python = _python_for(accounts["alice"], site)
        if python is None:
            unavailable(
                f"no Python {sys.version_info.major}.{sys.version_info.minor} that another user "
                f"can run with {SITE} (the venv's interpreter is {os.path.realpath(sys.executable)})"
            )
        assert python is not None
        d = accounts["daemon"]
        run_dir = root / "run"  # what /run/nightshift is in a real install
        run_dir.mkdir(mode=0o755)
        os.chown(run_dir, d.uid, d.gid)
        state = d.home / "state"
        shared = root / "shared"
        shared.mkdir(mode=0o755)
        _policy(shared / "policy.yaml")
        sock, log = run_dir / "api.sock", root / "daemon.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [python, "-c", boot(site), "daemon"],
                cwd=d.home,
                env=d.env(
                    NIGHTSHIFT_HOME=str(state),
                    NIGHTSHIFT_API__SOCKET=str(sock),
                    NIGHTSHIFT_POLICY__FILE=str(shared / "policy.yaml"),
                    NIGHTSHIFT_GPU__PROBE="none",
                    NIGHTSHIFT_LOOP__POLL_INTERVAL_S="0.1",
                    # The socket's rules, with a daemon of its own user whose jobs never start
                    # (no GPU); jobs that run as their submitters: test_jobs_as_submitters.py.
                    NIGHTSHIFT_EXECUTOR__RUN_AS="daemon",
                ),
                user=d.uid,
                group=d.gid,
                extra_groups=[],
                stdout=out,
                stderr=out,
            )
        end = time.monotonic() + 90
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the daemon did not serve {sock}:\n{log.read_text()}")
            time.sleep(0.1)
        yield Install(
            root,
            python,
            site,
            d,
            accounts["alice"],
            accounts["bob"],
            accounts["carol"],
            sock,
            state,
            log,
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        for name in names.values():
            if name in {a.name for a in accounts.values()}:
                subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def submit(inst: Install, who: Account, name: str, *extra: str) -> int:
    """`nightshift submit` as `who`: a job that waits for a GPU (there is none), so it stays
    queued. The spec lies where the daemon's user can read it."""
    spec = write_spec(
        inst.root / "shared", steps=50, name=name, resources={"gpus": 1}, file=f"{name}.yaml"
    )
    spec.chmod(0o644)
    r = inst.run(who, "submit", str(spec), "--json", *extra)
    assert r.returncode == 0, (r.stdout, r.stderr, inst.log.read_text())
    return int(json.loads(r.stdout)["job_ids"][0])


def pending_for(inst: Install, who: Account, job_id: int, timeout: float = 60) -> dict[str, Any]:
    """The pending approval on `job_id`, as `who` sees it through the socket."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = inst.run(who, "approvals", "list", "--json")
        assert r.returncode == 0, r.stderr
        rows = [a for a in json.loads(r.stdout) if a["args"].get("job_id") == job_id]
        if rows:
            return rows[0]
        time.sleep(0.2)
    raise AssertionError(f"no approval for job {job_id}:\n{inst.log.read_text()}")


def audit(inst: Install, **where: Any) -> list[sqlite3.Row]:
    """The daemon's audit events, read as root (who can read everything anyway)."""
    con = sqlite3.connect(inst.state / "nightshift.db")
    con.row_factory = sqlite3.Row
    sql = "select * from auditevent" + (
        " where " + " and ".join(f"{k} = ?" for k in where) if where else ""
    )
    return list(con.execute(sql + " order by id", tuple(where.values())))


def test_each_user_is_the_uid_the_kernel_reports(install: Install) -> None:
    for who in (install.alice, install.bob):
        r = install.run(who, "whoami", "--json", NIGHTSHIFT_POLICY__FILE="/dev/null")
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["mode"] == "client" and info["principal"] == who.name
        assert info["uid"] == who.uid and info["daemon_user"] == install.daemon.name
        # The caller's NIGHTSHIFT_POLICY__FILE has no effect: the daemon's policy decides.
        assert info["policy_file"] == str(install.root / "shared" / "policy.yaml")


def test_alice_cannot_approve_her_own_cancel_nor_pose_as_bob(install: Install) -> None:
    job_id = submit(install, install.alice, "alice-job")
    asker = install.popen(install.alice, "cancel", str(job_id), "--wait")
    try:
        row = pending_for(install, install.bob, job_id)
        assert row["requester"] == install.alice.name
        aid = str(row["id"])

        r = install.run(install.alice, "approve", aid)
        assert r.returncode == 3 and "requester never counts" in r.stderr, r.stderr
        # The old override of who you are is refused before anything is sent.
        r = install.run(
            install.alice, "approve", aid, NIGHTSHIFT_POLICY__PRINCIPAL=install.bob.name
        )
        assert r.returncode == 5 and "policy.principal is no longer a setting" in r.stderr
        # Naming bob in a request on the socket is refused, and audited as alice.
        line = (
            json.dumps(
                {
                    "op": "approvals.vote",
                    "approval_id": int(aid),
                    "approve": True,
                    "principal": install.bob.name,
                }
            ).encode()
            + b"\n"
        )
        forged = install.python_as(
            install.alice,
            "import socket\n"
            f"s = socket.socket(socket.AF_UNIX); s.connect({str(install.sock)!r})\n"
            f"s.sendall({line!r})\n"
            "print(s.makefile().readline())",
        )
        reply = json.loads(forged.stdout)
        assert reply["kind"] == "error" and "'principal' is not accepted" in str(reply)
        assert pending_for(install, install.bob, job_id)["state"] == "pending"

        r = install.run(install.bob, "approve", aid)
        assert r.returncode == 0, r.stderr
        assert f"approved ({install.bob.name} voted yes)" in r.stdout
        out, err = asker.communicate(timeout=120)
    finally:
        if asker.poll() is None:
            asker.kill()
    assert asker.returncode == 0, (out, err)
    assert f"job {job_id}: queued → cancelled" in out

    votes = audit(install, call_id=row["call_id"])
    by_action = {(e["action"], e["actor"]) for e in votes}
    assert ("approval.request", install.alice.name) in by_action
    assert ("approval.vote_refused", install.alice.name) in by_action
    assert ("approval.vote", install.bob.name) in by_action
    assert ("skill.start", install.alice.name) in by_action
    refused = [e for e in audit(install, action="api.refused") if install.bob.name in e["payload"]]
    assert [e["actor"] for e in refused] == [install.alice.name]


def test_two_person_rule_needs_two_people_other_than_the_requester(install: Install) -> None:
    """A high-priority victim needs two others: alice's votes never count, bob's second vote
    counts once, and carol's makes two."""
    job_id = submit(install, install.alice, "alice-urgent", "--priority", "high")
    asker = install.popen(
        install.alice, "skill", "cancel_job", "--arg", f"job_id={job_id}", "--wait"
    )
    try:
        row = pending_for(install, install.bob, job_id)
        aid = str(row["id"])
        assert row["quorum"] == 2 and row["rule"] == "destroy-high-priority-two-person"
        for _ in range(2):
            r = install.run(install.alice, "approve", aid)
            assert r.returncode == 3, r.stderr
        for _ in range(2):
            r = install.run(install.bob, "approve", aid)
            assert r.returncode == 0 and "pending" in r.stdout, r.stderr
        shown = json.loads(install.run(install.bob, "approvals", "show", aid, "--json").stdout)
        assert shown["state"] == "pending"
        assert [v["principal"] for v in shown["votes"]] == [install.bob.name]
        r = install.run(install.carol, "approve", aid)
        assert r.returncode == 0 and "approved" in r.stdout, r.stderr
        out, err = asker.communicate(timeout=120)
    finally:
        if asker.poll() is None:
            asker.kill()
    assert asker.returncode == 0, (out, err)
    shown = json.loads(install.run(install.bob, "show", str(job_id), "--json").stdout)
    assert shown["state"] == "cancelled"


def test_clients_cannot_read_or_write_the_store(install: Install) -> None:
    st = install.state.stat()
    assert st.st_uid == install.daemon.uid and st.st_mode & 0o777 == 0o700
    db = install.state / "nightshift.db"
    for who in (install.alice, install.bob):
        probe = install.python_as(
            who,
            "import sqlite3\n"
            f"db = {str(db)!r}\n"
            "for mode in ('rb', 'r+b'):\n"
            "    try:\n"
            "        open(db, mode)\n"
            "        print('opened', mode)\n"
            "    except PermissionError:\n"
            "        print('PermissionError', mode)\n"
            "try:\n"
            "    sqlite3.connect(db).execute('select count(*) from job').fetchone()\n"
            "    print('read the store')\n"
            "except sqlite3.Error as exc:\n"
            "    print('sqlite3', type(exc).__name__)\n",
        )
        assert probe.stdout.split("\n")[:3] == [
            "PermissionError rb",
            "PermissionError r+b",
            "sqlite3 OperationalError",
        ], (probe.stdout, probe.stderr)
        # A command that opens the store says it is the daemon's, in one error.
        r = install.run(who, "audit", "verify")
        assert r.returncode == 5 and "belongs to the daemon" in r.stderr, r.stderr
        # Insisting on the embedded mode over the daemon's home changes nothing.
        r = install.run(
            who, "jobs", NIGHTSHIFT_API__MODE="embedded", NIGHTSHIFT_HOME=str(install.state)
        )
        assert r.returncode == 5 and "permission denied" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
