"""Hit rate and throughput figures, plus the header line above every pane."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widget import Widget

from inspector.sources import ConnState, SourceStatus
from radixcache.wire.mirror import MirrorStats

_DOT = {ConnState.LIVE: ("●", "#98c379"), ConnState.LOCAL: ("●", "#61afef"),
        ConnState.REPLAY: ("▶", "#c792ea"), ConnState.RESYNCING: ("◐", "#e5c07b"),
        ConnState.DISCONNECTED: ("○", "#e06c75")}


class Rate:
    """Requests per second over the last ``window`` seconds of (time, count) samples."""

    def __init__(self, window: float = 2.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, count: int) -> float:
        """Record ``count`` (monotonic total) at time ``t``; return the rate."""
        if self.samples and self.samples[-1][0] >= t:  # the same moment (a paused replay)
            self.samples[-1] = (self.samples[-1][0], count)
        else:
            self.samples.append((t, count))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window:
            self.samples.popleft()
        t0, c0 = self.samples[0]
        return (count - c0) / (t - t0) if t > t0 else 0.0


class StatsPane(Widget):
    """Hit rate, prefill tokens saved, requests/s and the structural counters."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.stats = MirrorStats()
        self.req_per_s = 0.0
        self.nodes = 0

    def show(self, stats: MirrorStats, req_per_s: float, nodes: int) -> None:
        """Copy the figures to draw."""
        self.stats, self.req_per_s, self.nodes = stats, req_per_s, nodes
        self.refresh()

    def render(self) -> Text:
        """Two columns of figures."""
        s = self.stats
        rows = [
            ("hit rate", f"{s.hit_rate:.1%}"),
            ("prefill saved", f"{s.hit_tokens:,} tok"),
            ("requests", f"{s.requests:,} ({self.req_per_s:,.0f}/s)"),
            ("nodes", f"{self.nodes:,}"),
            ("evictions", f"{s.evictions:,} ({s.evicted_tokens:,} tok)"),
            ("splits/merges", f"{s.splits:,} / {s.merges:,}"),
            ("COW", f"{s.cow_copies:,} ({s.slots_copied:,} slots)"),
        ]
        out = Text()
        for name, value in rows:
            out.append(f"{name:<14}", "dim")
            out.append(f"{value}\n", "bold")
        out.rstrip()
        return out


def header_line(status: SourceStatus, epoch: int, seq: int, stats: MirrorStats,
                req_per_s: float, now: float) -> Text:
    """``radixcache ─ engine <endpoint> ● live  epoch 3  seq 48,211  hit 81.9%  1,204 req/s``."""
    dot, color = _DOT[status.state]
    out = Text(" radixcache ", "bold")
    out.append(f"─ {status.endpoint} ")
    out.append(f"{dot} {status.state.value}", f"bold {color}")
    if status.state is ConnState.DISCONNECTED:
        out.append(f" {now - status.since:.0f}s", color)
    if status.detail:
        out.append(f" ({status.detail})", "dim")
    out.append(f"  epoch {max(epoch, 0)}  seq {max(seq, 0):,}   ")
    out.append(f"hit {stats.hit_rate:.1%}", "bold #98c379")
    out.append(f"  {req_per_s:,.0f} req/s   ")
    out.append("? help", "dim")
    return out
