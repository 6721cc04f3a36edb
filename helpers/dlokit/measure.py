"""Honest measurements for training loops: step times that keep the CPU/GPU overlap, peak memory, GPU energy.

On a GPU, kernels run asynchronously: the host queues the work of step k+1 while the device still
computes step k. A phase split read from the host clock is only true after a device synchronisation,
and every synchronisation takes that overlap away. So:

* StepClock times every step as a whole with CUDA events (no synchronisation: the events are read back
  once the GPU has passed them) and splits a step into phases only on a few *breakdown* steps, which
  synchronise at every phase boundary. On the CPU nothing is asynchronous: every step is split.
* StepTimer splits every step, synchronising at every split (simple, but it serialises the host and
  the device: kept for scripts that want that).
"""
from __future__ import annotations

import resource
import sys
import time
from collections import deque
from dataclasses import dataclass, field


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


@dataclass
class StepTiming:
    """One step as StepClock measured it; `t_step` is known once `done` is true."""

    step: int
    breakdown: bool                              # split into phases (synchronised on a GPU)
    splits: dict = field(default_factory=dict)   # seconds per phase; only "data" on an overlapped step
    t_step: float | None = None                  # compute: from the batch in hand to the end of the step
    t_period: float | None = None                # end of the previous step to the end of this one (GPU clock)
    after_breakdown: bool = False                # the previous step synchronised: this period lost its overlap
    info: dict = field(default_factory=dict)     # whatever the caller wants to keep with the step
    done: bool = False
    _events: tuple = ()


class StepClock:
    """Step times without taking the CPU/GPU overlap away.

        clock.start(step)        # before fetching the batch
        clock.split("data")      # host time spent waiting for the batch (every step)
        clock.split("forward")   # a phase boundary: timed (after a synchronisation) on breakdown steps only
        clock.stop(info)         # end of the step
        for timing in clock.ready(): ...   # finished steps, in order (drain() waits for all)

    On a GPU (overlap=True) an ordinary step costs no synchronisation: two CUDA events mark the batch in
    hand and the end of the step, and are read back later, once the GPU has passed them (event.query()).
    `t_step` is the GPU time between them, `t_period` the GPU time between the ends of two consecutive
    steps (the real pace of training, waits for data included). A breakdown step (the first timed one,
    `first_breakdown`, then every `breakdown_every`-th) synchronises before its first phase and at every
    phase boundary: its splits are true, and it runs without overlap.

    On the CPU (overlap=False) every step is a breakdown step; synchronising costs nothing there.
    `sync` and `event` can be replaced (tests count synchronisations with fakes).
    """

    def __init__(self, device=None, *, breakdown_every: int = 10, first_breakdown: int | None = None,
                 overlap: bool | None = None, sync=None, event=None, now=time.perf_counter, max_pending: int = 32):
        cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
        self.overlap = cuda if overlap is None else overlap
        if sync is None:
            import torch

            sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        if event is None and self.overlap:
            import torch

            event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self._sync, self._event, self._now = sync, event, now
        self.breakdown_every, self.first_breakdown = max(1, breakdown_every), first_breakdown
        self.max_pending = max_pending
        self.current: StepTiming | None = None
        self._pending: deque[StepTiming] = deque()
        self._previous_end = None          # end event of the previous step, for t_period
        self._previous_breakdown = False
        self._last = 0.0

    def is_breakdown(self, step: int) -> bool:
        return not self.overlap or step == self.first_breakdown or step % self.breakdown_every == 0

    def start(self, step: int) -> None:
        self.current = StepTiming(step, self.is_breakdown(step), after_breakdown=self._previous_breakdown)
        if self.current.breakdown and self.overlap:
            self._sync()  # nothing of the previous steps still running: the splits are this step's alone
        self._last = self._now()

    def split(self, name: str) -> None:
        timing = self.current
        if name != "data" and not timing.breakdown:
            return  # an overlapped step: no synchronisation, no split
        if name != "data" and self.overlap:
            self._sync()
        now = self._now()
        timing.splits[name] = timing.splits.get(name, 0.0) + now - self._last
        self._last = now
        if name == "data" and self.overlap:
            begin = self._event()
            begin.record()  # the GPU passes it once the previous step's work is done (or at once, if idle)
            timing._events = (begin,)

    def stop(self, info: dict | None = None) -> StepTiming:
        timing, self.current = self.current, None
        timing.info = info or {}
        self._previous_breakdown = timing.breakdown and self.overlap
        if not self.overlap:
            timing.t_step = sum(seconds for name, seconds in timing.splits.items() if name != "data")
            timing.done = True
        else:
            end = self._event()
            end.record()
            begin = timing._events[0] if timing._events else end  # no "data" split: no compute window
            timing._events = (begin, end, self._previous_end)
            self._previous_end = end
        self._pending.append(timing)
        if len(self._pending) > self.max_pending:  # the GPU is far behind: wait for it once, not every step
            self._sync()
        return timing

    def interrupt(self) -> None:
        """Work outside the steps happened (validation, a checkpoint): the next step gets no t_period."""
        self._previous_end = None

    def _resolve(self, timing: StepTiming) -> None:
        if self.overlap:
            begin, end, previous = timing._events
            gpu_step = begin.elapsed_time(end) / 1000  # milliseconds -> seconds
            timing.t_step = (sum(s for name, s in timing.splits.items() if name != "data")
                             if timing.breakdown else gpu_step)
            timing.t_period = previous.elapsed_time(end) / 1000 if previous is not None else None
            timing._events = ()
        timing.done = True

    def ready(self):
        """The finished steps, oldest first, without waiting for the device."""
        while self._pending and (self._pending[0].done or self._pending[0]._events[1].query()):
            timing = self._pending.popleft()
            if not timing.done:
                self._resolve(timing)
            yield timing

    def drain(self):
        """Every step still pending, after one wait for the device if some are not finished."""
        if any(not t.done and not t._events[1].query() for t in self._pending):
            self._sync()
        yield from self.ready()


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
