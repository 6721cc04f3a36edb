"""Honest measurements for training loops: step times that keep the CPU/GPU overlap, peak memory, GPU energy.

On a GPU, kernels run asynchronously: the host queues the work of step k+1 while the device still
computes step k. A phase split read from the host clock is only true after a device synchronisation,
and every synchronisation takes that overlap away. So:

StepClock, the one step clock of every training script, times every step as a whole with CUDA events (no
synchronisation: the events are read back once the GPU has passed them) and splits a step into phases only on
a few *breakdown* steps, which synchronise at every phase boundary. On the CPU nothing is asynchronous: every
step is split. A script that reads every step's phases (train_llm.py) makes every step a breakdown step
(`breakdown_every=1`) and reads each step once it has stopped (`clock.finished()`).
"""
from __future__ import annotations

import resource
import sys
import time
from collections import deque
from dataclasses import dataclass, field


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
        import torch

        if sync is None:
            sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        if event is None and self.overlap:
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

    def finished(self) -> StepTiming:
        """The step just stopped, its timing known (waits for the device if it is behind): for a script that
        reads every step at once; the steps before it are dropped."""
        *_, timing = self.drain()
        return timing

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


def tf32_enabled(ops=("matmul", "conv")) -> bool:
    """Whether fp32 `ops` on CUDA may all use TF32 tensor cores: matrix products ("matmul", PyTorch's default no)
    and cuDNN convolutions ("conv", default yes). The classifier asks for both, train_llm.py (no convolution) for
    "matmul" only."""
    import torch

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(conv, "conv"):  # torch >= 2.9: per-backend precision
        allowed = {"matmul": matmul.fp32_precision == "tf32", "conv": conv.conv.fp32_precision == "tf32"}
    else:
        allowed = {"matmul": bool(matmul.allow_tf32), "conv": bool(conv.allow_tf32)}
    return all(allowed[op] for op in ops)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (host RAM), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024**2 if sys.platform == "darwin" else peak / 1024


def peak_gpu_memory_mb(device=None) -> float | None:
    import torch

    if device is None or getattr(device, "type", "cpu") != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1024**2


def nvml_handle(nvml, device):
    """NVML's handle for a CUDA device, found by the GPU's UUID (else its PCI bus id), never by the CUDA ordinal.

    CUDA numbers only the GPUs that CUDA_VISIBLE_DEVICES leaves visible, NVML every GPU of the machine: in a
    job given GPU 3 alone, cuda:0 is NVML's GPU 3, and nvmlDeviceGetHandleByIndex(0) would read another GPU
    (another job's, or the same GPU 0 for every rank of a one-GPU-per-task job).
    """
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:  # torch prints the bare 8-4-4-4-12 form; NVML names GPUs "GPU-<uuid>" and MIG slices "MIG-<uuid>"
        for name in ([uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(name)
            except Exception:
                pass
    if getattr(props, "pci_bus_id", None) is not None:
        bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    raise LookupError(f"NVML knows no GPU with the UUID or PCI bus id of cuda:{index}")


class EnergyMeter:
    """GPU energy and peak power of this process's GPU through NVML; every reading is None where NVML is
    absent (CPU, no driver, no permission, a GPU or MIG slice without an energy counter).

    The counter is the whole physical GPU's: `gpu_uuid` names it, so that a table sums energy once per GPU
    (not once per rank: two ranks on one GPU read the same counter).
    """

    def __init__(self, device=None):
        self._handle = None
        self.peak_power_w = None
        self.gpu_uuid = None
        self.unavailable = None  # why there is no reading on a GPU (null on the CPU: nothing to read)
        self._cuda = device is not None and getattr(device, "type", "cpu") == "cuda"
        if not self._cuda:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            handle = nvml_handle(pynvml, device)
            try:
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                self.gpu_uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except Exception:
                pass
            self._start_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self._handle = handle
        except Exception as error:  # no NVML library, no driver, no permission, no energy counter
            self.unavailable = f"{type(error).__name__}: {error}"[:200]

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

    def summary(self) -> dict:
        """The summary.json fields: energy in J and Wh, peak power, the GPU's UUID, and GPU-hours (this
        process held its GPU from its start until now; null on the CPU)."""
        from dlokit.in_job.runrecord import PROCESS_START

        energy = self.energy_j()
        return {"energy_j": energy, "energy_wh": energy / 3600 if energy is not None else None,
                "peak_power_w": self.peak_power_w, "gpu_uuid": self.gpu_uuid,
                "gpu_hours": (time.time() - PROCESS_START) / 3600 if self._cuda else None,
                "energy_unavailable": self.unavailable}
