"""A metric's curve as inline SVG (the charts of `charts.py`): its points by
step as line segments, the best step and the step the run stopped at marked."""
from __future__ import annotations

from spotbroker.api.dashboard.charts import BOTTOM, LEFT, RIGHT, TOP, WIDTH, Chart


def _tick(value: float) -> str:
    return f"{value:.4g}"


def curve(points: list[tuple[int, float]], best_step: int | None = None, stopped_step: int | None = None,
          height: int = 220) -> Chart:
    """(step, value) points in step order, one line; a vertical mark at `best_step` and at `stopped_step`."""
    chart = Chart(height)
    plot_h = height - TOP - BOTTOM
    steps, values = [s for s, _ in points], [v for _, v in points]
    # Drawn in units of the largest magnitude, so that a flat line at 1e17 or
    # a span near the float's limits still has a height to divide by.
    scale = max(abs(min(values)), abs(max(values)), 1.0)
    low, high = min(values) / scale, max(values) / scale
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    first, last = steps[0], max(steps[-1], steps[0] + 1)

    def x(step: int) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (step - first) / (last - first)

    def y(value: float) -> float:
        return TOP + plot_h - plot_h * (value / scale - low) / (high - low)

    for i in range(5):
        value = (low + (high - low) * i / 4) * scale
        chart.lines.append(dict(x1=LEFT, y1=y(value), x2=WIDTH - RIGHT, y2=y(value), cls="grid"))
        chart.texts.append(dict(x=LEFT - 6, y=y(value) + 4, text=_tick(value), cls="tick", anchor="end"))
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        chart.lines.append(dict(x1=x(s0), y1=y(v0), x2=x(s1), y2=y(v1), cls="metric"))
    for step, cls, label in ((best_step, "best", "best"), (stopped_step, "stopped", "stopped")):
        if step is not None and first <= step <= last:
            chart.lines.append(dict(x1=x(step), y1=TOP, x2=x(step), y2=TOP + plot_h, cls=cls))
            chart.texts.append(dict(x=x(step) + 4, y=TOP + 12, text=f"{label} {step}", cls="label", anchor="start"))
    chart.texts.append(dict(x=LEFT, y=height - 8, text=f"step {first}", cls="tick", anchor="start"))
    chart.texts.append(dict(x=WIDTH - RIGHT, y=height - 8, text=f"step {steps[-1]}", cls="tick", anchor="end"))
    legend = [("the reported value", "#0072B2")]
    if best_step is not None:
        legend.append(("best step (its checkpoint is kept)", "#009E73"))
    if stopped_step is not None:
        legend.append(("stopped early", "#D55E00"))
    chart.legend = legend
    return chart
