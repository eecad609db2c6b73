"""`radixcache serve | keys` and `radixcache bench events` (record, tree, export: see
cmd_recordings)."""

from __future__ import annotations

import enum
import itertools
import json
import multiprocessing as mp
import shlex
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.app import RUN, app, bench_app
from radixcache.core import events as ev
from radixcache.core.tree import RadixTree
from radixcache.tools.bench_hostile import hostile_rows, run_hostile
from radixcache.traffic.workloads import WORKLOADS, Workload, build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import Mirror
from radixcache.wire.security import ClientCurve, CurveError, create_keys
from radixcache.wire.stream import (
    BindPolicy,
    Endpoints,
    Publisher,
    SnapshotAt,
    TreeSource,
    serve_request,
)
from radixcache.wire.subscriber import HashDrop, Subscriber

if TYPE_CHECKING:  # these import torch (seconds): the commands import them when they run
    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.server import EngineServer

console = Console()


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
                   threads: int) -> EngineConfig:
    import torch

    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.model import ModelConfig
    from radixcache.serving.server import tiny_model

    torch.set_num_threads(threads)
    mc = tiny_model() if model is ModelSize.TINY else ModelConfig()
    return EngineConfig(num_blocks=blocks, model=mc, device=device)


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
) -> None:
    """Run the engine (model, radix cache, scheduler) in this process; serve its event stream,
    snapshots/replays and commands over ZeroMQ until SIGTERM or Ctrl-C."""
    from radixcache.serving.server import DEFAULT_LOOP, Answers, EngineServer, EngineServerConfig

    policy = BindPolicy.ANY if allow_remote else BindPolicy.LOCAL_ONLY
    kv = None
    if kv_events is not None:
        if kv_events != "vllm":
            raise typer.BadParameter("only 'vllm' is supported", param_hint="--kv-events")
        kv = (f"tcp://{endpoint_host}:{port + 3}", f"tcp://{endpoint_host}:{port + 4}")
    config = EngineServerConfig(_engine_config(model, blocks, device, threads),
                                Answers(answers.value), digest_every,
                                loop=DEFAULT_LOOP if loop else ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            server = EngineServer(_endpoints(port, endpoint_host, ipc), config, policy=policy,
                                  kv_endpoints=kv, curve_keys=curve_keys)
        except CurveError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
        except ValueError as exc:
            console.print(f"[red]{exc}[/] (pass --allow-remote to bind it anyway)")
            raise typer.Exit(2) from None
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    _serve_until_stopped(server, workload, workload_args)


def _serve_until_stopped(server: EngineServer, workload: str | None, args: str) -> None:
    server.start()
    ep = server.publisher.endpoints
    console.print(f"serving epoch {server.publisher.epoch} on {server.engine.model.device}: "
                  f"events {ep.events}  snapshot/replay {ep.control}  commands {ep.commands}",
                  highlight=False)
    if server.kv is not None:
        console.print(f"vLLM KV events {server.kv.endpoints[0]}  replay {server.kv.endpoints[1]}")
    if workload:
        console.print(server.handle(cmd.StartWorkload(workload, shlex.split(args))).message)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    server.close()


def _workload_prompts(name: str, requests: int) -> list[np.ndarray]:
    """Model-free prompts (prompt + forced answer) for ``bench events``."""
    out: list[np.ndarray] = []
    seed = 0
    while len(out) < requests:
        w = build_workload(name, {"seed": seed})
        for r in w.requests:
            extra = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
            out.append(np.concatenate([r.prompt, extra]).astype(np.uint32))
        seed += 1
    return out[:requests]


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
) -> None:
    """Events/s from a tree driver to a mirror in another process, and what publishing costs.

    Measures the stream, not the model: the driver runs chat requests (prompt + forced
    answer) through the radix tree with no model (``TreeSource``), as fast as the tree goes.

    Example: radixcache bench events --drop 0.01 --verify-every-batch --json"""
    if verify_every_batch:
        checked = verify_drops(min_events, drop, per_step)
        if as_json:
            typer.echo(json.dumps(checked._asdict()))
        else:
            console.print(checked)
        if checked.batches_digest_equal != checked.batches_checked:
            raise typer.Exit(1)
        return
    result = _bench(requests, per_step, late_join_nodes, quiet=as_json)
    with Progress(console=console, disable=as_json, transient=True) as progress:
        progress.add_task("hostile peer: a clean run, then a hostile one", total=None)
        hostile = run_hostile()
    if as_json:
        typer.echo(json.dumps({**result._asdict(), "hostile": hostile._asdict()}))
    else:
        table = _bench_table(result)
        for row in hostile_rows(hostile):
            table.add_row(*row)
        console.print(table)


# -- bench events -------------------------------------------------------------------------------
class BenchResult(NamedTuple):
    """What `bench events` measured."""

    events: int
    events_per_s: float
    lost: int
    recovered: int
    digest_equal: bool
    publish_overhead: float
    events_overhead: float
    late_join_seconds: float
    late_join_nodes: int
    tree_seconds_events_off: float
    tree_seconds_events_on: float
    publish_seconds: float
    driver_events_per_s: float


def _mirror_process(endpoints: tuple[str, str, str], conn: Connection) -> None:
    """Child process: follow the stream until told the last seq, then report."""
    done = threading.Event()
    target: list[int] = []

    def on_batch(batch: ev.Batch) -> None:
        if target and batch.seq >= target[0]:
            done.set()

    t0 = time.monotonic()
    sub = Subscriber(Endpoints(*endpoints), on_batch=on_batch).start()
    sub.wait_synced(60)
    conn.send(("synced", time.monotonic() - t0))
    target.append(conn.recv())
    if sub.seq >= target[0]:
        done.set()
    done.wait(300)
    conn.send((time.monotonic(), sub.seq, asdict(sub.stats), sub.mirror.digest(),
               time.monotonic() - t0))
    sub.stop()


class _Child(NamedTuple):
    process: BaseProcess
    conn: Connection


def _spawn_mirror(pub: Publisher) -> tuple[_Child, float]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_mirror_process, args=(tuple(pub.endpoints), child), daemon=True)
    proc.start()
    _, synced_s = parent.recv()
    return _Child(proc, parent), synced_s


def _finish(child: _Child, last_seq: int) -> tuple[float, int, dict[str, int], str, float]:
    child.conn.send(last_seq)
    t_done, seq, stats, digest, total = child.conn.recv()
    child.process.join(10)
    return t_done, last_seq - seq, stats, digest, total


def _phase_cost(prompts: list[np.ndarray], per_step: int, progress: Progress) -> tuple[
        list[float], TreeSource, list[list[ev.AnyEvent]], ev.Snapshot]:
    """Same run, step by step: tree ops with events off, with events on, and publishing."""
    from radixcache.core.pool import KVPool

    off = RadixTree(KVPool(4096, 16), record_events=False)
    source = TreeSource(RadixTree(KVPool(4096, 16)), digest_every=0)
    snap0 = source.tree.snapshot()
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), source.snapshot_at, ring=1 << 17)
    source.publisher = pub
    kept: list[list[ev.AnyEvent]] = []
    times = [0.0, 0.0, 0.0]
    task = progress.add_task("engine: events off vs on", total=len(prompts))
    with pub:
        child, _ = _spawn_mirror(pub)
        for i in range(0, len(prompts), per_step):
            step = prompts[i:i + per_step]
            times[0] += _timed(off, step)
            times[1] += _timed(source.tree, step)
            t = time.perf_counter()
            events = source.tree.take_events()
            if len(kept) % 256 == 255:  # TreeSource.flush, inlined to keep the lists
                events.append(ev.Digest(source.tree.digest()))
            pub.publish(events)
            times[2] += time.perf_counter() - t
            kept.append(events)
            progress.advance(task, len(step))
        _finish(child, pub.seq)
    return times, source, kept, snap0


def _timed(tree: RadixTree, step: list[np.ndarray]) -> float:
    t = time.perf_counter()
    for tokens in step:
        serve_request(tree, tokens)
    return time.perf_counter() - t


def _phase_throughput(batches: list[list[ev.AnyEvent]], snap0: ev.Snapshot, digest: str,
                      progress: Progress) -> tuple[float, int, int, bool]:
    """Publish recorded tree batches at full speed to a mirror in another process."""
    task = progress.add_task("stream: engine -> mirror", total=1)
    holder: list[Publisher] = []
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), lambda: SnapshotAt(snap0, holder[0].seq),
                    ring=1 << 17, hwm=100_000)
    holder.append(pub)
    with pub:
        child, _ = _spawn_mirror(pub)
        t0 = time.monotonic()
        for events in batches:
            pub.publish(events)
        t_done, lost, stats, got, _ = _finish(child, pub.seq)
    progress.advance(task)
    n = sum(len(b) for b in batches)
    return n / (t_done - t0), lost, stats["replayed_batches"], got == digest


def _big_tree(nodes: int, progress: Progress) -> TreeSource:
    from radixcache.core.pool import KVPool

    source = TreeSource(RadixTree(KVPool(nodes * 2 + 1024, 16)), digest_every=0)
    rng = np.random.default_rng(0)
    task = progress.add_task(f"late join: building {nodes:,} nodes", total=nodes)
    tree = source.tree
    while len(tree) < nodes:
        before = len(tree)
        for _ in range(256):
            serve_request(tree, rng.integers(0, 64, int(rng.integers(3, 9)), dtype=np.uint32))
        tree.take_events()
        progress.advance(task, len(tree) - before)
    return source


def _phase_late_join(nodes: int, progress: Progress) -> tuple[float, int]:
    source = _big_tree(nodes, progress)
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), source.snapshot_at)
    source.publisher = pub
    with pub:
        child, synced_s = _spawn_mirror(pub)
        _, lost, _, digest, _ = _finish(child, pub.seq)
    if lost or digest != source.tree.digest():
        raise RuntimeError("late joiner did not converge")
    return synced_s, len(source.tree)


def _bench(requests: int, per_step: int, late_nodes: int, *, quiet: bool) -> BenchResult:
    prompts = _workload_prompts("chat", requests)
    with Progress(console=console, disable=quiet, transient=True) as progress:
        times, source, kept, snap0 = _phase_cost(prompts, per_step, progress)
        events = sum(len(b) for b in kept)
        rate, lost, recovered, equal = _phase_throughput(kept, snap0, source.tree.digest(),
                                                         progress)
        late_s, late_n = _phase_late_join(late_nodes, progress) if late_nodes else (0.0, 0)
    off, on, pub = times
    return BenchResult(events, round(rate), lost, recovered, equal, round(pub / on, 4),
                       round((on + pub - off) / off, 4), round(late_s, 3), late_n,
                       round(off, 3), round(on, 3), round(pub, 3), round(events / on))


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


# -- bench events --verify-every-batch ----------------------------------------------------------
class DropCheck(NamedTuple):
    """What ``verify_drops`` saw: every batch the subscriber applied was checked against the
    tree's digest recorded by the driver for that seq."""

    events: int
    batches: int
    batches_checked: int
    batches_digest_equal: int
    dropped: int
    recovered: int
    replayed_batches: int
    gaps: int
    snapshots: int
    seconds: float
    events_per_s: float


class _Counts:
    def __init__(self) -> None:
        self.checked = self.equal = self.recovered = 0


def _chat_prompts() -> Iterator[np.ndarray]:
    """Endless model-free chat prompts (prompt + forced answer), 1000 conversations a seed
    (building a workload reads the trace: one big one per seed, not one per request)."""
    for seed in itertools.count():
        for r in build_workload("chat", {"conversations": 1000, "seed": seed}).requests:
            out = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
            yield np.concatenate([r.prompt, out]).astype(np.uint32)


def _catch_up(sub: Subscriber, source: TreeSource, digests: dict[int, str]) -> None:
    """Wait (<= 60 s) until ``sub`` applied the last seq. A dropped last batch is revealed
    only by a later one (heartbeats are off): publish an empty batch whenever 0.2 s pass
    without progress."""
    pub = source.publisher
    assert pub is not None
    end = time.monotonic() + 60
    last, since = sub.seq, time.monotonic()
    while sub.seq < pub.seq and time.monotonic() < end:
        time.sleep(0.01)
        if sub.seq != last:
            last, since = sub.seq, time.monotonic()
        elif time.monotonic() - since > 0.2:
            with source.step_lock:
                digests[pub.seq + 1] = source.tree.digest()
                pub.publish([])
            since = time.monotonic()


def verify_drops(min_events: int, drop: float, per_step: int = 16,
                 ring: int = 1 << 15) -> DropCheck:
    """Drive chat requests through a tree (no model) until ``min_events`` events were published,
    recording the tree's digest for each batch's seq; a subscriber on 127.0.0.1 drops the
    batches ``HashDrop(drop)`` picks, recovers them (replay, or a snapshot when too old), and
    after every batch it applies compares its mirror's digest with the recorded one."""
    from radixcache.core.pool import KVPool

    source = TreeSource(RadixTree(KVPool(4096, 16)), digest_every=0)
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), source.snapshot_at, ring=ring,
                    heartbeat_s=1e9, hwm=1 << 17)  # no heartbeats: every seq has a digest
    source.publisher = pub
    digests: dict[int, str] = {}
    hook, counts = HashDrop(drop), _Counts()

    def on_batch(batch: ev.Batch) -> None:  # the subscriber's thread, right after applying
        counts.checked += 1
        counts.equal += sub.mirror.digest() == digests.get(batch.seq)
        counts.recovered += batch.seq in hook.dropped

    sub = Subscriber(pub.endpoints, Mirror(16, 4096), drop=hook, on_batch=on_batch)
    t0 = time.perf_counter()
    events = 0
    with pub:
        sub.start()
        if not sub.wait_synced(10):
            raise RuntimeError("the subscriber did not sync")
        prompts = _chat_prompts()
        while events < min_events:
            while pub.seq - sub.seq > ring // 2:  # keep the gaps replayable from the ring
                time.sleep(0.001)
            with source.step_lock:
                for tokens in itertools.islice(prompts, per_step):
                    serve_request(source.tree, tokens)
                batch = source.tree.take_events()
                digests[pub.seq + 1] = source.tree.digest()
                pub.publish(batch)
            events += len(batch)
        _catch_up(sub, source, digests)
        sub.stop()
    seconds = time.perf_counter() - t0
    st = sub.stats
    return DropCheck(events, pub.seq, counts.checked, counts.equal, st.dropped_by_hook,
                     counts.recovered, st.replayed_batches, st.gaps, st.snapshots,
                     round(seconds, 2), round(events / seconds))
