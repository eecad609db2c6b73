"""The memory pane: device memory (NVML) with a history sparkline, pool occupancy against the
high and low watermarks, the K/V bytes of a block and of a token (the engine's ``stats``), or
a plain note saying why device figures are missing."""

from __future__ import annotations

from collections import deque

from rich.text import Text

from inspector.frame import EMPTY, Frame
from inspector.widgets.pane import Paint, PaneWidget
from radixcache.core import events as ev

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 60
GIB = 1 << 30


def sparkline(values: list[float], width: int) -> str:
    """The last ``width`` fractions in [0, 1] as block characters."""
    tail = values[-width:]
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int(v * len(SPARK))))] for v in tail)


def size_text(n: int) -> str:
    """Bytes in the unit that keeps them short: ``512B``, ``8KiB``, ``22.5KiB``, ``1.5MiB``."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.3g}{unit}"


def kv_line(per_block: int, per_token: int, width: int) -> str:
    """``K/V 8KiB/block 512B/token``, or ``8KiB/blk 512B/tok`` when that does not fit in
    ``width`` cells; empty when the engine did not say."""
    if not per_block:
        return ""
    block, token = size_text(per_block), size_text(per_token)
    wide = f"K/V {block}/block {token}/token"
    return wide if len(wide) <= width else f"{block}/blk {token}/tok"


def pool_bar(used: float, high: float, low: float, width: int) -> Text:
    """An occupancy bar of ``width`` cells with ``│`` at the low and ``▲`` at the high mark."""
    cells = max(4, width)
    filled = round(used * cells)
    marks = {min(cells - 1, round(low * cells)): "│", min(cells - 1, round(high * cells)): "▲"}
    bar = Text()
    for i in range(cells):
        mark = marks.get(i)
        color = "#e06c75" if used >= high else "#3d8b5a"
        if mark is not None:
            bar.append(mark, style="bold #ffb347")
        else:
            bar.append("█" if i < filled else "░", style=color if i < filled else "#4c566a")
    return bar


class MemoryPane(PaneWidget):
    """Watermark samples in, one short panel out. ``draws`` counts redraws (the bench)."""

    DEFAULT_CSS = """
    MemoryPane { width: 1fr; border: round #4c566a; padding: 0 1;
                 text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sample: ev.Watermark | None = None
        self.note = ""
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.draws = 0
        self.frame = EMPTY
        self.kv = (0, 0)  # K/V bytes per block and per token (0: the source does not know)

    def on_mount(self) -> None:
        """Twice a second a redraw (the sparkline, the device line) without new samples."""
        self.set_interval(0.5, self.refresh)

    def paint(self, p: Paint) -> None:
        """Take every watermark sample of the delta (so the sparkline does not depend on the
        frame rate), then the frame's pool line."""
        for sample in p.delta.watermarks[-HISTORY:]:
            self.push(sample, p.status.memory_note)
        kv = (p.status.kv_bytes_per_block, p.status.kv_bytes_per_token)
        if kv != self.kv:
            self.kv = kv
            self.refresh()
        self.show(p.frame)

    def show(self, frame: Frame) -> None:
        """The pool line follows the frame's used blocks (the mirror's, at the frame's seq),
        not the last sample's: a sample can be a batch older than the other panes."""
        if (frame.used_blocks, frame.num_blocks) != (self.frame.used_blocks,
                                                       self.frame.num_blocks):
            self.refresh()
        self.frame = frame

    def push(self, sample: ev.Watermark, note: str) -> None:
        """Record a sample: device fraction when NVML reports, else pool fraction."""
        self.sample, self.note = sample, sample.note or note  # the engine says why, if it can
        if sample.device_used is not None and sample.device_total:
            self.history.append(sample.device_used / sample.device_total)
        elif sample.total_blocks:
            self.history.append(sample.used_blocks / sample.total_blocks)
        self.refresh()

    def pool_line(self) -> str:
        """``pool 1,204/2,048 blocks 58.8%``: the frame's used blocks."""
        used, total = self.frame.used_blocks, self.frame.num_blocks
        return f"pool {used:,}/{total:,} blocks {used / total if total else 0.0:5.1%}"

    def render(self) -> Text:
        """Device line (or the NVML note), pool line and bar, K/V bytes, watermarks,
        sparkline (the last line: at 80x24 it is the one that does not fit)."""
        self.draws += 1
        s, width = self.sample, max(10, self.size.width - 2)
        out = Text(no_wrap=True, overflow="ellipsis")
        if s is None:
            return Text("waiting for a watermark sample…", style="dim")
        if s.device_used is not None and s.device_total:
            gib = f"{s.device_used / GIB:6.1f} / {s.device_total / GIB:.1f} GiB"
            out.append(f"GPU  {gib}\n", "bold")
        else:
            out.append((self.note or "NVML unavailable") + "\n", "#e5c07b")
        used, total = self.frame.used_blocks, self.frame.num_blocks
        frac = used / total if total else 0.0
        out.append(self.pool_line() + "\n")
        out.append_text(pool_bar(frac, s.high, s.low, width))
        kv = kv_line(*self.kv, self.size.width)
        if kv:
            out.append(f"\n{kv}", "#7fd4ff")
        out.append(f"\nhigh {s.high:.0%}  low {s.low:.0%}\n", "dim")
        out.append(sparkline(list(self.history), width), "#7fd4ff")
        return out
