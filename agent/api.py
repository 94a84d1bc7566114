"""The library API: what a script does instead of shelling out to the CLI. Every call passes the
same policy gate and lands in the same audit as the CLI and the agent."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nightshift.agent.wiring import Wiring
from nightshift.policies.gate import Confirm, Via
from nightshift.runtime.errors import ApprovalRequired


class Client:
    """`Client().submit("spec.yaml", params={"lr": 1e-3})` — one Wiring per process."""

    def __init__(
        self, wiring: Wiring | None = None, principal: str | None = None, via: Via = "api"
    ):
        self.w = wiring or Wiring.load()
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
