"""`radixcache serve | keys` (record, export: cmd_recordings; tree: cmd_tree; bench events:
cmd_bench_events)."""

from __future__ import annotations

import signal
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import zmq
from rich.console import Console

from cli.app import RUN, app
from cli.bounds import MAX_BLOCKS, MAX_THREADS
from cli.options import (
    CURVE_HELP,
    DTYPE_HELP,
    KV_MEMORY_HELP,
    MODEL_HELP,
    SCHEDULE_HELP,
    AnswerMode,
    ModelSize,
    checked_engine,
)
from radixcache.serving.policy import Policy
from radixcache.wire.endpoints import BindPolicy, EndpointError, Endpoints
from radixcache.wire.security import CurveError, create_keys

if TYPE_CHECKING:  # these import torch (seconds): the commands import them when they run
    from radixcache.serving.engine import Engine
    from radixcache.serving.server import Server, ServerConfig

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # an error stays one line


@app.command(rich_help_panel=RUN)  # next to serve (cli/app.py PANELS does not list it)
def keys(
    directory: Path = typer.Argument(..., help="Directory to create the keys in."),
) -> None:
    """Write a CURVE server keypair and a client keypair (server.key, server.key_secret,
    client.key, client.key_secret; secrets mode 0600) for `serve --curve-keys DIR`. Copy
    server.key, client.key and client.key_secret to the machines that connect.

    Example: radixcache keys ~/.radixcache/keys
    """
    try:
        files = create_keys(directory)
    except CurveError as exc:  # one line on stderr (was: stdout, wrapped at 80 columns)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for path in files:
        console.print(f"wrote {path}", highlight=False)


def _endpoints(port: int, host: str, ipc: str | None) -> Endpoints:
    return Endpoints.ipc(ipc) if ipc else Endpoints.tcp(host, port)


@app.command()
def serve(
    port: int = typer.Option(5557, help="Events on P, snapshot/replay on P+1, commands on P+2."),
    endpoint_host: str = typer.Option("127.0.0.1", help="Host to bind (loopback by default)."),
    ipc: str | None = typer.Option(None, help="Bind ipc://IPC-events/-control/-commands instead."),
    allow_remote: bool = typer.Option(False, help="Allow binding a non-loopback address."),
    workload: str | None = typer.Option(None, help="Start this workload at once (e.g. chat)."),
    workload_args: str = typer.Option("", help="Its arguments, e.g. \"20 --seed 7\"."),
    loop: bool = typer.Option(False, help="Whenever idle, inject the next of a mixed workload "
                                          "(chat, system, tot, fork, flood) so the tree keeps "
                                          "changing and evicting."),
    kv_events: str | None = typer.Option(None, help="'vllm': also publish vLLM KV events on "
                                                    "P+3 (replay P+4)."),
    blocks: int = typer.Option(2048, min=16, max=MAX_BLOCKS,
                                help="KV pool blocks of 16 tokens (2048: --loop evicts "
                                          "within a minute on a CPU)."),
    model: str = typer.Option(ModelSize.TINY.value, help=MODEL_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_memory: str | None = typer.Option(None, help=KV_MEMORY_HELP),
    answers: AnswerMode = typer.Option(AnswerMode.DECODE, help="decode forced answers token by "
                                       "token, or fold them into the prefill."),
    device: str | None = typer.Option(None, help="torch device (default: cuda when present)."),
    threads: int = typer.Option(1, min=1, max=MAX_THREADS,
                                 help="torch CPU threads (1 is fastest for the tiny model)."),
    schedule: Policy = typer.Option(Policy.FCFS, help=SCHEDULE_HELP),
    digest_every: int = typer.Option(64, min=0,
                                      help="A Digest event every N batches (0: none)."),
    curve_keys: Path | None = typer.Option(None, help=CURVE_HELP + " Every socket bound is a "
                                           "CURVE server accepting only client keys in DIR."),
    http: int | None = typer.Option(None, min=0, max=65535,
                                    help="Also serve OpenAI/SGLang HTTP on this port "
                                    "(on --endpoint-host; needs radixcache\\[http])."),
) -> None:
    """Run the engine (model, radix cache, scheduler) in this process; serve its event stream,
    snapshots/replays and commands over ZeroMQ until SIGTERM or Ctrl-C."""
    from radixcache.serving.engine import Answers
    from radixcache.serving.loop import DEFAULT_PROGRAM, LoopConfig
    from radixcache.serving.server import ServerConfig

    engine = checked_engine(model, blocks, device, threads, Answers(answers.value), schedule,
                            dtype=dtype, kv_memory=kv_memory)
    config = ServerConfig(LoopConfig(digest_every, program=DEFAULT_PROGRAM if loop else ()),
                          block_size=16, num_blocks=engine.config.num_blocks)
    server = _bind(engine, config, _endpoints(port, endpoint_host, ipc), allow_remote,
                   _kv_endpoints(kv_events, endpoint_host, port), curve_keys)
    _serve_until_stopped(server, str(engine.model.device), workload, workload_args,
                         (endpoint_host, http))


def _kv_endpoints(kv_events: str | None, host: str, port: int) -> tuple[str, str] | None:
    """``--kv-events vllm``: the vLLM-format publisher on P+3, its replay on P+4."""
    if kv_events is None:
        return None
    if kv_events != "vllm":
        raise typer.BadParameter("only 'vllm' is supported", param_hint="--kv-events")
    return f"tcp://{host}:{port + 3}", f"tcp://{host}:{port + 4}"


def _bind(engine: Engine, config: ServerConfig, endpoints: Endpoints, allow_remote: bool,
          kv: tuple[str, str] | None, curve_keys: Path | None) -> Server:
    """The server bound on ``endpoints`` (and ``kv``); a refused bind or bad keys exit 2
    with the reason; warnings are printed."""
    from radixcache.serving.server import Server

    policy = BindPolicy.ANY if allow_remote else BindPolicy.LOCAL_ONLY
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            server = Server(engine, endpoints, config, policy=policy, kv_endpoints=kv,
                            curve_keys=curve_keys)
        except (CurveError, EndpointError, zmq.ZMQError) as exc:
            # one line on stderr (was: stdout, wrapped at 80 columns, and the --allow-remote
            # hint on a port already in use too)
            hint = (" (pass --allow-remote to bind a non-loopback address)"
                    if isinstance(exc, EndpointError) and not allow_remote else "")
            what = "cannot bind: " if isinstance(exc, zmq.ZMQError) else ""
            typer.echo(f"error: {what}{exc}{hint}", err=True)
            raise typer.Exit(2) from None
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    return server


def _serve_until_stopped(server: Server, device: str, workload: str | None, args: str,
                         http: tuple[str, int | None] = ("127.0.0.1", None)) -> None:
    """Serve until SIGTERM/Ctrl-C, or until a worker thread dies: then the fault goes to
    stderr and the exit status is 1."""
    from cli.cmd_cluster import start_http

    server.start()
    front = start_http(server, *http)
    ep = server.publisher.endpoints
    console.print(f"serving epoch {server.publisher.epoch} on {device}: "
                  f"events {ep.events}  snapshot/replay {ep.control}  commands {ep.commands}",
                  highlight=False)
    if server.kv is not None:
        console.print(f"vLLM KV events {server.kv.endpoints[0]}  replay {server.kv.endpoints[1]}")
    if workload:
        console.print(server.loop.command_line(f"{workload} {args}"), highlight=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.2) and server.fault is None \
                and (front is None or front.fault is None):
            pass
    except KeyboardInterrupt:
        pass
    fault = server.fault or (front.fault if front is not None else None)
    if front is not None:
        front.close()
    server.close()
    if fault is not None:
        err_console.print(f"error: {fault.line()}", highlight=False)
        raise typer.Exit(1)
