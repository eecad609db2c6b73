"""The text tokenizer of the HTTP fronts: a fixed byte-level BPE shipped with the package.

``hf_tokenizer/tokenizer.json`` (4,096 tokens, Hugging Face ``tokenizers``) was trained once
from ShareGPT text by ``scripts/train_tokenizer.py``; ``hf_tokenizer/`` is what a client loads
with ``tokenizers.Tokenizer.from_file`` or ``transformers.AutoTokenizer.from_pretrained`` (the
directory the server reports as ``tokenizer_path``). Byte-level BPE maps any UTF-8 text to ids
and back byte for byte (``#``, CJK, emoji, code), and the vocabulary never grows, so the
memory a server spends on text is bounded whatever it is sent.

The chat template (OpenAI messages -> ids) uses special tokens 0-3::

    <bos> <hdr>user<end>hello<eot> <hdr>assistant<end>        (no spaces: ids 0, 1, ..., 2)

Message contents are encoded with the markers taken as plain text, so a user cannot forge a
turn; a completion prompt recognizes them (what a client that renders the template sends).

The model's vocabulary is this one's (``serving.model.ModelConfig.vocab_size``, 4,096; the HTTP
front refuses to start otherwise). The trace benchmarks (``traffic.sharegpt``: crc32 word ids)
keep their own tokenization; the model reads their ids folded into its vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from radixcache.core.tokens import TokenArray

TOKENIZER_DIR = Path(__file__).with_name("hf_tokenizer")
SPECIAL_TOKENS = ("<bos>", "<hdr>", "<end>", "<eot>")
BOS, HDR, HDR_END, EOT = range(4)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<hdr>{{ m['role'] }}<end>{{ m['content'] }}<eot>"
    "{% endfor %}{% if add_generation_prompt %}<hdr>assistant<end>{% endif %}"
)


class TextTokenizer:
    """The shipped tokenizer (thread-safe: encoding and decoding hold no state)."""

    def __init__(self, directory: Path = TOKENIZER_DIR) -> None:
        self.path = directory
        self._special = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._plain = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._plain.encode_special_tokens = True  # markers in message text stay text
        self.vocab_size = self._special.get_vocab_size()
        longest = max(len(t) for t in self._special.get_vocab())
        self.max_token_chars = longest  # no token covers more characters of text than this

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, the template markers recognized (a completion prompt). Raises
        ``ValueError`` for text that is not Unicode text (a lone surrogate from JSON)."""
        return _encode(self._special, text)

    def encode_plain(self, text: str) -> list[int]:
        """Ids of ``text`` with every character taken as text (a chat message)."""
        return _encode(self._plain, text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (markers included); ids outside the vocabulary are skipped."""
        return str(self._special.decode(list(ids), skip_special_tokens=False))

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Preview text of ``tokens`` (``core.tokens.TokenText``: a tree pane over HTTP text)."""
        return self.decode([int(t) for t in tokens])

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The chat template over ``(role, content)`` messages, generation prompt included."""
        out = [BOS]
        for role, content in messages:
            out += [HDR, *self.encode_plain(role), HDR_END, *self.encode_plain(content), EOT]
        return [*out, HDR, *self.encode_plain("assistant"), HDR_END]

    def stream(self) -> TextStream:
        """An incremental decoder for one answer."""
        return TextStream(self)


class TextStream:
    """Decodes one answer token by token: ``add(id)`` returns the text that id completes
    (empty while a multi-byte character is still cut)."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer._special
        self._stream = DecodeStream(skip_special_tokens=False)

    def add(self, token: int) -> str:
        """The new text after ``token``."""
        return self._stream.step(self._tok, token) or ""


def _encode(tok: Tokenizer, text: str) -> list[int]:
    # encode_batch lets go of the GIL while it works (encode holds it: a 1M-character prompt
    # stalled a server's event loop for seconds)
    return list(tok.encode_batch([_utf8(text)], add_special_tokens=False)[0].ids)


def _utf8(text: str) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"a lone surrogate at character {exc.start} is not text") from None
    return text


@cache
def shipped() -> TextTokenizer:
    """The packaged tokenizer, loaded once per process."""
    return TextTokenizer()
