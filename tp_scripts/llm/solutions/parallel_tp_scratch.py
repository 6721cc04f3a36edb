"""Tensor parallelism from scratch (Megatron-LM's split), no DTensor.

Two linears in a row: the first is split by columns (each rank computes some output features),
the second by rows (each rank consumes exactly the features it has and produces a partial sum).
Between them nothing is communicated; after the second, one all-reduce sums the partials.

    x --f--> [W1 columns] -> act -> [W2 rows] --g--> y
    f: identity forward, all-reduce backward      g: all-reduce forward, identity backward

Attention: q/k/v are column-split (whole heads per rank), wo is row-split.
SwiGLU: w1 and w3 column-split, w2 row-split.
Embedding, norms and output stay replicated: every rank computes them identically.
A split weight is a plain tensor here, so it carries where it was cut (`tp_shard_dim`): the
checkpoint saves it at its place in the full weight (checkpoint.py), never as a copy of rank 0's part.

TP4.4 (the student's TODOs): the two all-reduces, g's in the forward and f's in the backward. Without
them each rank computes with its own part only: `check_tp.py` shows outputs and gradients that differ
from the single-process layer, and counts the all-reduces each direction really ran.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class TensorParallelComm:
    """The tensor-parallel group and, optionally, a SectionTimer that adds up the time spent in
    its all-reduces (on the device clock: see timing.py). Passed to the layers explicitly."""

    def __init__(self, group, timer=None):
        self.group, self.timer = group, timer

    def all_reduce(self, x):
        x = x.contiguous()
        if self.timer is None:
            dist.all_reduce(x, group=self.group)
        else:
            with self.timer.section():
                dist.all_reduce(x, group=self.group)
        return x


class CopyToTensorParallel(torch.autograd.Function):
    """f: the input goes to every rank as is; their input gradients are partial, so sum them."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, grad):
        # >>> SOLUTION TP4.4: each rank's input gradient only counts its own columns: sum them (comm.all_reduce)
        return ctx.comm.all_reduce(grad.clone()), None
        # --- STUDENT
        # return grad, None
        # <<< SOLUTION


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: sum the partial outputs; the output gradient is already whole on every rank."""

    @staticmethod
    def forward(ctx, x, comm):
        # >>> SOLUTION TP4.4: each rank's output is a partial sum over its own rows: add them up (comm.all_reduce)
        return comm.all_reduce(x.clone())
        # --- STUDENT
        # return x
        # <<< SOLUTION

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _mark_split(weight, dim):
    """This parameter holds a 1/tp part of the full weight, cut along `dim`: the grad norm sums it
    over the group (tp_sharded) and the checkpoint saves it at its place in the full tensor."""
    weight.tp_sharded = True
    weight.tp_shard_dim = dim
    return weight


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        self.weight = _mark_split(nn.Parameter(linear.weight.detach().chunk(world, dim=0)[rank].clone()), 0)

    def forward(self, x):
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, rank: int, world: int, comm: TensorParallelComm):
        super().__init__()
        self.weight = _mark_split(nn.Parameter(linear.weight.detach().chunk(world, dim=1)[rank].clone()), 1)
        self.comm = comm

    def forward(self, x):
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.comm)


def _copy_input_hook(comm):
    # One f per sub-layer (not one per column linear): q, k and v share one backward all-reduce.
    def hook(module, args):
        return (CopyToTensorParallel.apply(args[0], comm),) + tuple(args[1:])
    return hook


def split_sublayer(module, columns, rows, comm):
    """The column linears (named in `columns`) and the row linear (`rows`) of one sub-layer, split over
    comm's group; f on the sub-layer's input, g inside the row linear: one all-reduce each way."""
    rank, world = dist.get_rank(comm.group), dist.get_world_size(comm.group)
    for name in columns:
        setattr(module, name, ColumnParallelLinear(getattr(module, name), rank, world))
    setattr(module, rows, RowParallelLinear(getattr(module, rows), rank, world, comm))
    module.register_forward_pre_hook(_copy_input_hook(comm))
    return module


def parallelize_tp_scratch(model, group, timer=None):
    """Split every block's linears over `group`; `timer` (a SectionTimer) times the all-reduces."""
    comm = TensorParallelComm(group, timer)
    for block in model.layers.values():
        split_sublayer(block.attention, ("wq", "wk", "wv"), "wo", comm)
        split_sublayer(block.feed_forward, ("w1", "w3"), "w2", comm)
    return model
