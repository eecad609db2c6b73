"""How an HTTP request's tokens are chosen and when it stops: the ``TokenPolicy`` the front
hands the engine with each request.

``choose`` runs on the engine's stepping thread with the step's logits of one request:
greedy (argmax) unless ``temperature >= GREEDY_BELOW``, then temperature, top-k, top-p and a
seeded ``torch.Generator`` (the same seed gives the same tokens). It is safe for any logits and
any parameters: the arithmetic is float64 (a float32 logit over the smallest temperature
cannot overflow), NaN logits never win, a ``+inf`` logit wins outright, top-p keeps at least
the likeliest token, and only a finite distribution that sums to more than 0 reaches
``torch.multinomial``; anything else falls back to the argmax of the finite logits. A row with
no number at all (every logit NaN) is the model's fault: ``ValueError``, for that request only.
The model's vocabulary is the tokenizer's (the front refuses to start otherwise), so every
chosen id decodes to text.
``stops_at`` decodes the token incrementally and ends the request at a stop token id or when
a stop string appears; the answer's text is cut before the stop string, as OpenAI does.
Every token's text (and its logprobs when asked) is handed to ``on_piece`` as it is decided;
text that could still be the start of a stop string is held back until it cannot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from radixcache.traffic.tokenizer import TextStream, TextTokenizer

# Temperatures under this are greedy: the limit of sampling as the temperature falls (vLLM's
# ``_SAMPLING_EPS`` is the same 1e-5; SGLang's greedy threshold is 1e-6).
GREEDY_BELOW = 1e-5
# A logprob of -inf (a token the logits rule out) is reported as this, as vLLM and OpenAI do:
# JSON has no infinity.
MIN_LOGPROB = -9999.0


class Sampling(NamedTuple):
    """A request's sampling parameters (validated by ``openai_api``; ``choose`` is safe for
    any values anyway)."""

    temperature: float = 0.0  # under GREEDY_BELOW: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: all
    seed: int | None = None
    logprobs: int | None = None  # None: none; n: the chosen token's and the top n
    stop: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False  # run past the model's end of sequence (vLLM's, SGLang's)


class TokenLogprob(NamedTuple):
    """One chosen token's log-probability and the ``top`` alternatives (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


class Piece(NamedTuple):
    """What one step added to the answer: its text (maybe empty) and logprob entries;
    ``upto``: the answer's output ids through this piece, where its taker counted them (-1:
    not counted; a stream then sends every id it has)."""

    text: str
    logprobs: list[TokenLogprob]
    upto: int = -1


@dataclass(slots=True)
class RequestPolicy:
    """One request's ``TokenPolicy``. After the request ends, ``text`` is the whole answer
    (cut at a stop string), ``stopped`` what stopped it (``None``: it ran to its length)."""

    sampling: Sampling
    tokenizer: TextTokenizer
    on_piece: Callable[[Piece], None] | None = None
    text: str = ""
    stopped: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)  # decoded so far
    _sent: int = 0  # characters of ``text`` handed to on_piece
    _pending: list[TokenLogprob] = field(default_factory=list)
    _generator: torch.Generator | None = None
    _stream: TextStream | None = None
    eos_ids: frozenset[int] = frozenset()  # the model's end of sequence (none: the tiny one)

    def __post_init__(self) -> None:
        self._stream = self.tokenizer.stream()
        if self.sampling.seed is not None:
            self._generator = torch.Generator().manual_seed(self.sampling.seed)

    def choose(self, logits: torch.Tensor) -> int:
        """The next token: one of the ``(vocab,)`` logits' ids, the tokenizer's. Raises
        ``ValueError`` only when no logit is a number."""
        s = self.sampling
        raw = logits.detach().float().cpu()
        if not s.temperature >= GREEDY_BELOW:  # greedy (NaN included)
            token = int(raw.argmax())  # NaN would win an argmax, and +inf does
            value = float(raw[token])
            if math.isnan(value) or value == -math.inf:
                token = int(_finite(raw).argmax())
            scores = _finite(raw) if s.logprobs is not None else raw
        else:
            scores = _finite(raw)
            token = _sample(scores, s, self._generator)
        if s.logprobs is not None:
            self._pending.append(_logprob(scores, token, s.logprobs))
        return token

    def stops_at(self, token: int) -> bool:
        """Decode ``token``; True (and the text cut) at a stop id or string."""
        if token in self.sampling.stop_ids or (token in self.eos_ids
                                               and not self.sampling.ignore_eos):
            self.stopped = token
            return self._emit(final=True)
        assert self._stream is not None
        self._ids.append(token)
        self.text += self._stream.add(token)
        for stop in self.sampling.stop:
            at = self.text.find(stop, max(0, self._sent - len(stop)))
            if at >= 0:
                self.text, self.stopped = self.text[:at], stop
                return self._emit(final=True)
        return self._emit(final=False)

    @property
    def may_stop(self) -> bool:
        """Whether anything can end the answer before its length: a stop string or id, or an
        end of sequence not ignored (``Request.early``: what the reserve estimate counts on).
        On the seeded model, which has none, a plain sampled answer runs to its length."""
        s = self.sampling
        return bool(s.stop or s.stop_ids or (self.eos_ids and not s.ignore_eos))

    def take_logprob(self) -> TokenLogprob | None:
        """The logprob entry ``choose`` just made, taken out of the answer (the engine's side of
        a front in another process sends it there, where ``replay`` puts it back); None when
        the request asked for no logprobs."""
        return self._pending.pop() if self._pending else None

    def replay(self, token: int, logprob: TokenLogprob | None) -> bool:
        """``token``, chosen by this request's policy in another process (with its logprob
        entry, if asked), taken as ``choose`` and ``stops_at`` would have: the same text, the
        same pieces handed to ``on_piece``, the same stop."""
        if logprob is not None:
            self._pending.append(logprob)
        return self.stops_at(token)

    def finish(self) -> Piece:
        """The text and logprobs not handed out yet (after the request ended), with the bytes
        of a character the answer cut at its end (decoded as U+FFFD, as a full decode does)."""
        if self.stopped is None:
            self.text = self.tokenizer.decode(self._ids)
        piece = Piece(self.text[self._sent:], self._pending)
        self.logprobs += self._pending
        self._sent, self._pending = len(self.text), []
        return piece

    def _emit(self, *, final: bool) -> bool:
        hold = 0 if final else max((len(s) - 1 for s in self.sampling.stop), default=0)
        end = max(self._sent, len(self.text) - hold)
        piece = Piece(self.text[self._sent:end], self._pending)
        self.logprobs += self._pending
        self._sent, self._pending = end, []
        if self.on_piece is not None and (piece.text or piece.logprobs or final):
            self.on_piece(piece)
        return final


def _finite(raw: torch.Tensor) -> torch.Tensor:
    """``raw`` as float64 with NaN as ``-inf``; where some are ``+inf``, those as 0 and the
    rest ``-inf`` (they share the whole probability). ``ValueError`` when none is above
    ``-inf``. One check when every logit is finite (the usual case)."""
    scores = raw.double()
    if bool(scores.isfinite().all()):
        return scores
    scores = torch.where(scores.isnan(), -math.inf, scores)
    top = scores.isposinf()
    if bool(top.any()):
        scores = torch.where(top, 0.0, -math.inf)
    if not bool(scores.isfinite().any()):
        raise ValueError("the model's logits hold no finite value")
    return scores


def _sample(scores: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> int:
    """One token drawn from ``_finite`` ``scores`` with ``s``'s temperature, top-k and top-p;
    the argmax when what is left is no distribution ``multinomial`` can draw from."""
    scores = _finite(scores / s.temperature)  # float64: finite for float32 logits
    if 0 < s.top_k < scores.numel():
        kth = torch.topk(scores, s.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if s.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=True)
        probs = torch.softmax(ordered, -1)
        drop = probs.cumsum(-1) - probs >= s.top_p  # keep the first over top_p
        drop[0] = False  # and always the likeliest, whatever top_p is
        scores = scores.scatter(0, index[drop], -math.inf)
    probs = torch.softmax(scores, -1)
    if not 0 < float(probs.sum()) < math.inf:  # NaN fails too
        return int(scores.argmax())
    return int(torch.multinomial(probs, 1, generator=gen))


def _logprob(scores: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The chosen token's log-probability and the ``top`` likeliest, under the finite
    ``scores`` before temperature; ``-inf`` is reported as ``MIN_LOGPROB``."""
    logp = torch.log_softmax(scores, -1).clamp(min=MIN_LOGPROB)
    best = torch.topk(logp, top) if top else None
    pairs = list(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best else []
    return TokenLogprob(token, float(logp[token]), pairs)
