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


def answers(fig: WhatIfFigures) -> list[str]:
    cf = fig.capacity_for
    lines = [
        f"{fig.requests:,} requests, {fig.prompt_tokens:,} prompt tokens, "
        f"block {fig.block_size} ({fig.format}) in {fig.seconds:.2f} s",
        f"maximum hit rate {pct(fig.max_hit_rate)} (infinite cache)",
        "capacity for 50% / 90% / 99% of it: "
        + " / ".join(f"{cf[f]:,} tokens" for f in ("0.5", "0.9", "0.99")),
        f"knee at {fig.knee_tokens:,} tokens",
    ]
    pool = fig.pool
    if pool is not None:
        who = "your pool" if pool.given_by == "option" else "the recording's pool"
        lines.append(
            f"{who} of {pool.blocks:,} blocks ({pool.tokens:,} tokens) reaches "
            f"{pct(pool.of_max)} of the maximum; 2x reaches {pct(pool.of_max_2x)}")
    if fig.sample_rate is not None:
        lines.append(f"estimated from a {pct(fig.sample_rate)} sample of the blocks (SHARDS)")
        low = fig.sample_resolves_from_tokens or 0
        rough = [f"{int(100 * float(f))}%" for f in ("0.5", "0.9", "0.99") if cf[f] < low]
        parts = [f"its capacit{'ies' if len(rough) > 1 else 'y'} for {' / '.join(rough)}"]
        parts = (parts if rough else []) + ["its knee"] * (fig.knee_tokens < low)
        many = len(rough) > 1 or len(parts) > 1
        if parts:
            lines.append(f"the sample resolves the curve only from {low:,} tokens up, so "
                         f"{' and '.join(parts)} " + ("lie below that and are rough: run "
                         "without --sample for them" if many else "lies below that and is "
                         "rough: run without --sample for it"))
    return lines


def curve_table(fig: WhatIfFigures, rows: int = 14) -> Table:
    caps, rates, miss, gib = fig.capacities_tokens, fig.hit_rate, fig.misses, fig.capacities_gib
    how = "sampled" if fig.sample_rate is not None else "exact"
    t = Table(title=f"radixcache whatif {fig.source} (LRU, {how})")
    for col in ("capacity tokens", "blocks", "GiB", "hit rate", "compulsory", "capacity",
                "alignment"):
        t.add_column(col, justify="right")
    align = miss.alignment
    step = max(1, len(caps) // rows)
    picks = sorted(set(range(0, len(caps), step)) | {len(caps) - 1})
    for i in picks:
        t.add_row(
            f"{caps[i]:,}", f"{caps[i] // fig.block_size:,}",
            f"{gib[i]:.2f}" if gib is not None else "-", pct(rates[i]),
            f"{miss.compulsory[i]:,}", f"{miss.capacity[i]:,}",
            f"{align[i]:,}" if align is not None else "-")
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


def print_human(fig: WhatIfFigures) -> None:
    out = Console()
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
