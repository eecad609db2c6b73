"""The closed set of commands an engine accepts, and its replies (msgpack via msgspec).

A command is one msgpack array whose first item is its tag::

    ["start", "chat", ["20", "--seed", "7"]]     StartWorkload(name, args)
    ["pause"]  ["resume"]  ["reset"]  ["stats"]  ["snapshot"]
    ["watermark", 0.9, 0.8]                      SetWatermark(high, low)
    ["evict", 4096]                              Evict(tokens)
    ["schedule", "lpm"]                          SetSchedule(policy)

Anything else (unknown tag, wrong field types, trailing garbage) fails to decode and the
engine answers ``Error``. Replies are ``["ok", message, {name: number|string}]`` or
``["error", message]``.
"""

from __future__ import annotations

import msgspec

MAX_COMMAND_BYTES = 64 * 1024


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
    """Reply with the engine's counters."""


class SetSchedule(Command, tag="schedule"):
    """Order the waiting queue by ``policy`` (``fcfs``, ``lpm``, ``dfs-weight``) from the next
    step on."""

    policy: str


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


AnyReply = Ok | Error


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
        raise CommandError(f"not a reply: {exc}") from None


def parse_command_line(line: str) -> AnyCommand:
    """A command typed by a person (``chat 20``, ``evict 4096``, ``watermark 0.9 0.8``, ``pause``).

    A first word that is not a control word names a workload. Raises ``CommandError``.
    """
    words = line.split()
    if not words:
        raise CommandError("empty command")
    head, rest = words[0].lower(), words[1:]
    simple: dict[str, AnyCommand] = {
        "pause": Pause(), "resume": Resume(), "reset": Reset(), "stats": Stats(),
        "snapshot": TakeSnapshot(),
    }
    try:
        if head in simple:
            if rest:
                raise CommandError(f"{head} takes no arguments")
            return simple[head]
        if head == "evict":
            (tokens,) = rest
            return Evict(int(tokens))
        if head == "watermark":
            high, low = rest
            return SetWatermark(float(high), float(low))
        if head == "schedule":
            (policy,) = rest
            return SetSchedule(policy)
    except ValueError as exc:
        if isinstance(exc, CommandError):
            raise
        raise CommandError(f"usage: evict TOKENS | watermark HIGH LOW | schedule POLICY "
                           f"({exc})") from None
    return StartWorkload(head, rest)
