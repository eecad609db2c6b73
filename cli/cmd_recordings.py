"""`radixcache record | export`: recordings written and exported (`tree`: ``cli.cmd_tree``).

Thin shells: the live recorder is ``radixcache.wire.recorder``, the reader
``radixcache.wire.recording``. Every error and warning goes to stderr; results to stdout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from cli.app import CliError, app
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
    check_kv_memory,
    checked_engine,
    sized_workload,
)
from cli.output import client_curve, console, stopped, unsynced, warn
from radixcache.core.files import descriptor_named, output_kind, write_whole
from radixcache.serving.policy import SchedulePolicy
from radixcache.traffic.workloads import Workload, WorkloadError
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.export import jsonl_lines, perfetto_json
from radixcache.wire.recorder import LiveRecorder
from radixcache.wire.recording import CaptureNote, RecordingReader, RecordingWriter
from radixcache.wire.security import ClientCurve

if TYPE_CHECKING:
    from radixcache.core import events as ev
    from radixcache.serving.engine import Engine
    from radixcache.serving.server import RecordResult

# 2,048 blocks of 16 tokens (32k tokens): 2,000 chat requests evict, so a recording shows
# eviction, merges and the LRU at work (65,536 never filled up: no eviction to see)
RECORD_BLOCKS = 2048


ANSWERS_HELP = ("Headless: prefill folds each forced answer into its prompt (same tree, ~50x "
                "faster on a CPU; RequestStart then counts answers as prompt); decode generates "
                "them token by token.")


@app.command()
def record(
    out: Path = typer.Option(..., "--out", help="Recording file to write."),
    workload: str = typer.Option("chat", help="Workload to run headless."),
    workload_args: str = typer.Option("", help="Its arguments (default: sized to --requests)."),
    requests: int = typer.Option(2000, min=1, help="Headless: run the first N requests."),
    from_: str | None = typer.Option(None, "--from", help="Record a live engine instead "
                                                          "(tcp://HOST:PORT of its events)."),
    seconds: float = typer.Option(10.0, min=0.1, max=WEEK_S,
                                 help="With --from: how long to record."),
    blocks: int = typer.Option(RECORD_BLOCKS, min=16, max=MAX_BLOCKS,
                               help="Headless: KV pool blocks of 16 tokens "
                                                   "(small enough that the workload evicts)."),
    model: str = typer.Option(ModelSize.TINY.value, help="Headless model. " + MODEL_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_memory: str | None = typer.Option(None, help="Headless: " + KV_MEMORY_HELP,
                                         callback=check_kv_memory),
    answers: AnswerMode = typer.Option(AnswerMode.PREFILL, help=ANSWERS_HELP),
    device: str | None = typer.Option(None, help="Headless torch device (default: cuda when "
                                                 "present, else cpu)."),
    threads: int = typer.Option(1, min=1, max=MAX_THREADS, help="torch CPU threads."),
    schedule: SchedulePolicy = typer.Option(
        SchedulePolicy.DFS_WEIGHT,  # as the demo (cmd_demo.DEMO_SCHEDULE)
        help="Headless: " + SCHEDULE_HELP),
    reserve: ReserveRule = typer.Option(ReserveRule.GROW, help="Headless: " + RESERVE_HELP),
    keyframe_every: int = typer.Option(50_000, min=1,
                                        help="Events between snapshot keyframes."),
    curve_keys: Path | None = typer.Option(None, help="With --from: " + CURVE_HELP),
) -> None:
    """Record a live engine (--from), or run a workload headless on the engine with the tiny
    model and record every step's events: 2000 chat requests take about 80 s on 2 CPU cores.

    SIGTERM stops it early: the file is closed whole, read back, and said so (exit 0)."""
    output_kind(out)  # a directory or a block device refused before the engine starts
    if from_ is not None:
        with _on_sigterm() as term:
            _record_live(from_, out, seconds, keyframe_every, client_curve(curve_keys), term)
        return
    from radixcache.serving.engine import Answers

    w = _first_requests(workload, workload_args, requests)
    n = len(w.requests)
    engine = checked_engine(model, blocks, device, threads, Answers(answers.value), schedule,
                            dtype=dtype, kv_memory=kv_memory, reserve=reserve)
    header: dict[str, str | int | float] = {
        "num_blocks": engine.config.num_blocks, "block_size": 16, "model": model,
        "answers": answers.value, "workload": f"{workload} {workload_args}".strip(), "requests": n,
        "schedule": schedule.value, "device": str(engine.model.device),
        # the model folder (absolute; "" for the seeded model): a replay decodes its previews
        # with the folder's tokenizer when the folder is on the replaying machine
        "model_dir": engine.model_dir, "model_name": engine.model.name}
    t0 = time.perf_counter()
    with _on_sigterm() as term:
        r = _record_to(out, header, keyframe_every, engine, w, term)
    c = r.counters
    what = (f"wrote {out}: {r.events:,} events in {r.batches:,} batches; {c.finished:,} of "
            f"{n:,} requests finished ({c.rejected} rejected) in {r.steps:,} steps, "
            f"{time.perf_counter() - t0:.1f} s")
    if term.is_set():
        what = f"stopped by SIGTERM: {what} ({_reads_back(out, r.batches)})"
    wrote(out, what)


@contextlib.contextmanager
def _on_sigterm() -> Iterator[threading.Event]:
    """An event that SIGTERM sets (instead of ending the process) inside the block."""
    term = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: term.set())
    try:
        yield term
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reads_back(path: Path, batches: int) -> str:
    """"reads back" once ``path`` has been read to its end with ``batches`` batches, whole;
    else ``CliError`` saying where it stopped (what a stop must never leave)."""
    from radixcache.core import events as evs

    with RecordingReader(path) as reader:
        found = sum(type(rec.item) is evs.Batch for rec in reader.records())
        damage = reader.damage
    if damage is not None or found != batches:
        where = f"stopped at byte {damage.offset:,}: {damage.reason}" if damage else \
            f"{found} batches, not {batches}"
        raise CliError(f"{path} does not read back: {where}")
    return f"reads back: {found:,} batches"


def _first_requests(workload: str, args: str, requests: int) -> Workload:
    """The workload's first ``requests`` requests; a bad one is a usage error (exit 2)."""
    try:
        w = sized_workload(workload, args, requests)
    except WorkloadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload") from None
    return dataclasses.replace(w, requests=w.requests[:requests])


def _record_to(out: Path, header: dict[str, str | int | float], keyframe_every: int,
               engine: Engine, w: Workload, stop: threading.Event) -> RecordResult:
    """Run ``w`` on ``engine`` into ``out`` with a progress bar (until ``stop`` is set); the
    engine is closed after. A full disk ends in ``RecordingWriteError``: one line, the file
    cut to whole frames."""
    from radixcache.serving.server import record_service

    try:
        with RecordingWriter(out, header, keyframe_every=keyframe_every) as writer, \
                _requests_bar(len(w.requests)) as bar:
            return record_service(engine, w, writer, progress=bar, until=stop.is_set)
    finally:
        engine.close()


@contextlib.contextmanager
def _requests_bar(total: int) -> Iterator[Callable[[ev.Batch], None]]:
    """A progress bar of finished requests on stderr (drawn on a terminal only, and erased
    at the end); yields what counts each batch's finished requests into it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from radixcache.core import events as evs

    err = Console(stderr=True)
    # disabled off a terminal: Rich's transient bar still ended with a blank line on stderr
    bar = Progress("recording", BarColumn(), MofNCompleteColumn(), "requests",
                   TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
    task = bar.add_task("record", total=total)

    def finished(batch: ev.Batch) -> None:
        done = sum(1 for e in batch.events if type(e) is evs.RequestFinish)
        if done:
            bar.advance(task, done)

    with bar:
        yield finished


def _record_live(endpoint: str, out: Path, seconds: float, every: int,
                 curve: ClientCurve | None, stop: threading.Event) -> None:
    rec = LiveRecorder(Endpoints.from_events(endpoint), out, keyframe_every=every, curve=curve)
    try:
        r = rec.run_for(seconds, stop)
    finally:
        if rec.busy_at_end:
            # the stream's thread still holds a huge frame (a 48 MB block list: 10M objects);
            # the interpreter's exit would walk them in several GC passes (4 s at load 5)
            gc.freeze()
    if r.failed:
        raise CliError(r.failed)
    if not r.synced:
        why = unsynced(rec.subscriber, "down, or it needs these --curve-keys")
        raise CliError(f"no snapshot from {endpoint} in {seconds:g} s ({why})")
    note = r.note
    assert note is not None  # synced and written: the recorder wrote its note
    what = (f"wrote {out}: {r.events:,} events in {r.batches:,} batches, {r.keyframes} "
            f"keyframes (seq {note.first_seq:,} to {note.last_seq:,})")
    if stop.is_set():
        what = (f"stopped by SIGTERM after {note.seconds:g} s: {what} "
                f"({_reads_back(out, r.batches)})")
    wrote(out, what)
    if not note.complete:
        warn(f"warning: incomplete capture (noted in the file): {capture_losses(note)}")


def capture_losses(note: CaptureNote) -> str:
    """What a live capture could not get, in one line."""
    state = {"live": "in sync", "snapshot": "waiting for a snapshot",
             "replay": "waiting for a replay"}.get(note.state, note.state)
    parts = [f"ended {state}" + (f", out of sync for {note.out_of_sync_s:.1f} s of "
                                 f"{note.seconds:g} s" if note.state != "live" else "")]
    for count, what in ((note.gaps, "gaps"), (note.too_old, "gaps older than the ring"),
                        (note.malformed, "malformed frames"), (note.resyncs, "resyncs"),
                        (note.seq_backwards, "seqs going backwards"),
                        (note.buffer_dropped, "batches dropped while waiting")):
        if count:
            parts.append(f"{count} {what}")
    if note.last_error:
        parts.append(f"last: {note.last_error}")
    return "; ".join(parts)


@app.command()
def export(
    file: Path = typer.Argument(..., help="A recording."),
    format: str = typer.Option("jsonl", help="jsonl or perfetto."),
    out: Path | None = typer.Option(None, help="Output file (default: FILE.jsonl/.json)."),
) -> None:
    """Export a recording as JSON lines or a Perfetto/Chrome trace."""
    if format not in ("jsonl", "perfetto"):
        raise typer.BadParameter("jsonl or perfetto", param_hint="--format")
    target = out or file.with_suffix(".jsonl" if format == "jsonl" else ".json")
    output_kind(target)  # a directory or a device refused before the recording is read
    with RecordingReader(file) as reader:
        items = [r.item for r in reader.fitting_records()]  # nothing that `tree` refuses
        damage = reader.damage
    # all or nothing (``core.files``): a full disk leaves the file that was there and says so
    if format == "jsonl":
        write_whole(target, "".join(line + "\n" for line in jsonl_lines(items)).encode())
    else:
        write_whole(target, perfetto_json(items))
    stopped(damage)
    wrote(target, f"wrote {target}")


def wrote(path: Path, line: str) -> None:
    """Say what was written: on stdout, unless the file itself went to stdout
    (``--out /dev/stdout``), where the line would end the data: then on stderr."""
    if descriptor_named(path) == 1:
        warn(line)
    else:
        console.print(line)
