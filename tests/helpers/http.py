"""An engine behind the HTTP front for the serving tests, and what they ask of it: its
greedy answer computed apart, its /metrics parsed by prometheus_client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.http import EngineBackend, HttpFront
from radixcache.serving.http_run import Limits
from radixcache.serving.loop import BatchSink, ServiceLoop
from radixcache.serving.model import tiny_model
from radixcache.traffic.tokenizer import shipped

MODEL = "radixcache-tiny"
TOK = shipped()

# one client with a generous timeout: a loaded 2-core machine answers slowly
_http = httpx.Client(timeout=60)


class Served(NamedTuple):
    """An HTTP front and the loop that steps its engine (``loop.fault``: how it died)."""

    front: HttpFront
    loop: ServiceLoop


@contextmanager
def served(blocks: int, limits: Limits | None = None) -> Iterator[Served]:
    """An engine stepped by a ``ServiceLoop`` (its batches dropped) behind an HTTP front on
    loopback, as ``serve --http`` runs them."""
    engine = Engine(EngineConfig(num_blocks=blocks, model=tiny_model()))
    loop = ServiceLoop(engine, BatchSink(lambda _batch: None)).start()
    f = HttpFront(EngineBackend(engine, loop), limits=limits).start()
    try:
        yield Served(f, loop)
    finally:
        f.close()
        loop.close()


@contextmanager
def http_engine(blocks: int, limits: Limits | None = None) -> Iterator[HttpFront]:
    """``served``'s front."""
    with served(blocks, limits) as s:
        yield s.front


def greedy(front: HttpFront, ids: list[int], n: int) -> list[int]:
    """What the engine answers to ``ids`` greedily (deterministic): the logits of a
    teacher-forced run, arg-maxed over the model's vocabulary, which is the tokenizer's."""
    engine = front.backend.engine  # type: ignore[attr-defined]
    out: list[int] = []
    for _ in range(n):
        r = engine.submit([*ids, *out], 1, keep_logits=True).result(30)
        assert r.logits.shape == (1, TOK.vocab_size)
        out.append(int(r.logits[0].argmax()))
    return out


def scrape(front: HttpFront) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client: (sample name, sorted labels) -> value."""
    text = _http.get(f"{front.url}/metrics").text
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}
