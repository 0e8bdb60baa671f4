"""The console's two small SVG charts, as geometry the templates draw: pure, no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from api.console.samples import WINDOW_SECONDS, RouteSample

WIDTH, HEIGHT = 600, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 24
"""Plot margins (axis labels go there)."""


@dataclass(frozen=True)
class Frame:
    """The plot area both charts draw their axes in (SVG user units)."""

    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    bottom_y: int = HEIGHT - BOTTOM
    right_x: int = WIDTH - RIGHT


@dataclass(frozen=True)
class Line:
    name: str
    """`running`, `limit` or `live`: also its CSS class and legend entry."""
    points: str
    """SVG polyline points, "x,y x,y ..."."""
    last: int | None
    """The newest value, for the legend (text, not colour alone)."""


@dataclass(frozen=True, kw_only=True)
class LineChart(Frame):
    lines: list[Line]
    y_max: int
    samples: int
    span_seconds: int
    """What the x axis spans, ending now."""


def _nice_max(value: float) -> int:
    """A round axis maximum at or above `value` (at least 1)."""
    if value <= 1:
        return 1
    step = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if value <= m * step:
            return int(m * step)
    return int(10 * step)


MIN_SPAN_SECONDS = 60
"""The x axis spans the samples kept (at least this long, at most `WINDOW_SECONDS`), so a page
opened a moment ago already shows a readable line."""


def route_chart(samples: Sequence[RouteSample], now: float) -> LineChart:
    """Running batch lines, the limit and live requests in flight over the last 15 minutes."""
    peak = max((max(s.running, s.limit, s.live) for s in samples), default=1)
    y_max = _nice_max(peak * 1.1)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    oldest = min((s.at for s in samples), default=now)
    span = min(max(now - oldest, MIN_SPAN_SECONDS), WINDOW_SECONDS)

    def xy(s: RouteSample, value: int) -> str:
        x = LEFT + plot_w * (1 - min(max(now - s.at, 0), span) / span)
        y = TOP + plot_h * (1 - value / y_max)
        return f"{x:.1f},{y:.1f}"

    lines = []
    # The dashed limit last, so it shows on top of a running line at the same height.
    for name in ("running", "live", "limit"):
        values = [(s, getattr(s, name)) for s in samples]
        points = " ".join(xy(s, v) for s, v in values)
        lines.append(Line(name=name, points=points, last=values[-1][1] if values else None))
    return LineChart(lines=lines, y_max=y_max, samples=len(samples), span_seconds=int(span))


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    series: str
    group: str
    value: int


@dataclass(frozen=True, kw_only=True)
class BarChart(Frame):
    bars: list[Bar]
    labels: list[tuple[float, str]]
    """(x centre, text) under each group."""
    y_max: int
    series: list[str]


def bar_chart(groups: Sequence[tuple[str, dict[str, int]]], series: Sequence[str]) -> BarChart:
    """Grouped bars: one group per label (a day), one bar per series (a service class)."""
    peak = max((v for _, values in groups for v in values.values()), default=0)
    y_max = _nice_max(peak)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    group_w = plot_w / max(len(groups), 1)
    bar_w = group_w * 0.8 / max(len(series), 1)
    bars, labels = [], []
    for g, (label, values) in enumerate(groups):
        x0 = LEFT + g * group_w + group_w * 0.1
        labels.append((x0 + group_w * 0.4, label))
        for i, name in enumerate(series):
            value = values.get(name, 0)
            h = plot_h * value / y_max
            bars.append(
                Bar(
                    x=x0 + i * bar_w,
                    y=TOP + plot_h - h,
                    w=bar_w,
                    h=h,
                    series=name,
                    group=label,
                    value=value,
                )
            )
    return BarChart(bars=bars, labels=labels, y_max=y_max, series=list(series))
