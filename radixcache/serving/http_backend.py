"""What the HTTP front needs of a running engine (``Backend``), and the engine's own
(``EngineBackend``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from radixcache.serving.engine import Engine, RequestHandle, TokenPolicy
from radixcache.serving.prometheus import Counters
from radixcache.serving.requests import TokenHook
from radixcache.wire import commands as cmd


class Backend(Protocol):
    """What the front needs of a running engine."""

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold are in ``[0, vocab_size)``."""
        ...

    @property
    def max_context(self) -> int:
        """Positions the whole pool holds (prompt + output of one request at most)."""
        ...

    def submit(self, prompt: Sequence[int], max_new_tokens: int, on_token: TokenHook | None,
               policy: TokenPolicy | None) -> RequestHandle:
        """Queue one request (thread-safe); ``ValueError`` for a malformed one."""
        ...

    def abort(self, request_id: int) -> bool:
        """Drop a request (a client that left); False when it is not queued or running."""
        ...

    def flush(self) -> bool:
        """Empty the cache; False (nothing done) while requests are queued or running."""
        ...

    def counters(self) -> Counters:
        """The engine's counters now."""
        ...


class EngineBackend:
    """An ``Engine`` stepped by someone else's loop (``serve``'s, or ``engine.start()``);
    ``wake`` tells that loop there is work (``serve`` waits on an event when idle);
    ``command`` is that loop's command handler (so a flush is published like a ``reset``)."""

    def __init__(self, engine: Engine, wake: Callable[[], None] | None = None,
                 command: Callable[[cmd.AnyCommand], cmd.AnyReply] | None = None) -> None:
        self.engine = engine
        self._wake, self._command = wake, command

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self.engine.config.model.vocab_size

    @property
    def max_context(self) -> int:
        """Blocks times block size."""
        return self.engine.config.num_blocks * self.engine.config.block_size

    def submit(self, prompt: Sequence[int], max_new_tokens: int, on_token: TokenHook | None,
               policy: TokenPolicy | None) -> RequestHandle:
        """``Engine.submit`` then wake the stepping loop."""
        handle = self.engine.submit(prompt, max_new_tokens, on_token=on_token, policy=policy)
        self._poke()
        return handle

    def abort(self, request_id: int) -> bool:
        """``Engine.abort``, then wake the loop so the next step drops it."""
        found = self.engine.abort(request_id)
        self._poke()
        return found

    def flush(self) -> bool:
        """The engine's reset, through the loop's command handler when there is one."""
        m = self.engine.metrics()
        if m.running or m.waiting:
            return False
        if self._command is not None:
            self._command(cmd.Reset())
        else:
            self.engine.reset()
        return True

    def counters(self) -> Counters:
        """From ``Engine.metrics`` and the pool's allocator (racy reads of plain ints)."""
        e = self.engine
        m, a = e.metrics(), e.pool.allocator
        return Counters(m.finished, m.prompt_tokens, m.hit_tokens, m.output_tokens,
                        m.running, m.waiting, a.used_count, a.num_blocks, e.pinned_blocks(),
                        e.config.block_size)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()
