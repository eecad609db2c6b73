"""The embedded engine feeds the inspector as a subscriber would: the UI never takes the loop's
lock, the loop never takes the feed's. Proved by holding one lock and doing what the other side
does (each would deadlock on a lock it took), no sleeps."""

from __future__ import annotations

import threading
import time

from inspector.feed import Feed
from inspector.sources import ConnState
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from tests.helpers.local import LocalSource


def _until_idle(src: object) -> None:
    while not src.idle():  # type: ignore[attr-defined]
        time.sleep(0.005)


def test_status_and_idle_read_published_state_while_a_step_holds_the_loop_lock() -> None:
    src, feed = LocalSource(256), Feed()
    src.start(feed)
    try:
        assert isinstance(src.send(cmd.StartWorkload("chat", ["3"])), cmd.Ok)
        _until_idle(src)
        assert src.loop is not None
        seen: list[tuple[ConnState, bool, bool]] = []
        with src.loop.lock:  # what a step in progress holds (a plain, non-reentrant lock)
            # the frame's calls, on another thread: if they took the loop lock they could not
            # end before this block does
            t = threading.Thread(target=lambda: seen.append(
                (src.status().state, src.status().busy, src.idle())))
            t.start()
            t.join(30)
            ended = not t.is_alive()
        assert ended and seen == [(ConnState.LOCAL, False, True)]
    finally:
        src.stop()


def test_the_loop_steps_and_answers_commands_while_a_frame_holds_the_feed_lock() -> None:
    src, feed = LocalSource(256), Feed()
    src.start(feed)
    try:
        replies: list[cmd.AnyReply] = []
        with feed.lock:  # a frame being built: a loop applying its batches here would hang
            before = feed.seq
            t = threading.Thread(target=lambda: replies.append(
                src.send(cmd.StartWorkload("tot", ["2", "2"]))))
            t.start()
            t.join(30)
            assert src.loop is not None
            while not t.is_alive() and src.loop.working:  # the loop serves the workload
                time.sleep(0.005)
            published, seq = src.loop.sink.seq, feed.seq  # nothing applied under the frame
        assert replies and isinstance(replies[0], cmd.Ok)
        assert seq == before and published > before + 1
        _until_idle(src)
        assert feed.mirror.digest() == src.service.digest()
        assert feed.seq == src.loop.sink.seq > 1
    finally:
        src.stop()



def test_stats_is_the_services_figures_without_the_streams_digest() -> None:
    """``stats`` through the embedded source never walks the tree for a digest under the loop's
    lock (it cost 635 ms a command at 100,000 nodes): the service's figures, no stream part."""
    src, feed = LocalSource(256), Feed()
    src.start(feed)
    try:
        assert isinstance(src.send(cmd.StartWorkload("flood", ["3"])), cmd.Ok)
        _until_idle(src)
        reply = src.send(cmd.Stats())
        assert isinstance(reply, cmd.StatsReply) and reply.stream is None
        assert reply.socket is None
        got = Stats.of(reply)
        assert got == src.service.stats()  # idle: exactly the service's figures now
        assert (got.submitted, got.finished, got.num_blocks) == (3, 3, 256)
        assert feed.seq == src.loop.sink.seq  # type: ignore[union-attr]  # nothing published
    finally:
        src.stop()
