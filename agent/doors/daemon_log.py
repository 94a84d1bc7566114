"""What the daemon's log says: at start, one line each for what it serves and how (home, store,
socket, executor, policy, whose account jobs run as); then one line when an attempt of a job
starts and one when it ends (with the time, and for a failed one its diagnosis), and nothing else
on a quiet night. An operator reading
`journalctl -u nightshift` should see which jobs ran, when, and how each attempt ended, without
opening the store."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import col, or_, select

from nightshift.agent.doors.effective_settings import mask_url
from nightshift.runtime.config import Settings
from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.store.lifecycle import ENDED_ATTEMPT
from nightshift.runtime.training.attempt_diagnosis import Diagnosis


def start_lines(settings: Settings, *, serve_api: bool) -> list[str]:
    """One line per thing the daemon serves or decides at start."""
    policy = settings.policy.file or "the shipped default (policies/default.yaml)"
    run_as = "their submitters" if settings.jobs_run_as_submitter else "this daemon's user"
    socket = (
        f"{settings.api_socket} (mode {settings.api.socket_mode})"
        if serve_api
        else f"not served (api.serve: false; clients open the store at {settings.home_path})"
    )
    return [
        f"home: {settings.home_path}",
        f"store: {mask_url(settings.store_url)}",
        f"socket: {socket}",
        f"executor: {settings.executor.kind}, runs in {settings.runs_dir}",
        f"policy file: {policy}",
        f"jobs run as {run_as} (executor.run_as: {settings.executor.run_as}); "
        f"run cgroups: {settings.run_cgroups} (executor.cgroups: {settings.executor.cgroups})",
    ]


class AttemptLines:
    """Tells, after each tick, the attempts of this node that started or ended since the last:
    it reads only attempts newer than the newest it has seen and those it saw running."""

    def __init__(self, store: Store, node: str):
        self.store, self.node = store, node
        self._newest = 0
        self._open: set[int] = set()  # attempts seen, not yet seen ended

    def begin(self) -> list[str]:
        """At start: remember where the attempts stand; name the runs a past daemon left going."""
        with self.store.session() as s:
            self._newest = s.exec(select(Attempt.id).order_by(col(Attempt.id).desc())).first() or 0
            rows = s.exec(
                select(Attempt, Job.name)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(col(Attempt.state).not_in(list(ENDED_ATTEMPT)), self._mine())
                .order_by(col(Attempt.id))
            ).all()
        for att, _ in rows:
            assert att.id is not None
            self._open.add(att.id)
        if not rows:
            return []
        named = ", ".join(f"job {a.job_id} ({name}) attempt {a.number}" for a, name in rows)
        return [f"re-attached to {len(rows)} run(s) still going: {named}"]

    def poll(self) -> list[str]:
        """One line per attempt started and per attempt ended since the last poll."""
        with self.store.session() as s:
            rows = s.exec(
                select(Attempt, Job.name)
                .join(Job, col(Job.id) == col(Attempt.job_id))
                .where(
                    or_(col(Attempt.id) > self._newest, col(Attempt.id).in_(sorted(self._open))),
                    self._mine(),
                )
                .order_by(col(Attempt.id))
            ).all()
        lines: list[str] = []
        for att, name in rows:
            assert att.id is not None
            self._newest = max(self._newest, att.id)
            if att.id not in self._open:
                lines.append(_started(att, name))
                self._open.add(att.id)
            if att.state in ENDED_ATTEMPT:
                lines.append(_ended(att, name))
                self._open.discard(att.id)
        return lines

    def _mine(self):  # type: ignore[no-untyped-def]
        return col(Attempt.node).in_((self.node, ""))


def _at(when: datetime | None) -> str:
    """`[23:04:11] `: when it happened, in this machine's local time (the store keeps UTC), so a
    log read from a file, not journald, still says when each run started and ended."""
    if when is None:
        return ""
    return f"[{when.replace(tzinfo=UTC).astimezone():%H:%M:%S}] "


def _started(att: Attempt, name: str) -> str:
    gpus = f"GPUs {','.join(map(str, att.gpus))}" if att.gpus else "no GPU"
    resumed = f", from step {att.start_step}" if att.start_step else ""
    return (
        f"{_at(att.started_at)}job {att.job_id} ({name}) attempt {att.number} started: "
        f"{att.executor} executor, {gpus}{resumed}"
    )


def _ended(att: Attempt, name: str) -> str:
    how = [f"exit {att.exit_code}"] if att.exit_code is not None else []
    if att.signal:
        how.append(f"signal {att.signal}")
    if att.last_step is not None:
        how.append(f"last step {att.last_step}")
    detail = f" ({', '.join(how)})" if how else ""
    diagnosis = Diagnosis.stored(att.diagnosis)
    why = f" — {diagnosis.brief()}" if diagnosis is not None else ""
    return (
        f"{_at(att.ended_at)}job {att.job_id} ({name}) attempt {att.number} ended: "
        f"{att.outcome or att.state}{detail}{why}"
    )
