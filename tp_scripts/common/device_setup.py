"""train_classifier.py's device: the job's process group joined, and the maths flags (TF32, cuDNN autotuning).

A module shared by tp_scripts/train_classifier.py (yours) and tp_scripts/solutions/train_classifier.py:
not part of any TP.
"""
from __future__ import annotations

import torch

from dlokit.in_job import rank as job


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
