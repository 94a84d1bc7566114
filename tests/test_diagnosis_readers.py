"""The blind readings the diagnosis eval sets the rules beside: drawn from the held-out split,
each log read by both readers in the corpus's categories, and scored the way the eval says."""

from __future__ import annotations

from nightshift.evals import diagnosis_readers as readers
from nightshift.evals.diagnosis import CORPUS, load_corpus

CONFIDENCES = {"high", "medium", "low"}


def test_the_readings_are_400_held_out_logs_read_twice_in_the_corpus_s_categories():
    readings = readers.load_readings()
    cases = {c.slug: c for c in load_corpus()}
    categories = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert len(readings) == 400 and len({rd.log for rd in readings}) == 400
    for rd in readings:
        assert rd.log in cases and cases[rd.log].held_out, rd.log
        for r in readers.READERS:
            assert rd.said[r] in categories, (rd.log, r, rd.said[r])
            assert rd.confidence[r] in CONFIDENCES, (rd.log, r)


def _reading(thread: str, a: str, b: str) -> readers.Reading:
    return readers.Reading(
        log=f"{thread}/x-{a}-{b}.log", said={"a": a, "b": b}, confidence={"a": "high", "b": "low"}
    )


def test_scores_count_each_reader_and_the_rules_against_the_thread():
    rs = [
        _reading("killed", "host_oom", "host_oom"),  # the thread knows what the log does not
        _reading("cuda_oom", "cuda_oom", "cuda_oom"),  # readable; the rules miss it
        _reading("crashed", "crashed", "config_error"),  # one reader only: not readable
        _reading("crashed", "crashed", "crashed"),  # readable; the rules read it
    ]
    said = dict(
        zip((rd.log for rd in rs), ["host_oom", "unknown", "crashed", "crashed"], strict=True)
    )
    s = readers.score(rs, said)
    assert s.n == {"killed": 1, "cuda_oom": 1, "crashed": 2}
    assert s.right["reader a"] == {"killed": 0, "cuda_oom": 1, "crashed": 2}
    assert s.right["reader b"] == {"killed": 0, "cuda_oom": 1, "crashed": 1}
    assert s.right["rules"] == {"killed": 0, "cuda_oom": 0, "crashed": 2}
    assert (s.readable, s.rules_on_readable) == (2, 1)


def test_the_eval_prints_the_rules_beside_the_readers(capsys):
    assert readers.main([]) == 0
    out = capsys.readouterr().out
    assert (
        "reader a" in out and "rules" in out and "logs both readers read as the thread did" in out
    )


def test_a_readings_file_naming_logs_outside_the_corpus_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "r.csv"
    bad.write_text(
        "log,blind_name,reader_a,confidence_a,reader_b,confidence_b\n"
        "crashed/not-there.log,000,crashed,high,crashed,high\n"
    )
    assert readers.main(["--readings", str(bad)]) == 2
    assert "crashed/not-there.log" in capsys.readouterr().err
