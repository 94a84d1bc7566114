"""The one loop: what every tick does, whether the daemon or a `nightshift run` drives it.

A tick checks GPU health when due (placement quarantines by those verdicts), watches and places
jobs (the engine), pauses the victims placement proposes — each pause through the gate as the
`system` principal —, carries out approved calls whose requester is gone (the daemon), and hands
failed jobs to recovery (the daemon's graph; a goal run recovers its own jobs in its graph).
The daemon's loop also drives the sweeps (runtime/scheduling/sweeps.py): it tells, prunes and asks for
their trials, each trial submitted through the gate as the sweep's owner.

The loop survives its environment. A step that meets a fault the operator must fix — a full disk
or quota, a store locked past store.busy_timeout_s, a store file deleted or replaced (checked
with one os.stat per step) — is cut short and reported once, in one line that says what to fix;
the loop then waits (1 s, doubling, at most 60 s) and tries again, and says so when a step runs
clean again. Runs go on meanwhile: they are processes of their own, watched again on recovery.
Any other error is a bug and surfaces.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlmodel import col, func, select

from nightshift.agent.brain.tick_heap import TickHeap
from nightshift.runtime.errors import (
    DiskFull,
    NightshiftError,
    OperatorError,
    StoreFull,
    StoreGone,
    StoreLocked,
    StoreUnavailable,
)
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.store.db import Attempt, Job, Sweep, utcnow
from nightshift.runtime.store.lifecycle import JobState

if TYPE_CHECKING:
    from nightshift.agent.brain.power_caps import PeakPowerCaps
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.scheduling.sweeps import SweepDriver

Say = Callable[[str, dict[str, Any]], None]

# A job moved this long before the last recovery scan began is read again by the next one.
RESCAN_SLACK = timedelta(minutes=1)
# Waits after a faulted step: 1 s, 2 s, 4 s … 60 s (one loop: no jitter to spread).
FAULT_BACKOFF = Backoff(base_s=1.0, factor=2.0, cap_s=60.0, jitter_frac=0.0)


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _kind(fault: OperatorError | None) -> str:
    """What makes two faults the same one: the class, or the text of a general store error
    (a log file after another on a full disk is still one full disk)."""
    specific = (StoreFull, StoreLocked, StoreGone, StoreUnavailable, DiskFull)
    return type(fault).__name__ if isinstance(fault, specific) else str(fault)


class Loop:
    def __init__(
        self,
        w: Wiring,
        *,
        say: Say | None = None,
        report: Callable[[str], None] | None = None,
        fault_backoff: Backoff = FAULT_BACKOFF,
    ):
        self.w = w
        self.say: Say = say or (lambda kind, data: None)
        # Where a fault and its recovery are told (one line each); stderr unless replaced.
        self.report: Callable[[str], None] = report or print_line
        self.fault_backoff = fault_backoff
        # Set by the daemon: hand failed or paused jobs to recovery, carry out orphaned approvals.
        self.recover: Callable[[int, int], None] | None = None
        self.carry_out_approved = False
        # Set by the daemon: ask, tell and prune the sweeps' trials (runtime/scheduling/sweeps.py).
        self.drive_sweeps = False
        self._sweeps: SweepDriver | None = None
        self._power: PeakPowerCaps | None = None
        self._last_health = float("-inf")
        self.fault: OperatorError | None = None  # the fault the last step met, until one runs
        self._fault_since = 0.0
        self._fault_steps = 0  # faulted steps in a row
        self._retry_at = float("-inf")
        self._scanned_at: datetime | None = None  # when the recovery scan last began
        # Set by the daemon's metrics: told each step's duration in seconds (faulted or not).
        self.on_tick: Callable[[float], None] | None = None
        # Set by the daemon: freeze what outlives a step out of the collector's walks.
        self.heap: TickHeap | None = None

    def step(self) -> None:
        """One step, unless a fault is being waited out; a fault ends the step (reported once
        and retried with backoff), any other error is raised."""
        now = time.monotonic()
        if now < self._retry_at:
            return
        try:
            self.w.store.check_file()  # a store nobody reads any more gets no new work
            self._step()
            if self.heap is not None:
                self.heap.after_tick()
        except Exception as exc:
            fault = self.w.store.fault_of(exc)
            if fault is None:
                raise
            self._faulted(fault, now)
            return
        finally:
            if self.on_tick is not None:
                self.on_tick(time.monotonic() - now)
        if self.fault is not None:
            self._recovered(now)

    def survive(self, what: str, fn: Callable[[], object]) -> None:
        """Run `fn` (the daemon's start and stop records); a fault is reported, not raised."""
        try:
            self.w.store.check_file()
            fn()
        except Exception as exc:
            fault = self.w.store.fault_of(exc)
            if fault is None:
                raise
            self.report(f"warning: could not record {what}: {fault}")

    def _faulted(self, fault: OperatorError, now: float) -> None:
        first = self.fault is None
        self._fault_steps += 1
        wait = self.fault_backoff.delay_s(self._fault_steps, 0)
        self._retry_at = now + wait
        if first:
            self._fault_since = now
        if first or _kind(fault) != _kind(self.fault):
            self.report(
                f"warning: the loop cannot go on: {fault}. Running jobs keep running; the loop "
                f"retries in {wait:g} s, then at most every {self.fault_backoff.cap_s:g} s"
            )
            self.say("fault", {"error": str(fault), "kind": type(fault).__name__, "retry_s": wait})
        self.fault = fault

    def _recovered(self, now: float) -> None:
        fault, self.fault = self.fault, None
        lasted = now - self._fault_since
        self._fault_steps, self._retry_at = 0, float("-inf")
        self.report(
            f"recovered: the loop runs again; the fault ({type(fault).__name__}) cleared after "
            f"{lasted:.0f} s"
        )
        self.say("recovered", {"error": str(fault), "seconds": round(lasted, 1)})
        payload = {"fault": type(fault).__name__, "error": str(fault), "seconds": round(lasted, 1)}
        self.survive(
            "the loop's recovery in the audit",
            lambda: self.w.audit.append("system", "loop.recovered", payload=payload),
        )

    def _step(self) -> None:
        mirror = getattr(self.w, "mirror", None)
        if mirror is not None:  # MLflow: a worker of its own, started with the loop
            mirror.start()
        self._health_check_if_due()
        self.w.engine.tick()
        self._cap_power()
        if self.drive_sweeps:
            self._drive_sweeps()
        self._preempt()
        if self.carry_out_approved:
            self._carry_out_orphans()
        if self.recover is not None:
            for job_id, attempts in self._needing_recovery():
                self.recover(job_id, attempts)

    def _system_call(self, skill: str, args: dict[str, Any]) -> Any:
        return self.w.gate.call(self.w.context("system"), skill, args, via="system")

    def _health_check_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_health < self.w.settings.loop.health_interval_min * 60:
            return
        self._last_health = now
        try:
            self._system_call("gpu_health_check", {})
        except NightshiftError as exc:  # a failed check is in the audit; keep going
            if self.w.store.fault_of(exc) is not None:
                raise
            self.say("health", {"error": str(exc)})

    def _cap_power(self) -> None:
        """GPUs of cost_sensitive jobs capped at peak price and their limits put back after
        (agent/brain/power_caps.py), each change a set_power_limit call by `system`."""
        if self._power is None:
            from nightshift.agent.brain.power_caps import PeakPowerCaps

            def note(action: str, payload: dict[str, Any]) -> None:
                self.w.audit.append("system", action, payload=payload)
                self.say(action, payload)

            self._power = PeakPowerCaps(
                self.w.store,
                self.w.settings,
                self.w.policy,
                lambda args: self._system_call("set_power_limit", args),
                note,
                running=lambda: self.w.engine.last_running,
            )
        self._power.step(self.w.engine.clock())

    def _preempt(self) -> None:
        """Placement only proposes; each pause passes the gate as a `modify` by `system`."""
        decision = self.w.engine.last_decision
        if not decision:
            return
        proposals, decision.preemptions = decision.preemptions, []  # the next tick proposes afresh
        for p in proposals:
            try:
                self._system_call(
                    "pause_job",
                    {
                        "job_id": p.victim_job_id,
                        "reason": f"preempted for job {p.for_job_id}: {p.reason}",
                        "preempted_for": p.for_job_id,
                    },
                )
            except NightshiftError as exc:
                if self.w.store.fault_of(exc) is not None:
                    raise  # the step stops here
                self.say("preempt", {"job_id": p.victim_job_id, "error": str(exc)})

    def _drive_sweeps(self) -> None:
        """Each running sweep's trials: told, reported, pruned and asked for; each trial is
        submitted through the gate as the sweep's owner, under a call id of its own."""
        if self._sweeps is None:
            from nightshift.runtime.scheduling.sweeps import SweepDriver

            def on_event(action: str, payload: dict[str, Any]) -> None:
                self.w.audit.append("system", action, job_id=payload.get("job_id"), payload=payload)
                self.say(action, payload)

            settings = self.w.settings
            self._sweeps = SweepDriver(
                self.w.store,
                self.w.engine,
                self._submit_trial,
                on_event=on_event,
                clock=self.w.engine.clock,
                share=settings.scheduler.sweep_share,
                cpu_slots=settings.loop.cpu_slots,
                node=settings.node,
            )
        self._sweeps.tick()

    def _submit_trial(self, sweep: Sweep, number: int, params: dict[str, Any]) -> int | None:
        """One trial as an ordinary job (submit_job: the policy's limits, tariffs, priorities
        and recovery apply); None while an approval holds it. SweepRefused for good."""
        from nightshift.runtime.errors import ApprovalRequired
        from nightshift.runtime.scheduling.sweeps import SweepRefused, call_key

        assert sweep.id is not None
        ctx = self.w.context(sweep.owner, call_key(sweep.id, number))
        args = {"spec": sweep.spec, "params": params, "group": sweep.name}
        try:
            result = self.w.gate.call(ctx, "submit_job", args, via="system")
        except ApprovalRequired:
            return None
        except NightshiftError as exc:
            if self.w.store.fault_of(exc) is not None:
                raise
            raise SweepRefused(str(exc)) from exc
        return int(result.job_id)  # type: ignore[attr-defined]

    def _carry_out_orphans(self) -> None:
        """Approved calls nobody is carrying out (the requester's shell closed, its process was
        killed): run each once, as its requester, through the same checks."""
        for row in self.w.approvals.orphaned(utcnow()):
            self.say("approved", {"approval_id": row.id, "skill": row.skill})
            try:
                self.w.gate.resume(row.id, self.w.context)  # type: ignore[arg-type]
            except NightshiftError as exc:  # recorded on the approval and in the audit
                if self.w.store.fault_of(exc) is not None:
                    raise
                self.say("approved", {"approval_id": row.id, "error": str(exc)})

    def _needing_recovery(self) -> list[tuple[int, int]]:
        """Failed and paused jobs whose last attempt this node ran: one daemon recovers each.
        A job a person holds is `held`, never here: recovery does not undo a person's pause.

        Only what changed since the last scan is read (jobs moved since it began, with a minute
        of slack for transactions that committed late); the first scan reads them all."""
        now = self.w.engine.clock()
        since, self._scanned_at = self._scanned_at, now - RESCAN_SLACK
        with self.w.store.session() as s:
            q = (
                select(Job.id, func.count(Attempt.id), func.max(Attempt.id))
                .join(Attempt, Attempt.job_id == Job.id)
                .where(col(Job.state).in_((JobState.FAILED, JobState.PAUSED)))
            )
            if since is not None:
                q = q.where(col(Job.updated_at) >= since)
            rows = s.exec(q.group_by(Job.id)).all()
            last = (
                dict(
                    s.exec(
                        select(Attempt.id, Attempt.node).where(
                            col(Attempt.id).in_([r[2] for r in rows])
                        )
                    ).all()
                )
                if rows
                else {}
            )
        node = self.w.settings.node
        return [(j, n) for j, n, a in rows if last.get(a) in (node, "")]
