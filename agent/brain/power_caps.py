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
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.gpu import power_record
from nightshift.runtime.gpu.power_limit import NvmlPowerControl, PowerLimits
from nightshift.runtime.gpu.power_record import PowerLimitRecord
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


def cost_sensitive_gpus(store: Store, node: str) -> set[int]:
    """This machine's GPU indices held by running attempts of cost_sensitive jobs and of no
    urgent one (a shared GPU runs at the urgent job's pace); a cluster host's GPUs (`host`
    set) are that host's to cap."""
    with store.session() as s:
        rows = s.exec(
            select(Attempt.gpus, Job.spec)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(
                col(Attempt.state).in_(("starting", "running")),
                col(Attempt.node).in_((node, "")),
                Attempt.host == "",
                Job.state == JobState.RUNNING,
            )
        ).all()
    cheap: set[int] = set()
    urgent: set[int] = set()
    for gpus, spec in rows:
        sensitive = (spec or {}).get("cost_class") == "cost_sensitive"
        (cheap if sensitive else urgent).update(int(i) for i in gpus or [])
    return cheap - urgent


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
    ):
        self.store, self.settings, self.policy = store, settings, policy
        self.call = call  # set_power_limit through the gate, as the scheduler
        self.note = note  # an audit event of the scheduler's, with its payload
        self.control = control
        self._cards: dict[int, PowerLimits] = {}  # constraints do not change while we run
        self._refused: dict[int, str] = {}  # GPU index -> why no cap, until the peak ends
        self._unrestored: dict[int, str] = {}  # GPU index -> why no restore, while we run

    def step(self, now: datetime) -> None:
        with self.store.session() as s:
            records = power_record.all_records(s)
        mine = {r.uuid: r for r in records if r.by == SCHEDULER}
        peak = self.settings.power.cap_at_peak and at_peak(self.settings.tariff, now)
        if not peak:
            self._refused.clear()
        wanted = cost_sensitive_gpus(self.store, self.settings.node) if peak else set()
        if not wanted and not mine:
            return  # the common case: nothing wanted, nothing of ours to put back
        people = {r.uuid for r in records if r.by != SCHEDULER}
        for gpu in sorted(wanted):
            if gpu in self._refused:
                continue
            card = self._card(gpu)
            if card is None or card.uuid in people or card.uuid in mine:
                continue  # refused (noted), a person's limit, or capped already
            self._cap(gpu, card)
        for record in mine.values():
            if record.gpu not in wanted:
                self._restore(record)

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
