"""What a training step holds in tensors, counted from the tensors themselves (not the process's RSS).

    meter = TensorMemory(model, optimizer)
    meter.start()              # before the forward pass: autograd's saved tensors are counted from here
    loss = criterion(model(images), labels)
    loss.backward()
    meter.after_backward()     # the gradients, before the next zero_grad
    optimizer.step()
    meter.stop()               # the weights and the optimizer's states; the hooks are removed
    meter.mib()                # {"saved_mib", "activations_mib", "weight_copies_mib", "params_mib", "grads_mib",
                               #  "optimizer_mib", "held_mib", "device_peak_mib"}

or `with meter.step(): ...` around the whole step (then the gradients are read at its end).

- saved_mib: the peak of what autograd keeps for backward (torch.autograd.graph.saved_tensors_hooks), each
  storage once, weights and buffers left out. It grows with the batch, image by image. Under autocast it also
  holds the weights' 16-bit copies, which do not grow with the batch: weight_copies_mib (saved tensors cast from a
  parameter), and activations_mib = saved_mib - weight_copies_mib, at the peak.
- params_mib, grads_mib, optimizer_mib: the model's weights, their gradients, the optimizer's states (momentum,
  Adam's m and v); each storage once. They do not depend on the batch.
- held_mib: their sum, what the step holds in tensors.
- device_peak_mib: on a GPU, torch.cuda.max_memory_allocated since the process started (or since your last
  torch.cuda.reset_peak_memory_stats): everything, workspaces included; None on a CPU.

A host process's peak RSS holds the interpreter and the libraries too (~760 MiB here) and moves by tens of MiB
from run to run: at Day 1's sizes the activations hide in it. These counts are exact and the same every run.
Inside torch.utils.checkpoint (non-reentrant) its own hooks take over: what it keeps is not counted here.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

MIB = 2**20


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def bytes_once(tensors) -> int:
    """Bytes of the storages behind these tensors, each storage once (tied weights, views of one buffer)."""
    seen = {}
    for tensor in tensors:
        if torch.is_tensor(tensor) and not tensor.is_meta:
            key, size = _storage(tensor)
            if key:  # 0: an empty storage
                seen[key] = size
    return sum(seen.values())


def optimizer_states(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its partition's in .optim
    return [value for state in inner.state.values() for value in state.values() if torch.is_tensor(value)]


class SavedTensors:
    """saved_tensors_hooks that count the bytes autograd holds for backward while they are alive, each storage
    once; `peak` is the most held at one time."""

    def __init__(self, skip: set[int]):
        self.skip = skip  # the storages of the weights and buffers: saved by reference, they cost nothing more
        self.refs: dict[int, int] = {}
        self.live = self.peak = 0
        self.live_copies = self.copies_at_peak = 0  # of which autocast's copies of the weights

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor):
        if isinstance(tensor, nn.Parameter) or tensor.is_meta:
            return tensor
        key, size = _storage(tensor)
        if not key or key in self.skip:
            return tensor
        return _Held(tensor, self, key, size, copy=_weight_copy(tensor))

    def hold(self, key: int, size: int, copy: bool = False) -> None:
        count = self.refs.get(key, 0)
        self.refs[key] = count + 1
        if count == 0:
            self.live += size
            self.live_copies += size if copy else 0
            if self.live > self.peak:
                self.peak, self.copies_at_peak = self.live, self.live_copies

    def release(self, key: int, size: int, copy: bool = False) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= size
            self.live_copies -= size if copy else 0


def _weight_copy(tensor: torch.Tensor) -> bool:
    """A tensor cast from a parameter (autocast's 16-bit copy of a weight, or a view of it such as a linear layer's
    transposed weight): its gradient goes straight to the leaf."""
    fn = (tensor._base if tensor._base is not None else tensor).grad_fn
    return fn is not None and fn.name() == "ToCopyBackward0" and any(
        type(next_fn).__name__ == "AccumulateGrad" for next_fn, _ in fn.next_functions if next_fn is not None)


class _Held:
    """A saved tensor, counted until autograd lets it go (after its backward, or with the graph)."""

    __slots__ = ("tensor", "counter", "key", "size", "copy")

    def __init__(self, tensor, counter, key, size, copy=False):
        self.tensor, self.counter, self.key, self.size, self.copy = tensor, counter, key, size, copy
        counter.hold(key, size, copy)

    def __del__(self):
        self.counter.release(self.key, self.size, self.copy)


def _unpack(packed):
    return packed.tensor if isinstance(packed, _Held) else packed


class TensorMemory:
    """One step's tensors: start() ... after_backward() ... stop(), then mib()."""

    def __init__(self, model: nn.Module, optimizer=None):
        self.model, self.optimizer = model, optimizer
        self.result: dict = {}
        self._counter = self._hooks = None

    def start(self) -> None:
        self.result = {}
        skip = {_storage(t)[0] for t in [*self.model.parameters(), *self.model.buffers()]}
        self._counter = SavedTensors(skip)
        self._hooks = self._counter.hooks()
        self._hooks.__enter__()

    def after_backward(self) -> None:
        self.result["grads"] = bytes_once(p.grad for p in self.model.parameters())

    def stop(self) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        device = next(self.model.parameters()).device
        self.result.setdefault("grads", bytes_once(p.grad for p in self.model.parameters()))
        self.result.update(
            saved=self._counter.peak, weight_copies=self._counter.copies_at_peak,
            params=bytes_once(self.model.parameters()),
            optimizer=bytes_once(optimizer_states(self.optimizer)) if self.optimizer is not None else 0,
            device_peak=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)

    @property
    def active(self) -> bool:
        """Between start() and stop()."""
        return self._hooks is not None

    @contextmanager
    def step(self):
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def mib(self) -> dict:
        """The last step's counts in MiB (None before a step has stopped)."""
        if "saved" not in self.result:
            return dict.fromkeys(("saved_mib", "activations_mib", "weight_copies_mib", "params_mib", "grads_mib",
                                  "optimizer_mib", "held_mib", "device_peak_mib"))
        r = self.result
        held = r["saved"] + r["params"] + r["grads"] + r["optimizer"]
        return {"saved_mib": r["saved"] / MIB, "activations_mib": (r["saved"] - r["weight_copies"]) / MIB,
                "weight_copies_mib": r["weight_copies"] / MIB,
                "params_mib": r["params"] / MIB, "grads_mib": r["grads"] / MIB,
                "optimizer_mib": r["optimizer"] / MIB, "held_mib": held / MIB,
                "device_peak_mib": r["device_peak"] / MIB if r["device_peak"] is not None else None}
