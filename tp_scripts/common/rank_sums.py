"""Sums and means over the ranks of a run (an all-reduce each; nothing to do in a single process).

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


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
