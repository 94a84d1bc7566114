"""The live divergence rule: what stops a run while it runs."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.training.divergence import first_divergence


def series(values, name="loss", start=1):
    return [(start + i, name, v) for i, v in enumerate(values)]


def test_a_non_finite_loss_diverges_at_its_step():
    """nan, inf and -inf each stop the run at the first such point."""
    for bad in (math.nan, math.inf, -math.inf):
        got = first_divergence(MetricSpec(), series([2.0, 1.5, bad, 1.0]))
        assert got is not None and got.step == 3 and got.name == "loss"


def test_a_non_finite_grad_norm_diverges_but_other_metrics_do_not():
    """`divergence.also` names the other metrics that count (grad_norm by default)."""
    pts = [
        (1, "loss", 2.0),
        (1, "lr_scale", math.inf),
        (2, "grad_norm", math.nan),
        (2, "loss", 1.9),
    ]
    got = first_divergence(MetricSpec(), pts)
    assert got is not None and (got.step, got.name) == (2, "grad_norm")
    assert first_divergence(MetricSpec(divergence={"also": []}), pts) is None


def test_an_explosion_over_the_window_diverges_at_its_first_bad_point():
    """The smoothed loss above k x its running minimum; the onset is the first point above."""
    values = [1.0] * 30 + [50.0] * 5
    got = first_divergence(MetricSpec(divergence={"window": 5, "k": 4.0}), series(values))
    assert got is not None and got.step == 31


def test_a_noisy_but_healthy_curve_does_not_diverge():
    """Noise below k x the minimum, and a metric that is maximised, never trigger the rule."""
    values = [3.0 / (1 + 0.01 * i) * (1.5 if i % 7 == 0 else 1.0) for i in range(500)]
    assert first_divergence(MetricSpec(), series(values)) is None
    assert (
        first_divergence(
            MetricSpec(name="acc", mode="max"), series([0.1, 0.9, 5.0, 40.0], name="acc")
        )
        is None
    )


def test_disabled_means_never():
    assert first_divergence(MetricSpec(divergence={"enabled": False}), series([math.nan])) is None


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=60))
def test_any_series_gives_a_verdict_without_raising(values):
    """Whatever a program logs, the rule answers; a non-finite value always diverges, there or
    at an explosion before it."""
    got = first_divergence(MetricSpec(), series(values))
    bad = next((i + 1 for i, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        assert got is not None and got.step <= bad


def test_an_explosion_before_a_nan_is_the_onset():
    """A loss that explodes and then goes nan diverged where it exploded, not where it broke."""
    values = [1.0] * 10 + [100.0] * 3 + [math.nan]
    got = first_divergence(MetricSpec(divergence={"window": 3}), series(values))
    assert got is not None and got.step == 11


def test_the_first_noisy_batches_of_a_resumed_attempt_are_no_baseline():
    """A resumed attempt whose first batch happens to be very low is not judged against it: the
    running minimum counts only full windows (seen in a preempted run resumed at step 150)."""
    values = [0.026, 0.09, 0.116, 0.29, 0.12, 0.1, 0.11, 0.09]
    assert first_divergence(MetricSpec(divergence={"window": 3}), series(values, start=150)) is None
    assert (
        first_divergence(
            MetricSpec(divergence={"window": 3}), series(values + [9.0] * 3, start=150)
        )
        is not None
    )


@given(
    st.lists(
        st.floats(min_value=0.001, max_value=1e6, allow_nan=False) | st.just(math.nan), max_size=80
    ),
    st.lists(st.integers(min_value=1, max_value=15), max_size=20),
)
def test_reading_a_few_points_a_tick_gives_the_same_verdict_as_all_at_once(values, cuts):
    """The loop feeds the rule a tick's points at a time, its state round-tripped through JSON
    (the store) between ticks: the verdict is the one over the whole series."""
    import json

    from nightshift.runtime.training.divergence import scan

    spec = MetricSpec(divergence={"window": 4})
    points = series(values)
    whole = first_divergence(spec, points)
    state, got, i = None, None, 0
    for n in [*cuts, len(points)]:
        got, state = scan(spec, points[i : i + n], state)
        state = json.loads(json.dumps(state))
        i += n
        if got is not None or i >= len(points):
            break
    assert got == whole
