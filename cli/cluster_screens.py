"""The cluster screen as the CLI opens it: over replicas' event streams (``cluster``,
``inspect EP1 EP2 ...``) or over a deployment's KV-event publishers (``inspect --kv-events
EP1 --kv-events EP2 ...``); Enter on a replica opens its own screen, q there comes back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from inspector.cluster import ClusterControls, FleetView
    from radixcache.wire.fleet import Fleet
    from radixcache.wire.security import ClientCurve


def run_cluster_screen(view: FleetView, router_url: str | None,
                       controls: ClusterControls | None,
                       open_replica: Callable[[int], None]) -> None:
    """The cluster screen until q; Enter on a replica runs ``open_replica(rank)`` (its full
    screen), whose q comes back here."""
    from inspector.cluster import ClusterApp

    while True:
        rank = ClusterApp(view, router_url, controls).run()
        if rank is None:
            return
        open_replica(rank)


def streams_screen(fleet: Fleet, router_url: str | None,
                    controls: ClusterControls | None = None) -> None:
    from inspector.app import InspectorApp
    from inspector.cluster import StreamFleet
    from inspector.live import LiveSource

    def open_replica(rank: int) -> None:
        InspectorApp(LiveSource(fleet.endpoints[rank].events, curve=fleet.curve)).run()

    run_cluster_screen(StreamFleet(fleet), router_url, controls, open_replica)


def inspect_many(endpoints: list[str], curve: ClientCurve | None = None) -> None:
    """``radixcache inspect EP1 EP2 ...``: the cluster screen over any set of engines (with
    ``curve``, every socket, a replica's own screen's included, uses those keys)."""
    from radixcache.wire.endpoints import Endpoints
    from radixcache.wire.fleet import Fleet

    fleet = Fleet([Endpoints.from_events(e) for e in endpoints], curve).start()
    try:
        streams_screen(fleet, None)
    finally:
        fleet.close()


def inspect_kv_many(endpoints: list[str], replays: list[str]) -> None:
    """``radixcache inspect --kv-events EP1 --kv-events EP2 ...`` (``--replay`` once per
    endpoint, or not at all): the cluster screen over a vLLM/SGLang deployment's ranks."""
    from inspector.kv_fleet import KVFleet
    from inspector.kv_view import KVEventsApp
    from radixcache.traffic.workloads import Vocabulary

    try:
        kv = KVFleet(endpoints, replays)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--replay") from None
    kv.start()

    def open_replica(rank: int) -> None:
        KVEventsApp(kv.endpoints[rank], kv.replays[rank], vocab=Vocabulary()).run()

    try:
        run_cluster_screen(kv, None, None, open_replica)
    finally:
        kv.close()
