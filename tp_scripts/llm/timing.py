"""Time spent inside some sections of a step, on the clock of the device that does the work.

On a GPU the host only queues kernels and collectives: a host timer around `dist.all_reduce`
measures the queuing, not the all-reduce. So on CUDA each section is bracketed by two CUDA events
recorded on the current stream, and the events are read once the step has been synchronised
(`take()` after the step's `torch.cuda.synchronize`). On the CPU every operation (gloo's
collectives included, when not `async_op`) has finished when the call returns: a host timer is right.

    timer = SectionTimer(device)
    with timer.section():
        dist.all_reduce(x)
    ...                                # end of the step, after synchronising
    seconds = timer.take()             # the sum since the last take()
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class SectionTimer:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._events: list[tuple] = []
        self._host_s = 0.0
        self.count = 0

    @contextmanager
    def section(self):
        self.count += 1
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((start, end))
        else:
            began = time.perf_counter()
            try:
                yield
            finally:
                self._host_s += time.perf_counter() - began

    def take(self) -> float:
        """Seconds spent in sections since the last take(). On CUDA this waits for the last event
        (free when the step has already been synchronised)."""
        if self.cuda:
            if self._events:
                self._events[-1][1].synchronize()
            total = sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
            self._events = []
        else:
            total, self._host_s = self._host_s, 0.0
        return total
