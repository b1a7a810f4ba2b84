"""Small bar charts as inline SVG, rendered on the server: no script, no CDN, no style
attribute (the CSP allows none); colours come from classes in the vendored stylesheet."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 480, 120, 18


def bar_chart(values: Sequence[int], labels: Sequence[str], title: str, *,
              classes: Sequence[str] | None = None) -> str:
    """One bar per value, scaled to the largest; each bar's <title> is its label and value
    (the tooltip a browser shows). Empty input draws an empty frame with a note."""
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT + PAD}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(title)}</title>",
             f'<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>']
    if not values:
        parts.append(f'<text class="note" x="{WIDTH // 2}" y="{HEIGHT // 2}" '
                     'text-anchor="middle">nothing yet</text>')
    else:
        top = max(max(values), 1)
        step = WIDTH / len(values)
        bar_w = max(step * 0.8, 1.0)
        for i, (v, label) in enumerate(zip(values, labels, strict=True)):
            h = 0 if v <= 0 else max(1.0, (HEIGHT - 4) * v / top)
            cls = classes[i] if classes else "bar"
            parts.append(f'<rect class="{escape(cls)}" x="{i * step:.1f}" y="{HEIGHT - h:.1f}" '
                         f'width="{bar_w:.1f}" height="{h:.1f}"><title>{escape(label)}: {v}'
                         "</title></rect>")
        parts.append(f'<text class="note" x="0" y="{HEIGHT + PAD - 4}">{escape(labels[0])}</text>')
        parts.append(f'<text class="note" x="{WIDTH}" y="{HEIGHT + PAD - 4}" text-anchor="end">'
                     f"{escape(labels[-1])}</text>")
        parts.append(f'<text class="note" x="{WIDTH}" y="12" text-anchor="end">max {top}</text>')
    parts.append("</svg>")
    return "".join(parts)
