"""The web dashboard over HTTP (Starlette's test client on the daemon's app): who is signed in
comes from a token made for an OS user and nothing else; pages escape what the store holds;
buttons are gate calls as the signed-in user (refused, parked or confirmed as the policy says,
audited under that user); a vote clicked twice counts once; CSRF and sign-in on every action."""

from __future__ import annotations

import html
import json
import os
import pwd
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from sqlmodel import col, select
from starlette.testclient import TestClient
from web_fixtures import submit, team_wiring, with_attempt

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.web import tokens
from nightshift.agent.doors.web.dashboard import COOKIE, Dashboard, csrf_of
from nightshift.agent.doors.web.server import WebServer
from nightshift.runtime.store.db import Approval, AuditEvent, WebToken

from conftest import free_port, nightshift, running_daemon


@pytest.fixture
def w(home: Path) -> Wiring:
    return team_wiring(home)


@pytest.fixture
def server(w: Wiring):
    s = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=Dashboard(w))
    yield s
    s.sock.close()


def client(server: WebServer, w: Wiring, user: str | None) -> TestClient:
    """A browser signed in as `user` (None: not signed in)."""
    c = TestClient(server.app, base_url="http://127.0.0.1", follow_redirects=False)
    if user is not None:
        secret = tokens.issue(w.store, user).secret
        r = c.get(f"/?token={secret}")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        assert "Secure" not in cookie  # plain http on loopback; behind TLS it is Secure
        c.cookies.set(COOKIE, secret)
        c.csrf = csrf_of(secret)  # type: ignore[attr-defined]
    return c


def form_of(html: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's form for `action` (its nonce and CSRF token)."""
    m = re.search(
        r'name="csrf" value="([^"]+)"><input type="hidden" name="nonce" value="([0-9a-f]+)">'
        rf'\s*<input type="hidden" name="action" value="{action}">',
        html,
    )
    assert m, html
    return {"csrf": m.group(1), "nonce": m.group(2), "action": action}


def test_without_a_token_pages_redirect_to_sign_in_and_data_is_401(server, w) -> None:
    """No token, no page: HTML pages send to /login, JSON and actions answer 401."""
    job = submit(w, "alice", "a")
    c = client(server, w, None)
    for path in ("/", f"/jobs/{job}", "/approvals", "/gantt"):
        r = c.get(path)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
    assert c.get(f"/jobs/{job}/log.json").status_code == 401
    assert c.post(f"/jobs/{job}/action", data={"action": "hold"}).status_code == 401
    assert c.get("/login").status_code == 200


def test_a_forged_or_revoked_token_is_refused_and_the_user_is_the_tokens(server, w) -> None:
    """A made-up token and a revoked one sign nobody in; the page shows the token's user, and
    nothing a request says (a header, a parameter) changes who that is."""
    c = client(server, w, None)
    forged = "nst_" + "A" * 43
    assert c.get(f"/?token={forged}").status_code == 401
    assert c.post("/login", data={"token": forged}).status_code == 401
    alice = tokens.issue(w.store, "alice")
    r = c.post("/login", data={"token": alice.secret, "next": "https://evil.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/"
    c.cookies.set(COOKIE, alice.secret)
    page = c.get("/?user=bob", headers={"X-User": "bob", "X-Forwarded-User": "bob"}).text
    assert '<span id="user">alice</span>' in page
    behind_tls = c.get(f"/?token={alice.secret}", headers={"X-Forwarded-Proto": "https"})
    assert "Secure" in behind_tls.headers["set-cookie"]
    assert tokens.revoke(w.store, "bob", alice.id) == []  # one user never revokes another's
    assert tokens.revoke(w.store, "alice", alice.id) == [alice.id]
    assert c.get("/").status_code == 303  # the next request after revoking: signed out
    with w.store.session() as s:
        row = s.exec(select(WebToken).where(col(WebToken.id) == alice.id)).one()
    assert alice.secret not in (row.digest, row.user) and len(row.digest) == 64


def test_the_cli_makes_a_token_for_the_os_user_and_revokes_it(home: Path) -> None:
    """`nightshift web token` shows the secret once, for the user running it; --revoke ends
    it; the store keeps only its digest."""
    r = nightshift("web", "token", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["user"] == pwd.getpwuid(os.geteuid()).pw_name
    w = Wiring.load()
    assert tokens.user_of(w.store, out["token"]) == out["user"]
    r = nightshift("web", "token", "--revoke", "--id", str(out["id"]))
    assert r.returncode == 0 and f"revoked {out['id']}" in r.stdout
    assert tokens.user_of(w.store, out["token"]) is None


def test_pages_show_the_store_escaped(server, w) -> None:
    """The jobs list filters; the job page has attempts, diagnosis, provenance, the log's JSON
    and the curves' JSON; a value with markup in it (a diagnosis's evidence line, from a log)
    arrives as text."""
    a = submit(w, "alice", "resnet")
    b = submit(w, "bob", "bert")
    with_attempt(w, a)
    c = client(server, w, "alice")
    page = c.get("/").text
    assert f'<a href="/jobs/{a}">resnet</a>' in page
    assert "bert" in page
    only_bob = c.get("/?owner=bob").text
    assert "bert" in only_bob and "resnet" not in only_bob
    assert "bert" not in c.get("/?name=resnet").text
    assert "resnet" not in c.get("/?state=running").text
    job = c.get(f"/jobs/{a}")
    assert job.status_code == 200
    assert "&lt;script&gt;alert(" in job.text and "<script>alert" not in job.text
    assert "0123abcd" in job.text and "cuda_oom" in job.text and "gpu-box" in job.text
    assert "Content-Security-Policy" in job.headers
    log = c.get(f"/jobs/{a}/log.json").json()
    assert log["lines"][-1] == "step 4 loss 0.200" and log["attempt"] == 1
    series = c.get(f"/jobs/{a}/metrics.json").json()["series"]
    assert series["loss"][0] == [0, 2.0] and len(series["loss"]) == 10
    assert b  # bob's job: listed, but its log is bob's (others-job-logs)
    refused = c.get(f"/jobs/{b}")
    assert "others-job-logs" in refused.text
    assert c.get(f"/jobs/{b}/log.json").status_code == 403
    assert c.get("/gantt").status_code == 200 and "gpu-box" in c.get("/gantt").text


def test_a_button_is_a_gate_call_as_the_signed_in_user(server, w) -> None:
    """alice holds her job: the audit says alice did, via the web. carol (a reader) is
    refused on the page and nothing changes. A form sent twice is one call."""
    job = submit(w, "alice", "a")
    carol = client(server, w, "carol")
    r = carol.post(f"/jobs/{job}/action", data=form_of(carol.get(f"/jobs/{job}").text, "hold"))
    assert r.status_code == 403 and "refused" in r.text
    assert w.store.job(job).state == "queued"  # type: ignore[union-attr]
    alice = client(server, w, "alice")
    form = form_of(alice.get(f"/jobs/{job}").text, "hold")
    r = alice.post(f"/jobs/{job}/action", data=form)
    assert r.status_code == 200 and "queued → held" in r.text
    again = alice.post(f"/jobs/{job}/action", data=form)
    assert "already sent" in again.text
    assert w.store.job(job).state == "held"  # type: ignore[union-attr]
    with w.store.session() as s:
        starts = s.exec(
            select(AuditEvent).where(
                col(AuditEvent.action) == "skill.start", col(AuditEvent.skill) == "pause_job"
            )
        ).all()
        refusals = s.exec(
            select(AuditEvent).where(
                col(AuditEvent.action) == "skill.refused", col(AuditEvent.skill) == "pause_job"
            )
        ).all()
    assert [e.actor for e in starts] == ["alice"]
    assert [e.actor for e in refusals] == ["carol"]


def test_a_cancel_is_confirmed_on_the_page_by_its_requester(server, w) -> None:
    """destroy-needs-confirmation: the first click shows the full request; the confirm button
    (same nonce, same call) cancels."""
    job = submit(w, "alice", "a")
    alice = client(server, w, "alice")
    form = form_of(alice.get(f"/jobs/{job}").text, "cancel")
    r = alice.post(f"/jobs/{job}/action", data=form)
    assert r.status_code == 200 and "cancel_job" in r.text and 'id="btn-confirm"' in r.text
    approval = int(re.search(r'name="confirm" value="(\d+)"', r.text).group(1))  # type: ignore[union-attr]
    assert w.store.job(job).state == "queued"  # type: ignore[union-attr]
    r = alice.post(f"/jobs/{job}/action", data={**form, "confirm": str(approval)})
    assert r.status_code == 200 and "→ cancelled" in r.text, r.text
    assert w.approvals.get(approval).state in ("executed", "approved")


def test_an_approval_clicked_twice_counts_once(server, w) -> None:
    """bob asks to hold alice's job (another person's: her vote is needed); alice approves on
    the approvals page twice; one vote is recorded. The requester cannot approve his own."""
    job = submit(w, "alice", "a")
    bob = client(server, w, "bob")
    r = bob.post(f"/jobs/{job}/action", data=form_of(bob.get(f"/jobs/{job}").text, "hold"))
    assert r.status_code == 202 and "waiting for approval" in r.text
    with w.store.session() as s:
        approval = s.exec(select(Approval)).one()
    own = bob.post(f"/approvals/{approval.id}/vote", data={"csrf": bob.csrf, "decision": "approve"})
    assert own.status_code == 403
    alice = client(server, w, "alice")
    page = alice.get("/approvals").text
    assert f'id="approve-{approval.id}"' in page
    for _ in range(2):
        r = alice.post(
            f"/approvals/{approval.id}/vote", data={"csrf": alice.csrf, "decision": "approve"}
        )
    assert r.status_code == 200
    row = w.approvals.get(approval.id)  # type: ignore[arg-type]
    assert row.state == "approved" and [v["principal"] for v in row.votes] == ["alice"]


def test_an_action_without_the_csrf_token_or_from_another_origin_is_refused(server, w) -> None:
    job = submit(w, "alice", "a")
    alice = client(server, w, "alice")
    form = form_of(alice.get(f"/jobs/{job}").text, "hold")
    assert alice.post(f"/jobs/{job}/action", data={**form, "csrf": "x"}).status_code == 403
    r = alice.post(f"/jobs/{job}/action", data=form, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    assert w.store.job(job).state == "queued"  # type: ignore[union-attr]


def test_the_page_time_benchmark_runs(home: Path) -> None:
    """evals/dashboard_pages.py on a small store (docs/benchmarks.md has its figures): every
    page answers 200 to a signed-in client."""
    from nightshift.evals import dashboard_pages

    rows = dashboard_pages.measure(40, 1)
    assert {r["page"] for r in rows} >= {"jobs list", "job page", "approvals (50 pending)"}
    assert all(int(str(r["bytes"])) > 500 for r in rows)


def test_the_daemon_serves_the_dashboard_on_web_listen(home: Path) -> None:
    """The real daemon with `web.listen`: /login answers, a token made by `nightshift web
    token` signs in and the jobs page names its user; `web.dashboard: false` leaves it out."""
    port = free_port()
    r = nightshift("web", "token", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    env = {**os.environ, "NIGHTSHIFT_WEB__LISTEN": f"127.0.0.1:{port}"}
    env["NIGHTSHIFT_GPU__PROBE"] = "none"
    for enabled, want in (("true", 200), ("false", 404)):
        env["NIGHTSHIFT_WEB__DASHBOARD"] = enabled
        with running_daemon(env) as daemon:
            end = time.monotonic() + 60
            while True:
                assert daemon.alive() and time.monotonic() < end, "no endpoint"
                try:
                    got = httpx.get(f"http://127.0.0.1:{port}/login", timeout=5)
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert got.status_code == want
            if want == 200:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
                    page = c.get(f"/?token={made['token']}", follow_redirects=True)
                assert page.status_code == 200
                assert f'<span id="user">{made["user"]}</span>' in page.text
        assert "Traceback" not in daemon.output, daemon.output


# ---------------------------------------------------------------------------- second slice
def with_curve(w: Wiring, job_id: int, scale: float) -> None:
    """A second job's attempt and its loss curve (another shape than with_attempt's)."""
    from nightshift.runtime.store.db import Attempt, MetricPoint, utcnow

    from conftest import made_by_hand

    with w.store.session() as s:
        att = Attempt(
            job_id=job_id,
            number=1,
            state="exited",
            outcome="succeeded",
            gpus=[1],
            host="gpu-box",
            started_at=utcnow(),
            provenance={"seed": 8},
        )
        s.add(att)
        s.flush()
        s.add_all(
            MetricPoint(
                attempt_id=att.id, job_id=job_id, step=i, name="loss", value=scale / (i + 1)
            )
            for i in range(0, 50, 5)
        )
        s.commit()
    made_by_hand(w.store)


def test_compare_shows_both_jobs_side_by_side_as_the_signed_in_user(server, w) -> None:
    """Two of alice's jobs ticked on the jobs list: parameters, final and best loss, the
    provenance that differs, and both curves in one SVG. bob may not read alice's curves
    (others-job-logs): refused, and the refusal is audited as bob's."""
    a, b = submit(w, "alice", "resnet"), submit(w, "alice", "resnet-wide")
    with_attempt(w, a)
    with_curve(w, b, 3.0)
    c = client(server, w, "alice")
    listing = c.get("/").text
    assert f'name="jobs" value="{a}" form="compare"' in listing and 'id="btn-compare"' in listing
    r = c.get(f"/compare?jobs={a}&jobs={b}")  # what the list's checkboxes send
    assert r.status_code == 200, r.text
    assert c.get(f"/compare?jobs={a},{b}").status_code == 200
    page = r.text
    assert f'data-job="{a}"' in page and f'data-job="{b}"' in page  # two polylines, one SVG
    assert page.count('class="series') == 2 and page.count('<svg id="overlay"') == 1
    assert "0.0434783 @ step 45" in page and "0.0652174 @ step 45" in page  # 2/46, 3/46
    assert "2 @ step 0" not in page  # best of a falling loss is its last: min mode
    assert "seed" in page and "0123abcd" in page  # provenance differs: seed 7 vs 8, commit
    bob = client(server, w, "bob")
    refused = bob.get(f"/compare?jobs={a},{b}")
    assert refused.status_code == 403 and "others-job-logs" in refused.text
    with w.store.session() as s:
        who = s.exec(
            select(AuditEvent.actor).where(
                col(AuditEvent.skill) == "compare_jobs", col(AuditEvent.action) == "skill.refused"
            )
        ).all()
    assert who == ["bob"]
    assert c.get("/compare?jobs=1").status_code == 400
    assert c.get(f"/compare?jobs={a},99999").status_code in (400, 404)


def test_a_reproduced_job_links_to_compare_with_its_source(server, w, tmp_path) -> None:
    """reproduce_job from the page; the new job's page links to /compare of the two."""
    a = submit(w, "alice", "resnet")
    with_attempt(w, a)
    with w.store.session() as s:  # no git recorded: it reruns the folder as it is
        from nightshift.runtime.store.db import Attempt

        att = s.exec(select(Attempt).where(col(Attempt.job_id) == a)).one()
        att.provenance = {"code_dir": str(tmp_path), "seed": 7}
        s.add(att)
        s.commit()
    c = client(server, w, "alice")
    r = c.post(f"/jobs/{a}/action", data=form_of(c.get(f"/jobs/{a}").text, "reproduce"))
    assert r.status_code == 200 and f"queued from job {a}" in r.text, r.text
    new = int(re.search(r"job (\d+) queued from", r.text).group(1))  # type: ignore[union-attr]
    assert f'href="/compare?jobs={a},{new}"' in c.get(f"/jobs/{new}").text
    assert "compare-source" not in c.get(f"/jobs/{a}").text


def test_the_report_page_is_nightshift_report(server, w, home) -> None:
    """/report shows what `nightshift report` prints: the same headline lines and jobs."""
    a = submit(w, "alice", "resnet")
    with_attempt(w, a)
    c = client(server, w, "alice")
    page = c.get("/report").text
    cli = nightshift("report", "--hours", "24").stdout
    for line in ("jobs: 1 (1 queued)", "attempts: 1", "GPU-hours: 1.00"):
        assert line in cli and f"<li>{line}" in page, line
    assert "cuda_oom" in page and f'<a href="/jobs/{a}">{a}</a>' in page
    assert c.get("/report?hours=1").status_code == 200


def submit_form(c: TestClient) -> dict[str, str]:
    page = c.get("/submit").text
    m = re.search(
        r'name="csrf" value="([^"]+)"><input type="hidden" name="nonce" value="(\w+)"', page
    )
    assert m, page
    return {"csrf": m.group(1), "nonce": m.group(2)}


def test_the_submit_form_makes_one_job_owned_by_the_signed_in_user(server, w) -> None:
    """A form (with an `owner` field a page could forge) sent twice: one job, alice's, its
    parameters and GPUs those typed, a cheap-hours job cost_sensitive."""
    from nightshift.runtime.store.db import Job

    c = client(server, w, "alice")
    form = {
        **submit_form(c),
        "name": "from-web",
        "command": "python -c 'print({lr})'",
        "gpus": "1",
        "params": "lr: 0.1",
        "when": "cheap",
        "owner": "bob",
    }
    first, second = c.post("/submit", data=form), c.post("/submit", data=form)
    assert first.status_code == 200 and "owner alice" in first.text, first.text
    assert "already sent" in second.text
    with w.store.session() as s:
        jobs = s.exec(select(Job).where(col(Job.name) == "from-web")).all()
    assert len(jobs) == 1 and jobs[0].owner == "alice" and jobs[0].params == {"lr": 0.1}
    assert jobs[0].spec["command"] == ["python", "-c", "print({lr})"]
    assert jobs[0].spec["resources"]["gpus"] == 1 and jobs[0].spec["cost_class"] == "cost_sensitive"


def test_a_bad_field_comes_back_named_with_what_was_typed(server, w) -> None:
    """Each bad field is named next to itself with its fix; what was typed stays."""
    from nightshift.runtime.store.db import Job

    c = client(server, w, "alice")
    base = {**submit_form(c), "name": "ok", "command": "python train.py"}
    cases = {
        "gpus": ({"gpus": "two"}, "not a whole number"),
        "name": ({"name": "has space"}, "name"),
        "params": ({"params": "- a list"}, "YAML mapping"),
        "begin": ({"when": "begin", "begin": "soonish"}, "is not a time"),
        "command": ({"command": "python 'unclosed"}, "closing quotation"),
    }
    for field, (bad, fix) in cases.items():
        r = c.post("/submit", data={**base, **bad})
        assert r.status_code == 400, (field, r.text)
        m = re.search(rf'id="error-{field}">([^<]*)<', r.text)
        assert m and fix in m.group(1), (field, r.text)
        for v in bad.values():
            assert html.escape(v, quote=True) in r.text  # kept as typed
    spec = c.post("/submit", data={**base, "command": "", "spec": "name: [unclosed"})
    assert 'id="error-spec"' in spec.text and "name: [unclosed" in spec.text
    with w.store.session() as s:
        assert s.exec(select(Job)).all() == []
    assert c.post("/submit", data={k: v for k, v in base.items() if k != "csrf"}).status_code == 403


def test_the_gantt_draws_the_tariff_bands_and_marks_holds(home) -> None:
    """With a tariff in the config: a band per price stretch behind the bars over the window,
    a legend naming each window and price; an attempt a person held is marked, and so is one
    the tariff's cheap window closing stopped (outcome paused: it was not marked before)."""
    from web_fixtures import night_and_day

    from nightshift.runtime.store.db import Attempt

    w = team_wiring(home, night_and_day())

    def night_page() -> str:
        served = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=Dashboard(w))
        try:
            return client(served, w, "alice").get("/gantt").text
        finally:
            served.sock.close()

    a = submit(w, "alice", "held-one")
    with_attempt(w, a)
    with w.store.session() as s:
        att = s.exec(select(Attempt).where(col(Attempt.job_id) == a)).one()
        att.outcome = "held"
        s.add(att)
        s.commit()
    page = night_page()
    bands = re.findall(r'class="band price-(\d)"><title>([^<]+)</title>', page)
    assert {t for _, t in bands} == {"night: 0.1 EUR/kWh", "day: 0.3 EUR/kWh"}
    assert 2 <= len(bands) <= 3  # 24 h: day/night boundaries at 07:00 and 23:00
    assert {lvl for lvl, t in bands if t.startswith("night")} == {"0"}
    assert 'id="tariff-legend"' in page and page.index('class="band') < page.index('class="bar')
    assert "⏸ hold" in page and "bar held held" in page
    with w.store.session() as s:  # the tariff's window closed on it: marked as such
        att = s.exec(select(Attempt).where(col(Attempt.job_id) == a)).one()
        att.outcome = "paused"
        s.add(att)
        s.commit()
    page = night_page()
    assert "⏸ cheap hours over" in page and "bar paused held" in page


def test_a_form_body_that_never_arrives_is_cut_at_the_deadline(w, monkeypatch) -> None:
    """The dashboard's forms read their body as the callbacks do (body.py): a client that sends
    a POST's headers and then stalls gets 408 at the deadline, not a worker held for ever; a
    form without a Content-Length gets 411."""
    from nightshift.agent.doors.web import body

    monkeypatch.setattr(body, "READ_TIMEOUT_S", 0.5)
    secret = tokens.issue(w.store, "alice").secret
    server = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=Dashboard(w))
    server.start()
    host, port = server.address.removeprefix("http://").split(":")
    head = (
        f"POST /submit HTTP/1.1\r\nHost: {host}:{port}\r\nCookie: {COOKIE}={secret}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
    )
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(f"{head}Content-Length: 100\r\n\r\ncsrf=".encode())  # 5 of 100 bytes
            t = time.monotonic()
            answer = sock.recv(4096).decode()
            assert answer.startswith("HTTP/1.1 408"), answer
            assert time.monotonic() - t < 3
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                f"{head}Transfer-Encoding: chunked\r\n\r\n5\r\ncsrf=\r\n0\r\n\r\n".encode()
            )
            assert sock.recv(4096).decode().startswith("HTTP/1.1 411")
    finally:
        server.stop()
