"""The end of train_classifier.py's run: the profiler's trace files, the weights compared across ranks, and
summary.json.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .layer_drop import skipped_blocks


def report(t, ins, start: dict) -> None:
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
