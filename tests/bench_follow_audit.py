"""The audit rows one `nightshift logs JOB -f` of a daemon's client leaves, for a job printing 10
and then 2,000 lines over about 3 s across two attempts (docs/benchmarks.md, issue 28):
`python tests/bench_follow_audit.py`. Counted from outside nightshift, with sqlite3."""

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from served_daemon import served  # noqa: E402
from test_follow_audit import _submit  # noqa: E402

with served(Path(tempfile.mkdtemp())) as d:
    for n in (10, 2000):
        tmp = Path(tempfile.mkdtemp())
        job = _submit(d, tmp, n)
        db = sqlite3.connect(d.home / "nightshift.db")
        before = db.execute("SELECT count(*) FROM auditevent").fetchone()[0]
        t = time.monotonic()
        f = d.run("logs", str(job), "-f", "-n", "5000", timeout=300)
        took = time.monotonic() - t
        c, size = db.execute(
            "SELECT count(*), coalesce(sum(length(payload)),0) FROM auditevent WHERE skill='job_logs' AND job_id=?",
            (job,),
        ).fetchone()
        total = db.execute("SELECT count(*) FROM auditevent").fetchone()[0] - before
        print(
            f"lines={n} exit={f.returncode} follow_s={took:.1f} job_logs_events={c} payload_bytes={size} all_audit_rows_during={total}"
        )
