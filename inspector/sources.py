"""Where the inspector's batches come from, and where its commands go.

A ``Source`` runs its own thread that decodes batches and applies them through a ``Feed``;
the app only polls ``status()`` and calls ``send()``. Sources here:

- ``EmbeddedSource`` (``inspector.embedded``): a service (an engine or the model-free
  ``TreeDriver``) stepped in-process by its ``ServiceLoop`` (``radixcache inspect`` without
  an endpoint; the tests' ``LocalSource`` is one over a ``TreeDriver``);
- ``ReplaySource`` (``inspector.replay``): a recording, with play/pause/step/seek;
- ``LiveSource`` (``inspector.live``): a running engine over ZeroMQ.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from inspector.layout import TokenText
from radixcache.traffic import sharegpt
from radixcache.traffic.sharegpt import TokenArray
from radixcache.traffic.workload_types import Vocabulary
from radixcache.wire.commands import AnyCommand, AnyReply

if TYPE_CHECKING:  # `tree FILE` needs DatasetWords only: not the feed and its what-if (numba)
    from inspector.feed import Feed

DATASET_CONVERSATIONS: int | None = None  # every conversation's words: the trace draws on all


class ConnState(Enum):
    """What the header's dot says."""

    CONNECTING = "connecting"  # no snapshot yet from an engine that never answered
    LIVE = "live"
    RESYNCING = "resyncing"
    DISCONNECTED = "disconnected"
    REPLAY = "replay"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """A source's state right now. ``since`` is when ``state`` began (time.time());
    ``memory_note`` explains missing device figures (``NVML unavailable: ...``); ``paused``:
    a replay standing still (the header shows ``❚❚``, not ``▶``); ``kv_bytes_per_block`` and
    ``kv_bytes_per_token``: the engine's K/V bytes, as its ``stats`` says (0: not known)."""

    state: ConnState
    endpoint: str
    since: float
    detail: str = ""
    busy: bool = False
    memory_note: str = ""
    paused: bool = False
    kv_bytes_per_block: int = 0
    kv_bytes_per_token: int = 0


@runtime_checkable
class Source(Protocol):
    """A stream of batches into a ``Feed`` plus a command channel."""

    def start(self, feed: Feed) -> None:
        """Begin delivering batches to ``feed`` from the source's own thread."""

    def stop(self) -> None:
        """Stop the thread and release sockets/files; idempotent."""

    def status(self) -> SourceStatus:
        """The current connection state (cheap, any thread)."""

    def send(self, command: AnyCommand) -> AnyReply:
        """Deliver a command and return the reply (may block: call it off the UI thread)."""

    def vocabulary(self) -> TokenText | None:
        """How to render token ids as text, when the source knows its workloads."""


class ReplayPosition(Protocol):
    """Where a replay stands."""

    index: int
    total: int
    playing: bool
    speed: float
    keyframes: list[int]
    note: str


@runtime_checkable
class ReplayControls(Protocol):
    """The extra controls of a replaying source."""

    def position(self) -> ReplayPosition:
        """Index of the next batch, batches in all, play state, speed, keyframe indexes, and a
        note on where a damaged file stopped (empty when whole)."""

    def toggle(self) -> None:
        """Play if paused, pause if playing."""

    def step(self, count: int) -> None:
        """Pause, then move ``count`` batches forward (negative: back)."""

    def seek_keyframe(self, direction: int) -> None:
        """Pause, then jump to the next (+1) or previous (-1) keyframe."""

    def set_speed(self, factor: float) -> None:
        """Multiply the playback speed by ``factor`` (clamped to 1/16 .. 64)."""


class DatasetWords:
    """Preview text for token ids: the synthetic workloads' words, then the ShareGPT words.

    Synthetic words always win (so synthetic previews never depend on the dataset). The
    first id the synthetic list lacks starts one background thread that reads the words of
    the first ``conversations`` ShareGPT conversations, all by default (``load_words``: a
    minute the first time, then from its disk cache; ``text`` never waits for it); until then,
    and for ids it does not know, an id renders as ``#id``. Without the sharegpt extra the
    thread ends at once and only the synthetic words are known. ``revision`` grows whenever
    the text of some ids changed (the dataset's words came in), so previews are drawn again.
    """

    def __init__(self, conversations: int | None = DATASET_CONVERSATIONS) -> None:
        self.synthetic = Vocabulary()
        self.conversations = conversations
        self.ready = threading.Event()  # set once the dataset's words are in (or unavailable)
        self.error = ""  # why the dataset's words are missing, once ``ready`` is set
        self.revision = 0
        self._detok: sharegpt.Detokenizer | None = None
        self._question = sharegpt.word_id("?")  # the one word that decodes like a miss
        self._loader: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` joined by spaces; an id neither list knows renders as ``#id``."""
        out = self.synthetic.text(tokens)
        if "#" not in out:
            return out
        self.load()
        detok = self._detok  # set whole by the loader thread, never changed afterwards
        if detok is None:
            return out
        return " ".join(self._word(detok, int(t)) for t in tokens)

    def _word(self, detok: sharegpt.Detokenizer, token: int) -> str:
        name = self.synthetic.text([token])
        if not name.startswith("#"):
            return name
        word = detok.decode([token])
        return word if word != "?" or token == self._question else name

    def loading(self) -> bool:
        """True while the background thread reads the dataset's words (previews show ids)."""
        return self._loader is not None and not self.ready.is_set()

    def load(self) -> threading.Event:
        """Start reading the dataset's words in the background (once); returns ``ready``."""
        with self._start_lock:
            if self._loader is None:
                self._loader = threading.Thread(target=self._load, name="dataset-words",
                                                daemon=True)
                self._loader.start()
        return self.ready

    def _load(self) -> None:
        try:  # cached on disk after the first build: `tree FILE` takes 0.1 s, not 5
            self._detok = sharegpt.load_words(self.conversations)
        except (sharegpt.DatasetUnavailable, OSError, ValueError) as err:
            self.error = str(err)
        finally:
            self.revision += 1
            self.ready.set()
