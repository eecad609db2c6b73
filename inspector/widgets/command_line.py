"""The command line: parse, validate, complete, remember.

``parse`` turns what a person typed into a typed ``radixcache.wire.commands`` command, or says
exactly why not; a workload command is checked by building it (the workloads' own rules),
so nothing invalid is ever sent.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import Input

from inspector.words import LOCAL, main_words, usage_line
from radixcache.traffic.workloads import WORKLOADS, WorkloadError, build_workload
from radixcache.wire import commands as cmd


class Parsed(NamedTuple):
    """A command to send, or a local action (``filter``/``help``/``quit``/``why``) with its
    args, or an error message (exactly one of the three is set). ``note`` says what a
    workload command will submit (``20 conversations, 64 requests``)."""

    command: cmd.AnyCommand | None
    local: tuple[str, ...] | None
    error: str | None
    note: str = ""


def _error(text: str) -> Parsed:
    return Parsed(None, None, text)


def parse(line: str) -> Parsed:
    """What ``line`` asks for. Never raises; a bad line gives ``Parsed.error``."""
    words = line.split()
    if words and words[0] in LOCAL:
        return Parsed(None, tuple(words), None)
    known = main_words()
    if words and words[0].lower() not in known:
        return _error(f"unknown command {words[0]!r} (commands: {' '.join(sorted(known))})")
    try:
        command = cmd.parse_command_line(line)
    except cmd.CommandError as err:
        return _error(str(err))
    if isinstance(command, cmd.StartWorkload):
        try:
            workload = build_workload(command.name, command.args)
        except WorkloadError as err:
            return _error(f"{err} (usage: {usage_line(command.name)})")
        note = WORKLOADS[command.name].explain(workload.params, len(workload.requests))
        return Parsed(command, None, None, note)
    return Parsed(command, None, None)


def complete(text: str) -> str:
    """Complete the first word to the longest common prefix of the commands it starts."""
    if " " in text:
        return text
    hits = sorted(w for w in main_words() if w.startswith(text))
    if not hits:
        return text
    common = hits[0]
    for w in hits[1:]:
        while not w.startswith(common):
            common = common[:-1]
    return common + " " if len(hits) == 1 else common


# what the command line suggests in replay mode: a recording takes the replay keys and the
# commands that only read (the live placeholder's workloads would be refused)
REPLAY_HINT = "p play/pause · . step · , back · < > keyframe · [ ] speed · why REQ · filter KIND"


class CommandLine(Input):
    """An ``Input`` with tab completion and an up/down history."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("tab", "complete", "Complete", show=False, priority=True),
        Binding("up", "history(-1)", "History", show=False),
        Binding("down", "history(1)", "History", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="chat 20 · tot 3 4 · evict 4096 · watermark 0.9 0.8 · pause",
                         id=id)
        self.history: list[str] = []
        self._at = 0

    async def _on_key(self, event: events.Key) -> None:
        """A ``:`` or ``/`` on an empty line is the key that opened it, not text, so
        ``::fork 2`` cannot become "unknown command ':fork'"; after the first character they
        are text (``why 3:4/5``). Decided here, in the order the keys reach the line (a burst
        of keys waits in its queue while the app already reads the next)."""
        if event.character in (":", "/") and not self.value:
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def remember(self, line: str) -> None:
        """Append to the history (no immediate duplicates) and reset the cursor."""
        if line and (not self.history or self.history[-1] != line):
            self.history.append(line)
        self._at = len(self.history)

    def action_complete(self) -> None:
        """Tab: complete the command word."""
        self.value = complete(self.value)
        self.cursor_position = len(self.value)

    def action_history(self, step: int) -> None:
        """Up/down: walk the history; past the newest entry gives an empty line."""
        if not self.history:
            return
        self._at = max(0, min(len(self.history), self._at + step))
        self.value = self.history[self._at] if self._at < len(self.history) else ""
        self.cursor_position = len(self.value)
