"""Model FLOPs utilisation: achieved training FLOP/s over the device's peak (dense bf16)."""
import torch

# Dense (no 2:4 sparsity) bf16 tensor-core peaks, in FLOP/s, from the vendor data sheets.
PEAK_BF16_FLOPS = {
    "A100": 312e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,   # SXM; also the NVL figure's order of magnitude
    "H200": 989e12,
}


def peak_flops(device) -> float | None:
    """The peak of this rank's GPU, or None on CPU or an unknown GPU (no MFU then)."""
    if device is None or device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, device) -> float | None:
    peak = peak_flops(device)
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / (peak * n_devices)
