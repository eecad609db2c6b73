"""`radixcache inspect`, `replay`, `screenshot` and `bench tui`: the Textual inspector.

``run_live(endpoints)`` and ``run_local()`` are the entry points other commands (``demo``)
call; the inspector package is imported lazily so ``radixcache --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import CliError, app, bench_app
from cli.bounds import MAX_BLOCKS

if TYPE_CHECKING:
    from inspector.bench import TuiBench
    from radixcache.wire.security import ClientCurve

console = Console()


def run_live(endpoints: list[str], curve: ClientCurve | None = None) -> None:
    """Open the inspector on the engine whose event endpoint is ``endpoints[0]`` (tcp://HOST:PORT
    or ipc://PATH-events; the snapshot/replay and command sockets follow from it). Blocks until
    the user quits. Only one engine is shown: extra endpoints are refused."""
    from inspector.app import InspectorApp
    from inspector.live import LiveSource

    if len(endpoints) != 1:
        raise CliError(f"the inspector follows one engine, got {len(endpoints)} endpoints")
    InspectorApp(LiveSource(endpoints[0], curve=curve)).run()


def run_local(num_blocks: int = 4096) -> None:
    """Open the inspector on an embedded cache of ``num_blocks`` blocks with no model (the
    tree driver, in the same service loop as ``serve``), steered from its command line.
    Blocks until the user quits."""
    from inspector.app import InspectorApp
    from inspector.embedded import EmbeddedSource
    from radixcache.serving.driver import TreeDriver

    InspectorApp(EmbeddedSource(TreeDriver(num_blocks))).run()


@app.command()
def inspect(
    endpoint: list[str] | None = typer.Argument(None, help="An engine's event endpoint "
                                                           "(tcp://HOST:PORT or ipc://PATH-"
                                                           "events); several: the cluster "
                                                           "screen."),
    kv_events: list[str] | None = typer.Option(None, help="Attach to a vLLM/SGLang KV-event "
                                                          "PUB (tcp://HOST:PORT) instead; "
                                                          "repeated: the cluster screen."),
    replay: list[str] | None = typer.Option(None, help="With --kv-events: its replay ROUTER "
                                                       "(one per --kv-events)."),
    topic: str = typer.Option("", help="With --kv-events: only this PUB topic (SGLang can put "
                                       "a data-parallel rank in it)."),
    blocks: int = typer.Option(4096, min=16, max=MAX_BLOCKS,
                              help="Without ENDPOINT: blocks of the embedded tree."),
    curve_keys: Path | None = typer.Option(None, help="With ENDPOINT(s): a key directory from "
                                           "`radixcache keys DIR` (the engine runs with "
                                           "`serve --curve-keys`)."),
) -> None:
    """Open the inspector on a running engine, on a vLLM-format KV-event publisher, or (with
    no ENDPOINT) on an embedded in-process tree.

    Example: radixcache inspect tcp://127.0.0.1:5557   (after: radixcache serve --port 5557)
    """
    keys = None
    if curve_keys is not None:
        if not endpoint:
            raise typer.BadParameter("--curve-keys goes with ENDPOINT (one or several)",
                                     param_hint="--curve-keys")
        keys = _load_curve_keys(curve_keys)  # one engine or the cluster screen: every socket
    if kv_events is not None and len(kv_events) > 1:
        from cli.cluster_screens import inspect_kv_many

        inspect_kv_many(kv_events, replay or [])
    elif kv_events:
        from inspector.kv_view import KVEventsApp
        from radixcache.traffic.workloads import Vocabulary

        KVEventsApp(kv_events[0], replay[0] if replay else None, vocab=Vocabulary(),
                    topic=topic.encode()).run()
    elif replay:
        raise typer.BadParameter("--replay goes with --kv-events", param_hint="--replay")
    elif endpoint is not None and len(endpoint) > 1:
        from cli.cluster_screens import inspect_many

        inspect_many(endpoint, keys)
    elif endpoint:
        run_live(endpoint, keys)
    else:
        run_local(blocks)


def _load_curve_keys(directory: Path) -> ClientCurve:
    """The client keys in ``directory``, handed to every subscriber and command socket the
    inspector opens (never through the environment); a clear error when they do not load."""
    from radixcache.wire.security import ClientCurve, CurveError

    try:
        return ClientCurve.load(directory)
    except CurveError as exc:
        raise CliError(str(exc)) from None


@app.command("replay")
def replay_file(
    file: Path = typer.Argument(..., help="A file written by `radixcache record`."),
) -> None:
    """Replay a recording in the inspector: p play/pause, . step, , step back, < > keyframes,
    [ ] speed. A damaged file replays up to the damage and the replay bar says where.

    Example: radixcache replay chat.rcx   (after: radixcache record --out chat.rcx)
    """
    from inspector.app import InspectorApp
    from inspector.replay import ReplaySource, load_recording

    InspectorApp(ReplaySource(load_recording(file))).run()


@app.command()
def screenshot(
    out: Path = typer.Option(Path("screenshots"), help="Directory to write SVG and PNG into."),
) -> None:
    """Write SVG and PNG screenshots of the inspector: the live tree after a chat workload, the
    block map under eviction, the what-if and why screens, replay mode and the view attached
    to a vLLM-format publisher. PNGs need the Fira Code font (Debian: fonts-firacode).

    Example: radixcache screenshot --out screenshots
    """
    from inspector.shots import monospace_font_missing, take_all

    missing = monospace_font_missing()
    if missing:
        console.print(f"[yellow]warning:[/] {missing}")
    out.mkdir(parents=True, exist_ok=True)
    for path in take_all(out, log=console.print):
        console.print(f"wrote {path}")


@bench_app.command("tui")
def bench_tui(
    nodes: int = typer.Option(100_000, min=1, max=10_000_000, help="Nodes in the tree."),
    seconds: float = typer.Option(3.0, min=0.1, max=3600.0,
                                 help="Length of each phase (scroll, change, keys)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    embedded: bool = typer.Option(False, "--embedded", help="Feed the inspector through an "
                                  "embedded engine's loop and feed thread (as `inspect` "
                                  "without ENDPOINT runs), not the bench's own stream."),
) -> None:
    """The inspector headless on a big tree fed 50,000 events/s: frame cost while scrolling
    and while nodes change, key latency, events ingested/s, memory pane redraws/s, command
    reply time.

    Example: radixcache bench tui --nodes 100000 --embedded --json
    """
    from inspector.bench import Path as BenchPath
    from inspector.bench import run_bench
    from radixcache.serving.driver import TreeDriver

    path = BenchPath.EMBEDDED if embedded else BenchPath.STREAM
    if as_json:
        result = run_bench(TreeDriver(nodes * 2 + 4096), nodes, seconds, path=path)
        print(json.dumps(result._asdict()))
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"),
                  TimeElapsedColumn(), console=console) as progress:
        build = progress.add_task(f"building {nodes:,} nodes", total=nodes)
        phase = progress.add_task("phases", total=3)

        def step(name: str) -> None:
            progress.update(phase, description=name, advance=0 if name == "scrolling" else 1)

        result = run_bench(TreeDriver(nodes * 2 + 4096), nodes, seconds,
                           progress=lambda done, _: progress.update(build, completed=done),
                           step=step, path=path)
        progress.update(phase, completed=3)
    console.print(_tui_table(result))


def _tui_table(result: TuiBench) -> Table:
    table = Table(title=f"bench tui ({result.nodes:,} nodes, {result.path})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    rows = [("frame p50 / p99 ms", f"{result.frame_ms_p50:.1f} / {result.frame_ms_p99:.1f}",
             "<= 30"),
            ("frame p99 scroll / change ms",
             f"{result.frame_ms_p99_scroll:.1f} / {result.frame_ms_p99_change:.1f}", "<= 30"),
            ("key p50 / p99 ms", f"{result.key_ms_p50:.1f} / {result.key_ms_p99:.1f}", "<= 100"),
            ("events ingested/s", f"{result.events_per_s:,.0f}", ">= 50,000"),
            ("memory pane redraws/s", f"{result.watermark_hz:.1f}", ">= 2"),
            ("command reply p99 ms (engine flooding)", f"{result.command_ms_p99:.1f}", "<= 200"),
            ("fidelity violations / frames checked",
             f"{result.fidelity_violations} / {result.fidelity_frames}", "0"),
            ("memory kept over resyncs MB", f"{result.resync_growth_mb:.1f}", "flat")]
    for row in rows:
        table.add_row(*row)
    return table
