"""The loopback guard: refuse, and log, any TCP or UDP connection to a host that is not this one.

Installed in the test process by conftest.py, and in every Python process the tests start by a
copy of this file put first on PYTHONPATH as `sitecustomize.py`. A connection to 127.0.0.0/8, ::1
or `localhost`, and any Unix socket, is fine; anything else raises `LoopbackViolation` and appends
one line to the file named by $LOOPBACK_GUARD_LOG, which conftest's autouse fixture reads after
each test. pip is exempt: it reaches the package index by design (`pip wheel` in
test_packaging). Then an environment's own sitecustomize, if any, still runs.

Plain Python 3.8+ and the standard library only: any interpreter a test starts imports it.
"""

import ipaddress
import os
import socket
import sys
import time

LOG_VAR = "LOOPBACK_GUARD_LOG"
MARKER = "nightshift-loopback-guard"  # in every copy of this file


class LoopbackViolation(OSError):
    """A test's process tried to reach a host that is not this one."""


def _argv():
    return list(getattr(sys, "orig_argv", None) or sys.argv)


def _exempt():
    return any(a == "pip" or "/pip/" in a or a.endswith("/pip") for a in _argv()[:4])


def remote_host(address):
    """The host `address` names when it is not this machine, else None (a Unix socket's path,
    a loopback address, localhost)."""
    if not isinstance(address, tuple) or not address:
        return None
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host)
    if host == "localhost":
        return None
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host  # a name other than localhost may resolve anywhere
    mapped = getattr(ip, "ipv4_mapped", None)
    if ip.is_loopback or (mapped is not None and mapped.is_loopback):
        return None
    return host


def _check(sock, address, how):
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    host = remote_host(address)
    if host is None or _exempt():
        return
    line = "{} pid={} test={} {} {!r} argv={!r}\n".format(
        time.strftime("%H:%M:%S"),
        os.getpid(),
        os.environ.get("PYTEST_CURRENT_TEST", "-"),
        how,
        address,
        _argv()[:6],
    )
    log = os.environ.get(LOG_VAR)
    if log:
        try:
            with open(log, "a") as f:
                f.write(line)
        except OSError:
            pass
    raise LoopbackViolation(13, f"tests may only talk to loopback, not {host} ({how})")


_real = {n: getattr(socket.socket, n) for n in ("connect", "connect_ex", "sendto", "sendmsg")}


def _connect(self, address):
    _check(self, address, "connect")
    return _real["connect"](self, address)


def _connect_ex(self, address):
    _check(self, address, "connect_ex")
    return _real["connect_ex"](self, address)


def _sendto(self, data, *rest):
    if rest:  # sendto(data, address) or sendto(data, flags, address)
        _check(self, rest[-1], "sendto")
    return _real["sendto"](self, data, *rest)


def _sendmsg(self, buffers, *rest):
    if len(rest) >= 3:  # sendmsg(buffers, ancdata, flags, address)
        _check(self, rest[2], "sendmsg")
    return _real["sendmsg"](self, buffers, *rest)


def install():
    """Patch the socket class once per process. When another copy patched it first (a pytest-xdist
    worker starts with the controller's copy as its sitecustomize), this module's
    LoopbackViolation becomes that copy's, the class the patched calls raise."""
    global LoopbackViolation
    if getattr(socket.socket, "_loopback_guard", False):
        LoopbackViolation = getattr(socket.socket, "_loopback_guard_error", LoopbackViolation)
        return
    socket.socket.connect = _connect
    socket.socket.connect_ex = _connect_ex
    socket.socket.sendto = _sendto
    socket.socket.sendmsg = _sendmsg
    socket.socket._loopback_guard = True
    socket.socket._loopback_guard_error = LoopbackViolation


def _is_guard(folder):
    """Whether `folder` holds a copy of this guard as its sitecustomize (another session's)."""
    try:
        with open(os.path.join(folder or ".", "sitecustomize.py")) as f:
            return MARKER in f.read(8192)
    except (OSError, UnicodeDecodeError):
        return False


def _chain():
    """Run the sitecustomize this copy shadows, if the environment has one (copies of this guard
    that another test session put on PYTHONPATH are skipped)."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if not _is_guard(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


install()
if __name__ == "sitecustomize":
    _chain()
