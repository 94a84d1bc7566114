"""The library API: what a script does instead of shelling out to the CLI. Every call passes the
same policy gate and lands in the same audit as the CLI and the agent."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nightshift.agent.wiring import Wiring, local_now
from nightshift.runtime.errors import ApprovalRejected, PolicyDenied
from nightshift.skills.base import get_skill


class Client:
    """`Client().submit("spec.yaml", params={"lr": 1e-3})` — one Wiring per process."""

    def __init__(self, wiring: Wiring | None = None, principal: str | None = None):
        self.w = wiring or Wiring.load()
        self.principal = principal or self.w.user

    def call(self, skill_name: str, args: dict[str, Any], *, call_id: str | None = None,
             wait: Callable[[dict[str, Any]], str] | None = None) -> BaseModel:
        """Run one skill through the gate. A call that needs approval is refused unless `wait` is
        given: it receives the approval request and returns approved | rejected | expired."""
        with self.w.audit.batch():
            return self._call(skill_name, args, call_id, wait)

    def _call(self, skill_name: str, args: dict[str, Any], call_id: str | None,
              wait: Callable[[dict[str, Any]], str] | None) -> BaseModel:
        skill = get_skill(skill_name)
        skill.parse(args)
        cid = call_id or f"api-{uuid.uuid4().hex}"
        verdict = self.w.gate.check(self.principal, skill, args, cid, local_now())
        if verdict.decision == "deny":
            raise PolicyDenied(f"{skill_name}: denied by {verdict.rule}: {'; '.join(verdict.reasons)}")
        if verdict.decision == "needs_approval":
            if wait is None:
                raise ApprovalRejected(f"{skill_name} needs approval ({verdict.rule}); run it from "
                                       "the CLI or a goal file, which wait for the decision")
            appr = self.w.gate.request_approval(self.principal, skill, args, cid, verdict, local_now())
            state = wait({"approval_id": appr.id, "skill": skill_name, "args": args,
                          "rule": verdict.rule, "quorum": appr.quorum})
            if state != "approved":
                raise ApprovalRejected(f"{skill_name}: approval {appr.id} {state}; nothing ran")
        return self.w.gate.run(self.w.context(self.principal, cid), skill, args, verdict)

    def submit(self, spec_path: str | None = None, *, spec: dict[str, Any] | None = None,
               params: dict[str, Any] | None = None, priority: int | None = None,
               call_id: str | None = None) -> int:
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
