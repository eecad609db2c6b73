"""The "what if" screen: the hit-rate curve of everything the engine has done, redrawn as it
grows, with the engine's own pool marked and its measured hit rate beside the curve's
prediction at that size.

- A live or embedded engine: the feed's ``Follower`` (``radixcache.analysis.follow``) has
  followed every event since the inspector joined; the curve covers the requests finished
  since then (nothing before the join is in the stream: for a whole run, record it and run
  ``radixcache whatif FILE``).
- A replay: its own mirror from the recording's first keyframe, fed the batches up to the
  replay's position (``ReplayCurve``), rebuilt after a seek back.
"""

from __future__ import annotations

import itertools
from typing import ClassVar, NamedTuple

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Static

from inspector.feed import Feed
from inspector.replay import ReplaySource
from inspector.sources import Source
from radixcache.analysis.answers import capacity_for
from radixcache.analysis.stackdist import Curve
from radixcache.analysis.whatif import RunningCurve
from radixcache.wire.mirror import Mirror

REDRAW_S = 0.5
_GLYPH_STYLE = {"*": "#98c379", "│": "#e06c75", " ": ""}


class ReplayCurve:
    """``RunningCurve`` over a replay's batches, advanced (or rebuilt) to its position."""

    def __init__(self, source: ReplaySource) -> None:
        self.source = source
        self.done = 0
        self.running = self._fresh()

    def _fresh(self) -> RunningCurve:
        snapshot = self.source.rec.keyframes[0][1]  # ReplaySource insists on one at batch 0
        mirror = Mirror()
        mirror.load_snapshot(snapshot)
        self.done = 0
        return RunningCurve(mirror)

    def advance(self) -> RunningCurve:
        """Apply the batches up to the replay's position (from scratch after a seek back)."""
        target = self.source.position().index
        if target < self.done:
            self.running = self._fresh()
        for batch in self.source.rec.batches[self.done : target]:
            for e in batch.events:
                self.running.apply(e)
        self.done = max(self.done, target)
        return self.running


class View(NamedTuple):
    """What one redraw shows, copied from a ``RunningCurve`` (under the feed's lock for a
    live source), then drawn without any lock."""

    curve: Curve
    capacity_tokens: int
    num_blocks: int
    block_size: int
    measured_hits: int
    measured_prompt: int
    scope: str
    causes: dict[str, int] | None = None  # missed tokens by cause (a live source)
    engine_finished: int = 0  # requests the engine finished, its own count (0: unknown)
    schedule: str = ""  # the engine's scheduling policy (its counters; "": not said)
    joined_at: int = 0  # the seq a live inspector joined a warm cache at (0: it did not)
    joined_nodes: int = 0  # the nodes that cache held then

    @classmethod
    def of(cls, r: RunningCurve, scope: str, causes: dict[str, int] | None = None,
           joined: tuple[int, int] = (0, 0)) -> View:
        """Copy what ``r`` holds now; ``joined``: the seq a live inspector joined at and the
        nodes the engine's tree held then."""
        m = r.mirror
        c = m.counters
        done = c.finished if c is not None else 0
        schedule = (c.schedule or "") if c is not None else ""
        return cls(r.curve(), r.capacity_tokens, m.num_blocks, m.block_size, r.measured_hits,
                   r.measured_prompt, scope, causes, done, schedule, *joined)


def headline(v: View) -> str:
    """The screen's first lines: requests seen, the pool, predicted against measured."""
    c = v.curve
    if not c.requests:
        if v.engine_finished:  # a late joiner: the engine's requests began before it came
            return (f"what if: {v.scope}: none of the requests followed from their start has "
                    f"finished yet (the engine has finished {v.engine_finished:,}, begun before "
                    "this inspector joined); the curve grows as they finish")
        return (f"what if: {v.scope}: no request has finished yet; the curve grows as they "
                "finish")
    p = max(c.prompt_tokens, 1)
    cap = v.capacity_tokens
    predicted = c.hit_rate_at(cap)
    measured = v.measured_hits / max(v.measured_prompt, 1)
    return (
        f"what if: {v.scope}: {c.requests:,} finished requests, {c.prompt_tokens:,} prompt "
        f"tokens\n"
        f"engine pool {v.num_blocks:,} blocks x {v.block_size} = {cap:,} tokens:"
        f" arrival-order LRU curve {100 * predicted:.2f}% (one request at a time), engine "
        f"measured {100 * measured:.2f}% (batched)" + _beaten(v, predicted, measured) + "\n"
        f"maximum {100 * c.max_hits / p:.2f}% (infinite cache); 90% of it at "
        f"{capacity_for(c, 0.9):,} tokens" + _cold_line(v) + _causes_line(v.causes))


def _beaten(v: View, predicted: float, measured: float) -> str:
    """Why an engine can measure more than the curve: the curve takes requests in arrival
    order, a cache-aware schedule does not (it is not a ceiling)."""
    if measured <= predicted or v.schedule in ("", "fcfs"):
        return ""
    return f": {v.schedule} reorders the queue, so it can beat the arrival order"


def _cold_line(v: View) -> str:
    """A late joiner's curve starts from an empty cache, not from the engine's."""
    if not v.joined_nodes:
        return ""
    return (f"\nthe curve starts cold at seq {v.joined_at:,}: the inspector joined when the "
            f"engine already cached {v.joined_nodes:,} nodes, so the first requests count "
            "misses the engine did not have")


def _causes_line(causes: dict[str, int] | None) -> str:
    """Why the followed requests missed, largest first (``why REQ`` for one request)."""
    if not causes or not any(causes.values()):
        return ""
    ranked = sorted(((n, k) for k, n in causes.items() if n), reverse=True)
    return ("\nmissed tokens by cause: " + ", ".join(f"{k} {n:,}" for n, k in ranked)
            + " (one request: why REQ)")


def plot(v: View, width: int, height: int = 16) -> Text:
    """The curve as a character chart: log capacity across, hit rate (%) up, the engine's
    pool as a vertical bar. Plain characters, so it is the same in every terminal."""
    c = v.curve
    cols = max(20, width - 10)
    top = max(2, int(c.saturation_units * 1.25), 2 * v.capacity_tokens)
    caps = np.geomspace(1, top, cols).round().astype(np.int64)
    rates = c.hits(caps) / max(c.prompt_tokens, 1)
    rows = [[" "] * cols for _ in range(height)]
    pool = int(np.searchsorted(caps, v.capacity_tokens))
    for y in range(height):
        if pool < cols:
            rows[y][pool] = "│"
    for x, rate in enumerate(rates):
        rows[height - 1 - min(height - 1, int(rate * (height - 1) + 0.5))][x] = "*"
    out = Text()
    for y, row in enumerate(rows):
        label = {0: "100%", height // 2: " 50%", height - 1: "  0%"}.get(y, "    ")
        out.append(f"{label} ┤", "dim")
        for glyph, run in itertools.groupby(row):  # one styled run per glyph: an exported
            out.append("".join(run), _GLYPH_STYLE[glyph])  # SVG places each run by its cell
        out.append("\n")
    out.append("      1" + f"{top:,}".rjust(cols - 1) + "\n", "dim")
    out.append("      * LRU hit rate against capacity (tokens, log scale)   ", _GLYPH_STYLE["*"])
    out.append("│ the engine's pool", _GLYPH_STYLE["│"])
    return out


class WhatIfScreen(ModalScreen[None]):
    """The curve of what the engine did (a replay: up to its position; a live or embedded
    engine: since the inspector joined); closes with escape, q or w."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,w", "app.pop_screen", "Close")]

    def __init__(self, source: Source, feed: Feed) -> None:
        super().__init__()
        self.feed = feed
        self.curve = ReplayCurve(source) if isinstance(source, ReplaySource) else None
        self.view: View | None = None

    def compose(self) -> ComposeResult:
        """A headline and the plot."""
        yield Static(id="whatif-head")
        yield Static(id="whatif-plot")

    def on_mount(self) -> None:
        """Draw now and every ``REDRAW_S`` while the engine or the replay moves."""
        self.redraw()
        self.set_interval(REDRAW_S, self.redraw)

    def redraw(self) -> None:
        """Bring the curve up to date and draw it."""
        if self.curve is not None:
            at = self.curve.source.position().index
            self.view = View.of(self.curve.advance(), f"the replay up to batch {at:,}")
        else:
            with self.feed.lock:
                f = self.feed.follow
                scope = f"since the inspector joined (seq {f.since:,})"
                if f.error is not None:
                    scope += f", up to where following stopped: {f.error}"
                elif f.curve_full:
                    scope += f", up to {f.max_tokens:,} distinct tokens"
                self.view = View.of(f.curve, scope, f.misses.totals(),
                                    (f.since, f.joined_nodes))
        self.query_one("#whatif-head", Static).update(headline(self.view))
        if self.view.curve.requests:
            self.query_one("#whatif-plot", Static).update(plot(self.view, self.size.width))
