"""How `radixcache whatif` shows its answer: the headline answers, the terminal plot, the
table, the routing table and the plot file (the command itself is in ``cli.cmd_whatif``). All
of it reads the typed figures (``radixcache.analysis.figures``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.app import CliError

if TYPE_CHECKING:
    from radixcache.analysis.figures import RoutingFigures, WhatIfFigures


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _est(exact: bool | None) -> str:
    return "" if exact is None or exact else " (est.)"


def answers(fig: WhatIfFigures) -> list[str]:
    """The headline answers; each says ``(est.)`` where it rests on an estimated point."""
    cf, cx = fig.capacity_for, fig.capacity_for_exact or {}
    lines = [
        f"{fig.requests:,} requests, {fig.prompt_tokens:,} prompt tokens, "
        f"block {fig.block_size} ({fig.format}) in {fig.seconds:.2f} s",
        f"maximum hit rate {pct(fig.max_hit_rate)} (infinite cache)"
        + _est(not fig.exact or fig.exact[-1]),
        "capacity for 50% / 90% / 99% of it: "
        + " / ".join(f"{cf[f]:,} tokens{_est(cx.get(f))}" for f in ("0.5", "0.9", "0.99")),
        f"knee at {fig.knee_tokens:,} tokens{_est(fig.knee_exact)}",
    ]
    pool = fig.pool
    if pool is not None:
        who = "your pool" if pool.given_by == "option" else "the recording's pool"
        lines.append(
            f"{who} of {pool.blocks:,} blocks ({pool.tokens:,} tokens) reaches "
            f"{pct(pool.of_max)} of the maximum; 2x reaches {pct(pool.of_max_2x)}"
            + _est(pool.exact))
    if fig.sample_rate is not None:
        lines += _sample_lines(fig)
    return lines


def _sample_lines(fig: WhatIfFigures) -> list[str]:
    """What a ``--sample`` answer rests on: the exact part and the estimated one, or (the
    sample alone) where it is rough."""
    rate = pct(fig.sample_rate or 0.0)
    if fig.exact_up_to_tokens is not None:
        return [f"exact up to {fig.exact_up_to_tokens:,} tokens (an exact pass over the top "
                f"of the stack); estimated above from a {rate} sample of the blocks (SHARDS), "
                f"each with its 95% bound (the table's point column)"]
    if fig.exact is not None and all(fig.exact):
        return [f"exact at every capacity: the exact pass held every block, the {rate} "
                f"sample was not needed"]
    cf = fig.capacity_for
    lines = [f"estimated from a {rate} sample of the blocks (SHARDS)"]
    low = fig.sample_resolves_from_tokens or 0
    rough = [f"{int(100 * float(f))}%" for f in ("0.5", "0.9", "0.99") if cf[f] < low]
    parts = [f"its capacit{'ies' if len(rough) > 1 else 'y'} for {' / '.join(rough)}"]
    parts = (parts if rough else []) + ["its knee"] * (fig.knee_tokens < low)
    many = len(rough) > 1 or len(parts) > 1
    if parts:
        lines.append(f"the sample resolves the curve only from {low:,} tokens up, so "
                     f"{' and '.join(parts)} " + ("lie below that and are rough: run "
                     "without --exact-depth 0 for them" if many else "lies below that and "
                     "is rough: run without --exact-depth 0 for it"))
    return lines


def _point(fig: WhatIfFigures, i: int) -> str:
    """``exact``, or an estimate's bound (``±0.12`` points; ``est.`` without one)."""
    if fig.exact is None or fig.exact[i]:
        return "exact"
    b = fig.bound_points[i] if fig.bound_points is not None else None
    return "est." if b is None else f"±{b:.2f}"


def curve_table(fig: WhatIfFigures, rows: int = 14) -> Table:
    caps, rates, miss, gib = fig.capacities_tokens, fig.hit_rate, fig.misses, fig.capacities_gib
    how = "sampled" if fig.sample_rate is not None else "exact"
    t = Table(title=f"radixcache whatif {fig.source} (LRU, {how})")
    cols = ["capacity tokens", "blocks", "GiB", "hit rate", "point", "compulsory", "capacity",
            "alignment"] + ["cost"] * (fig.cost is not None)
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    align = miss.alignment
    step = max(1, len(caps) // rows)
    picks = sorted(set(range(0, len(caps), step)) | {len(caps) - 1})
    for i in picks:
        t.add_row(
            f"{caps[i]:,}", f"{caps[i] // fig.block_size:,}",
            f"{gib[i]:.2f}" if gib is not None else "-", pct(rates[i]), _point(fig, i),
            f"{miss.compulsory[i]:,}", f"{miss.capacity[i]:,}",
            f"{align[i]:,}" if align is not None else "-",
            *([f"{fig.cost[i]:,.2f}"] if fig.cost is not None else []))
    return t


def terminal_plot(fig: WhatIfFigures, width: int, color: bool) -> Text:
    import plotext as plt

    from radixcache.analysis.chart import si

    pairs = [(c, 100 * r) for c, r in zip(fig.capacities_tokens, fig.hit_rate, strict=True)
             if c > 0]
    plt.clear_figure()
    plt.plot([c for c, _ in pairs], [r for _, r in pairs], marker="braille", label="LRU")
    ys = [r for _, r in pairs]
    for name, p in fig.policies.items():
        both = zip(p.capacities_tokens, p.hit_rate, strict=True)
        pts = [(c, 100 * r) for c, r in both if c > 0]
        if pts:
            plt.scatter([c for c, _ in pts], [r for _, r in pts], label=name)
            ys += [r for _, r in pts]
    plt.xscale("log")
    lo, hi = min(c for c, _ in pairs), max(c for c, _ in pairs)
    decades = [10**e for e in range(len(str(lo)) - 1, len(str(hi))) if lo <= 10**e <= hi]
    plt.xticks(decades, [si(d) for d in decades])
    bottom, top = max(0.0, min(ys) - 2), min(100.0, max(ys) + 2)
    plt.ylim(bottom, top)
    ticks = [float(t) for t in np.linspace(bottom, top, 5)]
    plt.yticks(ticks, [f"{t:.0f}%" for t in ticks])
    plt.plotsize(min(100, width), 20)
    if not color:
        plt.theme("clear")
    plt.title("token hit rate against capacity (tokens, log scale)")
    return Text.from_ansi(str(plt.build()))


def check_plot(plot: Path | None) -> None:
    """Refuse a --plot we cannot write (its name, or matplotlib missing) before any work."""
    from radixcache.analysis.chart import ChartError, check

    if plot is not None:
        try:
            check(plot)
        except ChartError as exc:
            raise typer.BadParameter(str(exc), param_hint="--plot") from None


def plot_file(path: Path, fig: WhatIfFigures) -> None:
    from radixcache.analysis.chart import ChartError, draw

    try:
        draw(path, fig)
    except ChartError as exc:
        raise CliError(f"--plot {exc}") from exc


def write_csv(path: Path, fig: WhatIfFigures) -> None:
    """``--csv``: every capacity (``figures.as_csv``), written beside and renamed over
    ``path`` so that a failed write never leaves a truncated file; a path that is there and
    not a regular file is refused."""
    import os
    import tempfile

    from radixcache.analysis.figures import as_csv

    if path.exists() and not path.is_file():
        raise CliError(f"--csv {path}: not a regular file (refused)")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(as_csv(fig))
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise CliError(f"--csv {path}: {exc.strerror or exc}") from exc


def print_human(fig: WhatIfFigures) -> None:
    probe = Console()  # piped: as wide as the widest line, so that no number is cut
    out = probe if probe.is_terminal else Console(width=400)
    for line in answers(fig):
        out.print(line)
    out.print(terminal_plot(fig, out.width, out.is_terminal))
    out.print(curve_table(fig))
    if fig.routing is not None:
        out.print(routing_table(fig.routing))


def routing_table(r: RoutingFigures) -> Table:
    t = Table(title=f"{r.replicas} replicas x {r.capacity_blocks:,} blocks "
                    f"(block {r.block_size}), offline")
    for col in ("router", "hit rate", "imbalance", "duplicated tokens"):
        t.add_column(col, justify="right")
    for name, p in r.policies.items():
        t.add_row(name, pct(p.hit_rate), f"{p.imbalance:.2f}", f"{p.duplicated_tokens:,}")
    one = r.shared
    t.add_row(f"one shared cache of {one.capacity_blocks:,}", pct(one.hit_rate), "-", "-")
    return t
