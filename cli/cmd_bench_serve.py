"""`radixcache bench serve`: the chat workload through HTTP beside the same workload in
process (harness in radixcache/tools/bench_serve.py)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import bench_app
from cli.bounds import MAX_BLOCKS

err_console = Console(stderr=True)


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise typer.BadParameter(f"not a comma-separated list of numbers: {text!r}",
                                 param_hint="--rates") from None
    if not rates or any(not 0 < r <= 10_000 for r in rates):
        raise typer.BadParameter("each rate must be in (0, 10000] requests/s",
                                 param_hint="--rates")
    return rates


@bench_app.command("serve")
def bench_serve(
    rates: str = typer.Option("5,20,60", help="Requests/s of each pass, comma-separated."),
    seconds: float = typer.Option(10.0, min=0.05, max=3600.0,
                                  help="Each pass sends rate x seconds requests."),
    max_tokens: int = typer.Option(32, min=1, max=4096, help="Answer length cap."),
    blocks: int = typer.Option(4096, min=16, max=MAX_BLOCKS, help="KV pool blocks (of 16)."),
    step_tokens: int = typer.Option(256, min=16, max=1 << 20,
                                     help="The engine's tokens per step (prefill chunk "
                                     "budget), both ways."),
    front_process: bool = typer.Option(True, "--front-process/--front-thread",
                                       help="Run the server's HTTP front in a process of its "
                                       "own (`serve`'s default), or in a thread of the "
                                       "engine's process (`serve --front-thread`)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead."),
) -> None:
    """The chat workload through `serve --http` (a child process, streaming HTTP clients)
    beside the same workload in process, at each rate and at saturation: TTFT and
    inter-token latency p50/p99, requests/s, CPU seconds per request.

    Saturation sends the largest pass's requests at once. HTTP CPU seconds are the server
    process's; in process, this process's.

    Example: radixcache bench serve --seconds 5 --json"""
    from radixcache.tools import bench_serve as bs

    cfg = bs.BenchServeConfig(_rates(rates), seconds, max_tokens, blocks,
                              step_tokens=step_tokens, front_process=front_process)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)  # type: ignore[arg-type]

        try:
            out = bs.run(cfg, progress)
        except RuntimeError as exc:
            err_console.print(f"error: {exc}", highlight=False)
            raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(out))
        return
    _print_table(out)


def _print_table(out: dict[str, object]) -> None:
    load = out["load_average"]
    t = Table(title=f"bench serve: chat, max_tokens {out['max_tokens']}, step tokens "
              f"{out['step_tokens']}, load average {load} (latencies in ms)")
    for col in ("rate/s", "path", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "req/s",
                "CPU s/req", "client CPU s/req", "failed"):
        t.add_column(col, justify="right")
    rows = [(f"{r['rate']:g}", r) for r in out["rates"]]  # type: ignore[attr-defined]
    rows.append(("saturated", out["saturated"]))
    for label, row in rows:
        for path in ("http", "in_process"):
            f = row[path]
            t.add_row(label, "HTTP" if path == "http" else "in proc", *(
                str(f.get(k, "-")) for k in (
                    "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "requests_per_s",
                    "cpu_s_per_request", "client_cpu_s_per_request", "failed")))
    Console().print(t)
