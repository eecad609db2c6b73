"""Hit rate and throughput figures, plus the header line above every pane.

The figures are the engine's own when it publishes its counters (``ev.Counters`` with its
heartbeat), labelled "since engine start" or "since reset N"; before the first heartbeat (or
from a source without one) they are what this inspector saw, labelled "seen here".

Retractions (``--reserve grow``) are counted from the stream's ``Retract`` events since the
inspector joined; the heartbeat does not carry the engine's, so what became of the tokens
they kept (read back from the tree, or computed again) is the engine's at the last ``stats``
reply (``engine``), marked so.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from rich.text import Text

from inspector.frame import EMPTY, Frame
from inspector.layout import human_count
from inspector.sources import ConnState, SourceStatus
from inspector.widgets.pane import Paint, PaneWidget
from radixcache.core import events as ev
from radixcache.serving.stats import Stats

_DOT = {ConnState.CONNECTING: ("◌", "#e5c07b"), ConnState.LIVE: ("●", "#98c379"),
        ConnState.LOCAL: ("●", "#61afef"),
        ConnState.REPLAY: ("▶", "#c792ea"), ConnState.RESYNCING: ("◐", "#e5c07b"),
        ConnState.DISCONNECTED: ("○", "#e06c75")}
_PAUSED = ("⏸", "#e5c07b")
_STILL = ("❚❚", "#c792ea")  # a replay standing still: the replay bar's pause glyph


class Figures(NamedTuple):
    """The counters a frame shows and where they come from."""

    label: str
    requests: int
    prompt_tokens: int
    hit_tokens: int
    evictions: int
    evicted_tokens: int
    cow_copies: int

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def figures(frame: Frame) -> Figures:
    """The engine's counters when it sent them, else the ones counted from the stream."""
    c = frame.counters
    if c is not None:
        label = "since engine start" if c.generation == 0 else f"since reset {c.generation}"
        return Figures(label, c.submitted, c.prompt_tokens, c.hit_tokens, c.evicted_nodes,
                       c.evicted_tokens, c.cow_copies)
    s = frame.stats
    return Figures("seen here", s.requests, s.prompt_tokens, s.hit_tokens, s.evictions,
                   s.evicted_tokens, s.cow_copies)


def served(frame: Frame) -> int:
    """Requests finished (the engine's count when it sent one): what the header's req/s
    rates. Submissions would count a paused engine's queue growing with nothing running."""
    c = frame.counters
    return c.finished if c is not None else frame.stats.finished


class Rate:
    """Requests per second over the last ``window`` seconds of (time, count) samples."""

    def __init__(self, window: float = 2.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, count: int) -> float:
        """Record ``count`` (monotonic total) at time ``t``; return the rate (a count that
        went down, after a reset or a seek back, starts the window again)."""
        if self.samples and (count < self.samples[-1][1] or t < self.samples[-1][0]):
            self.samples.clear()
        if self.samples and self.samples[-1][0] == t:  # the same moment (a paused replay)
            self.samples[-1] = (t, count)
        else:
            self.samples.append((t, count))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window:
            self.samples.popleft()
        t0, c0 = self.samples[0]
        return (count - c0) / (t - t0) if t > t0 else 0.0


class StatsPane(PaneWidget):
    """Hit rate, prefill tokens saved, requests/s, queue, evictions, COW, splits/merges."""

    DEFAULT_CSS = """
    StatsPane { width: 42; border: round #4c566a; padding: 0 1;
                text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame = EMPTY
        self.req_per_s = 0.0
        self.engine: Stats | None = None  # the figures of the last ``stats`` reply

    def stats_reply(self, stats: Stats) -> None:
        """The engine's figures from a ``stats`` reply (its retraction totals, its reserve)."""
        self.engine = stats
        self.refresh()

    def paint(self, p: Paint) -> None:
        """Draw the frame's figures with the header's request rate."""
        self.show(p.frame, p.req_per_s)

    def show(self, frame: Frame, req_per_s: float) -> None:
        """Copy the figures to draw; the border title says what they count since."""
        old = (self.frame.stats, self.frame.counters, self.frame.queue,
               self.frame.retractions, round(self.req_per_s))
        self.frame, self.req_per_s = frame, req_per_s
        title = f"stats · {figures(frame).label}"  # from the first frame, changed or not
        if self.border_title != title:
            self.border_title = title
        if old != (frame.stats, frame.counters, frame.queue, frame.retractions,
                   round(req_per_s)):
            self.refresh()

    def rows(self) -> list[tuple[str, str]]:
        """(name, value) pairs, each short enough for the pane's 38 columns."""
        f, s, c = figures(self.frame), self.frame.stats, self.frame.counters
        rows = [
            ("hit rate", f"{f.hit_rate:.1%}"),
            ("prefill saved", f"{human_count(f.hit_tokens)} tok"),
            ("requests", f"{f.requests:,} ({self.req_per_s:,.0f} done/s)"),
            ("evictions", f"{f.evictions:,} ({human_count(f.evicted_tokens)} tok)"),
            ("COW copies", f"{f.cow_copies:,}"),
            ("splits/merges", f"{s.splits:,} / {s.merges:,} (seen)"),
        ]
        if c is not None:
            rows.insert(3, ("waiting/running", f"{c.waiting:,} / {c.running:,}"))
        q = self.frame.queue
        if q is not None and q.waiting:
            why = " · ".join(f"{n} {r.value}" for r, n in q.counts().items() if n)
            rows.insert(4, ("why waiting", why))
            held = next((w for w in q.entries if w.reason is ev.WaitReason.SHARING), None)
            if held is not None:  # the first request held for another's prompt
                rows.insert(5, ("  e.g. held", f"r{held.req} for r{held.on_req} "
                                               f"(+{held.shared} tok after n{held.node})"))
        at = next(i for i, (name, _) in enumerate(rows) if name == "evictions") + 1
        rows[at:at] = self._retraction_rows()  # beside evictions: shown in a short pane too
        return rows

    def _retraction_rows(self) -> list[tuple[str, str]]:
        """The stream's retractions (when there were any, or the engine grows its leases);
        the engine's split of the tokens they kept, at its last ``stats`` reply."""
        r, e = self.frame.retractions, self.engine
        if not r.retractions and (e is None or e.reserve != "grow"):
            return []
        rows = [("retractions",
                 f"{human_count(r.retractions)} ({human_count(r.kept_tokens)} tok kept)")]
        if e is not None:  # at most 22 columns each (the pane's 38, less the names')
            rows.append(("  at last stats", f"{human_count(e.retractions)}, reserve {e.reserve}"))
            rows.append(("  read back", f"{human_count(e.retracted_from_tree)} · "
                                        f"{human_count(e.retracted_recomputed)} redone"))
        return rows

    def render(self) -> Text:
        """Two columns of figures, never wrapped."""
        out = Text(no_wrap=True, overflow="ellipsis")
        for name, value in self.rows():
            out.append(f"{name:<16}", "dim")
            out.append(f"{value}\n", "bold")
        out.rstrip()
        return out


def header_line(status: SourceStatus, frame: Frame, req_per_s: float, now: float,
                width: int) -> Text:
    """``radixcache ─ <endpoint> ● live  hit 81.9%  blocks 1,204/2,048  12 req/s  seq 48,211
    epoch 3f2a  ? help``; parts drop from the right of this order when ``width`` is short,
    the state and the hit rate last."""
    c = frame.counters
    gone = status.state is ConnState.DISCONNECTED  # the last counters say nothing now
    paused = c is not None and c.paused and not gone
    dot, color = _PAUSED if paused else _STILL if status.paused else _DOT[status.state]
    state = "paused" if paused else status.state.value
    if status.paused:  # a replay standing still
        state = f"{status.state.value} paused"
    if paused and c is not None and c.running:  # pause stops admission; these still step
        state = f"admission paused, {c.running:,} running"
    if gone or status.state is ConnState.CONNECTING:
        state += f" {max(0.0, now - status.since):.0f}s"
    parts: list[tuple[str, str]] = [
        (f"{dot} {state}", f"bold {color}"),
        (f"hit {figures(frame).hit_rate:.1%}", "bold #98c379"),
        (f"blocks {frame.used_blocks:,}/{frame.num_blocks:,}", ""),
        ("" if gone else f"{req_per_s:,.0f} req/s", ""),
        (f"schedule {c.schedule}" if c is not None and c.schedule else "", ""),
        (f"seq {max(frame.seq, 0):,}", "dim"),
        (f"({status.detail})" if status.detail else "", "dim"),
        (f"epoch {frame.epoch & 0xFFFF:04x}" if frame.epoch >= 0 else "", "dim"),
        ("? help", "dim"),
    ]
    out = Text(" radixcache ", "bold", no_wrap=True, overflow="crop")
    if len(status.endpoint) + 16 < width // 3:
        out.append(f"─ {status.endpoint} ")
    for text, style in parts:
        if text and out.cell_len + len(text) + 2 <= width:
            out.append(text, style)
            out.append("  ")
    out.rstrip()
    return out
