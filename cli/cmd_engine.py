"""`radixcache bench engine` (one workload served with the cache on and off) and the GPU check
that `radixcache doctor --gpu` runs."""

from __future__ import annotations

import json
import sys
from functools import partial
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cli.app import bench_app
from cli.bounds import MAX_BLOCKS
from cli.options import DTYPE_HELP, KV_MEMORY_HELP, ModelSize, check_kv_memory
from radixcache.tools.demo import DEFAULT_MIX
from radixcache.traffic.workloads import WorkloadError, build_workload

if TYPE_CHECKING:  # the engine and the GPU check import torch: imported in the commands
    pass

console = Console(stderr=True)


def _print_table(r: dict[str, float | int | str | bool]) -> None:
    t = Table(title=f"bench engine: {r['workload']}, {r['requests']} requests on {r['device']}")
    for col in ("", "cache on", "cache off", "off / on"):
        t.add_column(col, justify="right")
    t.add_row("prefill tokens computed", str(r["prefill_tokens_on"]), str(r["prefill_tokens_off"]),
              f"-{float(r['prefill_reduction']):.1%} (hit rate {float(r['hit_rate']):.1%})")
    t.add_row("TTFT p50 ms", str(r["ttft_p50_on_ms"]), str(r["ttft_p50_off_ms"]),
              f"{r['ttft_p50_ratio_off_on']}x")
    t.add_row("TTFT p99 ms", str(r["ttft_p99_on_ms"]), str(r["ttft_p99_off_ms"]),
              f"{r['ttft_p99_ratio_off_on']}x")
    t.add_row("decode tokens/s", str(r["decode_tokens_per_s_on"]),
              str(r["decode_tokens_per_s_off"]), "")
    t.add_row("wall s", str(r["wall_s_on"]), str(r["wall_s_off"]), "")
    Console().print(t)


@bench_app.command("engine")
def bench_engine(
    workload: str = typer.Option("chat", help="Workload name (chat, system, tot, fork, flood)."),
    requests: int | None = typer.Option(None, min=1, help="Serve only the first N requests."),
    blocks: int = typer.Option(4096, min=16, max=MAX_BLOCKS,
                               help="KV pool blocks (of 16 tokens); with --schedule "
                               "the demo's 2048 unless given."),
    step_tokens: int = typer.Option(512, min=16, max=1 << 20,
                                     help="Tokens per scheduler step (prefill budget)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead."),
    schedule: str | None = typer.Option(None, help="Compare scheduling policies instead, "
                                        "comma-separated (fcfs,lpm,dfs-weight), on the demo's "
                                        "mix as the demo sends it."),
    mix: str = typer.Option(",".join(DEFAULT_MIX), help="With --schedule: the workloads."),
    rounds: int = typer.Option(4, min=1, help="With --schedule: rounds of the mix."),
    interval: float = typer.Option(0.7, min=0.0, help="With --schedule: seconds between two "
                                   "workloads (the demo's pace)."),
    repeat: int = typer.Option(1, min=1, max=100, help="With --schedule: passes of each "
                               "policy, alternated; each figure is their median."),
    model: str | None = typer.Option(None, help="A local Hugging Face model folder to serve "
                                     "instead of the seeded model (without --schedule)."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_memory: str | None = typer.Option(None, help="Without --schedule: " + KV_MEMORY_HELP,
                                         callback=check_kv_memory),
    section: str | None = typer.Option(None, help="memory: ShareGPT requests (1,100 unless "
                                       "--requests) submitted at once with --max-tokens, each "
                                       "ending at its recorded answer length, on a 2,048-block "
                                       "pool (unless --blocks), under --reserve full and grow."),
    max_tokens: int = typer.Option(2000, min=1, max=1 << 20,
                                   help="With --section memory: each request's max_tokens."),
    prompts: str = typer.Option("first", help="With --section memory: first (each "
                                "conversation's first turn, as serving benchmarks sample "
                                "ShareGPT) or trace (the trace's requests, later turns with "
                                "their conversation so far)."),
) -> None:
    """Serve one workload with the cache on, then off; compare prefill work, TTFT, decode rate.
    With --schedule: the demo's mix under each scheduling policy (hit rate against the
    what-if curve, in-flight misses, queue wait, TTFT, throughput, equal outputs)."""
    if kv_memory is not None and (schedule is not None or section is not None):
        given = "--schedule" if schedule is not None else "--section"
        raise typer.BadParameter("sizes the pool of the cache on/off comparison: give "
                                 f"--blocks with {given}", param_hint="--kv-memory")
    if section is not None:
        if section != "memory":
            raise typer.BadParameter(f"unknown section {section!r} (memory)",
                                     param_hint="--section")
        _memory(requests or 1100, blocks if _given("--blocks") else 2048, max_tokens,
                step_tokens, as_json, prompts)
    elif schedule is not None:
        from cli.bench_schedule import bench_schedule

        bench_schedule(schedule, mix, rounds, interval,
                       blocks if _given("--blocks") else 2048, as_json, repeat)
    else:
        if kv_memory is not None:
            blocks = _kv_blocks(model, dtype, kv_memory)
        _cache_on_off(workload, requests, blocks, step_tokens, as_json, model, dtype)


def _kv_blocks(model: str | None, dtype: str, kv_memory: str) -> int:
    """The blocks ``--kv-memory`` holds for this model (``cli.options.engine_config``); a
    folder it cannot serve or a fraction without a GPU exits 2 with one line."""
    from cli.options import engine_config
    from radixcache.serving.engine import Answers

    try:
        return engine_config(model or ModelSize.DEFAULT.value, 16, None, 1, Answers.DECODE,
                             dtype=dtype, kv_memory=kv_memory).num_blocks
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _cache_on_off(workload: str, requests: int | None, blocks: int, step_tokens: int,
                  as_json: bool, model: str | None = None, dtype: str = "auto") -> None:
    """The workload with the cache on, then off (``bench engine`` without --schedule)."""
    import torch

    from radixcache.serving.checkpoint import Checkpoint
    from radixcache.serving.engine import EngineConfig
    from radixcache.tools.bench_engine import report as make_report
    from radixcache.tools.bench_engine import serve_pass

    torch.set_num_threads(1)  # measured faster than 2 threads for this model size
    try:
        w = build_workload(workload, [])
    except WorkloadError as err:  # a usage error, in one line as the others
        raise typer.BadParameter(str(err), param_hint="--workload") from None
    limit = len(w.requests) if requests is None else max(0, min(requests, len(w.requests)))
    figures = []
    for cache in (True, False):
        cfg = EngineConfig(num_blocks=blocks, cache=cache, max_step_tokens=step_tokens,
                           record_events=False,
                           checkpoint=None if model is None else Checkpoint(model, dtype))
        columns = (TextColumn(f"cache {'on' if cache else 'off'}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("requests", total=limit)
            figures.append(serve_pass(w, limit, cfg, partial(_completed, bar, task)))
    report = make_report(workload, *figures)
    if as_json:
        typer.echo(json.dumps(report))
    else:
        _print_table(report)


def _memory(requests: int, blocks: int, max_tokens: int, step_tokens: int,
            as_json: bool, prompts: str = "first") -> None:
    """``bench engine --section memory``: the same requests under both reserve rules."""
    import torch

    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.reserve import Reserve
    from radixcache.tools.bench_engine import memory_pass, memory_report, memory_requests
    from radixcache.traffic.sharegpt_text import DatasetUnavailable

    torch.set_num_threads(1)
    try:
        reqs = memory_requests(requests, prompts)
    except DatasetUnavailable as err:
        typer.echo(f"bench engine --section memory: {err}", err=True)
        raise typer.Exit(1) from None
    except ValueError as err:  # memory_requests names the choices
        raise typer.BadParameter(str(err), param_hint="--prompts") from None
    figures = []
    for reserve in (Reserve.FULL, Reserve.GROW):
        cfg = EngineConfig(num_blocks=blocks, max_step_tokens=step_tokens, record_events=False,
                           max_running=len(reqs), reserve=reserve)
        columns = (TextColumn(f"reserve {reserve.value}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("requests", total=len(reqs))
            figures.append(memory_pass(reqs, max_tokens, cfg, partial(_completed, bar, task)))
    report = memory_report(*figures, blocks=blocks, max_tokens=max_tokens, prompts=prompts)
    if as_json:
        typer.echo(json.dumps(report))
        return
    mem = report["memory"]
    assert isinstance(mem, dict)
    t = Table(title=f"bench engine --section memory: {len(reqs)} ShareGPT requests "
              f"({prompts} prompts), max_tokens {max_tokens}, {blocks} blocks")
    for col in ("", "reserve full", "reserve grow"):
        t.add_column(col, justify="right")
    for key in ("running_mean", "written_over_held", "retractions", "retracted_tokens_from_tree",
                "retracted_tokens_recomputed", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99",
                "failed", "outputs_equal", "wall_s"):
        t.add_row(key, str(mem["full"][key]), str(mem["grow"][key]))
    Console().print(t)


def _given(option: str) -> bool:
    """True when ``option`` is on the command line (its default differs by mode)."""
    return any(a == option or a.startswith(option + "=") for a in sys.argv)


def gpu_doctor(as_json: bool) -> None:
    """`doctor --gpu`: exit 1 with "CUDA unavailable: <reason>" without CUDA, else run the GPU
    check and exit 1 when reuse equality failed on the device."""
    from radixcache.tools.gpucheck import EQUAL_ATOL, cuda_unavailable, run_gpu_check

    reason = cuda_unavailable()
    if reason is not None:
        typer.echo(f"CUDA unavailable: {reason}")
        raise typer.Exit(1)
    report = run_gpu_check(lambda step: console.print(f"[dim]gpu check: {step}[/dim]"))
    values = {**report._asdict(), "ok": report.ok, "equal_atol": EQUAL_ATOL}
    if as_json:
        typer.echo(json.dumps(values))
    else:
        table = Table(title="radixcache doctor --gpu", show_header=False)
        table.add_column("figure", style="bold")
        table.add_column("value")
        for key, value in values.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        Console().print(table)
    if not report.ok:
        raise typer.Exit(1)


def _completed(bar: Progress, task: TaskID, done: int, _total: int) -> None:
    bar.update(task, completed=done)
