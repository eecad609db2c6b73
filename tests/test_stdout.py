"""A standard output that cannot be written (issue 33 item 5): one line on stderr and exit 1,
for every command that prints, never an ``OSError`` traceback.

The real CLI in a subprocess whose stdout is /dev/full (every write fails with ``ENOSPC``), a
pipe whose read end was closed before the child started (every write fails with ``EPIPE``;
Python ignores SIGPIPE), or a closed descriptor 1 (``sys.stdout`` is None). Each case asserts
the exit status, stderr exactly (one line, so no second traceback from the interpreter's
flush at exit), and that nothing else was printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.serving.server import record_file
from radixcache.traffic.mooncake import write_mooncake
from radixcache.traffic.workloads import build_workload

ROOT = Path(__file__).resolve().parent.parent
FULL = "error: cannot write to standard output: No space left on device"
PIPE = "error: cannot write to standard output: Broken pipe (its reader has gone)"
CLOSED = "error: cannot write to standard output: the descriptor is closed"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("stdout")
    record_file(d / "chat.rcx", build_workload("chat", ["6", "--seed", "3"]), model=False,
                blocks=160, keyframe_every=200, step_requests=4)
    write_mooncake(d / "mc.jsonl", 300, 1)
    return {"REC": str(d / "chat.rcx"), "TRACE": str(d / "mc.jsonl"), "DIR": str(d)}


COMPILE_NOTE = "note: compiling the trace kernels (numba; once: cached on disk), 30-60 s\n"


def run_into(args: list[str], stdout: str) -> subprocess.CompletedProcess[str]:
    """``radixcache ARGS`` with its stdout ``full`` (/dev/full), ``pipe`` (a pipe no one
    reads) or ``closed`` (descriptor 1 closed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cli.main", *args]
    if stdout == "full":
        with open("/dev/full", "w") as full:
            return subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True,
                                  env=env, timeout=300, check=False)
    if stdout == "pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)  # before the child starts: its first write finds no reader
        try:
            return subprocess.run(cmd, stdout=write_end, stderr=subprocess.PIPE, text=True,
                                  env=env, timeout=300, check=False)
        finally:
            os.close(write_end)
    assert stdout == "closed"
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=300, check=False, preexec_fn=lambda: os.close(1))


COMMANDS = {
    "help": ["--help"],
    "whatif-json": ["whatif", "TRACE", "--json"],
    "whatif-table": ["whatif", "TRACE"],
    "whatif-why": ["whatif", "REC", "--why", "3"],
    "whatif-why-json": ["whatif", "REC", "--why", "3", "--json"],
    "tree": ["tree", "REC"],
    "export": ["export", "REC", "--out", "DIR/out.jsonl"],
    "doctor": ["doctor"],
    "command-help": ["whatif", "--help"],
}


@pytest.mark.parametrize("stdout", ["full", "pipe"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_failed_stdout_is_one_line_and_exit_1(files, name, stdout):
    args = [files.get(a, a) for a in COMMANDS[name]]
    args = [a.replace("DIR", files["DIR"]) for a in args]
    r = run_into(args, stdout)
    # whatif's first run in a fresh checkout compiles its kernels and says so first: a note
    # about the work ahead, not about the failure (it comes before any output is written)
    said = r.stderr.removeprefix(COMPILE_NOTE) if name.startswith("whatif") else r.stderr
    assert (r.returncode, said) == (1, (FULL if stdout == "full" else PIPE) + "\n"), \
        r.stderr[-2000:]


def test_a_closed_stdout_is_one_line_and_exit_1(files):
    r = run_into(["tree", files["REC"]], "closed")
    assert (r.returncode, r.stderr) == (1, CLOSED + "\n"), r.stderr[-2000:]


def test_an_error_with_a_closed_stdout_is_its_own_one_line(files):
    """Nothing was to be printed: the command's own error is the one line."""
    r = run_into(["export", files["REC"], "--out", files["DIR"]], "closed")
    assert (r.returncode, r.stderr) == (
        1, f"error: {files['DIR']}: a directory; refusing to write over it\n")


def test_an_export_to_a_full_device_says_so(files):
    """`export --out /dev/stdout` writes into the stream: its failure names the file."""
    r = run_into(["export", files["REC"], "--out", "/dev/stdout"], "full")
    assert (r.returncode, r.stderr) == (1, "error: /dev/stdout: No space left on device\n")
