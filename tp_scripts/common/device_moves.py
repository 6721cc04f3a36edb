"""Which tensors the script moved with .to(device) (or .cuda()), for TP1.1's check.

On a CPU-only run the weights and batches are on the device whether or not the script moves them, so where a
tensor lives cannot judge the TODO there; the call itself can. A TorchFunctionMode sees every Tensor.to, the
ones nn.Module.to makes for each parameter included, without touching the student's code.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

MOVES = (torch.Tensor.to, torch.Tensor.cuda)


class DeviceMoves(TorchFunctionMode):
    """While active, keeps each tensor given to .to(<a device>) or .cuda(); `moved(tensors)` asks about them."""

    def __init__(self):
        super().__init__()
        self.sources = {}  # id -> tensor: kept alive so that no other tensor gets its id

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda or (func is torch.Tensor.to and
                                         torch._C._nn._parse_to(*args[1:], **kwargs)[0] is not None):
            self.sources[id(args[0])] = args[0]
        return func(*args, **kwargs)

    def moved(self, tensors) -> bool:
        """Whether every one of `tensors` was moved to a device while this was active."""
        tensors = list(tensors)
        return bool(tensors) and all(id(t) in self.sources for t in tensors)

    def forget(self) -> None:
        """Let the first batch go (asked about once, by the first step)."""
        self.sources.clear()
