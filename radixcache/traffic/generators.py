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

from collections.abc import Sequence

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
    WORD_VOCAB,
    TokenArray,
)
from radixcache.traffic.workload_types import (
    FORK_BASE_TOKENS,
    FORK_BLOCK,
    SYNTHETIC_SOURCE,
    TokenText,
    Vocabulary,
    Workload,
    WorkloadRequest,
)


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
