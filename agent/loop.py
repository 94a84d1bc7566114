"""The one loop: what every tick does, whether the daemon or a `nightshift run` drives it.

A tick checks GPU health when due (placement quarantines by those verdicts), watches and places
jobs (the engine), pauses the victims placement proposes — each pause through the gate as the
`system` principal —, carries out approved calls whose requester is gone (the daemon), and hands
failed jobs to recovery (the daemon's graph; a goal run recovers its own jobs in its graph).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlmodel import func, select

from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.store import Attempt, Job

if TYPE_CHECKING:
    from nightshift.agent.wiring import Wiring

Say = Callable[[str, dict[str, Any]], None]


class Loop:
    def __init__(self, w: Wiring, *, say: Say | None = None):
        self.w = w
        self.say: Say = say or (lambda kind, data: None)
        # Set by the daemon: hand failed or paused jobs to recovery, carry out orphaned approvals.
        self.recover: Callable[[int, int], None] | None = None
        self.carry_out_approved = False
        self._last_health = float("-inf")

    def step(self) -> None:
        self._health_check_if_due()
        self.w.engine.tick()
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
            self.say("health", {"error": str(exc)})

    def _preempt(self) -> None:
        """Placement only proposes; each pause passes the gate as a `modify` by `system`."""
        decision = self.w.engine.last_decision
        for p in decision.preemptions if decision else []:
            try:
                self._system_call(
                    "pause_job",
                    {
                        "job_id": p.victim_job_id,
                        "reason": f"preempted for job {p.for_job_id}: {p.reason}",
                    },
                )
            except NightshiftError as exc:
                self.say("preempt", {"job_id": p.victim_job_id, "error": str(exc)})
        if decision:
            decision.preemptions = []  # acted on (or refused); the next tick proposes afresh

    def _carry_out_orphans(self) -> None:
        """Approved calls nobody is carrying out (the requester's shell closed, its process was
        killed): run each once, as its requester, through the same checks."""
        from nightshift.agent.wiring import local_now

        for row in self.w.approvals.orphaned(local_now()):
            self.say("approved", {"approval_id": row.id, "skill": row.skill})
            try:
                self.w.gate.resume(row.id, self.w.context)  # type: ignore[arg-type]
            except NightshiftError as exc:  # recorded on the approval and in the audit
                self.say("approved", {"approval_id": row.id, "error": str(exc)})

    def _needing_recovery(self) -> list[tuple[int, int]]:
        with self.w.store.session() as s:
            rows = s.exec(
                select(Job.id, func.count(Attempt.id))
                .join(Attempt, Attempt.job_id == Job.id)
                .where(Job.state.in_(("failed", "paused")))
                .group_by(Job.id)
            ).all()
        return [(j, n) for j, n in rows]
