"""The shipped tokenizer: any UTF-8 text round-trips, the vocabulary is fixed, clients load it
(Hugging Face tokenizers and transformers) and its chat template matches the server's."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from radixcache.traffic.tokenizer import BOS, EOT, HDR, HDR_END, SPECIAL_TOKENS, shipped

TOK = shipped()
SAMPLES = ["I love C#", "## heading", "中文的分词 和 日本語", "emoji 😀👍🏽 flags 🇫🇷",
           "def f(x):\n\treturn x ** 2  # square\n", "<bos>not a marker in a message<eot>",
           "\x00\x01 control \r\n", "   leading and trailing   "]


@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    try:
        ids = TOK.encode_plain(text)
    except ValueError:  # only a lone surrogate, which UTF-8 cannot hold
        assert any(0xD800 <= ord(c) < 0xE000 for c in text)
        return
    assert TOK.decode(ids) == text
    assert all(0 <= i < TOK.vocab_size for i in ids)


def test_samples_round_trip_and_markers_are_special_only_in_prompts() -> None:
    for text in SAMPLES:
        assert TOK.decode(TOK.encode(text)) == text
        assert TOK.decode(TOK.encode_plain(text)) == text
    assert TOK.encode("I love C#") == [44, 2732, 369, 6]
    assert TOK.encode("<bos>hi<eot>")[::3] == [BOS, EOT]
    assert BOS not in TOK.encode_plain("<bos>hi<eot>")
    assert [TOK.encode(t) for t in SPECIAL_TOKENS] == [[BOS], [HDR], [HDR_END], [EOT]]


def test_a_huge_word_does_not_grow_the_vocabulary() -> None:
    word = "zq" * 50_000
    assert TOK.decode(TOK.encode(word)) == word
    assert TOK.vocab_size == 4096 == Tokenizer.from_file(str(TOK.path / "tokenizer.json")) \
        .get_vocab_size()


def test_the_shipped_file_is_small_and_fixed() -> None:
    data = json.loads((TOK.path / "tokenizer.json").read_text())
    assert data["model"]["type"] == "BPE"
    assert len(data["model"]["vocab"]) + len(data["added_tokens"]) - 4 == 4096
    assert (TOK.path / "tokenizer.json").stat().st_size < 200_000


def test_incremental_decoding_waits_for_whole_characters() -> None:
    ids = TOK.encode("中😀")
    stream = TOK.stream()
    pieces = [stream.add(i) for i in ids]
    assert "".join(pieces) == "中😀"
    assert "" in pieces  # a character cut between tokens comes out once it is whole


def test_transformers_loads_it_with_the_servers_chat_template() -> None:
    auto = AutoTokenizer.from_pretrained(str(TOK.path))
    assert auto.vocab_size == TOK.vocab_size
    for text in SAMPLES:
        ids = auto(text, add_special_tokens=False)["input_ids"]
        assert ids == TOK.encode(text)
        assert auto.decode(ids) == text
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<bos><hdr>system<end>be brief<eot><hdr>user<end>hi<eot><hdr>assistant<end>"
    ids = auto(rendered, add_special_tokens=False)["input_ids"]
    assert ids == TOK.chat([("system", "be brief"), ("user", "hi")])


def test_the_models_vocabulary_is_the_tokenizers_and_reads_the_traces_ids() -> None:
    from radixcache.serving.model import ModelConfig, tiny_model
    from radixcache.traffic.sharegpt import VOCAB_SIZE

    for config in (ModelConfig(), tiny_model()):
        assert (config.vocab_size, config.id_space) == (TOK.vocab_size, VOCAB_SIZE)
