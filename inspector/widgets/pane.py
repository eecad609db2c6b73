"""What every pane of the main screen is: a widget made from its id alone, styled by its own
``DEFAULT_CSS`` (colours of its component classes stay in ``app.tcss``), and drawn by one
method, ``paint``, that takes the frame.

``inspector.panes.PANES`` names each pane's widget class; the app composes the panes from that
table and the painter calls ``paint`` on each, in the table's order, so a new pane is its row
there and its widget module.
"""

from __future__ import annotations

from typing import NamedTuple

from textual.widget import Widget

from inspector.feed import Delta
from inspector.frame import Frame
from inspector.sources import SourceStatus


class Paint(NamedTuple):
    """What a pane draws from: the frame, the delta that led to it (events for the log,
    watermark samples, nodes to flash), the wall time, the source's status, the request rate
    the header shows and how long a changed node stays highlighted."""

    frame: Frame
    delta: Delta
    wall: float
    status: SourceStatus
    req_per_s: float
    flash_s: float


class PaneWidget(Widget):
    """A pane: ``paint`` draws a frame; ``animating`` says it changes with time alone."""

    def paint(self, p: Paint) -> None:
        """Draw ``p.frame`` (skip the work when what this pane shows did not change)."""
        raise NotImplementedError(type(self).__name__)

    def animating(self) -> bool:
        """True while the pane must be painted even with a frame equal to the last one
        (the tree's highlights run out with time). Most panes: never."""
        return False
