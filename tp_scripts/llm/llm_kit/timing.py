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

`Timeline` keeps each section's start and end instead of their sum, in seconds from a common origin
(the start of the step), for a timeline drawing of what ran when:

    timeline = Timeline(device)
    timeline.start()
    with timeline.section(stage=0, microbatch=3, phase="fwd"):
        ...
    span_s, events = timeline.take()   # [{"stage": 0, "microbatch": 3, "phase": "fwd", "t_start": .., "t_end": ..}]
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


class Timeline:
    """Labelled sections with their start and end, relative to `start()`; read by `take()` after the step
    (on CUDA the clock is the GPU's: events recorded on the current stream)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._origin = self._end = None
        self._sections: list[tuple[dict, object, object]] = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _seconds(self, mark) -> float:
        if self.cuda:
            return self._origin.elapsed_time(mark) / 1000.0
        return mark - self._origin

    def start(self):
        self._origin, self._end, self._sections = self._now(), None, []

    def stop(self):
        self._end = self._now()

    @contextmanager
    def section(self, **labels):
        began = self._now()
        try:
            yield
        finally:
            self._sections.append((labels, began, self._now()))

    def take(self) -> tuple[float, list[dict]]:
        """(seconds from start() to stop(), the sections in the order they began)."""
        if self._origin is None:
            return 0.0, []
        end = self._end if self._end is not None else self._now()
        if self.cuda:
            end.synchronize()
        events = [{**labels, "t_start": self._seconds(began), "t_end": self._seconds(ended)}
                  for labels, began, ended in self._sections]
        span = self._seconds(end)
        self._origin, self._end, self._sections = None, None, []
        return span, events
