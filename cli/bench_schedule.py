"""`radixcache bench engine --schedule ...`: the demo's mix under each scheduling policy
(the harness is ``radixcache.tools.bench_schedule``)."""

from __future__ import annotations

import json
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

from radixcache.serving.policy import SchedulePolicy

if TYPE_CHECKING:
    from radixcache.tools.bench_schedule import PolicyFigures

console = Console(stderr=True)

ROWS = (("hit rate", "hit_rate", "{:.2%}"), ("curve at the pool", "curve_hit_rate", "{:.2%}"),
        ("in-flight tokens", "in_flight_tokens", "{:,}"),
        ("queue wait p50 ms", "queue_wait_ms_p50", "{:.1f}"),
        ("queue wait p99 ms", "queue_wait_ms_p99", "{:.1f}"),
        ("TTFT p50 ms", "ttft_ms_p50", "{:.1f}"), ("TTFT p99 ms", "ttft_ms_p99", "{:.1f}"),
        ("requests/s", "requests_per_s", "{:.2f}"),
        ("requests/CPU s", "requests_per_cpu_s", "{:.2f}"),
        ("outputs equal", "outputs_equal", "{}"),
        ("held for sharing", "held_for_sharing", "{:,}"),
        ("shared in forward", "shared_in_forward", "{:,}"), ("aged", "aged", "{:,}"))


def _completed(bar: Progress, task: TaskID, done: int, _total: int) -> None:
    bar.update(task, completed=done)


def _policies(words: str) -> list[SchedulePolicy]:
    try:
        out = [SchedulePolicy.parse(w.strip()) for w in words.split(",") if w.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--schedule") from None
    if not out:
        raise typer.BadParameter("name at least one policy", param_hint="--schedule")
    return out


def bench_schedule(schedule: str, mix: str, rounds: int, interval: float, blocks: int,
                   as_json: bool, repeat: int = 1) -> None:
    """Run the mix under each policy of ``schedule`` (``repeat`` passes each, alternated) and
    print the table or the JSON."""
    policies = _policies(schedule)
    lines = [part.strip() for part in mix.split(",") if part.strip()]
    import torch

    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.model import tiny_model
    from radixcache.tools.bench_schedule import (
        combined,
        mix_workloads,
        pass_order,
        policy_pass,
        report,
    )
    from radixcache.traffic.workloads import WorkloadError

    torch.set_num_threads(1)
    try:
        workloads = mix_workloads(lines, rounds)
    except WorkloadError as err:
        raise typer.BadParameter(str(err), param_hint="--mix") from None
    total = sum(len(w.requests) for w in workloads)
    figures: dict[SchedulePolicy, list[PolicyFigures]] = {p: [] for p in policies}
    for k, p in enumerate(pass_order(policies, repeat)):
        cfg = EngineConfig(num_blocks=blocks, model=tiny_model(), schedule=p)
        label = f"{p.value:<10}" + (f" {k // len(policies) + 1}/{repeat}" if repeat > 1 else "")
        columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("requests", total=total)
            figures[p].append(policy_pass(workloads, interval, cfg, partial(_completed, bar, task)))
    if as_json:
        typer.echo(json.dumps(report(figures, lines, rounds, blocks)))
        return
    first = figures[policies[0]][0]
    t = Table(title=f"bench engine --schedule: {rounds} rounds of {', '.join(lines)} "
                    f"({first.requests} requests, {blocks} blocks)"
                    + (f", the median of {repeat} passes each" if repeat > 1 else ""))
    t.add_column("")
    cols = [combined(figures[p], first) for p in policies]
    for p in policies:
        t.add_column(p.value, justify="right")
    for label, key, fmt in ROWS:
        t.add_row(label, *(fmt.format(c[key]) for c in cols))
    Console().print(t)
