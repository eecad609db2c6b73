"""`radixcache bench whatif`: the one-pass curve's speed and exactness, the inspector's
follower, and a generated 1M-request Mooncake-format trace (``radixcache.tools.bench_whatif``)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import bench_app


def _rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        rates = []
    if not rates or any(not 1e-6 <= r < 1 for r in rates):
        raise typer.BadParameter("want rates in [1e-6, 1), comma-separated",
                                 param_hint="--sample")
    return rates


@bench_app.command("whatif")
def bench_whatif(
    requests: int = typer.Option(1_000_000, "--requests", min=1,
                                 help="Requests in the generated Mooncake-format trace."),
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N ShareGPT requests."),
    checks: int = typer.Option(8, "--checks", min=1, max=32,
                               help="Capacities replayed to check exactness."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated trace."),
    scale: int = typer.Option(0, "--scale", min=0, max=10**9,
                              help="Also the scale section: a generated trace of N requests, "
                                   "exact and sampled, in process and from a file (10M: "
                                   "minutes)."),
    sample: str = typer.Option("0.01", "--sample",
                               help="The scale section's sampling rates, comma-separated."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The ShareGPT curve at block 16 against one `bench tree` replay, its exactness against
    direct and real-tree replays, the inspector's follower on that trace's stream, and a
    generated 1M-request Mooncake-format trace.

    Example: [bold]radixcache bench whatif --requests 100000 --json[/bold]
    At scale: [bold]radixcache bench whatif --scale 10000000 --sample 0.01,0.1 --json[/bold]
    """
    from radixcache.tools.bench_whatif import run_bench

    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<32}"), BarColumn(),
                  TextColumn("{task.completed:,}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        fig = run_bench(requests, limit or None, checks, seed,
                        lambda label, total: bar.add_task(label, total=total),
                        lambda task, n: bar.advance(TaskID(task), n),
                        (scale, _rates(sample)) if scale else None)
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
