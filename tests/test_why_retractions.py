"""The why screen explains a request's wait by its retractions, and the stats pane counts
them (issue 35, item 5), from real retractions: a seeded engine under ``--reserve grow`` on a
pool too small for its running requests' growing leases. The stream of a schema 6 engine
(no ``RequestStart`` when a retracted request resumes) and one with that second
``RequestStart`` read the same, in either order of what follows a retraction."""

from __future__ import annotations

import itertools

from textual.widgets import Static

from inspector.app import InspectorApp
from inspector.embedded import EmbeddedSource
from inspector.feed import Feed
from inspector.fidelity import Fidelity
from inspector.replay import Recording
from inspector.why_screen import WhyScreen
from inspector.widgets.stats import StatsPane
from radixcache.core import events as ev
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.loop import LoopConfig, Sampling
from radixcache.serving.memory import MemorySource
from radixcache.serving.model import tiny_model
from radixcache.serving.reserve import Reserve
from radixcache.serving.service import handle
from radixcache.wire import commands as cmd
from tests.helpers.pilot import T0, NoNvml, sync, type_line, wait_until

STEP_S = 0.5  # each batch's time is this much after the last one's (an exact clock)


def _engine(num_blocks: int) -> Engine:
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=4, model=tiny_model(),
                               reserve=Reserve.GROW), memory=MemorySource(nvml=NoNvml()))


def _stream(num_blocks: int, workload: list[str]) -> tuple[ev.Snapshot, list[ev.Batch], Engine]:
    """The engine's snapshot before ``workload``, then one batch per step (seq 1, 2, ...; the
    n-th at ``T0 + n * STEP_S``) until it is idle; the engine is returned closed."""
    e = _engine(num_blocks)
    e.take_events()
    snap = e.snapshot()
    assert isinstance(handle(e, cmd.StartWorkload(workload[0], workload[1:])), cmd.Ok)
    batches = []
    for seq in itertools.count(1):
        if not e.busy():
            break
        e.step()
        batches.append(ev.Batch(seq, 1, T0 + seq * STEP_S, "test", e.take_events()))
    e.close()
    return snap, batches, e


def _resumed(batches: list[ev.Batch]) -> list[ev.Batch]:
    """``batches`` with a ``RequestStart`` (hit: the tokens kept) right before a retracted
    request's next event of its own: what an engine that says when it resumes would send."""
    open_: dict[int, int] = {}  # req -> kept tokens, retracted and not yet resumed
    out = []
    for b in batches:
        events: list[ev.AnyEvent] = []
        for x in b.events:
            req = getattr(x, "req", None)
            if isinstance(x, ev.Retract | ev.RequestFinish) and req in open_:
                events.append(ev.RequestStart(x.req, 1, open_.pop(x.req)))
            events.append(x)
            if isinstance(x, ev.Retract):
                open_[x.req] = x.kept_tokens
        out.append(ev.Batch(b.seq, b.epoch, b.ts, b.engine, events))
    return out


def _fed(snap: ev.Snapshot, batches: list[ev.Batch]) -> Feed:
    feed = Feed()
    feed.load(snap, 0, T0)
    assert all(feed.apply(b) for b in batches)  # a second RequestStart fits the mirror
    return feed


def _expected(batches: list[ev.Batch], req: int, *, resumed: bool) -> list[str]:
    """The why screen's retraction lines for ``req``, worked out here from the events."""
    mine = [(b.seq, b.ts, x) for b in batches for x in b.events
            if getattr(x, "req", None) == req and not isinstance(x, ev.RequestStart)]
    lines, kept, waited = [], 0, 0.0
    for (seq, ts, x), (nseq, nts, _) in itertools.pairwise(mine):
        if not isinstance(x, ev.Retract):
            continue
        kept, waited = kept + x.kept_tokens, waited + (nts - ts)
        head = (f"  retracted at seq {seq:,}: {x.kept_tokens:,} tokens kept in the tree, "
                f"{x.blocks:,} blocks freed; ")
        lines.append(head + (f"ran again at seq {nseq:,}, {nts - ts:.2f} s later, "
                             f"{x.kept_tokens:,} tokens read back from the tree" if resumed else
                             f"ran again within {nts - ts:.2f} s (by its next event, seq "
                             f"{nseq:,}; the engine does not say when)"))
    times = {1: "once", 2: "twice"}.get(len(lines), f"{len(lines)} times")
    wait = f"waited {'' if resumed else 'at most '}{waited:.2f} s to run again"
    return [f"retracted {times}: {kept:,} tokens kept in the tree, {wait}", *lines]


def test_retractions_of_a_schema_6_stream_and_of_one_that_says_when_it_resumed() -> None:
    snap, batches, engine = _stream(38, ["tot", "2", "3"])
    stats = engine.stats()
    retracts = [x for b in batches for x in b.events if isinstance(x, ev.Retract)]
    twice = [r for r in {x.req for x in retracts} if sum(x.req == r for x in retracts) == 2]
    assert stats.retractions == len(retracts) >= 3 and twice  # a request retracted twice
    for stream, resumed in ((batches, False), (_resumed(batches), True)):
        feed = _fed(snap, stream)
        r = feed.retractions
        assert (r.totals.retractions, r.totals.kept_tokens, r.totals.blocks) == (
            stats.retractions, stats.retracted_tokens, sum(x.blocks for x in retracts))
        for req in {x.req for x in retracts}:
            got = r.of(req)
            assert got is not None and got.lines() == _expected(stream, req, resumed=resumed)
        assert r.of(0) is None  # never retracted: the why screen adds nothing
    first = _fed(snap, batches).retractions.of(twice[0])
    assert first is not None and first.lines()[0].startswith("retracted twice: ")


def test_a_retraction_not_followed_yet_waits_and_a_first_start_is_no_resumption() -> None:
    snap, batches, _ = _stream(38, ["tot", "2", "3"])
    cut = next(i for i, b in enumerate(batches) if any(isinstance(x, ev.Retract)
                                                       for x in b.events))
    retract = next(x for x in batches[cut].events if isinstance(x, ev.Retract))
    feed = _fed(snap, batches[: cut + 1])
    got = feed.retractions.of(retract.req)
    assert got is not None and got.lines() == [
        f"retracted once: {retract.kept_tokens:,} tokens kept in the tree, waiting to run again",
        f"  retracted at seq {batches[cut].seq:,}: {retract.kept_tokens:,} tokens kept in the "
        f"tree, {retract.blocks:,} blocks freed; not run again yet"]
    # the resumption's RequestStart in a later batch than the retraction's
    later = ev.Batch(batches[cut].seq + 1, 1, batches[cut].ts + 2.0, "test",
                     [ev.RequestStart(retract.req, 1, retract.kept_tokens - 1)])
    assert feed.apply(later)
    assert got.lines()[-1].endswith(f"ran again at seq {later.seq:,}, 2.00 s later, "
                                    f"{retract.kept_tokens - 1:,} tokens read back from the tree")
    assert got.lines()[0].endswith("waited 2.00 s to run again")
    # a seek back forgets them (the replay brings them again)
    feed.load(snap, 0, T0)
    assert feed.retractions.of(retract.req) is None and feed.retractions.totals.retractions == 0


def _body(app: InspectorApp) -> str:
    screen = app.screen
    assert isinstance(screen, WhyScreen)
    return str(screen.query_one("#why-body", Static).render())


@sync
async def test_the_why_screen_and_the_stats_pane_show_real_retractions_and_blocks_stay_exact(
) -> None:
    """Every frame of a run with growing leases and retractions is checked against the mirror
    (``Fidelity``: every block's state, pinned, shared, cached, free); the why screen of a
    retracted request says its retractions as the event log has them; ``stats`` gives the
    stats pane the engine's split of the tokens kept."""
    ticks = itertools.count()
    engine, recording = _engine(48), Recording()
    src = EmbeddedSource(engine, LoopConfig(sampling=Sampling.EVERY_BATCH),
                         clock=lambda: T0 + next(ticks) * STEP_S, recording=recording,
                         keyframe_every=1 << 20)
    check = Fidelity(every=1)
    app = InspectorApp(src, flash_s=0, frame_interval=0.02, check=check)
    async with app.run_test(size=(150, 44)) as pilot:
        await type_line(pilot, "tot 2 3")
        await wait_until(pilot, lambda: app.replies == 1 and src.idle() and app.caught_up())
        stats = engine.stats()
        assert stats.retractions >= 3 and stats.rejected == 0
        assert check.checked >= 10 and check.violations == []
        with app.feed.lock:
            assert app.feed.mirror.digest() == engine.digest()
            totals = app.feed.retractions.totals
        assert (totals.retractions, totals.kept_tokens) == (stats.retractions,
                                                            stats.retracted_tokens)
        await pilot.press("f7")  # the stats pane (hidden by default)
        pane = app.query_one(StatsPane)
        await wait_until(pilot, lambda: pane.frame.retractions == totals)
        seen = ("retractions", f"{stats.retractions} ({stats.retracted_tokens:,} tok kept)")
        rows = pane.rows()
        assert rows[[name for name, _ in rows].index("evictions") + 1] == seen
        await type_line(pilot, "stats")
        await wait_until(pilot, lambda: app.replies == 2)
        rows = pane.rows()
        at = [name for name, _ in rows].index("retractions")
        assert rows[at - 1][0] == "evictions" and rows[at:at + 3] == [
            seen, ("  at last stats", f"{stats.retractions}, reserve grow"),
            ("  read back", f"{stats.retracted_from_tree:,} · "
                            f"{stats.retracted_recomputed:,} redone")]
        retracts = [x for b in recording.batches for x in b.events if isinstance(x, ev.Retract)]
        assert len(retracts) == stats.retractions
        for req in (retracts[0].req, retracts[-1].req):
            want = _expected(recording.batches, req, resumed=False)
            assert want[0].startswith("retracted once: ")
            if req == retracts[0].req:
                await type_line(pilot, f"why {req}")
            else:  # enter on the newest retract event in the log
                await type_line(pilot, "filter retract")
                await pilot.press("escape", "e", "enter")
            await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
            assert app.screen.req == req  # type: ignore[attr-defined]
            assert _body(app).splitlines()[-2 - len(want):] == [*want, "", "escape: close"]
            await pilot.press("escape")
            assert not isinstance(app.screen, WhyScreen)
