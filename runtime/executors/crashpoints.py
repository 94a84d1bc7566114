"""Named points where a crash-consistency test has this process SIGKILLed, to prove that a crash
between any two steps of a launch neither loses the attempt nor starts it twice.

    NIGHTSHIFT_CRASH_AT=launch.spawned nightshift daemon     # dies right after the Popen

With NIGHTSHIFT_CRASH_ONCE=FILE only the first process to reach the point dies (it creates FILE),
so a point inherited by every run's supervisor kills one launch, not all of them. A point costs
one environment lookup when the variable is unset; this module imports only the standard library,
so the supervisor uses it before its program starts.
"""

from __future__ import annotations

import os
import signal

ENV = "NIGHTSHIFT_CRASH_AT"
ONCE_ENV = "NIGHTSHIFT_CRASH_ONCE"

# In launch order: each is a moment where a crash used to be able to double or lose an attempt.
POINTS = (
    "attempt.claimed",  # the job row says running and the attempt row exists; nothing launched
    "launch.intent",  # the executor's intent is on disk; no process yet
    "launch.spawned",  # the supervisor is started; the handle may not be written yet
    "supervise.claimed",  # (in the supervisor) the handle is written; the program not started
    "launch.handle",  # the executor read the handle; the attempt row does not have it yet
    "attempt.running",  # the attempt row has the handle
)


def crash_point(name: str) -> None:
    """SIGKILL this process if the test asked to crash here (and, with ONCE_ENV, no one did yet)."""
    if os.environ.get(ENV) != name:
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:
            os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
