"""Identities that cannot collide (issue 26), from an adversarial test:

- a store recreated beside an existing runs folder handed out old ids, and two `sleep 30` jobs
  were `succeeded, exit 0` after 0.6 s: the local executor found the old runs' exit records under
  `attempt-<row id>`. Attempt keys are UUIDs now, the runs folder records its store, and a store
  that vanished from a home that shows it existed is reported instead of being made again;
- two homes on one SQLite file each ran a daemon, and one attempt ran as two processes: a SQLite
  store takes one daemon (its `store_lease`), whichever home it runs from. PostgreSQL is shared by
  several daemons as before.

Real stores, the real local executor and real daemons throughout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.agent.doors.daemon import Daemon, DaemonLock
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.errors import OperatorError, StoreGone
from nightshift.runtime.executors.kubernetes_executor import job_name, key_label
from nightshift.runtime.store.db import Attempt, Store, utcnow
from nightshift.runtime.store.runs_binding import MARKER, recorded
from nightshift.runtime.store.store_lease import DaemonLease, serving

from conftest import REPO, nightshift, store_row

pytest_plugins = ["postgres_service"]

QUICK = {"name": "quick", "command": ["{python}", "-c", "pass"]}
SLEEPER = {"name": "sleeper", "command": ["{python}", "-c", "import time; time.sleep(30)"]}


def run_quick_jobs(n: int) -> Wiring:
    """The first store's life: n jobs run to success in this home's runs folder."""
    w = Wiring.load()
    client = Client(w)
    jobs = [client.submit(spec=QUICK) for _ in range(n)]
    assert w.engine.run_until_settled(jobs, deadline_s=60) == dict.fromkeys(jobs, "succeeded")
    w.audit.flush()  # its anchor written now, not by a timer after the store is gone
    w.store.engine.dispose()
    return w


def delete_store(home: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (home / f"nightshift.db{suffix}").unlink(missing_ok=True)


def stop_all(w: Wiring, jobs: list[int]) -> None:
    for job in jobs:
        for att in w.store.attempts(job):
            if att.handle:
                w.executor.stop(att.handle, grace_s=1)


# -------------------------------------------------------------------------- attempt keys
def test_attempt_keys_are_unique_and_name_the_run(home):
    """The executor's key is the attempt's UUID key, never its row id."""
    w = run_quick_jobs(1)
    (att,) = w.store.attempts(1)
    assert re.fullmatch(r"attempt-[0-9a-f]{32}", att.key)
    assert att.handle["key"] == att.key
    assert (w.settings.runs_dir / "exits" / f"{att.key}.json").exists()
    assert not (w.settings.runs_dir / "exits" / f"attempt-{att.id}.json").exists()


def test_new_attempts_never_find_the_exit_records_of_a_recreated_stores_runs(home, monkeypatch):
    """The original finding, below the runs-folder check (an engine built by hand): the new
    store's attempts 1 and 2 are launched afresh, not read back from the old runs' exit files."""
    monkeypatch.setenv("NIGHTSHIFT_LOOP__CPU_SLOTS", "2")
    run_quick_jobs(2)
    delete_store(home)
    Store(f"sqlite:///{home / 'nightshift.db'}").engine.dispose()  # recreated, empty
    w = Wiring.load()
    client = Client(w)
    jobs = [client.submit(spec=SLEEPER) for _ in range(2)]
    assert jobs == [1, 2]  # the old jobs' ids again
    engine = Engine(w.store, w.executor, w.settings)
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            engine.tick()
            time.sleep(0.1)
        states = {j: w.store.job(j).state for j in jobs}
        assert states == dict.fromkeys(jobs, "running"), states  # was: succeeded, exit 0
    finally:
        stop_all(w, jobs)


def test_a_recreated_store_is_refused_beside_the_runs_of_the_old_one(home, tmp_path):
    """The runs folder records its store; a store made afresh at the same path starts no work
    there, with a message that says what happened and the fix."""
    first = run_quick_jobs(1)
    old_instance = first.store.instance_id()
    assert recorded(home / "runs") == {
        "instance": old_instance,
        "store": str(home / "nightshift.db"),
    }
    delete_store(home)
    Store(f"sqlite:///{home / 'nightshift.db'}").engine.dispose()  # recreated, empty
    w = Wiring.load()
    job = Client(w).submit(spec=SLEEPER)  # reading and queueing still work
    with pytest.raises(OperatorError) as err:
        w.engine  # noqa: B018  # what `nightshift run` and the daemon build to start work
    msg = str(err.value)
    assert f"the runs folder {home / 'runs'} belongs to store instance {old_instance}" in msg
    assert "recreated or replaced" in msg and "Nothing was started" in msg
    assert "Restore the store" in msg and "move" in msg and "executor.runs_dir" in msg
    d = Daemon(Wiring(_settings(home, f"sqlite:///{home / 'nightshift.db'}"), server=True))
    with pytest.raises(OperatorError, match="belongs to store instance"):
        d.run(max_ticks=1)
    assert w.store.attempts(job) == []

    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"steps": [{"watch": job}]}))
    r = nightshift("run", str(goal), timeout=60)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "belongs to store instance" in r.stdout + r.stderr
    assert w.store.attempts(job) == []


def test_runs_from_before_the_record_are_not_adopted_by_an_empty_store(home):
    """A runs folder from before it recorded its store, beside an empty store: refused too."""
    run_quick_jobs(1)
    (home / "runs" / MARKER).unlink()
    delete_store(home)
    Store(f"sqlite:///{home / 'nightshift.db'}").engine.dispose()
    with pytest.raises(OperatorError, match="records no store, and the store .* has no jobs"):
        Wiring.load().engine  # noqa: B018


def test_a_runs_folder_from_before_the_record_is_bound_to_its_store(home):
    """An upgraded home: its runs folder records nothing yet; its own store (with jobs) binds."""
    w = run_quick_jobs(1)
    (home / "runs" / MARKER).unlink()
    Wiring.load().engine  # noqa: B018
    assert recorded(home / "runs")["instance"] == w.store.instance_id()


# ---------------------------------------------------------------------- a vanished store
def test_a_deleted_store_is_reported_not_made_again(home):
    """rm nightshift.db beside its runs: the next command says the store is missing and how to
    restore it, and makes no new one (before: a fresh empty store, silently)."""
    run_quick_jobs(1)
    delete_store(home)
    r = nightshift("jobs")
    assert r.returncode == 5, r.stdout + r.stderr
    out = " ".join((r.stdout + r.stderr).split())
    assert f"the store {home / 'nightshift.db'} is missing" in out, out
    assert "Restore" in out and "move the runs folder aside" in out
    assert "Traceback" not in out
    assert not (home / "nightshift.db").exists()  # not made again, empty
    # Runs from before the folder recorded its store show it existed too.
    (home / "runs" / MARKER).unlink()
    with pytest.raises(StoreGone, match="holds the folders of earlier jobs"):
        Wiring.load().store  # noqa: B018
    assert not (home / "nightshift.db").exists()


def test_a_fresh_home_still_gets_its_store(home):
    """No runs yet: the first command makes the store, as the quickstart needs."""
    r = nightshift("jobs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (home / "nightshift.db").exists()


def test_two_processes_opening_a_fresh_store_agree_on_its_instance_id(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    start = time.time() + 2.0
    code = textwrap.dedent(f"""
        import time
        from nightshift.runtime.store.db import Store
        time.sleep(max(0.0, {start} - time.time()))
        print(Store({url!r}).instance_id())
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    ids = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0] * 4
    assert len(ids) == 1 and ids == {Store(url).instance_id()}


# --------------------------------------------------------------- one daemon per SQLite store
def _settings(home: Path, url: str, **loop: float) -> Settings:
    return Settings(
        home=str(home),
        store={"url": url},
        gpu={"probe": "none"},
        api={"serve": False},
        channels={"listen": None},
        loop={"poll_interval_s": 0.1, **loop},
    )


def _daemon_env(home: Path, url: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "NIGHTSHIFT_HOME": str(home),
        "NIGHTSHIFT_STORE__URL": url,
        "NIGHTSHIFT_GPU__PROBE": "none",
        "NIGHTSHIFT_API__SERVE": "false",
        "NIGHTSHIFT_CHANNELS__LISTEN": "null",
        "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.1",
        "NIGHTSHIFT_LOOP__LEASE_HEARTBEAT_S": "0.2",
        "NIGHTSHIFT_LOOP__LEASE_TIMEOUT_S": "2",
    }


def start_daemon(home: Path, url: str, db: Path) -> tuple[subprocess.Popen, int]:
    """The real `nightshift daemon` in `home` on the store `url`, once it holds the lease."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        env=_daemon_env(home, url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (pid,) = store_row(db, "select pid from store_lease where name='daemon'", proc=proc)
    return proc, pid


@pytest.fixture
def shared(tmp_path, home):
    """Two homes, A and B, whose settings point at one SQLite file."""
    db = tmp_path / "shared" / "x.db"
    db.parent.mkdir()
    return tmp_path / "home-a", tmp_path / "home-b", f"sqlite:///{db}", db


def test_a_second_daemon_on_one_sqlite_store_is_refused(shared):
    """Homes A and B on one file: B's daemon is refused while A's heartbeat is fresh, and may
    start once A stopped cleanly (its lease deleted)."""
    home_a, home_b, url, db = shared
    proc, pid = start_daemon(home_a, url, db)
    try:
        assert pid == proc.pid
        before = store_row(db, "select heartbeat_at from store_lease")[0]
        store_row(db, f"select 1 from store_lease where heartbeat_at > '{before}'")  # renewed
        d = Daemon(Wiring(_settings(home_b, url), server=True))
        with pytest.raises(OperatorError) as err:
            d.run(max_ticks=1)
        msg = str(err.value)
        assert msg.startswith(f"another nightshift daemon serves the store {db}: pid {pid} on ")
        assert f"home {home_a}" in msg and "stop that daemon first" in msg
        assert not DaemonLock.held(home_b)  # the refused daemon let its home's lock go
        assert store_row(db, "select pid from store_lease")[0] == pid  # A's lease untouched
        # The real command says the same in one line, exit 5.
        r = subprocess.run(
            [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon", "--max-ticks", "1"],
            cwd=REPO,
            env={**_daemon_env(home_b, url), "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 5, r.stdout + r.stderr
        assert "another nightshift daemon serves the store" in r.stdout + r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    with Store(url).engine.connect() as c:  # a clean stop deletes the lease
        assert c.exec_driver_sql("select count(*) from store_lease").scalar() == 0
    told: list[str] = []
    Daemon(Wiring(_settings(home_b, url), server=True), say=told.append).run(max_ticks=1)
    assert not any("taken over" in t for t in told)


def test_a_killed_daemons_lease_is_taken_over(shared):
    """SIGKILL leaves the lease; on the same node a holder whose process is gone is replaced at
    once (elsewhere its heartbeat must go stale first, below)."""
    home_a, home_b, url, db = shared
    proc, pid = start_daemon(home_a, url, db)
    proc.kill()
    proc.communicate(timeout=30)
    told: list[str] = []
    d = Daemon(Wiring(_settings(home_b, url), server=True), say=told.append)
    d.run(max_ticks=1)
    assert any(f"gone; taken over: pid {pid} on " in t for t in told), told


def test_a_lease_from_another_node_is_taken_only_once_stale(tmp_path):
    """Its pid means nothing here: only a heartbeat older than the timeout frees it, and the
    late holder learns at its next heartbeat that it must stop."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store(url)
    now = [utcnow()]

    def lease(node: str, home: str) -> DaemonLease:
        return DaemonLease(
            store, node=node, home=home, heartbeat_s=0.01, timeout_s=3, clock=lambda: now[0]
        )

    theirs, mine = lease("gpu-07", "/srv/a"), lease("gpu-01", "/srv/b")
    theirs.acquire()
    assert serving(store, node="gpu-01", timeout_s=3, now=now[0]).home == "/srv/a"
    with pytest.raises(
        OperatorError, match=r"pid \d+ on gpu-07, home /srv/a \(heartbeat 0 s ago\)"
    ):
        mine.acquire()
    now[0] += timedelta(seconds=2)
    time.sleep(0.02)
    theirs.renew()  # a heartbeat keeps it
    now[0] += timedelta(seconds=2)
    with pytest.raises(OperatorError):
        mine.acquire()
    now[0] += timedelta(seconds=2)  # 4 s without a heartbeat: stale
    assert serving(store, node="gpu-01", timeout_s=3, now=now[0]) is None
    taken = mine.acquire()
    assert taken is not None and taken.node == "gpu-07"
    time.sleep(0.02)
    with pytest.raises(OperatorError, match="was taken over by another daemon: pid"):
        theirs.renew()  # the late one learns it, and stops
    assert not theirs.held and mine.held
    assert theirs.release() and mine.release()
    assert serving(store, node="gpu-01", timeout_s=3) is None


def test_nightshift_run_refuses_while_another_homes_daemon_serves_the_store(shared, tmp_path):
    """`nightshift run` drives a loop of its own without a daemon of its home: not while another
    home's daemon serves the same SQLite store."""
    home_a, home_b, url, db = shared
    proc, pid = start_daemon(home_a, url, db)
    try:
        w = Wiring(_settings(home_b, url))
        job = Client(w).submit(spec=SLEEPER)
        with pytest.raises(OperatorError) as err:
            w.engine.start_background()
        msg = str(err.value)
        assert msg.startswith(f"a nightshift daemon of another home serves the store {db}: pid")
        assert f"NIGHTSHIFT_HOME={home_a}" in msg
        goal = tmp_path / "goal.yaml"
        goal.write_text(yaml.safe_dump({"steps": [{"watch": job}]}))
        env = {k: v for k, v in _daemon_env(home_b, url).items() if "LEASE" not in k}
        r = subprocess.run(
            [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
            cwd=REPO,
            env={**env, "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 5, r.stdout + r.stderr
        assert "a nightshift daemon of another home serves the store" in r.stdout + r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_the_daemons_own_home_still_runs_goals_through_it(home):
    """`nightshift run` in the daemon's home leaves the loop to it, as before (no refusal)."""
    url = f"sqlite:///{home / 'nightshift.db'}"
    lease = DaemonLease(
        Store(url), node=Settings().node, home=str(home.resolve()), heartbeat_s=1, timeout_s=5
    )
    lease.acquire()
    Wiring.load().refuse_foreign_daemon()
    lease.release()


# ------------------------------------------------------------------------------ executors
def test_a_uuid_key_makes_valid_kubernetes_names():
    key = Attempt(job_id=1, number=1).key
    assert len(key) == 40
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job_name(key))
    assert len(job_name(key)) <= 63 and job_name(key).endswith(key)
    assert key_label(key) == key


# ----------------------------------------------------------------------------- PostgreSQL
@pytest.mark.service
@pytest.mark.xdist_group("postgres")
def test_postgresql_is_shared_by_several_daemons_as_before(tmp_path, postgres_url):
    """No lease on PostgreSQL: two homes' daemons both serve it; the instance id binds both
    runs folders."""
    store = Store(postgres_url)
    first = DaemonLease(store, node="a", home="/a", heartbeat_s=1, timeout_s=5)
    assert first.acquire() is None and not first.held
    assert serving(store, node="b", timeout_s=5) is None
    for name in ("home-a", "home-b"):
        Daemon(Wiring(_settings(tmp_path / name, postgres_url), server=True)).run(max_ticks=1)
        assert recorded(tmp_path / name / "runs")["instance"] == store.instance_id()
    with store.engine.connect() as c:
        assert c.exec_driver_sql("select count(*) from store_lease").scalar() == 0
