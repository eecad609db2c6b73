"""What the HTTP front needs of a running engine (``Backend``), and the engine's own
(``EngineBackend``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from radixcache.serving.engine import Engine, RequestHandle, TokenPolicy
from radixcache.serving.loop import ServiceLoop
from radixcache.serving.prometheus import Counters
from radixcache.serving.requests import TokenHook


class Flush(NamedTuple):
    """What a flush found: the requests in its way (none: the cache was emptied)."""

    waiting: int
    running: int

    @property
    def done(self) -> bool:
        """Whether the cache was emptied (nothing was waiting or running)."""
        return not (self.waiting or self.running)


class Backend(Protocol):
    """What the front needs of a running engine."""

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: token ids a prompt may hold are in ``[0, vocab_size)``, and
        it must equal the tokenizer's."""
        ...

    @property
    def max_context(self) -> int:
        """Positions the whole pool holds (prompt + output of one request at most)."""
        ...

    @property
    def kv_bytes_per_block(self) -> int:
        """K and V bytes of one pool block, every layer (the model's shape and dtype)."""
        ...

    def submit(self, prompt: Sequence[int], max_new_tokens: int, on_token: TokenHook | None,
               policy: TokenPolicy | None) -> RequestHandle:
        """Queue one request (thread-safe); ``ValueError`` for a malformed one."""
        ...

    def abort(self, request_id: int) -> bool:
        """Drop a request (a client that left); False when it is not queued or running."""
        ...

    def flush(self) -> Flush:
        """Empty the cache unless requests are queued or running (then nothing is done and
        no request is touched), atomically with ``submit``."""
        ...

    def counters(self) -> Counters:
        """The engine's counters now."""
        ...

    def alive(self) -> str | None:
        """None when the engine can take requests (``/health``), else why not."""
        ...


class EngineBackend:
    """An ``Engine`` stepped by ``loop`` (``serve``'s): a submit or an abort wakes the loop
    (it waits on an event when idle); figures are read under the loop's state lock (a step's
    counts are all in or all out); a flush is decided and done between two steps with the
    front's submits held off (``flush``)."""

    def __init__(self, engine: Engine, loop: ServiceLoop) -> None:
        self.engine = engine
        self._loop = loop
        # held by ``submit`` and by ``flush`` inside the state lock (in that order, never the
        # other way): a flush's check and its reset see the same queue
        self._admission = threading.Lock()

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self.engine.model.vocab_size

    @property
    def kv_bytes_per_block(self) -> int:
        """The pool's bytes per block (fixed at start)."""
        return self.engine.pool.bytes_per_block()

    @property
    def max_context(self) -> int:
        """``Engine.max_context``."""
        return self.engine.max_context

    def submit(self, prompt: Sequence[int], max_new_tokens: int, on_token: TokenHook | None,
               policy: TokenPolicy | None) -> RequestHandle:
        """``Engine.submit`` then wake the stepping loop."""
        with self._admission:
            handle = self.engine.submit(prompt, max_new_tokens, on_token=on_token,
                                        policy=policy)
        self._loop.wake()
        return handle

    def abort(self, request_id: int) -> bool:
        """``Engine.abort``, then wake the loop so that its next step drops the request."""
        found = self.engine.abort(request_id)
        self._loop.wake()
        return found

    def flush(self) -> Flush:
        """The engine's reset, unless requests are queued or running. Checked and done under
        the loop's state lock (no step in progress: nothing is being admitted) and the
        admission lock (no HTTP submit in between), so a request submitted meanwhile is either
        counted here (nothing flushed) or queued after the reset: a flush never cancels a
        request. (The other submitters, ZeroMQ commands and a workload's follow-ups, submit
        under the state lock.) The reset is published as one batch, then a sample."""
        with self._loop.changing(), self._admission:
            waiting, running = self.engine.depths()
            found = Flush(waiting, running)
            if found.done:
                self.engine.reset()
        if found.done:
            self._loop.sample()
        return found

    def counters(self) -> Counters:
        """``Engine.stats`` between two steps, and the blocks running requests hold."""
        s, e = self._loop.stats(), self.engine
        return Counters(s.finished, s.prompt_tokens, s.hit_tokens, s.output_tokens,
                        s.running, s.waiting, s.used_blocks, s.num_blocks, e.pinned_blocks(),
                        e.config.block_size, s.retractions)

    def alive(self) -> str | None:
        """None: the engine runs in this process (a stopped process answers nothing)."""
        return None
