"""The frames between an HTTP front process and the engine process it serves (msgpack via
msgspec, never pickle): requests in, each request's tokens out.

The engine binds a ROUTER (``ipc://`` or 127.0.0.1 only, as every endpoint of ``serve``); each
front connects a DEALER and is told apart by its ZeroMQ identity, so several fronts can share
one engine. A front also binds a PULL of its own and names it in its ``Hello``: the engine
connects a PUSH to it and sends that front everything through it, from the thread that has
it (the stepping thread, after each step), so no thread of the engine's process wakes per
step to forward tokens (a front that names none is answered through the ROUTER, by the
port's thread). One ZeroMQ message is one frame, a msgpack array whose first item is its
tag::

    front -> engine
      ["hello", out]                              Hello: answered with Facts (through
                                                  ``out``, and everything after)
      ["submit", fid, prompt, max_new, sampling]  Submit: fid is the front's own request id
      ["abort", fid]                              Abort (the client left, a drain's cut)
      ["ask", qid, "counters" | "flush"]          Ask: answered with Answer(qid, ...)
      ["ready"] ["draining", n] ["drained", ...]  the front's part of serve's drain
    engine -> front
      ["facts", ...]                              Facts: what the front needs to start
      ["tokens", [[fid, token, logprob], ...]]    Tokens: one step's chosen tokens, in order
      ["done", fid, error, message, metrics]      Done: a request ended (after its tokens)
      ["answer", qid, counters, flush]            Answer
      ["drain", grace_s] ["cut", reason]          serve's SIGTERM, and its second one

Towards one front the order is the engine's: a request's ``Done`` comes after its last
``Tokens``. A frame that does not decode is dropped by its reader (counted), never
executed.
"""

from __future__ import annotations

import os

import msgspec

MAX_FRAME_BYTES = 16 << 20  # a prompt of the whole context fits many times over


class Frame(msgspec.Struct, tag_field="f", array_like=True, forbid_unknown_fields=True):
    """Base of every frame."""


class SamplingFrame(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A request's sampling parameters and stop rules (``serving.sampling.Sampling``) and the
    end-of-sequence ids its answer stops at unless ``ignore_eos``."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    stop: list[str] = []
    stop_ids: list[int] = []
    ignore_eos: bool = False
    eos_ids: list[int] = []


class Hello(Frame, tag="hello"):
    """A front asks what it needs to start; ``out`` is the endpoint of its own PULL, which the
    engine sends it everything through from then on (``ipc://`` in the engine endpoint's
    directory, or a loopback ``tcp://``; empty: through the ROUTER)."""

    out: str = ""


class Facts(Frame, tag="facts"):
    """What the engine tells a front: its limits, its model's name and tokenizer."""

    vocab_size: int
    id_space: int  # prompt ids the model reads: ``[0, id_space)``
    max_context: int
    kv_bytes_per_block: int
    model: str | None  # a checkpoint's name (None: the seeded model, the front's default)
    tokenizer_dir: str | None  # the checkpoint folder whose tokenizer.json to load
    eos_ids: list[int] = []


class Submit(Frame, tag="submit"):
    """Queue one request; ``fid`` names it on this front's connection."""

    fid: int
    prompt: list[int]
    max_new: int
    sampling: SamplingFrame


class Abort(Frame, tag="abort"):
    """Drop request ``fid`` (no reply: its ``Done`` says cancelled, if it was running)."""

    fid: int


class Ask(Frame, tag="ask"):
    """A question answered with ``Answer(qid)``: the engine's counters, a flush, or a ping
    (answered by the engine's port thread at once, without waiting for a step: the engine's
    process is alive and reading its socket)."""

    qid: int
    what: str  # "counters" | "flush" | "ping"


class Logprob(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One chosen token's log-probability and the top alternatives (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


class Tokens(Frame, tag="tokens"):
    """Tokens chosen since the last ``Tokens`` frame: ``(fid, token, logprob or None)``."""

    items: list[tuple[int, int, Logprob | None]]


class DoneMetrics(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A finished request's figures (``serving.requests.RequestMetrics``)."""

    request: int
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float
    latency_ms: float
    decode_tokens_per_s: float


class Done(Frame, tag="done"):
    """Request ``fid`` ended: ``error`` None (``metrics`` set), or ``rejected``,
    ``cancelled``, ``failed`` or ``invalid`` with the engine's ``message``."""

    fid: int
    error: str | None
    message: str
    metrics: DoneMetrics | None


class Answer(Frame, tag="answer"):
    """The answer to ``Ask(qid)``: ``counters`` (name -> figure) or ``flush`` (the
    requests waiting and running a flush found: none means the cache was emptied)."""

    qid: int
    counters: dict[str, int] | None = None
    flush: tuple[int, int] | None = None
    error: str | None = None


class Ready(Frame, tag="ready"):
    """The front serves HTTP."""


class Drain(Frame, tag="drain"):
    """Stop admitting (serve got SIGTERM): answered with ``Draining``; the requests in
    flight get ``grace_s`` seconds, then the front answers ``Drained`` and exits."""

    grace_s: float


class Cut(Frame, tag="cut"):
    """End the drain now (its grace is over, a second signal): the requests in flight are
    answered 503 saying ``reason``."""

    reason: str


class Draining(Frame, tag="draining"):
    """The front stopped admitting with ``in_flight`` HTTP requests in flight."""

    in_flight: int


class Drained(Frame, tag="drained"):
    """How the front's drain went (``serving.http.Drained``); the front exits next."""

    in_flight: int
    cut: int
    reason: str | None


ToEngine = Hello | Submit | Abort | Ask | Ready | Draining | Drained
ToFront = Facts | Tokens | Done | Answer | Drain | Cut

_ENCODER = msgspec.msgpack.Encoder()
_TO_ENGINE = msgspec.msgpack.Decoder(ToEngine)
_TO_FRONT = msgspec.msgpack.Decoder(ToFront)


def encode(frame: Frame) -> bytes:
    """One frame's bytes."""
    return _ENCODER.encode(frame)


def to_engine(raw: bytes) -> ToEngine:
    """A frame from a front; ``msgspec.DecodeError`` for anything else."""
    if len(raw) > MAX_FRAME_BYTES:
        raise msgspec.DecodeError(f"frame of {len(raw)} bytes is over {MAX_FRAME_BYTES}")
    return _TO_ENGINE.decode(raw)


def to_front(raw: bytes) -> ToFront:
    """A frame from the engine; ``msgspec.DecodeError`` for anything else."""
    return _TO_FRONT.decode(raw)


def endpoint_dir(endpoint: str) -> str | None:
    """The directory of an ``ipc://`` endpoint (None for another transport)."""
    if not endpoint.startswith("ipc://"):
        return None
    return os.path.dirname(os.path.abspath(endpoint[len("ipc://"):]))


def out_allowed(out: str, ipc_dir: str | None) -> bool:
    """Whether a front's PULL at ``out`` is one to connect to: ``ipc://`` in the port's own
    directory ``ipc_dir`` (private to this user), or ``tcp://`` on the loopback."""
    if out.startswith("ipc://"):
        return ipc_dir is not None and endpoint_dir(out) == ipc_dir
    for host in ("tcp://127.0.0.1:", "tcp://[::1]:"):
        if out.startswith(host):
            return out[len(host):].isdigit()
    return False
