"""The web dashboard in a real headless browser: Debian's chromium driven by Playwright, against
the daemon's app served on loopback. Pages load; a line appended to a running job's log shows up
on its page; a button makes a gated call (audited as the signed-in user; a reader is refused on
the page); an approval double-clicked on the page counts once; reproduce and retry make their
job and attempt; two jobs ticked on the list are compared with their curves overlaid; the
morning report loads; the experiment form, double-clicked, makes one job of the signed-in
user's.

Skipped, saying why, where chromium or playwright is missing; under CI=true their absence
fails (.ci/chromium.sh installs chromium, the `test` extra playwright). Screenshots of each
page go to $NIGHTSHIFT_SCREENSHOTS (docs/screenshots/ holds the ones the README shows), else to
the test's temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from web_fixtures import night_and_day, submit, team_wiring, with_attempt

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.web import tokens
from nightshift.agent.doors.web.dashboard import Dashboard
from nightshift.agent.doors.web.server import WebServer
from nightshift.runtime.store.db import Approval, Attempt, AuditEvent, Job

from conftest import need

CHROMIUM = "/usr/bin/chromium"


def expect(locator: Any) -> Any:
    """Playwright's waiting assertions (selectors, no eval: the pages' CSP forbids it)."""
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = need("playwright.sync_api", "drives the headless browser")
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is required in CI; .ci/chromium.sh installs it")
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/chromium.sh)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def w(home: Path) -> Wiring:
    return team_wiring(home, night_and_day())


@pytest.fixture
def base(w: Wiring) -> Iterator[str]:
    server = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=Dashboard(w))
    server.start()
    yield server.address
    server.stop()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("NIGHTSHIFT_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def signed_in(browser: Any, base: str, w: Wiring, user: str) -> Any:
    """A page of a fresh browser context, signed in as `user` through the login form."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{base}/")
    assert page.url.startswith(f"{base}/login")
    page.fill("input[name=token]", tokens.issue(w.store, user).secret)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    assert page.text_content("#user") == user
    return page


def test_pages_load_and_are_screenshot(browser, base, w, shots) -> None:
    """Every page renders in the browser, the curves are drawn by the page's script."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{base}/login")
    page.screenshot(path=str(shots / "login.png"))
    job = submit(w, "alice", "resnet-night")
    submit(w, "bob", "bert-finetune")
    with_attempt(w, job, lines=30)
    page = signed_in(browser, base, w, "alice")
    page.screenshot(path=str(shots / "jobs.png"), full_page=True)
    page.goto(f"{base}/jobs/{job}")
    page.wait_for_selector("svg.curve[data-metric=loss]")
    expect(page.locator("#log")).to_contain_text("step 29")
    page.screenshot(path=str(shots / "job.png"), full_page=True)
    page.goto(f"{base}/gantt")
    assert page.locator("#gantt rect.bar").count() == 1
    assert page.locator("#gantt rect.band").count() >= 2  # the tariff's night and day
    expect(page.locator("#tariff-legend")).to_contain_text("night: 0.1 EUR/kWh")
    page.screenshot(path=str(shots / "gantt.png"), full_page=True)
    page.goto(f"{base}/approvals")
    assert "No approval is waiting" in page.content()


def test_a_new_log_line_arrives_on_the_page(browser, base, w) -> None:
    """The job page polls its log: a line the program writes appears without a reload."""
    job = submit(w, "alice", "live")
    log = with_attempt(w, job, lines=3)
    page = signed_in(browser, base, w, "alice")
    page.goto(f"{base}/jobs/{job}")
    expect(page.locator("#log")).to_contain_text("step 2")
    with log.open("a") as f:
        f.write("step 3 loss 0.111 <b>not markup</b>\n")
    expect(page.locator("#log")).to_contain_text("step 3 loss 0.111 <b>", timeout=10_000)
    assert page.locator("#log b").count() == 0  # text, never markup


def test_a_button_makes_a_gated_call_as_the_signed_in_user(browser, base, w, shots) -> None:
    """carol (a reader) clicks Hold: refused on the page; alice clicks it: held, audited as
    alice's call through the gate."""
    job = submit(w, "alice", "hold-me")
    carol = signed_in(browser, base, w, "carol")
    carol.goto(f"{base}/jobs/{job}")
    carol.click("#btn-hold")
    assert "refused" in (carol.text_content("#result") or "")
    assert w.store.job(job).state == "queued"  # type: ignore[union-attr]
    alice = signed_in(browser, base, w, "alice")
    alice.goto(f"{base}/jobs/{job}")
    alice.click("#btn-hold")
    assert "queued → held" in (alice.text_content("#result") or "")
    alice.screenshot(path=str(shots / "action.png"))
    assert w.store.job(job).state == "held"  # type: ignore[union-attr]
    with w.store.session() as s:
        actors = s.exec(
            select(AuditEvent.actor, AuditEvent.action).where(
                col(AuditEvent.skill) == "pause_job",
                col(AuditEvent.action).in_(["skill.start", "skill.refused"]),
            )
        ).all()
    assert sorted(actors) == [("alice", "skill.start"), ("carol", "skill.refused")]


def test_an_approval_double_clicked_on_the_page_counts_once(browser, base, w, shots) -> None:
    """bob's hold of alice's job waits for her; she double-clicks Approve: one vote."""
    job = submit(w, "alice", "theirs")
    bob = signed_in(browser, base, w, "bob")
    bob.goto(f"{base}/jobs/{job}")
    bob.click("#btn-hold")
    assert "waiting for approval" in (bob.text_content("#result") or "")
    with w.store.session() as s:
        approval = s.exec(select(Approval)).one()
    alice = signed_in(browser, base, w, "alice")
    alice.goto(f"{base}/approvals")
    alice.screenshot(path=str(shots / "approvals.png"), full_page=True)
    alice.dblclick(f"#approve-{approval.id}")
    alice.wait_for_selector(".banner")
    row = w.approvals.get(approval.id)  # type: ignore[arg-type]
    assert row.state == "approved" and [v["principal"] for v in row.votes] == ["alice"]


def jobs_in(w: Wiring) -> list[Job]:
    with w.store.session() as s:
        return list(s.exec(select(Job).order_by(col(Job.id))))


def gated(w: Wiring, skill: str) -> list[tuple[str, str]]:
    """(actor, action) of the audit's start and refusal events of `skill`."""
    with w.store.session() as s:
        return list(
            s.exec(
                select(AuditEvent.actor, AuditEvent.action).where(
                    col(AuditEvent.skill) == skill,
                    col(AuditEvent.action).in_(["skill.start", "skill.refused"]),
                )
            ).all()
        )


def test_reproduce_and_retry_buttons_make_their_job_and_attempt(browser, base, w, tmp_path):
    """alice's failed job, its code in a real git repository: Reproduce (double-clicked) queues
    one new job of hers from the recorded commit; Retry requeues the failed job for one more
    attempt (its attempt limit raised by one). Counted from the store and the audit."""
    repo = tmp_path / "code"
    repo.mkdir()
    (repo / "train.py").write_text("print('hi')\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "train"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    job = submit(w, "alice", "to-redo")
    with_attempt(w, job)
    with w.store.session() as s:
        att = s.exec(select(Attempt).where(col(Attempt.job_id) == job)).one()
        att.provenance = {"git": {"repo": str(repo), "commit": commit}, "seed": 7}
        row = s.get(Job, job)
        assert row is not None
        row.state, row.reason, row.max_attempts = "failed", "cuda_oom", 1
        s.add_all([att, row])
        s.commit()
    page = signed_in(browser, base, w, "alice")
    page.goto(f"{base}/jobs/{job}")
    page.dblclick("#btn-reproduce")
    expect(page.locator("#result")).to_contain_text(f"queued from job {job}")
    after = jobs_in(w)
    assert len(after) == 2 and after[-1].owner == "alice" and after[-1].name == "to-redo"
    assert after[-1].spec["code"]["path"].startswith(str(w.settings.runs_dir / "reproduce"))
    assert gated(w, "reproduce_job") == [("alice", "skill.start")]
    page.goto(f"{base}/jobs/{after[-1].id}")
    page.click("#compare-source")  # the reproduced job's link to compare with its source
    expect(page.locator("table.compare")).to_contain_text(f"job {job}")
    page.goto(f"{base}/jobs/{job}")
    page.click("#btn-retry")
    expect(page.locator("#result")).to_contain_text("failed → queued")
    again = w.store.job(job)
    assert again is not None and again.state == "queued" and again.max_attempts == 2
    assert len(w.store.attempts(job)) + 1 == again.max_attempts  # room for one more attempt
    assert gated(w, "retry_job") == [("alice", "skill.start")]


def test_two_jobs_ticked_on_the_list_are_compared(browser, base, w, shots) -> None:
    """Tick two jobs, Compare selected: both jobs side by side, their curves in one SVG."""
    a, b = submit(w, "alice", "resnet-night"), submit(w, "alice", "resnet-wide")
    with_attempt(w, a)
    with_attempt(w, b, lines=8)
    with w.store.session() as s:  # the second one learnt faster
        from nightshift.runtime.store.db import MetricPoint

        for p in s.exec(select(MetricPoint).where(col(MetricPoint.job_id) == b)):
            p.value = p.value * 0.6
            s.add(p)
        s.commit()
    page = signed_in(browser, base, w, "alice")
    page.check(f"input[name=jobs][value='{a}']")
    page.check(f"input[name=jobs][value='{b}']")
    page.click("#btn-compare")
    page.wait_for_url(f"{base}/compare?jobs={b}&jobs={a}")  # the list is newest first
    expect(page.locator("table.compare").first).to_contain_text(f"job {a}")
    expect(page.locator("table.compare").first).to_contain_text(f"job {b}")
    assert page.locator("#overlay polyline.series").count() == 2
    assert page.locator(f"#overlay polyline[data-job='{b}']").count() == 1
    page.screenshot(path=str(shots / "compare.png"), full_page=True)


def test_the_report_page_loads(browser, base, w, shots) -> None:
    job = submit(w, "alice", "resnet-night")
    with_attempt(w, job)
    page = signed_in(browser, base, w, "alice")
    page.click("nav a[href='/report']")
    expect(page.locator("#headline")).to_contain_text("attempts: 1")
    expect(page.locator("table.causes")).to_contain_text("cuda_oom")
    page.screenshot(path=str(shots / "report.png"), full_page=True)


def test_the_form_makes_one_job_of_the_signed_in_user(browser, base, w, shots) -> None:
    """A bad GPU count comes back named, the text kept; fixed and double-clicked: one job,
    alice's, with what she typed."""
    page = signed_in(browser, base, w, "alice")
    page.click("nav a[href='/submit']")
    page.fill("#f-name", "from-the-form")
    page.fill("#f-command", "python train.py --lr {lr}")
    page.fill("#f-params", "lr: 0.05")
    page.fill("#f-gpus", "-1")
    page.check("#when-cheap")
    page.click("#btn-submit")
    expect(page.locator("#error-gpus")).to_contain_text("resources.gpus")
    assert page.input_value("#f-command") == "python train.py --lr {lr}"
    assert page.input_value("#f-params") == "lr: 0.05" and page.is_checked("#when-cheap")
    page.screenshot(path=str(shots / "submit.png"), full_page=True)
    page.fill("#f-gpus", "1")
    page.dblclick("#btn-submit")
    expect(page.locator("#result")).to_contain_text("queued, owner alice")
    made = jobs_in(w)
    assert len(made) == 1 and made[0].owner == "alice" and made[0].params == {"lr": 0.05}
    assert made[0].spec["cost_class"] == "cost_sensitive"
    assert gated(w, "submit_job") == [("alice", "skill.start")]
