"""The web dashboard in a real headless browser: Debian's chromium driven by Playwright, against
the daemon's app served on loopback. Pages load; a line appended to a running job's log shows up
on its page; a button makes a gated call (audited as the signed-in user; a reader is refused on
the page); an approval double-clicked on the page counts once.

Skipped, saying why, where chromium or playwright is missing; under CI=true their absence
fails (.ci/chromium.sh installs chromium, the `test` extra playwright). Screenshots of each
page go to $NIGHTSHIFT_SCREENSHOTS (docs/screenshots/ holds the ones the README shows), else to
the test's temporary folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from web_fixtures import submit, team_wiring, with_attempt

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.web import tokens
from nightshift.agent.doors.web.dashboard import Dashboard
from nightshift.agent.doors.web.server import WebServer
from nightshift.runtime.store.db import Approval, AuditEvent

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
    return team_wiring(home)


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
    assert page.locator("#gantt rect").count() == 1
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
