"""Prometheus /metrics on the daemon's HTTP app, and the idle-GPU rule.

GPU readings come from the health check as the daemon runs it, through a stand-in nvidia-smi
that answers from a real H100 capture (tests/fake_nvidia_smi.py); the store's other rows are
written by hand. One test scrapes with a real Prometheus server (Debian's `prometheus`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.idle_gpu import GpuUse, IdleGpuRule, IdleWatch
from nightshift.agent.doors.web.metrics import Metrics
from nightshift.agent.doors.web.server import WebServer
from nightshift.runtime.config import GpuSettings, IdleGpuSettings, Settings
from nightshift.runtime.store.db import Approval, Attempt, GpuSample, Job, utcnow

from conftest import free_port, made_by_hand, running_daemon

H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def fake_smi(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).parent / "fake_nvidia_smi.py"
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
        f'{shlex.quote(str(bin_dir / "state"))} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def w(home: Path) -> Wiring:
    """A store whose one GPU was read by the health check (nvidia-smi, the H100 capture)."""
    smi = fake_smi(home / "bin")
    w = Wiring(
        Settings(home=str(home), gpu=GpuSettings(probe="nvidia-smi", nvidia_smi=str(smi))),
        server=True,
    )
    w.gate.call(w.context("system"), "gpu_health_check", {}, via="system")
    return w


def add_jobs(w: Wiring, now: datetime) -> None:
    """Two queued jobs (the older waiting 10 minutes), one running on GPU 0, one failed whose
    attempt recovery diagnosed as cuda_oom, and a pending approval."""
    with w.store.session() as s:
        for minutes in (10, 2):
            s.add(Job(name=f"q{minutes}", spec={}, created_at=now - timedelta(minutes=minutes)))
        running = Job(name="r", spec={}, state="running")
        failed = Job(name="f", spec={}, state="failed")
        s.add(running)
        s.add(failed)
        s.flush()
        assert running.id and failed.id
        s.add(Attempt(job_id=running.id, number=1, state="running", gpus=[0], node=w.settings.node))
        s.add(
            Attempt(
                job_id=failed.id,
                number=1,
                state="exited",
                outcome="failed",
                cause="cuda_oom",
                energy_kwh=1.5,
                started_at=now - timedelta(hours=2),
                ended_at=now - timedelta(hours=1),
            )
        )
        s.add(Approval(call_id="c-1", skill="cancel_job", requester="agent", rule="r"))
    made_by_hand(w.store)


def scrape(metrics: Metrics) -> dict[str, list]:
    """Each sample by name: (labels, value)."""
    metrics._cached = None
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def only(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_metrics_read_the_health_checks_reading_and_the_store(w: Wiring) -> None:
    """Per GPU what nvidia-smi said (the capture: 100 %, 19818 of 81559 MiB, 59 °C, 631.95 W),
    labelled host, index, uuid and bus id; jobs by state, the queue's oldest wait, recoveries
    by cause, energy and pending approvals from the store."""
    now = utcnow()
    add_jobs(w, now)
    m = scrape(Metrics(w.store, w.settings, clock=lambda: now))
    gpu = {"host": w.settings.node, "gpu": "0", "uuid": H100_UUID, "bus_id": "00000000:00:09.0"}
    assert only(m, "nightshift_gpu_utilization_percent", **gpu) == 100
    assert only(m, "nightshift_gpu_memory_used_bytes", **gpu) == 19818 * 2**20
    assert only(m, "nightshift_gpu_memory_total_bytes", **gpu) == 81559 * 2**20
    assert only(m, "nightshift_gpu_temperature_celsius", **gpu) == 59
    assert only(m, "nightshift_gpu_power_watts", **gpu) == 631.95
    with w.store.session() as s:
        [sample] = s.exec(select(GpuSample)).all()
    verdict = sample.verdict
    assert only(m, "nightshift_gpu_health", **gpu) == {"OK": 0, "WARNING": 1}[verdict]
    assert only(m, "nightshift_gpu_health_verdict", verdict=verdict, **gpu) == 1
    assert only(m, "nightshift_gpu_health_verdict", verdict="CRITICAL", **gpu) == 0
    assert only(m, "nightshift_jobs", state="queued") == 2
    assert only(m, "nightshift_jobs", state="running") == 1
    assert only(m, "nightshift_jobs", state="held") == 0
    assert only(m, "nightshift_queue_oldest_wait_seconds") == pytest.approx(600, abs=1)
    assert only(m, "nightshift_recoveries_total", cause="cuda_oom") == 1
    assert only(m, "nightshift_energy_kwh_total") == 1.5
    assert only(m, "nightshift_approvals_pending") == 1
    assert "nightshift_energy_cost_total" not in m  # no tariff: no cost, not a zero


def test_a_gpu_without_a_reading_has_no_sample(w: Wiring) -> None:
    """A GPU whose utilisation could not be read (or that is gone) keeps its verdict but gets
    no utilisation sample: nothing is invented."""
    with w.store.session() as s:
        s.add(
            GpuSample(
                host=w.settings.node,
                gpu_index=1,
                uuid="GPU-1",
                verdict="CRITICAL",
                source="nvidia-smi",
                data={"index": 1, "uuid": "GPU-1", "memory_total_mib": 81559, "missing": ["x"]},
            )
        )
    m = scrape(Metrics(w.store, w.settings))
    assert [lab["gpu"] for lab, _ in m["nightshift_gpu_utilization_percent"]] == ["0"]
    assert only(m, "nightshift_gpu_health", gpu="1") == 3
    assert only(m, "nightshift_gpu_memory_total_bytes", gpu="1") == 81559 * 2**20


def test_tick_latency_and_the_wait_of_each_start_are_histograms(w: Wiring) -> None:
    """The loop tells each tick's duration; each attempt started since the daemon began is
    observed with its wait (submission → start, or the previous attempt's end → start)."""
    metrics = Metrics(w.store, w.settings)
    w.loop.on_tick = metrics.observe_tick
    w.loop.step()
    w.loop.step()
    first = scrape(metrics)
    assert only(first, "nightshift_loop_tick_seconds_count") == 2
    assert only(first, "nightshift_queue_wait_at_start_seconds_count") == 0
    t = utcnow()
    with w.store.session() as s:
        job = Job(name="j", spec={}, created_at=t - timedelta(seconds=500))
        s.add(job)
        s.flush()
        assert job.id
        s.add(Attempt(job_id=job.id, number=1, state="exited", started_at=t - timedelta(seconds=400), ended_at=t - timedelta(seconds=100)))  # fmt: skip
        s.add(Attempt(job_id=job.id, number=2, state="running", started_at=t - timedelta(seconds=40)))  # fmt: skip
    made_by_hand(w.store)
    m = scrape(metrics)
    assert only(m, "nightshift_queue_wait_at_start_seconds_count") == 2
    assert only(m, "nightshift_queue_wait_at_start_seconds_sum") == pytest.approx(100 + 60)
    assert only(m, "nightshift_queue_wait_at_start_seconds_bucket", le="60.0") == 1


def test_energy_cost_at_the_tariff(home: Path) -> None:
    tariff = {"timezone": "UTC", "currency": "EUR", "default_price_per_kwh": 0.25, "windows": []}
    w = Wiring(Settings.model_validate({"home": str(home), "gpu": {"probe": "none"}, "tariff": tariff}), server=True)  # fmt: skip
    now = utcnow()
    add_jobs(w, now)
    cost_of, currency = w.energy_pricing()
    metrics = Metrics(w.store, w.settings, cost_of=cost_of, currency=currency)
    assert only(scrape(metrics), "nightshift_energy_cost_total", currency="EUR") == 0.375
    assert only(scrape(metrics), "nightshift_energy_cost_total", currency="EUR") == 0.375


def test_metrics_are_served_beside_the_callbacks(w: Wiring) -> None:
    server = WebServer("127.0.0.1:0", {}, print, metrics=Metrics(w.store, w.settings))
    server.start()
    try:
        r = httpx.get(f"{server.address}/metrics", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "nightshift_gpu_utilization_percent{" in r.text
        assert httpx.get(f"{server.address}/healthz").text == "ok"
    finally:
        server.stop()


# The idle-GPU rule ------------------------------------------------------------------------------


def use(util: float | None, at: datetime, held_by: tuple[int, ...] = ()) -> GpuUse:
    return GpuUse("n1", 0, "GPU-a", util, at, held_by)


def test_an_idle_gpu_while_jobs_wait_is_told_once_until_it_clears(now: datetime) -> None:
    rule = IdleGpuRule(IdleGpuSettings(threshold_pct=10, for_s=3600))
    t = now
    assert rule.observe(t, [use(3, t)], queued=2) == []
    t += timedelta(minutes=59)
    assert rule.observe(t, [use(5, t)], queued=2) == []
    t += timedelta(minutes=1)
    [alert] = rule.observe(t, [use(4, t)], queued=2)
    assert (alert.kind, alert.since, alert.queued) == ("idle_while_queued", now, 2)
    t += timedelta(hours=3)
    assert rule.observe(t, [use(4, t)], queued=2) == []  # not repeated
    assert rule.observe(t, [use(4, t)], queued=0) == []  # the queue emptied: cleared
    start = t + timedelta(minutes=1)
    assert rule.observe(start, [use(4, start)], queued=1) == []
    later = start + timedelta(hours=1)
    assert len(rule.observe(later, [use(4, later)], queued=1)) == 1  # a new spell


def test_a_busy_reading_or_no_reading_is_not_idle(now: datetime) -> None:
    rule = IdleGpuRule(IdleGpuSettings(threshold_pct=10, for_s=60))
    t = now
    rule.observe(t, [use(2, t)], queued=1)
    t += timedelta(seconds=30)
    rule.observe(t, [use(50, t)], queued=1)  # busy: the spell ends
    t += timedelta(seconds=45)
    assert rule.observe(t, [use(2, t)], queued=1) == []
    assert rule.observe(t + timedelta(hours=2), [use(None, t)], queued=1) == []


def test_a_job_holding_a_gpu_it_does_not_use(now: datetime) -> None:
    rule = IdleGpuRule(IdleGpuSettings(threshold_pct=10, for_s=600))
    assert rule.observe(now, [use(0, now, held_by=(7,))], queued=0) == []
    t = now + timedelta(minutes=10)
    [alert] = rule.observe(t, [use(1, t, held_by=(7,))], queued=0)
    assert alert.kind == "held_unused" and alert.jobs == (7,)
    assert "job(s) 7" in alert.title


def test_the_watch_audits_and_notifies_from_the_store(w: Wiring) -> None:
    """IdleWatch on the recorded readings: GPU 0 is held by a running job; an idle reading is
    recorded, and an hour later (the clock handed in) one alert is audited and notified."""
    t = utcnow()
    add_jobs(w, t)
    with w.store.session() as s:
        s.add(GpuSample(host=w.settings.node, gpu_index=0, uuid=H100_UUID, verdict="OK", source="nvidia-smi", data={"utilization_pct": 0, "uuid": H100_UUID}, taken_at=t))  # fmt: skip
    told: list = []
    clock = [t]
    watch = IdleWatch(w.store, w.audit, w.settings, notify=told.append, clock=lambda: clock[0])
    assert watch.check() == []
    clock[0] = t + timedelta(hours=1)
    [alert] = watch.check()
    assert alert.kind == "held_unused" and told == [alert]
    [event] = w.audit.events(action="alert.idle_gpu")
    assert event.payload["gpu"] == 0 and event.payload["threshold_pct"] == 10
    clock[0] += timedelta(hours=1)
    assert watch.check() == []
    assert len(w.audit.events(action="alert.idle_gpu")) == 1


# A real Prometheus ------------------------------------------------------------------------------


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        why = "no prometheus binary (apt-get install -y prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"Prometheus is required in CI ({why}); .ci/run installs it")
        pytest.skip(why)
    return found


def query(port: int, promql: str) -> list:
    """The result of a PromQL query; HTTPError (400) for one Prometheus cannot parse."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        answer = json.load(r)
    assert answer["status"] == "success", (promql, answer)
    return answer["data"]["result"]


DASHBOARD = Path(__file__).parents[1] / "docs" / "grafana" / "nightshift.json"


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_the_grafana_dashboard_asks_for_metrics_that_exist(home: Path) -> None:
    """Every nightshift_* name in docs/grafana/nightshift.json is one /metrics exports (with a
    tariff, so the cost too), and every family /metrics exports has a panel."""
    tariff = {"timezone": "UTC", "currency": "EUR", "default_price_per_kwh": 0.25, "windows": []}
    w = Wiring(Settings.model_validate({"home": str(home), "gpu": {"probe": "none"}, "tariff": tariff}), server=True)  # fmt: skip
    add_jobs(w, utcnow())
    with w.store.session() as s:
        s.add(GpuSample(host=w.settings.node, gpu_index=0, verdict="OK", source="none", data={"utilization_pct": 5, "memory_used_mib": 1, "memory_total_mib": 2, "temperature_c": 40, "power_w": 50.0, "power_limit_w": 300.0}))  # fmt: skip
    cost_of, currency = w.energy_pricing()
    exported = set(scrape(Metrics(w.store, w.settings, cost_of=cost_of, currency=currency)))
    asked = {n for e in dashboard_exprs() for n in re.findall(r"nightshift_[a-z_]+", e)}
    assert asked <= exported, asked - exported
    families = {re.sub(r"_(bucket|count|sum|total|created)$", "", n) for n in exported}
    shown = {re.sub(r"_(bucket|count|sum|total|created)$", "", n) for n in asked}
    assert families - shown <= {
        "nightshift_gpu_health_verdict",  # the same verdict as nightshift_gpu_health
        "nightshift_gpu_reading_timestamp_seconds",
    }, families - shown


@pytest.mark.service
def test_prometheus_scrapes_the_daemons_app(w: Wiring, tmp_path: Path) -> None:
    """A real Prometheus scrapes /metrics every second; a GPU metric and a queue metric come
    back through its HTTP API."""
    binary = prometheus_binary()
    add_jobs(w, utcnow())
    server = WebServer("127.0.0.1:0", {}, print, metrics=Metrics(w.store, w.settings))
    server.start()
    target = server.address.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: nightshift\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        end = time.monotonic() + 60
        gpu: list = []
        queued: list = []
        while time.monotonic() < end and not (gpu and queued):
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(1)
            try:
                gpu = query(port, "nightshift_gpu_utilization_percent")
                queued = query(port, 'nightshift_jobs{state="queued"}')
            except OSError:
                continue
        assert gpu and queued, (tmp_path / "prometheus.log").read_text()[-2000:]
        [g] = gpu
        assert g["metric"]["uuid"] == H100_UUID and g["metric"]["job"] == "nightshift"
        assert float(g["value"][1]) == 100
        assert float(queued[0]["value"][1]) == 2
        [wait] = query(port, "nightshift_queue_oldest_wait_seconds")
        assert float(wait["value"][1]) >= 600
        for expr in dashboard_exprs():  # each of the dashboard's queries parses and runs
            query(port, expr.replace("$host", ".*"))
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        server.stop()


def test_the_daemon_serves_metrics_on_web_listen(home: Path) -> None:
    """The real daemon with `web.listen` and no channel: /metrics on that address, the loop's
    ticks counted; `metrics.enabled: false` leaves /metrics out of the same app."""
    port = free_port()
    env = {**os.environ, "NIGHTSHIFT_WEB__LISTEN": f"127.0.0.1:{port}"}
    env["NIGHTSHIFT_GPU__PROBE"] = "none"
    for enabled, want in (("true", 200), ("false", 404)):
        env["NIGHTSHIFT_METRICS__ENABLED"] = enabled
        with running_daemon(env) as daemon:
            end = time.monotonic() + 60
            while True:
                assert daemon.alive() and time.monotonic() < end, "no endpoint"
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                    if want == 404 or "nightshift_loop_tick_seconds_count" in r.text:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            assert r.status_code == want
            if want == 200:
                [count] = [
                    float(line.split()[-1])
                    for line in r.text.splitlines()
                    if line.startswith("nightshift_loop_tick_seconds_count")
                ]
                while count < 1 and time.monotonic() < end:  # the first tick may still run
                    time.sleep(0.5)
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                    count = float(text.split("nightshift_loop_tick_seconds_count ")[1].split()[0])
                assert count >= 1
        assert "Traceback" not in daemon.output, daemon.output
        assert f"HTTP on http://127.0.0.1:{port}" in daemon.output, daemon.output


def test_the_scrape_benchmark_runs() -> None:
    """evals/metrics_scrape.py on a small store (docs/benchmarks.md has its figures)."""
    from nightshift.evals import metrics_scrape

    [row] = [metrics_scrape.measure(40, 2)]
    assert row["jobs"] == 40 and int(str(row["bytes"])) > 1000


def test_a_scrape_in_progress_does_not_hold_up_the_loop(w: Wiring) -> None:
    """Mid-scrape (its read transaction open on the store) the loop still ticks and writes;
    a second scrape that cannot start within metrics.scrape_timeout_s gets a 503."""
    w.settings.metrics.scrape_timeout_s = 0.2
    metrics = Metrics(w.store, w.settings)
    reading = metrics.collect()
    next(reading)  # the first family read: the scrape's connection is open
    metrics._lock.acquire()  # as a scrape in progress holds it
    server = WebServer("127.0.0.1:0", {}, lambda line: None, metrics=metrics)
    server.start()
    try:
        t = time.monotonic()
        with w.store.session() as s:
            s.add(Job(name="meanwhile", spec={}))
        w.loop.step()
        assert time.monotonic() - t < 5
        assert httpx.get(f"{server.address}/metrics", timeout=10).status_code == 503
    finally:
        metrics._lock.release()
        reading.close()
        server.stop()
    assert b"nightshift_jobs" in metrics.exposition()
