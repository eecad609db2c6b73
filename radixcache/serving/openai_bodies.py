"""The typed request bodies of the HTTP front: one msgspec ``Struct`` per endpoint, decoded
straight from the body's bytes (``openai_api.decode``), so that a field of the wrong type or
out of its range is refused by the decoder with the path of that field.

What the types say is what a body may hold; what they cannot say (a token id under the
vocabulary, one of ``text`` or ``input_ids``, ``echo`` with ``logprobs``) ``openai_api``
checks. Every field is declared: an undeclared one is refused (``forbid_unknown_fields``). The
fields of ``NoOps`` are accepted only at the no-op values listed in ``NOOP`` (the parameters
OpenAI, vLLM or SGLang clients send at their defaults, and what sglang-router 0.3.2 adds).

Ranges (``msgspec.Meta``): ``temperature`` [0, 2], ``top_p`` (0, 1], ``top_k`` [-1, 2^30],
``seed`` [0, 2^63), ``logprobs`` / ``top_logprobs`` [0, 20], token counts [1, 2^31], at most
16 stop strings of at least one character.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

MAX_LOGPROBS = 20
MAX_STOPS = 16
SEED_LIMIT = 1 << 63

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1, le=1 << 30)]
Seed = Annotated[int, Meta(ge=0, le=SEED_LIMIT - 1)]  # msgspec's bounds are int64
Tokens = Annotated[int, Meta(ge=1, le=1 << 31)]
Logprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
Stop = Annotated[str, Meta(min_length=1)]
Stops = Stop | Annotated[list[Stop], Meta(max_length=MAX_STOPS)]

# A field absent, null or at one of these values changes nothing; any other value is refused.
NOOP: dict[str, tuple[object, ...]] = {
    "n": (1,), "best_of": (1,), "suffix": ("",), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],),
    "function_call": ("none", "auto"), "parallel_tool_calls": (True, False),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0), "logit_bias": ({},), "min_tokens": (0,), "min_p": (0, 0.0),
    "store": (False,), "service_tier": ("auto", "default"), "modalities": (["text"],),
    "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": (),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True, False),
    "spaces_between_special_tokens": (True, False), "min_new_tokens": (0,),
    "json_schema": (), "regex": (), "ebnf": (), "logprob_start_len": (-1, 0),
    "return_text_in_logprobs": (True, False), "no_stop_trim": (False,),
    # what sglang-router 0.3.2 adds to every request it forwards, at its defaults
    "return_hidden_states": (False,), "continue_final_message": (False,),
    "separate_reasoning": (True, False), "stream_reasoning": (True, False),
    "log_metrics": (True, False), "background": (False,), "no_logs": (True, False),
    "return_bytes": (False,), "return_entropy": (False,),
}


class NoOps(Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields of ``NOOP``: any JSON here, checked against ``NOOP`` after decoding."""

    n: object = None
    best_of: object = None
    suffix: object = None
    response_format: object = None
    tools: object = None
    tool_choice: object = None
    functions: object = None
    function_call: object = None
    parallel_tool_calls: object = None
    presence_penalty: object = None
    frequency_penalty: object = None
    repetition_penalty: object = None
    logit_bias: object = None
    min_tokens: object = None
    min_p: object = None
    store: object = None
    service_tier: object = None
    modalities: object = None
    audio: object = None
    prediction: object = None
    reasoning_effort: object = None
    web_search_options: object = None
    include_stop_str_in_output: object = None
    skip_special_tokens: object = None
    spaces_between_special_tokens: object = None
    min_new_tokens: object = None
    json_schema: object = None
    regex: object = None
    ebnf: object = None
    logprob_start_len: object = None
    return_text_in_logprobs: object = None
    no_stop_trim: object = None
    return_hidden_states: object = None
    continue_final_message: object = None
    separate_reasoning: object = None
    stream_reasoning: object = None
    log_metrics: object = None
    background: object = None
    no_logs: object = None
    return_bytes: object = None
    return_entropy: object = None


assert set(NoOps.__struct_fields__) == set(NOOP), "NoOps declares exactly NOOP's fields"


class SamplingFields(NoOps, kw_only=True, forbid_unknown_fields=True):
    """The sampling fields every dialect shares (OpenAI's top level, SGLang's
    ``sampling_params``)."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stops | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None


class StreamOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's ``stream_options`` (``continuous_usage_stats``: vLLM's)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class OpenAIFields(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """What both OpenAI endpoints take besides their prompt."""

    model: str | None = None
    user: str | None = None
    metadata: object = None  # carried, not used
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Tokens | None = None


class CompletionBody(OpenAIFields, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/completions``. ``prompt``: text, ids, or a batch of one of either."""

    prompt: str | list[int | str | list[int]] | None = None
    logprobs: Logprobs | None = None
    echo: bool | None = None
    split_special_tokens: bool | None = None  # marker text in the prompt stays text


class TextPart(Struct, kw_only=True, forbid_unknown_fields=True):
    """A message's content part: only text."""

    type: Literal["text"]
    text: str


Role = Literal["system", "developer", "user", "assistant"]


class Message(Struct, kw_only=True, forbid_unknown_fields=True):
    """One chat message."""

    role: Role
    content: str | list[TextPart]
    name: str | None = None


class ChatBody(OpenAIFields, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    max_completion_tokens: Tokens | None = None
    logprobs: bool | None = None
    top_logprobs: Logprobs | None = None


class SamplingParams(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """SGLang's ``sampling_params``."""

    max_new_tokens: Tokens | None = None
    sampling_seed: Seed | None = None


class GenerateBody(NoOps, kw_only=True, forbid_unknown_fields=True):
    """``POST /generate`` (SGLang): ``text`` or ``input_ids`` (lists of them are batches)."""

    text: str | list[object] | None = None
    input_ids: list[int | list[int]] | None = None
    sampling_params: SamplingParams | None = None
    stream: bool | None = None
    rid: str | None = None
    return_logprob: bool | None = None
    top_logprobs_num: Logprobs | None = None
    model: str | None = None
    split_special_tokens: bool | None = None


class TokenizeBody(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /tokenize``: ``prompt`` (or SGLang's ``text``), or ``messages``."""

    model: str | None = None
    prompt: str | None = None
    text: str | None = None
    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    split_special_tokens: bool | None = None


class DetokenizeBody(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[int] | None = None


class AbortBody(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /abort_request`` (SGLang): the ``rid`` of a ``/generate`` request."""

    rid: str
