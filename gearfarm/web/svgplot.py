"""Line charts as inline SVG for the dashboard: a series of points with optional interval bars,
vertical marks (change points, annotations) and a reference line (chart), or several named
lines with a legend (lines: a benchmark's curves within one run). Each point carries its
tooltip text (data-tip, shown by the page's few lines of script, and <title> for any reader)
and may link to its run.

Written here rather than with matplotlib, which the mail's PNGs use: a matplotlib figure takes
100-200 ms to draw, the whole page has 200 ms, and its SVG has no per-point hover or links. A
chart of a few hundred points is a handful of SVG elements."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass(frozen=True)
class Point:
    x: float
    y: float | None
    tip: str = ""
    lo: float | None = None  # an interval around y (a night's CI, or its runs' range)
    hi: float | None = None
    href: str | None = None


@dataclass(frozen=True)
class Mark:
    x: float
    label: str
    kind: str = "change"  # a CSS class: regression, improvement, expected, change


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values spanning [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.4g}"


class _Frame:
    """Axes, grid and scales of a chart over the given x and y values."""

    left, right, top, bottom = 64, 12, 24, 34

    def __init__(self, xs: Sequence[float], ys: Sequence[float], width: int, height: int, title: str,
                 y_label: str, x_labels: Sequence[tuple[float, str]] | None, css: str) -> None:
        y0, y1 = min(ys), max(ys)
        pad = (y1 - y0) * 0.08 or abs(y1) * 0.05 or 1.0
        self.y0, self.y1 = y0 - pad, y1 + pad
        self.x0, self.x1 = min(xs), max(xs)
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        self.pw, self.ph = width - self.left - self.right, height - self.top - self.bottom
        left, top, pw, ph = self.left, self.top, self.pw, self.ph
        self.out = [f'<svg class="{escape(css)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                    f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
                    f'<text x="{left}" y="15" font-size="13" font-weight="bold">{escape(title)}</text>',
                    f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>']
        for t in ticks(self.y0, self.y1):
            y = self.sy(t)
            self.out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                            f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_fmt(t)}</text>')
        if y_label:
            self.out.append(f'<text x="12" y="{top + ph / 2:.0f}" font-size="11" text-anchor="middle" '
                            f'transform="rotate(-90 12 {top + ph / 2:.0f})">{escape(y_label)}</text>')
        labels = x_labels if x_labels is not None else [(t, _fmt(t)) for t in ticks(self.x0, self.x1, 8)]
        for x, text in labels:
            self.out.append(f'<text x="{self.sx(x):.1f}" y="{height - self.bottom + 16}" font-size="11" '
                            f'text-anchor="middle">{escape(text)}</text>')

    def sx(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def sy(self, y: float) -> float:
        return self.top + (1 - (y - self.y0) / (self.y1 - self.y0)) * self.ph

    def done(self) -> Markup:
        return Markup("".join(self.out) + "</svg>")


def _empty(css: str, width: int, title: str) -> Markup:
    return Markup(f'<svg class="{escape(css)}" width="{width}" height="40" role="img"><text x="8" y="24">'
                  f'{escape(title)}: no data</text></svg>')


COLORS = ("#357", "#c60", "#393", "#93c", "#c33", "#399", "#996", "#666")


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, width: int = 900, height: int = 260,
          title: str = "", x_label: str = "", y_label: str = "", css: str = "chart lines") -> Markup:
    """Several named lines on one chart, with a legend; each point's tip names its line."""
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts if math.isfinite(y)]
    if not xs or not ys:
        return _empty(css, width, title)
    f = _Frame(xs, ys, width, height, title, y_label, None, css)
    if x_label:
        f.out.append(f'<text x="{f.left + f.pw:.0f}" y="{height - 4}" font-size="11" text-anchor="end">'
                     f'{escape(x_label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in pts if math.isfinite(y))
        f.out.append(f'<g class="line" data-line="{escape(name)}"><polyline points="{path}" fill="none" '
                     f'stroke="{color}" stroke-width="1.5"/>')
        if len(pts) <= 300:
            f.out += [f'<circle class="pt" cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="2" fill="{color}" '
                      f'data-tip="{escape(name)}: {_fmt(y)} at {x_label or "x"} {_fmt(x)}"/>'
                      for x, y in pts if math.isfinite(y)]
        f.out.append("</g>")
        lx = f.left + 8 + (i % 4) * 200
        ly = f.top + 14 + (i // 4) * 14
        f.out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{ly - 4}" font-size="11">{escape(name)}</text>')
    return f.done()


def chart(points: Sequence[Point], marks: Sequence[Mark] = (), *, width: int = 900, height: int = 260,
          title: str = "", y_label: str = "", reference: float | None = None,
          x_labels: Sequence[tuple[float, str]] | None = None, css: str = "chart", connect: bool = True) -> Markup:
    """One series with interval bars, vertical marks and an optional reference line."""
    ys = [v for p in points for v in (p.y, p.lo, p.hi) if v is not None and math.isfinite(v)]
    if reference is not None:
        ys.append(reference)
    xs = [p.x for p in points] + [m.x for m in marks]
    if not ys or not xs:
        return _empty(css, width, title)
    f = _Frame(xs, ys, width, height, title, y_label, x_labels, css)
    sx, sy, out = f.sx, f.sy, f.out
    left, top, pw, ph = f.left, f.top, f.pw, f.ph
    if reference is not None:
        y = sy(reference)
        out.append(f'<line class="reference" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#888" stroke-dasharray="2 3"/>')
    for m in marks:
        x = sx(m.x)
        color = {"regression": "#c00", "improvement": "#080", "expected": "#888"}.get(m.kind, "#55c")
        out.append(f'<g class="mark {escape(m.kind)}" data-tip="{escape(m.label)}"><line x1="{x:.1f}" x2="{x:.1f}" '
                   f'y1="{top}" y2="{top + ph}" stroke="{color}" stroke-width="2" stroke-dasharray="5 3"/>'
                   f'<text x="{x + 3:.1f}" y="{top + 12}" font-size="11" fill="{color}">{escape(m.label[:40])}</text>'
                   f'<title>{escape(m.label)}</title></g>')
    present = [p for p in points if p.y is not None and math.isfinite(p.y)]
    if connect and len(present) > 1:
        path = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in present)  # type: ignore[arg-type]
        out.append(f'<polyline points="{path}" fill="none" stroke="#357" stroke-width="1.2"/>')
    for p in points:
        if p.lo is not None and p.hi is not None:
            out.append(f'<line class="ci" x1="{sx(p.x):.1f}" x2="{sx(p.x):.1f}" y1="{sy(p.lo):.1f}" '
                       f'y2="{sy(p.hi):.1f}" stroke="#9ab" stroke-width="2"/>')
    r = 3 if len(present) < 200 else 2
    for p in present:
        dot = (f'<circle class="pt" cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="{r}" fill="#357" '  # type: ignore[arg-type]
               f'data-tip="{escape(p.tip)}"><title>{escape(p.tip)}</title></circle>')
        out.append(f'<a href="{escape(p.href)}">{dot}</a>' if p.href else dot)
    return f.done()
