"""The command line: parse, validate, complete, remember.

``parse`` turns what a person typed into a typed ``radixcache.wire.commands`` command, or says
exactly why not; a workload command is checked by building it (the workloads' own rules),
so nothing invalid is ever sent.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from textual.binding import Binding, BindingType
from textual.widgets import Input

from radixcache.serving.policy import Policy
from radixcache.traffic.workloads import WORKLOADS, WorkloadError, build_workload
from radixcache.wire import commands as cmd

CONTROL = ("pause", "resume", "reset", "stats", "snapshot", "evict", "watermark", "schedule")
LOCAL = ("filter", "help", "quit", "why")
SCHEDULES = tuple(p.value for p in Policy)
WORDS = tuple(sorted((*WORKLOADS, *CONTROL, *LOCAL)))


USAGE = {
    "evict": "evict TOKENS (e.g. evict 4096)",
    "watermark": "watermark HIGH LOW, fractions of the pool (e.g. watermark 0.9 0.8)",
    "schedule": "schedule fcfs|lpm|dfs-weight (e.g. schedule lpm)",
    "chat": "chat CONVERSATIONS [--seed N] (e.g. chat 20)",
    "system": "system USERS (e.g. system 50)",
    "tot": "tot DEPTH BRANCHING (e.g. tot 3 4)",
    "fork": "fork BRANCHES (e.g. fork 8)",
    "flood": "flood REQUESTS (e.g. flood 500)",
    "why": "why REQ: why request REQ missed (e.g. why 42)",
}


class Parsed(NamedTuple):
    """A command to send, or a local action (``filter``/``help``/``quit``) with its args, or
    an error message (exactly one of the three is set). ``note`` says what a workload
    command will submit (``20 conversations, 64 requests``)."""

    command: cmd.AnyCommand | None
    local: tuple[str, ...] | None
    error: str | None
    note: str = ""


def _error(text: str) -> Parsed:
    return Parsed(None, None, text)


def _controls(head: str, rest: list[str]) -> Parsed | None:
    """Check ``evict``/``watermark`` arguments here, so a mistake names the usage."""
    if head == "evict":
        if len(rest) != 1 or not rest[0].isdigit():
            return _error(f"usage: {USAGE['evict']}")
    elif head == "watermark":
        try:
            high, low = (float(w) for w in rest)
        except ValueError:
            return _error(f"usage: {USAGE['watermark']}")
        if not 0 < low <= high <= 1:
            return _error("watermark needs 0 < LOW <= HIGH <= 1, e.g. watermark 0.9 0.8")
    elif head == "schedule" and (len(rest) != 1 or rest[0] not in SCHEDULES):
        return _error(f"usage: {USAGE['schedule']}")
    return None


def parse(line: str) -> Parsed:
    """What ``line`` asks for. Never raises; a bad line gives ``Parsed.error``."""
    words = line.split()
    if words and words[0] in LOCAL:
        return Parsed(None, tuple(words), None)
    if words and words[0].lower() not in WORDS:
        return _error(f"unknown command {words[0]!r} (commands: {' '.join(WORDS)})")
    bad = _controls(words[0].lower(), words[1:]) if words else None
    if bad is not None:
        return bad
    try:
        command = cmd.parse_command_line(line)
    except cmd.CommandError as err:
        return _error(str(err))
    if isinstance(command, cmd.StartWorkload):
        try:
            workload = build_workload(command.name, command.args)
        except WorkloadError as err:
            return _error(f"{err} (usage: {USAGE[command.name]})")
        return Parsed(command, None, None, explain(command.name, workload.params,
                                                  len(workload.requests)))
    return Parsed(command, None, None)


def explain(name: str, params: dict[str, int], requests: int) -> str:
    """Where a workload's request count comes from, in its own unit (``20 conversations
    (every turn is a request)``, ``tree of thought 1 + 4 + 16 + 64``)."""
    p = params
    match name:
        case "chat":
            unit = f"{p.get('conversations', 0):,} conversations (every turn is a request)"
        case "system":
            users = p.get("users", 0)
            unit = f"{users:,} users' first questions + {requests - users:,} second questions"
        case "fork":
            unit = f"1 base + {p.get('branches', 0):,} branches"
        case "tot":
            b, d = p.get("branching", 0), p.get("depth", 0)
            unit = "tree of thought " + " + ".join(f"{b ** i:,}" for i in range(d + 1))
        case _:
            unit = f"{requests:,} {name} requests"
    return unit


def complete(text: str) -> str:
    """Complete the first word to the longest common prefix of the commands it starts."""
    if " " in text:
        return text
    hits = [w for w in WORDS if w.startswith(text)]
    if not hits:
        return text
    common = hits[0]
    for w in hits[1:]:
        while not w.startswith(common):
            common = common[:-1]
    return common + " " if len(hits) == 1 else common


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
