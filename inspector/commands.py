"""The command line's other half: send a parsed command from a worker, show the reply.

The engine words its replies (``queued (engine paused)``, why an ``evict`` freed nothing);
this adds where a workload's request count comes from, in the workload's own unit (``chat:
64 requests submitted (...); 20 conversations (every turn is a request)``), and leaves out
reply values the message already says.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import ClassVar

import msgspec
from rich.text import Text
from textual.app import App
from textual.widgets import Static

from inspector.sources import Source
from inspector.widgets.command_line import CommandLine, Parsed, parse
from inspector.widgets.event_log import KINDS, NOISY, EventLog
from inspector.widgets.stats import StatsPane
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd

MESSAGES_KEPT = 100  # the last messages shown, newest last
NOTE_AFTER_S = 5.0  # a note this soon after a reply joins the reply's line


class CommandReplies:
    """Messages and replies of one app: the last ``MESSAGES_KEPT`` messages shown, how many
    replies came back, and ``command_ms``, the time from enter to reply."""

    def __init__(self, app: App[None], source: Source, show_help: Callable[[], None],
                 explain: Callable[[int], None]) -> None:
        self.app = app
        self.source = source
        self.show_help = show_help
        self.explain = explain
        self.messages: deque[str] = deque(maxlen=MESSAGES_KEPT)
        self.replies = 0
        self.command_ms: deque[float] = deque(maxlen=10_000)
        self._shown = (Text(), -1e9)  # the message line and when it was said

    def submit(self, value: str) -> None:
        """Parse ``value``; say what is wrong, or send it from a worker thread."""
        line = value.strip()
        box = self.app.query_one("#command", CommandLine)
        box.value = ""
        if not line:
            return
        box.remember(line)
        parsed = parse(line)
        if parsed.error is not None:
            self.say(f"✗ {parsed.error} — nothing sent", error=True)
        elif parsed.local is not None:
            self._local(parsed.local)
        elif parsed.command is not None:
            self.say(f"→ {line}")
            self.app.run_worker(partial(self._send, line, parsed, time.perf_counter()),
                                thread=True, group="send")

    def _send(self, line: str, parsed: Parsed, t0: float) -> None:
        assert parsed.command is not None
        reply = self.source.send(parsed.command)
        self.app.call_from_thread(self._replied, line, parsed, reply, t0)

    def _replied(self, line: str, parsed: Parsed, reply: cmd.AnyReply, t0: float) -> None:
        self.command_ms.append((time.perf_counter() - t0) * 1000)
        self.replies += 1
        if isinstance(reply, cmd.StatsReply):
            try:
                self.say(f"✓ stats {stats_line(reply)}")
                self.app.query_one(StatsPane).stats_reply(Stats.of(reply))
            except cmd.CommandError as exc:
                self.say(f"✗ {line}: {exc}", error=True)
            return
        if isinstance(reply, cmd.Error):
            self.say(f"✗ {line}: {reply.message}", error=True)
            return
        extra = "  ".join(f"{k}={v}" for k, v in reply.values.items()
                          if str(v) not in reply.message)
        text = f"✓ {reply.message} {extra}".rstrip()
        if isinstance(parsed.command, cmd.StartWorkload):
            text += f"; {parsed.note}"
        self.say(text)

    def _local(self, words: tuple[str, ...]) -> None:
        self.LOCAL[words[0]](self, words[1:])

    def _help(self, _: tuple[str, ...]) -> None:
        self.show_help()

    def _quit(self, _: tuple[str, ...]) -> None:
        self.app.exit()

    def _why(self, rest: tuple[str, ...]) -> None:
        if len(rest) != 1 or not (rest[0].isascii() and rest[0].isdigit()):
            self.say("✗ usage: why REQ (a request id, as the event log shows it)", error=True)
            return
        self.explain(int(rest[0]))

    def _filter(self, rest: tuple[str, ...]) -> None:
        everything = frozenset(KINDS) - NOISY
        kinds = everything if rest == ("all",) else frozenset(rest)
        unknown = kinds - set(KINDS)
        if unknown or not kinds:
            self.say(f"✗ usage: filter KIND... or filter all; kinds: {' '.join(KINDS)}",
                     error=True)
            return
        self.app.query_one("#events", EventLog).set_kinds(kinds)
        noisy = ", ".join(k for k in KINDS if k in NOISY)
        hidden = f" (heartbeats {noisy} hidden: filter wm shows them)" if (
            rest == ("all",)) else ""
        self.say(f"✓ showing {' '.join(k for k in KINDS if k in kinds)}{hidden}")

    # one per ``inspector.words.LOCAL`` (a test checks)
    LOCAL: ClassVar[Mapping[str, Callable[[CommandReplies, tuple[str, ...]], None]]] = {
        "help": _help, "quit": _quit, "why": _why, "filter": _filter}

    def say(self, text: str, *, error: bool = False) -> None:
        """Show a one-line message above the command line (in red for an error)."""
        self.messages.append(text)
        style = "bold #e06c75" if error else "#98c379"
        self._shown = (Text(text, style), time.monotonic())
        self.app.query_one("#message", Static).update(self._shown[0])

    def note(self, text: str) -> None:
        """A consequence of what just happened (the selection followed a merge, or cleared):
        after a reply of the last ``NOTE_AFTER_S`` it is added to that line, not put over it
        (a reset's reply was replaced by "selection cleared" at once)."""
        shown, at = self._shown
        if time.monotonic() - at > NOTE_AFTER_S or not shown.plain.startswith(("✓", "✗")):
            self.say(text)
            return
        self.messages.append(text)
        line = shown + Text(f" · {text}", "dim")
        self.app.query_one("#message", Static).update(line)


def stats_line(reply: cmd.StatsReply) -> str:
    """``name=value`` of every figure a ``stats`` reply carries: the cache's and its two
    rates, then the stream's and the command socket's when it passed them (a figure without a
    value left out); ``CommandError`` when the cache's are no ``Stats``."""
    stats = Stats.of(reply)
    rates = {"hit_rate": round(stats.hit_rate, 4),
             "decode_tokens_per_s": round(stats.decode_tokens_per_s, 1)}
    parts = [msgspec.structs.asdict(p) for p in (stats, reply.stream, reply.socket)
             if p is not None]
    return "  ".join(f"{k}={v}" for p in (parts[0], rates, *parts[1:])
                     for k, v in p.items() if v is not None)
