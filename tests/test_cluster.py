"""Replicas behind the real sglang-router: the openai client through it, the merged tree of
the replicas' streams, the cluster screen, token-id prompts, and the faults (a replica
SIGKILLed and restarted by the supervisor, the router told; a taken port; no router
installed, or installed beside the interpreter only). Two small replicas, a few requests."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from textual.widgets import DataTable, Static

from inspector.cluster import ClusterApp, StreamFleet, replica_views, tree_lines
from radixcache.serving.cluster import (
    ROUTER_EXE,
    Cluster,
    ClusterConfig,
    ClusterError,
    RoutePolicy,
    router_exe,
)
from radixcache.serving.router_front import TOKEN_IDS
from radixcache.serving.supervisor import ReplicaState, router_workers
from radixcache.traffic.tokenizer import shipped
from radixcache.traffic.workloads import Vocabulary, build_workload
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.fleet import Fleet
from tests.helpers.stream import wait_for

MODEL = "radixcache-tiny"
SHARED = "the radix cache keeps every prefix it has seen, token by token, in blocks of"
TOK = shipped()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(ClusterConfig(replicas=2, policy=RoutePolicy.ROUND_ROBIN, blocks=128)).start()
    yield c
    c.close()


@pytest.fixture(scope="module")
def fleet(cluster: Cluster) -> Iterator[Fleet]:
    f = Fleet([Endpoints.tcp("127.0.0.1", r.zmq_port) for r in cluster.replicas]).start()
    f.wait_synced()
    yield f
    f.close()


def finished(cluster: Cluster, ranks: tuple[int, ...] = (0, 1)) -> list[int]:
    out = []
    for rank in ranks:
        url = cluster.replicas[rank].url
        with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
            out.append(json.loads(resp.read())["finished"])
    return out


def text(tail: str) -> str:
    """The router takes text prompts (422 for token ids): SHARED, then ``tail``."""
    return f"{SHARED} {tail}"


def complete(client: openai.OpenAI, tail: str) -> str:
    r = client.completions.create(model=MODEL, prompt=text(tail), max_tokens=3)
    return r.choices[0].text


def test_openai_client_through_the_router(cluster: Cluster, fleet: Fleet) -> None:
    assert [r.http_port - cluster.replicas[0].http_port for r in cluster.replicas] == [0, 1]
    client = openai.OpenAI(base_url=f"{cluster.router_url}/v1", api_key="unused")
    first = complete(client, "one")
    streamed = client.completions.create(model=MODEL, prompt=text("one"), max_tokens=3,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == first  # same model on each replica
    complete(client, "two")
    complete(client, "three")
    assert finished(cluster) == [2, 2]  # round robin
    fleet.settle()
    stats = fleet.merged().stats()
    # each replica cached prompt + 2 of its 3 answer tokens (the last one's K/V is never
    # written): SHARED one + 2 answer tokens on both, " two" + 2 on one, " three" + 2 on the
    # other (each tail one token of the shipped tokenizer)
    shared = TOK.encode(SHARED)
    assert [TOK.encode(text(t))[: len(shared)] == shared and len(TOK.encode(text(t)))
            for t in ("one", "two", "three")] == [len(shared) + 1] * 3
    assert stats.replication == {2: len(shared) + 3, 1: 6}
    assert stats.duplicated_tokens == len(shared) + 3
    # the router loaded the tokenizer from the replicas' model_path (a local directory)
    # instead of warning, once per replica, that it could not fetch "radixcache-tiny" from a hub
    assert "Failed to load tokenizer" not in (cluster.workdir / "router.log").read_text()


def test_cluster_screen_rows_and_tree(cluster: Cluster, fleet: Fleet) -> None:
    fleet.settle()
    views = replica_views(fleet)
    assert [(v.rank, v.up, v.total) for v in views] == [(0, True, 128), (1, True, 128)]
    lines = tree_lines(fleet.merged(), 2, Vocabulary())
    shared = len(TOK.encode(SHARED))  # the replicas split after the shared text
    assert lines[0].plain.startswith(f"[{shared}] ") and lines[0].plain.endswith("●● x2")

    n = len(build_workload("chat", {"conversations": 1}).requests)

    async def run() -> None:
        app = ClusterApp(StreamFleet(fleet), cluster.router_url, cluster, words=Vocabulary())
        async with app.run_test() as pilot:
            await pilot.pause()  # mounted: on_mount drew the rows (no timing)
            table = app.query_one(DataTable)
            assert table.row_count == 2
            assert "2/2 replicas up" in app.header_text().plain
            await pilot.press("colon", *"chat 1", "enter")  # through the router
            for _ in range(200):
                await pilot.pause(0.05)
                if "failed" in str(app.query_one("#message", Static).render()):
                    break
            assert str(app.query_one("#message", Static).render()).startswith(
                f"{n} requests, 0 failed")
            await pilot.press("escape", "down", "enter")
        assert app.return_value == 1  # Enter opens replica 1's full screen

    import asyncio

    asyncio.run(run())


def test_token_id_prompts_get_a_clear_error_through_the_router(cluster: Cluster) -> None:
    ids = TOK.encode(text("ids"))
    # was: sglang-router 0.3.2 answered 422 "Failed to deserialize the JSON body into the
    # target type: prompt: data did not match any variant of untagged enum StringOrArray"
    r = httpx.post(f"{cluster.router_url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": ids, "max_tokens": 2})
    assert (r.status_code, r.json()["error"]["message"]) == (400, TOKEN_IDS)
    # what the message offers works: /generate with input_ids through the router, a replica
    g = httpx.post(f"{cluster.router_url}/generate", timeout=60,
                   json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
    d = httpx.post(f"{cluster.replicas[0].url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": ids, "max_tokens": 2})
    assert (g.status_code, g.json()["meta_info"]["prompt_tokens"]) == (200, len(ids))
    assert (d.status_code, d.json()["usage"]["prompt_tokens"]) == (200, len(ids))


def test_a_killed_replica_is_restarted_and_the_router_told(cluster: Cluster,
                                                            fleet: Fleet) -> None:
    backend, url = cluster.router_backend_url, cluster.replicas[1].url
    worker = (router_workers(backend) or {})[url]
    assert wait_for(lambda: fleet.up(0) and fleet.up(1), timeout=10)  # heartbeats seen
    cluster.kill(1)
    assert wait_for(lambda: not fleet.up(1), timeout=10)  # the screen marks it down
    assert fleet.up(0)
    # was: nothing restarted it ("0/2 replicas up" after a request killed both, 20 s on)
    assert wait_for(lambda: cluster.replica_states()[1] == ReplicaState(1, True, 1, ""),
                    timeout=60)
    assert cluster.replica_states()[0] == ReplicaState(0, True, 0, "")
    assert wait_for(lambda: fleet.up(1) and fleet.subscribers[1].synced.is_set(), timeout=10)
    assert fleet.subscribers[1].stats.epochs == 1  # a new engine: resynced from its snapshot
    # the router was told: removed while it was down, added back once it answered (a new id)
    assert wait_for(lambda: url in (router_workers(backend) or {}), timeout=10)
    assert (router_workers(backend) or {})[url] != worker
    assert wait_for(lambda: cluster.router_state().out_of_rotation == (), timeout=10)
    client = openai.OpenAI(base_url=f"{cluster.router_url}/v1", api_key="unused")
    for i in range(6):  # routed to again (round robin; the router health-checks it first)
        complete(client, f"again {i}")
        if wait_for(lambda: finished(cluster, (1,)) == [1], timeout=2):
            break
    assert finished(cluster, (1,)) == [1]
    fleet.settle()  # both mirrors equal their engines' trees
    s0 = fleet.subscribers[0].stats
    assert (s0.epochs, s0.snapshots) == (0, 1)  # replica 0's view was never disturbed


def test_the_screen_says_when_the_router_was_killed_and_restarted(cluster: Cluster,
                                                                  fleet: Fleet) -> None:
    cluster.kill_router()
    assert not cluster.router_alive()
    assert wait_for(lambda: cluster.router_state().restarts == 1, timeout=60)

    async def run() -> tuple[str, list[str]]:
        app = ClusterApp(StreamFleet(fleet), cluster.router_url, cluster, words=Vocabulary())
        async with app.run_test() as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.router_up is not None:
                    break
            app.refresh_views()
            table = app.query_one(DataTable)
            return app.header_text().plain, [str(table.get_row_at(r)[-1]) for r in (0, 1)]

    import asyncio

    header, restarts = asyncio.run(run())
    assert f"router {cluster.router_url} ● up · restarted 1x" in header
    assert restarts == ["0", "1"]  # the restarts column: replica 1 was restarted once


def test_cluster_command_without_router_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    r = CliRunner().invoke(app, ["cluster", "--replicas", "1"])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: sglang-router is not installed: pip install 'radixcache[cluster]'"]


def test_router_port_taken_is_one_line_and_nothing_left_running() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        c = Cluster(ClusterConfig(replicas=1, router_port=port))
        with pytest.raises(ClusterError, match=f"^port {port} on 127.0.0.1 is taken$"):
            c.start()
    assert c._procs == {}


def test_the_router_is_found_beside_the_interpreter_off_path(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv, other = tmp_path / "venv" / "bin", tmp_path / "other"
    venv.mkdir(parents=True)
    other.mkdir()
    monkeypatch.setattr(sys, "executable", str(venv / "python3"))
    monkeypatch.setenv("PATH", str(other))
    assert router_exe() is None
    (other / ROUTER_EXE).write_text("#!/bin/sh\n")
    (other / ROUTER_EXE).chmod(0o755)
    assert router_exe() == str(other / ROUTER_EXE)  # on PATH
    # was: "sglang-router is not installed" when the venv's python ran without its bin on PATH
    (venv / ROUTER_EXE).write_text("#!/bin/sh\n")
    (venv / ROUTER_EXE).chmod(0o755)
    assert router_exe() == str(venv / ROUTER_EXE)  # beside the interpreter, before PATH


def test_no_router_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    with pytest.raises(ClusterError, match=r"^sglang-router is not installed: pip install "
                                           r"'radixcache\[cluster\]'$"):
        Cluster(ClusterConfig(replicas=1)).start()
