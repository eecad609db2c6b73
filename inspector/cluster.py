"""The cluster screen: many engines side by side and as one merged prefix tree.

::

  radixcache cluster · 4 replicas · router http://127.0.0.1:8000 ● up · 12,408 tokens duplicated
  ┌ replicas ─────────────────────────────────────────────────────────────────────┐
  │ rank  events                 state  pool                 hit    req/s  queue  │
  │ 0     tcp://127.0.0.1:5557   ● up   ████████░░░░  62%    61.2%   7.1   0+2    │
  │ 1     tcp://127.0.0.1:5560   ✕ down                                           │
  └───────────────────────────────────────────────────────────────────────────────┘
  ┌ merged prefix tree (● holds it; x2 = tokens held twice) ──────────────────────┐
  │ [4] <bos> <hdr>human<end>   ●●●○ x3                                           │
  │   [733] write a poem ...    ●○○○                                              │
  └───────────────────────────────────────────────────────────────────────────────┘
   > chat 20

One ``Subscriber`` per replica (``radixcache.wire.fleet.Fleet``); the inspector never sees an
engine, only streams. A replica is down when its stream (heartbeats included) is silent for
1.5 s. When this screen owns the cluster, a ``restarts`` column shows how often the supervisor
started each replica again, and a down replica's state says what it does next ("restarting in
1 s: exited -9"). Enter on a replica ends the app with its rank: the caller opens that
replica's full screen and comes back. The command line sends workloads through the router
(``chat 20``) and, when this screen owns the cluster, ``kill R`` / ``restart R`` a replica.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

from rich.text import Text
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static

from inspector.sources import DatasetWords
from inspector.words import CLUSTER, cluster_words
from radixcache.wire.fleet import Fleet, FleetNode, FleetTree

if TYPE_CHECKING:
    from radixcache.serving.supervisor import ReplicaState, RouterState
    from radixcache.traffic.workloads import TokenText, Workload

TREE_ROWS = 300
TREE_DEPTH = 8
PREVIEW_WORDS = 8
LOAD_RATE = 20.0  # requests/s of a workload typed on the command line
BAR = 12


class ClusterControls(Protocol):
    """What the screen may do to the processes of a cluster it owns."""

    def kill(self, rank: int) -> None:
        """SIGKILL replica ``rank``."""
        ...

    def restart(self, rank: int) -> None:
        """Start replica ``rank`` again and wait until it answers."""
        ...

    def restart_router(self) -> None:
        """Stop the router and start it again; returns once it answers."""
        ...

    def router_state(self) -> RouterState:
        """What the cluster's supervisor says of the router (restarts, rotation)."""
        ...

    def replica_states(self) -> tuple[ReplicaState, ...]:
        """What the cluster's supervisor says of each replica (restarts, what it does next)."""
        ...


class ReplicaView(NamedTuple):
    """One replica's row (None, and a total of 0: what its stream does not say)."""

    rank: int
    endpoint: str
    up: bool
    used: int
    total: int
    hit_rate: float | None
    finished: int | None
    queue: tuple[int, int] | None  # waiting, running


class FleetView(Protocol):
    """What the screen reads: a row per replica and the merged tree."""

    def views(self) -> list[ReplicaView]:
        """Every replica's row now."""
        ...

    def merged(self) -> FleetTree:
        """The replicas' trees merged now."""
        ...


class StreamFleet:
    """A ``FleetView`` over radixcache engines' own streams."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def views(self) -> list[ReplicaView]:
        """``replica_views``."""
        return replica_views(self.fleet)

    def merged(self) -> FleetTree:
        """``Fleet.merged``."""
        return self.fleet.merged()


def replica_views(fleet: Fleet) -> list[ReplicaView]:
    """Every replica's figures now: the engine's counters when its heartbeat carries them,
    else what the mirror counted since it joined."""
    out = []
    for rank, (e, s) in enumerate(zip(fleet.endpoints, fleet.subscribers, strict=True)):
        with s.lock:
            m = s.mirror
            wm, c, st = m.watermark, m.counters, m.stats
            used, total = (wm.used_blocks, wm.total_blocks) if wm else (m.used_blocks,
                                                                        m.num_blocks)
            if c is not None:
                hit = c.hit_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
                finished, queue = c.finished, (c.waiting, c.running)
            else:
                hit, finished, queue = st.hit_rate, st.finished, (0, st.requests - st.finished)
        out.append(ReplicaView(rank, e.events, fleet.up(rank), used, total, hit, finished,
                               queue))
    return out


def _bar(used: int, total: int) -> str:
    if not total:
        return f"{used:,} blocks"
    full = round(BAR * used / total)
    return "█" * full + "░" * (BAR - full) + f" {100 * used / total:3.0f}%"


def _marks(node: FleetNode, replicas: int) -> Text:
    t = Text()
    for r in range(replicas):
        t.append("●" if r in node.holders else "○", "green" if r in node.holders else "dim")
    if len(node.holders) > 1:
        t.append(f" x{len(node.holders)}", "bold yellow")
    return t


def tree_lines(tree: FleetTree, replicas: int, words: TokenText) -> list[Text]:
    """The merged tree as rows, heaviest subtrees first, ``TREE_DEPTH`` deep at most."""
    out: list[Text] = []
    stack: list[tuple[FleetNode, int]] = [(n, 0) for n in _by_weight(tree.root)]
    while stack and len(out) < TREE_ROWS:
        node, depth = stack.pop()
        preview = words.text([int(t) for t in node.tokens[:PREVIEW_WORDS]])
        line = Text("  " * depth + f"[{node.num_tokens:,}] ")
        line.append(preview[:40], "cyan")
        line.append("  ")
        line.append_text(_marks(node, replicas))
        out.append(line)
        if depth + 1 < TREE_DEPTH:
            stack.extend((c, depth + 1) for c in _by_weight(node))
    return out


def _by_weight(node: FleetNode) -> list[FleetNode]:
    """Children, lightest first (popped from a stack: the heaviest is shown first)."""
    return sorted(node.children.values(), key=lambda c: c.num_tokens * len(c.holders))


class ClusterApp(App[int | None]):
    """The cluster screen (see the module doc). Returns the rank chosen with Enter, or None."""

    TITLE = "radixcache cluster"
    CSS = """
    #header { height: 1; background: $boost; }
    #replicas { height: auto; max-height: 40%; border: round $accent; }
    #tree { border: round $accent; }
    #message { height: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon,slash", "focus_command", "Command", priority=True),  # before later keys
        Binding("escape", "focus_table", "Replicas", show=False),
        Binding("q", "quit_cluster", "Quit"),
    ]

    def __init__(self, fleet: FleetView, router_url: str | None = None,
                 controls: ClusterControls | None = None, *, refresh_s: float = 0.5,
                 words: TokenText | None = None) -> None:
        super().__init__()
        self.fleet, self.router_url, self.controls = fleet, router_url, controls
        self.refresh_s = refresh_s
        self.words = words if words is not None else DatasetWords()
        self.router_up: bool | None = None
        self.views: list[ReplicaView] = []
        self.duplicated = 0
        self._last: dict[int, tuple[float, int]] = {}
        self._rates: dict[int, float] = {}
        self._stop = threading.Event()

    def compose(self) -> ComposeResult:
        """Header, replica table, merged tree, message, command line."""
        yield Static(id="header")
        yield DataTable(id="replicas", cursor_type="row")
        with VerticalScroll(id="tree"):
            yield Static(id="tree-body")
        yield Static(id="message")
        examples = [next(iter(cluster_words().values())).example,
                    *(w.example for w in CLUSTER.values())]
        yield Input(placeholder=" · ".join(examples), id="command")
        yield Footer()

    def on_mount(self) -> None:
        """Columns, timers and the router poller."""
        table = self.query_one(DataTable)
        table.add_columns("rank", "events", "state", "pool", "hit", "req/s", "queue",
                          *(("restarts",) if self.controls is not None else ()))
        table.border_title = "replicas (enter: full screen)"
        self.query_one("#tree").border_title = "merged prefix tree (● holds it, xN held N times)"
        if self.router_url is not None:
            threading.Thread(target=self._poll_router, name="rc-router-poll",
                             daemon=True).start()
        self.set_interval(self.refresh_s, self.refresh_views)
        self.refresh_views()
        table.focus()

    def on_unmount(self) -> None:
        """Stop the router poller."""
        self._stop.set()

    def _poll_router(self) -> None:
        from radixcache.serving.cluster import http_ok

        assert self.router_url is not None
        while not self._stop.is_set():
            self.router_up = http_ok(f"{self.router_url}/health")
            self._stop.wait(1.0)

    # -- drawing --------------------------------------------------------------------------------
    def refresh_views(self) -> None:
        """Re-read every mirror and redraw the table, the tree and the header."""
        self.views = self.fleet.views()
        now = time.monotonic()
        for v in self.views:
            if v.finished is None:
                continue
            t0, f0 = self._last.get(v.rank, (now, v.finished))
            if now - t0 >= 1.0 or v.rank not in self._rates:
                self._rates[v.rank] = (v.finished - f0) / (now - t0) if now > t0 else 0.0
                self._last[v.rank] = (now, v.finished)
        self._draw_table()
        tree = self.fleet.merged()
        self.duplicated = tree.stats().duplicated_tokens
        body = Text("\n").join(tree_lines(tree, len(self.views), self.words))
        self.query_one("#tree-body", Static).update(body or Text("(empty)", "dim"))
        self.query_one("#header", Static).update(self.header_text())

    def _draw_table(self) -> None:
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        supervised = {} if self.controls is None else {
            s.rank: s for s in self.controls.replica_states()}
        for v in self.views:
            st = supervised.get(v.rank)
            restarts = () if self.controls is None else (str(st.restarts) if st else "",)
            state = Text("● up", "green") if v.up else Text("✕ down", "bold red")
            if st is not None and st.note:
                state.append(f" ({st.note})", "yellow")
            if not v.up:
                table.add_row(str(v.rank), v.endpoint, state, "", "", "", "", *restarts)
                continue
            rate = self._rates.get(v.rank)
            table.add_row(str(v.rank), v.endpoint, state, _bar(v.used, v.total),
                          "n/a" if v.hit_rate is None else f"{100 * v.hit_rate:.1f}%",
                          "n/a" if rate is None else f"{rate:.1f}",
                          "n/a" if v.queue is None else f"{v.queue[0]}+{v.queue[1]}",
                          *restarts)
        if self.views:
            table.move_cursor(row=min(cursor, len(self.views) - 1))

    def header_text(self) -> Text:
        """The one-line summary: replicas up, router state, duplicated tokens."""
        up = sum(v.up for v in self.views)
        t = Text(f" radixcache cluster · {up}/{len(self.views)} replicas up · ")
        if self.router_url is not None:
            t.append(f"router {self.router_url} ")
            if self.router_up is None:
                t.append("…", "dim")
            else:
                t.append("● up" if self.router_up else "✕ DOWN",
                         "green" if self.router_up else "bold red")
            t.append(self._router_note())
            t.append(" · ")
        t.append(f"{self.duplicated:,} tokens duplicated")
        return t

    def _router_note(self) -> str:
        """The supervisor's word on the router: restarts, what it does next, who is out."""
        if self.controls is None:
            return ""
        st = self.controls.router_state()
        out = ", ".join(str(r) for r in st.out_of_rotation)
        return "".join([f" ({st.note})" if st.note else "",
                        f" · restarted {st.restarts}x" if st.restarts else "",
                        f" · not routing to {out}" if out else ""])

    # -- keys and commands -------------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a replica: end with its rank (the caller opens its full screen)."""
        self.exit(event.cursor_row)

    def action_focus_command(self) -> None:
        """Focus the command line now (why: ``InspectorApp.action_focus_command``)."""
        inputs = self.screen.query(Input)
        if isinstance(self.focused, Input) or not inputs:
            raise SkipAction  # typed into an input, or a screen without one: its key
        self.screen.set_focus(inputs.first())

    def action_focus_table(self) -> None:
        """Back to the replica table."""
        self.query_one(DataTable).focus()

    def action_quit_cluster(self) -> None:
        """Quit (the caller stops what it started)."""
        self.exit(None)

    def say(self, message: str) -> None:
        """Show one line under the tree."""
        self.query_one("#message", Static).update(Text(message))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Run a typed command; the line is cleared and the answer shown."""
        event.input.value = ""
        try:
            words = shlex.split(event.value)
        except ValueError as exc:
            self.say(f"error: {exc}")
            return
        if not words:
            return
        handler = self.WORDS.get(words[0])
        if handler is not None:
            handler(self, words)
        elif words[0] in cluster_words():
            self._send_workload(words)
        else:
            known = " ".join(sorted(cluster_words()))
            self.say(f"error: unknown command {words[0]!r} (commands: {known})")

    def _quit(self, _: list[str]) -> None:
        self.exit(None)

    def _fault(self, words: list[str]) -> None:
        if self.controls is None:
            self.say("error: this screen did not start the cluster (radixcache cluster does)")
            return
        controls = self.controls
        if words == ["restart", "router"]:
            self._start("restart router", controls.restart_router)
            return
        if len(words) != 2 or not words[1].isdigit() or int(words[1]) >= len(self.views):
            self.say(f"error: usage: {words[0]} RANK (0..{len(self.views) - 1})")
            return
        rank = int(words[1])
        action = controls.kill if words[0] == "kill" else controls.restart
        self._start(f"{words[0]} replica {rank}", lambda: action(rank))

    def _start(self, what: str, action: Callable[[], None]) -> None:
        """Say ``what`` is under way, run ``action`` off the UI thread, then say how it ended."""
        self.say(f"{what} ...")

        def run() -> None:
            try:
                action()
                self.call_from_thread(self.say, f"{what}: done")
            except RuntimeError as exc:
                self.call_from_thread(self.say, f"error: {exc}")

        self.run_worker(run, thread=True)

    # one per ``inspector.words.CLUSTER`` (a test checks)
    WORDS: ClassVar[Mapping[str, Callable[[ClusterApp, list[str]], None]]] = {
        "quit": _quit, "kill": _fault, "restart": _fault}

    def _send_workload(self, words: list[str]) -> None:
        from radixcache.traffic.workloads import WorkloadError, build_workload

        if self.router_url is None:
            self.say("error: no router: workloads go through `radixcache cluster`'s router")
            return
        try:
            w = build_workload(words[0], words[1:])
        except WorkloadError as exc:
            self.say(f"error: {exc}")
            return
        self.say(f"{w.name}: {len(w.requests)} requests -> {self.router_url} at {LOAD_RATE:g}/s")
        self.run_worker(lambda: self._load(w), thread=True)

    def _load(self, workload: Workload) -> None:
        from radixcache.traffic.load import LoadConfig, load

        result = load(LoadConfig(str(self.router_url), LOAD_RATE), workload)
        s = result.summary()
        self.call_from_thread(self.say, f"{s['requests']} requests, {s['failed']} failed, "
                                        f"TTFT p50 {s['ttft_p50_ms']:.0f} ms")
