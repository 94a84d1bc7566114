"""Lost attempts and their leftovers, against real processes: a training process that outlived its
supervisor must be reported and stopped, and nothing that is not the run's may ever be signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.runtime.executors.local_executor import REBOOT_DETAIL, LocalExecutor, _boot_id

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process groups, sessions and /proc are Linux's"
)

# The training program: it starts a heartbeat writer in a session of its own (as a daemonised
# data loader would), records both pids, and sleeps; the writer may ignore SIGTERM.
FAMILY = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    role, heartbeat, pids, ignore_term = sys.argv[1:5]
    if role == "child":
        grand = subprocess.Popen([sys.executable, __file__, "grand", *sys.argv[2:5]],
                                 start_new_session=True)
        with open(pids + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {grand.pid}")
        os.replace(pids + ".tmp", pids)
        time.sleep(60)
    else:
        if ignore_term == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            with open(heartbeat, "a") as f:
                f.write("x")
            time.sleep(0.02)
""")


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def beating(heartbeat: Path, for_s: float = 0.25) -> bool:
    before = heartbeat.stat().st_size
    time.sleep(for_s)
    return heartbeat.stat().st_size != before


@pytest.fixture
def ex(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(tmp_path / "runs")


@pytest.fixture
def spare() -> Iterator[list[int]]:
    """Pids to SIGKILL at the end whatever happened, so a failing test leaves nothing running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_family(
    ex: LocalExecutor, tmp_path: Path, key: str, spare: list[int], ignore_term: bool = False
) -> tuple[dict, int, int, Path]:
    """Start the program; wait until the writer beats and the supervisor recorded its child."""
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    heartbeat, pids = tmp_path / f"{key}.beat", tmp_path / f"{key}.pids"
    h = ex.start(
        LaunchRequest(
            key=key,
            cwd=str(tmp_path),
            log_path=str(tmp_path / f"{key}.log"),
            argv=[
                sys.executable,
                str(script),
                "child",
                str(heartbeat),
                str(pids),
                "1" if ignore_term else "0",
            ],
        )
    )
    spare.append(h["pid"])
    wait_for(
        lambda: pids.exists() and heartbeat.exists() and Path(h["exit_file"] + ".child").exists()
    )
    child, grand = map(int, pids.read_text().split())
    spare += [child, grand]
    assert ex.poll(h).state == "running"
    return h, child, grand, heartbeat


def test_killed_supervisor_leaves_a_reported_leftover_that_cleanup_stops(ex, tmp_path, spare):
    """SIGKILL of the supervisor alone: the training process lives on, re-parented; poll must
    name it, and cleanup must stop it and its setsid'd writer before any relaunch."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "orphaned", spare)
    os.kill(h["pid"], signal.SIGKILL)
    wait_for(lambda: ex.poll(h).state == "lost")
    status = ex.poll(h)
    assert status.leftovers == sorted([child, grand])
    assert f"supervisor killed; training process {child} still running (re-parented)" in (
        status.detail or ""
    )
    assert str(grand) in (status.detail or "")
    assert beating(heartbeat)

    assert ex.cleanup(h, grace_s=2) == sorted([child, grand])
    assert not alive(child) and not alive(grand)
    assert not beating(heartbeat)
    assert ex.cleanup(h, grace_s=2) == []  # idempotent
    after = ex.poll(h)
    assert after.state == "lost" and after.leftovers == []  # the evidence stays "lost"


def test_sigkill_of_the_group_spares_a_setsid_descendant_until_cleanup(ex, tmp_path, spare):
    """killpg(SIGKILL) ends the group, not a descendant in its own session; one that even
    ignores SIGTERM must still be found by its env marker and killed after the grace."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "group", spare, ignore_term=True)
    os.killpg(h["pgid"], signal.SIGKILL)
    wait_for(lambda: ex.poll(h).state == "lost" and not alive(child))
    status = ex.poll(h)
    assert status.leftovers == [grand]
    assert (status.detail or "").startswith(
        "supervisor and its process group gone without an exit record"
    )
    assert str(grand) in (status.detail or "") and beating(heartbeat)

    t0 = time.monotonic()
    assert ex.cleanup(h, grace_s=0.3) == [grand]
    assert time.monotonic() - t0 >= 0.3  # SIGTERM first, SIGKILL after the grace
    assert not alive(grand) and not beating(heartbeat)


def test_stop_reaches_a_descendant_that_left_the_group(ex, tmp_path, spare):
    """Cancelling a run must not leave its daemonised writer training on."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "cancel", spare)
    status = ex.stop(h, grace_s=2)
    assert status.state == "exited" and status.signal == signal.SIGTERM
    assert not alive(grand) and not beating(heartbeat)


def test_cleanup_of_a_running_run_stops_it(ex, tmp_path, spare):
    """Before a relaunch cleanup also ends a run that is still running; the exit is recorded."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "running", spare)
    assert ex.cleanup(h, grace_s=2) == sorted([h["pid"], child, grand])
    status = ex.poll(h)
    assert status.state == "exited" and status.signal == signal.SIGTERM
    assert not beating(heartbeat)


def test_cleanup_never_touches_another_run_or_a_recycled_pid(ex, tmp_path, spare):
    """A handle whose pids now belong to other processes (recorded start times differ) and a
    run under another key must come through cleanup untouched."""
    other, _, other_grand, other_beat = start_family(ex, tmp_path, "other", spare)
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    spare.append(stranger.pid)
    mine = ex.start(
        LaunchRequest(
            key="mine",
            argv=[sys.executable, "-c", "pass"],
            cwd=str(tmp_path),
            log_path=str(tmp_path / "mine.log"),
        )
    )
    wait_for(lambda: ex.poll(mine).state == "exited" and not alive(mine["pid"]))
    Path(mine["exit_file"]).unlink()
    ctime = psutil.Process(stranger.pid).create_time()
    # The supervisor records its child too: claim the stranger, started at another time.
    Path(mine["exit_file"] + ".child").write_text(
        f'{{"pid": {stranger.pid}, "create_time": {ctime - 1000}}}'
    )
    for fake in (
        {
            **mine,
            "pid": stranger.pid,
            "pgid": stranger.pid,
            "start_time": None,
            "create_time": ctime - 1000,
        },
        {**mine, "pid": stranger.pid, "pgid": stranger.pid, "start_time": 1},
        {
            **mine,
            "pid": other["pid"],
            "pgid": other["pgid"],
            "start_time": 1,
            "create_time": other["create_time"] - 1000,
        },
    ):
        status = ex.poll(fake)
        assert status.state == "lost" and status.leftovers == []
        assert ex.cleanup(fake, grace_s=1) == []
    assert alive(stranger.pid)
    assert ex.poll(other).state == "running" and beating(other_beat)
    ex.stop(other, grace_s=2)
    assert not alive(other_grand)


@pytest.mark.skipif(_boot_id() is None, reason="no /proc/sys/kernel/random/boot_id")
def test_a_handle_from_another_boot_is_lost_and_never_signalled(ex, tmp_path, spare):
    """After a reboot the handle's pids are other processes' now: lost, and never signalled."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "rebooted", spare)
    fake = {**h, "boot_id": "00000000-0000-0000-0000-000000000000"}
    status = ex.poll(fake)
    assert status.state == "lost" and status.detail == REBOOT_DETAIL and status.leftovers == []
    assert ex.cleanup(fake, grace_s=1) == []
    assert ex.stop(fake, grace_s=1).state == "lost"
    assert ex.poll(h).state == "running" and beating(heartbeat)
    ex.stop(h, grace_s=2)


def test_cleanup_of_an_exited_run_is_empty(ex, tmp_path):
    """The common case before a relaunch: nothing left, nothing signalled, the exit kept."""
    h = ex.start(
        LaunchRequest(
            key="done",
            argv=[sys.executable, "-c", "raise SystemExit(4)"],
            cwd=str(tmp_path),
            log_path=str(tmp_path / "done.log"),
        )
    )
    wait_for(lambda: ex.poll(h).state == "exited")
    assert ex.cleanup(h, grace_s=1) == []
    assert ex.poll(h).exit_code == 4


def test_an_old_handle_without_the_new_fields_still_polls_and_stops(ex, tmp_path, spare):
    """Handles stored before leftovers were tracked lack create_time, boot_id and attempt_id."""
    h, child, grand, heartbeat = start_family(ex, tmp_path, "old", spare)
    old = {k: v for k, v in h.items() if k not in ("create_time", "boot_id", "attempt_id")}
    assert ex.poll(old).state == "running"
    # Without the marker only the group and the recorded child are found, not the writer.
    assert ex.cleanup(old, grace_s=2) == sorted([h["pid"], child])
    assert ex.poll(old).state == "exited"
    assert ex.cleanup(h, grace_s=2) == [grand]  # the new handle's marker still finds it
