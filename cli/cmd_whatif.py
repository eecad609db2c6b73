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
from cli.whatif_view import check_plot, plot_file, print_human, write_csv
from radixcache.core.blockrule import MAX_BLOCK_TOKENS
from radixcache.traffic.traces import TraceError

if TYPE_CHECKING:
    from radixcache.analysis.figures import WhatIfFigures
    from radixcache.analysis.policies import EvictionPolicy
    from radixcache.analysis.whatif import WhatIfConfig
    from radixcache.serving.cluster import RoutePolicy as Router


MAX_TOKENS = 2**50  # a capacity or pool beyond a quadrillion tokens is a typo
MAX_BLOCKS = 2**40


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what}: want comma-separated integers, got {text!r}") from None
    if any(not 0 <= v <= MAX_TOKENS for v in vals):
        raise typer.BadParameter(f"{what}: capacities must be in [0, 2^50] tokens")
    return vals


def _policies(text: str) -> tuple[EvictionPolicy, ...]:
    from radixcache.analysis.policies import EvictionPolicy

    if text in ("", "none"):
        return ()
    try:
        got = tuple(EvictionPolicy(p.strip()) for p in text.split(","))
    except ValueError:
        names = ", ".join(p.value for p in EvictionPolicy)
        raise typer.BadParameter(f"choose from {names} (or none)", param_hint="--policy"
                                 ) from None
    try:
        import libcachesim  # noqa: F401
    except ImportError:
        raise typer.BadParameter("needs libCacheSim: pip install 'radixcache[policies]'",
                                 param_hint="--policy") from None
    return got


def _routers(text: str) -> list[Router]:
    from radixcache.serving.cluster import RoutePolicy as Router

    if text == "all":
        return list(Router)
    try:
        return [Router(r.strip()) for r in text.split(",")]
    except ValueError:
        names = ", ".join(r.value for r in Router)
        raise typer.BadParameter(f"--router: choose from {names} (or all)") from None


def _bytes_per_token(kv_bytes: int | None, model: str | None) -> int | None:
    """``--bytes-per-token``, or ``--model``'s: a known name or a model folder's config.json
    (``answers.config_bytes_per_token``)."""
    from radixcache.analysis.answers import MODEL_BYTES_PER_TOKEN, config_bytes_per_token

    if model is None:
        return kv_bytes
    if model in MODEL_BYTES_PER_TOKEN:
        return MODEL_BYTES_PER_TOKEN[model]
    if Path(model).is_dir():
        try:
            return config_bytes_per_token(Path(model))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--model") from None
    raise typer.BadParameter(f"choose from {', '.join(MODEL_BYTES_PER_TOKEN)}, or give a "
                             f"model folder (its config.json)", param_hint="--model")


def _compute(
    cfg: WhatIfConfig, err: Console, *, at: list[int], pool_blocks: int | None,
    bpt: int | None, price: float | None, routers: list[Router], replicas: int,
) -> tuple[WhatIfFigures, list[str]]:
    """The ``--json`` figures (with ``routing`` when ``replicas``) and the source's notes."""
    from radixcache.analysis.answers import summary
    from radixcache.analysis.whatif import analyse, kernels_cached

    if not kernels_cached(cfg):
        typer.echo("note: compiling the trace kernels (numba; once: cached on disk), "
                   "30-60 s", err=True)

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:,}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("requests (one pass)", total=None)
        result = analyse(cfg, lambda n: bar.advance(task, n))
    fig = summary(result, at, pool_blocks, bpt, price)
    if replicas and pool_blocks is not None:
        from radixcache.analysis.routing import compare

        fig.routing = compare(cfg, routers, replicas, pool_blocks)
    return fig, result.notes


@app.command("whatif", rich_help_panel="Data")
def whatif(
    source: str = typer.Argument(
        ..., metavar="SOURCE", help="sharegpt, a recording (.rcx), or a JSONL trace."),
    block_size: int = typer.Option(16, "--block-size", min=1, max=1024,
                                   help="Tokens per block for token sources."),
    hash_block_size: int = typer.Option(512, "--hash-block-size", min=1, max=MAX_BLOCK_TOKENS,
                                        help="Tokens per hash id of a Mooncake-format trace."),
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N requests (0: all)."),
    at: str = typer.Option("", "--at", help="Extra capacities (tokens), comma-separated."),
    kv_bytes: int = typer.Option(None, "--bytes-per-token", "--kv-bytes-per-token", min=1,
                                 max=2**30, help="K+V bytes per token, for the bytes column."),
    model: str = typer.Option(None, "--model", help=(
        "Bytes per token of llama-3-8b, llama-3-70b, qwen2.5-7b, or a model folder "
        "(config.json: 2 x layers x KV heads x head dim x dtype bytes).")),
    price: float = typer.Option(None, "--price-per-gib", min=0.0, max=1e12, help=(
        "Cost of a GiB of KV cache, for a cost column (needs bytes per token).")),
    csv: Path = typer.Option(None, "--csv", help="Also write every capacity to FILE.csv."),
    pool_blocks: int = typer.Option(None, "--pool-blocks", min=1, max=MAX_BLOCKS, help=(
        "Your pool, in blocks of the curve's block size (default: a recording's own).")),
    policies: str = typer.Option("none", "--policy", "--policies", help=(
        "Also replay these (libCacheSim) at --samples sizes, comma-separated: lru, fifo, "
        "lfu, arc, lirs, s3fifo, sieve, tinylfu, clock, twoq, slru, "
        "clockpro.")),
    alignment: bool = typer.Option(False, "--alignment", help=(
        "Token sources: also the block-1 curve (a 2nd pass), for the alignment misses.")),
    sample: float = typer.Option(1.0, "--sample", min=1e-6, max=1.0, help=(
        "Mooncake format: follow this fraction of the blocks (SHARDS; 1: exact) above an "
        "exact pass of the first --exact-depth blocks.")),
    exact_depth: int = typer.Option(None, "--exact-depth", min=0, max=2**30, help=(
        "With --sample: blocks of stack depth answered exactly (default 400/R, at least "
        "65536; 0: the "
        "sample alone).")),
    sample_max: int = typer.Option(None, "--sample-max", "--s-max", min=1, max=2**30, help=(
        "Mooncake format: a fixed-size sample (SHARDS s_max): at most N blocks, its rate "
        "lowered from --sample (default 1) as the trace grows; the JSON's sample_rate is the "
        "final one.")),
    samples: int = typer.Option(6, "--samples", min=1, max=64,
                                help="Capacities each policy is replayed at."),
    plot: Path = typer.Option(None, "--plot", help="Write the chart: FILE.svg or FILE.png."),
    replicas: int = typer.Option(0, "--replicas", min=0, max=64,
                                 help="Also route the trace over N replicas of --pool-blocks "
                                      "(needs it)."),
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
                       _policies(policies), samples, alignment, sample, exact_depth,
                       sample_max)
    bpt = _bytes_per_token(kv_bytes, model)
    if price is not None and bpt is None:
        raise typer.BadParameter("needs --bytes-per-token or --model", param_hint="--price-per-gib")
    _checked_curve(cfg, _ints(at, "--at"), (bpt, price), (plot, csv),
                   (replicas, router, pool_blocks), as_json)


def _checked_curve(cfg: WhatIfConfig, at_caps: list[int], sizes: tuple[int | None, float | None],
                   files: tuple[Path | None, Path | None], routing: tuple[int, str, int | None],
                   as_json: bool) -> None:
    """Every option checked (a usage error, exit 2, before any work), then the curve."""
    replicas, router, pool_blocks = routing
    bpt, price = sizes
    plot, csv = files
    check_plot(plot)
    if cfg.exact_depth is not None and cfg.sample >= 1 and cfg.sample_max is None:
        raise typer.BadParameter("needs --sample (the exact pass is every depth without one)",
                                 param_hint="--exact-depth")
    routers = _routers(router) if replicas else []
    if replicas and pool_blocks is None:
        raise typer.BadParameter("--replicas needs --pool-blocks (each replica's pool)",
                                 param_hint="--replicas")
    _check_source(cfg)
    _curve(cfg, (plot, csv), as_json, partial(
        _compute, at=at_caps, pool_blocks=pool_blocks, bpt=bpt, price=price, routers=routers,
        replicas=replicas))


def _curve(cfg: WhatIfConfig, files: tuple[Path | None, Path | None], as_json: bool,
           compute: Callable[[WhatIfConfig, Console], tuple[WhatIfFigures, list[str]]]) -> None:
    """Compute the curve and show it: the answers and the table, or ``--json``; a bad trace
    is one line naming the line (exit 1). The plot is written last: a file that cannot be
    written loses none of the answers."""
    err = Console(stderr=True)
    try:
        fig, notes = compute(cfg, err)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    for note in notes:
        typer.echo(f"note: {note}", err=True)  # one line: Rich wrapped it at 80 columns
    if as_json:
        from radixcache.analysis.figures import as_json as json_line

        typer.echo(json_line(fig))
    else:
        print_human(fig)
    plot, csv = files
    if csv is not None:  # after the answers: a file that cannot be written loses nothing
        write_csv(csv, fig)
    if plot is not None:
        plot_file(plot, fig)


def _check_source(cfg: WhatIfConfig) -> None:
    """Options that only some sources take, refused before any work (the format is told by
    the first line, which also refuses a FIFO, a device or a file that is not JSON)."""
    from radixcache.traffic.traces import TraceFormat, detect_format

    try:
        fmt = detect_format(cfg.source)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    if (cfg.sample < 1.0 or cfg.sample_max is not None) and fmt is not TraceFormat.MOONCAKE:
        raise typer.BadParameter(f"{cfg.source}: sampling needs a Mooncake-format trace "
                                 f"(this is {fmt.value})", param_hint="--sample")


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
        typer.echo(f"note: {note}", err=True)
    if as_json:
        typer.echo(json.dumps({"source": source, "why": [why_record(follower, r) for r in reqs]}))
        return
    for r in reqs:
        for line in describe(follower.misses, r, follower.error):
            typer.echo(line.text)
