"""A streamed chunk carries its own piece's output ids, however far the engine ran ahead of
the stream (a front in another process gets several tokens in one frame, and a busy event
loop reads its queue late)."""

from __future__ import annotations

import asyncio
import json

from radixcache.serving import openai_api as api
from radixcache.serving import openai_out as out
from radixcache.serving.http_stream import stream_events
from radixcache.serving.sampling import Piece
from radixcache.traffic.tokenizer import TextTokenizer


class _Ran:
    """A request whose every id came in before the stream read its first piece."""

    def __init__(self, dialect: api.Dialect) -> None:
        self.ask = api.Ask(dialect, [5, 6, 7], 4, True, False)
        self.ids = [11, 12, 13, 14]
        self.rest = Piece("", [])

    @property
    def rid(self) -> str:
        return "cmpl-1"

    def outcome(self) -> out.Outcome:
        return out.Outcome(self.rid, 3, 0, self.ids, "abcd", None, [])


def _events(run: _Ran, pieces: list[Piece]) -> list[object]:
    left: list[Piece | None] = [*pieces, None]

    async def next_piece() -> Piece | None:
        return left.pop(0)

    async def collect() -> list[bytes]:
        return [e async for e in stream_events(run, next_piece, "m", TextTokenizer())]

    raw = asyncio.run(collect())
    return [json.loads(e[6:]) if e != b"data: [DONE]\n\n" else "[DONE]" for e in raw]


def test_each_generate_chunk_holds_the_ids_of_its_own_piece() -> None:
    # the second id decoded to no text yet: the third piece carries both of them
    pieces = [Piece("a", [], 1), Piece("b", [], 3), Piece("c", [], 4)]
    events = _events(_Ran(api.GENERATE), pieces)
    chunks = [(e["text"], e["output_ids"], e["meta_info"]["completion_tokens"])
              for e in events[:3] if isinstance(e, dict)]
    assert chunks == [("a", [11], 1), ("b", [12, 13], 3), ("c", [14], 4)]
    last = events[3]
    assert isinstance(last, dict)
    assert (last["output_ids"], events[4]) == ([], "[DONE]")


def test_a_piece_nobody_counted_takes_every_id_not_sent() -> None:
    events = _events(_Ran(api.GENERATE), [Piece("a", [], 1), Piece("bcd", [])])
    assert [e["output_ids"] for e in events[:3] if isinstance(e, dict)] == [[11], [12, 13, 14],
                                                                           []]
