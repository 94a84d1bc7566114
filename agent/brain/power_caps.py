"""The daemon's power cap at peak price: while the tariff is at its highest price, each GPU of
this machine that runs a cost_sensitive job gets a lower power limit; when the price leaves its
peak, or the job on that GPU ends (or is not cost_sensitive), the limit nightshift recorded
before its change is put back.

Every change is a set_power_limit call through the gate as the `system` principal, audited like
any other; the policy decides whether the scheduler may make it without a person (the shipped
waiver scheduler-caps-gpu-power-at-peak). What nightshift changed is in the store (the skill
records the limit before it changes it), so each step compares what is wanted with that record
and only acts on a difference: ticks repeat nothing, and a restarted daemon puts back what it
capped if the cap is no longer wanted. A GPU whose limit a person set through nightshift is
theirs: the scheduler neither caps nor restores it. A card that refuses (no permission, not
supported, the policy asks for a person) is noted once in the audit and not asked again until
the price leaves its peak.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.gpu import power_record
from nightshift.runtime.gpu.power_limit import NvmlPowerControl, PowerLimits
from nightshift.runtime.gpu.power_record import PowerLimitRecord
from nightshift.runtime.scheduling.placement import RunningJob
from nightshift.runtime.scheduling.power_model import PowerModelError, power_model
from nightshift.runtime.scheduling.tariff import Tariff
from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.store.lifecycle import JobState

if TYPE_CHECKING:
    from nightshift.policies.engine import PolicyEngine

SCHEDULER = "system"  # the principal the loop calls skills as (agent/brain/loop.py)
FALLBACK_FRACTION = 0.7  # of the default limit, for a card the power model does not know
Call = Callable[[dict[str, Any]], Any]
Note = Callable[[str, dict[str, Any]], None]


def at_peak(tariff: Tariff | None, now: datetime) -> bool:
    """Whether `now` is priced at the tariff's highest price (the simulator's peak band too);
    a tariff with one price has no peak."""
    if tariff is None:
        return False
    prices = tariff.prices()
    return len(prices) > 1 and tariff.price_at(now) >= prices[-1] - 1e-12


def cap_watts(settings: Settings, card: PowerLimits) -> float:
    """The cap for one card: power.cap_watts, else power.cap_fraction of its default limit,
    else its type's least-energy-per-work limit from the power model, else 70 % of its default
    limit; clamped into the card's own min-max limits."""
    power = settings.power
    if power.cap_watts is not None:
        watts = power.cap_watts
    elif power.cap_fraction is not None:
        watts = power.cap_fraction * card.default_w
    else:
        try:
            watts = power_model(card.name).least_energy_limit()
        except PowerModelError:
            watts = FALLBACK_FRACTION * card.default_w
    return min(max(watts, card.min_w), card.max_w)


def peak_end(tariff: Tariff, now: datetime) -> datetime:
    """When the price next drops below the tariff's highest (a week on at most)."""
    top = tariff.prices()[-1]
    for piece in tariff.pieces(now, now + timedelta(days=7)):
        if piece.price < top - 1e-12:
            return piece.start
    return now + timedelta(days=7)


def capped_end(
    now: datetime, expected_end: datetime, until: datetime, throughput: float
) -> datetime:
    """When a job expected to end at `expected_end` at full speed ends if it runs at
    `throughput` until `until` (the peak's end) and at full speed after (the simulator's rule)."""
    left = (expected_end - now).total_seconds()
    in_peak = (until - now).total_seconds() * throughput
    if left <= in_peak:
        return now + timedelta(seconds=left / throughput)
    return until + timedelta(seconds=left - in_peak)


def throughput_at(card: PowerLimits, watts: float) -> float:
    """Work per second at `watts` relative to the card's full speed, from the power model; for a
    card it does not know, the fraction of the default limit (a cap never slows work more)."""
    try:
        model = power_model(card.name)
        return model.throughput_factor(min(max(watts, model.min_w), model.max_w))
    except PowerModelError:
        return watts / card.default_w


def cost_sensitive_gpus(store: Store, node: str) -> dict[int, int]:
    """This machine's GPU indices held by running attempts of cost_sensitive jobs and of no
    urgent one (a shared GPU runs at the urgent job's pace), each with its job; a cluster
    host's GPUs (`host` set) are that host's to cap."""
    with store.session() as s:
        rows = s.exec(
            select(Attempt.gpus, Job.spec, Job.id)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(
                col(Attempt.state).in_(("starting", "running")),
                col(Attempt.node).in_((node, "")),
                Attempt.host == "",
                Job.state == JobState.RUNNING,
            )
        ).all()
    cheap: dict[int, int] = {}
    urgent: set[int] = set()
    for gpus, spec, job_id in rows:
        for i in gpus or []:
            if (spec or {}).get("cost_class") == "cost_sensitive":
                cheap[int(i)] = int(job_id)
            else:
                urgent.add(int(i))
    return {gpu: job for gpu, job in cheap.items() if gpu not in urgent}


class PeakPowerCaps:
    """One step per loop tick: caps wanted now against caps recorded, and the calls between."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        policy: PolicyEngine,
        call: Call,
        note: Note,
        control: Callable[[], NvmlPowerControl] = NvmlPowerControl,
        running: Callable[[], list[RunningJob]] = list,
    ):
        self.store, self.settings, self.policy = store, settings, policy
        self.running = running  # the running jobs as placement last saw them (deadlines)
        self.call = call  # set_power_limit through the gate, as the scheduler
        self.note = note  # an audit event of the scheduler's, with its payload
        self.control = control
        self._cards: dict[int, PowerLimits] = {}  # constraints do not change while we run
        self._refused: dict[int, str] = {}  # GPU index -> why no cap, until the peak ends
        self._unrestored: dict[int, str] = {}  # GPU index -> why no restore, while we run
        self._skipped: set[tuple[int, int]] = set()  # (GPU, job) left uncapped for a deadline
        # Off peak, once our caps are put back (or their restore refused, not retried while we
        # run): only our own caps, at peak, change that, so the loop's ticks read no records
        # until the price is at its peak again. False at start: a daemon restarted with caps
        # left from before puts them back first.
        self._settled = False

    def step(self, now: datetime) -> None:
        peak = self.settings.power.cap_at_peak and at_peak(self.settings.tariff, now)
        if not peak:
            self._refused.clear()
            self._skipped.clear()
            if self._settled:
                return
        with self.store.session() as s:
            records = power_record.all_records(s)
        mine = {r.uuid: r for r in records if r.by == SCHEDULER}
        self._settled = not peak  # its restores are made below, or refused for this run
        wanted = cost_sensitive_gpus(self.store, self.settings.node) if peak else {}
        if not wanted and not mine:
            return  # the common case: nothing wanted, nothing of ours to put back
        people = {r.uuid for r in records if r.by != SCHEDULER}
        jobs = {j.id: j for j in self.running()} if wanted else {}
        for gpu, job_id in sorted(wanted.items()):
            if gpu in self._refused:
                continue
            card = self._card(gpu)
            if card is None or card.uuid in people or card.uuid in mine:
                continue  # refused (noted), a person's limit, or capped already
            if (gpu, job_id) in self._skipped:
                continue
            late = self._would_miss(now, jobs.get(job_id), card)
            if late is not None:
                self._skipped.add((gpu, job_id))
                self.note("power.cap_skipped", {"gpu": gpu, "job_id": job_id, "why": late})
                continue
            self._cap(gpu, card)
        for record in mine.values():
            if record.gpu not in wanted:
                self._restore(record)

    def _would_miss(self, now: datetime, job: RunningJob | None, card: PowerLimits) -> str | None:
        """Why a cap would make the job miss its deadline on its expected end (the slower run
        in the peak, full speed after), or None: as the simulator, a deadline is not traded
        for energy."""
        if job is None or job.deadline is None or job.expected_end is None:
            return None
        assert self.settings.tariff is not None  # at peak: there is one
        watts = cap_watts(self.settings, card)
        end = capped_end(
            now, job.expected_end, peak_end(self.settings.tariff, now), throughput_at(card, watts)
        )
        if end <= job.deadline:
            return None
        return (
            f"job {job.id} would end at {end:%Y-%m-%d %H:%M} UTC under a {watts:g} W cap, after "
            f"its deadline {job.deadline:%Y-%m-%d %H:%M} UTC: left at full power"
        )

    def _card(self, gpu: int) -> PowerLimits | None:
        if gpu not in self._cards:
            probe = self.settings.gpu.probe
            if probe not in ("auto", "nvml"):  # as the skill: GPUs read from a file stay as is
                self._refuse(
                    gpu,
                    f"gpu.probe is {probe!r}: nightshift drives no GPU it does not read through NVML",
                )
                return None
            try:
                self._cards[gpu] = self.control().read(gpu)
            except NightshiftError as exc:
                self._refuse(gpu, f"reading its power limits failed: {exc}")
                return None
        return self._cards[gpu]

    def _cap(self, gpu: int, card: PowerLimits) -> None:
        watts = cap_watts(self.settings, card)
        args = {
            "gpu": gpu,
            "fraction": round(watts / card.default_w, 6),
            "reason": f"peak price: a cost_sensitive job runs on it; cap {watts:g} W "
            f"(power.cap_at_peak)",
        }
        if not self._permitted(gpu, args):
            return
        try:
            self.call(args)
        except NightshiftError as exc:
            if self.store.fault_of(exc) is not None:
                raise
            self._refuse(gpu, str(exc))

    def _restore(self, record: PowerLimitRecord) -> None:
        args = {"gpu": record.gpu, "restore": True, "reason": "peak cap no longer wanted"}
        if record.gpu in self._unrestored:
            return
        why = self._why_not(args)
        if why is None:
            try:
                self.call(args)
                return
            except NightshiftError as exc:
                if self.store.fault_of(exc) is not None:
                    raise
                why = str(exc)
        self._unrestored[record.gpu] = why
        self.note(
            "power.restore_refused",
            {
                "gpu": record.gpu,
                "capped_w": record.set_w,
                "previous_w": record.previous_w,
                "error": why,
            },
        )

    def _permitted(self, gpu: int, args: dict[str, Any]) -> bool:
        why = self._why_not(args)
        if why is not None:
            self._refuse(gpu, why)
        return why is None

    def _why_not(self, args: dict[str, Any]) -> str | None:
        """Only what the policy allows the scheduler at once is asked: a call that would wait
        for a person is noted instead, once (an approval given later, off peak, would cap a
        card nobody wants capped then). None: allowed."""
        from nightshift.skills.registry import get_skill

        verdict = self.policy.evaluate(SCHEDULER, get_skill("set_power_limit"), args)
        if verdict.allowed:
            return None
        return (
            f"the policy does not let the scheduler do this without a person ({verdict.rule}: "
            f"{'; '.join(verdict.reasons)}); give the scheduler a waiver for it (the "
            "shipped policy's waivers scheduler-caps-gpu-power-at-peak and "
            "scheduler-restores-gpu-power), or turn power.cap_at_peak off"
        )

    def _refuse(self, gpu: int, why: str) -> None:
        if gpu in self._refused:
            return
        self._refused[gpu] = why
        self.note("power.cap_refused", {"gpu": gpu, "error": why})
