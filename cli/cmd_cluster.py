"""``radixcache cluster``, ``radixcache load`` and ``radixcache bench cluster``; and the HTTP
front that ``serve --http`` starts beside the engine server."""

from __future__ import annotations

import enum
import json
import shlex
from functools import partial
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cli.app import RUN, CliError, app, bench_app
from cli.bounds import MAX_BLOCKS
from cli.cluster_screens import streams_screen
from cli.options import (
    DTYPE_HELP,
    KV_MEMORY_HELP,
    MODEL_HELP,
    SCHEDULE_HELP,
    ModelSize,
    check_kv_memory,
    kv_memory_args,
    model_args,
)
from radixcache.serving.cluster import RoutePolicy  # stdlib only: cheap at start-up
from radixcache.serving.policy import SchedulePolicy
from radixcache.wire.endpoints import LOOPBACK_HOSTS

if TYPE_CHECKING:

    from radixcache.serving.front_process import FrontProcess
    from radixcache.serving.http import HttpFront
    from radixcache.serving.server import Server
    from radixcache.tools.bench_cluster import BenchClusterConfig, RouteFigures
    from radixcache.tools.cluster_faults import FaultFigures
    from radixcache.traffic.workload_types import Workload

console = Console()
err_console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)  # one line each
HTTP_HINT = "pip install 'radixcache[http]'"
CLUSTER_HINT = "pip install 'radixcache[cluster]'"


def _need_cluster_extra() -> None:
    """Exit 2 with one line when the cluster extra's client libraries are missing."""
    import importlib.util

    for module in ("httpx", "aiohttp", "starlette", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            err_console.print(f"error: this command needs {module}: {CLUSTER_HINT}", markup=False,
                              highlight=False)
            raise typer.Exit(2)


def start_http(server: Server, host: str, port: int | None, *,
               front_process: bool = False) -> HttpFront | FrontProcess | None:
    """An HTTP front over ``server``'s engine on ``host:port`` (None when ``port`` is None),
    in this process or, with ``front_process``, in a child (``serving.front_process``).
    Exits 2 with one line (and closes ``server``) when the HTTP extra is missing, the
    port cannot be bound, or the server's service is not an engine."""
    if port is None:
        return None
    from radixcache.serving.engine import Engine

    if not isinstance(server.service, Engine):
        server.close()
        err_console.print("error: --http needs the engine (a model), not a model-free tree")
        raise typer.Exit(2)
    if server.service.config.checkpoint is not None and server.service.text is None:
        server.close()
        err_console.print("error: --http with --model needs the folder's tokenizer.json")
        raise typer.Exit(2)
    try:
        from radixcache.serving.http import EngineBackend, HttpFront
    except ImportError as exc:
        server.close()
        err_console.print(f"error: --http needs {exc.name}: {HTTP_HINT}", highlight=False,
                          markup=False)
        raise typer.Exit(2) from None
    try:
        engine, backend = server.service, EngineBackend(server.service, server.loop)
        front: HttpFront | FrontProcess
        if front_process:
            from radixcache.serving.front_process import FrontProcess

            front = FrontProcess(server, engine, host, port)
        else:
            front = (HttpFront(backend, host, port) if engine.text is None else  # a folder:
                     HttpFront(backend, host, port, model=engine.model.name,  # its name,
                               tokenizer=engine.text, eos_ids=engine.model.eos_ids))  # eos
    except (OSError, ValueError) as exc:
        server.close()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        err_console.print(f"error: cannot bind HTTP {host}:{port}: {why}", highlight=False)
        raise typer.Exit(2) from None
    try:
        front.start()
    except RuntimeError as exc:  # the front's process did not start
        server.close()
        err_console.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"HTTP (OpenAI, SGLang) {front.url}", highlight=False)
    if host not in LOOPBACK_HOSTS:
        console.print(f"[yellow]warning:[/] the HTTP API (OpenAI, SGLang, admin endpoints "
                      f"such as /flush_cache) on {front.url} is reachable from other machines "
                      "and is not authenticated")
    return front


def _progress() -> Progress:
    return Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


@app.command(rich_help_panel=RUN)
def load(
    url: str = typer.Option(..., help="An OpenAI-compatible server or router, e.g. "
                                      "http://127.0.0.1:8000"),
    workload: str = typer.Option("chat", help="Workload name (chat, system, tot, fork, flood)."),
    workload_args: str = typer.Option("", help="Its arguments, e.g. \"40 --seed 7\"."),
    trace: str = typer.Option(None, "--trace", metavar="FILE",
                              help="Replay a Mooncake-format JSONL (at its timestamps) or a "
                                   "ShareGPT .json (at --rate) instead of a workload."),
    limit: int = typer.Option(1000, "--limit", min=1, max=1_000_000,
                              help="With --trace: its first N requests."),
    hash_block_size: int = typer.Option(512, "--hash-block-size", min=1, max=65536,
                                        help="With a Mooncake-format --trace: tokens per "
                                             "hash id (as whatif --hash-block-size)."),
    rate: float = typer.Option(None, min=0.01, help="Requests per second (Poisson arrivals, "
                               "open loop; default 10, or a trace's own timestamps)."),
    max_tokens: int = typer.Option(16, min=1, max=1 << 20, help="Answer length cap per request."),
    model: str = typer.Option("radixcache-tiny", help="The model name sent."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Send a workload to URL over HTTP as text (next turns carry the real answers); print
    TTFT, throughput and the cached share of prompt tokens.

    Example: [bold]radixcache load --url http://127.0.0.1:8000 --workload chat --rate 20[/bold]
    A trace: [bold]radixcache load --url http://127.0.0.1:8000 --trace mooncake.jsonl[/bold]
    """
    _need_cluster_extra()
    from radixcache.traffic.load import LoadConfig
    from radixcache.traffic.load import load as run

    if (rate is not None and rate <= 0) or max_tokens < 1:
        raise typer.BadParameter("--rate must be > 0 and --max-tokens >= 1")
    w, times = _load_source(workload, workload_args, trace, limit, hash_block_size, max_tokens)
    if times is None and rate is None:
        rate = 10.0
        if trace is not None:
            raise typer.BadParameter(f"{trace} has no timestamps: give --rate",
                                     param_hint="--rate")
    with _progress() as bar:
        task = bar.add_task(f"{trace or workload} -> {url}", total=len(w.requests))
        result = run(LoadConfig(url.rstrip("/"), rate or 1.0, max_tokens, model), w,
                     lambda _r: bar.advance(task), None if rate else times)
    s = result.summary()
    if json_out:
        console.print_json(json.dumps(s))
    else:
        console.print(_summary_table(s))
    for r in result.failed[:3]:
        err_console.print(f"request {w.requests[r.request].tag}: {r.error}", highlight=False)
    if result.failed:
        raise typer.Exit(1)


def _load_source(workload: str, workload_args: str, trace: str | None, limit: int,
                 hash_block_size: int, max_tokens: int) -> tuple[Workload, list[float] | None]:
    """The workload to send and its send times (None: Poisson at --rate)."""
    from radixcache.traffic.workloads import WorkloadError, build_workload

    if trace is None:
        try:
            return build_workload(workload, shlex.split(workload_args)), None
        except WorkloadError as exc:
            raise typer.BadParameter(str(exc), param_hint="--workload") from None
    from radixcache.traffic.trace_load import trace_workload
    from radixcache.traffic.traces import TraceError

    try:
        tw = trace_workload(trace, limit, hash_block_size, max_tokens)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    return tw.workload, tw.times


def _summary_table(s: dict[str, float | int]) -> Table:
    t = Table(title="radixcache load")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("requests (failed)", f"{s['requests']} ({s['failed']})")
    t.add_row("TTFT p50 / p99", f"{s['ttft_p50_ms']:.1f} / {s['ttft_p99_ms']:.1f} ms")
    t.add_row("throughput", f"{s['output_tokens_per_s']:.0f} tok/s, "
                            f"{s['requests_per_s']:.1f} req/s")
    t.add_row("cached prompt tokens", f"{100 * s['hit_rate']:.1f}%")
    return t


class Section(enum.StrEnum):
    """The parts of ``bench cluster``."""

    POLICIES = "policies"
    FAULTS = "faults"


@bench_app.command("cluster")
def bench_cluster(
    replicas: int = typer.Option(4, min=1, max=16, help="Engine replicas."),
    blocks: int = typer.Option(2048, min=16, max=MAX_BLOCKS, help="KV blocks per replica."),
    conversations: int = typer.Option(320, min=1, help="chat conversations sent."),
    rate: float = typer.Option(30.0, min=0.01, max=1e6,
                              help="Requests per second through the router."),
    max_tokens: int = typer.Option(16, min=1, help="Answer length cap per request."),
    section: list[Section] = typer.Option(list(Section), "--section",
                                          help="What to run (repeatable): every router "
                                               "policy, and/or a router kill and a replica "
                                               "kill under load (faults)."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Every sglang-router policy on the chat workload over N replicas: hit rate, load
    imbalance, TTFT and the tokens cached on more than one replica; then the faults: requests
    failed across a router kill and a replica kill (openai clients, default retries) and the
    supervisor's restarts.

    Example: [bold]radixcache bench cluster --json[/bold]
    Faults only: [bold]radixcache bench cluster --section faults --replicas 2[/bold]
    """
    _need_cluster_extra()
    from radixcache.serving.cluster import ClusterError
    from radixcache.tools import bench_cluster as bc

    cfg = bc.BenchClusterConfig(replicas, blocks, conversations, rate, max_tokens)
    w = bc.bench_workload(cfg)
    results = {}
    faults = None
    try:
        with _progress() as bar:
            for p in cfg.policies if Section.POLICIES in section else ():
                task = bar.add_task(str(p), total=len(w.requests))
                results[p] = bc.run_policy(cfg, p, w, partial(_advance, bar, task))
            if Section.FAULTS in section:
                faults = _bench_faults(bar, replicas, blocks)
    except ClusterError as exc:
        err_console.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    doc = bc.figures(cfg, results, w)
    doc["faults"] = None if faults is None else faults.doc()
    if json_out:
        console.print_json(json.dumps(doc))
        return
    if results:
        console.print(_policies_table(cfg, results, len(w.requests)))
    if faults is not None:
        console.print(_faults_table(faults, replicas))


def _bench_faults(bar: Progress, replicas: int, blocks: int) -> FaultFigures:
    """The faults section, a progress row per phase."""
    import importlib.util

    from radixcache.tools import cluster_faults as cf

    if importlib.util.find_spec("openai") is None:
        raise CliError("bench cluster --section faults measures with the openai client: "
                       "pip install openai")
    config = cf.FaultsConfig(max(2, replicas), blocks=min(blocks, 2048))
    tasks: list[TaskID] = []

    def phase(name: str) -> None:
        if tasks:
            bar.update(tasks[-1], completed=config.warm + config.after)
        tasks.append(bar.add_task(f"faults: {name}", total=config.warm + config.after))

    def done() -> None:
        if tasks:
            bar.advance(tasks[-1])

    return cf.bench_faults(config, phase, done)


def _policies_table(cfg: BenchClusterConfig, results: dict[RoutePolicy, RouteFigures],
                    requests: int) -> Table:
    from radixcache.tools import bench_cluster as bc

    t = Table(title=f"radixcache bench cluster: {cfg.replicas} x {cfg.blocks} blocks, "
                    f"{requests} chat requests at {cfg.rate:g}/s through "
                    f"sglang-router {bc.router_version()}")
    for col in ("policy", "hit rate", "imbalance", "TTFT p50", "TTFT p99", "dup tokens",
                "answered", "per replica"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for p, f in results.items():
        t.add_row(str(p), f"{100 * f.hit_rate:.1f}%", f"{f.imbalance:.2f}",
                  f"{f.ttft_p50_ms:.0f} ms", f"{f.ttft_p99_ms:.0f} ms",
                  f"{f.duplicated_tokens:,}", f"{f.requests}/{f.requests + f.failed}",
                  " ".join(map(str, f.requests_per_replica)))
    return t


def _faults_table(f: FaultFigures, replicas: int) -> Table:
    t = Table(title=f"faults: {max(2, replicas)} replicas (round robin), openai clients with "
                    "their default 2 retries")
    for col in ("fault", "requests", "failed", "in flight", "held", "back after"):
        t.add_column(col, justify="left" if col == "fault" else "right")
    for name, p in (("router SIGKILL", f.router_kill), ("replica SIGKILL", f.replica_kill)):
        t.add_row(name, str(p.requests), str(p.failed),
                  str(p.in_flight) if name.startswith("replica") else "",
                  str(p.held) if name.startswith("router") else "", f"{p.back_s:.2f} s")
    t.caption = ("in flight: the killed replica's requests at the kill; held: requests the "
                 "front held while the router was down; restarts by the supervisor: "
                 f"{f.replica_restarts} replica, {f.router_restarts} router")
    return t


@app.command(rich_help_panel=RUN)
def cluster(
    replicas: int = typer.Option(2, min=1, max=16, help="Engine replicas."),
    policy: RoutePolicy = typer.Option(RoutePolicy.CACHE_AWARE, help="The router's policy."),
    blocks: int = typer.Option(2048, min=16, max=MAX_BLOCKS, help="KV blocks per replica."),
    http_base: int = typer.Option(0, help="Rank r serves HTTP on BASE+r (0: a free run)."),
    zmq_base: int = typer.Option(0, help="Rank r streams on BASE+3r..+2 (0: a free run)."),
    router_port: int = typer.Option(0, help="The router's port (0: a free one)."),
    router_arg: list[str] = typer.Option([], "--router-arg", help="More sglang-router flags, "
                                         "split as a shell would (repeatable), e.g. "
                                         "--router-arg='--cache-threshold 0.5'."),
    schedule: SchedulePolicy = typer.Option(SchedulePolicy.FCFS,
                                            help="Each replica's " + SCHEDULE_HELP),
    model: str = typer.Option(ModelSize.TINY.value, help="Each replica's model. " + MODEL_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_memory: str | None = typer.Option(None, help="Each replica's pool: " + KV_MEMORY_HELP,
                                         callback=check_kv_memory),
) -> None:
    """Start N engine replicas behind sglang-router (127.0.0.1) and open the cluster screen;
    q stops every process it started. Send load with `radixcache load --url ROUTER`.

    Example: [bold]radixcache cluster --replicas 4 --policy cache_aware[/bold]
    """
    _need_cluster_extra()
    from radixcache.serving.cluster import Cluster, ClusterConfig, ClusterError
    from radixcache.wire.endpoints import Endpoints
    from radixcache.wire.fleet import Fleet

    try:
        extra = tuple(a for arg in router_arg for a in shlex.split(arg))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--router-arg") from None
    config = ClusterConfig(replicas, policy, blocks, http_base, zmq_base, router_port,
                           router_args=extra, schedule=schedule.value,
                           model_args=model_args(model, dtype) + kv_memory_args(kv_memory))
    try:
        with console.status(f"starting {replicas} replicas and sglang-router ..."):
            c = Cluster(config).start()
    except ClusterError as exc:
        err_console.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    fleet = Fleet([Endpoints.tcp("127.0.0.1", r.zmq_port) for r in c.replicas]).start()
    try:
        streams_screen(fleet, c.router_url, c)
    finally:
        fleet.close()
        c.close()
    console.print(f"stopped {replicas} replicas and the router", highlight=False)


def _advance(bar: Progress, task: TaskID, _reply: object) -> None:
    bar.advance(task)


@bench_app.command("http")
def bench_http(
    blocks: int = typer.Option(2048, min=16, max=MAX_BLOCKS, help="KV blocks of the server."),
    leavers: int = typer.Option(300, min=1, help="Clients that leave mid-answer."),
    concurrent: int = typer.Option(500, min=1, help="Requests sent at once."),
    big_prompts: int = typer.Option(200, min=1, help="Prompts of one 900 KB word."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """A hostile client against `serve --http`: /health latency while huge prompts are
    refused, clients that leave, a burst of concurrent requests, server RSS under huge words.

    Example: [bold]radixcache bench http --json[/bold]
    """
    _need_cluster_extra()
    from radixcache.tools import bench_http as bh

    cfg = bh.BenchHttpConfig(blocks, leavers, concurrent, big_prompts)
    try:
        with err_console.status("starting serve --http ...") as status:
            out = bh.run(cfg, lambda name: status.update(name))
    except RuntimeError as exc:
        err_console.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    if json_out:
        print(json.dumps(out))
        return
    t = Table(title="serve --http under a hostile client")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, f"{v:.1f}" if isinstance(v, float) else str(v))
    console.print(t)
