"""The answer of ``radixcache whatif`` as typed figures: what ``--json`` prints (field names and
order are its stable keys, docs/whatif.md; a field left ``None`` is absent), what the terminal
view, the table and the chart read.

``answers.summary`` builds a ``WhatIfFigures``; ``routing.compare`` its ``routing``.
``as_json`` is the one place they become JSON.
"""

from __future__ import annotations

import json

import msgspec


class Misses(msgspec.Struct, omit_defaults=True):
    """Missed prompt tokens at each capacity, by class (``answers.misses``); ``alignment`` is
    None when the curve cannot tell those apart (then ``compulsory`` holds them too)."""

    compulsory: list[int]
    capacity: list[int]
    alignment: list[int] | None = None


class PolicyFigures(msgspec.Struct):
    """One policy replayed at a few capacities, beside the LRU curve there."""

    capacities_tokens: list[int]
    hit_rate: list[float]
    lru_hit_rate: list[float]


class PoolFigures(msgspec.Struct):
    """What a pool of ``blocks`` reaches, and twice it, as fractions of the maximum;
    ``given_by``: ``option`` (--pool-blocks) or ``recording`` (its engine's)."""

    blocks: int
    tokens: int
    of_max: float
    of_max_2x: float
    given_by: str
    exact: bool = True  # both capacities at exact points of the curve


class RouterFigures(msgspec.Struct):
    """One router over the replicas."""

    hit_rate: float
    imbalance: float
    duplicated_tokens: int
    requests: list[int]


class SharedFigures(msgspec.Struct):
    """One cache as large as all the replicas together."""

    hit_rate: float
    capacity_blocks: int


class RoutingFigures(msgspec.Struct):
    """Every router over ``replicas`` pools of ``capacity_blocks``, and the shared cache."""

    replicas: int
    capacity_blocks: int
    block_size: int
    policies: dict[str, RouterFigures]
    shared: SharedFigures


class WhatIfFigures(msgspec.Struct, omit_defaults=True):
    """The whole answer (see the module doc)."""

    source: str
    format: str
    requests: int
    prompt_tokens: int
    block_size: int
    capacities_tokens: list[int]
    capacities_blocks: list[int]
    hit_rate: list[float]
    max_hit_rate: float
    capacity_for: dict[str, int]  # "0.5", "0.9", "0.99" of the maximum -> tokens
    knee_tokens: int
    misses: Misses
    seconds: float
    policies: dict[str, PolicyFigures]
    notes: list[str]
    hit_rate_block_size_1: list[float] | None = None
    capacities_gib: list[float] | None = None
    pool: PoolFigures | None = None
    sample_rate: float | None = None
    sample_resolves_from_tokens: int | None = None  # a sample's curve holds from here up
    routing: RoutingFigures | None = None
    # beside ``capacities_tokens``: whether each point is exact, and an estimated point's
    # error bound (95%, points of hit rate; 0 where exact, None where none is known)
    exact: list[bool] | None = None
    bound_points: list[float | None] | None = None
    exact_up_to_tokens: int | None = None  # every capacity up to here is exact (None: all)
    knee_exact: bool | None = None
    capacity_for_exact: dict[str, bool] | None = None
    capacities_bytes: list[int] | None = None
    cost: list[float] | None = None  # capacities_gib x --price-per-gib


CSV_COLUMNS = ("capacity_tokens", "capacity_blocks", "capacity_bytes", "hit_rate",
               "compulsory_misses", "capacity_misses", "alignment_misses", "exact",
               "bound_points", "cost")


def as_csv(fig: WhatIfFigures) -> str:
    """Every capacity of ``fig`` as CSV (``CSV_COLUMNS``; a cell left empty where the figure is
    not known: bytes without bytes per token, a bound of an estimate without one)."""
    import csv
    import io

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    m, n = fig.misses, len(fig.capacities_tokens)
    none: list[None] = [None] * n
    cols = (fig.capacities_tokens, fig.capacities_blocks, fig.capacities_bytes or none,
            [f"{r:.6f}" for r in fig.hit_rate], m.compulsory, m.capacity, m.alignment or none,
            ["exact" if e else "estimated" for e in fig.exact or [True] * n],
            [None if b is None else f"{b:.4f}" for b in fig.bound_points or none],
            [f"{c:.6g}" for c in fig.cost] if fig.cost is not None else none)
    for row in zip(*cols, strict=True):
        w.writerow(["" if v is None else v for v in row])
    return out.getvalue()


def as_json(fig: WhatIfFigures) -> str:
    """The ``--json`` line (the standard library's float spelling, as before the types)."""
    return json.dumps(msgspec.to_builtins(fig))
