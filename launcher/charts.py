"""Line charts as SVG drawn on the server (`trainctl web`): no JavaScript library, no CDN.

GPU boxes are often offline, so the page may load nothing from elsewhere; and a chart of
a week is a few thousand points, which an SVG polyline draws at once. Each series is cut
to at most two points per pixel column (the lowest and the highest), so a spike one
sample wide still shows however long the run.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence

from trainctl.supervisor.records import field, record

PALETTE = ("#2f6fdf", "#d9480f", "#2b8a3e", "#7048e8", "#c2255c", "#0b7285", "#e67700", "#495057")
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 12, 22, 26


def plain(v: float) -> str:
    """A plain, rounded number for an axis or a hover: 12,500 or 1.25M, 0.031, never
    1.2e+04."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 1 or a == 0:
        return f"{v:.3g}"
    return f"{v:.4f}".rstrip("0").rstrip(".") if a >= 1e-4 else f"{v:.1e}"


@record(frozen=True)
class Series:
    """One line: its name and its (x, value) points in x's order (x: a time, or a step)."""

    label: str
    points: Sequence[tuple[float, float]]


@record(frozen=True)
class Marker:
    """A moment drawn as a vertical line with a tooltip (a checkpoint, a restart)."""

    t: float
    label: str
    kind: str = "mark"  # a CSS class: checkpoint | restart | deploy


@record(frozen=True)
class Chart:
    """What one chart shows."""

    title: str
    series: list[Series]
    fmt: Callable[[float], str] = plain
    markers: list[Marker] = field(default_factory=list)
    y_max: float | None = None  # a cap to draw against (memory_max): a dashed line
    from_zero: bool = True  # False: the axis spans the values (a loss curve)
    reach: float | None = None  # the axis goes at least this high (100 for a percentage)
    x: str = "time"  # what the x of each point is: "time" (epoch seconds) or "step"
    log_y: bool = False  # a log scale (a loss), when every value is above zero

    def x_label(self, v: float, span: float) -> str:
        """An x value as an axis or a hover says it: a time, or a step."""
        return when(v, span) if self.x == "time" else f"step {plain(v)}"

    def logged(self) -> bool:
        """Whether the y axis is drawn on a log scale: asked for, and possible."""
        return self.log_y and all(p[1] > 0 for s in self.series for p in s.points)


HOVER_POINTS = 120  # per series: each a <title> with its time and value


def thin(
    points: Sequence[tuple[float, float]], t0: float, t1: float, columns: int
) -> list[tuple[float, float]]:
    """At most the lowest and the highest point of each of ``columns`` time buckets, in order."""
    if len(points) <= 2 * columns or t1 <= t0:
        return list(points)
    buckets: dict[int, list[tuple[float, float]]] = {}
    for p in points:
        i = min(columns - 1, int((p[0] - t0) / (t1 - t0) * columns))
        b = buckets.get(i)
        if b is None:
            buckets[i] = [p, p]
        else:
            if p[1] < b[0][1]:
                b[0] = p
            if p[1] > b[1][1]:
                b[1] = p
    out: list[tuple[float, float]] = []
    for i in sorted(buckets):
        lo, hi = buckets[i]
        out += [lo] if lo is hi else sorted((lo, hi))
    return out


def _span(values: list[float], from_zero: bool, cap: float | None) -> tuple[float, float]:
    lo = 0.0 if from_zero else min(values, default=0.0)
    hi = max([*values, *([cap] if cap is not None else [])], default=1.0)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    return lo, hi


def when(t: float, span_s: float) -> str:
    """A time-axis label: the clock for a short span, the day and hour for a long one."""
    fmt = "%H:%M:%S" if span_s < 600 else "%H:%M" if span_s < 86400 else "%b %d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def render(chart: Chart, width: int = 720, height: int = 180) -> str:
    """The chart as an SVG element (no points: a note saying so)."""
    plot_w, plot_h = width - PAD_LEFT - PAD_RIGHT, height - PAD_TOP - PAD_BOTTOM
    pts = [p for s in chart.series for p in s.points]
    title = html.escape(chart.title)
    head = f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">'
    head += f'<text class="title" x="{PAD_LEFT}" y="14">{title}</text>'
    if not pts:
        return (
            head
            + f'<text class="empty" x="{PAD_LEFT}" y="{height // 2}">no samples yet</text></svg>'
        )
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    if t1 <= t0:
        t1 = t0 + 1
    tops = [v for v in (chart.y_max, chart.reach) if v is not None]
    scale = math.log10 if chart.logged() else float  # a loss falls by decades: log
    lo, hi = _span([scale(p[1]) for p in pts] + [scale(v) for v in tops],
                   chart.from_zero and not chart.logged(), None)  # fmt: skip

    def x(t: float) -> float:
        return PAD_LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return PAD_TOP + plot_h - (scale(v) - lo) / (hi - lo) * plot_h

    unscale = (lambda v: 10**v) if chart.logged() else float
    out = [head, _axes(chart, t0, t1, unscale(lo), unscale(hi), x, y, width, height)]
    out.append(_marks(chart, t0, t1, x, y, plot_w, plot_h))
    for i, s in enumerate(chart.series):
        drawn = thin(s.points, t0, t1, plot_w)
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in drawn if math.isfinite(v))
        colour = PALETTE[i % len(PALETTE)]
        out.append(
            f'<polyline class="series" data-label="{html.escape(s.label)}" '
            f'data-points="{len(drawn)}" fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{coords}"><title>{html.escape(s.label)}</title></polyline>'
        )
        out.append(_hover(chart, s.label, drawn, x, y, t1 - t0))
    if chart.logged():
        out.append(f'<text class="tick" x="{width - PAD_RIGHT}" y="{height - 8}" '
                   'text-anchor="end" dy="-12">log scale</text>')  # fmt: skip
    out.append(_legend(chart, width))
    out.append("</svg>")
    return "".join(out)


def _marks(
    chart: Chart,
    t0: float,
    t1: float,
    x: Callable[[float], float],
    y: Callable[[float], float],
    plot_w: float,
    plot_h: float,
) -> str:
    """The markers (checkpoints, run boundaries, deploys) and the cap line, each titled."""
    out = []
    for m in chart.markers:
        if t0 <= m.t <= t1:
            at = f"{x(m.t):.1f}"
            out.append(
                f'<line class="marker {html.escape(m.kind)}" x1="{at}" x2="{at}" y1="{PAD_TOP}" '
                f'y2="{PAD_TOP + plot_h}"><title>{html.escape(m.label)}</title></line>'
            )
    if chart.y_max is not None:
        cap = y(chart.y_max)
        out.append(
            f'<line class="cap" x1="{PAD_LEFT}" x2="{PAD_LEFT + plot_w}" y1="{cap:.1f}" '
            f'y2="{cap:.1f}"><title>cap {html.escape(chart.fmt(chart.y_max))}</title></line>'
        )
    return "".join(out)


def _hover(
    chart: Chart,
    label: str,
    drawn: list[tuple[float, float]],
    x: Callable[[float], float],
    y: Callable[[float], float],
    span_s: float,
) -> str:
    """Invisible points along a series, each saying its time and value on hover."""
    step = max(1, math.ceil(len(drawn) / HOVER_POINTS))
    name = html.escape(label)
    return "".join(
        f'<circle class="hover" cx="{x(t):.1f}" cy="{y(v):.1f}" r="4">'
        f"<title>{name} {html.escape(chart.x_label(t, span_s))}: {html.escape(chart.fmt(v))}"
        "</title>"
        f"</circle>"
        for t, v in drawn[::step]
        if math.isfinite(v)
    )


def _axes(
    chart: Chart,
    t0: float,
    t1: float,
    lo: float,
    hi: float,
    x: Callable[[float], float],
    y: Callable[[float], float],
    width: int,
    height: int,
) -> str:
    parts = []
    mid = math.sqrt(lo * hi) if chart.logged() else (lo + hi) / 2  # halfway up the axis
    for v in (lo, mid, hi):
        parts.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{width - PAD_RIGHT}" y1="{y(v):.1f}" '
            f'y2="{y(v):.1f}"/><text class="tick" x="{PAD_LEFT - 4}" y="{y(v) + 4:.1f}" '
            f'text-anchor="end">{html.escape(chart.fmt(v))}</text>'
        )
    for t, anchor in ((t0, "start"), ((t0 + t1) / 2, "middle"), (t1, "end")):
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{height - 8}" text-anchor="{anchor}">'
            f"{html.escape(chart.x_label(t, t1 - t0))}</text>"
        )
    return "".join(parts)


def _legend(chart: Chart, width: int) -> str:
    if len(chart.series) < 2:
        return ""
    items, at = [], width - PAD_RIGHT
    for i, s in reversed(list(enumerate(chart.series))):
        label = html.escape(s.label)
        at -= 12 + 7 * len(s.label)
        colour = PALETTE[i % len(PALETTE)]
        items.append(f'<text class="legend" x="{at}" y="14" fill="{colour}">{label}</text>')
    return "".join(items)
