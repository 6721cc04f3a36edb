"""Honest measurements for training loops: synchronised step splits, peak memory, GPU energy.

On GPU, kernels run asynchronously, so a split is only true if the device is synchronised before
the clock is read. StepTimer does that for you (and nothing on CPU).
"""
from __future__ import annotations

import resource
import sys
import time


class StepTimer:
    """Split one training step into named phases: timer.start(); ...; timer.split("forward") ..."""

    def __init__(self, device=None):
        import torch

        cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
        self._sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        self._last = None
        self.splits: dict[str, float] = {}

    def start(self) -> None:
        self._sync()
        self._last = time.perf_counter()
        self.splits = {}

    def split(self, name: str) -> float:
        self._sync()
        now = time.perf_counter()
        elapsed = now - self._last
        self.splits[name] = self.splits.get(name, 0.0) + elapsed
        self._last = now
        return elapsed


def peak_rss_mb() -> float:
    """Peak resident memory of this process (host RAM), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024**2 if sys.platform == "darwin" else peak / 1024


def peak_gpu_memory_mb(device=None) -> float | None:
    import torch

    if device is None or getattr(device, "type", "cpu") != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1024**2


class EnergyMeter:
    """GPU energy and peak power through NVML; every reading is None where NVML is absent (CPU)."""

    def __init__(self, device=None):
        self._handle = None
        self.peak_power_w = None
        if device is None or getattr(device, "type", "cpu") != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else 0
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._start_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception:  # no NVML library, no permission, or an old GPU without energy counters
            self._handle = None

    def sample_power(self) -> float | None:
        if self._handle is None:
            return None
        try:
            watts = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000
        except Exception:
            return None
        self.peak_power_w = max(self.peak_power_w or 0.0, watts)
        return watts

    def energy_j(self) -> float | None:
        if self._handle is None:
            return None
        try:
            return (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start_mj) / 1000
        except Exception:
            return None
