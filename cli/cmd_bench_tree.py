"""`radixcache bench tree`: the ShareGPT trace through the tree and two baseline policies."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import bench_app
from radixcache.tools.baselines import replay_block_hash
from radixcache.traffic.sharegpt import DatasetUnavailable, Trace, load_trace

if TYPE_CHECKING:  # radixcache.tools.benchtree imports torch (via the pool): imported where used
    from radixcache.tools.benchtree import Request, TreeBenchConfig, TreeFigures, TreeRun


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _run(bar: Progress, label: str, reqs: list[Request], cfg: TreeBenchConfig) -> TreeRun:
    from radixcache.tools.benchtree import replay_tree

    task = bar.add_task(label, total=len(reqs))
    return replay_tree(reqs, cfg, lambda n: bar.advance(task, n))


def _table(fig: TreeFigures, on_runs: list[float], off_runs: list[float]) -> Table:
    t = Table(title="radixcache bench tree (ShareGPT multi-turn trace)", show_lines=False)
    t.add_column("figure")
    t.add_column("value", justify="right")

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.2f}%"

    def runs(all_runs: list[float]) -> str:
        if len(all_runs) < 2:
            return ""
        return f" (best of {', '.join(f'{s:.2f}' for s in all_runs)})"

    rows: list[tuple[str, str]] = [
        ("requests", f"{fig.requests:,}"),
        ("prompt tokens", f"{fig.prompt_tokens:,}"),
        ("token hit rate (tree)", pct(fig.hit_rate)),
        ("hit rate, same tree at block size 1", pct(fig.hit_rate_block_size_1)),
        ("hit rate, page-aligned matching", pct(fig.hit_rate_page_aligned)),
        ("hit rate, full-block hashing", pct(fig.hit_rate_block_hash)),
    ]
    for op, (mean, p99) in fig.op_us().items():
        rows.append((f"{op} us mean / p99", f"{mean:.2f} / {p99:.2f}"))
    bpt = fig.bytes_per_cached_token
    rows += [
        ("tree-op seconds (events on)", f"{fig.tree_op_seconds:.3f}{runs(on_runs)}"),
        ("tree-op seconds (events off)",
         f"{fig.tree_op_seconds_events_off:.3f}{runs(off_runs)}"),
        ("event overhead", pct(fig.event_overhead)),
        ("events", f"{fig.events:,}"),
        ("tokens evicted", f"{fig.tokens_evicted:,}"),
        ("splits / merges / extends", f"{fig.splits:,} / {fig.merges:,} / {fig.extends:,}"),
        ("COW copies / slots copied", f"{fig.cow_copies:,} / {fig.slots_copied:,}"),
        ("metadata bytes per cached token", "--memory" if bpt is None else f"{bpt:.2f}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


@bench_app.command("tree")
def bench_tree(
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N requests (0: all)."),
    block_size: int = typer.Option(16, "--block-size", min=1, max=1024, help="Tokens per block."),
    capacity: int = typer.Option(200_000, "--capacity", min=1, help="Token slots in the pool."),
    high: float = typer.Option(1.0, "--high", min=0.01, max=1.0, help="High watermark."),
    low: float = typer.Option(1.0, "--low", min=0.01, max=1.0, help="Low watermark."),
    memory: bool = typer.Option(False, "--memory", help="Measure metadata bytes (tracemalloc)."),
    repeat: int = typer.Option(
        3, "--repeat", min=1, max=20,
        help="Replays of the tree with events on and off each (interleaved); the fastest counts.",
    ),
    block1: bool = typer.Option(
        True, "--block1/--no-block1", help="Also replay the same tree at block size 1."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay the ShareGPT multi-turn trace through the tree and two baselines.

    Example: [bold]radixcache bench tree --limit 20000 --json[/bold]
    """
    if low > high:
        raise typer.BadParameter(f"--low {low} must not exceed --high {high}")
    from radixcache.tools.benchtree import BlockOne, Memory, TreeBenchConfig, bench_runs, figures

    console = Console(stderr=True)
    trace = _load(console, limit)
    reqs: list[Request] = [(r.prompt, r.output) for r in trace.requests]
    with _progress(console) as bar:
        def block_hash() -> float:
            task = bar.add_task("full-block hashing", total=len(reqs))
            ticked = iter_progress(reqs, lambda: bar.advance(task))
            return replay_block_hash(ticked, capacity, block_size).hit_rate

        runs = bench_runs(reqs, TreeBenchConfig(block_size, capacity, high, low),
                          lambda label, cfg: _run(bar, label, reqs, cfg), repeat=repeat,
                          block1=BlockOne.ALSO if block1 else BlockOne.SKIP,
                          memory=Memory.MEASURE if memory else Memory.SKIP, block_hash=block_hash)
    fig = figures(runs.on, runs.off, runs.aligned, runs.block_hash_rate, runs.block1)
    on_runs = [r.times.total_seconds() for r in runs.ons]
    off_runs = [r.times.total_seconds() for r in runs.offs]
    if as_json:  # the figures' keys, then how many replays and each one's seconds
        typer.echo(json.dumps({**msgspec.structs.asdict(fig), "repeat": repeat,
                               "tree_op_seconds_runs": on_runs,
                               "tree_op_seconds_events_off_runs": off_runs}))
    else:
        Console().print(_table(fig, on_runs, off_runs))


def _load(console: Console, limit: int) -> Trace:
    """The ShareGPT trace (its first ``limit`` requests); exit 1 with the reason when the
    dataset is not installed; say where the packaged file is cut."""
    try:
        with console.status("loading the ShareGPT trace"):
            trace = load_trace(limit or None)
    except DatasetUnavailable as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    if trace.truncated_at is not None:
        console.print(f"dataset cut at byte {trace.truncated_at:,}:"
                      f" {trace.records_decoded:,} complete records used")
    return trace


def iter_progress(reqs: list[Request], tick: Callable[[], None]) -> Iterator[Request]:
    """Yield the requests, ticking the progress bar for each."""
    for r in reqs:
        tick()
        yield r
