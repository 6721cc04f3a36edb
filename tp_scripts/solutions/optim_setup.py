"""The optimiser and its learning-rate schedule, for train_classifier.py (Day 3, TP3.1: large batches).

    lr = peak_lr(args.lr, global_batch, args.base_batch_size, args.lr_scaling)   # the scaling rule
    optimizer = build_optimizer(args.optimizer, model.parameters(), lr, args.momentum, args.weight_decay)
    scheduler = build_schedule(optimizer, args.lr_schedule, total_steps, warmup_steps)   # stepped once per step

A larger batch takes fewer steps per epoch, each with a less noisy gradient: the learning rate has to grow
with it (linearly, or with its square root), a warm-up keeps the first steps of a large learning rate from
blowing up the freshly initialised network, and the layer-wise adaptive optimisers (LARS, LAMB) scale each
layer's step by the ratio of its weights' norm to its gradient's, which lets a very large batch train.
SGD and AdamW come from torch, LAMB, LARS and Lion from timm.optim. Run by
notebooks/day3_large_batch_compile_hpo.ipynb (through train_classifier.py --optimizer ...).
"""
import math

import torch
from torch.optim import lr_scheduler

OPTIMIZERS = ("sgd", "adamw", "lamb", "lars", "lion")
SCHEDULES = ("constant", "onecycle", "cosine")
LR_SCALINGS = ("none", "linear", "sqrt")


def peak_lr(lr: float, global_batch: int, base_batch: int, scaling: str) -> float:
    """--lr is the learning rate for --base-batch-size images per step; a global batch k times larger gets
    k times that (linear) or sqrt(k) times (sqrt)."""
    ratio = global_batch / base_batch
    return lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[scaling]


def build_optimizer(name: str, params, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    params = list(params)
    if name in ("lamb", "lars", "lion"):  # timm takes half a second to import: only the jobs that use it pay
        from timm.optim import Lamb, Lars, Lion
    # >>> SOLUTION TP3.1: build the optimiser --optimizer names (LAMB, LARS and Lion from timm.optim)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "lamb":  # Adam's update, rescaled per layer by |weights| / |update|
        return Lamb(params, lr=lr, weight_decay=weight_decay)
    if name == "lars":  # SGD with momentum, the step rescaled per layer by |weights| / |gradient|
        return Lars(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "lion":  # the sign of a momentum: every weight moves by lr; wants a 3-10x smaller lr than AdamW
        return Lion(params, lr=lr, weight_decay=weight_decay)
    # <<< SOLUTION
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def build_schedule(optimizer, kind: str, total_steps: int, warmup_steps: int = 0):
    """The learning rate of every step, from the optimiser's lr (the peak): stepped once per optimizer step.

    constant and cosine start with a linear warm-up of `warmup_steps` when asked; onecycle has its own warm-up
    (30 % of the run, or `warmup_steps`) and ends near zero, like cosine.
    """
    if kind == "onecycle":
        peak = [group["lr"] for group in optimizer.param_groups]
        rising = warmup_steps / total_steps if warmup_steps else 0.3
        return lr_scheduler.OneCycleLR(optimizer, max_lr=peak, total_steps=total_steps, pct_start=rising)
    if kind == "cosine":
        after = lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps))
    else:
        after = lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    if not warmup_steps:
        return after
    # step k of the warm-up (from 0) runs at (k + 1) / (warmup_steps + 1) of the peak
    warmup = lr_scheduler.LinearLR(optimizer, start_factor=1 / (warmup_steps + 1), total_iters=warmup_steps)
    return lr_scheduler.SequentialLR(optimizer, [warmup, after], milestones=[warmup_steps])
