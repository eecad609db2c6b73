"""The endpoints routers call, through the real sglang-router: its /flush_cache reaches every
replica's, its /get_loads reads every replica's /get_load; a replica refuses a flush while a
request runs; router flags pass through (`--router-arg`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from radixcache.serving.cluster import Cluster, ClusterConfig, RoutePolicy
from tests.helpers.stream import wait_for

MODEL = "radixcache-tiny"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    config = ClusterConfig(replicas=2, policy=RoutePolicy.ROUND_ROBIN, blocks=128,
                           router_args=("--request-timeout-secs", "120"))
    c = Cluster(config).start()
    yield c
    c.close()


def _used_blocks(c: Cluster) -> list[int]:
    return [httpx.get(f"{r.url}/server_info", timeout=10).json()["used_blocks"]
            for r in c.replicas]


def test_the_routers_flush_cache_empties_every_replica(cluster: Cluster) -> None:
    for tail in ("one", "two"):  # round robin: one request on each replica
        r = httpx.post(f"{cluster.router_url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": f"a prompt to cache, {tail}", "max_tokens": 2})
        assert r.status_code == 200
    assert all(n > 0 for n in _used_blocks(cluster))
    flushed = httpx.post(f"{cluster.router_url}/flush_cache", timeout=30).json()
    assert (flushed["status"], flushed["workers_flushed"]) == ("success", 2)
    assert _used_blocks(cluster) == [0, 0]


def test_the_routers_get_loads_reads_every_replica(cluster: Cluster) -> None:
    loads = httpx.get(f"{cluster.router_url}/get_loads", timeout=30).json()
    assert sorted((w["worker"], w["load"]) for w in loads["workers"]) == sorted(
        (r.url, 0) for r in cluster.replicas)


def test_a_replica_refuses_a_flush_while_a_request_runs(cluster: Cluster) -> None:
    url = cluster.replicas[0].url
    body = {"model": MODEL, "prompt": "go on and on", "max_tokens": 1500}
    t = threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json=body,
                                                   timeout=300))
    t.start()
    assert wait_for(lambda: httpx.get(f"{url}/get_load", timeout=10).json()[0][
        "num_running_reqs"] == 1, timeout=20)
    [load] = httpx.get(f"{url}/get_load", timeout=10).json()
    assert (load["dp_rank"], load["num_reqs"], load["num_running_reqs"]) == (0, 1, 1)
    assert load["num_tokens"] > 0  # the running request's blocks, in tokens
    refused = httpx.post(f"{url}/flush_cache", timeout=10)
    assert refused.status_code == 400
    assert refused.json() == {"message": "cache not flushed: 1 requests running, 0 waiting",
                              "running": 1, "waiting": 0}
    t.join(300)
    assert httpx.post(f"{url}/flush_cache", timeout=10).status_code == 200


def test_router_args_reach_the_router() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "cluster", "--replicas", "1",
                        "--blocks", "64", "--router-arg", "--no-such-flag 3"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stderr.startswith("error: router exited (2): ")
    assert "unrecognized arguments" in p.stderr and "--no-such-flag 3" in p.stderr
