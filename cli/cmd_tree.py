"""`radixcache tree`: the cache tree of a recording, a live engine or a KV-event stream.

Its own module so that `tree FILE` imports only the reader, the mirror and the tree's text
(``radixcache.wire.treeview``): ZeroMQ, the workloads, the recorder, the inspector's
dataset words and Rich (``cli.output``'s console) come in only when needed (``radixcache
bench cli`` times `tree FILE` on 500 requests against 0.5 s; it imports neither torch nor
Textual). Stdout is the tree alone, as plain text; the count read and any damage go to
stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.app import CliError, app
from cli.bounds import WEEK_S
from cli.options import CURVE_HELP
from radixcache.traffic.workload_types import Vocabulary
from radixcache.wire.recording import RecordingReader
from radixcache.wire.treeview import Line, TokenText, node_label, preview, walk

if TYPE_CHECKING:
    from radixcache.wire.mirror import Mirror
    from radixcache.wire.security import ClientCurve


def _words(lines: list[Line]) -> TokenText:
    """The synthetic words, or, when a preview needs more (trace workloads), the ShareGPT
    words too: loaded once, waited for at most 15 s (ids render as #id without them)."""
    synthetic = Vocabulary()
    if all("#" not in preview(line.node, synthetic) for line in lines):
        return synthetic
    from inspector.sources import DatasetWords  # the dataset's words: only when needed

    words = DatasetWords()
    words.load()
    words.ready.wait(15)
    return words


def tree_text(mirror: Mirror, limit: int) -> Iterator[str]:
    """The tree as lines, guides as ``tree(1)`` draws them (``├── ``, ``└── ``, ``│   ``)::

        root (3 nodes)
        ├── n1 [4 tok] "a b c d" 1 blocks b0 r0
        │   └── n3 [2 tok] ...
        └── n2 ...

    Plain text, never markup: a preview's ``[bold]`` is printed as it reads (Rich's tree
    took it for a style, and importing it cost `tree FILE` a tenth of its budget)."""
    lines = list(walk(mirror, limit))
    vocab = _words(lines)
    kids: dict[int, list[Line]] = {}
    for line in lines:
        assert line.node.parent is not None
        kids.setdefault(line.node.parent.id, []).append(line)
    yield f"root ({len(mirror.nodes) - 1} nodes)"
    stack: list[tuple[Line, str, bool]] = [(c, "", i == 0) for i, c in
                                          enumerate(reversed(kids.get(0, [])))]
    while stack:
        line, indent, last = stack.pop()
        yield f"{indent}{'└── ' if last else '├── '}{node_label(line.node, vocab)}"
        below = kids.get(line.node.id, [])
        deeper = indent + ("    " if last else "│   ")
        stack.extend((c, deeper, i == 0) for i, c in enumerate(reversed(below)))


def _print_tree(mirror: Mirror, limit: int) -> None:
    out = sys.stdout
    for text in tree_text(mirror, limit):
        out.write(text + "\n")


@app.command()
def tree(
    source: str | None = typer.Argument(None, help="A recording file or tcp://HOST:PORT."),
    kv_events: str | None = typer.Option(None, help="A vLLM/SGLang KV-event PUB endpoint."),
    replay: str | None = typer.Option(None, help="Its replay ROUTER (replays from seq 0)."),
    seconds: float = typer.Option(2.0, min=0.1, max=WEEK_S,
                                 help="With --kv-events: how long to follow."),
    limit: int = typer.Option(200, min=0, help="Print at most this many nodes."),
    curve_keys: Path | None = typer.Option(None, help="With ENDPOINT: " + CURVE_HELP),
) -> None:
    """Print the cache tree of a recording or a live engine, or a KV-event block-hash tree.
    Damage in a file is reported on stderr (byte offset, reason); exit 1 when nothing could
    be read."""
    if kv_events is not None:
        _kv_tree(kv_events, replay, seconds, limit)
        return
    if source is None:
        raise typer.BadParameter("give FILE, ENDPOINT or --kv-events")
    if "://" in source:
        from cli.output import client_curve

        mirror = _live_mirror(source, client_curve(curve_keys))
        _print_tree(mirror, limit)
        return
    with RecordingReader(Path(source)) as reader:
        mirror, events = reader.mirror_at(2**62)
        damage = reader.damage
    _print_tree(mirror, limit)
    typer.echo(f"{events:,} events read", err=True)  # stderr: stdout is the tree alone
    if damage is not None:  # (cli.output and its Rich console: only when there is damage)
        from cli.output import stopped

        stopped(damage)


def _live_mirror(source: str, curve: ClientCurve | None) -> Mirror:
    from cli.output import unsynced, warn
    from radixcache.wire.endpoints import Endpoints
    from radixcache.wire.subscriber import Subscriber

    sub = Subscriber(Endpoints.from_events(source), curve=curve).start()
    ok = sub.wait_synced(10)
    sub.stop()
    if not ok:
        why = unsynced(sub, "down, or it needs / refused these --curve-keys")
        raise CliError(f"no snapshot from {source} in 10 s ({why})")
    if sub.stats.malformed:
        warn(f"warning: {sub.stats.malformed} malformed frames; last: {sub.last_error}")
    return sub.mirror


def _kv_tree(endpoint: str, replay: str | None, seconds: float, limit: int) -> None:
    from radixcache.wire.kvevents.pubsub import KVEventsClient
    from radixcache.wire.kvevents.report import follow_lines

    client = KVEventsClient(endpoint, replay)
    try:
        lines = follow_lines(client, seconds, limit)
    finally:
        client.close()
    typer.echo("\n".join(lines))
