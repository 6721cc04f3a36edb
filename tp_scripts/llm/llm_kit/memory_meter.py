"""What one rank really holds, measured from the tensors themselves (not from the process's RSS).

    meter = MemoryMeter(modules, optimizer, device)
    with meter.forward():                  # activations: what autograd saves for backward
        loss = loss_fn(model(x), y)
    loss.backward()
    meter.after_backward()                 # gradients, before zero_grad
    optimizer.step()
    meter.after_step()                     # parameters, optimizer states
    meter.bytes()  -> {"params", "grads", "optimizer", "activations_peak", "gathered_params_peak", ...}

- params, grads, optimizer: bytes of this rank's tensors; a DTensor counts its local shard only
  (to_local()), ZeroRedundancyOptimizer its own partition's states. Each storage once.
- activations_peak: autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks), counted
  while they are alive, each storage once, parameters and buffers left out; the peak over the step
  (under 1F1B some micro-batches' activations are freed before others are saved). Under activation
  checkpointing the saved tensors of a block are not kept: its input is, and is counted.
- gathered_params_peak: FSDP only, weights all-gathered and alive at once, looked at inside each
  block's forward and backward: the root's and one or two blocks' when resharding after forward,
  every block's when not.
- device_peak (GPU only): torch.cuda.max_memory_allocated over the step, everything included.

Under DeepSpeed (train_deepspeed.py) the same counts come from where its engine keeps them (DeepSpeedMemory):
- params: the weights' storages (ZeRO-1/2: whole, in one flat buffer), and under ZeRO-3 each weight's partition
  (`param.ds_tensor`; the weight itself is an empty tensor between its uses).
- grads: the peak, during backward, of the gradients alive (`param.grad`) and of the ZeRO optimizer's gradient
  buffers: the attributes DeepSpeed names *grad* or *ipg* (its reduce buckets, `averaged_gradients`, ZeRO-3's
  partitions). ZeRO-1 reduces every gradient at the end of backward, ZeRO-2 bucket by bucket as they come: their
  peaks differ, what both keep for the step (this rank's partition) does not.
- optimizer: AdamW's m and v (the inner torch optimizer's state) and DeepSpeed's fp32 master copy of this rank's
  partition (attributes named *fp32*), which ZeRO keeps even when the model trains in fp32; optimizer_offloaded:
  those of them on the host while the model is on a GPU (`offload_optimizer: cpu`).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _storage_key_and_bytes(tensor: torch.Tensor) -> tuple[int, int]:
    storage = _local(tensor).untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def bytes_once(tensors) -> int:
    """Bytes of the storages behind these tensors, each storage once (tied weights, bucket views)."""
    seen = {}
    for tensor in tensors:
        if tensor is not None and torch.is_tensor(tensor) and not _local(tensor).is_meta:
            key, size = _storage_key_and_bytes(tensor)
            if key:  # 0: an empty storage
                seen[key] = size
    return sum(seen.values())


def parameters(modules):
    return [p for module in modules for p in module.parameters()]


def optimizer_states(optimizer) -> list[torch.Tensor]:
    """The state tensors this rank keeps: ZeroRedundancyOptimizer keeps its partition in `.optim`."""
    inner = getattr(optimizer, "optim", optimizer)
    return [value for state in inner.state.values() for value in state.values() if torch.is_tensor(value)]


class SavedTensorCounter:
    """saved_tensors_hooks that count the bytes autograd holds for backward, live, storage by storage."""

    def __init__(self, skip: set[int]):
        self.skip = skip  # storages of parameters and buffers
        self.refs: dict[int, int] = {}
        self.live = self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor):
        base = tensor._base if tensor._base is not None else tensor
        if isinstance(base, nn.Parameter) or not tensor.is_floating_point():
            return tensor
        key, size = _storage_key_and_bytes(tensor)
        if key in self.skip or not key:
            return tensor
        return _Held(tensor, self, key, size)

    def hold(self, key: int, size: int) -> None:
        count = self.refs.get(key, 0)
        self.refs[key] = count + 1
        if count == 0:
            self.live += size
            self.peak = max(self.peak, self.live)

    def release(self, key: int, size: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= size


class _Held:
    """A saved tensor, counted until autograd frees it (after its backward, or with the graph)."""

    __slots__ = ("tensor", "counter", "key", "size")

    def __init__(self, tensor, counter, key, size):
        self.tensor, self.counter, self.key, self.size = tensor, counter, key, size
        counter.hold(key, size)

    def __del__(self):
        self.counter.release(self.key, self.size)


def _unpack(packed):
    return packed.tensor if isinstance(packed, _Held) else packed


def _blocks(modules):
    return [block for module in modules for block in getattr(getattr(module, "module", module), "layers", {}).values()]


class MemoryMeter:
    def __init__(self, modules, optimizer, device, checkpointed: bool = False, fsdp: bool = False):
        self.modules, self.optimizer, self.device = modules, optimizer, device
        self.checkpointed, self.fsdp = checkpointed, fsdp
        self.sharded_ids = {id(p) for p in parameters(modules)}
        self.result: dict = {}
        self.gathered_peak = 0
        self._counter = SavedTensorCounter(set())

    def _gathered_now(self) -> int:
        """Weights FSDP has swapped in (all-gathered) right now: parameters that are not the sharded ones."""
        gathered = [p for m in self.modules for sub in m.modules() for p in sub.parameters(recurse=False)
                    if id(p) not in self.sharded_ids]
        return bytes_once(gathered)

    @contextmanager
    def forward(self):
        """Count the activations of the forward pass(es) run inside, until autograd frees them."""
        skip = {_storage_key_and_bytes(t)[0] for t in [*parameters(self.modules),
                                                       *(b for m in self.modules for b in m.buffers())]}
        self._counter = counter = SavedTensorCounter(skip)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with ExitStack() as stack:
            for block in _blocks(self.modules):
                if self.checkpointed:  # the checkpoint keeps each block's input, outside autograd's hooks
                    stack.enter_context(_keep_inputs(block, counter))
                if self.fsdp:
                    stack.enter_context(_each_forward(block, self._note_gathered))
            stack.enter_context(counter.hooks())
            yield

    def _note_gathered(self):
        self.gathered_peak = max(self.gathered_peak, self._gathered_now())

    def after_backward(self) -> None:
        self.result["grads"] = bytes_once(p.grad for p in parameters(self.modules))
        self.result["activations_peak"] = self._counter.peak

    def after_step(self) -> None:
        self.result["params"] = bytes_once(parameters(self.modules))
        self.result["optimizer"] = bytes_once(optimizer_states(self.optimizer))
        self.result["gathered_params_peak"] = self.gathered_peak if self.fsdp else None
        self.result["device_peak"] = (torch.cuda.max_memory_allocated(self.device)
                                      if self.device.type == "cuda" else None)

    def bytes(self) -> dict:
        keys = ("params", "grads", "optimizer", "activations_peak", "gathered_params_peak", "device_peak")
        return {key: self.result.get(key) for key in keys}


@contextmanager
def _keep_inputs(block, counter):
    held = []

    def hook(module, args):
        if args and torch.is_tensor(args[0]):
            key, size = _storage_key_and_bytes(args[0])
            counter.hold(key, size)
            held.append((key, size))
    handle = block.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
        for key, size in held:  # released with the step (the checkpoint frees them during backward)
            counter.release(key, size)


@contextmanager
def _each_forward(block, note):
    """note() inside the block while its weights are gathered: before its feed-forward's forward, and
    when its feed-forward's backward starts (FSDP has prefetched the next block's weights by then)."""
    inner = getattr(block, "feed_forward", None) or block

    def after_forward(module, args, output):
        note()
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda grad: note())
    handles = [inner.register_forward_pre_hook(lambda module, args: note()), inner.register_forward_hook(after_forward)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# ---- DeepSpeed: the same counts, where its engine keeps them -------------------------------------

GRADIENT_NAMES = ("grad", "ipg")
MASTER_NAMES = ("fp32",)


def _tensors(value, depth=0):
    """The tensors in an attribute's value: in lists, tuples, dicts and simple objects (a bucket), three deep."""
    if torch.is_tensor(value):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth + 1)
    elif depth < 3 and hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
        for item in vars(value).values():
            yield from _tensors(item, depth + 1)


def named_buffers(optimizer, names) -> list[torch.Tensor]:
    """Tensors held by the attributes of DeepSpeed's ZeRO optimizer whose name contains one of `names`."""
    return [t for attribute, value in vars(optimizer).items() if any(n in attribute.lower() for n in names)
            for t in _tensors(value)]


class DeepSpeedMemory:
    def __init__(self, engine, device):
        self.engine, self.device = engine, device
        self.params = list(engine.module.parameters())
        self.zero = engine.optimizer if hasattr(engine.optimizer, "optimizer") else None  # ZeRO's wrapper, or None
        self.inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # the torch AdamW
        self.result: dict = {}
        self.grads_peak = 0
        self._counter = SavedTensorCounter(set())
        self._hooks = [p.register_post_accumulate_grad_hook(self._note_gradients) for p in self.params
                       if p.requires_grad]

    def _gradients_now(self) -> list[torch.Tensor]:
        buffers = named_buffers(self.zero, GRADIENT_NAMES) if self.zero is not None else []
        return [*(p.grad for p in self.params), *buffers]

    def _note_gradients(self, _param):
        self.grads_peak = max(self.grads_peak, bytes_once(self._gradients_now()))

    @contextmanager
    def forward(self):
        skip = {_storage_key_and_bytes(p)[0] for p in self.params if p.numel()}
        self._counter = SavedTensorCounter(skip)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with self._counter.hooks():
            yield

    def after_step(self) -> None:
        for hook in self._hooks:
            hook.remove()
        weights = [*self.params, *(getattr(p, "ds_tensor", None) for p in self.params)]
        states = [value for state in self.inner.state.values() for value in state.values() if torch.is_tensor(value)]
        if self.zero is not None:
            states += named_buffers(self.zero, MASTER_NAMES)
        self.result.update(
            params=bytes_once(weights), grads=self.grads_peak, optimizer=bytes_once(states),
            optimizer_offloaded=bytes_once(t for t in states if t.device.type != self.device.type),
            activations_peak=self._counter.peak, gathered_params_peak=None,
            device_peak=torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None)

    def bytes(self) -> dict:
        return dict(self.result)
