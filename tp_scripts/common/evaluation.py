"""The end of an epoch in train_classifier.py: its loss and accuracy over every rank, then a validation pass
(loss, its per-image spread, top-1 and top-5 accuracy) on every rank's share of the validation set.

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py, and by the
race's scorer (dlokit/race/score_checkpoint.py): not part of any TP.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn as nn

from .rank_sums import epoch_sums, sum_over_ranks


def end_of_epoch(t, ins, epoch: int, totals, started: float, before=None) -> None:
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
