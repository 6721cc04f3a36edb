"""The start of train_classifier.py's run record: its config (the options and what the run built from them), the
Instrument that times and records every step, and the first printed lines.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

from dlokit.in_job.runrecord import shared_run_id

from .instrument import Instrument
from .training_state import warmup_steps


def open_records(t, launcher: str, start: dict) -> Instrument:
    """The run record (run.json now; metrics lines and summary later) and the first printed lines."""
    args, data = t.args, t.data
    param_count = sum(p.numel() for p in t.raw_model.parameters())
    config = {**vars(args), "world_size": t.world_size, "global_batch_size": args.batch_size * t.world_size,
              "steps_per_epoch": t.steps_per_epoch, "total_steps": t.total_steps, "num_classes": data.num_classes,
              "train_images": data.train_size, "val_images": data.val_size, "param_count": param_count,
              "launcher": launcher, "device_type": t.device.type, "optimizer_class": qualified_name(t.optimizer),
              "lr_peak": t.lr_peak, "warmup_steps": warmup_steps(args, t.steps_per_epoch)}
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
