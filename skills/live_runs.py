"""Shared by the skills that end a live run (cancel_job, pause_job): stop it through the executor
and record how it ended, so the loop finds the attempt already closed."""

from __future__ import annotations

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store import Attempt
from nightshift.skills.base import SkillContext


def stop_attempt(ctx: SkillContext, live: Attempt, outcome: str) -> int:
    """Stop `live` (SIGTERM, then SIGKILL after the grace period); returns its number."""
    if ctx.executor is None:
        raise SkillFailed("a run is live but no executor was given to stop it")
    status = ctx.executor.stop(live.handle, grace_s=ctx.settings.executor.stop_grace_s)
    with ctx.store.session() as s:
        att = s.get(Attempt, live.id)
        att.state, att.outcome = "stopped", outcome
        att.exit_code, att.signal, att.ended_at = status.exit_code, status.signal, ctx.now
        s.add(att)
    return live.number
