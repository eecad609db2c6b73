"""``radixcache bench cluster``: what the router's policy does to the replicas' caches.

For each policy, a fresh cluster (N replicas of ``blocks`` blocks behind sglang-router, see
``serving.cluster``) takes the ``chat`` workload through the router from the open-loop client
(``traffic.load``); then every replica's mirror is settled on its engine's digest and merged
(``wire.fleet``). Per policy:

- ``hit_rate``: the replicas' prefix-cache hit tokens over prompt tokens (the engines' counters);
- ``imbalance``: max over mean of the requests each replica finished;
- ``ttft_p50_ms`` / ``ttft_p99_ms``: time to first streamed chunk, seen by the client through
  the router;
- ``duplicated_tokens``: tokens cached on more than one replica at the end (held - unique);
- ``requests``: answered requests (``failed``: the others).

The router runs with ``ROUTER_ARGS``: cache_aware's ``cache_threshold`` 0.5 and a balance
threshold of 2 requests in flight (sglang-router's defaults, 0.3 and 64, never balance at this
load: the replica that first caches a common opening text collects every conversation that
opens alike). They are reported in the JSON; the other policies ignore them.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import NamedTuple

from radixcache.serving.cluster import ROUTER_EXE, Cluster, ClusterConfig, RoutePolicy
from radixcache.traffic.load import LoadConfig, Reply, load
from radixcache.traffic.workloads import Workload, build_workload
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.fleet import Fleet

ROUTER_ARGS = ("--cache-threshold", "0.5", "--balance-abs-threshold", "2")


class BenchClusterConfig(NamedTuple):
    """What ``bench cluster`` runs."""

    replicas: int = 4
    blocks: int = 2048
    conversations: int = 320
    rate: float = 30.0
    max_tokens: int = 16
    policies: tuple[RoutePolicy, ...] = tuple(RoutePolicy)
    seed: int = 0


class RouteFigures(NamedTuple):
    """One policy's figures (see the module doc)."""

    hit_rate: float
    imbalance: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    duplicated_tokens: int
    requests: int
    failed: int
    requests_per_replica: list[int]


def router_version() -> str:
    """The installed sglang-router's version ("not installed" when absent)."""
    try:
        return version(ROUTER_EXE)
    except PackageNotFoundError:
        return "not installed"


def _server_info(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/server_info", timeout=10) as r:
        info = json.loads(r.read())
    return {k: int(v) for k, v in info.items() if isinstance(v, int)}


def run_policy(config: BenchClusterConfig, policy: RoutePolicy, workload: Workload,
               on_reply: Callable[[Reply], None] | None = None) -> RouteFigures:
    """Start a cluster with ``policy``, send ``workload`` through its router, measure, stop."""
    cc = ClusterConfig(config.replicas, policy, config.blocks, router_args=ROUTER_ARGS)
    cluster = Cluster(cc).start()
    try:
        fleet = Fleet([Endpoints.tcp("127.0.0.1", r.zmq_port) for r in cluster.replicas])
        fleet.start().wait_synced()
        try:
            lc = LoadConfig(cluster.router_url, config.rate, config.max_tokens, seed=config.seed)
            result = load(lc, workload, on_reply)
            fleet.settle()
            duplicated = fleet.merged().stats().duplicated_tokens
        finally:
            fleet.close()
        infos = [_server_info(r.url) for r in cluster.replicas]
    finally:
        cluster.close()
    s = result.summary()
    prompt = sum(i["prompt_tokens"] for i in infos)
    done = [i["finished"] for i in infos]
    mean = sum(done) / len(done)
    return RouteFigures(
        sum(i["hit_tokens"] for i in infos) / prompt if prompt else 0.0,
        max(done) / mean if mean else 0.0, float(s["ttft_p50_ms"]), float(s["ttft_p99_ms"]),
        duplicated, int(s["requests"]) - int(s["failed"]), int(s["failed"]), done)


def bench_workload(config: BenchClusterConfig) -> Workload:
    """The ``chat`` workload the bench sends."""
    return build_workload("chat", {"conversations": config.conversations, "seed": config.seed})


def figures(config: BenchClusterConfig, results: dict[RoutePolicy, RouteFigures],
            workload: Workload) -> dict[str, object]:
    """The ``--json`` document: ``router`` (name, version, args) and ``policies``."""
    return {
        "router": {"name": ROUTER_EXE, "version": router_version(), "args": list(ROUTER_ARGS)},
        "replicas": config.replicas, "blocks": config.blocks,
        "workload": {"name": "chat", "source": workload.source,
                     "requests": len(workload.requests), "rate": config.rate,
                     "max_tokens": config.max_tokens},
        "policies": {str(p): f._asdict() for p, f in results.items()},
    }
