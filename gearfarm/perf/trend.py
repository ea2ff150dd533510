"""A figure's last nights as a trend small enough for a phone: a line of block characters
(every mail client and terminal shows them, where inline SVG is dropped by most mail clients
and a PNG per figure would cost the report ~0.1 s of matplotlib each), and the same as a tiny
inline SVG for the report file and the dashboard."""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup

from gearfarm.formats.words import counted

BLOCKS = "▁▂▃▄▅▆▇█"


def _present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def blocks(values: Sequence[float | None]) -> str:
    """One character a night, oldest first, scaled to the nights shown (a gap: a space)."""
    vs = _present(values)
    if not vs:
        return ""
    lo, hi = min(vs), max(vs)
    span = hi - lo
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
        elif span <= abs(hi) * 1e-9:
            out.append(BLOCKS[3])  # flat: the middle, not the floor (it did not fall)
        else:
            out.append(BLOCKS[min(len(BLOCKS) - 1, int((v - lo) / span * len(BLOCKS)))])
    return "".join(out)


def svg(values: Sequence[float | None], width: int = 96, height: int = 20) -> Markup:
    """The nights as a polyline, the last night as a dot."""
    vs = _present(values)
    if len(vs) < 2:
        return Markup("")
    lo, hi = min(vs), max(vs)
    span = (hi - lo) or 1.0
    step = (width - 4) / max(1, len(values) - 1)
    pts = [(2 + i * step, height - 2 - (v - lo) / span * (height - 4))
           for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    x, y = pts[-1]
    return Markup(f'<svg class="trend" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
                  f'role="img" aria-label="last {counted(len(values), "night")}"><polyline points="{line}" fill="none" '
                  f'stroke="#357" stroke-width="1.3"/><circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="#c60"/></svg>')
