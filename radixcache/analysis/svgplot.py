"""The what-if curve as a small self-contained SVG (log capacity against hit rate), and as PNG
through cairosvg (the ``png`` extra). No plotting library: a polyline, axes and markers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 36, 48
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _x(cap: float, lo: float, hi: float) -> float:
    span = math.log10(hi) - math.log10(lo) or 1.0
    return LEFT + (math.log10(max(cap, lo)) - math.log10(lo)) / span * (W - LEFT - RIGHT)


def _y(rate: float) -> float:
    return TOP + (1.0 - rate) * (H - TOP - BOTTOM)


def _axes(lo: float, hi: float) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" '
           f'height="{H - TOP - BOTTOM}" fill="none" stroke="#444"/>']
    for pct in range(0, 101, 20):
        y = _y(pct / 100)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{pct}%</text>')
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        if lo <= 10**e <= hi:
            x = _x(10**e, lo, hi)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                       f'stroke="#ddd"/><text x="{x:.1f}" y="{H - BOTTOM + 16}" '
                       f'text-anchor="middle">1e{e}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 10}" text-anchor="middle">'
               f'capacity (tokens, log scale)</text>')
    return out


def render_svg(
    title: str,
    caps: Sequence[int],
    rates: Sequence[float],
    points: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    marks: Mapping[str, int],
) -> str:
    """The chart: the LRU curve ``rates`` over ``caps``, each policy's sampled ``points``
    as dots, and vertical ``marks`` (label -> capacity), e.g. the pool."""
    pos = [c for c in caps if c > 0] or [1]
    lo, hi = min(pos), max(pos)
    hi = max(hi, lo * 10)  # one decade at least, so a flat trace still has an axis
    body = _axes(lo, hi)
    pairs = zip(caps, rates, strict=True)
    line = " ".join(f"{_x(c, lo, hi):.1f},{_y(r):.1f}" for c, r in pairs if c > 0)
    body.append(f'<polyline points="{line}" fill="none" stroke="{COLORS[0]}" stroke-width="2"/>')
    legend = [("LRU (one pass, exact)", COLORS[0])]
    for i, (name, (pc, pr)) in enumerate(points.items(), 1):
        color = COLORS[i % len(COLORS)]
        legend.append((f"{name} (replay)", color))
        body += [f'<circle cx="{_x(c, lo, hi):.1f}" cy="{_y(r):.1f}" r="4" fill="{color}"/>'
                 for c, r in zip(pc, pr, strict=True) if c > 0]
    for label, cap in marks.items():
        x = _x(cap, lo, hi)
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                    f'stroke="#888" stroke-dasharray="4 3"/><text x="{x + 4:.1f}" '
                    f'y="{TOP + 14}">{escape(label)}</text>')
    for i, (name, color) in enumerate(legend):
        y = H - BOTTOM - 12 - 16 * (len(legend) - 1 - i)  # lower right: curves rise to the right
        body.append(f'<rect x="{W - RIGHT - 200}" y="{y - 9}" width="10" height="10" '
                    f'fill="{color}"/><text x="{W - RIGHT - 184}" y="{y}">{escape(name)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" '
            f'fill="white"/><text x="{LEFT}" y="22" font-size="14">{escape(title)}</text>'
            + "".join(body) + "</svg>\n")


def write_plot(path: Path, svg: str) -> None:
    """Write ``svg`` to ``path``: as is for ``.svg``, converted for ``.png`` (needs the
    ``png`` extra: ``pip install radixcache[png]``). Raises ``ValueError`` otherwise."""
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(svg)
    elif suffix == ".png":
        try:
            import cairosvg
        except ImportError:
            raise ValueError("PNG needs cairosvg: pip install 'radixcache[png]'") from None
        cairosvg.svg2png(bytestring=svg.encode(), write_to=str(path))
    else:
        raise ValueError(f"--plot {path}: want a .svg or .png file name")
