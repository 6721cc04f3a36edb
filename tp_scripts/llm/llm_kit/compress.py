"""Make a trained model smaller after training: int8 weights, 2:4 sparsity, unstructured sparsity.

Each function changes a copy's nn.Linear layers (those of the transformer blocks: the embedding and
the output projection stay as they are) and returns it:

- quantize_int8: dynamic quantisation. Weights stored as int8 (one scale per tensor), activations
  quantised on the fly at each matmul; runs on the CPU (fbgemm/x86/onednn kernels). PyTorch 2.14 still
  ships torch.ao.quantization.quantize_dynamic but deprecates it in favour of torchao's `quantize_`
  (Int8DynamicActivationInt8WeightConfig), which is not installed here.
- prune_2_4: in every group of 4 consecutive input weights, the 2 smallest magnitudes are set to zero
  (the pattern NVIDIA's sparse tensor cores run twice as fast, from Ampere on:
  torch.sparse.to_sparse_semi_structured, CUDA only). On the CPU the zeros are still multiplied:
  same speed, same dense size; the packed format (`packed_2_4`) keeps half the values plus 2 bits
  of position each.
- prune_unstructured: the given fraction of each layer's smallest weights set to zero
  (torch.nn.utils.prune.l1_unstructured, made permanent). Dense kernels gain nothing; a sparse format
  (CSR: a value and a column index per kept weight) only pays at high sparsity.

`state_dict_bytes` measures a state dict as torch.save writes it; `sparse_state_dict` stores the pruned
weights in the format that would hold them (CSR, or the 2:4 packing) to measure what sparsity saves.
"""
from __future__ import annotations

import copy
import io
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import prune


def block_linears(model) -> list[tuple[str, nn.Linear]]:
    return [(f"layers.{name}", module) for name, module in model.layers.named_modules() if isinstance(module, nn.Linear)]


def quantize_int8(model):
    from torch.ao.quantization import quantize_dynamic

    quantized = copy.deepcopy(model)
    with warnings.catch_warnings():  # the deprecation notice of torch.ao.quantization, said once in the docstring
        warnings.simplefilter("ignore")
        quantized.layers = quantize_dynamic(quantized.layers, {nn.Linear}, dtype=torch.qint8)
    return quantized


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """True where a weight is kept: the 2 largest magnitudes of each group of 4 along the input dimension."""
    groups = weight.abs().reshape(weight.shape[0], -1, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return keep.reshape(weight.shape)


@torch.no_grad()
def prune_2_4(model):
    pruned = copy.deepcopy(model)
    for _, linear in block_linears(pruned):
        if linear.in_features % 4:
            raise ValueError(f"2:4 sparsity needs in_features divisible by 4, got {linear.in_features}")
        linear.weight.mul_(mask_2_4(linear.weight))
    return pruned


def prune_unstructured(model, amount: float):
    pruned = copy.deepcopy(model)
    for _, linear in block_linears(pruned):
        prune.l1_unstructured(linear, "weight", amount=amount)
        prune.remove(linear, "weight")  # the mask multiplied in for good: a plain weight with zeros
    return pruned


def packed_2_4(weight: torch.Tensor) -> dict:
    """A 2:4-sparse weight as sparse tensor cores store it: the kept values, and each one's position
    in its group of 4 (2 bits; 4 of them per byte)."""
    groups = weight.reshape(weight.shape[0], -1, 4)
    positions = mask_2_4(weight).reshape(groups.shape).nonzero()[:, -1].reshape(weight.shape[0], -1)
    values = groups.gather(-1, positions.reshape(weight.shape[0], -1, 2)).reshape(weight.shape[0], -1)
    bits = F.pad(positions.to(torch.uint8).flatten(), (0, -positions.numel() % 4)).reshape(-1, 4)
    packed = bits[:, 0] | bits[:, 1] << 2 | bits[:, 2] << 4 | bits[:, 3] << 6
    return {"values": values.clone(), "positions": packed}


def sparse_state_dict(model, layout: str) -> dict:
    """The state dict with every block linear's weight stored sparse: 'csr' (int32 indices) or '2:4'."""
    state = dict(model.state_dict())
    for name, linear in block_linears(model):
        weight = linear.weight.detach()
        if layout == "csr":
            with warnings.catch_warnings():  # "sparse CSR support is in beta"
                warnings.simplefilter("ignore")
                csr = weight.to_sparse_csr()
            state[f"{name}.weight"] = {"values": csr.values(), "crow": csr.crow_indices().int(),
                                       "col": csr.col_indices().int()}
        elif layout == "2:4":
            state[f"{name}.weight"] = packed_2_4(weight)
        else:
            raise ValueError(f"unknown sparse layout {layout!r}")
    return state


def state_dict_bytes(state: dict) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


def zero_fraction(model) -> float:
    """Share of zeros among the block linears' weights (dense ones; quantised layers count as dense)."""
    weights = [linear.weight.detach() for _, linear in block_linears(model)]
    if not weights:
        return 0.0
    return sum((w == 0).sum().item() for w in weights) / sum(w.numel() for w in weights)
