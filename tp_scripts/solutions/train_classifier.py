"""Train a torchvision image classifier, on CPU or GPUs, in one process or many, and record honest timings.

    python train_classifier.py --data data/generated/tiny --model resnet18 --image-size 64 --epochs 3
    torchrun --nproc_per_node=2 train_classifier.py --data synthetic --test
    srun python -u train_classifier.py ...            (one task per GPU; the rank comes from Slurm)

The script of Days 1 and 2 (notebooks/day1_single_gpu.ipynb, notebooks/day2_data_and_ddp.ipynb). main()
lists what happens: parse the options, join the process group, build the data, the model, the optimiser
and its schedule, train, report. Each of those is a small function below, and each TP's TODO sits in
one of them, next to the few lines it asks for.

Beside this script in tp_scripts/, shared and not part of any TP: train_options.py (every option, with its
reason, checked up front), image_data.py (files, per-image transforms, samplers), checkpointing.py (save and
resume), instrument.py (timings, memory, energy and the run record <runs-dir>/<run-id>/rank<k>/, see
docs/run-records.md).

tp_scripts/solutions/train_classifier.py is the reference solution; tp_scripts/train_classifier.py, the
copy you edit, is generated from it: each marked SOLUTION block becomes a `# TODO TPx.y` there, with the
block's STUDENT lines (if any) standing in its place. `dlokit.material.compare(...)` shows what is left.
"""
import contextlib
import copy
import math
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset
from torchvision.transforms import v2 as T

from dlokit.in_job import rank as job
from dlokit.in_job.jobenv import EXIT_BAD_OPTIONS
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import shared_run_id

# The shared modules: the package common/ (tp_scripts/common; solutions/common links to it).
from common.checkpointing import (CheckpointError, CheckpointWriteError, gather_rng_states, load_checkpoint,
                                  save_checkpoint)
from common.image_data import (DataSetError, ResumableSampler, SyntheticBatches, train_transform, val_transform,
                               worker_start)
from common.instrument import Instrument
from common.layer_drop import add_layer_drop, skipped_blocks
from common.storage_formats import open_image_data, read_manifest
from common.tracking import start_tracking, stop_tracking
from common.train_options import augmentations, parse_args
from common.webdataset_stream import shard_loaders

# Day 3's TP modules sit beside this script (the solution's beside the solution, your copies beside yours).
import optim_setup
from lr_range_test import first_batches, log_spaced, lr_range_test, suggest_lr

AMP_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
LOADER_TIMEOUT_S = 120  # seconds a DataLoader worker may take for one batch before the run stops with that cause


def main(argv=None) -> int:
    env = job.detect()
    args = parse_args(argv, world_size=env.world_size)  # a bad option stops every rank: message, exit code 2
    device = setup_distributed(args)
    data = build_data(args, env.rank, env.world_size, device)
    if len(data.train_loader) == 0:
        return fail(env.rank, f"{args.data}: fewer training images per process than --batch-size "
                              f"{args.batch_size} (and --drop-last is on)")
    model, raw_model = build_model(args, data.num_classes, device, env.world_size)
    epochs, total_steps = plan_steps(args, len(data.train_loader))
    warmup = warmup_steps(args, len(data.train_loader))
    if warmup >= total_steps and not args.lr_finder:
        return fail(env.rank, f"the warm-up ({warmup} steps) must be shorter than the run ({total_steps} steps)")
    optimizer = build_optimizer(args, model.parameters(), args.batch_size * env.world_size)
    scheduler = build_schedule(args, optimizer, total_steps, warmup)
    t = Training(args, device, env.rank, env.world_size, data, model, raw_model,
                 criterion=nn.CrossEntropyLoss(label_smoothing=args.label_smoothing), optimizer=optimizer,
                 scheduler=scheduler, scaler=build_scaler(args, device), amp_dtype=AMP_DTYPES[args.amp],
                 epochs=epochs, total_steps=total_steps, steps_per_epoch=len(data.train_loader))
    try:
        start = restore(t)
    except CheckpointError as error:
        return fail(env.rank, str(error))
    if args.compile:  # after loading the weights into the plain model
        t.model = torch.compile(t.model, mode=args.compile_mode)
    ins = open_records(t, env.source, start)  # from here on, a cancelled job is recorded as "cancelled"
    trackers = start_tracking(args, ins.record, env.rank, ins.record.header["config"])
    if args.lr_finder:  # instead of training
        find_lr(t, ins)
        stop_tracking(trackers)
        job.destroy_process_group()
        return 0
    t.profiler = profiling(args, ins.folder / "profile", env.rank, device)
    try:
        train(t, ins, start)
    except (torch.OutOfMemoryError, MemoryError) as error:  # recorded, and every other rank stops too: exit 3
        leave_now(ins.out_of_memory(error, batch_size=args.batch_size))
    except (DataSetError, CheckpointWriteError) as error:  # a damaged image, a full disk: one line names the file
        leave_now(ins.failed_with(error))
    except Exception as error:  # a collective broke because another rank stopped: record its cause, not ours
        leave_now(ins.stopped_by_other_rank(error))
    ins.tick("the report (all-gather of the weights' checksums)")
    report(t, ins, start)
    stop_tracking(trackers)
    job.destroy_process_group()
    return 0


# ---- what the loop works with --------------------------------------------------------------------

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
    profiler: object = None
    checkpoint_path: Path | None = None
    step: int = 0                 # progress, for the report
    epochs_done: int = 0
    val: dict = field(default_factory=dict)
    best_val_acc: float | None = None

    def say(self, *parts) -> None:
        if self.rank == 0:
            print(*parts, flush=True)


def fail(rank: int, message: str) -> int:
    if rank == 0:
        print(f"train_classifier.py: error: {message}", file=sys.stderr, flush=True)
    job.destroy_process_group()
    return EXIT_BAD_OPTIONS


# ---- set-up: process group, data, model, optimiser ---------------------------------------------

def setup_distributed(args) -> torch.device:
    """Join the job's process group (the kit sets this rank's GPU first, then initialises); maths flags."""
    device = job.init_process_group(device=None if args.device == "auto" else args.device)
    set_tf32(args.tf32)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    return device


def set_tf32(enabled: bool) -> None:
    """fp32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa), GPU only.

    PyTorch lets cuDNN convolutions use TF32 by default: turn it off explicitly so that the fp32
    baseline is really fp32.
    """
    # The legacy flags first: they also set the new per-operation ones to match. Setting only the new ones
    # leaves the legacy flags, which torch.compile and libraries still read, raising "mix of the legacy and
    # new APIs" (torch >= 2.9).
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: the new API, explicitly
        precision = "tf32" if enabled else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision


def build_data(args, rank: int, world_size: int, device) -> Data:
    """This rank's training batches, its share of the validation set, and the batch mixer."""
    if args.data == "synthetic":  # one random batch made on the device: the compute ceiling
        batches = SyntheticBatches(args.batch_size, args.image_size, args.num_classes, args.synthetic_steps,
                                   device, seed=args.seed + rank)
        return Data(batches, batches, None, None, args.num_classes, None, None, {}, False,
                    build_mixer(args, args.num_classes))
    randaugment = "randaugment" in augmentations(args.augment)
    non_blocking = False
    # >>> SOLUTION TP2.1: prepare batches in worker processes, in pinned memory, ahead of time
    loader_options = dict(num_workers=args.num_workers, pin_memory=args.pin_memory,
                          prefetch_factor=args.prefetch_factor if args.num_workers > 0 else None,
                          persistent_workers=args.persistent_workers and args.num_workers > 0)
    non_blocking = args.non_blocking
    # --- STUDENT
    # loader_options = dict(num_workers=0)  # every option off: the training loop decodes each image itself
    # <<< SOLUTION
    # a worker that stops answering ends the run with that cause instead of hanging it; the workers of a rank
    # start from a forkserver (image_data.worker_start says why)
    workers = dict(timeout=LOADER_TIMEOUT_S, **worker_start(world_size, args.num_workers)) \
        if loader_options.get("num_workers") else {}
    if args.data_format == "webdataset":  # a stream of tar shards, no sampler: each rank and worker reads its own
        return shard_data(args, rank, world_size, randaugment, loader_options, workers, non_blocking)
    train_set, val_set, classes = open_image_data(args.data, args.data_format, args.image_size, randaugment)
    # >>> SOLUTION TP2.2: each rank reads its own shard of the data set (set_epoch reshuffles it)
    shard_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    # --- STUDENT
    # shard_sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(args.seed))
    # <<< SOLUTION
    sampler = ResumableSampler(shard_sampler)
    # A last batch of one image would break BatchNorm ("expected more than 1 value per channel").
    drop_last = args.drop_last or len(shard_sampler) % args.batch_size == 1
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=drop_last,
                              generator=torch.Generator().manual_seed(args.seed), **workers, **loader_options)
    val_loader = None
    if val_set is not None and not args.test:
        my_share = Subset(val_set, range(rank, len(val_set), world_size))  # no padding: exact accuracy
        val_loader = DataLoader(my_share, batch_size=args.batch_size, **workers, **loader_options)
    return Data(train_loader, sampler, shard_sampler, val_loader, len(classes), len(train_set),
                len(val_set) if val_loader is not None else None, loader_options, non_blocking,
                build_mixer(args, len(classes)))


def shard_data(args, rank: int, world_size: int, randaugment: bool, loader_options: dict, workers: dict,
               non_blocking: bool) -> Data:
    """--data-format webdataset: shards split by rank, then by DataLoader worker (webdataset_stream.py)."""
    stream, split, val_loader, classes, train_size = shard_loaders(
        args.data, train_transform(args.image_size, randaugment), val_transform(args.image_size),
        batch_size=args.batch_size, rank=rank, world_size=world_size, seed=args.seed,
        loader_options={**workers, **loader_options}, validation=not args.test)
    val_size = read_manifest(args.data)["splits"].get("val", {}).get("count") if val_loader is not None else None
    return Data(stream, stream, split, val_loader, len(classes), train_size, val_size, loader_options, non_blocking,
                build_mixer(args, len(classes)))


def build_mixer(args, num_classes: int):
    """mixup / cutmix (--augment): they need a whole batch, so they run in the loop, on the device."""
    mixers = [T.MixUp(num_classes=num_classes) if name == "mixup" else T.CutMix(num_classes=num_classes)
              for name in augmentations(args.augment) if name in ("mixup", "cutmix")]
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else T.RandomChoice(mixers)  # both: one of the two per batch


def create_model(name: str, num_classes: int) -> nn.Module:
    extra = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    return torchvision.models.get_model(name, num_classes=num_classes, **extra)


def small_image_stem(model: nn.Module) -> nn.Module:
    """--cifar-stem: a ResNet's 7x7 stride-2 convolution and max-pool leave 8x8 of a 32 px image to the first
    block; a 3x3 stride-1 convolution without the pool keeps 32x32, as CIFAR ResNets do (more accurate,
    about 3-4x the compute per image on a CPU)."""
    model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build_model(args, num_classes: int, device, world_size: int):
    """(the model the loop calls, the plain model inside it)."""
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = create_model(args.model, num_classes)
    if args.cifar_stem:
        model = small_image_stem(model)
    if args.layer_drop:
        model = add_layer_drop(model, args.layer_drop)
    # >>> SOLUTION TP1.1: the weights must live where the computation happens
    model = model.to(device)
    # <<< SOLUTION
    # >>> SOLUTION TP1.3: NHWC weights: tensor-core convolutions need no layout conversion
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    # <<< SOLUTION
    model = parallelize(model, args, device, world_size)
    return model, model.module if isinstance(model, DDP) else model


def parallelize(model: nn.Module, args, device, world_size: int) -> nn.Module:
    """Data parallelism sits beside the model: wrap it, leave its code alone."""
    if args.sync_bn:  # asked for: converted even on one GPU (statistics of one rank are the global ones)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if world_size == 1:
        return model
    knobs = dict(find_unused_parameters=args.find_unused_parameters, static_graph=args.static_graph,
                 gradient_as_bucket_view=args.gradient_as_bucket_view)
    if args.bucket_cap_mb is not None:  # otherwise DDP's own default
        knobs["bucket_cap_mb"] = args.bucket_cap_mb
    # >>> SOLUTION TP2.2: DDP keeps one replica per rank and averages the gradients during backward
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **knobs)
    # <<< SOLUTION
    return model


def plan_steps(args, steps_per_epoch: int) -> tuple[int, int]:
    """(epochs, total optimizer steps): --test stops after --test-nsteps steps."""
    if args.test:
        return math.ceil(args.test_nsteps / steps_per_epoch), args.test_nsteps
    return args.epochs, args.epochs * steps_per_epoch


def peak_lr(args, global_batch: int) -> float:
    """--lr, scaled from --base-batch-size to this global batch by --lr-scaling."""
    return optim_setup.peak_lr(args.lr, global_batch, args.base_batch_size, args.lr_scaling)


def build_optimizer(args, params, global_batch: int) -> torch.optim.Optimizer:
    """--optimizer at the schedule's peak learning rate (optim_setup.py, TP3.1)."""
    return optim_setup.build_optimizer(args.optimizer, params, peak_lr(args, global_batch), args.momentum,
                                       args.weight_decay)


def warmup_steps(args, steps_per_epoch: int) -> int:
    return args.warmup_steps or round(args.warmup_epochs * steps_per_epoch)


def build_schedule(args, optimizer, total_steps: int, warmup: int):
    """--lr-schedule: constant, cosine (each after a linear warm-up when asked) or one cycle; stepped every step."""
    return optim_setup.build_schedule(optimizer, args.lr_schedule, total_steps, warmup)


def build_scaler(args, device) -> torch.amp.GradScaler:
    # >>> SOLUTION TP1.2: fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
    return torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    # --- STUDENT
    # return torch.amp.GradScaler(device.type, enabled=False)
    # <<< SOLUTION


def restore(t: Training) -> dict:
    """Where training starts: step 0, or where the --resume checkpoint left off (weights, optimiser,
    schedule, scaler, random state, position in the epoch)."""
    torch.manual_seed(t.args.seed + 1 + t.rank)  # augmentations: a different random stream per rank
    if not t.args.resume:
        return {"epoch": 0, "batch_in_epoch": 0, "step": 0, "epoch_totals": [0.0, 0.0, 0.0]}
    return load_checkpoint(t.args.resume, model=t.raw_model, optimizer=t.optimizer, scheduler=t.scheduler,
                           scaler=t.scaler, device=t.device, rank=t.rank, world_size=t.world_size,
                           batch_size=t.args.batch_size)


def open_records(t: Training, launcher: str, start: dict) -> Instrument:
    """The run record (run.json now; metrics lines and summary later) and the first printed lines."""
    args, data = t.args, t.data
    param_count = sum(p.numel() for p in t.raw_model.parameters())
    config = {**vars(args), "world_size": t.world_size, "global_batch_size": args.batch_size * t.world_size,
              "steps_per_epoch": t.steps_per_epoch, "total_steps": t.total_steps, "num_classes": data.num_classes,
              "train_images": data.train_size, "val_images": data.val_size, "param_count": param_count,
              "launcher": launcher,
              "device_type": t.device.type, "optimizer_class": qualified_name(t.optimizer),
              "lr_peak": peak_lr(args, args.batch_size * t.world_size),
              "warmup_steps": warmup_steps(args, t.steps_per_epoch)}
    ins = Instrument(config, rank=t.rank, world_size=t.world_size, run_id=shared_run_id(), runs_dir=args.runs_dir,
                     device=t.device, start_step=start["step"], total_steps=t.total_steps,
                     breakdown_every=args.breakdown_every, print_every=args.print_every, say=t.say,
                     model=t.raw_model, optimizer=t.optimizer)
    t.checkpoint_path = args.checkpoint_path or ins.folder / "checkpoint.pt"
    t.say(f"run {ins.record.run_id} | {t.world_size} process(es) via {launcher} on {t.device.type} | {args.model} "
          f"{param_count / 1e6:.1f}M params | batch {args.batch_size}/process, {args.batch_size * t.world_size} "
          f"global | amp {args.amp} | channels_last {args.channels_last} | compile {args.compile}")
    t.say(f"data {args.data} | {data.train_size or 'synthetic'} train images, {data.num_classes} classes, "
          f"{t.steps_per_epoch} steps/epoch | loader {data.loader_options or 'on-device'} non_blocking "
          f"{data.non_blocking} | augment {args.augment}")
    t.say(f"records in {ins.folder}")
    if args.resume:
        ins.event("resumed", checkpoint=start["path"], epoch=start["epoch"], step=start["step"],
                  batch_in_epoch=start["batch_in_epoch"])
        t.say(f"resumed from {start['path']} at step {start['step']} (epoch {start['epoch'] + 1}, "
              f"batch {start['batch_in_epoch']})")
    return ins


def qualified_name(thing) -> str:
    """'torch.optim.sgd.SGD', 'timm.optim.lamb.Lamb': the class that was really built."""
    return f"{type(thing).__module__}.{type(thing).__qualname__}"


def profiling(args, trace_dir: Path, rank: int, device):
    """The profiler of --profile, started (None without --profile)."""
    profiler = None
    # >>> SOLUTION TP1.4: skip a step, warm up, then trace a few steps; one trace file per rank
    if args.profile:
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []),
            schedule=torch.profiler.schedule(wait=args.profile_wait, warmup=args.profile_warmup,
                                             active=args.profile_active, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}"),
            record_shapes=True, profile_memory=True)
        profiler.start()
    # <<< SOLUTION
    return profiler


@contextlib.contextmanager
def phase(ins: Instrument, name: str):
    """One phase of a step (data, h2d, forward...): a labelled span in the profiler trace, then the step clock's
    split, so that the record has each phase's time."""
    # >>> SOLUTION TP1.4: name each phase so that it shows up as a labelled span in the profiler trace
    with torch.profiler.record_function(name):
        yield
    # --- STUDENT
    # yield
    # <<< SOLUTION
    ins.split(name)


# ---- the loop ---------------------------------------------------------------------------------------

def train(t: Training, ins: Instrument, start: dict) -> None:
    """Epochs of steps; after each epoch, its averages, a validation pass and maybe a checkpoint."""
    t.step, t.epochs_done = start["step"], start["epoch"]
    for epoch in range(start["epoch"], t.epochs):
        if t.step >= t.total_steps:
            break
        started = time.perf_counter()
        # resumed mid-epoch: the epoch's sums before the checkpoint (all ranks), for its epoch line
        first_batch, before = (start["batch_in_epoch"], start["epoch_totals"]) if epoch == start["epoch"] else (0, None)
        batch_in_epoch, totals = train_epoch(t, ins, epoch, first_batch, before)
        end_of_epoch(t, ins, epoch, totals, started, before)
        if t.args.checkpoint_epochs and batch_in_epoch == t.steps_per_epoch:
            save(t, ins, epoch + 1, 0)


def train_epoch(t: Training, ins: Instrument, epoch: int, first_batch: int, before=None):
    """One pass over this rank's shard (from batch `first_batch` when resuming): (batches done, totals)."""
    args = t.args
    t.data.sampler.skip = first_batch * args.batch_size
    # >>> SOLUTION TP2.2: a new shuffle each epoch, the same on every rank (so the shards stay disjoint)
    t.data.sampler.set_epoch(epoch)
    # <<< SOLUTION
    totals = torch.zeros(3, device=t.device)  # loss sum, hits, images: summed on the device, no sync per step
    batch_in_epoch = first_batch
    t.model.train()
    batches = iter(t.data.train_loader)
    while t.step < t.total_steps:
        ins.start_step(t.step + 1)
        with phase(ins, "data"):
            batch = next(batches, None)
        if batch is None:
            break
        lr = t.optimizer.param_groups[0]["lr"]
        loss, hits, n = train_step(t, ins, *batch)
        t.step, batch_in_epoch = t.step + 1, batch_in_epoch + 1
        totals[:2] += torch.stack([loss.float() * n, hits.float()]).to(t.device)  # .to: no-op once on the device
        totals[2] += n
        metrics = sync_metrics(t, ins, loss, hits, n) if t.step % args.metric_step == 0 else {}
        if t.profiler is not None:
            t.profiler.step()
        ins.end_step(t.step, epoch=epoch, lr=lr, samples=n * t.world_size, **metrics)
        if args.checkpoint_steps and t.step % args.checkpoint_steps == 0:
            save(t, ins, epoch, batch_in_epoch, epoch_sums(totals, before))
        if ins.checkpoint_due(t.step):  # --checkpoint-on-signal: the job's time is nearly up, save and leave
            save(t, ins, epoch, batch_in_epoch, epoch_sums(totals, before))
            leave_now(ins.checkpointed(epochs=t.epochs_done, val_acc=t.val.get("val_acc"), best_val_acc=t.best_val_acc))
    return batch_in_epoch, totals


def train_step(t: Training, ins: Instrument, images, labels):
    """One optimisation step on one batch: (loss, hits) as tensors on the device (nothing waits), batch size."""
    args, model = t.args, t.model
    pinned = images.is_pinned()
    with phase(ins, "h2d"):
        # >>> SOLUTION TP1.1: move the batch to the device (non_blocking: overlap the copy with compute)
        images = images.to(t.device, non_blocking=t.data.non_blocking)
        labels = labels.to(t.device, non_blocking=t.data.non_blocking)
        # <<< SOLUTION
    targets = labels
    with phase(ins, "augment"):
        # >>> SOLUTION TP2.4: mixup/cutmix (t.data.mixer, set by --augment) on the device, whole batch: soft targets
        if t.data.mixer is not None:
            images, targets = t.data.mixer(images, labels)
        # <<< SOLUTION
    with phase(ins, "forward"):
        # >>> SOLUTION TP1.3: NHWC images to match the NHWC weights
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        # <<< SOLUTION
        # >>> SOLUTION TP1.2: run the forward pass and the loss under autocast
        with torch.autocast(t.device.type, dtype=t.amp_dtype, enabled=t.amp_dtype is not None):
            logits = model(images)
            loss = t.criterion(logits, targets)
        # --- STUDENT
        # logits = model(images)
        # loss = t.criterion(logits, targets)
        # <<< SOLUTION
    with phase(ins, "backward"):
        t.optimizer.zero_grad(set_to_none=True)
        # >>> SOLUTION TP1.2: scale the loss so that fp16 gradients do not flush to zero
        t.scaler.scale(loss).backward()
        # --- STUDENT
        # loss.backward()
        # <<< SOLUTION
    with phase(ins, "optimizer"):
        # >>> SOLUTION TP1.2: unscale, skip the step if a gradient overflowed, adapt the scale
        t.scaler.step(t.optimizer)
        t.scaler.update()
        # --- STUDENT
        # t.optimizer.step()
        # <<< SOLUTION
        t.scheduler.step()
    ins.observe_once(t, phase=phase, images=images, targets=targets, logits=logits, pinned=pinned)
    hits = (logits.argmax(dim=1) == labels).sum()  # against the true labels, mixed batch or not
    return loss.detach(), hits, len(labels)


def sync_metrics(t: Training, ins: Instrument, loss, hits, n: int) -> dict:
    """This step's loss and accuracy averaged over the ranks: an all-reduce, and the host waits for it."""
    with phase(ins, "metrics"):
        loss_mean, acc_mean = mean_over_ranks(torch.stack([loss.float(), hits.float() / n]).to(t.device)).tolist()
    return {"loss": loss_mean, "acc": acc_mean}


def mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
        values /= dist.get_world_size()
    return values


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def epoch_sums(totals, before=None) -> list:
    """The epoch's sums so far over every rank (a collective: every rank calls it), with those before a resume."""
    now = sum_over_ranks(totals.clone()).tolist()
    return [a + b for a, b in zip(now, before or [0.0, 0.0, 0.0])]


def end_of_epoch(t: Training, ins: Instrument, epoch: int, totals, started: float, before=None) -> None:
    """The epoch's loss and accuracy over every image of every rank (also those before a resume), then a
    validation pass. Its time and throughput are this run's part of the epoch."""
    ins.tick(f"the end of epoch {epoch + 1} (all-reduce of its sums)")
    before = before or [0.0, 0.0, 0.0]
    loss_sum, hits, images = epoch_sums(totals, before)
    images_now = images - before[2]
    seconds = time.perf_counter() - started
    t.epochs_done = epoch + 1
    message = f"epoch {epoch + 1}/{t.epochs} in {seconds:.1f} s"
    if images_now:  # zero when resuming from a checkpoint taken on the epoch's last step
        ins.log("epoch", epoch=epoch, train_loss=loss_sum / images, train_acc=hits / images, epoch_time_s=seconds,
                throughput_train=images_now / seconds)
        message += f" | train loss {loss_sum / images:.4f} acc {hits / images:.3f}"
    ins.log_batchnorm_buffers(t.raw_model, epoch)  # before validation, which runs outside DDP and updates nothing
    if t.data.val_loader is not None:
        val_started = time.perf_counter()
        t.val = evaluate(t.raw_model, t.data.val_loader, t.criterion, t.amp_dtype, t.args.channels_last, ins.tick)
        t.best_val_acc = max(t.best_val_acc or 0.0, t.val["val_acc"])
        ins.log("val", epoch=epoch, step=t.step, val_time_s=time.perf_counter() - val_started, **t.val)
        message += f" | val loss {t.val['val_loss']:.4f} acc {t.val['val_acc']:.3f} top5 {t.val['val_acc5']:.3f}"
    t.say(message)


@torch.no_grad()  # no graph kept for backward: less memory, less time
def evaluate(model, loader, criterion, amp_dtype, channels_last: bool, tick=lambda where: None) -> dict:
    model.eval()
    device = next(model.parameters()).device  # wherever the weights are, the batches go too
    totals = torch.zeros(5, device=device)  # loss sum, top-1 hits, top-5 hits, images, sum of squared losses
    tick("validation, waiting for its first batch")
    for batch, (images, labels) in enumerate(loader, 1):
        tick(f"validation batch {batch}")
        images, labels = images.to(device), labels.to(device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        losses = nn.functional.cross_entropy(logits.float(), labels, reduction="none")
        totals[:3] += torch.stack([losses.sum(),
                                   (top5[:, 0] == labels).sum().float(),
                                   (top5 == labels[:, None]).any(dim=1).sum().float()])
        totals[3:] += torch.stack([torch.tensor(float(len(labels)), device=device), (losses ** 2).sum()])
    tick("validation (all-reduce of its sums)")
    loss, top1, top5, count, squares = sum_over_ranks(totals).tolist()
    model.train()
    mean = loss / max(count, 1)
    # the per-image losses' standard deviation: how sure the mean is (the interval of Day 3's comparisons)
    spread = math.sqrt(max(squares - count * mean ** 2, 0.0) / max(count - 1, 1))
    return {"val_loss": mean, "val_loss_sd": spread, "val_acc": top1 / max(count, 1), "val_acc5": top5 / max(count, 1)}


def save(t: Training, ins: Instrument, epoch: int, batch_in_epoch: int, epoch_totals=None) -> None:
    """Every rank hands its random state to rank 0, which writes the file (with the epoch's sums so far)."""
    ins.pause()  # between two steps: the step lines so far are written, the next step's pace leaves this out
    ins.tick("a checkpoint (gathering the random states)")
    rng_states = gather_rng_states(t.device)
    if t.rank == 0:
        started = time.perf_counter()
        save_checkpoint(t.checkpoint_path, model=t.raw_model, optimizer=t.optimizer, scheduler=t.scheduler,
                        scaler=t.scaler, epoch=epoch, batch_in_epoch=batch_in_epoch, step=t.step,
                        world_size=t.world_size, batch_size=t.args.batch_size, rng_states=rng_states,
                        epoch_totals=epoch_totals)
        ins.event("checkpoint_saved", path=str(t.checkpoint_path), step=t.step, epoch=epoch,
                  batch_in_epoch=batch_in_epoch, seconds=time.perf_counter() - started)


# ---- the LR range test -----------------------------------------------------------------------------

def find_lr(t: Training, ins: Instrument) -> None:
    """--lr-finder: log-spaced learning rates, each trained on the same first batches from the same initial
    weights (lr_range_test.py, TP3.2), for each optimiser of --lr-finder-optimizers; one 'lr_trial' record line
    per trial, the suggestions in the summary (--optimizer's at its top level)."""
    args = t.args
    batches = first_batches(t.data.train_loader, args.lr_finder_steps, t.device, args.channels_last)
    lrs = log_spaced(args.lr_finder_min, args.lr_finder_max, args.lr_finder_trials)
    start = copy.deepcopy(t.raw_model.state_dict())  # every optimiser's test starts from these weights

    def make_optimizer(name: str, lr: float):
        return optim_setup.build_optimizer(name, t.raw_model.parameters(), lr, args.momentum, args.weight_decay)

    def record(name: str, trial: dict) -> None:
        ins.log("lr_trial", optimizer=name, **trial)
        first, smoothed = (float("nan") if trial[k] is None else trial[k] for k in ("first_loss", "smoothed_loss"))
        t.say(f"{name} trial {trial['trial'] + 1:2d}/{len(lrs)} | lr {trial['lr']:.2e} | first loss {first:.4f} | "
              f"smoothed loss {smoothed:.4f}" + (" | diverged" if trial["diverged"] else ""))

    by_optimizer, steps = {}, 0
    for name in args.lr_finder_optimizers:
        t.raw_model.load_state_dict(start)
        trials = lr_range_test(t.model, partial(make_optimizer, name), batches, t.criterion, t.amp_dtype, lrs,
                               seed=args.seed, on_trial=partial(record, name))
        found = by_optimizer[name] = suggest_lr(trials)
        steps += sum(trial["steps"] for trial in trials)
        if found["lr_finder_no_descent"]:
            t.say(f"{name}: no descent seen: the lowest loss is the smallest lr's ({_g(found['lr_finder_min_loss_lr'])}); "
                  "no suggestion (more --lr-finder-steps per trial, or a lower --lr-finder-min)")
        t.say(f"{name}: suggested lr {_g(found['lr_finder_suggested_lr'])} (rule {found['lr_finder_rule']}; "
              f"steepest descent at {_g(found['lr_finder_steepest_lr'])}); first losses differ by "
              f"{_g(found['lr_finder_first_loss_spread'])} (relative)")
    ins.finish(steps=steps, epochs=0, **by_optimizer[args.optimizer], lr_finder_optimizers=list(by_optimizer),
               lr_finder_by_optimizer=by_optimizer)


def _g(value) -> str:
    return "none" if value is None else f"{value:.3g}"


# ---- the report ------------------------------------------------------------------------------------

def report(t: Training, ins: Instrument, start: dict) -> None:
    """The profiler's trace files, the weights compared across ranks, and summary.json."""
    if t.profiler is not None:
        t.profiler.stop()
        trace_dir = ins.folder / "profile"
        files = sorted(str(p) for p in trace_dir.glob(f"rank{t.rank}.*"))
        ins.event("profiler_trace", files=files)
        args = t.args
        t.say(f"profiler traces in {trace_dir}" if files else
              f"no profiler trace: the run ended before wait+warmup+active = "
              f"{args.profile_wait + args.profile_warmup + args.profile_active} steps")
    checksums, identical = compare_weights(t.raw_model, t.device)
    ins.finish(steps=t.step, epochs=t.epochs_done, resumed_from_step=start["step"] if t.args.resume else None,
               val_acc=t.val.get("val_acc"), val_acc5=t.val.get("val_acc5"), best_val_acc=t.best_val_acc,
               param_checksum=checksums.tolist(), params_identical_across_ranks=identical,
               **skipped_blocks(t.raw_model))
    t.say(f"parameters identical across {t.world_size} rank(s): {identical}")


def compare_weights(model: nn.Module, device) -> tuple[torch.Tensor, bool]:
    """[sum, sum of squares] of the weights (two numbers that differ when any weight differs), all-gathered:
    (this rank's, whether every rank holds the same)."""
    params = [p.detach().double() for p in model.parameters()]
    checksums = torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)]).to(device)
    gathered = [checksums]
    if dist.is_initialized():
        gathered = [torch.zeros_like(checksums) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, checksums)
    return checksums, all(torch.equal(g, gathered[0]) for g in gathered)


if __name__ == "__main__":
    # Leave without the interpreter's teardown (about 0.7 s with torch loaded, on every job): the records are
    # written and flushed by now, the trackers closed.
    leave_now(main())
