"""`radixcache whatif SOURCE`: the hit rate of every cache size in one pass, and why requests
miss; `radixcache bench whatif`: its speed and exactness figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from cli.app import CliError, app, bench_app
from radixcache.traffic.traces import TraceError

if TYPE_CHECKING:
    from radixcache.analysis.replay import Policy
    from radixcache.analysis.routing import Router
    from radixcache.analysis.whatif import WhatIfConfig


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what}: want comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise typer.BadParameter(f"{what}: capacities must be >= 0")
    return vals


def _policies(text: str) -> tuple[Policy, ...]:
    from radixcache.analysis.replay import Policy

    if text in ("", "none"):
        return ()
    try:
        return tuple(Policy(p.strip()) for p in text.split(","))
    except ValueError:
        names = ", ".join(p.value for p in Policy)
        raise typer.BadParameter(f"--policies: choose from {names} (or none)") from None


def _routers(text: str) -> list[Router]:
    from radixcache.analysis.routing import Router

    if text == "all":
        return list(Router)
    try:
        return [Router(r.strip()) for r in text.split(",")]
    except ValueError:
        names = ", ".join(r.value for r in Router)
        raise typer.BadParameter(f"--router: choose from {names} (or all)") from None


def _bytes_per_token(kv_bytes: int | None, model: str | None) -> int | None:
    from radixcache.analysis.answers import MODEL_BYTES_PER_TOKEN

    if model is None:
        return kv_bytes
    if model not in MODEL_BYTES_PER_TOKEN:
        raise typer.BadParameter(f"--model: choose from {', '.join(MODEL_BYTES_PER_TOKEN)}")
    return MODEL_BYTES_PER_TOKEN[model]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _answers(fig: dict[str, object]) -> list[str]:
    cf = fig["capacity_for"]
    assert isinstance(cf, dict)
    lines = [
        f"{fig['requests']:,} requests, {fig['prompt_tokens']:,} prompt tokens, "
        f"block {fig['block_size']} ({fig['format']}) in {fig['seconds']:.2f} s",
        f"maximum hit rate {_pct(float(fig['max_hit_rate']))} (infinite cache)",
        "capacity for 50% / 90% / 99% of it: "
        + " / ".join(f"{cf[f]:,} tokens" for f in ("0.5", "0.9", "0.99")),
        f"knee at {fig['knee_tokens']:,} tokens",
    ]
    pool = fig.get("pool")
    if isinstance(pool, dict):
        lines.append(
            f"your pool of {pool['blocks']:,} blocks reaches {_pct(pool['of_max'])} of the "
            f"maximum; 2x reaches {_pct(pool['of_max_2x'])}")
    return lines


def _table(fig: dict[str, object], rows: int = 14) -> Table:
    caps = fig["capacities_tokens"]
    rates = fig["hit_rate"]
    miss = fig["misses"]
    gib = fig.get("capacities_gib")
    assert isinstance(caps, list) and isinstance(rates, list) and isinstance(miss, dict)
    t = Table(title=f"radixcache whatif {fig['source']} (LRU, exact)")
    for col in ("capacity tokens", "blocks", "GiB", "hit rate", "compulsory", "capacity",
                "alignment"):
        t.add_column(col, justify="right")
    step = max(1, len(caps) // rows)
    picks = sorted(set(range(0, len(caps), step)) | {len(caps) - 1})
    for i in picks:
        t.add_row(
            f"{caps[i]:,}", f"{caps[i] // int(str(fig['block_size'])):,}",
            f"{gib[i]:.2f}" if isinstance(gib, list) else "-", _pct(rates[i]),
            f"{miss['compulsory'][i]:,}", f"{miss['capacity'][i]:,}",
            f"{miss['alignment'][i]:,}")
    return t


def _terminal_plot(fig: dict[str, object], width: int, color: bool) -> Text:
    import plotext as plt

    caps, rates = fig["capacities_tokens"], fig["hit_rate"]
    assert isinstance(caps, list) and isinstance(rates, list)
    pairs = [(c, 100 * r) for c, r in zip(caps, rates, strict=True) if c > 0]
    plt.clear_figure()
    plt.plot([c for c, _ in pairs], [r for _, r in pairs], marker="braille", label="LRU")
    pol = fig["policies"]
    assert isinstance(pol, dict)
    for name, p in pol.items():
        both = zip(p["capacities_tokens"], p["hit_rate"], strict=True)
        pts = [(c, 100 * r) for c, r in both if c > 0]
        if pts:
            plt.scatter([c for c, _ in pts], [r for _, r in pts], label=name)
    plt.xscale("log")
    plt.ylim(0, 100)
    plt.plotsize(min(100, width), 20)
    if not color:
        plt.theme("clear")
    plt.title("token hit rate (%) against capacity (tokens)")
    return Text.from_ansi(str(plt.build()))


def _check_plot_name(plot: Path | None) -> None:
    """Refuse a --plot name we cannot write before any work is done."""
    if plot is not None and plot.suffix.lower() not in (".svg", ".png"):
        raise typer.BadParameter(f"{plot}: want a .svg or .png file name", param_hint="--plot")


def _plot_file(path: Path, fig: dict[str, object]) -> None:
    from radixcache.analysis.svgplot import render_svg, write_plot

    pol = fig["policies"]
    assert isinstance(pol, dict)
    points = {n: (p["capacities_tokens"], p["hit_rate"]) for n, p in pol.items()}
    pool = fig.get("pool")
    marks = {}
    if isinstance(pool, dict):
        marks[f"pool {pool['blocks']:,} blocks"] = int(pool["blocks"]) * int(str(fig["block_size"]))
    caps, rates = fig["capacities_tokens"], fig["hit_rate"]
    assert isinstance(caps, list) and isinstance(rates, list)
    title = f"what if: {fig['source']} (block {fig['block_size']})"
    try:
        write_plot(path, render_svg(title, caps, rates, points, marks))
    except (ValueError, OSError) as exc:  # cairosvg missing, or the file cannot be written
        raise CliError(f"--plot {path}: {exc}") from exc


def _compute(
    cfg: WhatIfConfig, at: list[int], pool_blocks: int, bpt: int | None,
    routers: list[Router], replicas: int, err: Console,
) -> tuple[dict[str, object], list[str]]:
    """The ``--json`` object (with ``routing`` when ``replicas``) and the source's notes."""
    from radixcache.analysis.answers import summary
    from radixcache.analysis.whatif import analyse

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:,}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("requests (one pass)", total=None)
        result = analyse(cfg, lambda n: bar.advance(task, n))
    fig = summary(result, at, pool_blocks, bpt)
    if replicas:
        from radixcache.analysis.routing import compare

        fig["routing"] = compare(cfg, routers, replicas, pool_blocks)
    return fig, result.notes


@app.command("whatif", rich_help_panel="Data")
def whatif(
    source: str = typer.Argument(
        ..., metavar="SOURCE", help="sharegpt, a recording (.rcx), or a JSONL trace."),
    block_size: int = typer.Option(16, "--block-size", min=1, max=1024,
                                   help="Tokens per block for token sources."),
    hash_block_size: int = typer.Option(512, "--hash-block-size", min=1,
                                        help="Tokens per hash id of a Mooncake-format trace."),
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N requests (0: all)."),
    at: str = typer.Option("", "--at", help="Extra capacities (tokens), comma-separated."),
    kv_bytes: int = typer.Option(None, "--kv-bytes-per-token", min=1,
                                 help="K+V bytes per token, for the GiB column."),
    model: str = typer.Option(None, "--model",
                              help="Bytes per token of: llama-3-8b, llama-3-70b, qwen2.5-7b."),
    pool_blocks: int = typer.Option(12_500, "--pool-blocks", min=1,
                                    help="Your pool, in blocks of the curve's block size."),
    policies: str = typer.Option("fifo,lfu", "--policies",
                                 help="Replayed at sampled sizes: lru, fifo, lfu, or none."),
    samples: int = typer.Option(6, "--samples", min=1, max=64,
                                help="Capacities each policy is replayed at."),
    plot: Path = typer.Option(None, "--plot", help="Write the chart: FILE.svg or FILE.png."),
    replicas: int = typer.Option(0, "--replicas", min=0, max=64,
                                 help="Also route the trace over N replicas of --pool-blocks."),
    router: str = typer.Option("all", "--router",
                               help="cache_aware, round_robin, power_of_two, random, or all."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The token hit rate of every cache size in one exact pass (LRU), and why requests miss.

    Example: [bold]radixcache whatif sharegpt --block-size 16 --plot curve.svg[/bold]
    """
    from radixcache.analysis.whatif import WhatIfConfig

    cfg = WhatIfConfig(source, block_size, hash_block_size, limit or None,
                       _policies(policies), samples)
    _check_plot_name(plot)
    routers = _routers(router) if replicas else []
    err = Console(stderr=True)
    try:
        fig, notes = _compute(cfg, _ints(at, "--at"), pool_blocks,
                              _bytes_per_token(kv_bytes, model), routers, replicas, err)
        if plot is not None:
            _plot_file(plot, fig)
    except TraceError as exc:  # a bad trace: one line naming the line, exit 1
        raise CliError(str(exc)) from exc
    for note in notes:
        err.print(f"note: {note}", highlight=False)
    if as_json:
        typer.echo(json.dumps(fig))
    else:
        _print_human(fig)


def _print_human(fig: dict[str, object]) -> None:
    out = Console()
    for line in _answers(fig):
        out.print(line)
    out.print(_terminal_plot(fig, out.width, out.is_terminal))
    out.print(_table(fig))
    routing = fig.get("routing")
    if isinstance(routing, dict):
        out.print(_routing_table(routing))


def _routing_table(r: dict[str, object]) -> Table:
    t = Table(title=f"{r['replicas']} replicas x {r['capacity_blocks']:,} blocks "
                    f"(block {r['block_size']}), offline")
    for col in ("router", "hit rate", "imbalance", "duplicated tokens"):
        t.add_column(col, justify="right")
    pol, one = r["policies"], r["shared"]
    assert isinstance(pol, dict) and isinstance(one, dict)
    for name, p in pol.items():
        t.add_row(name, _pct(p["hit_rate"]), f"{p['imbalance']:.2f}",
                  f"{p['duplicated_tokens']:,}")
    t.add_row(f"one shared cache of {one['capacity_blocks']:,}", _pct(one["hit_rate"]), "-", "-")
    return t


@bench_app.command("whatif")
def bench_whatif(
    requests: int = typer.Option(1_000_000, "--requests", min=1,
                                 help="Requests in the generated Mooncake-format trace."),
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N ShareGPT requests."),
    checks: int = typer.Option(8, "--checks", min=1, max=32,
                               help="Capacities replayed to check exactness."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated trace."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The ShareGPT curve at block 16 against one `bench tree` replay, its exactness against
    direct and real-tree replays, and a generated 1M-request Mooncake-format trace.

    Example: [bold]radixcache bench whatif --requests 100000 --json[/bold]
    """
    from radixcache.tools.bench_whatif import run_bench

    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<32}"), BarColumn(),
                  TextColumn("{task.completed:,}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        fig = run_bench(requests, limit or None, checks, seed,
                        lambda label, total: bar.add_task(label, total=total),
                        lambda task, n: bar.advance(task, n))
    if as_json:
        typer.echo(json.dumps(fig))
        return
    from radixcache.tools.bench_whatif import table_rows

    t = Table(title="radixcache bench whatif")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in table_rows(fig):
        t.add_row(k, v)
    Console().print(t)

