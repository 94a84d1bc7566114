"""Builds the parts a command needs from the settings: store, executor, loop, policy gate, audit.
Each part is built, and its modules imported, when first asked for: `nightshift jobs` needs the
store only, and the policy stack and the engine would double its start-up time.

Who asks is the kernel's answer, never a setting: here the process's OS user (the single-user
embedded mode), and in a shared install the daemon's peer uid (agent/doors/api_server.py). When the
daemon of a shared install serves its socket, `served_at` names it: the store is not this
process's to open, and the doors talk to that daemon instead (agent/doors/remote.py)."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightshift.runtime import read_settings
from nightshift.runtime.config import Settings, load_settings
from nightshift.runtime.errors import OperatorError, StoreError

if TYPE_CHECKING:
    from nightshift.agent.brain.loop import Loop
    from nightshift.agent.brain.second_opinion import LaterOpinions
    from nightshift.policies.approvals import Approvals
    from nightshift.policies.audit import AuditLog
    from nightshift.policies.engine import PolicyEngine
    from nightshift.policies.gate import Gate
    from nightshift.runtime.engine import Engine
    from nightshift.runtime.executors.executor import Executor
    from nightshift.runtime.store.db import Store
    from nightshift.runtime.training.attempt_diagnosis import SecondOpinion
    from nightshift.runtime.training.mlflow_mirror import Mirror
    from nightshift.skills.base import SkillContext

# How long a model's opinion waits for the loop to record the end of the attempt it is about.
ATTACH_WAIT_S = 60.0


class _AuditOnDemand:
    """The store's row recorder (runtime.store.db.RowRecorder), backed by the audit log that it
    creates only when a transition first needs it."""

    def __init__(self, log: Callable[[], Any]):
        self._log = log

    def record_in(self, conn: Any, events: list[dict[str, Any]]) -> Callable[[], None]:
        return self._log().record_in(conn, events)  # type: ignore[no-any-return]

    def authentic(self, event: Any) -> bool:
        return bool(self._log().authentic(event))


def local_now() -> datetime:
    """Naive UTC, the store's convention."""
    return datetime.now(UTC).replace(tzinfo=None)


def os_user_name(uid: int) -> str:
    """The user database's name for a uid (`uid-N` for one it does not list), not $USER or
    getpass, which read the environment."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


# The commands a client of the daemon has (README "Shared install"); the others open the store.
SERVED = (
    "skill, submit, sweep, sweep-stop, status, jobs, show, logs, cancel, retry, approve, reject, "
    "approvals, whoami"
)


def served_socket(settings: Settings) -> Path | None:
    """The daemon's socket when these settings make a command its client, else None: the
    single-user embedded mode (read_settings.served_socket)."""
    return read_settings.served_socket(settings.api.mode, settings.api_socket)


def not_served(socket_path: Path) -> OperatorError:
    """Why a command that opens the store does not run in client mode, and what to do."""
    return OperatorError(
        f"this command opens the store, which in this shared install belongs to the daemon "
        f"that serves {socket_path}; the daemon serves: {SERVED}. Run it as the daemon's user, "
        "or set api.mode: embedded for a store of your own"
    )


@dataclass
class Wiring:
    settings: Settings
    server: bool = False  # the daemon: it owns the state, and is never a client of itself
    # The loop's second opinions on their way (agent/brain/second_opinion.py), once the engine is
    # built with a model endpoint configured.
    opinions: LaterOpinions | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, config: str | None = None, *, server: bool = False) -> Wiring:
        return cls(load_settings(config), server=server)

    @cached_property
    def served_at(self) -> Path | None:
        """The socket of the daemon whose store this is, when this command is its client (a
        shared install), else None: the single-user embedded mode."""
        return None if self.server else served_socket(self.settings)

    def refuse_if_served(self) -> None:
        """For what opens the store itself: not in a shared install, where it is the daemon's."""
        if self.served_at is not None:
            raise not_served(self.served_at)

    @cached_property
    def store(self) -> Store:
        from nightshift.runtime.store.db import Store

        self.refuse_if_served()
        from nightshift.runtime.store.runs_binding import check_store_present

        check_store_present(self.settings.store_url, self.settings.runs_dir)
        self.settings.home_path.mkdir(parents=True, exist_ok=True)
        store = Store(self.settings.store_url, busy_timeout_s=self.settings.store.busy_timeout_s)
        # Every transition's audit event is chained in with the rows it moved (lifecycle), by
        # this wiring's audit log, loaded on the first transition: a read-only command such as
        # `jobs` never imports the audit's machinery.
        store.recorder = _AuditOnDemand(lambda: self.audit)
        return store

    @cached_property
    def executor(self) -> Executor:
        ex = self.settings.executor
        if ex.kind == "docker":
            from nightshift.runtime.executors.docker_executor import (
                DockerExecutor,  # needs the docker extra
            )

            return DockerExecutor(
                self.settings.runs_dir,
                base_url=ex.docker_url,
                network_mode=ex.network_mode,
                stop_grace_s=ex.stop_grace_s,
                pids_limit=ex.pids_limit,
            )
        if ex.kind == "ray":
            from nightshift.runtime.executors.ray_executor import RayExecutor  # needs the ray extra

            return RayExecutor(
                self.settings.runs_dir, address=ex.ray_address, stop_grace_s=ex.stop_grace_s
            )
        if ex.kind == "kubernetes":
            from nightshift.runtime.executors.kubernetes_executor import KubernetesExecutor

            return KubernetesExecutor(
                self.settings.runs_dir, settings=ex.kubernetes, stop_grace_s=ex.stop_grace_s
            )
        from nightshift.runtime.executors.local_executor import LocalExecutor

        return LocalExecutor(self.settings.runs_dir, cgroups=self.settings.run_cgroups)

    @cached_property
    def audit(self) -> AuditLog:
        from nightshift.policies.audit import AuditLog

        # From the settings: the key file and the publish sinks too, so a daemon publishes the
        # chain head on its schedule and every process that appended publishes it at exit. The
        # store's recorder hands its events to this log: one chain, one anchor per process.
        return AuditLog.from_settings(self.store, self.settings)

    @cached_property
    def approvals(self) -> Approvals:
        from nightshift.policies.approvals import Approvals

        return Approvals(self.store, self.audit, engine=self.policy)

    @cached_property
    def policy(self) -> PolicyEngine:
        return self._policy_engine()

    def _policy_engine(self) -> PolicyEngine:
        """The policy `apply_policy` stored, else the file's, followed at every verdict
        (policies/policy_source.py): where this process opens the store. A client of a shared
        install's daemon has the file's only; the daemon's own decides its calls. The policy
        layer also lends apply_policy its reviewer here (a skill may not import it)."""
        from nightshift.policies.engine import PolicyEngine
        from nightshift.policies.model import load_policy

        fallback = load_policy(self.settings.policy.file)
        if self.served_at is not None:
            return PolicyEngine(fallback)
        from nightshift.policies.policy_check import review
        from nightshift.policies.policy_source import LivePolicyEngine
        from nightshift.runtime.store.db import sqlite_file
        from nightshift.skills.apply_policy import lend_review

        lend_review(review)
        db = sqlite_file(self.settings.store_url)
        return LivePolicyEngine(
            fallback,
            lambda: self.store,
            lambda: self.audit,
            look_now=db is None or db.exists(),  # no store yet: nothing applied, none made
        )

    @cached_property
    def gate(self) -> Gate:
        from nightshift.policies.gate import Gate

        return Gate(self.policy, self.audit, self.approvals, self.store)

    @cached_property
    def engine(self) -> Engine:
        from nightshift.policies import killswitch
        from nightshift.runtime.engine import Engine
        from nightshift.runtime.store.runs_binding import bind_runs

        def on_event(action: str, payload: dict[str, Any]) -> None:
            self.audit.append("system", action, job_id=payload.get("job_id"), payload=payload)

        def paused() -> str | None:
            info = killswitch.pause_info(self.store)
            return (
                f"paused by {info['by']}: `nightshift resume` to start new work" if info else None
            )

        # Work starts only where the runs folder belongs to this store (runtime/store/runs_binding.py).
        bind_runs(self.store, self.settings.runs_dir)
        from nightshift.agent.brain.second_opinion import LaterOpinions, with_second_opinion
        from nightshift.skills.attempt_diagnosis import diagnose_attempt

        def opinion_asked(step: dict[str, Any]) -> None:
            self.audit.append("system", "llm.second_opinion", payload=step)

        # A person's correction of a log that ended the same way comes first (their category, the
        # rules' kept beside it); the loop never waits for the model: the opinion is attached
        # when it comes.
        diagnose = with_second_opinion(
            partial(diagnose_attempt, store=self.store),
            self.settings,
            on_call=opinion_asked,
            attach=self.attach_opinion,
        )
        self.opinions = diagnose if isinstance(diagnose, LaterOpinions) else None
        engine = Engine(
            self.store,
            self.executor,
            self.settings,
            on_event=on_event,
            paused=paused,
            diagnose=diagnose,
        )
        if self.mirror is not None:
            engine.run_env = self.mirror.env_for
        if self.server:  # the daemon, which holds the store's lease (agent/doors/daemon.py)
            engine.step = lambda: self.loop.step()  # whoever ticks, the whole loop's step runs
            return engine

        def step() -> None:
            try:
                self.refuse_foreign_daemon()
            except StoreError:
                pass  # a store fault: the loop's step meets it too, and waits it out
            self.loop.step()

        start = engine.start_background

        def start_background() -> None:
            self.refuse_foreign_daemon()  # here, in the caller's thread, before the loop's
            start()

        engine.step = step
        engine.start_background = start_background  # type: ignore[method-assign]
        return engine

    @cached_property
    def mirror(self) -> Mirror | None:
        """Each job mirrored as an MLflow run where `tracking.mlflow.uri` is set (its worker
        starts with the loop's first step: agent/brain/loop.py), else None."""
        if not self.settings.tracking.mlflow.uri:
            return None
        import sys

        from nightshift.runtime.training.mlflow_mirror import Mirror

        def note(action: str, payload: dict[str, Any]) -> None:
            self.audit.append("system", action, job_id=payload.get("job_id"), payload=payload)

        def report(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        return Mirror(self.store, self.settings, note=note, report=report)

    def stop_mirror(self, drain_s: float = 15.0) -> None:
        """Before this process ends: the mirror's last pass (bounded), so a job that just ended
        shows its end in MLflow."""
        if "mirror" in self.__dict__ and self.mirror is not None:
            self.mirror.stop(drain_s)

    def attach_opinion(self, attempt_id: int, opinion: SecondOpinion) -> bool:
        """Keep a model's second opinion with attempt `attempt_id`'s stored diagnosis, waiting
        (at most ATTACH_WAIT_S) for the loop to record the attempt's end; whether it was kept."""
        from nightshift.runtime.store import lifecycle

        end = time.monotonic() + ATTACH_WAIT_S
        while True:
            with self.store.write_session() as s:
                kept = lifecycle.attach_opinion(s, attempt_id, opinion.model_dump())
            if kept is not None:
                return kept
            if time.monotonic() > end:
                return False
            time.sleep(0.1)

    def drain_opinions(self) -> None:
        """Before this process ends: wait for the models' opinions still on their way (each is
        bounded), so that they are kept."""
        if self.opinions is not None:
            self.opinions.drain()

    def refuse_foreign_daemon(self) -> None:
        """This process drives a loop of its own (`nightshift run`, chat): not on a SQLite store
        that a daemon of another home serves, whose loop would place the same jobs. (A daemon of
        this home is seen by its lock, and the command leaves the loop to it.)"""
        from nightshift.runtime.store.db import utcnow
        from nightshift.runtime.store.runs_binding import shown_url
        from nightshift.runtime.store.store_lease import serving

        s = self.settings
        holder = serving(self.store, node=s.node, timeout_s=s.loop.lease_timeout_s)
        if holder is None or holder.home == str(s.home_path.resolve()):
            return
        raise OperatorError(
            f"a nightshift daemon of another home serves the store {shown_url(self.store.url)}: "
            f"{holder.describe(utcnow())}. A loop here would place the same jobs; nothing was "
            f"started. Run the command in that daemon's home (NIGHTSHIFT_HOME={holder.home}), "
            "stop that daemon, or give this home its own store (unset store.url / "
            "NIGHTSHIFT_STORE__URL)"
        )

    @cached_property
    def loop(self) -> Loop:
        from nightshift.agent.brain.loop import Loop

        return Loop(self)

    def energy_pricing(self) -> tuple[object, str | None]:
        """(cost_of(start, end, kwh), currency) from the configured tariff, or (None, None).
        An attempt's energy is spread evenly over its run time across the price windows."""
        tariff = self.settings.tariff
        if tariff is None:
            return None, None

        def cost_of(start: datetime, end: datetime, kwh: float) -> float:
            hours = (end - start).total_seconds() / 3600
            if hours <= 0:
                return kwh * tariff.price_at(start)
            return tariff.energy_cost(start, end, kwh * 1000 / hours)

        return cost_of, tariff.currency

    @property
    def user(self) -> str:
        """Who runs this process, as the kernel says: its effective uid's user name."""
        return os_user_name(os.geteuid())

    def context(self, principal: str, call_id: str | None = None) -> SkillContext:
        from nightshift.skills.base import SkillContext

        return SkillContext(
            store=self.store,
            settings=self.settings,
            now=local_now(),
            call_id=call_id,
            principal=principal,
            executor=self.executor,
            policy_limits=self.policy.limits(),
        )
