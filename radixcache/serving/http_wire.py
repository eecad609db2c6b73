"""``WireBackend``: the HTTP front's ``Backend`` when the engine runs in another process,
over the front wire (``wire.frontwire``; the engine's end is ``serving.engine_port``).

The front keeps everything it does in process: each request's ``RequestPolicy`` (built by
``http_run``) gets the engine's chosen tokens (``RequestPolicy.replay``) and decodes them, finds
its stop strings and hands the pieces to the stream as it would on the stepping thread; its
``RequestHandle`` is settled by the engine's ``Done``. Only the sampler runs in the engine (it
needs the logits).

One thread, ``rc-front-wire``, owns the DEALER and the front's PULL: it forwards what other
threads send (through an inproc PUSH under a lock) and handles what the engine sends (tokens,
ends, answers, drain orders). The PULL is bound beside the engine's ``ipc://`` endpoint (in its
private directory; on the loopback for a ``tcp://`` engine) and named in ``Hello``: the engine
sends everything through it from its stepping thread (``serving.engine_port``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import NamedTuple

import msgspec
import zmq

from radixcache.core import tokens as tk
from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving.engine import RequestHandle, TokenPolicy
from radixcache.serving.http_backend import Flush
from radixcache.serving.prometheus import Counters
from radixcache.serving.requests import (
    EngineError,
    RequestCancelled,
    RequestFailed,
    RequestMetrics,
    RequestRejected,
    RequestResult,
    TokenHook,
)
from radixcache.serving.sampling import RequestPolicy, TokenLogprob
from radixcache.wire import frontwire as fw
from radixcache.wire.endpoints import BindPolicy, bind, connect

ASK_TIMEOUT_S = 30.0  # a counters or flush question (it waits for a step)
PING_TIMEOUT_S = 2.0  # /health's question: the engine's port answers it without a step
LINGER_MS = 2000  # on close, how long what was sent may take to leave
_WIRES = itertools.count()


class EngineGone(RuntimeError):
    """The engine did not answer (it is not running, or not at that endpoint)."""


class _Remote(NamedTuple):
    """A request submitted over the wire: its handle, hook, policy and tokens so far."""

    handle: RequestHandle
    on_token: TokenHook | None
    policy: RequestPolicy | None
    tokens: list[int]


def _error(kind: str | None, message: str) -> EngineError:
    if kind == "rejected":
        return RequestRejected(message)
    if kind == "cancelled":
        return RequestCancelled(message)
    return RequestFailed(message)


def _sampling_frame(policy: TokenPolicy | None) -> fw.SamplingFrame:
    if not isinstance(policy, RequestPolicy):  # greedy to the end
        return fw.SamplingFrame()
    s = policy.sampling
    return fw.SamplingFrame(s.temperature, s.top_p, s.top_k, s.seed, s.logprobs,
                            list(s.stop), sorted(s.stop_ids), s.ignore_eos,
                            sorted(policy.eos_ids))


class WireBackend:
    """The engine at ``endpoint``, as a ``Backend``. ``start()`` (asks its ``Facts``), then
    ``close()``. ``on_drain(grace_s)`` and ``on_cut(reason)`` are serve's drain orders."""

    def __init__(self, endpoint: str, *, on_drain: Callable[[float], None] | None = None,
                 on_cut: Callable[[str], None] | None = None) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._dealer = ctx.socket(zmq.DEALER)
        for hwm in (zmq.SNDHWM, zmq.RCVHWM):  # nothing dropped or blocked at a mark: the
            self._dealer.setsockopt(hwm, 0)  # engine's ROUTER has none either
        connect(self._dealer, endpoint)
        n = next(_WIRES)
        self._in = ctx.socket(zmq.PULL)
        self._in.setsockopt(zmq.RCVHWM, 0)
        self._in.setsockopt(zmq.LINGER, 0)
        self._in.setsockopt(zmq.MAXMSGSIZE, fw.MAX_FRAME_BYTES)
        here = fw.endpoint_dir(endpoint)
        self.out_endpoint = bind(self._in, f"ipc://{here}/front-{os.getpid()}-{n}"
                                 if here is not None else "tcp://127.0.0.1:*",
                                 BindPolicy.LOCAL_ONLY)
        inner = f"inproc://rc-front-wire-{n}"
        self._outgoing = ctx.socket(zmq.PULL)
        self._outgoing.setsockopt(zmq.RCVHWM, 0)
        self._outgoing.bind(inner)
        self._push = ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(inner)
        self._push_lock = threading.Lock()
        self.endpoint = endpoint
        self.on_drain, self.on_cut = on_drain, on_cut
        self._fids = itertools.count()
        self._qids = itertools.count()
        self._runs: dict[int, _Remote] = {}
        self._asked: dict[int, Future[fw.Answer]] = {}
        self._facts: Future[fw.Facts] = Future()
        self.guard = Guard()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0  # frames from the engine that did not decode

    @property
    def fault(self) -> ThreadFault | None:
        """How the wire's thread died, if it did."""
        return self.guard.fault

    def start(self, timeout_s: float = 60.0) -> WireBackend:
        """Start the wire's thread and wait for the engine's ``Facts``; ``EngineGone`` when
        they do not come within ``timeout_s``."""
        self._thread = self.guard.start("rc-front-wire", self._run)
        self.send(fw.Hello(self.out_endpoint))
        try:
            self.facts = self._facts.result(timeout_s)
        except TimeoutError:
            self.close()
            raise EngineGone(f"no engine answered on {self.endpoint} within "
                             f"{timeout_s:g} s") from None
        return self

    def close(self) -> None:
        """Stop the thread; the sockets are closed."""
        self._stop.set()
        with self._push_lock, contextlib.suppress(zmq.ZMQError):
            self._push.send(b"")  # wakes the thread, which forwards what was sent before
        if self._thread is not None:
            self._thread.join(5)
        self._dealer.close(LINGER_MS)  # what was forwarded still leaves
        for s in (self._outgoing, self._push, self._in):
            s.close(0)

    def send(self, frame: fw.Frame) -> None:
        """Send ``frame`` to the engine (any thread)."""
        with self._push_lock, contextlib.suppress(zmq.ZMQError):
            self._push.send(fw.encode(frame))

    # -- Backend ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self.facts.vocab_size

    @property
    def max_context(self) -> int:
        """Positions the engine's pool holds."""
        return self.facts.max_context

    @property
    def kv_bytes_per_block(self) -> int:
        """The engine pool's bytes per block."""
        return self.facts.kv_bytes_per_block

    def submit(self, prompt: Sequence[int], max_new_tokens: int, on_token: TokenHook | None,
               policy: TokenPolicy | None) -> RequestHandle:
        """Send the request to the engine; ``ValueError`` for what the engine would refuse
        at once (its own checks, before anything is sent)."""
        ids = tk.validated_array(prompt, self.facts.id_space, "prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        fid = next(self._fids)
        handle = RequestHandle(fid)
        replay = policy if isinstance(policy, RequestPolicy) else None
        self._runs[fid] = _Remote(handle, on_token, replay, [])
        self.send(fw.Submit(fid, ids.tolist(), max_new_tokens, _sampling_frame(policy)))
        return handle

    def abort(self, request_id: int) -> bool:
        """Ask the engine to drop the request; False when it has ended already."""
        if request_id not in self._runs:
            return False
        self.send(fw.Abort(request_id))
        return True

    def flush(self) -> Flush:
        """The engine's flush (``EngineBackend.flush``)."""
        a = self._ask("flush")
        assert a.flush is not None
        return Flush(*a.flush)

    def counters(self) -> Counters:
        """The engine's counters now."""
        a = self._ask("counters")
        assert a.counters is not None
        return Counters(**a.counters)

    def alive(self) -> str | None:
        """None when the engine's process answers a ping within ``PING_TIMEOUT_S``, else why
        not (a stopped or wedged process: the front's own answers would say nothing of it)."""
        try:
            self._ask("ping", PING_TIMEOUT_S)
        except (EngineGone, RuntimeError) as exc:
            return str(exc)
        return None

    def _ask(self, what: str, timeout: float = ASK_TIMEOUT_S) -> fw.Answer:
        qid = next(self._qids)
        answer: Future[fw.Answer] = Future()
        self._asked[qid] = answer
        self.send(fw.Ask(qid, what))
        try:
            a = answer.result(timeout)
        except TimeoutError:
            raise EngineGone(f"the engine did not answer {what!r} within "
                             f"{timeout:g} s") from None
        finally:
            self._asked.pop(qid, None)
        if a.error is not None:
            raise RuntimeError(f"the engine failed to answer {what!r}: {a.error}")
        return a

    # -- the wire's thread --------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._outgoing, zmq.POLLIN)
        poller.register(self._in, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(500))
            if self._outgoing in ready:
                while self._outgoing.poll(0):
                    if raw := self._outgoing.recv():  # empty: ``close``'s wake
                        self._dealer.send(raw)
            for sock in (self._in, self._dealer):  # the PULL: all but a ROUTER-only engine's
                if sock in ready:
                    while sock.poll(0):
                        self._receive(sock.recv())

    def _receive(self, raw: bytes) -> None:
        try:
            frame = fw.to_front(raw)
        except msgspec.DecodeError:
            self.dropped += 1
            return
        if isinstance(frame, fw.Tokens):
            for fid, token, lp in frame.items:
                self._token(fid, token, lp)
        elif isinstance(frame, fw.Done):
            self._done(frame)
        elif isinstance(frame, fw.Answer):
            asked = self._asked.get(frame.qid)
            if asked is not None and not asked.done():
                asked.set_result(frame)
        elif isinstance(frame, fw.Facts):
            if not self._facts.done():
                self._facts.set_result(frame)
        elif isinstance(frame, fw.Drain):
            if self.on_drain is not None:
                self.on_drain(frame.grace_s)
        elif self.on_cut is not None:
            self.on_cut(frame.reason)

    def _token(self, fid: int, token: int, lp: fw.Logprob | None) -> None:
        r = self._runs.get(fid)
        if r is None:  # ended here already (a failed hook)
            return
        r.tokens.append(token)
        try:
            if r.on_token is not None:
                r.on_token(token)
            if r.policy is not None:
                r.policy.replay(token, None if lp is None else
                                TokenLogprob(lp.token, lp.logprob, list(lp.top)))
        except Exception as exc:  # as in the engine: the hook fails this request only
            del self._runs[fid]
            self.send(fw.Abort(fid))
            r.handle.settle(None, RequestFailed(f"request {fid}: streaming failed: "
                                                f"{type(exc).__name__}: {exc}"))

    def _done(self, d: fw.Done) -> None:
        r = self._runs.pop(d.fid, None)
        if r is None:
            return
        if d.error is None:
            assert d.metrics is not None
            m = d.metrics
            metrics = RequestMetrics(d.fid, m.prompt_tokens, m.hit_tokens, m.prefill_tokens,
                                     m.output_tokens, m.queue_ms, m.ttft_ms, m.latency_ms,
                                     m.decode_tokens_per_s)
            r.handle.settle(RequestResult(r.tokens, metrics, None), None)
        else:
            r.handle.settle(None, _error(d.error, d.message))
