"""`radixcache bench events`: the event stream's figures, the every-batch digest check with
drops, the hostile-peer run and the fan-in of several streams (harnesses in
radixcache/tools)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.app import bench_app

if TYPE_CHECKING:  # the harnesses import torch: imported when the command runs
    from radixcache.tools.bench_events import BenchResult

console = Console()


@bench_app.command("events")
def bench_events(
    requests: int = typer.Option(20_000, min=1, max=10**7, help="Requests the tree driver runs."),
    per_step: int = typer.Option(16, min=1, max=4096, help="Requests per engine step (batch)."),
    late_join_nodes: int = typer.Option(100_000, min=1, max=10_000_000,
                                         help="Tree size for the late-join test."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    drop: float = typer.Option(0.0, min=0.0, max=0.99, help="With --verify-every-batch: the "
                               "fraction of batches lost on the way to the subscriber (a "
                               "deterministic hash of the seq picks them)."),
    verify_every_batch: bool = typer.Option(False, help="Instead of the figures above: publish "
                                            "until --min-events, lose --drop of the batches on "
                                            "the way to the subscriber, and compare the mirror "
                                            "digest with the tree's after every applied batch."),
    min_events: int = typer.Option(1_000_000, min=1, max=10**9,
                                    help="With --verify-every-batch: events to run."),
    publishers: int = typer.Option(1, min=1, max=64, help="Instead of the figures above: N "
                                   "engine streams followed by one process (fan-in)."),
) -> None:
    """Events/s from a tree driver to a mirror in another process, and what publishing costs.

    Measures the stream, not the model: the driver runs chat requests (prompt + forced
    answer) through the radix tree with no model (``TreeSource``), as fast as the tree goes.

    Example: radixcache bench events --drop 0.01 --verify-every-batch --json"""
    from radixcache.tools.bench_events import run_bench, verify_drops  # torch: imported here
    from radixcache.tools.bench_hostile import hostile_rows, run_hostile

    if publishers > 1:
        _bench_fanin(publishers, as_json)
        return
    if verify_every_batch:
        checked = verify_drops(min_events, drop, per_step)
        if as_json:
            typer.echo(json.dumps(checked._asdict()))
        else:
            console.print(checked)
        if checked.batches_digest_equal != checked.batches_checked:
            raise typer.Exit(1)
        return
    with Progress(console=console, disable=as_json, transient=True) as progress:
        result = run_bench(requests, per_step, late_join_nodes, progress)
        progress.add_task("hostile peer: a clean run, then a hostile one", total=None)
        hostile = run_hostile()
    if as_json:
        typer.echo(json.dumps({**result._asdict(), "hostile": hostile._asdict()}))
    else:
        table = _bench_table(result)
        for row in hostile_rows(hostile):
            table.add_row(*row)
        console.print(table)


def _bench_table(r: BenchResult) -> Table:
    t = Table(title="bench events")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("events", f"{r.events:,}"),
        ("events/s engine -> mirror (other process)", f"{r.events_per_s:,.0f}"),
        ("lost / recovered by replay", f"{r.lost} / {r.recovered}"),
        ("digest equal at the end", str(r.digest_equal)),
        ("publishing / tree-op time", f"{r.publish_overhead:.1%}"),
        ("events on vs off (tree + publish)", f"{r.events_overhead:+.1%}"),
        ("tree driver events/s", f"{r.driver_events_per_s:,.0f}"),
        (f"late join of {r.late_join_nodes:,} nodes", f"{r.late_join_seconds:.3f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _bench_fanin(publishers: int, as_json: bool) -> None:
    from radixcache.tools.bench_fanin import run_fanin

    with Progress(console=console, disable=as_json, transient=True) as progress:
        task = progress.add_task("fan-in", total=None)
        r = run_fanin(publishers, progress=lambda what: progress.update(task, description=what))
    if as_json:
        typer.echo(json.dumps(r._asdict()))
        return
    t = Table(title=f"bench events: {publishers} streams into one process")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in (("events (all streams)", f"{r.events:,}"),
                 ("events/s arriving in total", f"{r.events_per_s:,.0f}"),
                 ("batches lost", str(r.lost)),
                 ("mirrors with the engine's digest", f"{r.digests_equal} of {r.publishers}"),
                 ("resyncs", str(r.resyncs)), ("seconds", f"{r.seconds:.2f}")):
        t.add_row(k, v)
    console.print(t)
