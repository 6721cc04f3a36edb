"""Tensor parallelism from scratch (Megatron-LM's split), no DTensor.

Two linears in a row: the first is split by columns (each rank computes some output features),
the second by rows (each rank consumes exactly the features it has and produces a partial sum).
Between them nothing is communicated; after the second, one all-reduce sums the partials.

    x --f--> [W1 columns] -> act -> [W2 rows] --g--> y
    f: identity forward, all-reduce backward      g: all-reduce forward, identity backward

Attention: q/k/v are column-split (whole heads per rank), wo is row-split.
SwiGLU: w1 and w3 column-split, w2 row-split.
Embedding, norms and output stay replicated: every rank computes them identically.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

COMM_SECONDS = [0.0]  # all-reduce time spent in this file, read by the training script


def _all_reduce(x, group):
    start = time.perf_counter()
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    COMM_SECONDS[0] += time.perf_counter() - start
    return x


class CopyToTensorParallel(torch.autograd.Function):
    """f: the input goes to every rank as is; their input gradients are partial, so sum them."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.group), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: sum the partial outputs; the output gradient is already whole on every rank."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=0)[rank].clone())
        self.weight.tp_sharded = True

    def forward(self, x):
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, rank: int, world: int, group):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=1)[rank].clone())
        self.weight.tp_sharded = True
        self.group = group

    def forward(self, x):
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.group)


def _copy_input_hook(group):
    # One f per sub-layer (not one per column linear): q, k and v share one backward all-reduce.
    def hook(module, args):
        return (CopyToTensorParallel.apply(args[0], group),) + tuple(args[1:])
    return hook


def parallelize_tp_scratch(model, group):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    for block in model.layers.values():
        attention, mlp = block.attention, block.feed_forward
        for name in ("wq", "wk", "wv"):
            setattr(attention, name, ColumnParallelLinear(getattr(attention, name), rank, world))
        attention.wo = RowParallelLinear(attention.wo, rank, world, group)
        for name in ("w1", "w3"):
            setattr(mlp, name, ColumnParallelLinear(getattr(mlp, name), rank, world))
        mlp.w2 = RowParallelLinear(mlp.w2, rank, world, group)
        attention.register_forward_pre_hook(_copy_input_hook(group))
        mlp.register_forward_pre_hook(_copy_input_hook(group))
    return model
