"""`radixcache serve | keys` and `radixcache bench events` (record, tree, export: see
cmd_recordings)."""

from __future__ import annotations

import enum
import json
import shlex
import signal
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import zmq
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.app import RUN, app, bench_app
from radixcache.traffic.workloads import WORKLOADS, Workload, build_workload
from radixcache.wire.endpoints import BindPolicy, EndpointError, Endpoints
from radixcache.wire.security import ClientCurve, CurveError, create_keys

if TYPE_CHECKING:  # these import torch (seconds): the commands import them when they run
    from radixcache.serving.engine import Answers, Engine, EngineConfig
    from radixcache.serving.server import Server, ServerConfig
    from radixcache.tools.bench_events import BenchResult

console = Console()
err_console = Console(stderr=True)


CURVE_HELP = ("A key directory from `radixcache keys DIR`: CURVE-encrypt and authenticate "
              "(for non-loopback use).")


def _client_curve(directory: Path | None) -> ClientCurve | None:
    """The client keys of ``directory`` (None: plain); a clear error and exit 2 if unusable."""
    if directory is None:
        return None
    try:
        return ClientCurve.load(directory)
    except CurveError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


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
    except CurveError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    for path in files:
        console.print(f"wrote {path}", highlight=False)


def _endpoints(port: int, host: str, ipc: str | None) -> Endpoints:
    return Endpoints.ipc(ipc) if ipc else Endpoints.tcp(host, port)


class ModelSize(enum.StrEnum):
    """Which model the engine runs."""

    TINY = "tiny"
    DEFAULT = "default"


class AnswerMode(enum.StrEnum):
    """How forced answers are computed: the values of ``radixcache.serving.server.Answers`` (which
    imports torch, so it is imported only when a command runs)."""

    DECODE = "decode"
    PREFILL = "prefill"


def _engine_config(model: ModelSize, blocks: int, device: str | None,
                   threads: int, answers: Answers) -> EngineConfig:
    import torch

    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.model import ModelConfig, tiny_model

    torch.set_num_threads(threads)
    mc = tiny_model() if model is ModelSize.TINY else ModelConfig()
    return EngineConfig(num_blocks=blocks, model=mc, device=device, answers=answers)


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
    blocks: int = typer.Option(2048, help="KV pool blocks of 16 tokens (2048: --loop evicts "
                                          "within a minute on a CPU)."),
    model: ModelSize = typer.Option(ModelSize.TINY, help="tiny: 1 layer, d_model 32 (fast on a "
                                                         "CPU); default: the 2-layer model."),
    answers: AnswerMode = typer.Option(AnswerMode.DECODE, help="decode forced answers token by "
                                       "token, or fold them into the prefill."),
    device: str | None = typer.Option(None, help="torch device (default: cuda when present)."),
    threads: int = typer.Option(1, help="torch CPU threads (1 is fastest for the tiny model)."),
    digest_every: int = typer.Option(64, help="A Digest event every N batches (0: none)."),
    curve_keys: Path | None = typer.Option(None, help=CURVE_HELP + " Every socket bound is a "
                                           "CURVE server accepting only client keys in DIR."),
    http: int | None = typer.Option(None, help="Also serve OpenAI/SGLang HTTP on this port "
                                    "(on --endpoint-host; needs radixcache[http])."),
) -> None:
    """Run the engine (model, radix cache, scheduler) in this process; serve its event stream,
    snapshots/replays and commands over ZeroMQ until SIGTERM or Ctrl-C."""
    from radixcache.serving.engine import Answers, Engine
    from radixcache.serving.loop import DEFAULT_PROGRAM, LoopConfig
    from radixcache.serving.server import ServerConfig

    engine = Engine(_engine_config(model, blocks, device, threads, Answers(answers.value)))
    config = ServerConfig(LoopConfig(digest_every, program=DEFAULT_PROGRAM if loop else ()),
                          block_size=16, num_blocks=blocks)
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
        except CurveError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
        except (EndpointError, zmq.ZMQError) as exc:
            console.print(f"[red]{exc}[/] (pass --allow-remote to bind a non-loopback address)")
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


_SIZE_PARAM = {"chat": "conversations", "system": "users", "flood": "requests"}


def _sized_workload(name: str, args: str, requests: int) -> Workload:
    """``name`` built from ``args``, or (no args) sized to hold at least ``requests``."""
    if args or name not in _SIZE_PARAM:
        return build_workload(name, shlex.split(args))
    high = next(p.high for p in WORKLOADS[name].params if p.name == _SIZE_PARAM[name])
    return build_workload(name, {_SIZE_PARAM[name]: min(requests, high)})


@bench_app.command("events")
def bench_events(
    requests: int = typer.Option(20_000, help="Requests the tree driver runs."),
    per_step: int = typer.Option(16, help="Requests per engine step (batch)."),
    late_join_nodes: int = typer.Option(100_000, help="Tree size for the late-join test."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    drop: float = typer.Option(0.0, help="With --verify-every-batch: the fraction of batches "
                                         "the subscriber drops (deterministic hash of the seq)."),
    verify_every_batch: bool = typer.Option(False, help="Instead of the figures above: publish "
                                            "until --min-events, drop --drop of the batches at "
                                            "the subscriber, and compare the mirror digest with "
                                            "the tree's after every applied batch."),
    min_events: int = typer.Option(1_000_000, help="With --verify-every-batch: events to run."),
    publishers: int = typer.Option(1, min=1, max=64, help="Instead of the figures above: N "
                                   "engine streams followed by one process (fan-in)."),
) -> None:
    """Events/s from a tree driver to a mirror in another process, and what publishing costs.

    Measures the stream, not the model: the driver runs chat requests (prompt + forced
    answer) through the radix tree with no model (``TreeSource``), as fast as the tree goes.

    Example: radixcache bench events --drop 0.01 --verify-every-batch --json"""
    from radixcache.tools.bench_events import run_bench, verify_drops  # torch: imported here
    from radixcache.tools.bench_hostile import hostile_rows, run_hostile

    if publishers > 1:
        _bench_fanin(publishers, as_json)
        return
    if verify_every_batch:
        checked = verify_drops(min_events, drop, per_step)
        if as_json:
            typer.echo(json.dumps(checked._asdict()))
        else:
            console.print(checked)
        if checked.batches_digest_equal != checked.batches_checked:
            raise typer.Exit(1)
        return
    with Progress(console=console, disable=as_json, transient=True) as progress:
        result = run_bench(requests, per_step, late_join_nodes, progress)
        progress.add_task("hostile peer: a clean run, then a hostile one", total=None)
        hostile = run_hostile()
    if as_json:
        typer.echo(json.dumps({**result._asdict(), "hostile": hostile._asdict()}))
    else:
        table = _bench_table(result)
        for row in hostile_rows(hostile):
            table.add_row(*row)
        console.print(table)


def _bench_table(r: BenchResult) -> Table:
    t = Table(title="bench events")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("events", f"{r.events:,}"),
        ("events/s engine -> mirror (other process)", f"{r.events_per_s:,.0f}"),
        ("lost / recovered by replay", f"{r.lost} / {r.recovered}"),
        ("digest equal at the end", str(r.digest_equal)),
        ("publishing / tree-op time", f"{r.publish_overhead:.1%}"),
        ("events on vs off (tree + publish)", f"{r.events_overhead:+.1%}"),
        ("tree driver events/s", f"{r.driver_events_per_s:,.0f}"),
        (f"late join of {r.late_join_nodes:,} nodes", f"{r.late_join_seconds:.3f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _bench_fanin(publishers: int, as_json: bool) -> None:
    from radixcache.tools.bench_fanin import run_fanin

    with Progress(console=console, disable=as_json, transient=True) as progress:
        task = progress.add_task("fan-in", total=None)
        r = run_fanin(publishers, progress=lambda what: progress.update(task, description=what))
    if as_json:
        typer.echo(json.dumps(r._asdict()))
        return
    t = Table(title=f"bench events: {publishers} streams into one process")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in (("events (all streams)", f"{r.events:,}"),
                 ("events/s arriving in total", f"{r.events_per_s:,.0f}"),
                 ("batches lost", str(r.lost)),
                 ("mirrors with the engine's digest", f"{r.digests_equal} of {r.publishers}"),
                 ("resyncs", str(r.resyncs)), ("seconds", f"{r.seconds:.2f}")):
        t.add_row(k, v)
    console.print(t)
