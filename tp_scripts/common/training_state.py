"""What train_classifier.py's loop works with: the run's Data and its Training state, and how many steps it runs.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from dlokit.in_job import rank as job
from dlokit.in_job.jobenv import EXIT_BAD_OPTIONS

AMP_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Data:
    train_loader: object          # this rank's training batches
    sampler: object               # what the loader draws from: resumable mid-epoch, reshuffled by set_epoch
    shard_sampler: object         # DistributedSampler or RandomSampler inside it (None for synthetic data)
    val_loader: object            # this rank's share of the validation set (None: no validation)
    num_classes: int
    train_size: int | None        # training images (None for synthetic data)
    val_size: int | None          # validation images, all ranks together (None: no validation)
    loader_options: dict
    non_blocking: bool            # copies to the device may overlap with computation
    mixer: object                 # mixup/cutmix, applied to whole batches on the device (None: off)


@dataclass
class Training:
    args: object
    device: torch.device
    rank: int
    world_size: int
    data: Data
    model: nn.Module              # what the loop calls (maybe wrapped in DDP, maybe compiled)
    raw_model: nn.Module          # the plain model inside it: what is saved, evaluated and checked
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    epochs: int
    total_steps: int
    steps_per_epoch: int
    lr_peak: float | None = None  # the schedule's peak learning rate, for the record
    profiler: object = None
    watch: object = None          # fit_harness.StepWatch under --grad-accum/--activation-checkpointing: what ran
    moves: object = None          # device_moves.DeviceMoves: what .to(device) moved (TP1.1), till the first step
    checkpoint_path: Path | None = None
    step: int = 0                 # progress, for the report
    epochs_done: int = 0
    val: dict = field(default_factory=dict)
    best_val_acc: float | None = None

    def ran(self) -> dict:
        """The forward passes since the last call (their images, the blocks' forwards); {} without a watch."""
        return self.watch.take() if self.watch is not None else {}

    def say(self, *parts) -> None:
        if self.rank == 0:
            print(*parts, flush=True)


def plan_steps(args, steps_per_epoch: int) -> tuple[int, int]:
    """(epochs, total optimizer steps): --test stops after --test-nsteps steps."""
    if args.test:
        return math.ceil(args.test_nsteps / steps_per_epoch), args.test_nsteps
    return args.epochs, args.epochs * steps_per_epoch


def last_batch_dropped(images: int, batch_size: int, micro_batches: int = 1) -> bool:
    """Whether an epoch's incomplete last batch is left out: one of a single image would break BatchNorm ("expected
    more than 1 value per channel"), and under --grad-accum K one that does not split into K equal micro-batches of
    two images or more."""
    rest = images % batch_size
    return bool(rest) and (rest % micro_batches != 0 or rest // micro_batches < 2)


def warmup_steps(args, steps_per_epoch: int) -> int:
    return args.warmup_steps or round(args.warmup_epochs * steps_per_epoch)


def fail(rank: int, message: str) -> int:
    """A run that cannot start: one line on stderr (rank 0), the process group left, exit code 2."""
    if rank == 0:
        print(f"train_classifier.py: error: {message}", file=sys.stderr, flush=True)
    job.destroy_process_group()
    return EXIT_BAD_OPTIONS
