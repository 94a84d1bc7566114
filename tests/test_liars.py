"""evals/liars.py: a seeded share of the long jobs give a one-minute estimate, and the table
splits the waits between them and the honest jobs."""

from __future__ import annotations

import math

from nightshift.evals import liars as L
from nightshift.evals import scheduler_table as T


def test_every_long_job_lies_at_share_one_and_the_rest_are_honest(monkeypatch, capsys):
    monkeypatch.setattr(L, "WINDOWS", (T.Window("philly", 0.1, 0.8),))
    (row,) = L.run(["nightshift-notariff"], share=1.0)
    (none,) = L.run(["nightshift-notariff"], share=1e-9)
    assert row["liars"] > 0 and none["liars"] == 0
    assert math.isfinite(float(row["liars_mean_h"])) and math.isnan(float(none["liars_mean_h"]))
    assert float(row["honest_mean_h"]) >= 0 and float(row["honest_max_h"]) >= 0
    assert L.main(["--policies", "easy", "--share", "0.5"]) == 0
    assert "| philly | `easy` |" in capsys.readouterr().out
