"""The watermark source: device memory from NVML when a driver is there, else pool figures.

``MemorySource`` opens NVML once. When it cannot (no ``pynvml``, no driver library, no such
device) it says why in every sample's ``nvml_error`` -- e.g. ``"NVML unavailable:
NVMLError_LibraryNotFound: NVML Shared Library Not Found"`` -- and still reports the process,
torch and pool figures. Nothing here raises because a GPU or its driver is missing.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from importlib import import_module
from typing import Protocol

import torch

NVML_UNAVAILABLE = "NVML unavailable:"


class NvmlMemoryInfo(Protocol):
    """What ``nvmlDeviceGetMemoryInfo`` returns (bytes)."""

    used: int
    total: int


class NvmlModule(Protocol):
    """The part of ``pynvml`` (package nvidia-ml-py) this module calls."""

    def nvmlInit(self) -> None:  # NVML's own names
        """Load the driver library."""

    def nvmlShutdown(self) -> None:
        """Release the driver library."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        """An opaque handle of device ``index``."""

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> NvmlMemoryInfo:
        """Used and total device memory."""

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        """The device's marketing name (bytes in old versions)."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading. Device fields are None when NVML is unavailable (``nvml_error`` says why).

    ``torch_allocated_bytes`` is ``torch.cuda.memory_allocated`` when the pool lives on a
    CUDA device, else the pool tensor's bytes as passed to ``sample``.
    """

    ts: float  # time.time()
    device_used_bytes: int | None
    device_total_bytes: int | None
    device_name: str | None
    nvml_error: str | None
    process_rss_bytes: int | None
    torch_allocated_bytes: int
    pool_used_blocks: int
    pool_total_blocks: int


def _describe(err: BaseException) -> str:
    """``TypeName: message`` (just the type when the message is empty)."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def process_rss_bytes() -> int | None:
    """Resident set size of this process now (Linux ``/proc``), else its peak, else None."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024


class MemorySource:
    """Samples device, process, torch and pool memory. Not thread-safe: one sampler owns it.

    ``nvml`` is the NVML module to use (``pynvml`` by default, imported here); tests pass an
    object with the same functions. ``device`` is where the pool tensor lives.
    """

    def __init__(
        self,
        device_index: int = 0,
        device: torch.device | str = "cpu",
        nvml: NvmlModule | None = None,
    ) -> None:
        self.device_index = device_index
        self.device = torch.device(device)
        self._nvml: NvmlModule | None = None
        self._handle: object = None
        self.device_name: str | None = None
        self.nvml_error: str | None = None
        self._open(nvml)

    def _open(self, nvml: NvmlModule | None) -> None:
        """Init NVML and find the device; on any failure keep the reason in ``nvml_error``."""
        try:
            module: NvmlModule = nvml if nvml is not None else import_module("pynvml")
        except ImportError as err:
            self.nvml_error = f"{NVML_UNAVAILABLE} pynvml not installed ({_describe(err)})"
            return
        try:
            module.nvmlInit()
        except Exception as err:  # NVMLError_* or a broken library: report it
            self.nvml_error = f"{NVML_UNAVAILABLE} {_describe(err)}"
            return
        self._nvml = module
        try:
            self._handle = module.nvmlDeviceGetHandleByIndex(self.device_index)
            name = module.nvmlDeviceGetName(self._handle)
        except Exception as err:
            self.nvml_error = f"{NVML_UNAVAILABLE} device {self.device_index}: {_describe(err)}"
            self.close()
            return
        self.device_name = name.decode() if isinstance(name, bytes) else name

    @property
    def nvml_available(self) -> bool:
        """True while NVML is open on the device."""
        return self._nvml is not None

    def _device_memory(self) -> tuple[int | None, int | None, str | None]:
        """(used, total, error) from NVML; a read failure is reported, not raised."""
        if self._nvml is None:
            return None, None, self.nvml_error
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as err:
            return None, None, f"NVML read failed: {_describe(err)}"
        return int(info.used), int(info.total), None

    def _torch_allocated(self, pool_bytes: int) -> int:
        if self.device.type == "cuda" and torch.cuda.is_available():
            return int(torch.cuda.memory_allocated(self.device))
        return pool_bytes

    def sample(self, pool_used: int, pool_total: int, pool_bytes: int) -> MemorySample:
        """Read every figure now. ``pool_used``/``pool_total`` are blocks, ``pool_bytes`` the
        pool tensor's size. Never raises for a missing or failing driver."""
        used, total, error = self._device_memory()
        return MemorySample(
            ts=time.time(),
            device_used_bytes=used,
            device_total_bytes=total,
            device_name=self.device_name,
            nvml_error=error,
            process_rss_bytes=process_rss_bytes(),
            torch_allocated_bytes=self._torch_allocated(pool_bytes),
            pool_used_blocks=pool_used,
            pool_total_blocks=pool_total,
        )

    def close(self) -> None:
        """Shut NVML down (once); later samples report NVML as closed. Idempotent."""
        if self._nvml is None:
            return
        module, self._nvml = self._nvml, None
        if self.nvml_error is None:
            self.nvml_error = f"{NVML_UNAVAILABLE} closed"
        with suppress(Exception):  # shutting down: nothing left to report to
            module.nvmlShutdown()

    def __enter__(self) -> MemorySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
