"""Fit the log model diagnose_failure consults when no signature decides, on the tuning split only.

`nightshift eval diagnosis-model [--cv] [--write] [--folds K]`

The model (runtime/training/log_classifier.py) is TF-IDF word weights and a linear SVM
(scikit-learn's TfidfVectorizer and LinearSVC, sublinear term frequency, C=1) over the words of a
log as pasted_log reads it. Its vocabulary is the words that appear in the logs of at least
MIN_REPOSITORIES repositories, so a word only one project prints (its own module names, its
paths) is never learned.

It is fitted on the corpus's tuning split (evals/diagnosis.py): the held-out repositories' logs
are never read here. `--write` writes runtime/training/diagnosis_model.json with the list of the
logs it was fitted on and a digest of their text (tests/test_log_classifier.py checks that list
against the tuning split as it stands, and that no held-out log is in it).

`--cv` estimates how the model, and the rules with it, do on repositories they have not seen,
without the held-out split: the tuning split's repositories are cut into K folds (by a hash of
owner/name); each fold is diagnosed by a model fitted on the other folds. The rules themselves
were written while reading every tuning log, so their part of the figure is optimistic; the
model's alone is not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nightshift.evals.diagnosis import Case, diagnose_case, load_corpus, select
from nightshift.runtime.training import log_classifier, pasted_log

TOKEN_PATTERN = r"[a-z][a-z0-9_]{2,30}"  # applied to the lower-cased text
MIN_REPOSITORIES = 2
C = 1.0
FOLDS = 5


def log_lines(case: Case) -> list[str]:
    """The lines the model reads, as diagnose_failure hands them over: the file split at
    newlines, each read by pasted_log, informational ones blank."""
    from nightshift.skills.diagnose_failure import model_lines

    raw = pasted_log.split_lines(case.path.read_bytes().decode("utf-8", errors="replace"))
    return model_lines(raw, [pasted_log.primary(line) for line in raw])


def document(lines: Sequence[str]) -> str:
    return "\n".join(log_classifier.text_of(lines))


def vocabulary(cases: Sequence[Case], docs: dict[str, str]) -> list[str]:
    """The words of at least MIN_REPOSITORIES repositories' logs, sorted."""
    token = re.compile(TOKEN_PATTERN)
    seen: dict[str, set[str]] = defaultdict(set)
    for case in cases:
        for word in set(token.findall(docs[case.slug].lower())):
            seen[word].add(case.repository)
    return sorted(w for w, repos in seen.items() if len(repos) >= MIN_REPOSITORIES)


def digest(cases: Sequence[Case]) -> str:
    """A digest of the fitted-on logs: their slugs and bytes, in slug order."""
    h = hashlib.sha256()
    for case in sorted(cases, key=lambda c: c.slug):
        h.update(case.slug.encode() + b"\0" + hashlib.sha256(case.path.read_bytes()).digest())
    return h.hexdigest()


def estimators(cases: Sequence[Case], docs: dict[str, str]) -> tuple[Any, Any]:
    """scikit-learn's TfidfVectorizer and LinearSVC, fitted on these logs."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    vectorizer = TfidfVectorizer(
        token_pattern=TOKEN_PATTERN,
        lowercase=True,
        sublinear_tf=True,
        vocabulary=vocabulary(cases, docs),
    )
    x = vectorizer.fit_transform([docs[c.slug] for c in cases])
    return vectorizer, LinearSVC(C=C, random_state=0).fit(x, [c.category for c in cases])


def fit(cases: Sequence[Case], docs: dict[str, str]) -> dict[str, Any]:
    """The model fitted on these logs, as the JSON log_classifier reads."""
    import sklearn

    vectorizer, svm = estimators(cases, docs)
    return {
        "token_pattern": TOKEN_PATTERN,
        "terms": [str(t) for t in vectorizer.get_feature_names_out()],
        "idf": [round(float(v), 6) for v in vectorizer.idf_],
        "categories": [str(c) for c in svm.classes_],
        "weights": [[round(float(v), 6) for v in row] for row in svm.coef_],
        "intercepts": [round(float(v), 6) for v in svm.intercept_],
        "trained_on": {
            "logs": len(cases),
            "repositories": len({c.repository for c in cases}),
            "digest": digest(cases),
            "files": sorted(c.slug for c in cases),
            "fitted_with": f"scikit-learn {sklearn.__version__} LinearSVC(C={C}) on TF-IDF "
            f"(sublinear tf) of words in >= {MIN_REPOSITORIES} repositories' logs",
        },
    }


def fold_of(repository: str, k: int) -> int:
    return int(hashlib.sha256(repository.encode()).hexdigest(), 16) % k


def cross_validate(cases: Sequence[Case], docs: dict[str, str], k: int) -> dict[str, Any]:
    """Each fold's repositories diagnosed with a model fitted on the other folds: rows for the
    model alone, the rules alone and the rules with the model (as diagnose_failure combines
    them)."""
    from nightshift.skills import diagnose_failure as skill

    rows: dict[str, list[dict[str, Any]]] = {"rules": [], "rules + model": [], "model alone": []}
    loader = skill.LOG_MODEL_LOADER
    try:
        skill.LOG_MODEL_LOADER = lambda: None
        rows["rules"] = [diagnose_case(c) for c in cases]
        for fold in range(k):
            train = [c for c in cases if fold_of(c.repository, k) != fold]
            test = [c for c in cases if fold_of(c.repository, k) == fold]
            model = log_classifier.LogModel.from_dict(fit(train, docs))
            skill.LOG_MODEL_LOADER = lambda model=model: model  # type: ignore[misc]
            rows["rules + model"] += [diagnose_case(c) for c in test]
            for c in test:
                reading = log_classifier.read(log_lines(c), model)
                got = reading.category if reading is not None else "unknown"
                rows["model alone"].append({"category": c.category, "got": got})
    finally:
        skill.LOG_MODEL_LOADER = loader
    return rows


def summary(rows: list[dict[str, Any]]) -> tuple[int, int, dict[str, float]]:
    n = Counter(r["category"] for r in rows)
    right = Counter(r["category"] for r in rows if r["got"] == r["category"])
    return sum(right.values()), len(rows), {c: right[c] / n[c] for c in sorted(n)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nightshift eval diagnosis-model", description=__doc__)
    p.add_argument("--cv", action="store_true", help="repository-grouped cross-validation")
    p.add_argument("--folds", type=int, default=FOLDS)
    p.add_argument("--write", action="store_true", help=f"write {log_classifier.MODEL_FILE}")
    p.add_argument("--out", type=Path, default=log_classifier.MODEL_FILE)
    args = p.parse_args(argv)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("error: fitting needs scikit-learn: pip install -e '.[test]'")
        return 2
    cases = select(load_corpus(), "tuning")
    docs = {c.slug: document(log_lines(c)) for c in cases}
    repos = len({c.repository for c in cases})
    print(f"tuning split: {len(cases)} logs from {repos} repositories (held-out never read)")
    if args.cv:
        rows = cross_validate(cases, docs, args.folds)
        cats = sorted({r["category"] for r in rows["rules"]})
        print(f"\n{args.folds}-fold cross-validation by repository")
        print(f"{'':14}{'right':>12}  " + " ".join(f"{c[:7]:>7}" for c in cats))
        for name, rs in rows.items():
            right, total, recall = summary(rs)
            line = " ".join(f"{recall.get(c, 0):7.2f}" for c in cats)
            print(f"{name:14}{right:>5}/{total} {right / total:5.1%}  {line}")
    if args.write:
        model = fit(cases, docs)
        args.out.write_text(json.dumps(model, separators=(",", ":")) + "\n")
        size = args.out.stat().st_size
        print(f"wrote {args.out} ({size // 1024} KiB, {len(model['terms'])} words)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
