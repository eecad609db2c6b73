"""Text <-> ids for the HTTP fronts: exact both ways, markers and roles included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixcache.traffic.chattext import TextCodec
from radixcache.traffic.sharegpt import (
    BOS,
    EOT,
    HDR,
    HDR_END,
    ROLE_GPT,
    ROLE_HUMAN,
    ROLE_SYSTEM,
    VOCAB_SIZE,
    word_id,
)

SPECIAL = [BOS, HDR, HDR_END, EOT, ROLE_HUMAN, ROLE_GPT, ROLE_SYSTEM, word_id("human")]
IDS = st.one_of(st.integers(0, VOCAB_SIZE - 1), st.sampled_from(SPECIAL))


@given(st.lists(IDS, max_size=60))
def test_decode_then_encode_gives_the_same_ids(ids: list[int]) -> None:
    codec = TextCodec()
    assert codec.encode(codec.decode(ids)) == ids


def test_the_chat_layout_reads_as_the_template() -> None:
    codec = TextCodec()
    ids = [BOS, HDR, ROLE_HUMAN, HDR_END, word_id("people"), EOT, HDR, ROLE_GPT, HDR_END, 12345]
    assert codec.decode(ids) == "<bos> <hdr>human<end> people <eot> <hdr>gpt<end> #12345"
    # a word spelled like a role, right after <hdr>, is written as its id to stay a word
    assert codec.decode([HDR, word_id("human")]) == f"<hdr> #{word_id('human')}"


def test_encoding_learns_words_for_later_decoding() -> None:
    codec = TextCodec()
    zebra = word_id("zebroid")
    assert codec.decode([zebra]) == f"#{zebra}"
    assert codec.encode("a zebroid") == [word_id("a"), zebra]
    assert codec.decode([zebra]) == "zebroid"


def test_an_id_outside_the_vocabulary_is_refused() -> None:
    try:
        TextCodec().encode(f"#{VOCAB_SIZE}")
    except ValueError as exc:
        assert str(exc) == f"token #{VOCAB_SIZE} is outside the vocabulary [0, {VOCAB_SIZE})"
    else:
        raise AssertionError("no ValueError")
