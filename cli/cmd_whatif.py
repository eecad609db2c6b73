"""`radixcache whatif SOURCE`: the hit rate of every cache size in one pass, and why requests
miss (shown by ``cli.whatif_view``; `bench whatif` is ``cli.cmd_bench_whatif``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cli.app import CliError, app
from cli.whatif_view import check_plot_name, plot_file, print_human
from radixcache.traffic.traces import TraceError

if TYPE_CHECKING:
    from radixcache.analysis.replay import Policy
    from radixcache.analysis.whatif import WhatIfConfig
    from radixcache.serving.cluster import Policy as Router


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
    from radixcache.serving.cluster import Policy as Router

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


def _compute(
    cfg: WhatIfConfig, err: Console, *, at: list[int], pool_blocks: int, bpt: int | None,
    routers: list[Router], replicas: int,
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
    why: list[int] | None = typer.Option(None, "--why", min=0,
                                         help="With a recording: why request REQ missed "
                                              "(repeatable), instead of the curve."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The token hit rate of every cache size in one exact pass (LRU), and why requests miss.

    Example: [bold]radixcache whatif sharegpt --block-size 16 --plot curve.svg[/bold]
    Why one request of a recording missed: [bold]radixcache whatif run.rcx --why 212[/bold]
    """
    from radixcache.analysis.whatif import WhatIfConfig

    if why:
        _why(source, why, as_json)
        return

    cfg = WhatIfConfig(source, block_size, hash_block_size, limit or None,
                       _policies(policies), samples)
    check_plot_name(plot)
    routers = _routers(router) if replicas else []
    _curve(cfg, plot, as_json, partial(_compute, at=_ints(at, "--at"), pool_blocks=pool_blocks,
                                       bpt=_bytes_per_token(kv_bytes, model), routers=routers,
                                       replicas=replicas))


def _curve(cfg: WhatIfConfig, plot: Path | None, as_json: bool,
           compute: Callable[[WhatIfConfig, Console], tuple[dict[str, object], list[str]]]) -> None:
    """Compute the curve and show it: the answers and the table, or ``--json``; a bad trace
    is one line naming the line (exit 1)."""
    err = Console(stderr=True)
    try:
        fig, notes = compute(cfg, err)
        if plot is not None:
            plot_file(plot, fig)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    for note in notes:
        err.print(f"note: {note}", highlight=False)
    if as_json:
        typer.echo(json.dumps(fig))
    else:
        print_human(fig)


def _why(source: str, reqs: list[int], as_json: bool) -> None:
    """``--why``: follow the recording as the inspector would, explain each request."""
    from radixcache.analysis.follow import follow_recording, why_record
    from radixcache.analysis.misses import describe
    from radixcache.traffic.traces import TraceFormat, detect_format

    try:
        if detect_format(source) is not TraceFormat.RECORDING:
            raise typer.BadParameter(f"{source}: --why needs a recording (.rcx)",
                                     param_hint="--why")
        follower, note = follow_recording(Path(source))
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    if note is not None:
        Console(stderr=True).print(f"note: {note}", highlight=False)
    if as_json:
        typer.echo(json.dumps({"source": source, "why": [why_record(follower, r) for r in reqs]}))
        return
    for r in reqs:
        for line in describe(follower.misses, r, follower.error):
            typer.echo(line.text)
