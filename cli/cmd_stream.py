"""`radixcache serve | keys` (record, export: cmd_recordings; tree: cmd_tree; bench events:
cmd_bench_events)."""

from __future__ import annotations

import ipaddress
import re
import signal
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import typer
import zmq
from rich.console import Console

from cli.app import RUN, app
from cli.bounds import MAX_BLOCKS, MAX_THREADS, WEEK_S
from cli.options import (
    CURVE_HELP,
    DTYPE_HELP,
    KV_MEMORY_HELP,
    MODEL_HELP,
    RESERVE_HELP,
    SCHEDULE_HELP,
    AnswerMode,
    ModelSize,
    ReserveRule,
    checked_engine,
)
from radixcache.serving.policy import SchedulePolicy
from radixcache.wire.endpoints import LOOPBACK_HOSTS, BindPolicy, EndpointError, Endpoints
from radixcache.wire.security import CurveError, create_keys

if TYPE_CHECKING:  # these import torch (seconds): the commands import them when they run
    from radixcache.serving.engine import Engine
    from radixcache.serving.front_process import FrontProcess
    from radixcache.serving.http import HttpFront
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


class HttpAt(NamedTuple):
    """Where ``--http`` serves: ``host`` None means ``--endpoint-host``'s."""

    host: str | None
    port: int


_HTTP_FORMS = (re.compile(r"(?P<port>\d+)"), re.compile(r"\[(?P<host>[^\]]+)\]:(?P<port>\d+)"),
               re.compile(r"(?P<host>[^:\[\]]+):(?P<port>\d+)"))


def http_at(value: str) -> HttpAt:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` (what ``--http`` takes); ``typer.BadParameter``
    for anything else, a port outside 0-65535 or a bracketed host that is not IPv6."""
    for form in _HTTP_FORMS:
        if (m := form.fullmatch(value.strip())) is not None:
            break
    else:
        raise typer.BadParameter(f"expected PORT, HOST:PORT or [IPv6]:PORT, got {value!r}")
    port = int(m["port"])
    if port > 65535:
        raise typer.BadParameter(f"port {port} is outside 0-65535")
    host = m.groupdict().get("host")
    if host is not None and value.strip().startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise typer.BadParameter(f"{host!r} in brackets is not an IPv6 address") from None
    return HttpAt(host, port)


def _check_http(value: str | None) -> str | None:
    """``--http``'s callback: refused before any work (exit 2) unless ``http_at`` reads it."""
    if value is not None:
        http_at(value)
    return value


def _endpoints(port: int, host: str, ipc: str | None) -> Endpoints:
    return Endpoints.ipc(ipc) if ipc else Endpoints.tcp(host, port)


@app.command()
def serve(
    ctx: typer.Context,
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
    schedule: SchedulePolicy = typer.Option(SchedulePolicy.FCFS, help=SCHEDULE_HELP),
    step_tokens: int = typer.Option(256, min=16, max=1 << 20,
                                     help="Tokens per step (the prefill chunk budget): lower "
                                     "bounds inter-token latency behind long prompts, higher "
                                     "batches more (see `bench serve --step-tokens`)."),
    reserve: ReserveRule = typer.Option(ReserveRule.GROW, help=RESERVE_HELP),
    digest_every: int = typer.Option(64, min=0,
                                      help="A Digest event every N batches (0: none)."),
    curve_keys: Path | None = typer.Option(None, help=CURVE_HELP + " Every socket bound is a "
                                           "CURVE server accepting only client keys in DIR."),
    http: str | None = typer.Option(None, metavar="[HOST:]PORT", callback=_check_http,
                                    help="Also serve OpenAI/SGLang HTTP on HOST:PORT, "
                                    "[IPv6]:PORT or PORT (on --endpoint-host; needs "
                                    "radixcache\\[http]). A host beyond loopback needs "
                                    "--allow-remote."),
    drain_s: float = typer.Option(30.0, min=0.0, max=WEEK_S,
                                  help="With --http: on SIGTERM or Ctrl-C, stop admitting and "
                                  "give the requests in flight this long to finish (a second "
                                  "signal cuts it short; as uvicorn's and vLLM's grace)."),
    front_process: bool = typer.Option(True, "--front-process/--front-thread",
                                       help="With --http: run the HTTP front (parsing, "
                                       "tokenizing, streaming) in a process of its own, "
                                       "joined to the engine over ZeroMQ (ipc://), so its "
                                       "Python never holds the step loop's interpreter lock; "
                                       "--front-thread runs it in a thread of this process."),
) -> None:
    """Run the engine (model, radix cache, scheduler) in this process; serve its event stream,
    snapshots/replays and commands over ZeroMQ until SIGTERM or Ctrl-C.

    With --http, SIGTERM or Ctrl-C drains the HTTP front first (see --drain-s)."""
    from cli.cmd_cluster import start_http
    from radixcache.serving.engine import Answers
    from radixcache.serving.loop import DEFAULT_PROGRAM, LoopConfig
    from radixcache.serving.server import ServerConfig

    at = _http_host(http, endpoint_host, allow_remote)
    source = ctx.get_parameter_source("front_process")  # (typer's own copy of click's enum)
    given = source is not None and source.name == "COMMANDLINE"
    if front_process and given and at is None:
        typer.echo("error: --front-process needs --http (it runs the HTTP front)", err=True)
        raise typer.Exit(2)
    engine = checked_engine(model, blocks, device, threads, Answers(answers.value), schedule,
                            dtype=dtype, kv_memory=kv_memory, step_tokens=step_tokens,
                            reserve=reserve)
    config = ServerConfig(LoopConfig(digest_every, program=DEFAULT_PROGRAM if loop else ()),
                          block_size=16, num_blocks=engine.config.num_blocks)
    server = _bind(engine, config, _endpoints(port, endpoint_host, ipc), allow_remote,
                   _kv_endpoints(kv_events, endpoint_host, port), curve_keys)
    stop, again = _stop_on_signals()  # before anything answers: a SIGTERM from then drains
    server.start()
    front = None if at is None else start_http(server, *at, front_process=front_process)
    _serve_until_stopped(server, front, str(engine.model.device), workload, workload_args,
                         drain_s, stop, again)


def _http_host(http: str | None, endpoint_host: str,
               allow_remote: bool) -> tuple[str, int] | None:
    """Where ``--http`` serves (its host, else ``--endpoint-host``); a host beyond loopback
    without --allow-remote exits 2 in one line before any work, as the ZeroMQ endpoints."""
    if http is None:
        return None
    at = http_at(http)
    host = at.host or endpoint_host
    if host not in LOOPBACK_HOSTS and not allow_remote:
        typer.echo(f"error: refusing to bind HTTP {host}:{at.port}: only loopback unless "
                   "explicitly allowed (pass --allow-remote to bind a non-loopback address)",
                   err=True)
        raise typer.Exit(2)
    return host, at.port


def _drain(front: HttpFront | FrontProcess, server: Server, drain_s: float,
           again: threading.Event) -> None:
    """Stop admitting HTTP requests, let the ones in flight finish (``HttpFront``'s drain),
    saying so on stderr in one line at each end."""
    n = front.stop_admitting()
    err_console.print(f"draining: {n} HTTP requests in flight, grace {drain_s:g} s (SIGTERM "
                      "or Ctrl-C again cuts it short)", highlight=False)
    d = front.finish_drain(drain_s, lambda: again.is_set() or server.fault is not None)
    if d.reason is None:
        err_console.print(f"drained: every request answered ({d.in_flight} in flight)",
                          highlight=False)
    else:
        err_console.print(f"drain cut short: {d.cut} requests answered 503 ({d.reason})",
                          highlight=False)


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


def _stop_on_signals() -> tuple[threading.Event, threading.Event]:
    """SIGTERM and Ctrl-C set the first event, a second one the second (installed before
    the server starts: a front answers /health as soon as it serves, and a signal sent from
    then must drain, not kill)."""
    stop, again = threading.Event(), threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        (again if stop.is_set() else stop).set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop, again


def _serve_until_stopped(server: Server, front: HttpFront | FrontProcess | None, device: str,
                         workload: str | None, args: str, drain_s: float,
                         stop: threading.Event, again: threading.Event) -> None:
    """Serve until ``stop`` (SIGTERM/Ctrl-C, ``_stop_on_signals``: then drain the HTTP front,
    ``_drain``), or until a worker thread dies: then the fault goes to stderr and the exit
    status is 1."""
    ep = server.publisher.endpoints
    console.print(f"serving epoch {server.publisher.epoch} on {device}: "
                  f"events {ep.events}  snapshot/replay {ep.control}  commands {ep.commands}",
                  highlight=False)
    if server.kv is not None:
        console.print(f"vLLM KV events {server.kv.endpoints[0]}  replay {server.kv.endpoints[1]}")
    if workload:
        console.print(server.loop.command_line(f"{workload} {args}"), highlight=False)
    while not stop.wait(0.2) and server.fault is None \
            and (front is None or front.fault is None):
        pass
    fault = server.fault or (front.fault if front is not None else None)
    if front is not None:
        if fault is None:
            _drain(front, server, drain_s, again)
        else:
            front.close()
    server.close()
    fault = fault or server.fault
    if fault is not None:
        err_console.print(f"error: {fault.line()}", highlight=False)
        raise typer.Exit(1)
