"""Train a torchvision image classifier, on CPU or GPUs, in one process or many, and record honest timings.

    python train_classifier.py --data data/generated/tiny --model resnet18 --image-size 64 --epochs 3
    torchrun --nproc_per_node=2 train_classifier.py --data synthetic --test
    srun python -u train_classifier.py ...            (one task per GPU; the rank comes from Slurm)

The script of Days 1 and 2 (notebooks/day1_single_gpu.ipynb, notebooks/day2_data_and_ddp.ipynb), read top to
bottom: main() parses the options, builds the data, the model and the optimiser, trains, reports; then the
functions that build each of them, then the loop (train, train_epoch, train_step). Each TP's TODO sits in one of
them, next to the few lines it asks for.

What no TP asks you to write lives in the package common/ (docs/architecture.md lists each module): options,
data, the run record and its timings, checkpoints, the end of an epoch, the LR range test, the report.

tp_scripts/solutions/train_classifier.py is the reference solution; tp_scripts/train_classifier.py, the
copy you edit, is generated from it: each marked SOLUTION block becomes a `# TODO TPx.y` there, with the
block's STUDENT lines (if any) standing in its place. `dlokit.material.compare(...)` shows what is left.
"""
import contextlib
import time
from functools import partial

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset

from dlokit.in_job import rank as job
from dlokit.in_job.peers import leave_now

# The shared modules: the package common/ (tp_scripts/common, installed with the kit under that name).
from common.checkpointing import CheckpointError, CheckpointWriteError, restore, save
from common.device_setup import setup_distributed
from common.evaluation import end_of_epoch
from common.fit_harness import StepWatch
from common.image_data import DataSetError, ResumableSampler
from common.image_models import create_model, small_image_stem
from common.instrument import Instrument
from common.layer_drop import add_layer_drop
from common.lr_finder import find_lr
from common.rank_sums import epoch_sums, mean_over_ranks
from common.report import report
from common.run_data import build_mixer, shard_data, synthetic_data, worker_options
from common.run_start import open_records
from common.device_moves import DeviceMoves
from common.storage_formats import open_image_data
from common.tracking import start_tracking, stop_tracking
from common.train_options import augmentations, parse_args
from common.training_state import AMP_DTYPES, Data, Training, fail, last_batch_dropped, plan_steps, warmup_steps

# The TP modules of Days 1 (TP1.5: the memory levers) and 3 sit beside this script (yours beside yours).
import fit_levers
import lr_range_test
import optim_setup


def main(argv=None) -> int:
    env = job.detect()
    args = parse_args(argv, world_size=env.world_size)  # a bad option stops every rank: message, exit code 2
    device = setup_distributed(args)
    data = build_data(args, env.rank, env.world_size, device)
    if len(data.train_loader) == 0:
        return fail(env.rank, f"{args.data}: fewer training images per process than --batch-size "
                              f"{args.batch_size} (and --drop-last is on)")
    moves = DeviceMoves()
    with moves:
        model, raw_model, watch = build_model(args, data.num_classes, device, env.world_size)
    epochs, total_steps = plan_steps(args, len(data.train_loader))
    warmup = warmup_steps(args, len(data.train_loader))
    if warmup >= total_steps and not args.lr_finder:
        return fail(env.rank, f"the warm-up ({warmup} steps) must be shorter than the run ({total_steps} steps)")
    lr_peak = optim_setup.peak_lr(args.lr, args.batch_size * env.world_size, args.base_batch_size, args.lr_scaling)
    optimizer = optim_setup.build_optimizer(args.optimizer, model.parameters(), lr_peak, args.momentum,
                                            args.weight_decay)
    scheduler = optim_setup.build_schedule(optimizer, args.lr_schedule, total_steps, warmup)
    t = Training(args, device, env.rank, env.world_size, data, model, raw_model,
                 criterion=nn.CrossEntropyLoss(label_smoothing=args.label_smoothing), optimizer=optimizer,
                 scheduler=scheduler, scaler=build_scaler(args, device), amp_dtype=AMP_DTYPES[args.amp],
                 epochs=epochs, total_steps=total_steps, steps_per_epoch=len(data.train_loader), lr_peak=lr_peak,
                 watch=watch, moves=moves)
    try:
        start = restore(t)
    except CheckpointError as error:
        return fail(env.rank, str(error))
    if args.compile:  # after loading the weights into the plain model
        t.model = torch.compile(t.model, mode=args.compile_mode)
    ins = open_records(t, env.source, start)  # from here on, a cancelled job is recorded as "cancelled"
    trackers = start_tracking(args, ins.record, env.rank, ins.record.header["config"])
    if args.lr_finder:  # instead of training
        find_lr(t, ins, optim_setup, lr_range_test)
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


# ---- set-up: the data, the model, the loss scaler -----------------------------------------------------

def build_data(args, rank: int, world_size: int, device) -> Data:
    """This rank's training batches, its share of the validation set, and the batch mixer."""
    if args.data == "synthetic":  # one random batch made on the device: the compute ceiling
        return synthetic_data(args, rank, device)
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
    workers = worker_options(world_size, loader_options)  # their start, and a time limit per batch
    if args.data_format == "webdataset":  # a stream of tar shards, no sampler: each rank and worker reads its own
        return shard_data(args, rank, world_size, randaugment, loader_options, workers, non_blocking)
    train_set, val_set, classes = open_image_data(args.data, args.data_format, args.image_size, randaugment)
    # >>> SOLUTION TP2.2: each rank reads its own shard of the data set (set_epoch reshuffles it)
    shard_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    # --- STUDENT
    # shard_sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(args.seed))
    # <<< SOLUTION
    sampler = ResumableSampler(shard_sampler)
    drop_last = args.drop_last or last_batch_dropped(len(shard_sampler), args.batch_size, args.grad_accum)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=drop_last,
                              generator=torch.Generator().manual_seed(args.seed), **workers, **loader_options)
    val_loader = None
    if val_set is not None and not args.test:
        my_share = Subset(val_set, range(rank, len(val_set), world_size))  # no padding: exact accuracy
        val_loader = DataLoader(my_share, batch_size=args.batch_size, **workers, **loader_options)
    return Data(train_loader, sampler, shard_sampler, val_loader, len(classes), len(train_set),
                len(val_set) if val_loader is not None else None, loader_options, non_blocking,
                build_mixer(args, len(classes)))


def build_model(args, num_classes: int, device, world_size: int):
    """(the model the loop calls, the plain model inside it, what watches its passes under the memory levers)."""
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = create_model(args.model, num_classes)
    if args.cifar_stem:
        model = small_image_stem(model)
    if args.layer_drop:
        model = add_layer_drop(model, args.layer_drop)
    watch = StepWatch(model) if args.grad_accum > 1 or args.activation_checkpointing else None  # what each step ran
    if args.activation_checkpointing:
        model = fit_levers.checkpoint_stages(model)
    # >>> SOLUTION TP1.1: the weights must live where the computation happens
    model = model.to(device)
    # <<< SOLUTION
    # >>> SOLUTION TP1.3: NHWC weights: tensor-core convolutions need no layout conversion
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    # <<< SOLUTION
    model = parallelize(model, args, device, world_size)
    return model, model.module if isinstance(model, DDP) else model, watch


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


def build_scaler(args, device) -> torch.amp.GradScaler:
    # >>> SOLUTION TP1.2: fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
    return torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    # --- STUDENT
    # return torch.amp.GradScaler(device.type, enabled=False)
    # <<< SOLUTION


# ---- the profiler, and the phases of a step ------------------------------------------------------------

def profiling(args, trace_dir, rank: int, device):
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
    t.ran()  # forget the validation's forward passes
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
        ran = t.ran()  # the memory levers' forward passes, recorded with the metrics
        metrics = {**sync_metrics(t, ins, loss, hits, n), **ran} if t.step % args.metric_step == 0 else {}
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
    args, model = t.args, getattr(t.model, "_orig_mod", t.model)  # compiled: the model inside (DDP's no_sync)
    loaded = (images, labels)  # as the loader gave them
    with phase(ins, "h2d"), t.moves if ins.observed is None else contextlib.nullcontext():
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
    t.optimizer.zero_grad(set_to_none=True)
    outputs = []  # the logits of each forward pass
    one_pass, one_backward = partial(forward, t, ins, outputs), partial(backward, t, ins)
    if args.grad_accum > 1:  # the race's memory lever: your TP1.5 loop (fit_levers.py), K micro-batches
        loss = fit_levers.accumulate_step(model, images, targets, args.grad_accum, one_pass, one_backward)
    else:
        loss = one_pass(images, targets)
        one_backward(loss)
    with phase(ins, "optimizer"):
        # >>> SOLUTION TP1.2: unscale, skip the step if a gradient overflowed, adapt the scale
        t.scaler.step(t.optimizer)
        t.scaler.update()
        # --- STUDENT
        # t.optimizer.step()
        # <<< SOLUTION
        t.scheduler.step()
    logits = torch.cat(outputs)
    ins.observe_once(t, phase=phase, images=images, targets=targets, logits=logits, loaded=loaded)
    hits = (logits.argmax(dim=1) == labels).sum()  # against the true labels, mixed batch or not
    return loss.detach(), hits, len(labels)


def forward(t: Training, ins: Instrument, outputs: list, images, targets):
    """One forward pass (the batch, or a micro-batch of it) and its loss."""
    with phase(ins, "forward"):
        # >>> SOLUTION TP1.2: run the forward pass and the loss under autocast
        with torch.autocast(t.device.type, dtype=t.amp_dtype, enabled=t.amp_dtype is not None):
            logits = t.model(images)
            loss = t.criterion(logits, targets)
        # --- STUDENT
        # logits = t.model(images)
        # loss = t.criterion(logits, targets)
        # <<< SOLUTION
    outputs.append(logits.detach())
    return loss


def backward(t: Training, ins: Instrument, loss) -> None:
    with phase(ins, "backward"):
        # >>> SOLUTION TP1.2: scale the loss so that fp16 gradients do not flush to zero
        t.scaler.scale(loss).backward()
        # --- STUDENT
        # loss.backward()
        # <<< SOLUTION


def sync_metrics(t: Training, ins: Instrument, loss, hits, n: int) -> dict:
    """This step's loss and accuracy averaged over the ranks: an all-reduce, and the host waits for it."""
    with phase(ins, "metrics"):
        loss_mean, acc_mean = mean_over_ranks(torch.stack([loss.float(), hits.float() / n]).to(t.device)).tolist()
    return {"loss": loss_mean, "acc": acc_mean}


if __name__ == "__main__":
    # no interpreter teardown (0.7 s with torch loaded, every job): the records are written, the trackers closed
    leave_now(main())
