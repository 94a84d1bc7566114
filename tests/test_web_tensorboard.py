"""TensorBoard inside the dashboard (/jobs/{id}/tensorboard/): TensorBoard's own app over the
event files a job's program wrote, behind the dashboard's sign-in and the job_logs decision;
its data moves as the program writes; without tensorboard the page says how to install it.
Over HTTP through Starlette's test client on the daemon's app, and once in real chromium."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from test_web_browser import browser, shots, signed_in  # noqa: F401  (fixtures)
from web_fixtures import submit, team_wiring

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.web import tensorboard, tokens
from nightshift.agent.doors.web.dashboard import COOKIE, Dashboard
from nightshift.agent.doors.web.server import WebServer
from nightshift.runtime.engine import job_paths

from conftest import need

TAG = "train/loss"
# The job's program: TensorBoard's own writer, a scalar per step into the folder it is given.
PROGRAM = """
import sys
from tensorboard.summary import Writer
w = Writer(sys.argv[1])
for step in range(int(sys.argv[2]), int(sys.argv[3])):
    w.add_scalar("train/loss", 1.0 / (step + 1), step)
w.close()
"""


@pytest.fixture
def w(home: Path) -> Wiring:
    need("tensorboard.program", "the tensorboard extra: TensorBoard itself")
    need("a2wsgi", "the tensorboard extra: TensorBoard's WSGI app on the ASGI app")
    return team_wiring(home)


@pytest.fixture
def server(w: Wiring, monkeypatch):
    monkeypatch.setattr(tensorboard, "RELOAD_S", 0.2)
    dashboard = Dashboard(w)
    s = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=dashboard)
    yield s
    dashboard._boards.close()
    s.sock.close()


def client(server: WebServer, w: Wiring, user: str | None) -> TestClient:
    c = TestClient(server.app, base_url="http://127.0.0.1", follow_redirects=False)
    if user is not None:
        c.cookies.set(COOKIE, tokens.issue(w.store, user).secret)
    return c


def run_program(w: Wiring, job_id: int, start: int, stop: int, run: str = "train") -> Path:
    """Run the job's program (a process of its own) writing steps start..stop-1 below the
    job's folder; the folder of its event files is returned."""
    job = w.store.job(job_id)
    assert job is not None
    out = job_paths(w.settings, job)["workspace"] / "tb" / run
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", PROGRAM, str(out), str(start), str(stop)], check=True)
    return out


def scalars(c: TestClient, job_id: int) -> list[tuple[int, float]]:
    r = c.get(f"/jobs/{job_id}/tensorboard/data/plugin/scalars/scalars?run=tb/train&tag={TAG}")
    assert r.status_code == 200, r.text
    return [(int(step), float(value)) for _, step, value in r.json()]


def test_the_owner_sees_tensorboard_and_the_scalars_written(server, w) -> None:
    """alice's job page links to TensorBoard; its index is TensorBoard's, with the dashboard's
    framing and caching rules; its scalars route returns the values the program wrote, and
    steps written later arrive without a new page."""
    job = submit(w, "alice", "tb-run")
    c = client(server, w, "alice")
    assert 'id="tensorboard"' not in c.get(f"/jobs/{job}").text  # no event file yet
    assert "no TensorBoard event files" in c.get(f"/jobs/{job}/tensorboard/").text
    run_program(w, job, 0, 10)
    assert f'href="/jobs/{job}/tensorboard/"' in c.get(f"/jobs/{job}").text

    r = c.get(f"/jobs/{job}/tensorboard/")
    assert r.status_code == 200 and "<tb-webapp>" in r.text
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert "'unsafe-eval'" in r.headers["content-security-policy"]  # TensorBoard's own
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    runs = c.get(f"/jobs/{job}/tensorboard/data/runs")
    assert runs.json() == ["tb/train"] and runs.headers["cache-control"] == "no-store"
    got = scalars(c, job)
    assert [s for s, _ in got] == list(range(10))
    assert [v for _, v in got] == pytest.approx([1.0 / (s + 1) for s in range(10)], rel=1e-6)

    run_program(w, job, 10, 15)  # the run goes on: a new event file
    end = time.monotonic() + 10
    while len(got) < 15 and time.monotonic() < end:
        time.sleep(0.1)
        got = scalars(c, job)
    assert [s for s, _ in got] == list(range(15))


def test_no_sign_in_and_no_right_are_refused(server, w) -> None:
    """Without a token nothing of TensorBoard is served; bob (an operator, not an admin)
    is refused with the policy's reason; a POST from another site is refused."""
    job = submit(w, "alice", "private")
    run_program(w, job, 0, 3)
    anonymous = client(server, w, None)
    for path in ("", "data/runs", f"data/plugin/scalars/scalars?run=tb/train&tag={TAG}"):
        r = anonymous.get(f"/jobs/{job}/tensorboard/{path}")
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
    bob = client(server, w, "bob")
    for path in ("", f"data/plugin/scalars/scalars?run=tb/train&tag={TAG}"):
        r = bob.get(f"/jobs/{job}/tensorboard/{path}")
        assert r.status_code == 403 and "others-job-logs" in r.text and "tb/train" not in r.text
    alice = client(server, w, "alice")
    r = alice.post(
        f"/jobs/{job}/tensorboard/data/plugin/scalars/scalars_multirun",
        data={"tag": TAG, "runs": "tb/train"},
        headers={"origin": "https://evil.example"},
    )
    assert r.status_code == 403
    r = alice.post(
        f"/jobs/{job}/tensorboard/data/plugin/scalars/scalars_multirun",
        data={"tag": TAG, "runs": "tb/train"},
    )
    assert r.status_code == 200 and len(r.json()["tb/train"]) == 3


def test_without_tensorboard_the_page_says_how_to_install_it(server, w, monkeypatch) -> None:
    """tensorboard not importable where the daemon runs: the page names the extra, no trace."""
    job = submit(w, "alice", "no-tb")
    run_program(w, job, 0, 3)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard.program", None)
    r = client(server, w, "alice").get(f"/jobs/{job}/tensorboard/")
    assert r.status_code == 503
    assert "pip install &#x27;nightshift[tensorboard]&#x27;" in r.text
    assert "Traceback" not in r.text


def test_boards_past_the_limit_are_closed(server, w, monkeypatch) -> None:
    """Only MAX_BOARDS TensorBoards are kept: the least recently used one is closed (its
    reload thread ends) and made again when asked for."""
    monkeypatch.setattr(tensorboard, "MAX_BOARDS", 1)
    c = client(server, w, "alice")
    first, second = submit(w, "alice", "one"), submit(w, "alice", "two")
    for job in (first, second):
        run_program(w, job, 0, 2)
    boards = server.dashboard._boards  # type: ignore[union-attr]
    assert c.get(f"/jobs/{first}/tensorboard/data/runs").status_code == 200
    old = boards._boards[first]
    assert c.get(f"/jobs/{second}/tensorboard/data/runs").status_code == 200
    assert list(boards._boards) == [second]
    old._thread.join(timeout=5)
    assert not old._thread.is_alive()
    assert [s for s, _ in scalars(c, first)] == [0, 1]


def test_tensorboard_in_the_browser_shows_the_scalar(browser, w, shots) -> None:  # noqa: F811
    """From the job page's link, TensorBoard's frontend loads under the dashboard's prefix
    and draws the scalar the program wrote (its tag shown)."""
    job = submit(w, "alice", "tb-browser")
    run_program(w, job, 0, 50)
    server = WebServer("127.0.0.1:0", {}, lambda line: None, dashboard=Dashboard(w))
    server.start()
    try:
        base = server.address
        page: Any = signed_in(browser, base, w, "alice")
        blocked: list[str] = []
        page.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.goto(f"{base}/jobs/{job}")
        started = time.monotonic()
        page.click("#tensorboard")
        page.get_by_text(TAG).first.wait_for(timeout=30_000)
        page.wait_for_selector("canvas, svg.line-chart, .line-chart", timeout=30_000)
        print(f"TensorBoard first load: {time.monotonic() - started:.2f} s")
        assert page.url == f"{base}/jobs/{job}/tensorboard/#timeseries"
        page.screenshot(path=str(shots / "tensorboard.png"))
        assert blocked == []  # TensorBoard's frontend runs under the CSP it is given
    finally:
        server.dashboard._boards.close()  # type: ignore[union-attr]
        server.stop()


def test_a_folder_with_a_linked_event_file_is_left_out(server, w) -> None:
    """bob's program puts a link to alice's event file beside its own in one folder: that
    folder is left out of his TensorBoard (it would open what the link points to, as the
    daemon); his other run is shown."""
    alices = run_program(w, submit(w, "alice", "secret"), 0, 3)
    job = submit(w, "bob", "snoop")
    run_program(w, job, 0, 2)
    mixed = run_program(w, job, 0, 2, run="mixed")
    theirs = next(alices.iterdir())
    (mixed / theirs.name).symlink_to(theirs)
    r = client(server, w, "bob").get(f"/jobs/{job}/tensorboard/data/runs")
    assert r.status_code == 200 and r.json() == ["tb/train"]
