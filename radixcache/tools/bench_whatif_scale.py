"""`radixcache bench whatif --scale N`: the what-if pass at the scale of a month of traffic.

A seeded Mooncake-format trace of N requests (``traffic.mooncake.generate_runs``, valid by
aiperf's rule) is analysed four ways, each in a fresh interpreter so that its time and peak
memory are its own: generated in process (the generator feeds the pass batch by batch; the
pass's own time is counted apart from the generator's) and from a file of it on disk (the
path of ``radixcache whatif FILE``, parsing included), each exact and at ``--sample`` R. The
sampled curves are compared with the exact one at 800 log-spaced capacities; the error is
given where the sample resolves the curve (capacity >= 100/R blocks) and over all of them.
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
    renumber_stamps(np.zeros(1, np.int32), np.zeros(2, np.int32), np.zeros(10, np.int64))
    line = b'{"input_length": 5, "hash_ids": [1]}\n'
    scan_bytes(line, MOONCAKE_BLOCK)
    scan_bytes(line, MOONCAKE_BLOCK, sample_keep(0.5))
    return time.perf_counter() - t0


def in_process(requests: int, seed: int, rate: float) -> Figures:
    """The pass over a trace generated batch by batch in this process."""
    jit = warm_up()
    stack, pass_s, t0 = HashStack(MOONCAKE_BLOCK, rate), 0.0, time.perf_counter()
    for runs in generate_runs(requests, seed):
        t = time.perf_counter()
        stack.add(runs.ids, runs.ends, runs.tokens)
        pass_s += time.perf_counter() - t
    t = time.perf_counter()
    curve = stack.curve()
    pass_s += time.perf_counter() - t
    return _result(curve, pass_s, {"wall_seconds": time.perf_counter() - t0,
                                   "distinct_blocks": stack.distinct, "jit_seconds": jit})


def from_file(path: Path, rate: float) -> Figures:
    """``radixcache whatif FILE [--sample R]``'s analysis (``analysis.whatif.analyse``)."""
    from radixcache.analysis.whatif import WhatIfConfig, analyse

    jit = warm_up()
    t0 = time.perf_counter()
    w = analyse(WhatIfConfig(str(path), sample=rate))
    return _result(w.curve, time.perf_counter() - t0, {"file_bytes": path.stat().st_size,
                                                        "jit_seconds": jit})


def _child(*args: str) -> Figures:
    cmd = [sys.executable, "-m", "radixcache.tools.bench_whatif_scale", *args]
    done = subprocess.run(cmd, capture_output=True, check=True)
    fig: Figures = json.loads(done.stdout)
    return fig


def _errors(exact: Figures, est: Figures, rate: float) -> Figures:
    """Max abs error (points) of ``est`` against ``exact`` over the grid up to twice the exact
    saturation: where the sample resolves the curve, and everywhere."""
    e, s = (np.asarray(f["hits_at_grid"], np.float64) for f in (exact, est))
    sat = exact["saturation_blocks"]
    assert isinstance(sat, int)
    upto = 2 * max(sat, 1) >= GRID
    diff = 100 * np.abs(s - e) / max(float(str(exact["prompt_tokens"])), 1.0)
    resolved = upto & (100 / rate <= GRID)
    return {"max_abs_error_points": float(diff[resolved].max(initial=0.0)),
            "max_abs_error_points_all": float(diff[upto].max(initial=0.0)),
            "resolved_from_tokens": int(np.ceil(100 / rate)) * MOONCAKE_BLOCK}


def _pair(exact: Figures, sample: Figures, rate: float) -> Figures:
    for f in (exact, sample):
        f.pop("hits_at_grid", None)
    return {"exact": exact, "sample": sample, "time_ratio": float(str(sample["seconds"]))
            / max(float(str(exact["seconds"])), 1e-9)}


def run_scale(requests: int, seed: int, rate: float) -> Figures:
    """The ``scale`` section of ``bench whatif --json`` (see the module docstring)."""
    fig: Figures = {"requests": requests, "seed": seed, "sample_rate": rate,
                    "load_average": list(os.getloadavg())}
    exact = _child("gen", str(requests), str(seed), "1")
    sample = _child("gen", str(requests), str(seed), str(rate))
    sample.update(_errors(exact, sample, rate))
    fig["distinct_blocks"] = exact["distinct_blocks"]
    fig["in_process"] = _pair(exact, sample, rate)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        t0 = time.perf_counter()
        write_mooncake(path, requests, seed)
        fig["write_seconds"] = time.perf_counter() - t0
        exact = _child("file", str(path), "1")
        sample = _child("file", str(path), str(rate))
    sample.update(_errors(exact, sample, rate))
    fig["file"] = _pair(exact, sample, rate)
    return fig


def table_rows(s: Figures) -> list[tuple[str, str]]:
    """The human table's rows for the scale section."""
    rows = [("scale: requests, distinct blocks", f"{s['requests']:,}, {s['distinct_blocks']:,}")]
    for where in ("in_process", "file"):
        part = s[where]
        assert isinstance(part, dict)
        ex, sa = part["exact"], part["sample"]
        rows += [
            (f"scale {where}: exact (s, peak MB)", f"{ex['seconds']:.1f}, {ex['peak_rss_mb']:.0f}"),
            (f"scale {where}: sample {s['sample_rate']} (s, peak MB, x exact)",
             f"{sa['seconds']:.1f}, {sa['peak_rss_mb']:.0f}, {part['time_ratio']:.2f}x"),
            (f"scale {where}: sample error (points; all sizes)",
             f"{sa['max_abs_error_points']:.3f}; {sa['max_abs_error_points_all']:.2f}"),
        ]
    return rows


if __name__ == "__main__":  # one measured pass, in a fresh interpreter
    if sys.argv[1] == "gen":
        out = in_process(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        out = from_file(Path(sys.argv[2]), float(sys.argv[3]))
    print(json.dumps(out))
