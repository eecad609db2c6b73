"""The "what if" screen: the hit-rate curve of everything a replayed engine has done so far,
redrawn as the replay moves, with the engine's own pool marked and its measured hit rate
beside the curve's prediction at that size.

It keeps its own mirror (from the recording's first keyframe) and feeds the batches up to the
replay's position through ``RunningCurve``, so it needs nothing from the main feed. A live
source has no history before the inspector joined: the screen says how to get the curve then
(record it, then ``radixcache whatif FILE``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Static

from inspector.replay import ReplaySource
from inspector.sources import Source
from radixcache.analysis.answers import capacity_for
from radixcache.analysis.whatif import RunningCurve
from radixcache.wire.mirror import Mirror

REDRAW_S = 0.5
NO_HISTORY = ("what if: this source has no history before the inspector joined. Record it "
              "(radixcache record --from ENDPOINT --out run.rcx), then: radixcache whatif "
              "run.rcx, or radixcache replay run.rcx and press w.")


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


def headline(r: RunningCurve) -> str:
    """The screen's first lines: requests seen, the pool, predicted against measured."""
    c = r.curve()
    p = max(c.prompt_tokens, 1)
    cap = r.capacity_tokens
    predicted = float(c.hits(np.asarray([cap]))[0]) / p
    measured = r.measured_hits / max(r.measured_prompt, 1)
    return (
        f"what if: {c.requests:,} finished requests, {c.prompt_tokens:,} prompt tokens\n"
        f"engine pool {r.mirror.num_blocks:,} blocks x {r.mirror.block_size} = {cap:,} tokens:"
        f" curve predicts {100 * predicted:.2f}%, engine measured {100 * measured:.2f}%\n"
        f"maximum {100 * c.max_hits / p:.2f}% (infinite cache); 90% of it at "
        f"{capacity_for(c, 0.9):,} tokens")


def plot(r: RunningCurve, width: int, height: int = 16) -> Text:
    """The curve as a character chart: log capacity across, hit rate (%) up, the engine's
    pool as a vertical bar. Plain characters, so it is the same in every terminal."""
    c = r.curve()
    cols = max(20, width - 10)
    top = max(2, int(c.saturation_units * 1.25), 2 * r.capacity_tokens)
    caps = np.geomspace(1, top, cols).round().astype(np.int64)
    rates = c.hits(caps) / max(c.prompt_tokens, 1)
    rows = [[" "] * cols for _ in range(height)]
    pool = int(np.searchsorted(caps, r.capacity_tokens))
    for y in range(height):
        if pool < cols:
            rows[y][pool] = "│"
    for x, rate in enumerate(rates):
        rows[height - 1 - min(height - 1, int(rate * (height - 1) + 0.5))][x] = "*"
    lines = []
    for y, row in enumerate(rows):
        label = {0: "100%", height // 2: " 50%", height - 1: "  0%"}.get(y, "    ")
        lines.append(f"{label} ┤" + "".join(row))
    lines.append("      1" + f"{top:,}".rjust(cols - 1))
    lines.append("      * LRU hit rate against capacity (tokens, log scale)   │ the engine's pool")
    return Text("\n".join(lines))


class WhatIfScreen(ModalScreen[None]):
    """The curve over the replay so far; closes with escape, q or w."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,w", "app.pop_screen", "Close")]

    def __init__(self, source: Source) -> None:
        super().__init__()
        self.curve = ReplayCurve(source) if isinstance(source, ReplaySource) else None

    def compose(self) -> ComposeResult:
        """A headline and the plot."""
        yield Static(id="whatif-head")
        yield Static(id="whatif-plot")

    def on_mount(self) -> None:
        """Draw now and every ``REDRAW_S`` while the replay moves."""
        self.redraw()
        if self.curve is not None:
            self.set_interval(REDRAW_S, self.redraw)

    def redraw(self) -> None:
        """Advance the curve to the replay's position and draw it."""
        head = self.query_one("#whatif-head", Static)
        if self.curve is None:
            head.update(NO_HISTORY)
            return
        running = self.curve.advance()
        head.update(headline(running))
        self.query_one("#whatif-plot", Static).update(plot(running, self.size.width))
