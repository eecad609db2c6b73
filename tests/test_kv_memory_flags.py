"""``--kv-memory`` on ``demo``, ``record``, ``cluster`` and ``bench engine`` as on ``serve``: a
value it cannot read is one usage line before anything starts (exit 2); a size it reads sizes
the pool (record's header, bench engine's blocks, the serve arguments demo and cluster start
their engines with)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer

from cli.cmd_engine import _kv_blocks
from cli.options import kv_memory_args, model_args
from radixcache.tools.demo import EngineProcess
from radixcache.wire.recording import RecordingReader

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=180, check=False)


def _usage(command: str, problem: str) -> str:
    hint = "'--kv-memory': " if problem.startswith("'") else "--kv-memory: "  # callback's, body's
    return (f"radixcache {command}: error: Invalid value for {hint}{problem} "
            f"(see radixcache {command} --help)\n")


CASES = [
    (["demo", "--no-inspect", "--kv-memory", "lots"], "demo",
     "'lots': a size such as 2GiB or a fraction such as 0.5"),
    (["record", "--out", "x.rcx", "--kv-memory", "0GiB"], "record", "'0GiB' must be positive"),
    (["cluster", "--kv-memory", "2"], "cluster", "'2': a fraction must be in (0, 1]"),
    (["bench", "engine", "--kv-memory", "-1MiB"], "bench engine", "'-1MiB' must be positive"),
    (["bench", "engine", "--schedule", "fcfs", "--kv-memory", "1MiB"], "bench engine",
     "sizes the pool of the cache on/off comparison: give --blocks with --schedule"),
    (["bench", "engine", "--section", "memory", "--kv-memory", "1MiB"], "bench engine",
     "sizes the pool of the cache on/off comparison: give --blocks with --section"),
]


@pytest.mark.parametrize(("argv", "command", "problem"), CASES,
                         ids=[" ".join(c[0][:2]) for c in CASES])
def test_a_kv_memory_it_cannot_read_is_one_usage_line(argv: list[str], command: str,
                                                      problem: str, tmp_path: Path) -> None:
    p = _run(argv, cwd=tmp_path)
    assert (p.returncode, p.stderr, p.stdout) == (2, _usage(command, problem), "")
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_record_sizes_its_pool_from_kv_memory(tmp_path: Path) -> None:
    """The tiny model: 1 layer x 1 KV head x head dim 16 x float32 x (K, V) x 16 slots = 2 KiB
    a block, so 1 MiB holds 512 blocks (not --blocks' default)."""
    out = tmp_path / "kv.rcx"
    p = _run(["record", "--out", str(out), "--requests", "2", "--kv-memory", "1MiB"])
    assert p.returncode == 0, p.stderr
    reader = RecordingReader(out)
    try:
        assert reader.header.config["num_blocks"] == 512
    finally:
        reader.close()


def test_bench_engine_sizes_its_pool_from_kv_memory() -> None:
    """bench engine's model (the 2-layer seeded one): 2 x 2 x 16 x 4 x 2 x 16 = 8 KiB a
    block; a fraction needs a GPU's free memory, which a CPU run refuses in one line."""
    assert _kv_blocks(None, "auto", "1MiB") == 128
    assert _kv_blocks(None, "auto", "3GiB") == 3 * 2**30 // 8192


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU reports its free memory")
def test_bench_engine_refuses_a_fraction_without_a_gpu_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_:
        _kv_blocks(None, "auto", "0.5")
    assert (exit_.value.exit_code, capsys.readouterr().err) == (
        2, "error: --kv-memory as a fraction needs a device that reports free memory (a GPU); "
           "give a size such as 2GiB\n")


def test_demo_and_cluster_start_serve_with_the_kv_memory_given() -> None:
    proc = EngineProcess(16, model_args=model_args("tiny", "auto") + kv_memory_args("64MiB"))
    try:
        assert proc.command()[-2:] == ["--kv-memory", "64MiB"]
    finally:
        proc.stop()
    assert kv_memory_args(None) == ()
