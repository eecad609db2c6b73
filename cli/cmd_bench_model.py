"""`radixcache bench model`: a checkpoint on the radix cache against transformers' generate
(``radixcache.tools.bench_model``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
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
from cli.bounds import MAX_THREADS

if TYPE_CHECKING:  # radixcache.tools.bench_model imports torch: imported where used
    from radixcache.tools.bench_model import ModelReport, TurnFigures

console = Console(stderr=True)


def _table(r: ModelReport) -> Table:
    t = Table(title=f"bench model: {r.model} ({r.layers} layers), {r.requests} chat "
                    f"requests, answers <= {r.max_tokens} tokens ({r.history} history), "
                    f"{r.threads} threads")
    for col in ("turn", "figure", "radixcache", "transformers"):
        t.add_column(col, justify="right" if col != "figure" else "left")

    def cells(f: TurnFigures | None) -> tuple[str, ...]:
        if f is None:
            return ("",) * len(_TURN_KEYS)
        return tuple(str(v) for v in (f.ttft_p50_ms, f.ttft_p99_ms, f.prefill_tokens_per_s,
                                      f.decode_tokens_per_s))

    for turn, figs in r.engine.items():
        for key, ours, theirs in zip(_TURN_KEYS, cells(figs), cells(r.transformers.get(turn)),
                                     strict=True):
            t.add_row(turn, key, ours, theirs)
    t.add_row("all", "requests/s (transformers: padded batches of 16)",
              str(r.engine_requests_per_s), str(r.transformers_padded16_requests_per_s))
    return t


_TURN_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "prefill_tokens_per_s", "decode_tokens_per_s")


@bench_app.command("model")
def bench_model(
    conversations: int = typer.Option(4, min=1, max=1000, help="Chat conversations."),
    max_tokens: int = typer.Option(16, min=2, max=4096, help="Answer tokens at most."),
    layers: int = typer.Option(30, min=1, max=30, help="Layers of the random checkpoint "
                               "(SmolLM2-135M has 30)."),
    model: Path | None = typer.Option(None, help="A Llama/Qwen folder instead of the random "
                                      "SmolLM2-shaped one."),
    threads: int = typer.Option(1, min=1, max=MAX_THREADS, help="torch CPU threads (both)."),
    history: str = typer.Option("served", help="Later turns' prompts: 'served' holds the "
                                "answers as cut to --max-tokens, as a client sends them; "
                                "'trace' the trace's whole recorded answers."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead."),
) -> None:
    """A random checkpoint with SmolLM2-135M's shapes on the radix cache against
    transformers' generate, on the multi-turn chat workload: TTFT, prefill and decode tokens/s
    per turn, requests/s.

    The config is written locally (nothing downloaded); the same prompts on both sides:
    TTFT p50/p99 and prefill/decode tokens/s per turn at batch 1 (requests alternated), and
    requests/s on the whole workload (transformers in padded batches of 16). Needs
    transformers.

    Example: radixcache bench model --conversations 4 --max-tokens 16
    """
    import torch

    from radixcache.tools.bench_model import HISTORIES, run_bench, write_checkpoint

    if history not in HISTORIES:
        raise typer.BadParameter(f"{history!r}: one of {', '.join(HISTORIES)}",
                                 param_hint="--history")

    torch.set_num_threads(threads)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="rc-bench-model-") as tmp, \
            Progress(*columns, console=console, transient=True) as bar:
        folder = model
        if folder is None:
            folder = Path(tmp)
            write_checkpoint(folder, layers)
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done)

        report = run_bench(folder, conversations, max_tokens, progress, history=history)
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(report)))
    else:
        Console().print(_table(report))
