"""``core.recency`` against a token-by-token model: a node's steps are where the access time of
its tokens drops. Every function, with and without older steps (their fast paths included)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.core import recency


def times_of(start: int, end: int, clock: int, older: recency.Steps) -> list[int]:
    """The access time of each token of ``[start, end)``."""
    out, t, steps = [], clock, list(older)
    for p in range(start, end):
        while steps and steps[0][0] <= p:
            t = steps.pop(0)[1]
        out.append(t)
    return out


def steps_of(start: int, times: list[int]) -> recency.Steps:
    """The steps of tokens from ``start`` with these times: where the time drops."""
    return tuple((start + i, t) for i, t in enumerate(times) if i and t < times[i - 1])


@st.composite
def nodes(draw: st.DrawFn, start: int | None = None, top: int = 1000) -> tuple[int, int, int,
                                                                             int, recency.Steps]:
    """(block, start, end, clock, older): a node whose older steps sit on block boundaries
    inside it, clocks strictly decreasing below ``clock <= top``."""
    block = draw(st.sampled_from([1, 4, 16]))
    s = draw(st.integers(0, 80)) if start is None else start
    e = s + draw(st.integers(1, 120))
    bounds = [p for p in range(s + 1, e) if p % block == 0]
    at = sorted(draw(st.sets(st.sampled_from(bounds), max_size=4))) if bounds else []
    at = at[: top - 1]  # as many steps as there are clocks below ``top``
    clock = draw(st.integers(len(at) + 1, top))
    clocks = sorted(draw(st.sets(st.integers(1, clock - 1), min_size=len(at),
                                 max_size=len(at))), reverse=True) if at else []
    return block, s, e, clock, tuple(zip(at, clocks, strict=True))


@settings(max_examples=300)
@given(nodes(), st.data())
def test_stamp_uses_every_token_before_its_end_rounded_up_to_a_block(node, data) -> None:
    block, s, e, clock, older = node
    upto = data.draw(st.integers(s + 1, e))
    now = clock + data.draw(st.integers(1, 5))
    ub = -(-upto // block) * block
    times = [now if p < ub else t for p, t in zip(range(s, e), times_of(s, e, clock, older),
                                                  strict=True)]
    assert recency.stamp(clock, older, e, upto, now, block) == steps_of(s, times)


@settings(max_examples=300)
@given(nodes(), st.data())
def test_split_keeps_each_tokens_time_on_its_side(node, data) -> None:
    _, s, e, clock, older = node
    if e - s < 2:
        return
    pos = data.draw(st.integers(s + 1, e - 1))
    times = times_of(s, e, clock, older)
    head, suffix_clock, tail = recency.split(clock, older, pos)
    assert head == steps_of(s, times[: pos - s])
    assert (suffix_clock, tail) == (times[pos - s], steps_of(pos, times[pos - s :]))
    assert recency.tail_clock(clock, older) == times[-1]


@settings(max_examples=300)
@given(nodes(), st.data())
def test_join_gives_the_shared_block_the_parents_time(parent, data) -> None:
    block, ps, cs, pclock, polder = parent
    tail = times_of(ps, cs, pclock, polder)[-1]
    child = data.draw(nodes(start=cs, top=tail))
    _, _, end, cclock, colder = child
    at = -(-cs // block) * block
    colder = tuple((p, c) for p, c in colder if p % block == 0)
    times = times_of(ps, cs, pclock, polder) + [
        tail if p < at else t for p, t in zip(range(cs, end), times_of(cs, end, cclock, colder),
                                              strict=True)]
    assert recency.join(pclock, polder, cs, cclock, colder, block, end) == steps_of(ps, times)


def test_a_node_without_older_steps() -> None:
    assert recency.stamp(9, (), 40, 17, 12, 16) == ((32, 9),)
    assert recency.stamp(9, (), 40, 33, 12, 16) == ()
    assert recency.split(9, (), 20) == ((), 9, ())
    assert recency.join(9, (), 20, 7, (), 16, 50) == ((32, 7),)
    assert recency.join(9, (), 20, 9, (), 16, 50) == ()
    assert recency.join(9, (), 20, 7, (), 16, 30) == ()
