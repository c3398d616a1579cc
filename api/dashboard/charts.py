"""Charts drawn on the server as inline SVG, so a page needs no script and
fetches nothing: the functions below place rectangles, lines and labels,
and `svg` writes them out, escaping every label (job names are a team's
own text)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from markupsafe import Markup, escape

from spotbroker.broker.money.dashboard import BudgetView, JobLine

WIDTH = 1000
LEFT, RIGHT, TOP, BOTTOM = 84, 16, 12, 28
# Distinguishable for common colour blindness (Okabe-Ito), then greys.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999", "#666666")


@dataclass
class Chart:
    height: int
    rects: list[dict] = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)
    texts: list[dict] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    width: int = WIDTH


def svg(chart: Chart, label: str, dom_id: str) -> Markup:
    """The chart as a figure of inline SVG, with its legend; every text is
    escaped (classes, colours and numbers are this module's own). Written
    here rather than in a template: a 90-day page has ~800 shapes, and a
    template's per-value lookups, filters and escapes cost several times
    these f-strings (docs/benchmarks.md, Money)."""
    out = [f'<figure class="chart" id="{escape(dom_id)}">\n<svg viewBox="0 0 {chart.width} {chart.height}" '
           f'role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">\n']
    out += [f'<line class="{ln["cls"]}" x1="{ln["x1"]:.1f}" y1="{ln["y1"]:.1f}" x2="{ln["x2"]:.1f}" '
            f'y2="{ln["y2"]:.1f}"/>\n' for ln in chart.lines]
    for r in chart.rects:
        day = f' data-day="{escape(r["day"])}"' if r.get("day") else ""
        out.append(f'<rect x="{r["x"]:.1f}" y="{r["y"]:.1f}" width="{r["w"]:.1f}" height="{r["h"]:.1f}" '
                   f'fill="{r["fill"]}"{day} data-key="{escape(r["key"])}" data-amount="{r["amount"]}">'
                   f'<title>{escape(r["title"])}</title></rect>\n')
    out += [f'<text class="{t["cls"]}" x="{t["x"]:.1f}" y="{t["y"]:.1f}" text-anchor="{t["anchor"]}">'
            f'{escape(t["text"])}</text>\n' for t in chart.texts]
    out.append("</svg>\n")
    if chart.legend:
        out.append('<figcaption class="legend">')
        out += [f'<span><svg class="swatch" viewBox="0 0 10 10" aria-hidden="true"><rect width="10" height="10" '
                f'fill="{color}"/></svg>{escape(name)}</span>' for name, color in chart.legend]
        out.append("</figcaption>\n")
    out.append("</figure>\n")
    return Markup("".join(out))


def money(x: float) -> str:
    """Cents, or four decimals under a dollar (a short spot job's $0.0007 read $0.00, as if free)."""
    return f"${x:,.2f}" if abs(x) >= 1 or x == 0 else f"${x:.4f}"


def _figure(x: float) -> str:
    return "0" if x == 0 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.3f}"


def kwh(x: float) -> str:
    return f"{_figure(x)} kWh"


def kg(x: float) -> str:
    return f"{_figure(x)} kg"


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    step = 10 ** len(str(int(v))) / 10 if v >= 1 else 0.1
    for m in (1, 2, 2.5, 5, 10):
        if v <= step * m * 1.0001:
            return step * m
    return step * 10


def _axis(chart: Chart, top_value: float, plot_h: float, unit: Callable[[float], str] = money) -> None:
    for i in range(5):
        value = top_value * i / 4
        y = TOP + plot_h - plot_h * i / 4
        chart.lines.append(dict(x1=LEFT, y1=y, x2=WIDTH - RIGHT, y2=y, cls="grid"))
        label = f"${value:,.0f}" if unit is money and top_value >= 100 else unit(value)
        chart.texts.append(dict(x=LEFT - 6, y=y + 4, text=label, cls="tick", anchor="end"))


def colors(keys) -> dict[str, str]:
    return {k: PALETTE[min(i, len(PALETTE) - 1)] for i, k in enumerate(keys)}


def stacked_days(days: list[str], series: dict[str, dict[str, float]], height: int = 240,
                 muted: tuple[str, ...] = (), unit: Callable[[float], str] = money) -> Chart:
    """A bar per day, stacked by key (cloud, GPU, a label's value), biggest
    keys at the bottom; `muted` keys (a label's "(none)") in grey; `unit`
    writes a value (dollars, kWh, kg CO2e)."""
    chart = Chart(height)
    totals: dict[str, float] = {}
    for parts in series.values():
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v
    keys = [k for k, _ in sorted(totals.items(), key=lambda kv: -kv[1])]
    palette = {**colors([k for k in keys if k not in muted]), **{k: "#BBBBBB" for k in muted}}
    chart.legend = [(k, palette[k]) for k in keys]
    plot_h = height - TOP - BOTTOM
    top = _nice_max(max([sum(series.get(d, {}).values()) for d in days] or [0]))
    _axis(chart, top, plot_h, unit)
    slot = (WIDTH - LEFT - RIGHT) / max(len(days), 1)
    for i, day in enumerate(days):
        x, y = LEFT + i * slot, TOP + plot_h
        for k in keys:
            v = series.get(day, {}).get(k, 0.0)
            if v <= 0:
                continue
            h = plot_h * v / top
            y -= h
            chart.rects.append(dict(x=x + slot * 0.12, y=y, w=slot * 0.76, h=h, fill=palette[k], day=day, key=k,
                                    amount=round(v, 6), title=f"{day} · {k}: {unit(v)}"))
        if len(days) <= 14 or i % max(len(days) // 10, 1) == 0:
            chart.texts.append(dict(x=x + slot / 2, y=height - 8, text=day[5:], cls="tick", anchor="middle"))
    return chart


def _x(t: datetime, start: datetime, end: datetime) -> float:
    span = (end - start).total_seconds() or 1.0
    return LEFT + (WIDTH - LEFT - RIGHT) * min(max((t - start).total_seconds() / span, 0.0), 1.0)


def burn(b: BudgetView, now: datetime, height: int = 240) -> Chart:
    """Spend so far in the budget's period against the budget line, the
    even-rate line, and the forecast to the period's end."""
    chart = Chart(height)
    plot_h = height - TOP - BOTTOM
    top = _nice_max(max(b.amount, b.forecast, b.spent) * 1.05)

    def y(v: float) -> float:
        return TOP + plot_h - plot_h * min(v, top) / top

    _axis(chart, top, plot_h)
    x0, x1 = _x(b.start, b.start, b.end), _x(b.end, b.start, b.end)
    chart.lines.append(dict(x1=x0, y1=y(b.amount), x2=x1, y2=y(b.amount), cls="budget"))
    chart.texts.append(dict(x=x1 - 4, y=y(b.amount) - 6, text=f"budget {money(b.amount)}", cls="label",
                            anchor="end"))
    chart.lines.append(dict(x1=x0, y1=y(0), x2=x1, y2=y(b.amount), cls="even"))
    points = [(_x(t, b.start, b.end), y(v)) for t, v in b.cumulative]
    for (ax, ay), (bx, by) in zip(points, points[1:]):
        chart.lines.append(dict(x1=ax, y1=ay, x2=bx, y2=by, cls="spent"))
    xn = _x(now, b.start, b.end)
    chart.lines.append(dict(x1=xn, y1=y(b.spent), x2=x1, y2=y(b.forecast), cls="forecast"))
    chart.texts.append(dict(x=x1 - 4, y=y(b.forecast) + 16, text=f"forecast {money(b.forecast)}", cls="label",
                            anchor="end"))
    chart.texts.append(dict(x=LEFT + 4, y=height - 8, text=f"{b.start:%Y-%m-%d}", cls="tick", anchor="start"))
    chart.texts.append(dict(x=x1, y=height - 8, text=f"{b.end:%Y-%m-%d}", cls="tick", anchor="end"))
    chart.legend = [("spent", "#0072B2"), ("even rate", "#999999"), ("budget", "#D55E00"),
                    ("forecast (the running jobs' rate)", "#E69F00")]
    return chart


def bars(rows: list[tuple[str, float, str]], height_per_row: int = 26, width: int = 560) -> Chart:
    """Horizontal bars: (label, value, colour), labels at the left."""
    left = 200
    chart = Chart(height=max(len(rows), 1) * height_per_row + 8, width=width)
    top = _nice_max(max([v for _, v, _ in rows] or [0]))
    for i, (label, value, fill) in enumerate(rows):
        y = 4 + i * height_per_row
        w = (width - left - 90) * max(value, 0) / top
        short = label if len(label) <= 26 else label[:25] + "…"
        chart.texts.append(dict(x=left - 8, y=y + 16, text=short, cls="label", anchor="end"))
        chart.rects.append(dict(x=left, y=y + 3, w=w, h=height_per_row - 8, fill=fill, title=f"{label}: {money(value)}",
                                key=label, amount=round(value, 6)))
        chart.texts.append(dict(x=left + w + 6, y=y + 16, text=money(value), cls="value", anchor="start"))
    return chart


def timeline(jobs: list[JobLine], since: datetime, now: datetime, row: int = 34) -> Chart:
    """Each job a row, each attempt a bar over its running time (coloured by
    cloud, its price on it where it fits), a reclaim marked by a red cross."""
    left = 270
    chart = Chart(height=max(len(jobs), 1) * row + BOTTOM + 4)
    start = min((a.start for j in jobs for a in j.attempts), default=since)
    palette = colors(sorted({a.cloud for j in jobs for a in j.attempts}))
    chart.legend = [(k, c) for k, c in palette.items()] + [("reclaimed (preempted)", "#D55E00")]

    def x(t: datetime) -> float:
        span = (now - start).total_seconds() or 1.0
        return left + (WIDTH - left - RIGHT) * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    for i, job in enumerate(jobs):
        y = 4 + i * row
        name = job.name if len(job.name) <= 22 else job.name[:21] + "…"  # (names are not unique: the id first)
        chart.texts.append(dict(x=left - 8, y=y + 18, text=f"{job.id} {name} ({money(job.cost)})", cls="label",
                                anchor="end"))
        chart.lines.append(dict(x1=left, y1=y + row - 2, x2=WIDTH - RIGHT, y2=y + row - 2, cls="grid"))
        for a in job.attempts:
            ax, bx = x(a.start), max(x(a.end), x(a.start) + 2)
            end = "running" if a.running else (a.end_reason or "ended")
            title = (f"attempt {a.id} · {a.cloud} {a.where} · {a.gpu} · {'spot' if a.spot else 'on-demand'} "
                     f"{money(a.price)}/h × {a.nodes} · {money(a.cost)} · {a.start:%m-%d %H:%M}–"
                     f"{a.end:%m-%d %H:%M} UTC · {end}")
            chart.rects.append(dict(x=ax, y=y + 6, w=bx - ax, h=row - 14, fill=palette[a.cloud], title=title,
                                    key=str(a.id), amount=round(a.cost, 6)))
            if bx - ax > 70:
                chart.texts.append(dict(x=ax + 4, y=y + 22, text=f"{money(a.price)}/h", cls="onbar", anchor="start"))
            if a.reclaimed:
                chart.lines.append(dict(x1=bx - 5, y1=y + 4, x2=bx + 5, y2=y + row - 6, cls="reclaim"))
                chart.lines.append(dict(x1=bx + 5, y1=y + 4, x2=bx - 5, y2=y + row - 6, cls="reclaim"))
    chart.texts.append(dict(x=left, y=chart.height - 6, text=f"{start:%Y-%m-%d %H:%M}", cls="tick", anchor="start"))
    chart.texts.append(dict(x=WIDTH - RIGHT, y=chart.height - 6, text=f"now {now:%Y-%m-%d %H:%M} UTC", cls="tick",
                            anchor="end"))
    return chart


def sparkline(days: list[str], values: list[float], width: int = 240, height: int = 40) -> Chart:
    """A team's spend per day as small bars, no axis: the trend at a glance
    (each bar's title says its day and amount)."""
    chart = Chart(height, width=width)
    top = max(values, default=0.0) or 1.0
    slot = width / max(len(days), 1)
    chart.lines.append(dict(x1=0, y1=height - 0.5, x2=width, y2=height - 0.5, cls="grid"))
    for i, (day, v) in enumerate(zip(days, values, strict=True)):
        h = (height - 4) * v / top
        chart.rects.append(dict(x=i * slot + slot * 0.1, y=height - 1 - h, w=slot * 0.8, h=h, fill=PALETTE[0],
                                day=day, key=day, amount=round(v, 6), title=f"{day}: {money(v)}"))
    return chart


def meter(spent: float, amount: float, width: int = 240, height: int = 22) -> Chart:
    """Spent against a budget: the budget's bar, filled to what is spent
    (orange past 80 %, red past it all)."""
    chart = Chart(height, width=width)
    share = spent / amount if amount > 0 else 0.0
    fill = "#D55E00" if share >= 1 else "#E69F00" if share >= 0.8 else "#009E73"
    chart.rects.append(dict(x=0, y=3, w=width, h=height - 6, fill="#dde1e8", key="budget", amount=round(amount, 6),
                            title=f"budget {money(amount)}"))
    chart.rects.append(dict(x=0, y=3, w=width * min(share, 1.0), h=height - 6, fill=fill, key="spent",
                            amount=round(spent, 6), title=f"spent {money(spent)} ({share:.0%})"))
    return chart
