"""`radixcache bench whatif --scale N`: the what-if pass at the scale of a month of traffic.

A seeded Mooncake-format trace of N requests (``traffic.mooncake.generate_runs``, valid by
aiperf's rule) is analysed generated in process (the generator feeds the pass batch by batch;
the pass's own time is counted apart from the generator's) and from a file of it on disk (the
path of ``radixcache whatif FILE``, parsing included), each in a fresh interpreter so that its
time and peak memory are its own (and from the file each command also as a user runs it, its
wall time from start to exit, ``time_over_exact`` its share of the exact command's): exact,
then at each ``--sample`` rate R two ways, as
``whatif --sample R`` answers (``hybrid``: the exact pass to 400/R blocks of depth joined with
the sample above it) and the sample alone (``--exact-depth 0``). Each estimate is compared
with the exact curve at 800 log-spaced capacities up to twice its saturation: the error over
all of them first, then over those a sample resolves (capacity >= 100/R blocks).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from radixcache.analysis.hashstack import HashStack, renumber_stamps
from radixcache.analysis.hybrid import HybridPass
from radixcache.analysis.stackdist import Curve
from radixcache.traffic.mooncake import generate_runs, write_mooncake
from radixcache.traffic.mooncake_scan import sample_keep, scan_bytes
from radixcache.traffic.traces import MOONCAKE_BLOCK

Figures = dict[str, object]
GRID = np.unique(np.geomspace(1, 2**36, 800).round().astype(np.int64))  # capacities, blocks


def peak_rss_mb() -> float:
    """This process's peak resident memory: Linux's VmHWM (ru_maxrss would carry the forking
    parent's peak across exec), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _result(curve: Curve, seconds: float, extra: Figures) -> Figures:
    p = max(curve.prompt_tokens, 1)
    return {"seconds": seconds, "peak_rss_mb": peak_rss_mb(), "requests": curve.requests,
            "prompt_tokens": curve.prompt_tokens, "max_hit_rate": curve.max_hits / p,
            "saturation_blocks": curve.saturation_units,
            "hits_at_grid": [int(h) for h in curve.hits(GRID)], **extra}


def warm_up() -> float:
    """Load the compiled kernels (numba's cache; a first run compiles them): seconds. Done
    before each timed pass, as a command's start-up is not its pass."""
    t0 = time.perf_counter()
    one = (np.asarray([1], np.uint64), np.asarray([1]), np.asarray([5]))
    HashStack(MOONCAKE_BLOCK).add(*one)
    HashStack(MOONCAKE_BLOCK, 0.5).add(*one)
    HybridPass(MOONCAKE_BLOCK, 0.5, 1).add(*one)
    renumber_stamps(np.zeros(1, np.int32), np.zeros(2, np.int32), np.zeros(10, np.int64))
    line = b'{"input_length": 5, "hash_ids": [1]}\n'
    scan_bytes(line, MOONCAKE_BLOCK)
    scan_bytes(line, MOONCAKE_BLOCK, sample_keep(0.5))
    return time.perf_counter() - t0


def _stack(rate: float, depth: int | None) -> HashStack | HybridPass:
    """The pass of ``whatif --sample rate --exact-depth depth`` (depth 0: the sample alone)."""
    if rate < 1 and depth != 0:
        return HybridPass(MOONCAKE_BLOCK, rate, depth)
    return HashStack(MOONCAKE_BLOCK, rate)


def in_process(requests: int, seed: int, rate: float, depth: int | None = None) -> Figures:
    """The pass over a trace generated batch by batch in this process."""
    jit = warm_up()
    stack, pass_s, t0 = _stack(rate, depth), 0.0, time.perf_counter()
    for runs in generate_runs(requests, seed):
        t = time.perf_counter()
        stack.add(runs.ids, runs.ends, runs.tokens)
        pass_s += time.perf_counter() - t
    t = time.perf_counter()
    curve = stack.curve()
    pass_s += time.perf_counter() - t
    distinct = stack.distinct if isinstance(stack, HashStack) else stack.sample.distinct
    return _result(curve, pass_s, {"wall_seconds": time.perf_counter() - t0,
                                   "distinct_blocks": distinct, "jit_seconds": jit})


def from_file(path: Path, rate: float, depth: int | None = None) -> Figures:
    """``radixcache whatif FILE [--sample R [--exact-depth D]]``'s analysis
    (``analysis.whatif.analyse``)."""
    from radixcache.analysis.whatif import WhatIfConfig, analyse

    jit = warm_up()
    t0 = time.perf_counter()
    w = analyse(WhatIfConfig(str(path), sample=rate, exact_depth=depth if rate < 1 else None))
    return _result(w.curve, time.perf_counter() - t0, {"file_bytes": path.stat().st_size,
                                                        "jit_seconds": jit})


def _child(*args: str) -> Figures:
    cmd = [sys.executable, "-m", "radixcache.tools.bench_whatif_scale", *args]
    done = subprocess.run(cmd, capture_output=True, check=True)
    fig: Figures = json.loads(done.stdout)
    return fig


def cli_wall(path: Path, rate: float, depth: int | None) -> float:
    """The wall time of ``radixcache whatif PATH --json [--sample R [--exact-depth D]]`` as a
    user runs it: a fresh interpreter, start-up, imports and the loading of the compiled
    kernels included (their numba cache warm: the passes before wrote it)."""
    cmd = [sys.executable, "-m", "cli.main", "whatif", str(path), "--json"]
    if rate < 1:
        cmd += ["--sample", str(rate)] + ([] if depth is None else ["--exact-depth", str(depth)])
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _errors(exact: Figures, est: Figures, rate: float) -> Figures:
    """Max abs error (points) of ``est`` against ``exact`` over the grid up to twice the exact
    saturation: everywhere first, then where a sample resolves the curve (>= 100/R blocks)."""
    e, s = (np.asarray(f["hits_at_grid"], np.float64) for f in (exact, est))
    sat = exact["saturation_blocks"]
    assert isinstance(sat, int)
    upto = 2 * max(sat, 1) >= GRID
    diff = 100 * np.abs(s - e) / max(float(str(exact["prompt_tokens"])), 1.0)
    resolved = upto & (100 / rate <= GRID)
    return {"max_abs_error_points_all": float(diff[upto].max(initial=0.0)),
            "max_abs_error_points_resolved": float(diff[resolved].max(initial=0.0)),
            "resolved_from_tokens": int(np.ceil(100 / rate)) * MOONCAKE_BLOCK}


HOW = {"hybrid": None, "sample_alone": 0}  # the ways at each rate: ``--exact-depth``


def _where(args: list[str], rates: list[float]) -> Figures:
    """Exact, then each rate both ways (``HOW``), from ``args`` (``gen N SEED`` or ``file
    PATH``), each estimate with its errors and its time as a share of the exact pass's; from
    a file also each command's own wall time (``cli_wall``) and its share of the exact one's
    (``time_over_exact``)."""
    exact = _child(*args, "1")
    path = Path(args[1]) if args[0] == "file" else None
    if path is not None:
        exact["cli_wall_seconds"] = cli_wall(path, 1.0, None)
    out: Figures = {}
    for rate in rates:
        per: Figures = {}
        for how, depth in HOW.items():
            est = _child(*args, str(rate), "-" if depth is None else str(depth))
            est.update(_errors(exact, est, rate))
            est["time_ratio"] = float(str(est["seconds"])) / max(float(str(exact["seconds"])),
                                                                  1e-9)
            est.pop("hits_at_grid", None)
            if path is not None:
                est["cli_wall_seconds"] = wall = cli_wall(path, rate, depth)
                est["time_over_exact"] = wall / max(float(str(exact["cli_wall_seconds"])), 1e-9)
            per[how] = est
        out[f"{rate:g}"] = per
    exact.pop("hits_at_grid", None)
    return {"exact": exact, "rates": out}


def run_scale(requests: int, seed: int, rates: list[float]) -> Figures:
    """The ``scale`` section of ``bench whatif --json`` (see the module docstring)."""
    fig: Figures = {"requests": requests, "seed": seed, "sample_rates": rates,
                    "load_average": list(os.getloadavg())}
    fig["in_process"] = _where(["gen", str(requests), str(seed)], rates)
    part = fig["in_process"]
    assert isinstance(part, dict)
    fig["distinct_blocks"] = part["exact"]["distinct_blocks"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        t0 = time.perf_counter()
        write_mooncake(path, requests, seed)
        fig["write_seconds"] = time.perf_counter() - t0
        fig["file"] = _where(["file", str(path)], rates)
    return fig


def table_rows(s: Figures) -> list[tuple[str, str]]:
    """The human table's rows for the scale section: per place and rate, the error over all
    sizes first, then over the resolved range."""
    rows = [("scale: requests, distinct blocks", f"{s['requests']:,}, {s['distinct_blocks']:,}")]
    for where in ("in_process", "file"):
        part = s[where]
        assert isinstance(part, dict)
        ex = part["exact"]
        rows.append((f"scale {where}: exact (s, peak MB)",
                     f"{ex['seconds']:.1f}, {ex['peak_rss_mb']:.0f}"))
        if "cli_wall_seconds" in ex:
            rows.append((f"scale {where}: exact `radixcache whatif FILE` (wall s)",
                         f"{ex['cli_wall_seconds']:.1f}"))
        for rate, per in part["rates"].items():
            for how, f in per.items():
                rows += [
                    (f"scale {where}: {how} {rate} (s, peak MB, x exact)",
                     f"{f['seconds']:.1f}, {f['peak_rss_mb']:.0f}, {f['time_ratio']:.2f}x"),
                    (f"scale {where}: {how} {rate} error (points; all sizes, resolved)",
                     f"{f['max_abs_error_points_all']:.3f}; "
                     f"{f['max_abs_error_points_resolved']:.3f}"),
                ]
                if "time_over_exact" in f:
                    rows.append((f"scale {where}: {how} {rate} command (wall s, x exact's)",
                                 f"{f['cli_wall_seconds']:.1f}, {f['time_over_exact']:.2f}x"))
    return rows


def _depth(args: list[str]) -> int | None:
    return None if not args or args[0] == "-" else int(args[0])


if __name__ == "__main__":  # one measured pass, in a fresh interpreter
    if sys.argv[1] == "gen":
        out = in_process(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                         _depth(sys.argv[5:]))
    else:
        out = from_file(Path(sys.argv[2]), float(sys.argv[3]), _depth(sys.argv[4:]))
    print(json.dumps(out))
