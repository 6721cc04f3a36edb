"""Which collectives a step issues and how many bytes each rank hands them, as PyTorch's dispatcher sees them.

Every collective of torch.distributed goes through the dispatcher as an op of the `c10d` namespace
(`_c10d_functional` when traced): DDP's bucketed all-reduces (issued by its C++ reducer), FSDP2's
all-gathers and reduce-scatters, ZeroRedundancyOptimizer's broadcasts, DTensor's redistributions,
the pipeline's sends and receives, the hand-written all-reduces of tp-scratch and context parallel.
CollectiveLog is a TorchDispatchMode (the hook torch's own CommDebugMode uses): each one reports
to it, with the bytes of the tensors this rank contributes.

    with CollectiveLog() as log:
        ... one training step (forward, backward, optimizer) ...
    log.summary()    # {"allreduce": {"calls": 2, "bytes": 868352}, "broadcast": {...}}

A dispatch mode adds a Python call to every operation of the step, so train_llm.py logs one step
(its first, left out of the timings) and never under --compile. The time spent communicating is
another matter: on a GPU only device-side events can time it (timing.py, tp-scratch's comm_s).
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACES = ("c10d", "_c10d_functional")
KINDS = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "broadcast", "alltoall", "all_to_all",
         "send", "recv", "gather", "scatter", "reduce")
# op -> index of the argument holding this rank's contribution (the rest: the first argument)
INPUT_ARGUMENT = {"_allgather_base_": 1, "allgather_": 1, "allgather_into_tensor_coalesced_": 1,
                  "_reduce_scatter_base_": 1, "reduce_scatter_": 1, "reduce_scatter_tensor_coalesced_": 1,
                  "alltoall_": 1, "alltoall_base_": 1}


def _tensor_bytes(value) -> int:
    if torch.is_tensor(value):
        local = value.to_local() if hasattr(value, "to_local") else value
        return local.numel() * local.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def kind(op_name: str) -> str | None:
    """'_allgather_base_' -> 'allgather', 'reduce_scatter_tensor' -> 'reduce_scatter', 'recv_' -> 'recv';
    None for what moves no data between ranks (waits, barriers, autograd wrappers)."""
    name = op_name.strip("_")
    for base in KINDS:
        if name.startswith(base):
            return base.replace("all_", "all")
    return None


class CollectiveLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # a DTensor: let it run, its collectives on plain tensors come back here
        if func.namespace in NAMESPACES:
            name = func.overloadpacket.__name__
            what = kind(name)
            if what is not None:
                position = INPUT_ARGUMENT.get(name, 0)
                self.calls[what] = self.calls.get(what, 0) + 1
                self.bytes[what] = self.bytes.get(what, 0) + (_tensor_bytes(args[position]) if len(args) > position else 0)
        return func(*args, **kwargs)

    def summary(self) -> dict:
        return {what: {"calls": self.calls[what], "bytes": self.bytes[what]} for what in sorted(self.calls)}
