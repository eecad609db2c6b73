"""`radixcache bench cli`: the front door's speed (harness: ``radixcache.tools.bench_cli``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.app import bench_app

console = Console()


@bench_app.command("cli")
def bench_cli(
    recording: Path | None = typer.Option(None, help="The recording `tree` prints (default: "
                                          "record --requests chat requests first)."),
    requests: int = typer.Option(500, min=1, help="Chat requests of the default recording."),
    demo: bool = typer.Option(True, "--demo/--no-demo", help="Also time the demo in a "
                                                            "pseudo-terminal."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The CLI's own speed: --help, tree FILE (time and peak memory), the demo's first output,
    first frame and quit, and whether record shows progress; each in a fresh process.

    Example: radixcache bench cli --json"""
    from radixcache.tools import bench_cli as b

    steps = 5 + int(demo) + int(recording is None)
    with tempfile.TemporaryDirectory() as tmp, \
            Progress(console=console, disable=as_json, transient=True) as bar:
        task = bar.add_task("bench cli", total=steps)
        bar.update(task, description="compiling the project (as an install does)")
        compiled = b.compile_project(Path(tmp) / "pyc")
        bar.advance(task)

        def step(label: str) -> None:
            bar.update(task, description=label)

        step("recording the chat workload" if recording is None else "tree FILE")
        rec = recording or b.tree_recording(Path(tmp) / "chat.rcx", requests)
        bar.advance(task)
        step("radixcache --help")
        help_s, _ = b.best(3, [*b.CLI, "--help"])
        bar.advance(task)
        step("radixcache tree FILE")
        tree_s, tree_mb = b.best(3, [*b.CLI, "tree", str(rec)])
        bar.advance(task)
        demo_s = (-1.0, -1.0, -1.0, -1.0)
        if demo:
            step("radixcache demo (first frame, q)")
            demo_s = b.measure_demo()
            bar.advance(task)
        step("radixcache record (progress; --from a busy stream)")
        progress, record_from = b.record_figures(Path(tmp))
        bar.advance(task)
    first_output, first_frame, live, quit_s = (round(s, 3) for s in demo_s)
    figures = b.CliFigures(round(help_s, 3), round(tree_s, 3), round(tree_mb, 1),
                           requests if recording is None else -1, first_output, first_frame,
                           live, quit_s, progress, record_from, b.load_avg(), compiled)
    over = b.over_target(figures)
    if not demo:  # skipped, not missed
        over = tuple(name for name in over if not name.startswith(("demo_", "quit_")))
    figures = figures._replace(over_target=over)
    if as_json:
        typer.echo(json.dumps(figures._asdict()))
        return
    console.print(_table(figures, b.TARGETS))


def _table(f: object, targets: dict[str, float]) -> Table:
    t = Table(title="radixcache bench cli (fresh processes; timings depend on the load)")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    for name, value in f._asdict().items():  # type: ignore[attr-defined]
        target = targets.get(name)
        shown = (", ".join(value) or "none") if isinstance(value, tuple) else str(value)
        t.add_row(name, shown, "" if target is None else f"<= {target:g}")
    return t
