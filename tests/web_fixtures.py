"""A store for the dashboard's tests: alice's and bob's jobs (submitted through the gate), one
with an attempt, its log in the runs folder, metric points, a diagnosis and provenance; a
policy where alice and bob are operators and carol, whom it does not list, a reader."""

from __future__ import annotations

from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nightshift.agent.brain.wiring import Wiring
from nightshift.runtime.config import PolicySettings, Settings
from nightshift.runtime.engine import job_paths
from nightshift.runtime.scheduling.tariff import PriceWindow, Tariff
from nightshift.runtime.store.db import Attempt, MetricPoint, utcnow

from conftest import made_by_hand

SPEC = {"name": "resnet-night", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}


def team_policy(home: Path) -> Path:
    data: dict[str, Any] = yaml.safe_load(
        resources.files("nightshift.policies").joinpath("default.yaml").read_text()
    )
    data["local_users"] = ["alice", "bob"]
    path = home / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    return path


def night_and_day() -> Tariff:
    """Cheap nights, dear days (UTC, so the bands sit at the same hours wherever tests run)."""
    return Tariff(
        timezone="UTC",
        currency="EUR",
        windows=[
            PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.10),
            PriceWindow(name="day", start="07:00", end="23:00", price_per_kwh=0.30),
        ],
    )


def team_wiring(home: Path, tariff: Tariff | None = None) -> Wiring:
    settings = Settings(
        home=str(home), policy=PolicySettings(file=str(team_policy(home))), tariff=tariff
    )
    return Wiring(settings, server=True)


def submit(w: Wiring, owner: str, name: str) -> int:
    r: Any = w.gate.call(w.context(owner), "submit_job", {"spec": {**SPEC, "name": name}})
    return int(r.job_id)


def with_attempt(w: Wiring, job_id: int, lines: int = 5) -> Path:
    """A first attempt that ran on GPU 0 and failed: its log, metrics, diagnosis, provenance.
    The log's path is returned (a test appends to it)."""
    job = w.store.job(job_id)
    assert job is not None
    ws = job_paths(w.settings, job)["workspace"]
    ws.mkdir(parents=True, exist_ok=True)
    log = ws / "attempt-1.log"
    log.write_text("".join(f"step {i} loss {1 / (i + 1):.3f}\n" for i in range(lines)))
    now = utcnow()
    with w.store.session() as s:
        att = Attempt(
            job_id=job_id,
            number=1,
            state="exited",
            outcome="failed",
            cause="cuda_oom",
            gpus=[0],
            host="gpu-box",
            log_path=str(log),
            last_step=40,
            last_loss=0.2,
            exit_code=1,
            started_at=now - timedelta(hours=2),
            ended_at=now - timedelta(hours=1),
            diagnosis={
                "category": "cuda_oom",
                "evidence": "<script>alert('x')</script> CUDA out of memory",
                "remediation": "halve the micro-batch",
            },
            provenance={"git": {"commit": "0123abcd", "dirty": True}, "seed": 7},
        )
        s.add(att)
        s.flush()
        assert att.id is not None
        for step in range(0, 50, 5):
            s.add(
                MetricPoint(
                    attempt_id=att.id, job_id=job_id, step=step, name="loss", value=2 / (step + 1)
                )
            )
        s.commit()
    made_by_hand(w.store)
    return log
