"""Model FLOPs utilisation: achieved training FLOP/s over the peak of the arithmetic the run uses.

The peak depends on the GPU model and on the arithmetic: bf16 tensor cores, TF32 tensor cores (fp32
matmuls when TF32 is allowed, e.g. torch.set_float32_matmul_precision("high") or --tf32), or plain
fp32 (CUDA cores, TF32 off: PyTorch's default). Dividing an fp32 run by the bf16 peak makes it look
10x worse than it is.

Peaks: DENSE figures (no 2:4 sparsity; data sheets print the sparse figure, twice these, with an
asterisk), in FLOP/s, from NVIDIA's data sheets: A100 Tensor Core GPU (2021), H100 Tensor Core GPU
(SXM / NVL columns, and the H100 PCIe sheet), H200 Tensor Core GPU (SXM / NVL), L40S, L40, L4, A40,
A10, V100 (no TF32 or bf16 tensor cores). An unknown GPU gets no MFU (and says so), never a guess.
"""
from __future__ import annotations

import re

import torch

# (pattern on torch.cuda.get_device_name, label, {arithmetic: dense peak FLOP/s}); first match wins,
# so the more specific names come first ("H100 NVL" before "H100", "A100" cannot match "A10").
PEAKS = [
    (r"\bH200 NVL\b", "H200 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    (r"\bGH200\b", "GH200 (H100/H200 SXM class)", {"bf16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12}),
    (r"\bH200\b", "H200 SXM", {"bf16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12}),
    (r"\bH100 NVL\b", "H100 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (r"\bH100\b", "H100 SXM", {"bf16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12}),
    (r"\bA100\b", "A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"\bL40S\b", "L40S", {"bf16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12}),
    (r"\bL40\b", "L40", {"bf16": 181.05e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    (r"\bL4\b", "L4", {"bf16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    (r"\bA40\b", "A40", {"bf16": 149.7e12, "tf32": 74.8e12, "fp32": 37.4e12}),
    (r"\bA10\b", "A10", {"bf16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe", {"fp32": 14e12}),
    (r"\bV100\b", "V100 SXM2", {"fp32": 15.7e12}),
]


def arithmetic(dtype: str, tf32: bool) -> str:
    """The --dtype of the run and the TF32 setting -> the key of the peak to divide by."""
    if dtype == "bf16":
        return "bf16"
    return "tf32" if tf32 else "fp32"


def peak_for_name(name: str, kind: str) -> tuple[float | None, str]:
    """(peak FLOP/s, how it was chosen) for a GPU name and an arithmetic; (None, why) if unknown."""
    for pattern, label, peaks in PEAKS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            if kind not in peaks:
                return None, f"{label} has no {kind} tensor-core peak in the table: no MFU"
            return peaks[kind], f"{label} dense {kind} peak {peaks[kind] / 1e12:g} TFLOP/s"
    return None, f"no peak known for GPU {name!r}: no MFU (add it to mfu.PEAKS with its data-sheet source)"


def peak_flops(device, kind: str = "bf16") -> tuple[float | None, str]:
    """The peak of this rank's device for that arithmetic; (None, why) on CPU or an unknown GPU."""
    if device is None or torch.device(device).type != "cuda":
        return None, "no MFU on CPU (no reliable peak)"
    return peak_for_name(torch.cuda.get_device_name(device), kind)


def mfu(tokens_per_s: float | None, flops_per_token: float, n_devices: int, peak: float | None) -> float | None:
    if peak is None or tokens_per_s is None:
        return None
    return tokens_per_s * flops_per_token / (peak * n_devices)
