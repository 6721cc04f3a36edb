"""Context parallelism: each rank holds a slice of the sequence; attention fetches the keys and values
of the other slices.

Every CP rank reads the SAME batch (the data-parallel degree of --mode cp is 1) and keeps its part of
the sequence. With c ranks the sequence is cut into 2c chunks and rank r keeps chunks r and 2c-1-r:
under a causal mask late positions attend to more keys than early ones, so each rank gets one early
and one late chunk (load balancing).

Attention needs the keys and values of every earlier position, and other ranks hold most of them:

- "allgather" (the default, any device): all-gather K and V over the CP group and attend with a mask
  built from the global positions; the variant Llama 3 was trained with. Backward sums each rank's
  gradient of the gathered K/V back to their owner (a reduce-scatter; all-reduce + slice on gloo,
  which has no reduce-scatter). Memory: the full sequence's K/V, but never the full activations.
- "torch" (CUDA): PyTorch's ring attention (torch.distributed.tensor.experimental.context_parallel)
  passes K/V blocks around the ring while it computes. It swaps SDPA's CUDA kernels; it has no CPU
  kernel, so on CPU probe_context_parallel reports why and the run is recorded as skipped.

The rest of the model works token by token: each rank computes it on its tokens only. The loss is the
mean over this rank's tokens; every rank holds as many tokens, so the mean over ranks is the mean over
the sequence. The weights are sharded with FSDP over the CP ranks, which also averages the gradients.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F


def load_balanced_positions(seq_len: int, rank: int, size: int) -> torch.Tensor:
    """The positions rank `rank` of `size` keeps: chunks rank and 2 size - 1 - rank of 2 size."""
    chunks = torch.arange(seq_len).chunk(2 * size)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]])


class _GatherSequence(torch.autograd.Function):
    """(batch, heads, local_seq, d) on each rank -> (batch, heads, size x local_seq, d), ranks in order."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if grad.device.type == "cpu":  # gloo: no reduce-scatter
            grad = grad.contiguous()
            dist.all_reduce(grad, group=group)
            return grad.chunk(size, dim=2)[rank].contiguous(), None
        parts = [part.contiguous() for part in grad.chunk(size, dim=2)]
        mine = torch.empty_like(parts[rank])
        dist.reduce_scatter(mine, parts, group=group)
        return mine, None


class AllGatherKVAttention:
    """Replaces Attention.attend: this rank's queries against every rank's keys and values."""

    def __init__(self, group, q_positions, kv_positions):
        self.group = group
        # query i sees key j when j's place in the sequence is not after i's
        self.mask = kv_positions[None, :] <= q_positions[:, None]

    def __call__(self, q, k, v):
        k, v = _GatherSequence.apply(k, self.group), _GatherSequence.apply(v, self.group)
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


class ContextParallel:
    """Installs the all-gather attention in every block and cuts batches along the sequence."""

    def __init__(self, model, group, seq_len: int, device):
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.positions = load_balanced_positions(seq_len, rank, size).to(device)
        everyone = torch.cat([load_balanced_positions(seq_len, r, size) for r in range(size)]).to(device)
        attention = AllGatherKVAttention(group, self.positions, everyone)
        for block in model.layers.values():
            block.attention.attend = attention

    def prepare(self, inputs, targets):
        """The whole batch in; this rank's tokens, their positions and their targets out."""
        return (inputs[:, self.positions],), {"positions": self.positions}, targets[:, self.positions]


# ---- PyTorch's ring attention (CUDA) ----

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
