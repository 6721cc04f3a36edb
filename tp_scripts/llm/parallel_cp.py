"""Context parallelism: each rank holds a slice of the sequence; attention passes the key/value
slices around the ring so every query still sees its whole causal context (ring attention).

PyTorch's implementation (torch.distributed.tensor.experimental.context_parallel) swaps the
scaled-dot-product-attention kernel for a ring version. It covers the CUDA flash / efficient /
cuDNN kernels; the CPU kernel is not among them in the versions we checked, so on CPU
`probe_context_parallel` reports why and the training script records the run as skipped.
"""
import contextlib

import torch
import torch.nn.functional as F


def context_parallel_available():
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as error:
        return False, f"this torch ({torch.__version__}) has no context_parallel: {error}"
    return True, ""


def probe_context_parallel(cp_mesh, device):
    """Try one tiny ring attention forward+backward; returns (works, reason)."""
    available, reason = context_parallel_available()
    if not available:
        return False, reason
    from torch.distributed.tensor.experimental import context_parallel
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(1, 2, 8 * cp_mesh.size(), 16, device=device, dtype=dtype)
    try:
        with context_parallel(cp_mesh, buffers=[x], buffer_seq_dims=[2], no_restore_buffers={x}):
            q = x.detach().requires_grad_()
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    except Exception as error:  # the failure mode differs between versions; report it verbatim
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return False, f"context_parallel does not run on {device.type} here ({type(error).__name__}: {first_line})"
    return True, ""


def context_parallel_region(model, cp_mesh, inputs, targets):
    """Context manager: shards inputs, targets and the rotary tables along the sequence in place."""
    from torch.distributed.tensor.experimental import context_parallel
    if cp_mesh is None:
        return contextlib.nullcontext()
    return context_parallel(cp_mesh, buffers=[inputs, targets, model.rope_cos, model.rope_sin],
                            buffer_seq_dims=[1, 1, 0, 0], no_restore_buffers={inputs, targets})
