"""The closed set of commands an engine accepts, and its replies (msgpack via msgspec).

A command is one msgpack array whose first item is its tag::

    ["start", "chat", ["20", "--seed", "7"]]     StartWorkload(name, args)
    ["pause"]  ["resume"]  ["reset"]  ["stats"]  ["snapshot"]
    ["watermark", 0.9, 0.8]                      SetWatermark(high, low)
    ["evict", 4096]                              Evict(tokens)
    ["schedule", "lpm"]                          SetSchedule(policy)

Anything else (unknown tag, wrong field types, trailing garbage) fails to decode and the
engine answers ``Error``. Replies are ``["ok", message, {name: number|string}]``,
``["error", message]`` or, to ``stats`` only, ``["stats", {figures}, {stream}, {socket}]``
(``StatsReply``: typed figures, each layer's in its own struct).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import msgspec

MAX_COMMAND_BYTES = 64 * 1024
# The command socket reads frames up to this size, so a command over ``MAX_COMMAND_BYTES`` is
# read and answered with an error; ZeroMQ drops a larger frame with its connection unanswered.
MAX_COMMAND_READ_BYTES = 1024 * 1024


class Command(msgspec.Struct, tag_field="cmd", array_like=True, forbid_unknown_fields=True):
    """Base of every command."""


class StartWorkload(Command, tag="start"):
    """Start the named workload (``traffic.workloads``) with command-line style args."""

    name: str
    args: list[str] = []


class Pause(Command, tag="pause"):
    """Stop admitting new requests; running ones finish."""


class Resume(Command, tag="resume"):
    """Admit requests again."""


class SetWatermark(Command, tag="watermark"):
    """Set the eviction band: past ``high`` (fraction of blocks used) evict down to ``low``."""

    high: float
    low: float


class Evict(Command, tag="evict"):
    """Evict at least ``tokens`` tokens of unlocked LRU leaves (or as many as can go)."""

    tokens: int


class Reset(Command, tag="reset"):
    """Empty the cache; waiting and running requests are cancelled first."""


class Stats(Command, tag="stats"):
    """Reply with the engine's counters (``StatsReply``)."""


class SchedulePolicy(enum.StrEnum):
    """A scheduling policy, as ``schedule`` and ``--schedule`` name it (``serving.policy``
    orders the waiting queue by it)."""

    FCFS = "fcfs"
    LPM = "lpm"
    DFS_WEIGHT = "dfs-weight"

    @property
    def cache_aware(self) -> bool:
        """True for the policies that match waiting requests against the tree (and hold a
        request for a running request's insert)."""
        return self is not SchedulePolicy.FCFS

    @classmethod
    def parse(cls, word: str) -> SchedulePolicy:
        """The policy named ``word``; ``ValueError`` naming the choices otherwise."""
        try:
            return cls(word)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown schedule {word!r}: choose one of {names}") from None


class SetSchedule(Command, tag="schedule"):
    """Order the waiting queue by ``policy`` from the next step on."""

    policy: SchedulePolicy


class TakeSnapshot(Command, tag="snapshot"):
    """Publish a full ``Snapshot`` event in the stream (a keyframe for recorders)."""


AnyCommand = (
    StartWorkload | Pause | Resume | SetWatermark | Evict | Reset | Stats | TakeSnapshot
    | SetSchedule
)


class Reply(msgspec.Struct, tag_field="status", array_like=True):
    """Base of the two replies."""


class Ok(Reply, tag="ok"):
    """The command was done; ``values`` carries figures (``stats``) or ids."""

    message: str
    values: dict[str, float | int | str] = {}


class Error(Reply, tag="error"):
    """The command was refused or failed; ``message`` says why, for a person to read."""

    message: str


class StreamFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the serving loop adds to a ``stats`` reply: the ``seq`` of the last batch it
    published, how many ``batches``, the cache's ``digest`` now, the rounds of its command
    program, the program's error and the worker fault when there is one, and the step
    timeline's figures (``timeline_steps``, p50/p99/max ms of each phase)."""

    seq: int
    batches: int
    digest: str
    program_rounds: int
    program_error: str | None = None
    fault: str | None = None
    timeline: dict[str, float | int] = {}  # the last steps' phases (``serving.timeline``)


class SocketFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the command socket refused: commands over ``MAX_COMMAND_BYTES`` (answered with an
    error) and connections ZeroMQ dropped for a frame over ``MAX_COMMAND_READ_BYTES``."""

    commands_too_large: int
    command_connections_dropped: int


class StatsReply(Reply, tag="stats"):
    """The answer to ``stats``. ``stats`` is the cache's ``serving.stats.Stats`` as its own
    msgpack map, carried as it came (this layer does not name the service's figures: read it
    with ``Stats.of``); ``stream`` is the loop's and ``socket`` the command socket's, each
    absent when the reply did not pass that layer (an in-process service, an embedded loop)."""

    stats: msgspec.Raw
    stream: StreamFigures | None = None
    socket: SocketFigures | None = None

    @property
    def message(self) -> str:
        """Its one-line wording, as every reply has one: ``stats``."""
        return "stats"


AnyReply = Ok | Error | StatsReply
_REPLY_TAGS = frozenset(t.__struct_config__.tag for t in (Ok, Error, StatsReply))


class CommandError(ValueError):
    """Bytes that are not one of the commands."""


_ENCODER = msgspec.msgpack.Encoder()
_COMMAND = msgspec.msgpack.Decoder(AnyCommand)
_REPLY = msgspec.msgpack.Decoder(AnyReply)


def encode_command(command: AnyCommand) -> bytes:
    """msgpack bytes of ``command``."""
    return _ENCODER.encode(command)


def decode_command(data: bytes) -> AnyCommand:
    """The typed command in ``data``; raises ``CommandError`` with a readable reason."""
    if len(data) > MAX_COMMAND_BYTES:
        raise CommandError(f"command of {len(data)} bytes exceeds {MAX_COMMAND_BYTES}")
    try:
        return _COMMAND.decode(data)
    except msgspec.DecodeError as exc:
        raise CommandError(f"not a command: {exc}") from None


def encode_reply(reply: AnyReply) -> bytes:
    """msgpack bytes of ``reply``."""
    return _ENCODER.encode(reply)


def decode_reply(data: bytes) -> AnyReply:
    """The reply in ``data``; raises ``CommandError`` when it is not one."""
    try:
        return _REPLY.decode(data)
    except msgspec.DecodeError as exc:
        raise CommandError(_newer(data) or f"not a reply: {exc}") from None


def _newer(data: bytes) -> str:
    """Why a reply did not decode, when its tag is one this reader does not know (a newer
    engine's reply: the command protocol has no version number, a new reply is a new tag);
    empty otherwise."""
    try:
        items: object = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return ""
    head = items[0] if isinstance(items, list) and items else None
    if not isinstance(head, str) or head in _REPLY_TAGS:
        return ""
    return (f"reply {head!r} is not one this client reads: the engine is a newer radixcache "
            "(upgrade this client)")


def stats_reply(reply: AnyReply) -> StatsReply:
    """``reply`` as the answer to ``stats``; ``CommandError`` saying what came instead (the
    error's message, or an ``ok`` reply: an engine older than the typed ``stats`` reply)."""
    match reply:
        case StatsReply():
            return reply
        case Error():
            raise CommandError(reply.message)
        case Ok():
            raise CommandError("the engine answered stats with an untyped reply: it is an older "
                               "radixcache than this client (upgrade the engine)")


class Control(NamedTuple):
    """A control word as a person types it: ``usage`` (``evict TOKENS``), an ``example``, what
    it ``does`` (the help line), and ``build``, which makes the command from the words after
    it or raises ``CommandError`` with the message to show."""

    usage: str
    example: str
    does: str
    build: Callable[[list[str]], AnyCommand]

    @property
    def word(self) -> str:
        """The word that starts it."""
        return self.usage.split()[0]

    def usage_line(self) -> str:
        """``usage`` with its example: what a mistake is answered with."""
        return f"{self.usage} (e.g. {self.example})"


def _bare(command: AnyCommand) -> Callable[[list[str]], AnyCommand]:
    def build(rest: list[str]) -> AnyCommand:
        if rest:
            raise CommandError(f"{type(command).__struct_config__.tag} takes no arguments")
        return command
    return build


def _evict(rest: list[str]) -> AnyCommand:
    if len(rest) != 1 or not (rest[0].isascii() and rest[0].isdigit()):
        raise CommandError(f"usage: {CONTROLS['evict'].usage_line()}")
    return Evict(int(rest[0]))


def _watermark(rest: list[str]) -> AnyCommand:
    try:
        high, low = (float(w) for w in rest)
    except ValueError:
        raise CommandError(f"usage: {CONTROLS['watermark'].usage_line()}") from None
    if not 0 < low <= high <= 1:
        raise CommandError("watermark needs 0 < LOW <= HIGH <= 1, e.g. watermark 0.9 0.8")
    return SetWatermark(high, low)


def _schedule(rest: list[str]) -> AnyCommand:
    if len(rest) != 1:
        raise CommandError(f"usage: {CONTROLS['schedule'].usage_line()}")
    try:
        return SetSchedule(SchedulePolicy.parse(rest[0]))
    except ValueError as exc:
        raise CommandError(str(exc)) from None


# The control words, in the order help lists them. A first word that is none of these names a
# workload (``traffic.workloads.WORKLOADS``).
CONTROLS: Mapping[str, Control] = MappingProxyType({c.word: c for c in (
    Control("evict TOKENS", "evict 4096", "evict at least TOKENS tokens of LRU leaves", _evict),
    Control("watermark HIGH LOW, fractions of the pool", "watermark 0.9 0.8",
            "evict past HIGH down to LOW", _watermark),
    Control("pause", "pause", "stop admitting requests", _bare(Pause())),
    Control("resume", "resume", "admit requests again", _bare(Resume())),
    Control("reset", "reset", "empty the cache", _bare(Reset())),
    Control("stats", "stats", "the engine's counters", _bare(Stats())),
    Control("snapshot", "snapshot", "publish a keyframe", _bare(TakeSnapshot())),
    Control("schedule fcfs|lpm|dfs-weight", "schedule lpm",
            "order the waiting queue by this policy", _schedule),
)})


def parse_command_line(line: str) -> AnyCommand:
    """A command typed by a person (``chat 20``, ``evict 4096``, ``watermark 0.9 0.8``, ``pause``).

    A first word that is not a control word (``CONTROLS``) names a workload. Raises
    ``CommandError`` with the message to show.
    """
    words = line.split()
    if not words:
        raise CommandError("empty command")
    head, rest = words[0].lower(), words[1:]
    control = CONTROLS.get(head)
    return control.build(rest) if control is not None else StartWorkload(head, rest)
