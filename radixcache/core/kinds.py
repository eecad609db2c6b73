"""The event kinds, and the check that a dispatcher over them forgets none.

``KINDS`` is every event class of ``AnyEvent`` in its order; ``TAGS`` their wire tags. A
module that does something per kind of event holds a table from event class to handler and
builds it with ``exhaustive``: every kind is either handled or named as ignored, or the
module fails to import with a line that says which kinds it lacks. A dispatcher written as a
``match`` ends with ``assert_never`` instead, so mypy proves the same thing.

Adding a kind (a struct in ``core/events.py``, in ``AnyEvent``) therefore fails every
dispatcher that has not decided what to do with it: the list in docs/architecture.md ("Where
things go") is the list ``tests/test_kinds.py`` checks against the code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar, get_args

from radixcache.core import events as ev

KINDS: tuple[type[ev.Event], ...] = get_args(ev.AnyEvent)
TAGS: Mapping[type[ev.Event], str] = MappingProxyType(
    {k: str(k.__struct_config__.tag) for k in KINDS}
)

H = TypeVar("H")


class KindsError(TypeError):
    """A dispatch table that does not account for every event kind exactly once: a bug."""


def tag(e: ev.AnyEvent) -> str:
    """The event's wire tag (``split``, ``evict``, ...)."""
    return TAGS[type(e)]


def exhaustive(
    where: str, table: Mapping[type[ev.Event], H], ignored: Iterable[type[ev.Event]] = ()
) -> Mapping[type[ev.Event], H]:
    """``table`` made read-only, once it is checked that every kind in ``KINDS`` is in it or
    in ``ignored`` and none in both; raises ``KindsError`` naming ``where`` and the kinds."""
    ignored = frozenset(ignored)
    handled = frozenset(table)
    problems = []
    if missing := set(KINDS) - handled - ignored:
        problems.append(f"lacks {_names(missing)}")
    if twice := handled & ignored:
        problems.append(f"both handles and ignores {_names(twice)}")
    if unknown := (handled | ignored) - set(KINDS):
        problems.append(f"names non-events {_names(unknown)}")
    if problems:
        raise KindsError(f"{where}: " + "; ".join(problems))
    return MappingProxyType(dict(table))


def _names(kinds: Iterable[type]) -> str:
    return ", ".join(sorted(k.__name__ for k in kinds))
