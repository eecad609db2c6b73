"""The watermark source: honest NVML status, device figures through a fake NVML module."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest

from radixcache.serving.memory import MemorySample, MemorySource, process_rss_bytes

GiB = 2**30


def _statm_rss() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class FakeNVMLError(Exception):
    """Stands for pynvml's NVMLError_* classes."""


@dataclass
class FakeMemoryInfo:
    used: int
    total: int


class FakeNvml:
    """A stand-in for the ``pynvml`` module: same function names, scripted answers."""

    def __init__(self, name: str | bytes = "NVIDIA H200", fail: str = "") -> None:
        self.name = name
        self.fail = fail  # "init", "handle" or "memory": which call raises
        self.used = 3 * GiB
        self.total = 140 * GiB
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail == "init":
            raise FakeNVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        self.calls.append(f"handle {index}")
        if self.fail == "handle":
            raise FakeNVMLError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> FakeMemoryInfo:
        self.calls.append(f"memory {handle}")
        if self.fail == "memory":
            raise FakeNVMLError("GPU is lost")
        return FakeMemoryInfo(self.used, self.total)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        self.calls.append(f"name {handle}")
        return self.name


def _real_nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_without_a_driver_the_reason_is_reported_and_pool_figures_kept() -> None:
    if _real_nvml_works():
        pytest.skip("this machine has an NVML driver: the unavailable path does not apply")
    before = _statm_rss()
    with MemorySource() as source:
        assert source.nvml_available is False
        assert source.nvml_error == (
            "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
        )
        sample = source.sample(pool_used=37, pool_total=512, pool_bytes=8 * 2**20)
    after = _statm_rss()
    assert isinstance(sample, MemorySample)
    assert sample.nvml_error is not None
    assert sample.nvml_error.startswith("NVML unavailable:")
    assert (sample.device_used_bytes, sample.device_total_bytes, sample.device_name) == (
        None, None, None
    )
    assert (sample.pool_used_blocks, sample.pool_total_blocks) == (37, 512)
    assert sample.torch_allocated_bytes == 8 * 2**20
    assert sample.process_rss_bytes is not None
    assert before - 16 * 2**20 <= sample.process_rss_bytes <= after + 16 * 2**20


def test_process_rss_reads_proc_statm() -> None:
    rss = process_rss_bytes()
    assert rss is not None
    assert abs(rss - _statm_rss()) <= 4 * 2**20


def test_fake_nvml_gives_device_used_and_total() -> None:
    fake = FakeNvml()
    source = MemorySource(device_index=1, nvml=fake)
    assert source.nvml_available is True
    assert source.device_name == "NVIDIA H200"
    first = source.sample(1, 2, 3)
    fake.used = 5 * GiB
    second = source.sample(1, 2, 3)
    assert (first.device_used_bytes, first.device_total_bytes) == (3 * GiB, 140 * GiB)
    assert second.device_used_bytes == 5 * GiB
    assert (second.nvml_error, second.device_name) == (None, "NVIDIA H200")
    assert second.ts >= first.ts
    source.close()
    source.close()
    assert fake.calls == [
        "init",
        "handle 1",
        "name ('handle', 1)",
        "memory ('handle', 1)",
        "memory ('handle', 1)",
        "shutdown",
    ]
    closed = source.sample(1, 2, 3)
    assert (closed.device_used_bytes, closed.nvml_error) == (None, "NVML unavailable: closed")


def test_old_pynvml_bytes_names_are_decoded() -> None:
    with MemorySource(nvml=FakeNvml(name=b"Tesla T4")) as source:
        assert source.sample(0, 1, 0).device_name == "Tesla T4"


def test_init_failure_is_reported_not_raised() -> None:
    fake = FakeNvml(fail="init")
    source = MemorySource(nvml=fake)
    sample = source.sample(4, 8, 16)
    assert sample.nvml_error == "NVML unavailable: FakeNVMLError: Driver Not Loaded"
    assert (sample.device_used_bytes, sample.pool_used_blocks, sample.torch_allocated_bytes) == (
        None, 4, 16
    )
    source.close()
    assert fake.calls == ["init"]


def test_missing_device_shuts_nvml_down_and_says_which() -> None:
    fake = FakeNvml(fail="handle")
    source = MemorySource(device_index=3, nvml=fake)
    assert source.nvml_error == "NVML unavailable: device 3: FakeNVMLError: Invalid Argument"
    assert source.sample(0, 1, 0).device_total_bytes is None
    assert fake.calls == ["init", "handle 3", "shutdown"]


def test_read_failure_is_reported_per_sample() -> None:
    fake = FakeNvml(fail="memory")
    with MemorySource(nvml=fake) as source:
        sample = source.sample(0, 1, 0)
        assert sample.nvml_error == "NVML read failed: FakeNVMLError: GPU is lost"
        assert sample.device_name == "NVIDIA H200"
        fake.fail = ""
        assert source.sample(0, 1, 0).device_used_bytes == 3 * GiB


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sample = MemorySource().sample(0, 1, 0)
    assert sample.nvml_error == (
        "NVML unavailable: pynvml not installed "
        "(ModuleNotFoundError: import of pynvml halted; None in sys.modules)"
    )
