"""The what-if chart a planner puts in a report, drawn with matplotlib (the ``plot`` extra),
which writes SVG and PNG itself: hit rate against log capacity in tokens, with blocks (or GiB,
given bytes per token) on the top axis, the knee, the capacities for 50/90/99% of the maximum,
the maximum, the pool when one is known, other policies' curves (libCacheSim) and a sampled
curve's error band; legend outside the data, a short title.

The input is the figures of ``radixcache whatif`` (``answers.summary``). The file is written
whole or not at all (``core.files.write_with``: beside its name, then renamed; a full disk leaves
no half chart and the old one unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from numpy.typing import ArrayLike

from radixcache.core.files import FileRefused, WriteFailed, output_kind, write_with

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from radixcache.analysis.figures import WhatIfFigures as Fig

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
FORMATS = (".svg", ".png")


class ChartError(ValueError):
    """The chart cannot be drawn or written (no matplotlib, a bad name, an unwritable file)."""


def check(path: Path) -> None:
    """Refuse, before any work, a file the chart cannot be written to by name or library."""
    if path.suffix.lower() not in FORMATS:
        raise ChartError(f"{path}: want a .svg or .png file name")
    try:
        output_kind(path)  # a directory, a block device: refused before the curve is computed
    except FileRefused as exc:
        raise ChartError(str(exc)) from None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ChartError("plots need matplotlib: pip install 'radixcache[plot]'") from None


def si(x: float, unit: str = "") -> str:
    """``x`` with a K/M/G/T suffix and at most 3 significant digits: 1536 -> 1.54K."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


Scale = Callable[[ArrayLike], ArrayLike]


def _scale_axis(fig: Fig) -> tuple[str, Scale, Scale]:
    """The top axis: GiB when bytes per token are known, else blocks."""
    caps, gib = fig.capacities_tokens, fig.capacities_gib
    per = 1 / fig.block_size
    label = f"capacity (blocks of {fig.block_size} tokens)"
    if gib is not None and caps[-1] > 0:
        per, label = gib[-1] / caps[-1], "KV cache (GiB)"
    return label, lambda t: np.asarray(t) * per, lambda g: np.asarray(g) / per


def _marks(ax: Axes, fig: Fig, caps: np.ndarray, rates: np.ndarray) -> None:
    """The knee, the 50/90/99% capacities and the maximum, on the curve."""
    top = 100 * fig.max_hit_rate
    ax.axhline(top, color="#666", lw=0.8, ls=":", label=f"maximum {top:.1f}% (infinite cache)")
    cf = fig.capacity_for
    for frac, marker in (("0.5", "v"), ("0.9", "s"), ("0.99", "D")):
        c = max(int(cf[frac]), 1)
        y = 100 * float(np.interp(np.log(c), np.log(caps), rates))
        ax.plot([c], [y], marker, color="#333", ms=6, ls="none",
                label=f"{float(frac):.0%} of max at {si(c)} tokens")
    knee = max(fig.knee_tokens, 1)
    ky = 100 * float(np.interp(np.log(knee), np.log(caps), rates))
    ax.plot([knee], [ky], "o", ms=11, mfc="none", mec="#d62728", mew=2, ls="none",
            label=f"knee at {si(knee)} tokens")


def _pool(ax: Axes, fig: Fig) -> None:
    pool = fig.pool
    if pool is not None:
        who = "your pool" if pool.given_by == "option" else "the engine's pool"
        ax.axvline(pool.tokens, color="#2ca02c", lw=1.5, ls="--",
                   label=f"{who}: {pool.blocks:,} blocks = {si(pool.tokens)} tokens "
                         f"({pool.of_max:.0%} of max)")


def _band(ax: Axes, fig: Fig, caps: np.ndarray, rates: np.ndarray) -> None:
    """The estimated points' error band (``bound_points``), and where the exact part ends."""
    if fig.exact is None or all(fig.exact):
        return
    keep = [i for i, c in enumerate(fig.capacities_tokens) if c > 0]
    bound = np.asarray([(fig.bound_points or [None] * len(fig.exact))[i] or 0.0 for i in keep])
    est = ~np.asarray([fig.exact[i] for i in keep])
    ax.fill_between(caps, 100 * rates - bound, 100 * rates + bound, where=est, color=COLORS[0],
                    alpha=0.25, lw=0, label="estimated (SHARDS sample): 95% bound")
    if fig.exact_up_to_tokens:
        ax.axvline(fig.exact_up_to_tokens, color="#999", lw=0.8, ls="-.",
                   label=f"exact up to {si(fig.exact_up_to_tokens)} tokens")


def draw(path: Path, fig: Fig) -> None:
    """Write the chart of ``fig`` to ``path`` (.svg or .png); ``ChartError`` if it cannot."""
    check(path)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, PercentFormatter

    caps_all, rates_all = fig.capacities_tokens, fig.hit_rate
    keep = [i for i, c in enumerate(caps_all) if c > 0]
    caps = np.asarray([caps_all[i] for i in keep], dtype=np.float64)
    rates = np.asarray([rates_all[i] for i in keep], dtype=np.float64)
    figure = Figure(figsize=(10, 5.2), layout="constrained")
    ax = figure.add_subplot()
    exact = "sampled" if fig.sample_rate is not None else "exact"
    ax.plot(caps, 100 * rates, color=COLORS[0], lw=2, label=f"LRU (one pass, {exact})")
    for i, (name, p) in enumerate(fig.policies.items(), 1):
        pts = [(c, 100 * r) for c, r in zip(p.capacities_tokens, p.hit_rate, strict=True)
               if c > 0]
        ax.plot([c for c, _ in pts], [r for _, r in pts], "o-", color=COLORS[i % len(COLORS)],
                lw=1, ms=4, label=f"{name.upper()} (libCacheSim)")
    _band(ax, fig, caps, rates)
    _marks(ax, fig, caps, rates)
    _pool(ax, fig)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: si(x)))
    ax.set_xlabel("capacity (tokens, log scale)")
    ax.set_ylabel("token hit rate")
    ax.yaxis.set_major_formatter(PercentFormatter(100))
    ax.set_ylim(0, min(100.0, 100 * float(rates.max(initial=0)) * 1.08 + 2))
    ax.grid(visible=True, which="major", color="#ddd", lw=0.6)
    label, fwd, inv = _scale_axis(fig)
    top = ax.secondary_xaxis("top", functions=(fwd, inv))
    top.set_xlabel(label)
    top.xaxis.set_major_formatter(FuncFormatter(lambda x, _: si(x)))
    name = Path(fig.source).name
    ax.set_title(f"What-if: {name}, block {fig.block_size}", loc="left", fontsize=12)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=9)
    from matplotlib import rc_context

    def save(file: BinaryIO) -> None:  # SVG text stays text: searchable, editable in a report
        with rc_context({"svg.fonttype": "none"}):
            figure.savefig(file, format=path.suffix.lower()[1:], dpi=120)

    try:
        write_with(path, save)
    except (FileRefused, WriteFailed) as exc:
        raise ChartError(str(exc)) from None
