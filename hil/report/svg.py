"""Small line charts as inline SVG, drawn by hand: no plotting library, no network.

``chart`` takes named series of (x, y) points (x in seconds from the start), a y label
and fault windows (start, end, label) that are drawn as shaded bands behind the lines.
Everything is escaped; the output is a standalone ``<svg>`` element sized by viewBox.
"""

from __future__ import annotations

import math
from html import escape

W, H = 860, 240
L, R, T, B = 64, 16, 28, 36
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"]


def _nice(hi: float) -> float:
    if hi <= 0 or math.isnan(hi):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(hi))
    for step in (1, 2, 2.5, 5, 10):
        if hi <= step * mag:
            return float(step * mag)
    return 10 * mag


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def chart(title: str, series: dict[str, list[tuple[float, float]]], ylabel: str,
          x_end: float, faults: list[tuple[float, float, str]]) -> str:
    ys = [y for pts in series.values() for _, y in pts if not math.isnan(y)]
    ymax = _nice(max(ys) if ys else 1.0)
    xmax = max(1.0, x_end)
    pw, ph = W - L - R, H - T - B

    def px(x: float) -> float:
        return L + pw * x / xmax

    def py(y: float) -> float:
        return T + ph * (1 - y / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="{escape(title)}" class="chart">',
           f'<text x="{L}" y="18" class="title">{escape(title)}</text>']
    for a, b, label in faults:
        x0, x1 = px(max(0.0, a)), px(min(xmax, max(b, a + xmax / 300)))
        out.append(f'<rect x="{x0:.1f}" y="{T}" width="{x1 - x0:.1f}" height="{ph}" '
                   f'class="fault"><title>{escape(label)}</title></rect>')
        out.append(f'<text x="{x0 + 2:.1f}" y="{T + 12}" class="flabel">{escape(label)}</text>')
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
                   'class="grid"/>')
        out.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" class="ytick">{_fmt(y)}</text>')
    step = _nice(xmax / 8)
    x = 0.0
    while x <= xmax + 1e-9:
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" class="xtick">{x:g}s</text>')
        x += step
    out.append(f'<text x="12" y="{T + ph / 2:.0f}" class="ylabel" '
               f'transform="rotate(-90 12 {T + ph / 2:.0f})">{escape(ylabel)}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" class="frame"/>')
    lx = W - R - 8
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        # a NaN (no data in that second) breaks the line instead of bridging the gap
        cmds: list[str] = []
        pen_up = True
        for x, y in pts:
            if not 0 <= x <= xmax:
                continue
            if math.isnan(y):
                pen_up = True
                continue
            cmds.append(f"{'M' if pen_up else 'L'}{px(x):.1f},{py(y):.1f}")
            pen_up = False
        if cmds:
            out.append(f'<path d="{" ".join(cmds)}" stroke="{colour}" class="line"/>')
        out.append(f'<text x="{lx}" y="{T + 14 + 14 * i}" fill="{colour}" '
                   f'class="legend">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)
