"""The LR range test of train_classifier.py --lr-finder (Day 3, TP3.2): a learning rate before training.

    batches = first_batches(train_loader, steps, device)
    trials = lr_range_test(model, make_optimizer, batches, criterion, amp_dtype, log_spaced(1e-7, 10, 16))
    suggest_lr(trials)   # {"lr_finder_suggested_lr": ..., ...}

Each trial trains the same few batches at one learning rate. Plotted against the learning rate (log scale),
the loss a trial reaches stays flat (too small to move), falls, bottoms out, then blows up. For the
trials to be comparable, each must start from the same initial weights with a fresh optimiser: a trial
that inherits the weights and the momentum of the previous ones measures the whole history, not its lr.
Then every trial's first loss is the same number. Run by notebooks/day3_large_batch_compile_hpo.ipynb
(through train_classifier.py --lr-finder).
"""
import copy
import math

import torch

DIVERGED = 4.0  # a trial whose loss passes 4x its first loss has blown up: larger lrs are not tried


def log_spaced(low: float, high: float, count: int) -> list[float]:
    return [low * (high / low) ** (k / (count - 1)) for k in range(count)]


def first_batches(loader, count: int, device, channels_last: bool = False) -> list:
    """The first `count` batches of the loader (again from its start if it has fewer), on the device: every
    trial trains on exactly these."""
    batches = []
    while len(batches) < count:
        before = len(batches)
        for images, labels in loader:
            images = images.to(device)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            batches.append((images, labels.to(device)))
            if len(batches) == count:
                break
        if len(batches) == before:
            raise ValueError("the training loader gave no batch")
    return batches


def train_step(model, optimizer, criterion, images, labels, amp_dtype) -> float:
    with torch.autocast(images.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def lr_range_test(model, make_optimizer, batches, criterion, amp_dtype, lrs, seed: int = 0, on_trial=None) -> list:
    """One trial per learning rate, in increasing order, until one blows up. make_optimizer(lr) builds the
    optimiser; on_trial(trial) is called after each trial (to record it)."""
    model.train()
    initial_weights = copy.deepcopy(model.state_dict())  # BatchNorm's running statistics included
    optimizer = make_optimizer(lrs[0])
    trials = []
    for index, lr in enumerate(lrs):
        # >>> SOLUTION TP3.2: every trial starts from the same weights, with a fresh optimiser (no momentum left)
        model.load_state_dict(initial_weights)
        optimizer = make_optimizer(lr)
        # <<< SOLUTION
        for group in optimizer.param_groups:
            group["lr"] = lr
        torch.manual_seed(seed)  # the same dropout / stochastic depth draws in every trial
        losses = []
        for images, labels in batches:
            losses.append(train_step(model, optimizer, criterion, images, labels, amp_dtype))
            if blew_up(losses):
                break
        trials.append(describe(index, lr, losses))
        if on_trial is not None:
            on_trial(trials[-1])
        if trials[-1]["diverged"]:
            break
    return trials


def blew_up(losses: list[float]) -> bool:
    return not math.isfinite(losses[-1]) or losses[-1] > DIVERGED * losses[0]


def describe(index: int, lr: float, losses: list[float]) -> dict:
    """One trial as its 'lr_trial' record line; a non-finite loss is written as null."""
    finite = [x if math.isfinite(x) else None for x in losses]
    last_half = losses[len(losses) // 2:]
    smoothed = sum(last_half) / len(last_half)
    return {"trial": index, "lr": lr, "first_loss": finite[0], "final_loss": finite[-1],
            "smoothed_loss": smoothed if math.isfinite(smoothed) else None, "steps": len(losses),
            "diverged": blew_up(losses), "losses": finite}


def suggest_lr(trials: list[dict]) -> dict:
    """The summary of the test. The suggestion is the lr of the lowest smoothed loss divided by 10: the
    lowest loss sits at the edge of blowing up, a tenth of it trains fast and stays clear of that edge.
    When the lowest loss is the smallest lr's, no trial lowered the loss: the test saw no descent
    (lr_finder_no_descent) and suggests nothing, since a tenth of it would lie below the range tried.
    The steepest descent (largest fall of the smoothed loss per decade of lr) is given beside it."""
    usable = [t for t in trials if not t["diverged"] and t["smoothed_loss"] is not None]
    firsts = [t["first_loss"] for t in trials if t["first_loss"] is not None]
    spread = (max(firsts) - min(firsts)) / abs(sum(firsts) / len(firsts)) if firsts else None
    summary = {"lr_finder_trials": len(trials), "lr_finder_rule": "min_loss_lr/10",
               "lr_finder_suggested_lr": None, "lr_finder_min_loss_lr": None, "lr_finder_steepest_lr": None,
               "lr_finder_no_descent": False, "lr_finder_first_loss_spread": spread,
               "lr_finder_diverged_at_lr": next((t["lr"] for t in trials if t["diverged"]), None)}
    if not usable:
        return summary
    best = min(usable, key=lambda t: t["smoothed_loss"])
    summary["lr_finder_min_loss_lr"] = best["lr"]
    if best is usable[0] and len(usable) > 1:
        summary["lr_finder_no_descent"] = True
    else:
        summary["lr_finder_suggested_lr"] = best["lr"] / 10
    slopes = [((b["smoothed_loss"] - a["smoothed_loss"]) / math.log10(b["lr"] / a["lr"]), a["lr"])
              for a, b in zip(usable, usable[1:])]
    if slopes and min(slopes)[0] < 0:  # no fall at all: no steepest descent
        summary["lr_finder_steepest_lr"] = min(slopes)[1]
    return summary
