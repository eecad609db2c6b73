"""The engine's end of the front wire (``wire.frontwire``): HTTP fronts in other processes
submit requests here and read each request's chosen tokens back.

::

    front process(es)            engine process (serve)
    DEALER ──Submit/Abort/Ask──► ROUTER  rc-engine-port: submits (Engine._queue), aborts,
                                         answers Hello and ping
    PULL   ◄──Tokens/Done/Answer── PUSH  (one per front, connected to the PULL its Hello
                                         names) rc-service-loop: each token of a front's
                                         request is appended to the outbox (a list under
                                         ``_out_lock``); after each step the loop's
                                         after-step hook sends it, from that thread
                                 rc-engine-ask: Ask (counters, flush: they wait for a step)

The stepping thread sends each step's frames itself: a thread woken once per step to forward
them took the GIL between the next forward's torch calls (beside the in-process engine at 60
requests/s, a thread doing the port's work per step raised the forward p50 from 0.65-0.69 ms
to 1.01-1.26 ms, and TTFT p99 from 73-77 ms to 99-111 ms). A ZeroMQ socket is used by one
thread at a time: each PUSH is used under ``_push_lock`` (the port's thread opens it, the
stepping thread and the others send on it), the ROUTER only by the port's thread, which also
forwards the outbox of a front that named no PULL (one inproc nudge per step for it).

What runs on the stepping thread for a front's request is its sampler (``choose``: it needs
the logits), the stop check on ids, a list append per token and, after each step, the
encoding and sending of that step's frames.
The text (incremental detokenizing, stop strings, the pieces streamed, the JSON) is the
front's, in its own process; only a request with stop strings is also decoded here, because
the stop decides where the engine ends it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import msgspec
import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving.http_backend import EngineBackend
from radixcache.serving.requests import (
    RequestCancelled,
    RequestRejected,
    RequestResult,
)
from radixcache.serving.sampling import GREEDY_BELOW, RequestPolicy, Sampling
from radixcache.traffic.tokenizer import TextTokenizer
from radixcache.wire import frontwire as fw
from radixcache.wire.endpoints import BindPolicy, bind, connect

POLL_MS = 50  # the outbox is forwarded at least this often (a cancel outside a step)
_PORTS = itertools.count()
Item = tuple[int, int, fw.Logprob | None] | fw.Frame  # one token, or a whole frame


class _Chooser:
    """The engine's ``TokenPolicy`` for a front's request: the front's sampler; the stop on
    ids here, and on strings (decoding) only when the request has some."""

    def __init__(self, policy: RequestPolicy) -> None:
        self.policy = policy
        self._decode = bool(policy.sampling.stop)

    @property
    def may_stop(self) -> bool:
        """The front's policy's (``RequestPolicy.may_stop``)."""
        return self.policy.may_stop

    def choose(self, logits: torch.Tensor) -> int:
        """The sampler's choice (its logprob entry is kept for ``take_logprob``)."""
        return self.policy.choose(logits)

    def stops_at(self, token: int) -> bool:
        """A stop id, the end of sequence (unless ignored), or a stop string."""
        if self._decode:
            return self.policy.stops_at(token)
        s, p = self.policy.sampling, self.policy
        return token in s.stop_ids or (token in p.eos_ids and not s.ignore_eos)


def _sampling(f: fw.SamplingFrame) -> Sampling:
    return Sampling(f.temperature, f.top_p, f.top_k, f.seed, f.logprobs, tuple(f.stop),
                    frozenset(f.stop_ids), f.ignore_eos)


def _plain(f: fw.SamplingFrame) -> bool:
    """Whether the request is the engine's plain greedy run to its length: greedy, no
    logprobs, and nothing that can stop it early."""
    return not f.temperature >= GREEDY_BELOW and f.logprobs is None and not f.stop \
        and not f.stop_ids and (f.ignore_eos or not f.eos_ids)


def _done(fid: int, handle: Future[RequestResult]) -> fw.Done:
    err = handle.exception()
    if err is None:
        m = handle.result().metrics
        return fw.Done(fid, None, "", fw.DoneMetrics(*m))
    kind = ("rejected" if isinstance(err, RequestRejected) else
            "cancelled" if isinstance(err, RequestCancelled) else "failed")
    return fw.Done(fid, kind, str(err), None)


def framed(out: list[tuple[bytes, Item]]) -> list[tuple[bytes, fw.Frame]]:
    """The outbox as frames, in order: each front's tokens in one ``Tokens`` frame, sent
    before any other frame for that front (a request's ``Done`` after its tokens)."""
    frames: list[tuple[bytes, fw.Frame]] = []
    tokens: dict[bytes, list[tuple[int, int, fw.Logprob | None]]] = {}
    for front, item in out:
        if isinstance(item, fw.Frame):
            if front in tokens:
                frames.append((front, fw.Tokens(tokens.pop(front))))
            frames.append((front, item))
        else:
            tokens.setdefault(front, []).append(item)
    frames.extend((front, fw.Tokens(items)) for front, items in tokens.items())
    return frames


class FrontState(NamedTuple):
    """What the fronts said of serve's drain (``EnginePort.drain_said``)."""

    draining: int | None  # requests in flight when it stopped admitting
    drained: fw.Drained | None


class EnginePort:
    """The ROUTER that fronts connect to. ``start()``; ``after_step`` as the loop's
    after-step hook; ``close()``."""

    def __init__(self, backend: EngineBackend, endpoint: str, tokenizer: TextTokenizer,
                 facts: fw.Facts, *, policy: BindPolicy = BindPolicy.LOCAL_ONLY) -> None:
        self.backend, self.tokenizer, self.facts = backend, tokenizer, facts
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._router = ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, fw.MAX_FRAME_BYTES)
        # no high-water mark: a ROUTER drops what goes past it, and a lost Tokens or Done
        # frame would leave its request unanswered; what waits is bounded by the requests in
        # flight (the front's own bound)
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.setsockopt(zmq.RCVHWM, 0)
        self.endpoint = bind(self._router, endpoint, policy)
        nudge = f"inproc://rc-engine-port-{next(_PORTS)}"
        self._nudged = ctx.socket(zmq.PULL)
        self._nudged.bind(nudge)
        self._nudge = ctx.socket(zmq.PUSH)
        self._nudge.setsockopt(zmq.LINGER, 0)
        self._nudge.connect(nudge)
        self._nudge_lock = threading.Lock()  # any thread nudges
        self._out_lock = threading.Lock()
        self._out: list[tuple[bytes, Item]] = []
        # a front's own PUSH (it named its PULL in Hello), used under ``_push_lock`` by any
        # thread; ``_flush_lock`` keeps one flush's frames together (a request's Done after
        # its tokens) when two threads flush at once
        self._pushes: dict[bytes, zmq.Socket[bytes]] = {}
        self._push_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._routed: list[tuple[bytes, Item]] = []  # for fronts without one: the port's
        # each PUSH's monitor (the port's thread reads them): its front's PULL went away
        self._monitors: dict[zmq.Socket[bytes], bytes] = {}
        self._poller = zmq.Poller()
        self.lost = 0  # fronts whose PULL went away (their requests aborted)
        self._dir = fw.endpoint_dir(self.endpoint)
        self._live: dict[tuple[bytes, int], int] = {}  # (front, fid) -> engine request id
        self._asks = ThreadPoolExecutor(1, thread_name_prefix="rc-engine-ask")
        self.guard = Guard()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0  # frames that did not decode
        self.fronts: list[bytes] = []  # the identities that said Ready, in order
        self.ready = threading.Event()
        self._said = FrontState(None, None)
        self.said_changed = threading.Condition()

    @property
    def fault(self) -> ThreadFault | None:
        """How the port's thread died, if it did."""
        return self.guard.fault

    @property
    def pushed(self) -> int:
        """Fronts sent to through a PULL of their own (the others through the ROUTER)."""
        return len(self._pushes)

    def start(self) -> EnginePort:
        """Serve fronts from a guarded thread."""
        self._thread = self.guard.start("rc-engine-port", self._run)
        return self

    def close(self) -> None:
        """Stop the thread; every socket is closed."""
        self._stop.set()
        self.after_step()
        if self._thread is not None:
            self._thread.join(5)
        self._asks.shutdown(wait=False, cancel_futures=True)
        with self._push_lock:
            for push in self._pushes.values():
                push.disable_monitor()
                push.close(0)
            self._pushes.clear()
        for s in (self._router, self._nudged, self._nudge):
            s.close(0)

    # -- any thread ---------------------------------------------------------------------------
    def after_step(self) -> None:
        """The loop's after-step hook (and any thread's, after adding to the outbox): send
        what the outbox holds, from this thread, to each front through its own PUSH; what is
        for a front without one goes to the port's thread (one inproc nudge)."""
        routed = False
        if self._out:
            with self._flush_lock:
                mine: list[tuple[bytes, Item]] = []
                with self._out_lock:
                    out, self._out = self._out, []
                    for front, item in out:  # one look each: a front gained or lost meanwhile
                        (mine if front in self._pushes else self._routed).append((front, item))
                    routed = len(mine) < len(out)
                for front, frame in framed(mine):
                    self._deliver(front, fw.encode(frame))
        if routed or self._stop.is_set():
            with self._nudge_lock, contextlib.suppress(zmq.ZMQError):
                self._nudge.send(b"", zmq.NOBLOCK)

    def _deliver(self, front: bytes, raw: bytes) -> bool:
        """Send ``raw`` through ``front``'s own PUSH (any thread); False when it has none."""
        push = self._pushes.get(front)
        if push is None:
            return False
        with self._push_lock, contextlib.suppress(zmq.ZMQError):  # closed: nothing to tell
            push.send(raw, zmq.NOBLOCK)
        return True

    def _put(self, front: bytes, item: Item) -> None:
        with self._out_lock:
            self._out.append((front, item))

    def tell_fronts(self, frame: fw.Frame) -> None:
        """Send ``frame`` (``Drain``, ``Cut``) to every front that said Ready."""
        for front in self.fronts:
            self._put(front, frame)
        self.after_step()

    def drain_said(self) -> FrontState:
        """What the fronts said of the drain so far."""
        with self.said_changed:
            return self._said

    # -- the port's thread --------------------------------------------------------------------
    def _run(self) -> None:
        poller = self._poller
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._nudged, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(POLL_MS))
            if self._nudged in ready:
                while self._nudged.poll(0):
                    self._nudged.recv()
            if self._router in ready:
                while self._router.poll(0):
                    front, raw = self._router.recv_multipart()[:2]
                    self._receive(front, raw)
            for mon in [m for m in self._monitors if m in ready]:
                self._watch(mon)
            self.after_step()  # what a thread added and did not send (an end outside a step)
            self._forward()
        for mon in self._monitors:
            mon.close(0)

    def _watch(self, mon: zmq.Socket[bytes]) -> None:
        """A PUSH's monitor spoke: when its front's PULL went away (the front's process
        ended), abort that front's requests (nobody reads their tokens) and close the PUSH."""
        gone = False
        while mon.poll(0):
            gone |= recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED
        if not gone:
            return
        front = self._monitors.pop(mon)
        self._poller.unregister(mon)
        mon.close(0)
        with self._push_lock:
            push = self._pushes.pop(front, None)
            if push is not None:
                push.disable_monitor()
                push.close(0)
        self.lost += 1
        with self.said_changed, contextlib.suppress(ValueError):  # as ``_heard`` adds it
            self.fronts.remove(front)
        for key in [k for k in list(self._live) if k[0] == front]:
            rid = self._live.pop(key, None)
            if rid is not None:
                self.backend.abort(rid)

    def _forward(self) -> None:
        """Send the outbox of the fronts without a PUSH through the ROUTER."""
        with self._out_lock:
            out, self._routed = self._routed, []
        for front, frame in framed(out):
            self._send(front, frame)

    def _send(self, front: bytes, frame: fw.Frame) -> None:
        """``frame`` to ``front``: through its PUSH, or the ROUTER (this thread's)."""
        raw = fw.encode(frame)
        if not self._deliver(front, raw):
            with contextlib.suppress(zmq.ZMQError):  # a front that is gone: nothing to tell
                self._router.send_multipart([front, raw], zmq.NOBLOCK)

    def _open_push(self, front: bytes, out: str) -> None:
        """Connect a PUSH to the PULL ``front`` named (``Hello.out``), if it is one this port
        may connect to (``ipc://`` in its own directory, or loopback ``tcp://``); a front
        that named another is answered through the ROUTER."""
        if front in self._pushes or not fw.out_allowed(out, self._dir):
            return
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        with self._push_lock:
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.setsockopt(zmq.SNDHWM, 0)  # as the ROUTER: a lost frame would hang a request
            mon = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            try:
                connect(push, out)  # (IPv6 loopback included)
            except zmq.ZMQError:
                push.disable_monitor()
                mon.close(0)
                push.close(0)
                return
            self._pushes[front] = push
        self._monitors[mon] = front
        self._poller.register(mon, zmq.POLLIN)

    def _receive(self, front: bytes, raw: bytes) -> None:
        try:
            frame = fw.to_engine(raw)
        except msgspec.DecodeError:
            self.dropped += 1
            return
        if isinstance(frame, fw.Submit):
            self._submit(front, frame)
        elif isinstance(frame, fw.Abort):
            rid = self._live.get((front, frame.fid))
            if rid is not None:
                self.backend.abort(rid)
        elif isinstance(frame, fw.Ask) and frame.what == "ping":
            self._send(front, fw.Answer(frame.qid))  # this thread: no step waited for
        elif isinstance(frame, fw.Ask):
            self._asks.submit(self._answer, front, frame)
        elif isinstance(frame, fw.Hello):
            if frame.out:
                self._open_push(front, frame.out)
            self._send(front, self.facts)
        else:
            self._heard(front, frame)

    def _heard(self, front: bytes, frame: fw.Ready | fw.Draining | fw.Drained) -> None:
        with self.said_changed:
            if isinstance(frame, fw.Ready):
                self.fronts.append(front)
                self.ready.set()
            elif isinstance(frame, fw.Draining):
                self._said = self._said._replace(draining=frame.in_flight)
            else:
                self._said = self._said._replace(drained=frame)
            self.said_changed.notify_all()

    def _submit(self, front: bytes, f: fw.Submit) -> None:
        try:
            policy = RequestPolicy(_sampling(f.sampling), self.tokenizer,
                                   eos_ids=frozenset(f.sampling.eos_ids))
        except (ValueError, RuntimeError, TypeError) as exc:  # a seed torch refuses
            self._send(front, fw.Done(f.fid, "invalid", str(exc), None))
            return
        chooser, fid, key = _Chooser(policy), f.fid, (front, f.fid)
        # nothing to choose or stop on: the engine's batched argmax, no call per token
        plain = _plain(f.sampling)

        def on_token(token: int) -> None:  # the stepping thread
            lp = None if plain else policy.take_logprob()
            item = (fid, token, None if lp is None else fw.Logprob(lp.token, lp.logprob, lp.top))
            with self._out_lock:
                self._out.append((front, item))

        def on_done(handle: Future[RequestResult]) -> None:
            self._live.pop(key, None)
            self._put(front, _done(fid, handle))

        try:
            handle = self.backend.submit(f.prompt, f.max_new, on_token,
                                         None if plain else chooser)
        except ValueError as exc:
            self._send(front, fw.Done(fid, "invalid", str(exc), None))
            return
        assert handle.id is not None
        self._live[key] = handle.id
        handle.add_done_callback(on_done)

    def _answer(self, front: bytes, ask: fw.Ask) -> None:  # rc-engine-ask
        try:
            if ask.what == "counters":
                answer = fw.Answer(ask.qid, counters=self.backend.counters()._asdict())
            elif ask.what == "flush":
                f = self.backend.flush()
                answer = fw.Answer(ask.qid, flush=(f.waiting, f.running))
            else:
                answer = fw.Answer(ask.qid, error=f"unknown question {ask.what!r}")
        except Exception as exc:  # the front's caller gets it as a 500
            answer = fw.Answer(ask.qid, error=f"{type(exc).__name__}: {exc}")
        self._put(front, answer)
        self.after_step()
