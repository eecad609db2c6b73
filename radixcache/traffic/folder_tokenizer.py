"""A model folder's own tokenizer and chat template (``serve --model DIR``).

``DIR/tokenizer.json`` is read with Hugging Face ``tokenizers`` (as ``TextTokenizer`` reads the
shipped one); the chat template is ``tokenizer_config.json``'s ``chat_template`` (or
``DIR/chat_template.jinja``). A chat's ids are what transformers' ``apply_chat_template(...,
add_generation_prompt=True)`` returns for the same messages: with transformers installed it is
that very call on the folder's tokenizer (loaded from the folder, never from a hub); without
it, the template is rendered with jinja2 as transformers configures it (``trim_blocks``,
``lstrip_blocks``, ``raise_exception``) and the text encoded with its special tokens
recognized, which is what transformers did before it marked control tokens.

The built-in workloads (``chat``, ``system``, ...) speak their own word ids; ``retokenized``
maps them into the model's ids word by word, so ``demo --model DIR`` shows that model's cache
with its own text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
from tokenizers import Tokenizer

from radixcache.traffic.sharegpt import TokenArray
from radixcache.traffic.tokenizer import TextTokenizer
from radixcache.traffic.workload_types import Workload

Messages = list[dict[str, str]]


def _token_text(v: object) -> str:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


class FolderTokenizer(TextTokenizer):
    """The tokenizer of a Hugging Face model folder (thread-safe as ``TextTokenizer``)."""

    def __init__(self, directory: Path) -> None:
        if not (directory / "tokenizer.json").is_file():
            raise ValueError(f"{directory}: no tokenizer.json (a fast tokenizer is needed)")
        super().__init__(directory)
        cfg_path = directory / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        template = cfg.get("chat_template")
        jinja = directory / "chat_template.jinja"
        if not isinstance(template, str) and jinja.is_file():
            template = jinja.read_text()
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self._apply: Callable[[Messages], list[int]] | None = None
        self._framed = Tokenizer.from_file(str(directory / "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        """Ids of a completion prompt as transformers' ``tokenizer(text)`` gives them: the
        markers recognized and the tokenizer's own framing added (Llama 3's BOS, when its
        post-processor has one), so usage counts equal the client's."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # as the shipped tokenizer refuses it
            raise ValueError(f"a lone surrogate at character {exc.start} is not text") from None
        return list(self._framed.encode_batch([text], add_special_tokens=True)[0].ids)

    def _special_ids(self, text: str) -> list[int]:
        return super().encode(text)

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The folder's chat template over ``(role, content)`` messages, generation prompt
        included, as transformers tokenizes it. Raises ``ValueError`` without a template."""
        if self.chat_template is None:
            raise ValueError(f"{self.path}: the tokenizer has no chat template")
        msgs = [{"role": r, "content": c} for r, c in messages]
        if self._apply is None:
            self._apply = self._transformers() or self._jinja()
        return self._apply(msgs)

    def _transformers(self) -> Callable[[Messages], list[int]] | None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            return None
        tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)

        def apply(msgs: Messages) -> list[int]:
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
            return [int(i) for i in cast("list[int]", ids)]

        return apply

    def _jinja(self) -> Callable[[Messages], list[int]]:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def fail(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.globals["raise_exception"] = fail
        compiled = env.from_string(str(self.chat_template))

        def apply(msgs: Messages) -> list[int]:
            text = compiled.render(messages=msgs, add_generation_prompt=True,
                                   bos_token=self.bos_token, eos_token=self.eos_token)
            return self._special_ids(text)  # the template frames it: no framing added

        return apply


class _ModelText:
    """A workload's preview text in the model's own words (``TokenText``)."""

    def __init__(self, tok: FolderTokenizer) -> None:
        self.tok = tok

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """The folder tokenizer's decoding of ``tokens``."""
        return self.tok.decode([int(t) for t in tokens])


def retokenized(workload: Workload, tok: FolderTokenizer) -> Workload:
    """``workload`` in the model's ids: each of its tokens becomes the ids of its word (with a
    leading space) in ``tok``, one mapping per distinct token, so a prompt that extends
    another (a chat's next turn, a shared system prompt) still extends it token for token and
    the cache sees the workload's sharing unchanged; forced answers are mapped the same way
    (``max_new_tokens`` is their new length). Previews read in the model's text."""
    ids: dict[int, TokenArray] = {}

    def mapped(tokens: TokenArray) -> TokenArray:
        out = []
        for t in tokens.tolist():
            if t not in ids:
                ids[t] = np.asarray(tok.encode_plain(" " + workload.text([t])), dtype=np.uint32)
            out.append(ids[t])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.uint32)

    requests = []
    for r in workload.requests:
        forced = None if r.forced_output is None else mapped(r.forced_output)
        n = r.max_new_tokens if forced is None else len(forced)
        requests.append(r._replace(prompt=mapped(r.prompt), forced_output=forced,
                                   max_new_tokens=n))
    return replace(workload, requests=requests, vocab=_ModelText(tok))
