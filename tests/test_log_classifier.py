"""The log model diagnose_failure consults when no signature decides (runtime/training/
log_classifier.py): scored in plain Python exactly as scikit-learn scores it, fitted on the tuning
split only, and used by the skill only as a labelled, low-confidence reading that the machine's
evidence and a clean log's silence still outrank."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from nightshift.evals import diagnosis_model as dm
from nightshift.evals.diagnosis import load_corpus, select
from nightshift.runtime.training import log_classifier
from nightshift.runtime.training.machine_evidence import CgroupMemory, MachineEvidence
from nightshift.skills import diagnose_failure as skill
from nightshift.skills.base import SkillContext

CORPUS = Path(__file__).parent / "fixtures" / "logs" / "corpus"


@pytest.fixture(scope="module")
def tuning():
    return select(load_corpus(), "tuning")


def run(**kw):
    ctx = SkillContext(store=None, settings=None, now=datetime(2026, 12, 5))  # type: ignore[arg-type]
    return skill.diagnose_failure.fn(ctx, skill.diagnose_failure.parse(kw))


def test_plain_python_scores_are_scikit_learns(tuning):
    """The shipped scorer (no scikit-learn at run time) gives scikit-learn's own decision values,
    fitted here on a third of the tuning logs, for logs it was and was not fitted on."""
    pytest.importorskip("sklearn")
    part = tuning[::3]
    docs = {c.slug: dm.document(dm.log_lines(c)) for c in tuning}
    vectorizer, svm = dm.estimators(part, docs)
    model = log_classifier.LogModel.from_dict(dm.fit(part, docs))
    probe = tuning[1::25]
    expected = svm.decision_function(vectorizer.transform([docs[c.slug] for c in probe]))
    for case, row in zip(probe, expected, strict=True):
        got = log_classifier.scores(model, log_classifier.features(model, dm.log_lines(case)))
        for k, category in enumerate(svm.classes_):
            assert got[category] == pytest.approx(row[k], abs=1e-4), (case.slug, category)


def test_the_shipped_model_was_fitted_on_the_tuning_split_as_it_stands(tuning):
    """Its list of logs is the tuning split's, byte for byte (a changed corpus needs
    `nightshift eval diagnosis-model --write`), and not one held-out log is in it."""
    model = log_classifier.load()
    assert model is not None
    trained = model.trained_on
    held = {c.slug for c in select(load_corpus(), "held-out")}
    assert held and held.isdisjoint(trained["files"])
    assert trained["files"] == sorted(c.slug for c in tuning), (
        "the corpus changed: refit with `nightshift eval diagnosis-model --write`"
    )
    assert trained["digest"] == dm.digest(tuning)
    assert set(model.categories) <= set(skill.Category.__args__)  # type: ignore[attr-defined]


def test_a_learned_reading_is_labelled_low_and_quotes_real_lines():
    """An exception the signatures do not know (pickle's EOFError on an empty checkpoint file:
    a tuning log) is read by its words: low confidence, said to be the model's, with the lines
    that weigh most — lines that are in the log, at their own numbers."""
    path = CORPUS / "checkpoint_corrupt" / "deepvoice3-synthesis-empty-checkpoint-eoferror-67.log"
    loader = skill.LOG_MODEL_LOADER
    try:
        skill.LOG_MODEL_LOADER = lambda: None
        alone = run(log_path=str(path))
    finally:
        skill.LOG_MODEL_LOADER = loader
    r = run(log_path=str(path))
    assert alone.category == "crashed" and alone.confidence == "low"
    assert r.category == "checkpoint_corrupt" and r.confidence == "low"
    assert "by its words the log reads most like checkpoint_corrupt" in r.reasoning
    assert "the signatures alone: no exit status was given" in r.reasoning
    lines = path.read_text().splitlines()
    assert r.evidence
    for e in r.evidence:
        assert lines[e.line_no - 1].strip().startswith(e.text[:40])


def test_signatures_and_the_machine_outrank_the_model():
    """A signature's verdict is never replaced; the machine's word (a cgroup OOM kill) outranks a
    reading of the words; a short log is not read at all (too few known words)."""
    oom = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB\n"
    assert run(log_tail=oom, exit_code=1).category == "cuda_oom"
    path = CORPUS / "checkpoint_corrupt" / "deepvoice3-synthesis-empty-checkpoint-eoferror-67.log"
    machine = MachineEvidence(cgroup=CgroupMemory(version=2, oom_kills=1))
    r = run(log_path=str(path), exit_code=-9, machine=machine)
    assert r.category == "host_oom" and r.confidence == "high"
    short = run(log_tail="step 10 loss 1.2\nstep 20 loss 1.1\n", exit_code=3)
    assert short.category == "unknown"


def test_without_a_model_file_the_signatures_decide_alone(tmp_path):
    """A model file that is not there (a trimmed install) is no model, not an error."""
    assert log_classifier.load(tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    ("tail", "exit_code", "category"),
    [
        # Interrupted while a DataLoader waited on its queue (pytorch/pytorch#1355's shape)
        (
            "Traceback (most recent call last):\n"
            '  File "train.py", line 80, in <module>\n'
            "    for batch in loader:\n"
            '  File "/usr/lib/python3.10/multiprocessing/queues.py", line 113, in get\n'
            "    if not self._poll(timeout):\n"
            '  File "/usr/lib/python3.10/multiprocessing/connection.py", line 424, in _poll\n'
            "    r = wait([self], timeout)\n"
            '  File "/usr/lib/python3.10/multiprocessing/connection.py", line 931, in wait\n'
            "    ready = selector.select(timeout)\n"
            "KeyboardInterrupt\n",
            None,
            "hang_or_timeout",
        ),
        # A pasted log that ends on a bar short of its total, with no exit status, reads as a
        # hang at low confidence (what reports of that shape most often turn out to be) ...
        (
            "Epoch 1/30\n 999/1000 [============================>.] - ETA: 1s - loss: 0.2676\n",
            None,
            "hang_or_timeout",
        ),
        # ... but not once the run is known to have exited
        (
            "Epoch 1/30\n 999/1000 [============================>.] - ETA: 1s - loss: 0.2676\n",
            1,
            None,
        ),
        # An interrupt that did not come while waiting is no hang either
        (
            "Traceback (most recent call last):\n"
            '  File "train.py", line 80, in <module>\n'
            "    loss = model(x).sum()\n"
            "KeyboardInterrupt\n",
            None,
            None,
        ),
    ],
)
def test_a_stuck_run_is_a_hang(tail, exit_code, category):
    r = run(log_tail=tail, exit_code=exit_code)
    if category is None:
        assert r.category != "hang_or_timeout"
    else:
        assert r.category == category, r.reasoning
