"""A classifier's loss above chance after the warm-up: the training is diverging (most often a learning rate too
high for the batch). One rule, said in the step line a job prints (so the queue shows it live) and in the checks.

Chance is ln(classes): the cross-entropy of a model that gives every class the same probability, whatever the
(hard, smoothed or mixed) targets. An untrained network starts about there, a little above; so a step is judged
after the learning-rate warm-up and the first SETTLING_STEPS, and only a loss MARGIN × chance or more counts.
"""
from __future__ import annotations

import math

SETTLING_STEPS = 3
MARGIN = 1.5
WORD = "diverging:"  # how the note begins, where the queue shows it


def diverging(loss, *, step: int, num_classes, warmup_steps=0, lr_peak=None) -> str | None:
    """'diverging: loss 13.4 at step 5, above chance ln(10)=2.30; the peak lr 0.081 …', or None (a loss at or
    near chance or below it, a step in the warm-up, a run without its classes' count)."""
    if loss is None or not num_classes or num_classes < 2 or step <= max(warmup_steps or 0, SETTLING_STEPS):
        return None
    chance = math.log(num_classes)
    if loss <= MARGIN * chance:  # a NaN loss is not <=: diverged too
        return None
    lr = f"the peak lr {lr_peak:.3g}" if lr_peak is not None else "the learning rate"
    return (f"{WORD} loss {loss:.3g} at step {step}, above chance ln({num_classes})={chance:.2f}; {lr} is likely "
            "too high for this batch (--lr, or a longer --warmup-steps)")
