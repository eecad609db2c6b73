"""`radixcache demo`: an engine process with a mixed workload, and the inspector attached to it
(the harness is ``radixcache.tools.demo``). The engine is stopped however the demo ends: the
inspector quit, Ctrl-C, SIGTERM, SIGHUP (the terminal closed), or something raised."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

from cli.app import app
from cli.bounds import MAX_BLOCKS
from cli.options import (
    DTYPE_HELP,
    KV_MEMORY_HELP,
    MODEL_HELP,
    RESERVE_HELP,
    SCHEDULE_HELP,
    ModelSize,
    ReserveRule,
    check_kv_memory,
    kv_memory_args,
    model_args,
)
from radixcache.serving.policy import SchedulePolicy
from radixcache.tools.demo import (
    DEFAULT_MIX,
    DemoError,
    DemoStats,
    EngineProcess,
    MixLoop,
    headless,
)
from radixcache.traffic.workloads import WorkloadError, build_workload

console = Console(stderr=True)
DEMO_SCHEDULE = SchedulePolicy.DFS_WEIGHT  # `bench engine --schedule` measured it best (README)
# q: the demo's engine holds nothing to save. It gets SIGTERM when the inspector starts to
# close and SIGKILL 0.4 s later: its orderly exit (the step in flight, then the interpreter's
# teardown of torch) took 0.9-1.4 s at load 5, which `q` within 1 s cannot wait for
QUIT_GRACE_S = 0.4


@contextlib.contextmanager
def running_demo(blocks: int, mix: tuple[str, ...], interval_s: float,
                 schedule: SchedulePolicy = SchedulePolicy.FCFS, model: tuple[str, ...] = (),
                 reserve: str = "grow") -> Iterator[tuple[EngineProcess, MixLoop]]:
    """An engine that answers, fed by a running mix loop; both stopped on the way out.
    ``model``: ``serve``'s model arguments (``model_args``); ``reserve``: its ``--reserve``."""
    with EngineProcess(blocks, schedule=schedule.value, model_args=model,
                       reserve=reserve) as engine:
        engine.start()
        engine.wait_ready()
        loop = MixLoop(engine, mix, interval_s).start()
        try:
            yield engine, loop
        finally:
            loop.stop()


def _stats_table(s: DemoStats) -> Table:
    t = Table(title="radixcache demo (headless)")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for label, value in (
        ("seconds", f"{s.seconds:g}"),
        ("first tree with nodes after", f"{s.first_tree_s:.3f} s"),
        ("workloads sent", str(s.workloads_sent)),
        ("requests served / still queued", f"{s.served:,} / {s.queued:,}"),
        ("nodes (engine / mirror)", f"{s.nodes:,} / {s.mirror_nodes:,}"),
        ("splits / merges / evicted nodes", f"{s.splits:,} / {s.merges:,} / {s.evicted_nodes:,}"),
        ("batches followed", f"{s.batches:,}"),
        ("digest checks / resyncs", f"{s.digest_checks:,} / {s.resyncs}"),
        ("hit rate: curve predicts / engine measured",
         f"{100 * s.predicted_hit_rate:.2f}% / {100 * s.measured_hit_rate:.2f}%"),
        ("missed tokens by cause", ", ".join(f"{k} {v:,}" for k, v in
                                              s.missed_tokens_by_cause.items() if v) or "none"),
    ):
        t.add_row(label, value)
    return t


def _run_inspector(engine: EngineProcess, mix: tuple[str, ...], interval_s: float) -> None:
    """The inspector at once, on an engine still starting (its header says so); the mix loop
    starts on a thread once the engine answers. An engine that never answers ends the app
    and its error is raised here. On quit the engine is stopped in the open."""
    from inspector.app import InspectorApp
    from inspector.live import LiveSource

    class DemoSource(LiveSource):
        """Closed when the inspector quits (however it quits): the engine gets SIGTERM then
        at the latest, so it shuts down while the screen closes, not after."""

        def stop(self) -> None:
            engine.terminate()
            super().stop()

    class DemoApp(InspectorApp):
        """``q`` sends the engine SIGTERM first: Textual's teardown before the source's
        ``stop`` took 0.2 s at load 7, which the engine's shutdown now overlaps."""

        async def action_quit(self) -> None:
            engine.terminate()
            await super().action_quit()

    app = DemoApp(DemoSource(engine.endpoints.events, connecting="starting engine ..."))
    failed: list[DemoError] = []
    loops: list[MixLoop] = []

    def start_mix() -> None:
        try:
            engine.wait_ready()
        except DemoError as exc:
            failed.append(exc)
            app.call_from_thread(app.exit)
            return
        loops.append(MixLoop(engine, mix, interval_s).start())

    threading.Thread(target=start_mix, name="rc-demo-start", daemon=True).start()
    app.run()
    console.print("stopping engine ...")
    for loop in loops:
        loop.stop(join_s=0)
    if failed:
        raise failed[0]


def _leave_now() -> NoReturn:
    """End the process now with status 0. Everything is done: the engine is gone, its folder
    removed, the terminal restored; only the interpreter's teardown is left, freeing the
    inspector's objects one by one (the mirror, the what-if history, the widgets): 0.3-0.9 s
    at load 5-8, after the user pressed q, for nothing to save."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _interrupt_on_sigterm() -> None:
    """Turn SIGTERM and SIGHUP (the terminal closed) into KeyboardInterrupt, so that a killed
    demo still stops its engine and removes its temp folder."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def _parse_mix(mix: str) -> tuple[str, ...]:
    lines = tuple(part.strip() for part in mix.split(",") if part.strip())
    if not lines:
        raise typer.BadParameter("give at least one workload", param_hint="--mix")
    for line in lines:
        name, *args = line.split()
        try:
            build_workload(name, args)
        except WorkloadError as exc:
            raise typer.BadParameter(str(exc), param_hint="--mix") from None
    return lines


DEMO_HELP = (
    "Start an engine with a looping mixed workload and open the inspector on it.\n\n"
    "The engine runs in its own process on private ipc:// endpoints; quitting the inspector "
    "(q) stops it. Type commands such as [bold]chat 20[/], [bold]flood 500[/], "
    "[bold]evict 4096[/] or [bold]pause[/] in the inspector's command line.\n\n"
    "Example:  radixcache demo\n\n"
    "Headless check (prints what the engine did):  radixcache demo --no-inspect --seconds 5"
)


@app.command(help=DEMO_HELP)
def demo(
    no_inspect: bool = typer.Option(False, "--no-inspect", help="Run headless: follow the stream "
                                    "for --seconds, then print what happened."),
    seconds: float = typer.Option(10.0, min=0.5, help="With --no-inspect: how long to run."),
    blocks: int = typer.Option(2048, min=16, max=MAX_BLOCKS,
                               help="KV pool blocks (of 16 tokens); small, so "
                               "the mix evicts."),
    mix: str = typer.Option(",".join(DEFAULT_MIX), help="Workloads sent in turn, comma-separated, "
                            "as typed in the inspector's command line."),
    interval: float = typer.Option(0.7, min=0.05, help="Seconds between two workloads."),
    as_json: bool = typer.Option(False, "--json", help="With --no-inspect: one JSON object."),
    schedule: SchedulePolicy = typer.Option(DEMO_SCHEDULE, help=SCHEDULE_HELP),
    model: str = typer.Option(ModelSize.TINY.value, help=MODEL_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_memory: str | None = typer.Option(None, help=KV_MEMORY_HELP, callback=check_kv_memory),
    reserve: ReserveRule = typer.Option(ReserveRule.GROW, help=RESERVE_HELP),
) -> None:
    """Start an engine with a looping mixed workload and open the inspector on it (see
    ``DEMO_HELP``); the engine process is stopped however the demo ends."""
    if not no_inspect:
        console.print("starting engine ...")  # on screen within the first second
    lines = _parse_mix(mix)
    _interrupt_on_sigterm()
    serve_args = model_args(model, dtype) + kv_memory_args(kv_memory)
    if not no_inspect:
        with EngineProcess(blocks, grace_s=QUIT_GRACE_S, schedule=schedule.value,
                           model_args=serve_args, reserve=reserve.value) as engine:
            _run_inspector(engine.start(), lines, interval)
        _leave_now()
    with running_demo(blocks, lines, interval, schedule, serve_args,
                      reserve.value) as (engine, loop):
        stats = headless(engine, loop, seconds)
    if as_json:
        typer.echo(_json(stats))
    else:
        Console().print(_stats_table(stats))


def _json(stats: DemoStats) -> str:
    return json.dumps(stats._asdict())
