"""The replay bar: a timeline with the keyframes, the play head, the speed and any damage."""

from __future__ import annotations

from rich.text import Text

from inspector.sources import ReplayPosition


def timeline(pos: ReplayPosition, width: int) -> Text:
    """`` ▶ ───┼──●──┼─── 120/400 ×2  p . , < > [ ]`` fitted to ``width`` columns."""
    width = max(10, width - 40 - (len(pos.note) + 4 if pos.note else 0))
    cells = ["─"] * width
    for k in pos.keyframes:
        cells[min(width - 1, k * width // max(1, pos.total))] = "┼"
    at = min(width - 1, pos.index * width // max(1, pos.total))
    out = Text(" ▶ " if pos.playing else " ❚❚ ", "bold #c792ea", no_wrap=True)
    out.append("".join(cells[:at]), "#c792ea")
    out.append("●", "bold #ffffff")
    out.append("".join(cells[at + 1 :]), "dim")
    out.append(f" {pos.index:,}/{pos.total:,} ×{pos.speed:g}  p . , > < ] [", "dim")
    if pos.note:
        out.append(f"  ✗ {pos.note}", "bold #e06c75")
    return out
