"""set_power_limit and `nightshift power show|set|restore`: a GPU's power limit set through NVML,
recorded in the store before it changes (who, when, why, the limit before), put back by restore,
audited through the gate, confirmed by a person (the agent's request waits for an admin).

No GPU here: NVML is the fake of tests/fake_pynvml.py (the H100 capture's limits: 200-700 W),
in-process through sys.modules and for the real CLI through tests/fake_nvml on PYTHONPATH."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import fake_pynvml, h100
from sqlmodel import select

from nightshift.policies.engine import PolicyEngine
from nightshift.policies.model import load_policy
from nightshift.runtime.config import GpuSettings, Settings
from nightshift.runtime.errors import BadArguments, SkillFailed
from nightshift.runtime.gpu.power_limit import PowerControlUnavailable
from nightshift.runtime.store.db import AuditEvent, KeyValue, Store
from nightshift.skills.base import SkillContext
from nightshift.skills.registry import get_skill

from conftest import empty_store, nightshift, run_skill

FAKE_NVML = Path(__file__).parent / "fake_nvml"


# ------------------------------------------------------------------------------ the real CLI
@pytest.fixture
def gpus(tmp_path, home) -> Path:
    """Two H100s as the fake NVML's state file (GPU 1 already at 500 W)."""
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps([h100(), h100(uuid="GPU-1", limit_mw=500_000)]))
    return state


def cli(state: Path, *args: str):
    return nightshift(*args, env={"PYTHONPATH": str(FAKE_NVML), "NIGHTSHIFT_TEST_NVML": str(state)})


def limits(state: Path) -> list[int]:
    return [g["limit_mw"] for g in json.loads(state.read_text())]


def test_set_then_restore_through_the_cli(gpus):
    """A person sets GPU 0 to 450 W: the card changes, `power show` says what restore puts back
    and who set it why, the audit has the call; restore puts 700 W back and forgets the record."""
    r = cli(gpus, "power", "set", "0", "450", "--reason", "peak price", "--yes")
    assert r.returncode == 0, r.stderr
    assert "700 W → 450 W" in r.stdout and "nightshift power restore 0" in r.stdout
    assert limits(gpus) == [450_000, 500_000]

    shown = json.loads(cli(gpus, "power", "show", "--json").stdout)["gpus"]
    assert [(g["gpu"], g["current_w"], g["recorded_previous_w"]) for g in shown] == [
        (0, 450.0, 700.0),
        (1, 500.0, None),
    ]
    assert shown[0]["reason"] == "peak price" and shown[0]["set_by"]
    assert shown[0]["estimate"]["gpu_type"] == "H100" and shown[0]["estimate"]["measured"] is False
    assert shown[0]["estimate"]["throughput"] < shown[1]["estimate"]["throughput"] < 1

    r = cli(gpus, "power", "restore", "0", "--yes")
    assert r.returncode == 0, r.stderr
    assert "restored 450 W → 700 W" in r.stdout
    assert limits(gpus) == [700_000, 500_000]
    assert (
        json.loads(cli(gpus, "power", "show", "--json").stdout)["gpus"][0]["recorded_previous_w"]
        is None
    )

    audit = json.loads(cli(gpus, "audit", "show", "--json").stdout)
    done = [e for e in audit if e["skill"] == "set_power_limit" and e["action"] == "skill.result"]
    assert [(e["payload"]["ok"], e["payload"]["result"]["after_w"]) for e in done] == [
        (True, 450.0),
        (True, 700.0),
    ]


def test_the_first_previous_limit_is_the_one_restored(gpus):
    """Two changes in a row: restore returns the card to where it was before nightshift."""
    for watts in ("450", "300"):
        assert cli(gpus, "power", "set", "1", watts, "--yes").returncode == 0
    assert limits(gpus) == [700_000, 300_000]
    r = cli(gpus, "power", "restore", "1", "--yes")
    assert r.returncode == 0, r.stderr
    assert limits(gpus) == [700_000, 500_000]


def test_out_of_range_names_the_field_and_the_range(gpus):
    """50 W on a 200-700 W card: exit 2 naming watts and the range, before anyone is asked to
    confirm (no set_power_limit call, no approval); nothing changed or recorded."""
    r = cli(gpus, "power", "set", "0", "50", "--yes")
    assert r.returncode == 2
    assert (
        "watts: 50 W is outside GPU 0's (NVIDIA H100 80GB HBM3) allowed range 200-700 W" in r.stderr
    )
    assert "Traceback" not in r.stderr
    assert limits(gpus) == [700_000, 500_000]
    assert (
        json.loads(cli(gpus, "power", "show", "--json").stdout)["gpus"][0]["recorded_previous_w"]
        is None
    )
    audit = json.loads(cli(gpus, "audit", "show", "--json").stdout)
    assert not [e for e in audit if e["skill"] == "set_power_limit"]


def test_no_permission_is_a_refusal_not_a_crash(gpus):
    """NVML's NO_PERMISSION (not root) is one error line saying so (exit 5, the operator's), and
    the record written before the attempt is taken back."""
    state = json.loads(gpus.read_text())
    state[0]["fail"] = {**state[0]["fail"], "set_limit": 4}
    gpus.write_text(json.dumps(state))
    r = cli(gpus, "power", "set", "0", "400", "--yes")
    assert r.returncode == 5, r.stderr
    assert "no permission" in r.stderr and "root" in r.stderr and "Traceback" not in r.stderr
    assert limits(gpus) == [700_000, 500_000]
    shown = json.loads(cli(gpus, "power", "show", "--json").stdout)["gpus"]
    assert shown[0]["recorded_previous_w"] is None


def test_restore_without_a_record_says_so(gpus):
    r = cli(gpus, "power", "restore", "1", "--yes")
    assert r.returncode == 1
    assert "nothing to restore on GPU 1" in r.stderr and "now 500 W" in r.stderr
    assert limits(gpus) == [700_000, 500_000]


# ------------------------------------------------------------------------------ the skill
@pytest.fixture
def ctx(tmp_path, home, now) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "ns.db"),
        settings=Settings(),
        now=now,
        principal="alice",
    )


def test_the_record_is_written_before_the_card_changes(ctx, monkeypatch):
    """The set call finds the previous limit already in the store: a crash between the two
    leaves the limit to restore recorded, never lost."""
    seen: list[Any] = []
    nv = fake_pynvml([h100()])
    real_set = nv.nvmlDeviceSetPowerManagementLimit

    def set_and_look(handle: int, mw: int) -> None:
        with ctx.store.session() as s:
            seen.extend(s.exec(select(KeyValue)).all())
        real_set(handle, mw)

    nv.nvmlDeviceSetPowerManagementLimit = set_and_look
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    out = run_skill(get_skill("set_power_limit"), ctx, {"gpu": 0, "watts": 350, "reason": "x"})
    assert (out.before_w, out.after_w, out.recorded_previous_w, out.by) == (700, 350, 700, "alice")
    [row] = [r for r in seen if r.key.startswith("gpu_power_limit:")]
    assert json.loads(row.value)["previous_w"] == 700 and json.loads(row.value)["by"] == "alice"


def test_bad_arguments_and_missing_nvml(ctx, monkeypatch):
    """watts and restore together (or neither) is a BadArguments naming both; no GPU of that
    index, or no NVML, is a failure that says which."""
    sk = get_skill("set_power_limit")
    for args in ({"gpu": 0}, {"gpu": 0, "watts": 300, "restore": True}):
        with pytest.raises(BadArguments, match="either watts .* or restore"):
            sk.parse(args)
    nv = fake_pynvml([h100()])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with pytest.raises(BadArguments, match=r"watts: 800 W is outside GPU 0's .* 200-700 W"):
        run_skill(sk, ctx, {"gpu": 0, "watts": 800})  # the agent's call: no CLI checked it first
    assert nv.state["sets"] == []
    with pytest.raises(PowerControlUnavailable, match="there is no GPU 3 here"):
        run_skill(sk, ctx, {"gpu": 3, "watts": 300})
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=9))
    with pytest.raises(SkillFailed, match="NVML did not initialise"):
        run_skill(sk, ctx, {"gpu": 0, "watts": 300})
    shown = run_skill(get_skill("show_power_limits"), ctx, {})
    assert shown.gpus == [] and "NVML did not initialise" in (shown.error or "")


def test_declared_gpus_are_never_driven(ctx, monkeypatch):
    """With gpu.probe: inventory (GPUs read from a file, as in the evals), NVML is not touched
    even where it would answer: the skill says why instead of changing a real card."""
    nv = fake_pynvml([h100()])
    opened: list[int] = []
    nv.nvmlInit = lambda: opened.append(1)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    ctx.settings = Settings(gpu=GpuSettings(probe="inventory", inventory="gpus.yaml"))
    with pytest.raises(PowerControlUnavailable, match="gpu.probe is 'inventory'"):
        run_skill(get_skill("set_power_limit"), ctx, {"gpu": 0, "watts": 300})
    assert "gpu.probe is 'inventory'" in (
        run_skill(get_skill("show_power_limits"), ctx, {}).error or ""
    )
    assert nv.state["sets"] == [] and opened == []


def test_the_policy_asks_a_person_and_an_admin_for_the_agent(home):
    """The shipped policy: a person's own change is confirmed by them; the agent's or the loop's
    waits for someone else with the admin role."""
    engine = PolicyEngine(load_policy(None))
    sk = get_skill("set_power_limit")
    assert sk.capability == "modify"
    person = engine.evaluate("alice", sk, {"gpu": 0, "watts": 300})
    assert (person.decision, person.rule, person.from_others) == (
        "needs_approval",
        "gpu-power-limit-needs-a-person",
        False,
    )
    for machine in ("agent", "system"):
        v = engine.evaluate(machine, sk, {"gpu": 0, "watts": 300})
        assert (v.decision, v.from_others, v.approvers) == ("needs_approval", True, ["role:admin"])
    assert engine.evaluate("alice", get_skill("show_power_limits"), {}).decision == "allow"


def test_audit_events_carry_the_change(gpus, home):
    """The gate's audit of the call holds the arguments (the reason) and the result (before and
    after), so the chain says who changed which GPU's power and why."""
    assert (
        cli(gpus, "power", "set", "0", "420", "--reason", "cheap night over", "--yes").returncode
        == 0
    )
    store = Store(f"sqlite:///{home / 'nightshift.db'}")
    with store.session() as s:
        events = [e for e in s.exec(select(AuditEvent)).all() if e.skill == "set_power_limit"]
    text = json.dumps([e.payload for e in events], default=str)
    assert "cheap night over" in text and "420" in text and "700" in text
