"""The library API: what a script does instead of shelling out to the CLI. Every call passes the
same policy gate and lands in the same audit as the CLI and the agent.

In a shared install (agent/doors/remote.py says when) the calls go to the daemon's socket, and the
caller is the uid the kernel reports there: no `principal` can be named.

A call that the store fails under (a full disk, a lock held too long) is never reported as a
plain failure once it had started: it may have taken effect (a job queued, its result not yet
recorded), so it raises CallInDoubt with its call id and the jobs it queued; calling again with
that call id answers from what it did instead of doing it twice."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.remote import remote_of
from nightshift.policies.gate import Confirm, Via
from nightshift.runtime.errors import ApprovalRequired, BadArguments, CallInDoubt, OperatorError


class Client:
    """`Client().submit("spec.yaml", params={"lr": 1e-3})` — one Wiring per process."""

    def __init__(
        self, wiring: Wiring | None = None, principal: str | None = None, via: Via = "api"
    ):
        self.w = wiring or Wiring.load()
        self.remote = remote_of(self.w)
        if principal is not None and self.remote is not None:
            raise BadArguments(
                f"principal={principal!r}: a client of the daemon at {self.remote.path} is "
                "the uid the kernel reports for it, and names no one"
            )
        self.principal = principal or self.w.user
        self.via = via

    def call(
        self,
        skill_name: str,
        args: dict[str, Any],
        *,
        call_id: str | None = None,
        confirm: Confirm | None = None,
        wait: Callable[[ApprovalRequired], object] | None = None,
    ) -> BaseModel:
        """Run one skill through the gate. A call that needs approval raises ApprovalRequired
        (call again with the same `call_id` once it is decided), unless `wait` is given: it is
        handed the pending approval and returns when it is decided; the call then runs, or
        raises ApprovalRejected. `confirm` lets a person at a terminal answer for themselves
        where the policy allows it."""
        cid = call_id or f"api-{uuid.uuid4().hex}"
        while True:
            try:
                if self.remote is not None:  # the daemon's gate, as this process's uid
                    return self.remote.call(
                        skill_name, args, call_id=cid, via=self.via, confirm=confirm
                    )
                return self.w.gate.call(
                    self.w.context(self.principal, cid),
                    skill_name,
                    args,
                    via=self.via,
                    confirm=confirm,
                )
            except ApprovalRequired as exc:
                if wait is None:
                    raise
                wait(exc)
                confirm = None  # asked once; now it is the others' decision that counts
            except Exception as exc:
                if self.remote is not None:
                    raise  # the daemon has said what the store did
                fault = self.w.store.fault_of(exc)
                if fault is None:
                    raise
                raise self._in_doubt(skill_name, cid, fault) from exc

    def _in_doubt(self, skill_name: str, cid: str, fault: OperatorError) -> OperatorError:
        """The fault itself if the call never started; else CallInDoubt, naming the jobs it
        queued (reads still work on a full or write-locked store)."""
        from sqlmodel import col, select

        from nightshift.runtime.store.db import AuditEvent, Job
        from nightshift.skills.registry import registry

        found = registry().get(skill_name)
        if found is not None and found.capability == "read":
            return fault  # a read changes nothing: there is nothing to be in doubt about
        try:
            with self.w.store.session() as s:
                events = s.exec(
                    select(AuditEvent.action, AuditEvent.payload).where(AuditEvent.call_id == cid)
                ).all()
                jobs = sorted(
                    s.exec(
                        select(Job.id).where(
                            (col(Job.submitted_by_call) == cid)
                            | col(Job.submitted_by_call).startswith(f"{cid}#", autoescape=True)
                        )
                    ).all()
                )
        except Exception as exc:
            if self.w.store.fault_of(exc) is None:
                raise
            events, jobs = [("skill.start", {})], []  # cannot tell: assume it may have run
        actions = {action for action, _ in events}
        undone = any(  # a store-only call whose transaction was rolled back: nothing stayed
            action == "skill.result" and (payload or {}).get("rolled_back")
            for action, payload in events
        )
        if undone or ("skill.start" not in actions and not jobs):
            return fault  # nothing the call did stayed
        when = (
            "after its result was recorded"
            if "skill.result" in actions
            else "before its result was recorded"
        )
        done = (
            f"job {', '.join(map(str, jobs))} {'is' if len(jobs) == 1 else 'are'} queued"
            " (`nightshift jobs`; do not submit again)"
            if jobs
            else "it may have taken effect"
        )
        return CallInDoubt(
            f"{skill_name} started, then the store failed {when}: "
            f"{done}. The failure: {fault}. Once that is fixed, repeat the call with "
            f"call_id={cid!r}: it answers from what the call did and does not run it twice",
            call_id=cid,
            job_ids=[j for j in jobs if j is not None],
        )

    def submit(
        self,
        spec_path: str | None = None,
        *,
        spec: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        priority: int | None = None,
        call_id: str | None = None,
    ) -> int:
        """Queue a job; returns its id. The same call_id never queues twice."""
        args: dict[str, Any] = {"params": params or {}}
        if spec_path is not None:
            args["spec_path"] = spec_path
        if spec is not None:
            args["spec"] = spec
        if priority is not None:
            args["priority"] = priority
        return self.call("submit_job", args, call_id=call_id).job_id  # type: ignore[attr-defined]

    def submit_many(self, items: list[dict[str, Any]], *, call_id: str | None = None) -> list[int]:
        """Queue many jobs as one audited decision (each item as submit_job takes it): all
        validated and limit-checked, then stored in one transaction. Returns their ids."""
        result = self.call("submit_jobs", {"items": items}, call_id=call_id)
        return [j.job_id for j in result.jobs]  # type: ignore[attr-defined]
