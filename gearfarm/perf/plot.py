"""Small inline plots of a performance series for the morning report (issue #6): the last 60
nights, the change points as vertical lines at the first bad night, and each regime's mean as a
horizontal segment. PNG for the mail, SVG for the HTML report. Only called for metrics that
changed: a metric without a change gets no plot."""

from __future__ import annotations

import io
from typing import Literal

import matplotlib

matplotlib.use("Agg")  # no display on the farm; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gearfarm.perf.changepoint import RevisionChange  # noqa: E402

WINDOW = 60
_COLOURS = {"regression": "#c0392b", "improvement": "#27ae60"}


def plot(series: list[tuple[str, float]], changes: list[RevisionChange], title: str,
         fmt: Literal["png", "svg"]) -> bytes:
    """Render `series` ([(revision, value)] oldest first) with `changes` marked; returns the bytes."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"unsupported format {fmt!r}")
    shown = series[-WINDOW:]
    offset = len(series) - len(shown)  # change indices refer to the full series
    xs = [i for i, (_, v) in enumerate(shown) if v is not None]
    ys = [shown[i][1] for i in xs]
    # A Figure, not pyplot's global state: the report may render plots from several threads.
    fig = Figure(figsize=(6.0, 2.2), dpi=100)
    ax = fig.add_subplot()
    ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=0.8, color="#34495e")
    visible = sorted((c for c in changes if c.index >= offset), key=lambda c: c.index)
    for c in visible:
        ax.axvline(c.index - offset - 0.5, color=_COLOURS[c.direction], linestyle="--", linewidth=1)
        ax.annotate(f"{c.change:+.1%}", (c.index - offset - 0.5, 1), xycoords=("data", "axes fraction"),
                    xytext=(2, -10), textcoords="offset points", fontsize=7, color=_COLOURS[c.direction])
    # Regime means between the visible change points (the first regime's mean is the `before`
    # of the first change, later ones are each change's `after`).
    bounds = [0] + [c.index - offset for c in visible] + [len(shown)]
    means = ([visible[0].before_mean] + [c.after_mean for c in visible]) if visible else []
    for (s, e), m in zip(zip(bounds, bounds[1:], strict=False), means, strict=False):
        ax.hlines(m, s - 0.5, e - 0.5, color="#2980b9", linewidth=1.5)
    ticks = sorted({0, len(shown) - 1, *(c.index - offset for c in visible)})
    ax.set_xticks(ticks, [shown[i][0][:10] for i in ticks], fontsize=6, rotation=20)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title, fontsize=8)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)  # harmless for a bare Figure; keeps pyplot's registry empty if one leaked
    return buf.getvalue()
