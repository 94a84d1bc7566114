"""Shared by the skills that end a live run (cancel_job, pause_job): stop it through the executor
and record how it ended through the lifecycle, so the loop finds the attempt already closed and
the attempt keeps its exit status and energy like any other."""

from __future__ import annotations

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store import lifecycle
from nightshift.runtime.store.db import Attempt
from nightshift.skills.base import SkillContext


def stop_attempt(ctx: SkillContext, live: Attempt) -> int:
    """Stop `live` (SIGTERM, then SIGKILL after the grace period); returns its number. The job
    was moved first (held, paused, cancelled): that move gives the attempt its outcome."""
    if ctx.executor is None:
        raise SkillFailed("a run is live but no executor was given to stop it")
    status = ctx.executor.stop(live.handle, grace_s=ctx.settings.executor.stop_grace_s)
    with ctx.store.write_session() as s:
        att = s.get(Attempt, live.id)
        if att is not None:
            lifecycle.end_attempt(
                s, att, lifecycle.Ended.of(status, stopped=True), ctx.now, by=ctx.principal
            )
    return live.number
