"""The loopback guard itself (tests/loopback_guard.py, installed by conftest.py): a connection to
a host that is not this one is refused and logged, in the test process and in the processes the
tests start (a CLI subprocess included), while loopback and Unix sockets work; and a test during
which that happened fails even when the code under test swallowed the error. 203.0.113.0/24 and
2001:db8::/32 are documentation ranges: nothing leaves the machine, the guard refuses first."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import loopback_guard
import pytest

from conftest import GUARD_LOG, REPO, nightshift

REMOTE = [
    (socket.AF_INET, socket.SOCK_STREAM, ("203.0.113.7", 443)),
    (socket.AF_INET6, socket.SOCK_STREAM, ("2001:db8::7", 443, 0, 0)),
    (socket.AF_INET, socket.SOCK_STREAM, ("example.org", 80)),
    (socket.AF_INET, socket.SOCK_DGRAM, ("203.0.113.7", 53)),
]


@pytest.fixture
def own_log(tmp_path, monkeypatch) -> Path:
    """A log of this test's own, so that the session's fixture does not fail it."""
    log = tmp_path / "violations.log"
    monkeypatch.setenv(loopback_guard.LOG_VAR, str(log))
    return log


@pytest.mark.parametrize(("family", "kind", "address"), REMOTE, ids=["v4", "v6", "name", "udp"])
@pytest.mark.parametrize("how", ["connect", "connect_ex", "sendto"])
def test_a_remote_address_is_refused_and_logged(own_log, family, kind, address, how):
    with socket.socket(family, kind) as s:
        with pytest.raises(loopback_guard.LoopbackViolation, match="only talk to loopback"):
            if how == "sendto":
                s.sendto(b"x", address)
            else:
                getattr(s, how)(address)
    line = own_log.read_text()
    assert f"pid={os.getpid()}" in line and how in line and str(address[0]) in line


def test_loopback_and_unix_sockets_are_fine(own_log, tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection((host, port), timeout=5):
                pass
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6) as server:
                server.bind(("::1", 0))
                server.listen(1)
                with socket.create_connection(("::1", server.getsockname()[1]), timeout=5):
                    pass
        except OSError as exc:  # no IPv6 loopback here: the guard is not what refused
            assert not isinstance(exc, loopback_guard.LoopbackViolation)
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(1)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"x", ("127.0.0.1", 9))
    assert not own_log.exists() or own_log.read_text() == ""


def test_the_guard_is_on_for_every_process_the_tests_start(own_log):
    """conftest put it first on PYTHONPATH as sitecustomize.py, readable by other users; a child
    Python that swallows the refusal is still logged, under its own pid."""
    first = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    site = Path(first) / "sitecustomize.py"
    assert site.read_text() == Path(loopback_guard.__file__).read_text()
    assert site.stat().st_mode & stat.S_IROTH and Path(first).stat().st_mode & stat.S_IXOTH
    code = textwrap.dedent("""
        import os, socket
        try:
            socket.create_connection(("203.0.113.9", 80), timeout=1)
        except OSError as exc:
            print(type(exc).__name__, os.getpid())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    name, pid = r.stdout.split()
    assert name == "LoopbackViolation"
    assert f"pid={pid} " in own_log.read_text()


def test_a_cli_subprocess_is_guarded(own_log, home, tmp_path):
    """`nightshift doctor` told to reach dockerd on a remote TCP host: the guard in the CLI
    process refuses it, the doctor reports it as unreachable, and the log names the process."""
    r = nightshift("doctor", "--json", env={"DOCKER_HOST": "tcp://203.0.113.5:2375"})
    assert "Traceback" not in r.stderr
    assert "not reachable at tcp://203.0.113.5:2375" in r.stdout
    log = own_log.read_text()
    assert "('203.0.113.5', 2375)" in log and "nightshift.agent.doors.entry" in log


def test_a_test_that_swallowed_a_remote_connection_fails(tmp_path):
    """An inner pytest session with this conftest: a test whose code (or child process) tried a
    remote host and hid the error fails, naming the address; a loopback-only test passes."""
    for name in ("conftest.py", "loopback_guard.py", "lifecycle_guard.py"):
        shutil.copy(REPO / "tests" / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent("""
            import socket, subprocess, sys

            def test_hides_an_error():
                try:
                    socket.create_connection(("203.0.113.11", 80), timeout=1)
                except OSError:
                    pass

            def test_child_hides_an_error():
                code = (
                    "import socket\\ntry:\\n"
                    "    socket.create_connection(('203.0.113.12', 80), timeout=1)\\n"
                    "except OSError:\\n    pass\\n"
                )
                subprocess.run([sys.executable, "-c", code], check=True)

            def test_loopback_only():
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
        """)
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert "203.0.113.11" in out and "203.0.113.12" in out
    assert out.count("non-loopback connection(s) during this test") == 2
    assert GUARD_LOG.read_text().count("203.0.113.1") == 0  # the inner session kept its own log
