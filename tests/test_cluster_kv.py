"""The cluster screen over KV-event publishers (the ranks of a vLLM or SGLang deployment):
each rank's block chains merged into one prefix tree with the ranks that hold them."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable

from inspector.cluster import ClusterApp
from inspector.kv_fleet import KVFleet
from radixcache.traffic.workloads import Vocabulary
from radixcache.wire.kvevents import BlockStored, KVEventPublisher
from tests.helpers.stream import wait_for


def test_ranks_blocks_merge_and_show() -> None:
    pubs = [KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") for _ in range(2)]
    pubs[0].publish([BlockStored([1, 2], None, list(range(32)), 16)])
    pubs[1].publish([BlockStored([1], None, list(range(16)), 16),
                     BlockStored([5], 1, list(range(100, 116)), 16)])
    kv = KVFleet([p.endpoints[0] for p in pubs], [p.endpoints[1] for p in pubs]).start()
    try:
        assert wait_for(lambda: [v.used for v in kv.views()] == [2, 2])
        tree = kv.merged()
        rows = sorted((len(n.tokens), sorted(n.holders), int(n.tokens[0])) for n in tree.walk())
        assert rows == [(16, [0], 16), (16, [0, 1], 0), (16, [1], 100)]
        assert tree.stats().duplicated_tokens == 16

        async def run() -> list[str]:
            app = ClusterApp(kv, words=Vocabulary())
            async with app.run_test() as pilot:
                await pilot.pause()  # mounted: on_mount drew the rows (no timing)
                table = app.query_one(DataTable)
                return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(2)]

        shown = asyncio.run(run())
        row = ["●", "up", "2", "blocks", "n/a", "n/a", "n/a"]  # KV events carry no counters
        assert [r.split()[2:] for r in shown] == [row, row]
    finally:
        kv.close()
        for p in pubs:
            p.close()
