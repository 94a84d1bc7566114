"""The daemon's power cap at peak price (agent/brain/power_caps.py): the loop's real step (engine
tick, placement, real job processes, the gate, the audit, the store) on a fixed wall clock, with
NVML the fake of tests/fake_pynvml.py (two H100s of the capture: 200-700 W, default 700 W).

The tariff is cheap from 00:00 to 08:00 UTC and at its peak after: jobs start in the cheap hours
(a cost_sensitive job is held at peak), then the clock moves into the peak."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_pynvml import fake_pynvml, h100
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring
from nightshift.policies.engine import PolicyEngine
from nightshift.policies.model import load_policy
from nightshift.runtime.config import Settings
from nightshift.runtime.errors import SpecError
from nightshift.runtime.gpu import power_record
from nightshift.runtime.gpu.power_record import PowerLimitRecord
from nightshift.runtime.store.db import Approval, AuditEvent
from nightshift.skills.registry import get_skill

from conftest import nightshift

CHEAP = datetime(2026, 12, 2, 7, 0)
PEAK = datetime(2026, 12, 2, 9, 0)
CHEAP_AGAIN = datetime(2026, 12, 3, 1, 0)
TARIFF = {
    "timezone": "UTC",
    "currency": "EUR",
    "windows": [
        {"name": "valley", "start": "00:00", "end": "08:00", "price_per_kwh": 0.10},
        {"name": "peak", "start": "08:00", "end": "24:00", "price_per_kwh": 0.40},
    ],
}
H100_LEAST_ENERGY_MW = 466_667  # power_model.yaml's H100 curve: least watts per unit of work


def idle_h100(**over: Any) -> dict[str, Any]:
    return h100(procs=[], mem_used_mib=10, util=0, power_mw=60_000, **over)


@pytest.fixture
def nvml(monkeypatch) -> Any:
    nv = fake_pynvml([idle_h100(), idle_h100(uuid="GPU-1")])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


class Daemon:
    """The daemon's parts on one store, its wall clock in the test's hands; `restart()` builds
    them again (a new process: nothing kept in memory) on the same store."""

    def __init__(self, home: Path, **config: Any):
        self.home, self.config = home, config
        self.t = CHEAP
        self.w = self._wiring()

    def _wiring(self) -> Wiring:
        settings = {
            "home": str(self.home),
            "gpu": {"probe": "nvml"},
            "tariff": TARIFF,
            "power": {"cap_at_peak": True},
            "loop": {"poll_interval_s": 0.05},
            **self.config,
        }
        w = Wiring(Settings.model_validate(settings), server=True)
        w.engine.clock = lambda: self.t
        return w

    def restart(self, **config: Any) -> None:
        self.config.update(config)
        self.w = self._wiring()

    def submit(self, cost_class: str, until: Path, **spec_fields: Any) -> int:
        """A one-GPU job that runs until `until` exists (a minute at most)."""
        wait = (
            f"import pathlib, time; p = pathlib.Path({str(until)!r}); t = time.time()\n"
            "while not p.exists() and time.time() - t < 60: time.sleep(0.05)"
        )
        spec = {
            "name": cost_class,
            "command": [sys.executable, "-c", wait],
            "resources": {"gpus": 1, "expected_duration_min": 30},
            "cost_class": cost_class,
            **spec_fields,
        }
        out = self.w.gate.call(self.w.context("alice"), "submit_job", {"spec": spec}, via="api")
        return int(out.job_id)  # type: ignore[attr-defined]

    def step(self, at: datetime | None = None, times: int = 1) -> None:
        if at is not None:
            self.t = at
        for _ in range(times):
            self.w.loop.step()

    def until_running(self, *job_ids: int) -> dict[int, list[int]]:
        """Step (in the cheap hours) until the jobs run; their GPUs."""
        for _ in range(100):
            self.step()
            jobs = [self.w.store.job(j) for j in job_ids]
            if all(j.state == "running" for j in jobs):
                return {j: self.gpus_of(j) for j in job_ids}
            time.sleep(0.05)
        raise AssertionError(f"jobs {job_ids} did not start")

    def until_ended(self, job_id: int) -> None:
        for _ in range(200):
            self.step()
            if self.w.store.job(job_id).state not in ("queued", "running"):
                return
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not end")

    def gpus_of(self, job_id: int) -> list[int]:
        from nightshift.runtime.store.db import Attempt

        with self.w.store.session() as s:
            att = s.exec(select(Attempt).where(Attempt.job_id == job_id)).one()
        return list(att.gpus)

    def records(self) -> dict[int, PowerLimitRecord]:
        with self.w.store.session() as s:
            return {r.gpu: r for r in power_record.all_records(s)}

    def audit(self, action: str, skill: str | None = None) -> list[AuditEvent]:
        with self.w.store.session() as s:
            events = s.exec(select(AuditEvent).order_by(AuditEvent.id)).all()
        return [e for e in events if e.action == action and (skill is None or e.skill == skill)]


@pytest.fixture
def ends(tmp_path) -> Iterator[Path]:
    """Files whose existence ends the test's jobs; all made at the end, so no job outlives it."""
    folder = tmp_path / "ends"
    folder.mkdir()
    yield folder
    for name in ("a", "b", "c"):
        (folder / name).touch()
    time.sleep(0.2)


def card_limits(nv: Any) -> list[float]:
    from nightshift.runtime.gpu.power_limit import NvmlPowerControl

    control = NvmlPowerControl(nv)
    return [control.read(i).current_w for i in range(2)]


def test_peak_caps_the_cost_sensitive_jobs_gpu_and_the_cheap_hours_restore_it(home, nvml, ends):
    """At peak price the GPU of the cost_sensitive job gets the H100's least-energy limit
    through set_power_limit as the scheduler (allowed by the waiver, audited), the urgent job's
    GPU is not touched, further ticks change nothing, and when the price drops the recorded
    700 W is put back and the record forgotten."""
    d = Daemon(home)
    cheap_job = d.submit("cost_sensitive", ends / "a")
    urgent_job = d.submit("urgent", ends / "b")
    gpus = d.until_running(cheap_job, urgent_job)
    [capped], [other] = gpus[cheap_job], gpus[urgent_job]
    assert nvml.state["sets"] == []  # cheap hours: nothing capped

    d.step(PEAK, times=3)
    uuid = idle_h100(uuid="GPU-1")["uuid"] if capped == 1 else idle_h100()["uuid"]
    assert nvml.state["sets"] == [(uuid, H100_LEAST_ENERGY_MW)]  # once, whatever the ticks
    assert card_limits(nvml)[capped] == pytest.approx(466.667)
    assert card_limits(nvml)[other] == 700.0
    record = d.records()[capped]
    assert (record.by, record.previous_w) == ("system", 700.0)
    [verdict] = [
        e for e in d.audit("policy.verdict", "set_power_limit") if e.payload["decision"] == "allow"
    ]
    assert verdict.actor == "system"
    assert verdict.payload["rule"] == "scheduler-caps-gpu-power-at-peak"
    [done] = d.audit("skill.result", "set_power_limit")
    assert done.payload["ok"] and done.payload["result"]["after_w"] == pytest.approx(466.667)

    d.step(CHEAP_AGAIN, times=2)
    assert nvml.state["sets"][1:] == [(uuid, 700_000)]
    assert card_limits(nvml) == [700.0, 700.0]
    assert d.records() == {}
    rules = [e.payload["rule"] for e in d.audit("policy.verdict", "set_power_limit")]
    assert rules == ["scheduler-caps-gpu-power-at-peak", "scheduler-restores-gpu-power"]


def test_the_job_ending_at_peak_restores_its_gpu(home, nvml, ends):
    """The cost_sensitive job ends during the peak: the tick that sees it end puts the limit
    back, though the price is still at its peak."""
    d = Daemon(home)
    job = d.submit("cost_sensitive", ends / "a")
    [gpu] = d.until_running(job)[job]
    d.step(PEAK)
    assert card_limits(nvml)[gpu] == pytest.approx(466.667)
    (ends / "a").touch()
    d.until_ended(job)
    assert d.w.store.job(job).state == "succeeded"
    assert card_limits(nvml)[gpu] == 700.0 and d.records() == {}
    assert len(nvml.state["sets"]) == 2


def test_a_restarted_daemon_repeats_nothing_and_restores_what_is_no_longer_wanted(home, nvml, ends):
    """After a restart at peak the recorded cap is not set again; a limit a person set through
    nightshift on the other GPU is left alone throughout; restarted with the cap turned off,
    the daemon puts back only what the scheduler capped."""
    d = Daemon(home)
    job = d.submit("cost_sensitive", ends / "a")
    [gpu] = d.until_running(job)[job]
    other = 1 - gpu
    person = d.w.gate.call(
        d.w.context("alice"),
        "set_power_limit",
        {"gpu": other, "watts": 500, "reason": "mine"},
        via="terminal",
        confirm=lambda request: True,
    )
    assert person.after_w == 500  # type: ignore[attr-defined]
    d.step(PEAK)
    sets = list(nvml.state["sets"])
    assert len(sets) == 2  # the person's, then the scheduler's

    d.restart()
    d.step(PEAK, times=2)
    assert nvml.state["sets"] == sets  # nothing set again
    assert card_limits(nvml)[gpu] == pytest.approx(466.667)

    d.restart(power={"cap_at_peak": False})
    d.step(PEAK)
    assert card_limits(nvml)[gpu] == 700.0
    assert card_limits(nvml)[other] == 500.0  # the person's limit stays
    assert list(d.records()) == [other] and d.records()[other].by == "alice"


def test_a_job_the_cap_would_make_late_is_left_at_full_power(home, nvml, ends):
    """As in the simulator, a deadline is not traded for energy: two cost_sensitive jobs
    expected to end at 10:00, one due at 10:02 (at the H100's least-energy limit, 0.93 of full
    speed, the hour left at 09:00 takes 64 minutes) and one due at noon. Only the second's GPU is
    capped; the first is noted once, with both times."""
    d = Daemon(home)
    expected = {"gpus": 1, "expected_duration_min": 180}
    tight = d.submit("cost_sensitive", ends / "a", resources=expected, deadline="2026-12-02T10:02")
    loose = d.submit("cost_sensitive", ends / "b", resources=expected, deadline="2026-12-02T12:00")
    gpus = d.until_running(tight, loose)
    d.step(PEAK, times=3)
    assert card_limits(nvml)[gpus[loose][0]] == pytest.approx(466.667)
    assert card_limits(nvml)[gpus[tight][0]] == 700.0
    [note] = d.audit("power.cap_skipped")
    assert (
        note.payload["job_id"] == tight
        and "after its deadline 2026-12-02 10:02" in (note.payload["why"])
    )


def test_a_card_that_refuses_is_noted_once_and_not_asked_again(home, nvml, ends):
    """NVML answers NO_PERMISSION (the daemon is not root): one power.cap_refused note naming
    the GPU and the fix, the card unchanged, nothing recorded, and no new call on later ticks."""
    for gpu in nvml_gpus(nvml):
        gpu["fail"] = {**gpu["fail"], "set_limit": 4}
    d = Daemon(home)
    job = d.submit("cost_sensitive", ends / "a")
    [gpu] = d.until_running(job)[job]
    d.step(PEAK, times=4)
    [note] = d.audit("power.cap_refused")
    assert note.payload["gpu"] == gpu and "no permission" in note.payload["error"]
    assert "root" in note.payload["error"]
    assert len(d.audit("skill.start", "set_power_limit")) == 1  # tried once
    assert card_limits(nvml) == [700.0, 700.0] and d.records() == {}


def nvml_gpus(nv: Any) -> list[dict[str, Any]]:
    """The fake's GPU dicts (closed over by its calls)."""
    cell = nv.nvmlDeviceSetPowerManagementLimit.__closure__
    return next(c.cell_contents for c in cell if isinstance(c.cell_contents, list))


def test_without_the_waiver_the_scheduler_asks_nobody_and_changes_nothing(
    home, nvml, ends, tmp_path
):
    """A site policy without the waiver: the scheduler's cap would need an admin's vote, so the
    daemon neither calls nor parks an approval; it notes once why (the rule that stops it and
    the fix). The verdict the gate would give is the person-needing one."""
    policy = yaml.safe_load((Path(__file__).parents[1] / "policies" / "default.yaml").read_text())
    del policy["waivers"]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    d = Daemon(home, policy={"file": str(tmp_path / "policy.yaml")})
    job = d.submit("cost_sensitive", ends / "a")
    d.until_running(job)
    d.step(PEAK, times=3)
    assert nvml.state["sets"] == [] and d.records() == {}
    [note] = d.audit("power.cap_refused")
    assert "gpu-power-limit-needs-a-person" in note.payload["error"]
    assert "scheduler-caps-gpu-power-at-peak" in note.payload["error"]
    with d.w.store.session() as s:
        assert s.exec(select(Approval)).all() == []
    verdict = PolicyEngine(load_policy(tmp_path / "policy.yaml")).evaluate(
        "system", get_skill("set_power_limit"), {"gpu": 0, "fraction": 0.7}
    )
    assert (verdict.decision, verdict.rule) == ("needs_approval", "gpu-power-limit-needs-a-person")


def test_the_shipped_waiver_spares_only_the_scheduler_within_its_range():
    """People and the agent still confirm; the scheduler goes without a person only for a cap
    of at least half the default limit, or a restore."""
    engine = PolicyEngine(load_policy(None))
    sk = get_skill("set_power_limit")

    def decide(who: str, **args: Any) -> tuple[str, str]:
        v = engine.evaluate(who, sk, {"gpu": 0, **args})
        return v.decision, v.rule

    assert decide("system", fraction=0.6) == ("allow", "scheduler-caps-gpu-power-at-peak")
    assert decide("system", restore=True) == ("allow", "scheduler-restores-gpu-power")
    needs = ("needs_approval", "gpu-power-limit-needs-a-person")
    assert decide("system", fraction=0.4) == needs
    assert decide("system", watts=400) == needs
    for who in ("agent", "alice"):
        assert decide(who, fraction=0.6) == needs
        assert decide(who, restore=True) == needs


def test_a_waiver_for_a_person_is_refused(tmp_path):
    """A waiver speaks only for the agent or the loop: one naming a person's principal is an
    error naming the field."""
    policy = yaml.safe_load((Path(__file__).parents[1] / "policies" / "default.yaml").read_text())
    policy["waivers"][0]["principals"] = ["local_user"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy))
    with pytest.raises(SpecError, match="never a person") as exc:
        load_policy(tmp_path / "p.yaml")
    assert "waivers.0.principals.0" in str(exc.value)


def test_a_cap_below_the_card_is_clamped_and_a_bad_fraction_names_the_field(
    home, nvml, ends, tmp_path
):
    """power.cap_watts 120 on a 200-700 W card is clamped to 200 W: below the shipped waiver's
    half of the default limit, so the policy stops it (noted); a site policy that lets the
    scheduler go to a quarter gets 200 W. cap_fraction 1.5, or both set, is a config error
    naming the field (exit 5, no traceback)."""
    d = Daemon(home, power={"cap_at_peak": True, "cap_watts": 120})
    job = d.submit("cost_sensitive", ends / "a")
    [gpu] = d.until_running(job)[job]
    d.step(PEAK)
    [note] = d.audit("power.cap_refused")
    assert "gpu-power-limit-needs-a-person" in note.payload["error"]
    assert card_limits(nvml)[gpu] == 700.0

    policy = yaml.safe_load((Path(__file__).parents[1] / "policies" / "default.yaml").read_text())
    policy["waivers"][0]["when"] = ["args.fraction >= 0.25"]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    d.restart(policy={"file": str(tmp_path / "policy.yaml")})
    d.step(PEAK)
    assert card_limits(nvml)[gpu] == 200.0
    assert d.records()[gpu].set_w == 200.0

    for bad, field in (
        ({"cap_fraction": 1.5}, "power.cap_fraction"),
        ({"cap_watts": 300, "cap_fraction": 0.5}, "power"),
    ):
        (home / "config.yaml").write_text(yaml.safe_dump({"power": bad}))
        r = nightshift("jobs")
        assert r.returncode == 5, r.stderr
        assert f"config field {field}:" in r.stderr and "Traceback" not in r.stderr
    assert "cap_watts or cap_fraction, not both" in r.stderr
    (home / "config.yaml").write_text(yaml.safe_dump({"power": {"cap_at_peak": True}}))
    r = nightshift("jobs")
    assert r.returncode == 5 and "config field power.cap_at_peak: true needs a tariff" in r.stderr


def test_the_loop_wakes_at_the_next_price_change(home):
    """With a long poll interval the loop's sleep ends just after the peak begins, not a poll
    interval later; without a tariff, or with no change within the interval, it is the poll."""
    s = Settings.model_validate(
        {"home": str(home), "tariff": TARIFF, "loop": {"poll_interval_s": 600}}
    )
    w = Wiring(s, server=True)
    w.engine.clock = lambda: datetime(2026, 12, 2, 7, 59, 30)
    assert w.engine.wait_s() == pytest.approx(30.01)
    w.engine.clock = lambda: datetime(2026, 12, 2, 9, 0)
    assert w.engine.wait_s() == 600
    w2 = Wiring(s.model_copy(update={"tariff": None}), server=True)
    assert w2.engine.wait_s() == 600


def test_power_show_reports_the_schedulers_cap(home, nvml, ends):
    """What a person sees: the capped GPU's record says the scheduler set it, and why."""
    d = Daemon(home)
    job = d.submit("cost_sensitive", ends / "a")
    [gpu] = d.until_running(job)[job]
    d.step(PEAK)
    shown = json.loads(
        get_skill("show_power_limits")
        .output_model.model_validate(
            d.w.gate.call(d.w.context("alice"), "show_power_limits", {}, via="api")
        )
        .model_dump_json()
    )["gpus"]
    row = next(g for g in shown if g["gpu"] == gpu)
    assert row["set_by"] == "system" and "peak price" in row["reason"]
    assert row["recorded_previous_w"] == 700.0
