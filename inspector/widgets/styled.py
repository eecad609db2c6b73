"""Colours from the stylesheet for widgets that draw strips (``render_line``)."""

from __future__ import annotations

from rich.style import Style
from textual.widget import Widget


class Styled:
    """Rich styles of a widget's component classes (``app.tcss`` rules), looked up once and
    forgotten when the stylesheet changes (call ``clear`` from ``notify_style_update``)."""

    def __init__(self, widget: Widget) -> None:
        self.widget = widget
        self._cache: dict[str, Style] = {}

    def __call__(self, name: str) -> Style:
        """The style of component class ``name``; plain until the stylesheet is applied."""
        style = self._cache.get(name)
        if style is None:
            try:
                style = self.widget.get_component_rich_style(name, partial=True)
            except KeyError:  # not styled yet (before the first layout)
                return Style()
            self._cache[name] = style
        return style

    def clear(self) -> None:
        """Forget every style (the stylesheet changed)."""
        self._cache.clear()
