"""A job's metric curves as one PNG (the MLflow mirror uploads it as the run's plot, so every
mirrored job has one, whether or not its program draws its own): a panel per metric, a line per
attempt, so a resume shows where it took over. Drawn on matplotlib's object API with the Agg
canvas, never pyplot: the mirror draws in a thread of its own, and pyplot's state is global."""

from __future__ import annotations

import io
from collections.abc import Iterable

MAX_PANELS = 6  # metrics drawn, the spec's own first; the rest stay in MLflow's charts


def curves_png(
    points: Iterable[tuple[int, str, int, float | None]], *, title: str, first: str | None = None
) -> bytes | None:
    """`points` as (attempt number, metric, step, value), in the order recorded; None when there
    is nothing to draw or matplotlib is missing. Non-finite values (stored as None) are gaps."""
    series: dict[str, dict[int, tuple[list[int], list[float]]]] = {}
    for attempt, name, step, value in points:
        steps, values = series.setdefault(name, {}).setdefault(attempt, ([], []))
        steps.append(step)
        values.append(float("nan") if value is None else value)
    if not series:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    names = sorted(series, key=lambda n: (n != first, n))[:MAX_PANELS]
    fig = Figure(figsize=(8, 2.6 * len(names) + 0.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(names), 1, squeeze=False, sharex=True)[:, 0]
    for ax, name in zip(axes, names, strict=True):
        for attempt, (steps, values) in sorted(series[name].items()):
            ax.plot(steps, values, label=f"attempt {attempt}", linewidth=1.2)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if len(series[name]) > 1:
            ax.legend()
    axes[-1].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()
