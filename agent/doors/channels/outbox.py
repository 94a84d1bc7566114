"""The outbox: what each channel must show, written to the store before it is sent.

Every tick (the daemon's channel thread, never the scheduling loop) it
- queues a card for every pending approval on each channel its rule names, and queues the card
  again whenever it changes (a vote, the decision, the execution), wherever it was decided;
- queues one notice per job event (failed with its diagnosis, recovered, finished, early-stopped)
  read from the audit past a cursor, the rows and the cursor in one transaction, so each event
  is queued once;
- sends what is due. A channel that is down keeps its rows: each is tried again with backoff
  (the server's Retry-After when it gives one) and the request stays decidable from the CLI and
  the TUI meanwhile. The first failure of a row and the first success after failures are
  audited (`channel.send_failed`, `channel.recovered`); a card's first post is audited with
  where it went (`channel.posted`).

A notice sent just before a crash, with its row not yet marked sent, is sent again after the
restart (at least once); Slack and WeChat Work offer no idempotency key for a bot's message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import col, delete, select

from nightshift.agent.doors.channels.base import (
    ApprovalCard,
    Channel,
    ChannelDown,
    Notice,
    Posted,
    Vote,
)
from nightshift.policies.approvals import Approvals
from nightshift.policies.audit import AuditLog, write_transaction
from nightshift.policies.engine import PolicyEngine
from nightshift.runtime.config import ChannelsSettings
from nightshift.runtime.store.db import (
    Approval,
    AuditEvent,
    ChannelMessage,
    ChannelReceipt,
    Job,
    KeyValue,
    Store,
)

CURSOR = "channels.notice_cursor"
FINAL = ("rejected", "expired", "executed", "failed")
BATCH = 200
RECEIPTS_KEPT = timedelta(days=2)  # far past any callback's timestamp window


class Outbox:
    def __init__(
        self,
        store: Store,
        audit: AuditLog,
        approvals: Approvals,
        policy: PolicyEngine,
        settings: ChannelsSettings,
        channels: Mapping[str, Channel],
        clock: Callable[[], datetime],
    ):
        self.store, self.audit, self.approvals = store, audit, approvals
        self.policy, self.settings = policy, settings
        self.channels = dict(channels)
        self.clock = clock  # naive UTC

    def tick(self) -> int:
        """Queue what is new, send what is due; the number of messages sent."""
        now = self.clock()
        self.queue_approvals(now)
        self.queue_notices(now)
        sent = self.send_due(now)
        self._forget_receipts(now)
        return sent

    # ---------------------------------------------------------------------------- queueing

    def targets(self, row: Approval) -> list[str]:
        """The configured channels the approval's rule names (all of them by default)."""
        rule = next((r for r in self.policy.policy.approvals if r.id == row.rule), None)
        named = rule.channels if rule is not None and rule.channels is not None else None
        return [c for c in self.channels if named is None or c in named]

    def queue_approvals(self, now: datetime) -> None:
        pending = self.approvals.pending(now)  # marks overdue ones expired (audited)
        with write_transaction(self.store, ChannelMessage.__tablename__) as s:
            for row in pending:
                subject = f"approval:{row.id}"
                have = set(
                    s.exec(select(ChannelMessage.channel).where(ChannelMessage.subject == subject))
                )
                for channel in self.targets(row):
                    if channel not in have:
                        s.add(ChannelMessage(channel=channel, subject=subject, next_try_at=now))
            shown = list(
                s.exec(
                    select(ChannelMessage).where(
                        ChannelMessage.state == "sent",
                        col(ChannelMessage.subject).startswith("approval:"),
                    )
                )
            )
            for msg in shown:
                approval = s.get(Approval, _approval_id(msg.subject))
                if approval is not None and card_of(approval).version != msg.shown:
                    msg.state, msg.next_try_at = "queued", now
                    s.add(msg)

    def touched(self, approval_id: int, posted: Posted | None) -> None:
        """A click changed this approval: show it at once, and keep the newest reference the
        click carried (WeChat Work's response codes are single-use)."""
        now = self.clock()
        with write_transaction(self.store, ChannelMessage.__tablename__) as s:
            for msg in s.exec(
                select(ChannelMessage).where(ChannelMessage.subject == f"approval:{approval_id}")
            ):
                if posted is not None and posted.channel == msg.channel and msg.ref:
                    msg.ref = {**msg.ref, **posted.ref}
                if msg.state == "sent":
                    msg.state = "queued"
                msg.next_try_at = now
                s.add(msg)

    def queue_notices(self, now: datetime) -> None:
        kinds = set(self.settings.notify)
        wanted = [c for c in self.channels if kinds]
        if not wanted:
            return
        with write_transaction(self.store, ChannelMessage.__tablename__) as s:
            cursor = int((s.get(KeyValue, CURSOR) or KeyValue(key=CURSOR, value="0")).value)
            events = list(
                s.exec(
                    select(AuditEvent)
                    .where(
                        col(AuditEvent.id) > cursor,
                        col(AuditEvent.action).in_(("job.state", "skill.result")),
                    )
                    .order_by(col(AuditEvent.id))
                    .limit(BATCH)
                )
            )
            for event in events:
                assert event.id is not None
                job = s.get(Job, event.job_id) if event.job_id is not None else None
                notice = notice_of(event, job)
                if notice is not None and notice.kind == "job_failed":
                    diagnosis = _diagnosis_after(s, event)
                    waited = (now - _parse_ts(event.ts)).total_seconds()
                    if diagnosis is None and waited < self.settings.failure_notice_wait_s:
                        break  # the recovery is diagnosing it: wait (in order) for a while
                    notice = with_diagnosis(notice, diagnosis)
                if notice is not None and notice.kind in kinds:
                    for channel in wanted:
                        s.add(
                            ChannelMessage(
                                channel=channel,
                                subject=notice.key,
                                notice=notice_dict(notice),
                                next_try_at=now,
                            )
                        )
                cursor = event.id
            s.merge(KeyValue(key=CURSOR, value=str(cursor)))

    def queue_notice(self, notice: Notice) -> None:
        """A notice that is not a job event (the morning report), to every channel, once per
        key."""
        now = self.clock()
        with write_transaction(self.store, ChannelMessage.__tablename__) as s:
            have = set(
                s.exec(select(ChannelMessage.channel).where(ChannelMessage.subject == notice.key))
            )
            for channel in self.channels:
                if channel not in have:
                    s.add(
                        ChannelMessage(
                            channel=channel,
                            subject=notice.key,
                            notice=notice_dict(notice),
                            next_try_at=now,
                        )
                    )

    # ----------------------------------------------------------------------------- sending

    def send_due(self, now: datetime) -> int:
        with self.store.session() as s:
            due = list(
                s.exec(
                    select(ChannelMessage)
                    .where(
                        ChannelMessage.state == "queued",
                        col(ChannelMessage.next_try_at) <= now,
                    )
                    .order_by(col(ChannelMessage.id))
                    .limit(BATCH)
                )
            )
        sent = 0
        for msg in due:
            channel = self.channels.get(msg.channel)
            if channel is None:
                self._save(msg, state="dropped", last_error=f"{msg.channel} is not configured")
                continue
            try:
                outcome = self._send(channel, msg)
            except ChannelDown as exc:
                self._failed(msg, exc, now)
                continue
            if outcome is not None:
                sent += 1
        return sent

    def _send(self, channel: Channel, msg: ChannelMessage) -> str | None:
        if msg.notice is not None:
            channel.notify(notice_from(msg.notice))
            self._done(msg, state="done", shown="sent")
            return "notice"
        approval = self.store_get(_approval_id(msg.subject))
        if approval is None:
            self._save(msg, state="dropped", last_error="the approval is gone")
            return None
        card = card_of(approval, self._evidence(approval))
        final = card.state in FINAL
        if not msg.ref:
            if card.decided:  # decided before it was ever shown here: nothing to ask
                self._save(msg, state="done", shown=card.version)
                return None
            posted = channel.post_approval(card)
            self._done(msg, state="sent", shown=card.version, ref=posted.ref)
            self.audit.append(
                "system",
                "channel.posted",
                skill=approval.skill,
                call_id=approval.call_id,
                payload={"approval_id": approval.id, "channel": msg.channel, "ref": posted.ref},
            )
            return "posted"
        more = channel.update_approval(Posted(channel=channel.name, ref=dict(msg.ref)), card)
        self._done(msg, state="done" if final or not more else "sent", shown=card.version)
        return "updated"

    def store_get(self, approval_id: int) -> Approval | None:
        with self.store.session() as s:
            return s.get(Approval, approval_id)

    def _done(self, msg: ChannelMessage, **changes: Any) -> None:
        if msg.attempts:
            self.audit.append(
                "system",
                "channel.recovered",
                payload={"channel": msg.channel, "subject": msg.subject, "tries": msg.attempts},
            )
        self._save(msg, attempts=0, last_error=None, sent_at=self.clock(), **changes)

    def _failed(self, msg: ChannelMessage, exc: ChannelDown, now: datetime) -> None:
        tries = msg.attempts + 1
        wait = exc.retry_after_s or min(self.settings.retry_max_s, 2.0**tries)
        if tries == 1:
            self.audit.append(
                "system",
                "channel.send_failed",
                payload={"channel": msg.channel, "subject": msg.subject, "error": str(exc)},
            )
        self._save(
            msg,
            attempts=tries,
            last_error=str(exc),
            next_try_at=now + timedelta(seconds=min(wait, self.settings.retry_max_s)),
        )

    def _save(self, msg: ChannelMessage, **changes: Any) -> None:
        """Write a row's new fields unless it was queued again meanwhile (a click while it was
        being sent): then only the reference, so the newer card still goes out."""
        with write_transaction(self.store, ChannelMessage.__tablename__) as s:
            row = s.get(ChannelMessage, msg.id)
            if row is None:
                return
            requeued = row.next_try_at > msg.next_try_at and changes.get("state") != "dropped"
            for key, value in changes.items():
                if key == "ref":
                    value = {**value, **row.ref} if row.ref else value
                if requeued and key in ("state", "shown", "next_try_at"):
                    continue
                setattr(row, key, value)
            s.add(row)

    def _evidence(self, approval: Approval) -> tuple[str, ...]:
        job_id = approval.args.get("job_id") if isinstance(approval.args, dict) else None
        if not isinstance(job_id, int):
            return ()
        with self.store.session() as s:
            job = s.get(Job, job_id)
        if job is None:
            return (f"job {job_id}: not found",)
        return (
            f"job {job.id} {job.name}: {job.state}, owner {job.owner}, priority {job.priority}",
        )

    def _forget_receipts(self, now: datetime) -> None:
        with self.store.session() as s:
            s.exec(
                delete(ChannelReceipt).where(col(ChannelReceipt.received_at) < now - RECEIPTS_KEPT)
            )


# --------------------------------------------------------------------------- cards and notices


def card_of(row: Approval, evidence: tuple[str, ...] = ()) -> ApprovalCard:
    return ApprovalCard(
        approval_id=row.id or 0,
        skill=row.skill,
        args=dict(row.args),
        requester=row.requester,
        rule=row.rule,
        quorum=row.quorum,
        votes=tuple(
            Vote(principal=v["principal"], approve=bool(v["approve"]), via=v.get("as") or "?")
            for v in row.votes
        ),
        state=row.state,  # type: ignore[arg-type]  # the store's states are the card's
        expires_at=row.expires_at,
        evidence=evidence,
    )


def notice_of(event: AuditEvent, job: Job | None) -> Notice | None:
    """The notice a job event makes, if any."""
    p = event.payload
    name = f"job {event.job_id}" + (f" {job.name}" if job is not None else "")
    key = f"event:{event.id}"
    if event.action == "job.state":
        after, outcome = p.get("after"), p.get("outcome")
        if after == "failed":
            why = p.get("reason") or f"attempt {p.get('attempt')} ended {outcome}"
            return Notice(
                key=key,
                kind="job_failed",
                title=f"{name} failed: {why}",
                lines=tuple(
                    x
                    for x in (
                        f"attempt {p.get('attempt')}, outcome {outcome}",
                        f"last step {p['last_step']}" if p.get("last_step") is not None else "",
                    )
                    if x
                ),
                job_id=event.job_id,
            )
        if after == "succeeded":
            early = outcome == "early_stopped"
            return Notice(
                key=key,
                kind="job_early_stopped" if early else "job_finished",
                title=f"{name} {'stopped early' if early else 'finished'}"
                + (f": {p['reason']}" if early and p.get("reason") else ""),
                lines=(f"attempts {p.get('attempt')}, last step {p.get('last_step')}",),
                job_id=event.job_id,
            )
        return None
    if event.skill == "retry_job" and p.get("ok"):
        r = p.get("result") or {}
        resume = r.get("resume_from")
        return Notice(
            key=key,
            kind="job_recovered",
            title=f"{name} requeued by {event.actor}"
            + (f", resuming from {resume}" if resume else ""),
            lines=(f"after {r.get('attempts')} attempt(s); it was: {r.get('reason_before')}",),
            job_id=event.job_id,
        )
    return None


def with_diagnosis(notice: Notice, diagnosis: dict[str, Any] | None) -> Notice:
    if not diagnosis:
        return notice
    remedy = diagnosis.get("remediation") or {}
    lines = [
        f"diagnosis: {diagnosis.get('category')} ({diagnosis.get('confidence')} confidence, "
        f"{'retryable' if diagnosis.get('retryable') else 'not retryable'})",
        str(diagnosis.get("reasoning") or ""),
    ]
    if isinstance(remedy, dict) and remedy.get("message"):
        lines.append(f"next: {remedy.get('action')}: {remedy['message']}")
    return Notice(
        key=notice.key,
        kind=notice.kind,
        title=notice.title,
        lines=(*notice.lines, *(x for x in lines if x)),
        job_id=notice.job_id,
    )


def notice_dict(n: Notice) -> dict[str, Any]:
    return {"key": n.key, "kind": n.kind, "title": n.title, "lines": list(n.lines), "job": n.job_id}


def notice_from(d: dict[str, Any]) -> Notice:
    return Notice(
        key=d["key"], kind=d["kind"], title=d["title"], lines=tuple(d["lines"]), job_id=d["job"]
    )


def _diagnosis_after(s: Any, event: AuditEvent) -> dict[str, Any] | None:
    found = s.exec(
        select(AuditEvent)
        .where(
            col(AuditEvent.id) > event.id,
            AuditEvent.job_id == event.job_id,
            AuditEvent.action == "skill.result",
            AuditEvent.skill == "diagnose_failure",
        )
        .order_by(col(AuditEvent.id))
        .limit(1)
    ).first()
    if found is None or not found.payload.get("ok"):
        return None
    result = found.payload.get("result")
    return result if isinstance(result, dict) else None


def _approval_id(subject: str) -> int:
    return int(subject.partition(":")[2])


def _parse_ts(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).replace(tzinfo=None)
