"""When the batch does not fit: gradient accumulation and activation checkpointing (Day 1, TP1.5).

    python fit_levers.py --data DIR --batch-size 64 --micro-batches 4 --norm-lesson batch,group
    python fit_levers.py --data DIR --batch-size 256 --levers plain --memory-limit 200 --steps 1

Two ways to train a batch whose activations do not fit, both yours to write:
- gradient accumulation (accumulate_step): the batch in k micro-batches, each forward-backward adding its
  gradients, each loss scaled by 1/k so that their sum is the batch's mean; one optimizer step. The activations of
  one micro-batch only, the maths of the large batch, at the price of k smaller (slower) passes. Under DDP,
  every micro-batch but the last runs in model.no_sync(): one all-reduce per step, not k.
- activation checkpointing (Checkpointed): a ResNet stage keeps only its input in forward and runs again in
  backward to get its activations back: less memory, one more forward pass of time.

The arms (--levers) train from the same weights on the same batches, their steps alternated (A B C A B C: a drift
of the machine hits every arm alike). Per step the record holds its time, what it held in tensors
(common/tensor_memory.py: autograd's saved tensors, weights, gradients, optimizer states; on a GPU the allocator's
peak) and what the model did (the images of each forward pass, how often each stage ran). --norm-lesson compares
the accumulated step with the plain large batch, step by step, for each normalisation: BatchNorm normalises each
micro-batch with its own statistics, so there accumulation is not the large batch. Under --memory-limit a run that
runs out of memory says so in its record (status "oom", exit code 3). Run by notebooks/day1_single_gpu.ipynb.
"""
import contextlib
import sys
from functools import partial

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from dlokit.in_job import rank as job
from dlokit.in_job.jobenv import EXIT_OUT_OF_MEMORY
from dlokit.in_job.measure import StepClock
from dlokit.in_job.peers import is_out_of_memory, leave_now

# The shared modules: the package common/ (tp_scripts/common, installed with the kit under that name).
from common.fit_harness import (STAGES, StepWatch, build_model, device_peak, fixed_batches, grad_norm, parse_args,
                                start_record)
from common.memory_limit import limit_memory
from common.tensor_memory import TensorMemory


def accumulate_step(model, images, labels, micro_batches: int, forward, backward=torch.Tensor.backward):
    """The batch's gradients added up in .grad over `micro_batches` passes (forward(x, y): a micro-batch's loss,
    backward(loss): its backward); returns the batch's loss. The caller zeroes the gradients and steps once."""
    # >>> SOLUTION TP1.5: k micro-batches, each loss / k, the gradients added up; DDP all-reduces on the last only
    total = torch.zeros((), device=images.device)
    pieces = list(zip(images.chunk(micro_batches), labels.chunk(micro_batches)))
    for index, (x, y) in enumerate(pieces):
        last = index == len(pieces) - 1
        with model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext():
            loss = forward(x, y) / len(pieces)
            backward(loss)  # adds to .grad; this micro-batch's activations are freed here
        total += loss.detach()
    # --- STUDENT
    # total = forward(images, labels)  # the whole batch in one pass: all its activations alive at once
    # backward(total)
    # <<< SOLUTION
    return total


def accumulated_step(model, optimizer, criterion, images, labels, micro_batches: int) -> torch.Tensor:
    """One optimizer step on the batch, its gradients accumulated over `micro_batches` passes (train_classifier.py's
    --grad-accum calls accumulate_step too, with its autocast forward and its loss scaler's backward)."""
    optimizer.zero_grad(set_to_none=True)
    loss = accumulate_step(model, images, labels, micro_batches, lambda x, y: criterion(model(x), y))
    optimizer.step()
    return loss


class Checkpointed(nn.Module):
    """A residual block that keeps only its input for backward, and runs again there to get its activations back.
    (That second forward, in training mode, also moves BatchNorm's running statistics a second time.)"""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        # >>> SOLUTION TP1.5: run the block through torch.utils.checkpoint
        # reentrant: its saved input and the recomputed activations pass through autograd's saved-tensor hooks,
        # where TensorMemory counts them (the non-reentrant form keeps them out of its sight)
        return checkpoint(self.block, x, use_reentrant=True)
        # --- STUDENT
        # return self.block(x)  # an ordinary call: autograd keeps every activation of the block
        # <<< SOLUTION


def checkpoint_stages(model: nn.Module) -> nn.Module:
    """Each residual block of the four stages checkpointed: one block's activations alive at a time in backward
    (whole stages: at batch 256 the process still needed 92 % of the plain step's memory; block by block 81 %)."""
    for name in STAGES:
        stage = getattr(model, name)
        for index, block in enumerate(list(stage)):
            stage[index] = Checkpointed(block)
    return model


def plain_step(model, optimizer, criterion, images, labels) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main(argv=None) -> int:
    args = parse_args(argv)
    env = job.detect()
    device = job.init_process_group(device=None if args.device == "auto" else args.device)
    record = start_record(args, env, device)
    batches, classes = fixed_batches(args.data, args.image_size, args.batch_size, args.steps + 2, device,
                                      args.seed)
    limit = limit_memory(args.memory_limit, device) if args.memory_limit else {}
    try:
        arms = {lever: arm(lever, args, classes, device) for lever in args.levers}
        timed = time_arms(arms, batches, args, record)
        lesson = {norm: norm_lesson(norm, args, classes, device, batches, record) for norm in args.norm_lesson}
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        message = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        print(f"fit_levers.py: out of memory, levers {args.levers}, batch {args.batch_size}: {message}",
              file=sys.stderr, flush=True)
        record.out_of_memory(message, **limit)
        return EXIT_OUT_OF_MEMORY
    record.finish(steps=args.steps, timed=timed, norm_lesson=lesson, **limit)
    job.destroy_process_group()
    return 0


def arm(lever: str, args, classes: int, device) -> dict:
    model = build_model(args.model, classes, "batch", device, args.seed)
    watch = StepWatch(model)  # before checkpointing: it watches the blocks themselves
    if lever == "checkpoint":
        checkpoint_stages(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = partial(accumulated_step, micro_batches=args.micro_batches) if lever == "accumulate" else plain_step
    return {"step": step, "watch": watch, "meter": TensorMemory(model, optimizer), "model": model,
            "optimizer": optimizer, "clock": StepClock(device, breakdown_every=1)}


def time_arms(arms: dict, batches, args, record) -> dict:
    """Each arm's steps, alternated. The first and the last step of each count the tensors (warm-up: allocations,
    caches; untimed), the steps between are timed without the counting hooks."""
    for index, (images, labels) in enumerate(batches):
        counted = index in (0, len(batches) - 1)
        for lever, a in arms.items():
            a["clock"].start(index)  # every step a breakdown step: it starts and ends on a synchronised device
            with a["meter"].step() if counted else contextlib.nullcontext(), device_peak(images.device) as peak:
                loss = a["step"](a["model"], a["optimizer"], nn.functional.cross_entropy, images, labels)
            a["clock"].split("step")
            a["clock"].stop()
            seconds = a["clock"].finished().t_step
            counts = {**a["meter"].mib(), **peak} if counted else {}
            record.log("lever_step", lever=lever, step=index, timed=not counted, t_step=seconds,
                       loss=float(loss.detach()), grad_norm=grad_norm(a["model"]), **counts, **a["watch"].take())
    return {lever: len(batches) - 2 for lever in arms}


def norm_lesson(norm: str, args, classes: int, device, batches, record) -> int:
    """The plain large batch and the accumulated one, each step from the same weights (the plain run's, copied: only
    the step's own difference is measured, not fp32 rounding compounded over the steps): loss, gradient norm."""
    models = {how: build_model(args.model, classes, norm, device, args.seed) for how in ("plain", "accumulate")}
    optimizers = {how: torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9) for how, m in models.items()}
    watch = StepWatch(models["accumulate"])
    for index, (images, labels) in enumerate(batches[:args.norm_steps]):
        models["accumulate"].load_state_dict(models["plain"].state_dict())  # weights and BatchNorm's running stats
        plain = plain_step(models["plain"], optimizers["plain"], nn.functional.cross_entropy, images, labels)
        accumulated = accumulated_step(models["accumulate"], optimizers["accumulate"], nn.functional.cross_entropy,
                                       images, labels, args.micro_batches)
        record.log("norm_step", norm=norm, step=index, loss_plain=float(plain),
                   loss_accumulate=float(accumulated.detach()),
                   grad_norm_plain=grad_norm(models["plain"]), grad_norm_accumulate=grad_norm(models["accumulate"]),
                   **watch.take())
    return min(args.norm_steps, len(batches))


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
