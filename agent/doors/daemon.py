"""`nightshift daemon`: the one loop (agent/brain/loop.py), run for as long as it lives.

Each tick checks health, places and watches (the engine), preempts through the gate, carries out
approved calls whose requester is gone, and hands every failed or paused job to the agent graph as
a `recover job N` goal, so each change to a job passes the policy gate and lands in the audit.
The recoveries run in a worker thread of their own (agent/brain/recovery.py), never in the tick.

A full disk, a store locked past its busy timeout or a store file deleted under it does not end
the daemon: the loop reports the fault once, waits it out with backoff and says when it cleared
(agent/brain/loop.py), while the runs go on.

One daemon serves a SQLite store, whichever home it runs from: at start it takes the store's
lease (runtime/store/store_lease.py), renews it as it ticks and deletes it when it stops, and it binds
the runs folder to the store (runtime/store/runs_binding.py), so a store missing, recreated or already
served is refused before any work starts. Daemons of several nodes share a PostgreSQL store.

The daemon owns its state: at start its home folder is made 0700 and the store, anchor and lock
files in it not writable by group or others (keys/ is 0700 already, policies/audit.py), and a
policy file others could write is refused. With `serve_api` it serves the API on its Unix socket
(agent/doors/api_server.py) while it runs: in a shared install the CLI of every other user goes
through it, known by uid. With Slack or WeChat Work configured it posts approval cards and
notifications there and serves their callbacks (agent/doors/channels/service.py), in threads of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightshift.agent.brain.graph import build_graph, sqlite_checkpointer
from nightshift.agent.brain.planner import DeterministicPlanner, Planner
from nightshift.agent.brain.recovery import Recoveries
from nightshift.agent.brain.tick_heap import TickHeap
from nightshift.agent.brain.wiring import Wiring, os_user_name
from nightshift.agent.doors.daemon_log import AttemptLines, start_lines
from nightshift.runtime import locks
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import OperatorError
from nightshift.runtime.executors import run_cgroup
from nightshift.runtime.store.db import utcnow
from nightshift.runtime.store.runs_binding import bind_runs
from nightshift.runtime.store.store_lease import DaemonLease

# Files in the home folder that only the daemon's user may write.
STATE_FILES = (
    "nightshift.db",
    "nightshift.db-wal",
    "nightshift.db-shm",
    "graph.db",
    "graph.db-wal",
    "graph.db-shm",
    "audit.anchor",
    "audit.since",
    "daemon.lock",
    "config.yaml",
)


def own_state(settings: Settings, config: str | None = None) -> None:
    """The home folder 0700 (made so if it is this user's), the state files in it not writable
    by group or others, a policy file and a config file (`--config`) that only their owner (this
    user or root) can write, and — where jobs run as their submitters — a daemon able to switch to
    them. Else an OperatorError naming the path and the fix."""
    home, me = settings.home_path, os.geteuid()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = home.stat()
    if st.st_uid != me:
        raise OperatorError(
            f"the daemon's home {home} belongs to {os_user_name(st.st_uid)}, not to "
            f"{os_user_name(me)}, which runs the daemon: `chown -R {os_user_name(me)} {home}`, "
            "or run the daemon as its owner"
        )
    try:
        if st.st_mode & 0o777 != 0o700:
            home.chmod(0o700)
        for name in STATE_FILES:
            path = home / name
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue
            if mode & 0o022:
                path.chmod(mode & 0o755)
    except OSError as exc:
        raise OperatorError(
            f"cannot keep {exc.filename or home} to the daemon's user: {exc.strerror or exc}"
        ) from exc
    if settings.policy.file:
        only_owner_writes(Path(settings.policy.file).expanduser(), "policy file", me)
    if config is not None:
        only_owner_writes(Path(config).expanduser(), "config file", me)
    if settings.jobs_run_as_submitter:
        can_run_as_submitters(settings)


def only_owner_writes(path: Path, what: str, me: int) -> None:
    """A file that decides who may do what (the policy, the config that names it) is refused
    when anyone but root or the daemon's user could change it."""
    try:
        st = path.stat()
    except OSError:
        return  # loading it says what is wrong
    if st.st_uid not in (0, me) or st.st_mode & 0o022:
        raise OperatorError(
            f"{what} {path} can be changed by others (owner {os_user_name(st.st_uid)}, "
            f"mode {st.st_mode & 0o777:04o}): whoever writes it decides who may do what. "
            f"`chown {os_user_name(me)} {path}; chmod go-w {path}`"
        )


def can_run_as_submitters(settings: Settings) -> None:
    """A daemon that runs each job as its submitter (a shared install, executor.run_as) must be
    able to: it starts as root, with a runs folder outside its 0700 home that jobs can pass
    through (0711: each job's own folder is its submitter's, 0700) and an executor that can
    start a run as another account. Else an OperatorError naming the fix, before any work."""
    why = (
        "this daemon serves other users "
        f"({settings.api_socket}, mode {settings.api.socket_mode}) and runs each job as its "
        "submitter"
        if settings.executor.run_as == "auto"
        else "executor.run_as is submitter: each job runs as its submitter"
    )
    if os.geteuid() != 0:
        raise OperatorError(
            f"{why}, which needs a daemon started as root (it switches to the submitter's uid "
            f"for each run); it runs as {os_user_name(os.geteuid())}. Start it as root (README "
            "Shared install: the systemd unit), or set executor.run_as: daemon to run every job "
            "with this daemon's rights (then anyone who may submit may act as the daemon)"
        )
    if settings.executor.kind == "ray":
        raise OperatorError(
            f"{why}, but a Ray job runs as the Ray cluster's user, whoever submitted it: use the "
            "local, docker or kubernetes executor, or set executor.run_as: daemon"
        )
    runs, home = settings.runs_dir.expanduser().resolve(), settings.home_path.resolve()
    if runs.is_relative_to(home):
        raise OperatorError(
            f"{why}, and its runs folder {runs} is inside the daemon's home {home}, which no job "
            "may enter: set executor.runs_dir to a folder of its own, e.g. "
            "/var/lib/nightshift-runs"
        )
    runs.mkdir(mode=0o711, parents=True, exist_ok=True)
    st = runs.stat()
    if st.st_uid != 0:
        raise OperatorError(
            f"the runs folder {runs} belongs to {os_user_name(st.st_uid)}, who could swap any "
            f"job's folder: `chown root: {runs}`"
        )
    runs.chmod(0o711)
    if settings.executor.kind == "local" and settings.run_cgroups == "required":
        _can_make_cgroups(why)


def _can_make_cgroups(why: str) -> None:
    """A run as its submitter goes in a cgroup of its own (limits the job cannot raise, every
    process found): make and remove one now, rather than fail each run later."""
    try:
        run_cgroup.make(f"start-check.{os.getpid()}", run_cgroup.CgroupLimits()).remove()
    except run_cgroup.CgroupUnavailable as exc:
        raise OperatorError(
            f"{why}, and each run goes in a cgroup of its own, but {exc}: run the daemon as "
            "a service with its own cgroup subtree (README Shared install: Delegate=yes), or "
            "set executor.cgroups: off to run jobs without kernel limits"
        ) from None


class DaemonLock:
    """One daemon per NIGHTSHIFT_HOME: two loops would both place the same queued job."""

    def __init__(self, home: Path):
        self.path = home / "daemon.lock"
        self._held: locks.Held | None = None

    def acquire(self) -> None:
        held = locks.try_exclusive(self.path)
        if held is None:
            raise OperatorError(
                f"another nightshift daemon holds {self.path} (pid "
                f"{locks.note(self.path) or '?'}); stop it first"
            )
        held.write_note(str(os.getpid()))
        self._held = held

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    @staticmethod
    def held(home: Path) -> bool:
        """Whether a live daemon holds the lock (a stale file from a killed one does not count)."""
        return locks.is_held(home / "daemon.lock")


class Daemon:
    def __init__(
        self,
        w: Wiring,
        planner: Planner | None = None,
        on_progress: Callable[[str, dict[str, Any]], None] | None = None,
        *,
        serve_api: bool = False,
        say: Callable[[str], None] | None = None,
        config: str | None = None,
    ):
        self.w = w
        self.config = config  # the --config file, held to the policy file's rule
        self.serve_api = serve_api
        self.tell = say or (lambda message: None)
        self.say = on_progress or (lambda kind, data: None)
        self.graph = build_graph(
            w,
            planner or DeterministicPlanner(),
            checkpointer=sqlite_checkpointer(w),
            on_progress=on_progress,
        )
        self.lock = DaemonLock(w.settings.home_path)
        self.lease: DaemonLease | None = None  # on a SQLite store, from run() on
        self.stop_event = threading.Event()
        self.recoveries = Recoveries(w, self.graph, say=self.say, tell=self.tell)
        self.attempt_lines: AttemptLines | None = None  # from run() on: a line per start and end
        self.idle: Any = None  # from run() on: the idle-GPU rule (agent/doors/idle_gpu.py)
        w.loop.say = self.say
        w.loop.recover = self.recoveries.request
        w.loop.carry_out_approved = True
        w.loop.drive_sweeps = True
        w.loop.heap = TickHeap()  # a long queue's objects out of the collector's walks

    def run(self, *, max_ticks: int | None = None) -> None:
        """Tick until stopped (SIGTERM/SIGINT set `stop_event`). Runs keep going when the daemon
        stops; the next daemon re-attaches to them."""
        own_state(self.w.settings, self.config)
        self.lock.acquire()
        api = channels = web = None
        try:
            self._serve_store()
            for line in start_lines(self.w.settings, serve_api=self.serve_api):
                self.tell(line)
            self.attempt_lines = AttemptLines(self.w.store, self.w.settings.node)
            for line in self.attempt_lines.begin():
                self.tell(line)
            from nightshift.agent.doors.channels.service import ChannelService

            channels = ChannelService(self.w, say=self.tell)
            channels.start(serve=False)
            web = self._web(channels)
            self.idle = self._idle_watch(channels)
            if self.serve_api:
                from nightshift.agent.doors.api_server import ApiServer

                api = ApiServer(self.w, say=self.tell)
                if api.start():
                    self.tell(f"API on {api.path} (mode {self.w.settings.api.socket_mode})")
            self._run(max_ticks)
        finally:
            if api is not None:
                api.stop()
            if web is not None:
                web.stop()
            if channels is not None:
                channels.stop()
            if self.lease is not None and not self.lease.release():
                self.tell(
                    "warning: could not delete this daemon's lease on the store; it goes stale"
                )
            self.lock.release()
            TickHeap.release()  # the process may go on without this daemon (a test's does)

    def _web(self, channels: Any) -> Any:
        """The daemon's HTTP app (callbacks, /metrics, and the dashboard where `web.listen` is
        set) on `web.listen`, else on channels.listen where a channel receives callbacks; None
        where neither asks for one."""
        from nightshift.agent.doors.web.metrics import Metrics
        from nightshift.agent.doors.web.server import WebServer

        s = self.w.settings
        routes = channels.routes()
        listen = s.web.listen or (s.channels.listen if routes else None)
        if not listen:
            return None
        metrics = None
        if s.metrics.enabled:
            cost_of, currency = self.w.energy_pricing()
            metrics = Metrics(self.w.store, s, cost_of=cost_of, currency=currency)
            self.w.loop.on_tick = metrics.observe_tick
        dashboard = None
        if s.web.listen and s.web.dashboard:
            from nightshift.agent.doors.web.dashboard import Dashboard

            dashboard = Dashboard(self.w, say=self.tell)
        try:
            web = WebServer(
                listen,
                routes,
                self.tell,
                limits=s.channels,
                refusals=channels.desk.refusals,
                metrics=metrics,
                dashboard=dashboard,
            )
        except OSError as exc:
            key = "web.listen" if s.web.listen else "channels.listen"
            raise OperatorError(f"{key} {listen}: cannot listen ({exc.strerror or exc})") from None
        web.start()
        paths = [
            *routes,
            *(["/metrics"] if metrics is not None else []),
            *(["/ (dashboard)"] if dashboard is not None else []),
        ]
        self.tell(f"HTTP on {web.address} ({', '.join(paths) or '/healthz'})")
        return web

    def _idle_watch(self, channels: Any) -> Any:
        """The idle-GPU rule, its notices through the channels' outbox where any is set up."""
        from nightshift.agent.doors.channels.base import Notice
        from nightshift.agent.doors.idle_gpu import IdleAlert, IdleWatch

        def notify(a: IdleAlert) -> None:
            channels.outbox.queue_notice(
                Notice(
                    key=f"idle_gpu:{a.host}:{a.index}:{a.kind}:{a.since.isoformat()}",
                    kind="idle_gpu",
                    title=a.title,
                    lines=(
                        f"utilisation {a.utilization_pct:g} % (under "
                        f"{self.w.settings.alerts.idle_gpu.threshold_pct:g} %) since "
                        f"{a.since:%Y-%m-%d %H:%M} UTC (alerts.idle_gpu)",
                    ),
                )
            )

        return IdleWatch(
            self.w.store,
            self.w.audit,
            self.w.settings,
            notify=notify if channels.active else None,
        )

    def _serve_store(self) -> None:
        """Take the store's lease (one daemon per SQLite store, whichever home it runs from),
        then bind the runs folder to the store: a store missing, recreated or served by another
        daemon is refused here, before any work starts."""
        s = self.w.settings
        self.lease = DaemonLease(
            self.w.store,
            node=s.node,
            home=str(s.home_path.resolve()),
            heartbeat_s=s.loop.lease_heartbeat_s,
            timeout_s=s.loop.lease_timeout_s,
        )
        taken = self.lease.acquire()
        if taken is not None:
            gone = taken.describe(utcnow())
            self.tell(f"the store's lease was left by a daemon that is gone; taken over: {gone}")
        bind_runs(self.w.store, s.runs_dir)

    def _run(self, max_ticks: int | None) -> None:
        self.w.loop.survive(
            "the daemon's start in the audit",
            lambda: self.w.audit.append("system", "daemon.start", payload={"pid": os.getpid()}),
        )
        ticks = 0
        self.recoveries.start()
        try:
            while not self.stop_event.is_set():
                self._heartbeat()
                self.step()
                ticks += 1
                if max_ticks is not None and ticks >= max_ticks:
                    break
                self.stop_event.wait(self.w.engine.wait_s())  # ends at a price change
        finally:
            self.recoveries.stop()
            self.w.drain_opinions()  # the models' opinions still on their way are kept
            self.w.engine.drain_provenance()  # the package lists still being read are kept
            self.w.stop_mirror()  # MLflow shows what ended last (a bounded last pass)
            self.w.loop.survive(
                "the daemon's stop in the audit",
                lambda: self.w.audit.append(
                    "system", "daemon.stop", payload={"pid": os.getpid(), "ticks": ticks}
                ),
            )

    def step(self) -> None:
        self.w.loop.step()
        self.recoveries.poll_waiting()
        self._tell_attempts()
        self._check_idle()

    def _check_idle(self) -> None:
        """The idle-GPU rule (every 30 s at most); a store fault is the loop's to report."""
        if self.idle is None:
            return
        try:
            self.idle.check()
        except Exception as exc:
            if self.w.store.fault_of(exc) is None:
                raise

    def _tell_attempts(self) -> None:
        """A line for each attempt started or ended in this step; a store fault is the loop's
        to report (it met it too), and the lines come on the step after it clears."""
        if self.attempt_lines is None:
            return
        try:
            lines = self.attempt_lines.poll()
        except Exception as exc:
            if self.w.store.fault_of(exc) is None:
                raise
            return
        for line in lines:
            self.tell(line)

    def _heartbeat(self) -> None:
        """Renew the store's lease when due. A store fault is left to the loop's step, which
        meets it too and reports it once; a lease taken over by another daemon ends this one."""
        if self.lease is None:
            return
        try:
            self.lease.renew()
        except Exception as exc:
            if self.w.store.fault_of(exc) is None:
                raise
