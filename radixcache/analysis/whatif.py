"""What-if: from a SOURCE to the LRU curve at every capacity, the block-1 curve (for the
alignment misses) and other policies' points by direct replay."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from radixcache.analysis.policies import EvictionPolicy, min_blocks, replay_hits, with_paths
from radixcache.analysis.stackdist import Curve, StackDistances
from radixcache.core import events as ev
from radixcache.traffic.mooncake import head, line_of, read_hash_runs, read_mooncake
from radixcache.traffic.traces import (
    MOONCAKE_BLOCK,
    Access,
    RequestTracker,
    TokenRequest,
    TraceError,
    TraceFormat,
    detect_format,
    read_recording,
    read_token_jsonl,
    token_access,
)

if TYPE_CHECKING:
    from radixcache.wire.mirror import Mirror

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class WhatIfConfig:
    """What to analyse. ``block_size`` applies to token sources (sharegpt, token JSONL,
    recordings); a Mooncake trace's unit is its ``hash_block_size``."""

    source: str
    block_size: int = 16
    hash_block_size: int = MOONCAKE_BLOCK
    limit: int | None = None
    policies: tuple[EvictionPolicy, ...] = ()  # libCacheSim's, ``samples`` replays each
    samples: int = 6
    alignment: bool = False  # the block-1 curve (a second pass) for the alignment misses
    sample: float = 1.0  # SHARDS rate for hash-id traces (1: exact)
    exact_depth: int | None = None  # with a sample: blocks the exact pass keeps (None:
    # ``hybrid.default_depth``; 0: the sample alone)
    sample_max: int | None = None  # a fixed-size sample (SHARDS s_max): at most this many
    # blocks, its rate lowered from ``sample`` as the trace grows


@dataclass(slots=True)
class PolicyPoints:
    """One policy's hit tokens at sampled capacities (units)."""

    policy: EvictionPolicy
    capacities_units: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)


@dataclass(slots=True)
class WhatIf:
    """The analysis of one source."""

    source: str
    format: TraceFormat
    curve: Curve  # at ``curve.block_tokens``
    token_curve: Curve | None  # at block size 1 (token sources only): the alignment misses
    policies: list[PolicyPoints]
    seconds: float
    notes: list[str]
    pool_tokens: int | None = None  # the source's own pool (a recording's engine), tokens


class Source:
    """A SOURCE that can be streamed more than once (one pass per curve or replay)."""

    def __init__(self, cfg: WhatIfConfig) -> None:
        self.cfg = cfg
        self.format = detect_format(cfg.source)
        self.notes: list[str] = []
        self._tokens: list[TokenRequest] | None = None
        if self.format is TraceFormat.SHAREGPT:
            from radixcache.traffic.sharegpt import load_trace

            trace = load_trace(cfg.limit)
            self._tokens = [
                TokenRequest(r.prompt, np.concatenate((r.prompt, r.output[:-1])))
                for r in trace.requests
            ]

    @property
    def block_tokens(self) -> int:
        """Tokens per unit of this source's curve."""
        if self.format is TraceFormat.MOONCAKE:
            return self.cfg.hash_block_size
        return self.cfg.block_size

    @property
    def has_tokens(self) -> bool:
        """Whether the source carries token ids (so block size 1 can be analysed)."""
        return self.format is not TraceFormat.MOONCAKE

    def _token_requests(self) -> Iterator[TokenRequest]:
        if self._tokens is not None:
            return iter(self._tokens)
        path = Path(self.cfg.source)
        if self.format is TraceFormat.RECORDING:
            return self._recording(path)
        return read_token_jsonl(path)

    def _recording(self, path: Path) -> Iterator[TokenRequest]:
        """The recording's requests; its damage note once, however many passes read it."""
        notes: list[str] = []
        yield from read_recording(path, notes)
        self.notes.extend(n for n in notes if n not in self.notes)

    def pool_tokens(self) -> int | None:
        """The pool the source itself knows: a recording's engine's, in tokens."""
        if self.format is not TraceFormat.RECORDING:
            return None
        from radixcache.wire.recording import Keyframe, RecordingReader

        for rec in RecordingReader(Path(self.cfg.source)).records():
            if isinstance(rec.item, Keyframe):
                return rec.item.snapshot.num_blocks * rec.item.snapshot.block_size
        return None

    def hash_curve(self, progress: Progress | None = None) -> Curve:
        """The LRU curve of a Mooncake-format trace by the array pass (``hashstack``): exact,
        or with ``sample`` the exact pass to ``exact_depth`` joined with the sample above it
        (``hybrid``), or the sample alone (``exact_depth`` 0)."""
        # numba costs ~0.3-0.9 s to import: only a Mooncake-format trace pays it, not every
        # screen that imports the what-if analysis
        from radixcache.analysis.fixedsample import FixedSample
        from radixcache.analysis.hashstack import HashStack, HashStackError
        from radixcache.analysis.hybrid import HybridPass
        from radixcache.traffic.mooncake_scan import sample_keep

        cfg = self.cfg
        path, left = Path(cfg.source), cfg.limit
        stack: HashStack | HybridPass | FixedSample
        sampled = cfg.sample < 1 or cfg.sample_max is not None
        if sampled and cfg.exact_depth != 0:
            stack = HybridPass(cfg.hash_block_size, cfg.sample, cfg.exact_depth, cfg.sample_max)
            keep = 0
        elif cfg.sample_max is not None:  # the fixed-size sample alone: read at its start
            stack = FixedSample(cfg.hash_block_size, cfg.sample_max, cfg.sample)
            keep = sample_keep(cfg.sample)
        else:
            stack = HashStack(cfg.hash_block_size, cfg.sample)
            keep = stack.keep  # the scanner samples as it reads each id
        for runs in read_hash_runs(path, cfg.hash_block_size, keep):
            if left is not None:
                runs = head(runs, left)
                left -= len(runs.tokens)
            try:
                if isinstance(stack, HybridPass):
                    stack.add(runs.ids, runs.ends, runs.tokens)
                elif isinstance(stack, FixedSample):
                    stack.add(runs.ids, runs.ends, runs.tokens, runs.wants)
                else:
                    stack.add(runs.ids, runs.ends, runs.tokens, runs.wants)
            except HashStackError as exc:
                raise TraceError(f"{path}:{line_of(runs, exc.index)}: {exc}") from None
            if progress is not None:
                progress(len(runs.tokens))
            if left is not None and left <= 0:
                break
        self.notes.extend(_sample_notes(stack, cfg.sample))
        self.notes.extend(_fixed_notes(stack))
        return stack.curve()

    def accesses(self, block: int | None = None) -> Iterator[Access]:
        """The requests as units of ``block`` tokens (default: the source's own)."""
        limit = self.cfg.limit
        if self.format is TraceFormat.MOONCAKE:
            it: Iterator[Access] = read_mooncake(Path(self.cfg.source), self.cfg.hash_block_size)
        else:
            b = block or self.cfg.block_size
            it = (token_access(r, b) for r in self._token_requests())
        for i, a in enumerate(it):
            if limit is not None and i >= limit:
                return
            yield a

    def width(self, block: int | None = None) -> int:
        """Bytes per unit in ``accesses(block)``."""
        if self.format is TraceFormat.MOONCAKE:
            return 8
        return 4 * (block or self.cfg.block_size)


def kernels_cached(cfg: WhatIfConfig) -> bool:
    """Whether the compiled kernels a Mooncake-format trace needs are in numba's on-disk
    cache (``cache=True``: the first run compiles them, 30-60 s); true for other sources."""
    import importlib.util
    import os

    try:
        if detect_format(cfg.source) is not TraceFormat.MOONCAKE:
            return True
    except TraceError:
        return True  # refused later, with its reason
    where = os.environ.get("NUMBA_CACHE_DIR")
    mods = ["radixcache.analysis.hashstack", "radixcache.traffic.mooncake_scan"]
    if (cfg.sample < 1 or cfg.sample_max is not None) and cfg.exact_depth != 0:
        mods.append("radixcache.analysis.boundstack")
    if cfg.sample_max is not None:
        mods.append("radixcache.analysis.fixedsample")
    for mod in mods:
        spec = importlib.util.find_spec(mod)
        if spec is None or spec.origin is None:
            return False
        src = Path(spec.origin)
        dirs = [src.parent / "__pycache__"] + ([Path(where)] if where else [])
        if not any(any(d.rglob(f"{src.stem}.*.nbi")) for d in dirs if d.is_dir()):
            return False
    return True


def _fixed_notes(stack: object) -> list[str]:
    """What a fixed-size sample (alone or above the exact pass) says: its final rate."""
    from radixcache.analysis.fixedsample import FixedSample
    from radixcache.analysis.hybrid import HybridPass

    sample = stack.sample if isinstance(stack, HybridPass) else stack
    if not isinstance(sample, FixedSample):
        return []
    if isinstance(stack, HybridPass) and not stack.exact.evicted:
        return []
    return [f"fixed-size sample: at most {sample.s_max:,} blocks (held {sample.peak:,} at "
            f"most); final rate {sample.rate:.6g}, resolving from "
            f"{int(np.ceil(100 / sample.rate)):,} blocks"]


def _sample_notes(stack: object, rate: float) -> list[str]:
    """What a sampled pass should say about itself; ``TraceError`` for a sample that
    followed no block at all (it could say nothing)."""
    from radixcache.analysis.hashstack import HashStack
    from radixcache.analysis.hybrid import HybridPass

    if isinstance(stack, HybridPass):
        from radixcache.analysis.fixedsample import FixedSample

        what = "fixed-size" if isinstance(stack.sample, FixedSample) else f"{rate:g}"
        if not stack.exact.evicted:
            return [f"the exact pass held every block (at most {stack.depth:,}): every "
                    f"capacity is exact, the {what} sample was not needed"]
        from radixcache.analysis.hybrid import MIN_SUB_BLOCKS

        if not stack.subs or min(s.distinct for s in stack.subs) < MIN_SUB_BLOCKS:
            return [f"the {what} sample holds {stack.sample.distinct:,} blocks: too few for "
                    f"an error bound on the estimates above {stack.depth:,} blocks"]
        return []
    if not isinstance(stack, HashStack) or not stack.keep:
        return []
    if stack.requests and stack.distinct == 0:
        raise TraceError(f"--sample {rate:g} followed no block of the trace's: nothing to "
                         f"estimate from (raise --sample, or keep the exact pass)")
    if stack.distinct < 100:
        n = stack.distinct
        return [f"the {rate:g} sample followed only {n} block{'s' * (n > 1)}: too few to "
                f"resolve the curve (estimates rough at every capacity)"]
    return []


def one_pass(
    accesses: Iterable[Access], width: int, block_tokens: int, progress: Progress | None = None
) -> Curve:
    """The LRU curve of ``accesses`` in one pass (see ``radixcache.analysis.stackdist``)."""
    sd = StackDistances(width, block_tokens)
    for i, a in enumerate(accesses, 1):
        sd.add(a)
        if progress is not None and i % 1024 == 0:
            progress(1024)
    if progress is not None:
        progress(sd.requests % 1024)
    return sd.curve()


def sample_units(curve: Curve, samples: int) -> list[int]:
    """``samples`` capacities (units), log-spaced up to where the curve saturates."""
    top = max(2, curve.saturation_units)
    grid = np.unique(np.geomspace(1, top, samples).round().astype(np.int64))
    return [int(u) for u in grid]


def replay_points(src: Source, policies: Iterable[EvictionPolicy], units: list[int],
                  progress: Progress | None = None) -> list[PolicyPoints]:
    """Each policy replayed by libCacheSim at each capacity in ``units`` from its smallest
    (``policies``), over the requests read once and shared by every replay."""
    policies = list(policies)
    if not policies:
        return []
    trace = list(with_paths(src.accesses(), src.width()))
    out = []
    for policy in policies:
        pts = PolicyPoints(policy)
        for u in (u for u in units if u >= min_blocks(policy)):
            pts.capacities_units.append(u)
            pts.hits.append(replay_hits(trace, policy, u, src.block_tokens))
            if progress is not None:
                progress(1)
        out.append(pts)
    return out


def analyse(cfg: WhatIfConfig, progress: Progress | None = None) -> WhatIf:
    """Everything ``radixcache whatif`` shows for ``cfg``: the curves, then the replays."""
    t0 = time.perf_counter()
    src = Source(cfg)
    if src.format is TraceFormat.MOONCAKE:
        curve = src.hash_curve(progress)
    else:
        curve = one_pass(src.accesses(), src.width(), src.block_tokens, progress)
    token_curve = None
    if cfg.alignment and src.has_tokens:
        token_curve = curve if cfg.block_size == 1 else one_pass(src.accesses(1), src.width(1), 1)
    units = sample_units(curve, cfg.samples)
    points = replay_points(src, cfg.policies, units)
    return WhatIf(cfg.source, src.format, curve, token_curve, points, time.perf_counter() - t0,
                  src.notes, src.pool_tokens())


class RunningCurve:
    """The block-1 curve of an engine's event stream as it grows, beside the engine's own
    measured hits (its ``RequestStart`` events): the inspector's what-if screen.

    ``apply`` each event in order (it applies it to ``mirror`` first), or ``observe`` it
    after someone else did; ``curve()`` is the token-granular LRU curve of the requests
    finished so far."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.tracker = RequestTracker(mirror)
        self.stack = StackDistances(4, 1)
        self.measured_hits = 0
        self.measured_prompt = 0

    def apply(self, e: ev.AnyEvent) -> None:
        """Apply ``e`` to the mirror and count the request it finished or started."""
        self.mirror.apply(e)
        self.observe(e)

    def observe(self, e: ev.AnyEvent) -> TokenRequest | None:
        """Count ``e`` once someone applied it to the mirror (the inspector's feed); returns
        the request it finished, if any."""
        req = self.tracker.after(e)
        if req is not None:
            self.stack.add(token_access(req, 1))
        elif isinstance(e, ev.RequestStart):
            self.measured_hits += e.hit_tokens
            self.measured_prompt += e.prompt_tokens
        return req

    def curve(self) -> Curve:
        """The curve of the requests finished so far (hits at every capacity, in tokens)."""
        return self.stack.curve()

    @property
    def measured_rate(self) -> float:
        """The hit rate the engine's ``RequestStart`` events measured (0 before any)."""
        return self.measured_hits / max(self.measured_prompt, 1)

    @property
    def capacity_tokens(self) -> int:
        """The engine's pool: blocks x block size, as its snapshots say."""
        return self.mirror.num_blocks * self.mirror.block_size
