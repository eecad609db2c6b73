"""`radixcache soak`: an engine under mixed load, checked against its event stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import app
from cli.bounds import MAX_BLOCKS, MAX_THREADS, WEEK_S

if TYPE_CHECKING:  # radixcache.tools.soak imports torch (via the engine): imported when run
    from radixcache.tools.soak import SoakConfig, SoakReport, SoakStatus

console = Console(stderr=True)


def run_soak(cfg: SoakConfig, progress: Callable[[SoakStatus], None]) -> SoakReport:
    """``radixcache.tools.soak.run_soak``, imported only when a soak runs (tests replace this)."""
    from radixcache.tools.soak import run_soak as run

    return run(cfg, progress)


def _table(r: SoakReport) -> Table:
    table = Table(title="soak", show_header=False)
    for name, value in r._asdict().items():
        if name != "violations":
            table.add_row(name, f"{value:.3f}" if isinstance(value, float) else f"{value:,}")
    table.add_row("violations", str(len(r.violations)))
    return table


@app.command()
def soak(
    minutes: float = typer.Option(0.0, min=0.0, max=WEEK_S / 60, help="Soak this many minutes."),
    seconds: float = typer.Option(0.0, min=0.0, max=WEEK_S,
                                 help="Soak this many seconds (short runs)."),
    blocks: int = typer.Option(160, min=16, max=MAX_BLOCKS,
                              help="KV pool blocks (small, so eviction happens)."),
    threads: int = typer.Option(3, min=1, max=MAX_THREADS, help="Submitter threads."),
    check_every: float = typer.Option(1.0, min=0.01, max=WEEK_S,
                                     help="Seconds between tree.check + digest compare."),
    seed: int = typer.Option(0, help="Seed of the workload mix."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Mixed workloads from several threads on a small pool; exit 1 on any violation."""
    total = minutes * 60 + seconds
    if total <= 0:
        raise typer.BadParameter("give --minutes or --seconds (> 0)", param_hint="--minutes")
    from radixcache.tools.soak import SoakConfig

    cfg = SoakConfig(seconds=total, num_blocks=blocks, threads=threads,
                     check_every_s=check_every, seed=seed)
    columns = (TextColumn("soak"), BarColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task("", total=total)

        def progress(s: SoakStatus) -> None:
            bar.update(task, completed=min(s.elapsed, total),
                       description=f"{s.requests:,} req {s.events:,} ev {s.checks} checks "
                                   f"{s.violations} violations")

        report = run_soak(cfg, progress)
    if json_out:
        out = report._asdict()
        out["violation_details"] = out.pop("violations")
        out["violations"] = len(report.violations)
        typer.echo(json.dumps(out))
    else:
        console.print(_table(report))
        for v in report.violations:
            console.print(f"[red]violation:[/] {v}")
    if report.violations or report.final_locks or report.final_request_blocks:
        raise typer.Exit(1)
