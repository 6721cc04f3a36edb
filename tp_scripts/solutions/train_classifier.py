"""Train a torchvision image classifier, on CPU or GPUs, in one process or many, and record honest timings.

    python train_classifier.py --data data/generated/tiny --model resnet18 --image-size 64 --epochs 3
    torchrun --nproc_per_node=2 train_classifier.py --data synthetic --test
    srun python -u train_classifier.py ...            (one task per GPU; the rank comes from Slurm)

Every rank writes a run record (<runs-dir>/<run-id>/rank<k>/: run.json, metrics.jsonl, summary.json,
see docs/run-records.md); rank 0 prints a few lines. `--help` lists every option with its reason.

This file is the solution. Each marked SOLUTION block is an optimisation a TP asks you to add: in your
version it is a TODO, and the STUDENT lines of the block (if any) stand in its place.
"""
import contextlib
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset

from dlokit import rank as job
from dlokit.measure import EnergyMeter, StepTimer, peak_gpu_memory_mb, peak_rss_mb
from dlokit.runrecord import RunRecorder, shared_run_id

from checkpointing import CheckpointError, gather_rng_states, load_checkpoint, save_checkpoint
from image_data import ResumableSampler, SyntheticBatches, image_folders
from train_options import parse_args

TIMING_WARMUP_STEPS = 2  # left out of the averages: first steps pay for allocation, autotuning, compilation
AMP_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def build_model(name: str, num_classes: int) -> nn.Module:
    extra = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    return torchvision.models.get_model(name, num_classes=num_classes, **extra)


def parallelize(model: nn.Module, args, device, world_size: int) -> nn.Module:
    """Data parallelism sits beside the model: wrap it, leave its code alone."""
    if world_size == 1:
        return model
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # >>> SOLUTION TP2.2: DDP keeps one replica per rank and averages the gradients during backward
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=args.find_unused_parameters)
    # <<< SOLUTION
    return model


def set_tf32(enabled: bool) -> None:
    """fp32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa), GPU only.

    PyTorch lets cuDNN convolutions use TF32 by default: turn it off explicitly so that the fp32
    baseline is really fp32.
    """
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = "tf32" if enabled else "ieee"
        torch.backends.cudnn.conv.fp32_precision = "tf32" if enabled else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def tf32_enabled() -> bool:
    if hasattr(torch.backends.cudnn, "conv"):
        return torch.backends.cuda.matmul.fp32_precision == "tf32" == torch.backends.cudnn.conv.fp32_precision
    return torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
        values /= dist.get_world_size()
    return values


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


@torch.no_grad()  # no graph kept for backward: less memory, less time
def evaluate(model, loader, criterion, amp_dtype, channels_last: bool) -> dict:
    model.eval()
    device = next(model.parameters()).device  # wherever the weights are, the batches go too
    totals = torch.zeros(4, device=device)  # loss sum, top-1 hits, top-5 hits, images
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        totals += torch.stack([
            nn.functional.cross_entropy(logits.float(), labels, reduction="sum"),
            (top5[:, 0] == labels).sum().float(), (top5 == labels[:, None]).any(dim=1).sum().float(),
            torch.tensor(float(len(labels)), device=device)])
    loss, top1, top5, count = sum_over_ranks(totals).tolist()
    model.train()
    return {"val_loss": loss / max(count, 1), "val_acc": top1 / max(count, 1), "val_acc5": top5 / max(count, 1)}


def param_checksum(model: nn.Module) -> torch.Tensor:
    """Two numbers that differ when any weight differs: cheap to all-gather and compare."""
    params = [p.detach().double() for p in model.parameters()]
    return torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)])


def save_and_log(args, record, path, raw_model, optimizer, scheduler, scaler, device, epoch, batch_in_epoch, step,
                 world_size, is_main):
    """Every rank hands its random state to rank 0, which writes the file."""
    rng_states = gather_rng_states(device)
    if is_main:
        started = time.perf_counter()
        save_checkpoint(path, model=raw_model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                        epoch=epoch, batch_in_epoch=batch_in_epoch, step=step, world_size=world_size,
                        batch_size=args.batch_size, rng_states=rng_states)
        record.log("event", event="checkpoint_saved", path=str(path), step=step, epoch=epoch,
                   batch_in_epoch=batch_in_epoch, seconds=time.perf_counter() - started)


def main(argv=None) -> int:
    env = job.detect()
    args = parse_args(argv, world_size=env.world_size)  # exits with a clear message on a bad option
    device = job.init_process_group(device=None if args.device == "auto" else args.device)
    is_main = env.rank == 0
    world_size = env.world_size

    def say(*parts):
        if is_main:
            print(*parts, flush=True)

    def fail(message: str) -> int:
        if is_main:
            print(f"train_classifier.py: error: {message}", file=sys.stderr, flush=True)
        job.destroy_process_group()
        return 2

    set_tf32(args.tf32)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    amp_dtype = AMP_DTYPES[args.amp]

    # ---- data -------------------------------------------------------------------------------------
    non_blocking = False
    val_loader = None
    if args.data == "synthetic":
        train_loader = SyntheticBatches(args.batch_size, args.image_size, args.num_classes, args.synthetic_steps,
                                        device, seed=args.seed + env.rank)
        sampler, shard_sampler, num_classes, train_size = train_loader, None, args.num_classes, None
        loader_options = {}
    else:
        train_set, val_set, classes = image_folders(args.data, args.image_size)
        num_classes, train_size = len(classes), len(train_set)
        # >>> SOLUTION TP2.2: each rank reads its own shard of the data set (set_epoch reshuffles it)
        shard_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=env.rank, shuffle=True,
                                           seed=args.seed)
        # --- STUDENT
        # shard_sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(args.seed))
        # <<< SOLUTION
        sampler = ResumableSampler(shard_sampler)
        # >>> SOLUTION TP2.1: prepare batches in worker processes, in pinned memory, ahead of time
        loader_options = dict(num_workers=args.num_workers, pin_memory=args.pin_memory,
                              prefetch_factor=args.prefetch_factor if args.num_workers > 0 else None,
                              persistent_workers=args.persistent_workers and args.num_workers > 0)
        non_blocking = args.non_blocking
        # --- STUDENT
        # loader_options = dict(num_workers=0)  # every option off: the training loop decodes each image itself
        # <<< SOLUTION
        # A last batch of one image would break BatchNorm ("expected more than 1 value per channel").
        drop_last = args.drop_last or len(shard_sampler) % args.batch_size == 1
        train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=drop_last,
                                  generator=torch.Generator().manual_seed(args.seed), **loader_options)
        if val_set is not None and not args.test:
            my_share = Subset(val_set, range(env.rank, len(val_set), world_size))  # no padding: exact accuracy
            val_loader = DataLoader(my_share, batch_size=args.batch_size, **loader_options)
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        return fail(f"{args.data}: fewer training images per process than --batch-size {args.batch_size} "
                    "(and --drop-last is on)")
    epochs = math.ceil(args.test_nsteps / steps_per_epoch) if args.test else args.epochs
    total_steps = args.test_nsteps if args.test else epochs * steps_per_epoch

    # ---- model, loss, optimizer --------------------------------------------------------------------
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = build_model(args.model, num_classes)
    # >>> SOLUTION TP1.1: the weights must live where the computation happens
    model = model.to(device)
    # <<< SOLUTION
    # >>> SOLUTION TP1.3: NHWC weights: tensor-core convolutions need no layout conversion
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    # <<< SOLUTION
    model = parallelize(model, args, device, world_size)
    raw_model = model.module if isinstance(model, DDP) else model  # what we save, evaluate and check
    param_count = sum(p.numel() for p in raw_model.parameters())
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps)
    # >>> SOLUTION TP1.2: fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    # --- STUDENT
    # scaler = torch.amp.GradScaler(device.type, enabled=False)
    # <<< SOLUTION
    torch.manual_seed(args.seed + 1 + env.rank)  # augmentations: a different random stream per rank

    start = {"epoch": 0, "batch_in_epoch": 0, "step": 0}
    if args.resume:
        try:
            start = load_checkpoint(args.resume, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, device=device, rank=env.rank, world_size=world_size,
                                    batch_size=args.batch_size)
        except CheckpointError as error:
            return fail(str(error))
    if args.compile:
        model = torch.compile(model)

    # ---- records --------------------------------------------------------------------------------
    run_id = shared_run_id()
    config = {**vars(args), "world_size": world_size, "global_batch_size": args.batch_size * world_size,
              "steps_per_epoch": steps_per_epoch, "total_steps": total_steps, "num_classes": num_classes,
              "train_images": train_size, "param_count": param_count, "launcher": env.source,
              "device_type": device.type}
    record = RunRecorder(config, rank=env.rank, world_size=world_size, run_id=run_id, runs_dir=args.runs_dir,
                         script="train_classifier.py", device=device)
    checkpoint_path = args.checkpoint_path or record.folder.parent / "checkpoint.pt"
    say(f"run {run_id} | {world_size} process(es) via {env.source} on {device.type} | {args.model} "
        f"{param_count / 1e6:.1f}M params | batch {args.batch_size}/process, {args.batch_size * world_size} global | "
        f"amp {args.amp} | channels_last {args.channels_last} | compile {args.compile}")
    say(f"data {args.data} | {train_size or 'synthetic'} train images, {num_classes} classes, "
        f"{steps_per_epoch} steps/epoch | loader {loader_options or 'on-device'} non_blocking {non_blocking}")
    say(f"records in {record.folder.parent}")
    if args.resume:
        record.log("event", event="resumed", checkpoint=start["path"], epoch=start["epoch"], step=start["step"],
                   batch_in_epoch=start["batch_in_epoch"])
        say(f"resumed from {start['path']} at step {start['step']} (epoch {start['epoch'] + 1}, "
            f"batch {start['batch_in_epoch']})")

    # >>> SOLUTION TP1.4: name each phase so that it shows up as a labelled span in the profiler trace
    phase = torch.profiler.record_function
    # --- STUDENT
    # phase = lambda name: contextlib.nullcontext()
    # <<< SOLUTION
    profiler, trace_dir = None, record.folder.parent / "profile"
    # >>> SOLUTION TP1.4: skip a step, warm up, then trace a few steps; one trace file per rank
    if args.profile:
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []),
            schedule=torch.profiler.schedule(wait=args.profile_wait, warmup=args.profile_warmup,
                                             active=args.profile_active, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{env.rank}"),
            record_shapes=True, profile_memory=True)
        profiler.start()
    # <<< SOLUTION

    # ---- training ---------------------------------------------------------------------------------
    timer, energy = StepTimer(device), EnergyMeter(device)
    step, observed, timed, first_load, epochs_done = start["step"], None, [], None, start["epoch"]
    val, best_val_acc, last_metrics = {}, None, {}
    done = step >= total_steps
    for epoch in range(start["epoch"], epochs):
        if done:
            break
        first_batch = start["batch_in_epoch"] if epoch == start["epoch"] else 0
        sampler.skip = first_batch * args.batch_size
        # >>> SOLUTION TP2.2: a new shuffle each epoch, the same on every rank (so the shards stay disjoint)
        sampler.set_epoch(epoch)
        # <<< SOLUTION
        batch_in_epoch, epoch_started = first_batch, time.perf_counter()
        sums = torch.zeros(3, device=device)  # loss sum, hits, images: summed on the device, no sync per step
        model.train()
        batches = iter(train_loader)
        while True:
            timer.start()
            with phase("data"):
                batch = next(batches, None)
            if batch is None:
                break
            images, labels = batch
            timer.split("data")
            pinned = images.is_pinned()
            # >>> SOLUTION TP1.1: move the batch to the device (non_blocking: overlap the copy with compute)
            images = images.to(device, non_blocking=non_blocking)
            labels = labels.to(device, non_blocking=non_blocking)
            # <<< SOLUTION
            # >>> SOLUTION TP1.3: NHWC images to match the NHWC weights
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            # <<< SOLUTION
            timer.split("h2d")
            lr = optimizer.param_groups[0]["lr"]
            with phase("forward"):
                # >>> SOLUTION TP1.2: run the forward pass and the loss under autocast
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    logits = model(images)
                    loss = criterion(logits, labels)
                # --- STUDENT
                # logits = model(images)
                # loss = criterion(logits, labels)
                # <<< SOLUTION
            timer.split("forward")
            with phase("backward"):
                optimizer.zero_grad(set_to_none=True)
                # >>> SOLUTION TP1.2: scale the loss so that fp16 gradients do not flush to zero
                scaler.scale(loss).backward()
                # --- STUDENT
                # loss.backward()
                # <<< SOLUTION
            timer.split("backward")
            with phase("optimizer"):
                # >>> SOLUTION TP1.2: unscale, skip the step if a gradient overflowed, adapt the scale
                scaler.step(optimizer)
                scaler.update()
                # --- STUDENT
                # optimizer.step()
                # <<< SOLUTION
                scheduler.step()
            timer.split("optimizer")
            step += 1
            batch_in_epoch += 1
            hits = (logits.argmax(dim=1) == labels).sum()
            sums += torch.stack([loss.detach().float() * len(labels), hits.float(), hits.new_tensor(len(labels)).float()]).to(device)
            metrics = {}
            if step % args.metric_step == 0:  # one small all-reduce, and the GPU waits for it
                with phase("metrics"):
                    loss_mean, acc_mean = mean_over_ranks(torch.stack([loss.detach().float(), hits / len(labels)])).tolist()
                metrics = {"loss": loss_mean, "acc": acc_mean}
                last_metrics = metrics
                timer.split("metrics")
            if profiler is not None:
                profiler.step()

            splits = dict(timer.splits)
            t_step = sum(seconds for name, seconds in splits.items() if name != "data")
            samples = len(labels) * world_size
            if first_load is None:
                first_load = splits["data"]
            if observed is None:  # what really ran, for the notebook's check cells
                first_conv = next((m for m in raw_model.modules() if isinstance(m, nn.Conv2d)), None)
                observed = {
                    "device": str(images.device), "model_device": str(next(raw_model.parameters()).device),
                    "amp_dtype": str(logits.dtype).replace("torch.", ""), "grad_scaler": scaler.is_enabled(),
                    "channels_last_input": images.is_contiguous(memory_format=torch.channels_last),
                    "channels_last_weights": first_conv is not None and
                    first_conv.weight.is_contiguous(memory_format=torch.channels_last),
                    "ddp_wrapped": isinstance(getattr(model, "_orig_mod", model), DDP),
                    "ddp_world_size": dist.get_world_size() if dist.is_initialized() else 1,
                    "sync_bn": any(isinstance(m, nn.SyncBatchNorm) for m in raw_model.modules()),
                    "compiled": hasattr(model, "_orig_mod"),
                    "sampler": type(shard_sampler).__name__ if shard_sampler is not None else None,
                    "samples_per_rank_per_epoch": len(shard_sampler) if shard_sampler is not None else None,
                    "loader_num_workers": getattr(train_loader, "num_workers", None),
                    "loader_pin_memory": getattr(train_loader, "pin_memory", None),
                    "loader_prefetch_factor": getattr(train_loader, "prefetch_factor", None),
                    "loader_persistent_workers": getattr(train_loader, "persistent_workers", None),
                    "batch_pinned": pinned, "non_blocking": non_blocking,
                    "record_function_labels": phase is torch.profiler.record_function,
                    "profiler": profiler is not None,
                    "tf32": tf32_enabled(),
                    "cudnn_benchmark": torch.backends.cudnn.benchmark,
                }
                record.amend(observed=observed)
                record.log("event", event="observed", **observed)
            energy.sample_power()
            record.log("step", epoch=epoch, step=step, lr=lr, batch_size=samples,
                       **{f"t_{name}": round(seconds, 6) for name, seconds in splits.items()},
                       t_step=round(t_step, 6), throughput_train=samples / (splits["data"] + t_step),
                       throughput_compute=samples / t_step, gpu_mem_mb=peak_gpu_memory_mb(device), **metrics)
            if step > start["step"] + TIMING_WARMUP_STEPS:
                timed.append({**splits, "step": t_step, "samples": samples})
            if step % args.print_every == 0 or step == total_steps:
                say(f"step {step:5d}/{total_steps} | epoch {epoch + 1} | loss {last_metrics.get('loss', float('nan')):.4f} "
                    f"acc {last_metrics.get('acc', float('nan')):.3f} | lr {lr:.4f} | "
                    f"{samples / (splits['data'] + t_step):.0f} img/s (compute {samples / t_step:.0f}) | "
                    f"data {splits['data'] * 1e3:.1f} ms step {t_step * 1e3:.1f} ms")

            if args.checkpoint_steps and step % args.checkpoint_steps == 0:
                save_and_log(args, record, checkpoint_path, raw_model, optimizer, scheduler, scaler, device,
                             epoch, batch_in_epoch, step, world_size, is_main)
            if step >= total_steps:
                done = True
                break

        loss_sum, hits, images_seen = sum_over_ranks(sums).tolist()
        epoch_time = time.perf_counter() - epoch_started
        epochs_done = epoch + 1
        message = f"epoch {epoch + 1}/{epochs} in {epoch_time:.1f} s"
        if images_seen:  # zero when resuming from a checkpoint taken on the epoch's last step
            record.log("epoch", epoch=epoch, train_loss=loss_sum / images_seen, train_acc=hits / images_seen,
                       epoch_time_s=epoch_time, throughput_train=images_seen / epoch_time)
            message += f" | train loss {loss_sum / images_seen:.4f} acc {hits / images_seen:.3f}"
        if val_loader is not None:
            val = evaluate(raw_model, val_loader, criterion, amp_dtype, args.channels_last)
            best_val_acc = max(best_val_acc or 0.0, val["val_acc"])
            record.log("val", epoch=epoch, step=step, **val)
            message += f" | val loss {val['val_loss']:.4f} acc {val['val_acc']:.3f} top5 {val['val_acc5']:.3f}"
        say(message)
        if args.checkpoint_epochs and batch_in_epoch == steps_per_epoch:
            save_and_log(args, record, checkpoint_path, raw_model, optimizer, scheduler, scaler, device,
                         epoch + 1, 0, step, world_size, is_main)

    if profiler is not None:
        profiler.stop()
        files = sorted(str(p) for p in trace_dir.glob(f"rank{env.rank}.*"))
        record.log("event", event="profiler_trace", files=files)
        say(f"profiler traces in {trace_dir}" if files else
            f"no profiler trace: the run ended before wait+warmup+active = "
            f"{args.profile_wait + args.profile_warmup + args.profile_active} steps")

    # ---- summary ----------------------------------------------------------------------------------
    checksums = param_checksum(raw_model).to(device)
    if dist.is_initialized():
        gathered = [torch.zeros_like(checksums) for _ in range(world_size)]
        dist.all_gather(gathered, checksums)
    else:
        gathered = [checksums]
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    mean = {name: sum(t.get(name, 0.0) for t in timed) / len(timed) for name in
            ("data", "h2d", "forward", "backward", "optimizer", "metrics", "step")} if timed else {}
    per_step_samples = sum(t["samples"] for t in timed) / len(timed) if timed else None
    summary = {
        "steps": step, "epochs": epochs_done,
        "resumed_from_step": start["step"] if args.resume else None,
        "first_step_load_s": first_load, "timing_warmup_steps": TIMING_WARMUP_STEPS, "timed_steps": len(timed),
        **{f"t_{name}": seconds for name, seconds in mean.items()},
        "throughput_train": per_step_samples / (mean["data"] + mean["step"]) if timed else None,
        "throughput_compute": per_step_samples / mean["step"] if timed else None,
        "gpu_mem_peak_mb": peak_gpu_memory_mb(device), "host_rss_peak_mb": peak_rss_mb(),
        "energy_j": energy.energy_j(), "peak_power_w": energy.peak_power_w,
        "val_acc": val.get("val_acc"), "val_acc5": val.get("val_acc5"), "best_val_acc": best_val_acc,
        "train_loss": last_metrics.get("loss"),
        "param_checksum": checksums.tolist(), "params_identical_across_ranks": identical,
        "observed": observed,
    }
    record.finish(**summary)
    if timed:
        say(f"done: {step} steps | {summary['throughput_train']:.1f} img/s train, "
            f"{summary['throughput_compute']:.1f} img/s compute | per step: data {mean['data'] * 1e3:.1f} ms, "
            f"h2d {mean['h2d'] * 1e3:.1f}, forward {mean['forward'] * 1e3:.1f}, backward {mean['backward'] * 1e3:.1f}, "
            f"optimizer {mean['optimizer'] * 1e3:.1f} | first batch {first_load:.2f} s | "
            f"host RSS {summary['host_rss_peak_mb']:.0f} MiB" +
            (f" | GPU peak {summary['gpu_mem_peak_mb']:.0f} MiB" if summary["gpu_mem_peak_mb"] is not None else ""))
    say(f"parameters identical across {world_size} rank(s): {identical}")
    job.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
