"""Charts as inline SVG, rendered on the server: no script, no CDN, no style attribute (the
CSP allows none); colours come from classes in the vendored stylesheet.

Every chart has a y axis with ticks in the values' unit (``fmt``: "20 ETH", not the number of
milli-ETH) and an x axis with its labels; a time series (``time_chart``) has one bar per equal
time bucket over the whole span, empty buckets included, so a quiet hour shows as a gap and a
single event is not a lone bar filling the chart.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from html import escape

WIDTH, HEIGHT = 480, 150
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 16, 30  # plot margins: y tick labels left, x labels below
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def _plain(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def bar_chart(values: Sequence[float], labels: Sequence[str], title: str, *,
              classes: Sequence[str] | None = None, fmt: Callable[[float], str] = _plain,
              y_label: str = "", x_labels: Sequence[str] | None = None) -> str:
    """One bar per value, scaled to the largest, on a y axis with ticks at 0, half and the
    largest value (each written with ``fmt``, in the values' unit) and ``y_label`` (the unit)
    above it. ``x_labels``: the labels under the x axis (default: the first and last bar's).
    Each bar's <title> is its label and value (a browser's tooltip). Empty input draws the
    axes with a note."""
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(title)}</title>"]
    x0, y0 = LEFT, TOP + PLOT_H  # the origin
    parts.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{WIDTH - RIGHT}" y2="{y0}"/>')
    parts.append(f'<line class="axis" x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}"/>')
    if y_label:
        parts.append(f'<text class="note y-label" x="{x0 + 4}" y="{TOP - 5}" '
                     f'text-anchor="start">{escape(y_label)}</text>')
    if not values:
        parts.append(f'<text class="note" x="{x0 + PLOT_W // 2}" y="{TOP + PLOT_H // 2}" '
                     'text-anchor="middle">nothing yet</text>')
        parts.extend(_x_labels(list(x_labels or []), x0, y0))
        parts.append("</svg>")
        return "".join(parts)
    top = max(max(values), 1)
    for frac in (0.0, 0.5, 1.0):
        y = y0 - PLOT_H * frac
        parts.append(f'<line class="tick" x1="{x0 - 3}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}"/>')
        parts.append(f'<text class="note y-tick" x="{x0 - 5}" y="{y + 3:.1f}" '
                     f'text-anchor="end">{escape(fmt(top * frac))}</text>')
    step = PLOT_W / len(values)
    bar_w = max(step * 0.8, 1.0)
    for i, (v, label) in enumerate(zip(values, labels, strict=True)):
        h = 0 if v <= 0 else max(1.0, PLOT_H * v / top)
        cls = classes[i] if classes else "bar"
        parts.append(f'<rect class="{escape(cls)}" x="{x0 + i * step + (step - bar_w) / 2:.1f}" '
                     f'y="{y0 - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}">'
                     f"<title>{escape(label)}: {escape(fmt(v))}</title></rect>")
    parts.extend(_x_labels(list(x_labels) if x_labels is not None else [labels[0], labels[-1]],
                           x0, y0))
    parts.append("</svg>")
    return "".join(parts)


def _x_labels(xs: list[str], x0: int, y0: int) -> list[str]:
    """Labels spread evenly under the x axis, each with its tick."""
    parts = []
    for k, text in enumerate(xs):
        if len(xs) == 1:
            x, anchor = x0 + PLOT_W / 2, "middle"
        else:
            x = x0 + PLOT_W * k / (len(xs) - 1)
            anchor = "start" if k == 0 else "end" if k == len(xs) - 1 else "middle"
        parts.append(f'<line class="tick" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 3}"/>')
        parts.append(f'<text class="note x-tick" x="{x:.1f}" y="{y0 + 14}" '
                     f'text-anchor="{anchor}">{escape(text)}</text>')
    return parts


def _clock(ts: int, span_s: int) -> str:
    t = dt.datetime.fromtimestamp(ts, dt.UTC)
    return t.strftime("%H:%M:%S" if span_s < 600 else "%H:%M" if span_s < 86_400 * 2
                      else "%m-%d %H:%M")


def bucket_width(span_s: int, buckets: int) -> int:
    """Seconds per bucket: a round step (1 s … 1 day) so that ``buckets`` cover ``span_s``."""
    for w in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600,
              43_200, 86_400):
        if w * buckets >= span_s:
            return w
    return -(-span_s // buckets)


def per(w: int) -> str:
    """'per 5 min' for a bucket of ``w`` seconds."""
    if w % 86_400 == 0:
        return f"per {w // 86_400} d" if w > 86_400 else "per day"
    if w % 3600 == 0:
        return f"per {w // 3600} h" if w > 3600 else "per hour"
    if w % 60 == 0:
        return f"per {w // 60} min" if w > 60 else "per min"
    return f"per {w} s"


def time_chart(times: Sequence[int], title: str, unit: str, *, start: int, end: int,
               buckets: int = 24, weights: Sequence[float] | None = None,
               red: Sequence[bool] | None = None, rate_per_s: float | None = None) -> str:
    """A time series over [start, end] (unix seconds): ``buckets`` bars of a round width, each
    the count (or the sum of ``weights``) of ``times`` inside it; time labels under the x axis
    (start, middle, end, UTC) and ``unit`` with the bucket width on the y axis ("receipts per
    5 min"). ``rate_per_s``: each bar divided by the bucket's seconds and multiplied by this
    (60: a rate per minute; the unit then says so). ``red``: bars where most of the bucket's
    events are marked (slashed challenges) are drawn red."""
    if times:
        start, end = min(start, min(times)), max(end, max(times))
    end = max(end, start + 1)
    if not times:  # the axes over the span with a note: the time it covers is still shown
        span = end - start
        return bar_chart([], [], title, y_label=unit,
                         x_labels=[_clock(start, span), _clock(end, span) + " UTC"])
    w = bucket_width(end - start + 1, buckets)
    n = buckets  # always the whole row of buckets, ending at ``end``: never a lone bar
    start = end - n * w + 1
    sums = [0.0] * n
    marked, counts = [0] * n, [0] * n
    for k, t in enumerate(times):
        i = min(n - 1, max(0, (t - start) // w))
        sums[i] += weights[k] if weights is not None else 1
        counts[i] += 1
        marked[i] += bool(red[k]) if red is not None else 0
    values = sums if rate_per_s is None else [s * rate_per_s / w for s in sums]
    y_label = unit if rate_per_s is not None else f"{unit} {per(w)}"
    labels = [f"{_clock(start + i * w, end - start)}–{_clock(start + (i + 1) * w, end - start)}"
              for i in range(n)]
    classes = ["bar slash" if m * 2 > c else "bar" for m, c in zip(marked, counts, strict=True)]
    span = end - start
    x_labels = [_clock(start, span), _clock(start + span // 2, span),
                _clock(end, span) + " UTC"]
    return bar_chart(values, labels, title, classes=classes, y_label=y_label, x_labels=x_labels)
