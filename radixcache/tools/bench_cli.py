"""`radixcache bench cli`: how quick the front door is, measured as a user meets it.

Every figure runs the real console command in a fresh process (``python -m cli.main``):

- ``help_s``: ``radixcache --help``, the best of three wall times;
- ``tree_s``, ``tree_peak_mb``: ``radixcache tree FILE`` on a recording (the best of three; the
  peak resident memory of that process, from ``os.wait4``);
- ``demo_first_output_s``, ``demo_first_frame_s``, ``demo_live_s``, ``quit_s``: ``radixcache
  demo`` in a pseudo-terminal (120x40): the first byte on screen, the first frame of the
  inspector (its tree pane's title drawn), the header's ``● live``, and from the ``q`` key
  until the process (and its engine) is gone;
- ``record_progress``: whether ``radixcache record`` draws progress on a terminal;
- ``record_from_s``: ``radixcache record --from ENDPOINT --seconds 2`` against a peer whose
  batches keep the recorder busy past the deadline (``radixcache.tools.bench_record_from``);
- ``compiled``: the commands ran with the project compiled to bytecode beforehand, as an
  installed package is (``compile_project``); false: each start compiled what it imported;
- ``over_target``: the figures past their ``TARGETS`` (or never reached: -1), by name; empty
  when the front door met every target this run.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from radixcache.tools.bench_record_from import record_from_seconds

CLI = [sys.executable, "-m", "cli.main"]
TARGETS = {"help_s": 0.25, "tree_s": 0.5, "tree_peak_mb": 150.0, "demo_first_output_s": 1.0,
           "demo_first_frame_s": 3.0, "quit_s": 1.0, "record_from_s": 5.0}


class CliFigures(NamedTuple):
    """The figures of one run (seconds, megabytes); -1 where the step did not get there."""

    help_s: float
    tree_s: float
    tree_peak_mb: float
    tree_requests: int
    demo_first_output_s: float
    demo_first_frame_s: float
    demo_live_s: float
    quit_s: float
    record_progress: bool
    record_from_s: float
    load_avg_1m: float
    compiled: bool
    over_target: tuple[str, ...] = ()


def over_target(figures: CliFigures) -> tuple[str, ...]:
    """The figures past their target in ``TARGETS``, or not measured (-1) though targeted
    (a caller that skipped a step, ``--no-demo``, drops its names)."""
    values = figures._asdict()
    return tuple(name for name, target in TARGETS.items()
                 if values[name] > target or values[name] < 0)


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of ``argv`` run to its end, output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


def in_terminal(argv: list[str], until: list[bytes], timeout_s: float,
                keys: Callable[[int], bytes | None] = lambda _: None,
                ) -> tuple[dict[bytes, float], float]:
    """Run ``argv`` in a 120x40 pseudo-terminal; the seconds at which each of ``until`` first
    appeared in its output (``b""``: any byte), and when it exited (-1: killed at
    ``timeout_s``). ``keys(i)`` is typed once marker ``i`` was seen (then the exit is timed
    from that key)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True)
    os.close(slave)
    seen: dict[bytes, float] = {}
    out = b""
    exited, typed_at = -1.0, 0.0
    try:
        while time.perf_counter() - t0 < timeout_s:
            if proc.poll() is not None:
                exited = time.perf_counter() - (typed_at or t0)
                break
            if select.select([master], [], [], 0.02)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the terminal closed: the process is ending
                    continue
            for i, marker in enumerate(until):
                if marker not in seen and out and marker in out:
                    seen[marker] = time.perf_counter() - t0
                    key = keys(i)
                    if key is not None:
                        os.write(master, key)
                        typed_at = time.perf_counter()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return seen, exited


def load_avg() -> float:
    """The 1-minute load average (timings on a shared machine need it beside them)."""
    return os.getloadavg()[0]


def measure_demo(timeout_s: float = 120.0) -> tuple[float, float, float, float]:
    """(first output, first frame, live, quit) seconds of ``radixcache demo``."""
    markers = [b"", b"tree (", "● live".encode()]
    seen, exited = in_terminal([*CLI, "demo"], markers, timeout_s,
                               keys=lambda i: b"q" if i == 2 else None)
    return (seen.get(markers[0], -1.0), seen.get(markers[1], -1.0),
            seen.get(markers[2], -1.0), exited)


def record_draws_progress(out: Path) -> bool:
    """``record`` on a terminal: does its progress bar appear?"""
    argv = [*CLI, "record", "--workload", "tot", "--requests", "120", "--out", str(out)]
    seen, _ = in_terminal(argv, [b"recording"], 120.0)
    return b"recording" in seen


def record_figures(tmp: Path) -> tuple[bool, float]:
    """``record_progress`` and ``record_from_s``, with their files in ``tmp``."""
    return (record_draws_progress(tmp / "tot.rcx"),
            record_from_seconds(tmp / "busy.rcx", CLI))


def tree_recording(out: Path, requests: int) -> Path:
    """A recording of ``requests`` chat requests (``record`` with its defaults)."""
    argv = [*CLI, "record", "--workload", "chat", "--requests", str(requests), "--out", str(out)]
    timed(argv)
    return out


def best(runs: int, argv: list[str]) -> tuple[float, float]:
    """The best wall time of ``runs`` and the peak memory of that run."""
    return min(timed(argv) for _ in range(runs))


def compile_project(cache: Path) -> bool:
    """Compile the project's packages into ``cache`` and point every command run from here on
    at it (``PYTHONPYCACHEPREFIX``), as pip compiles a package it installs. Without it, a
    checkout run under ``PYTHONDONTWRITEBYTECODE`` (CI, sandboxes) compiled every module a
    command imports on each start: 0.1-0.4 s of `tree FILE` that no installed user pays.
    Returns whether it compiled (False: the commands compile as they start)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                           *(str(root / pkg) for pkg in ("cli", "inspector", "radixcache"))],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False)
    if done.returncode != 0:
        return False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    return True
