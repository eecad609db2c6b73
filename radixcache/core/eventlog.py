"""EventLog: the events the tree and its collaborators record, drained in one list swap.

Each writer checks ``on`` before building an event, so with events off a change costs one
attribute read and no event object (the quiet `bench tree` replay measures that path).
"""

from __future__ import annotations

from radixcache.core import events as ev


class EventLog:
    """Events in the order they happened, since the last ``take``. Not thread-safe: the tree's
    lock guards it like the rest of the tree."""

    __slots__ = ("_events", "on")

    def __init__(self, *, on: bool) -> None:
        self.on = on  # False: writers record nothing
        self._events: list[ev.AnyEvent] = []

    def emit(self, event: ev.AnyEvent) -> None:
        """Append ``event`` (callers check ``on`` first, before building it)."""
        self._events.append(event)

    def take(self) -> list[ev.AnyEvent]:
        """Every event since the last call, in order; the log starts a new list."""
        out = self._events
        self._events = []
        return out
