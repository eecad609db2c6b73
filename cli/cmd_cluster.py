"""``radixcache cluster``, ``radixcache load`` and ``radixcache bench cluster``; and the HTTP
front that ``serve --http`` starts beside the engine server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.console import Console

from cli.app import app, bench_app

if TYPE_CHECKING:
    from radixcache.serving.http import HttpFront
    from radixcache.serving.server import EngineServer

console = Console()
err_console = Console(stderr=True)
HTTP_HINT = "pip install 'radixcache[http]'"


def start_http(server: EngineServer, host: str, port: int | None) -> HttpFront | None:
    """An HTTP front over ``server``'s engine on ``host:port`` (None when ``port`` is None).
    Exits 2 with one line when the HTTP extra is missing or the port cannot be bound."""
    if port is None:
        return None
    try:
        from radixcache.serving.http import EngineBackend, HttpFront
    except ImportError as exc:
        server.close()
        err_console.print(f"error: --http needs {exc.name}: {HTTP_HINT}", highlight=False)
        raise typer.Exit(2) from None
    try:
        front = HttpFront(EngineBackend(server.engine, server.wake), host, port)
    except OSError as exc:
        server.close()
        err_console.print(f"error: cannot bind HTTP {host}:{port}: {exc.strerror}",
                          highlight=False)
        raise typer.Exit(2) from None
    front.start()
    console.print(f"HTTP (OpenAI, SGLang) {front.url}", highlight=False)
    return front
