"""Context parallelism: each rank holds a slice of the sequence; attention fetches the keys and values
of the other slices.

Every CP rank reads the SAME batch (the data-parallel degree of --mode cp is 1) and keeps its part of
the sequence. With c ranks the sequence is cut into 2c chunks and rank r keeps chunks r and 2c-1-r:
under a causal mask late positions attend to more keys than early ones, so each rank gets one early
and one late chunk (load balancing).

Attention needs the keys and values of every earlier position, and other ranks hold most of them:

- "ring" (any device, gloo included; written here from scratch): the K/V blocks travel around the ring
  of CP ranks, one hop per step (send to the next rank, receive from the previous one); after c steps
  every rank's queries have met every block. Each block's scores are merged into the running result
  with the online softmax (a running max and a running sum, as in FlashAttention), so no rank ever holds
  the whole sequence's scores. Backward: autograd sends the blocks' gradients back along the ring.
  (Real implementations overlap each hop with the block's compute and recompute the blocks in the
  backward to keep only one in memory; this one keeps them all, for clarity.)
- "allgather" (any device): all-gather K and V over the CP group and attend with a mask built from
  the global positions; the variant Llama 3 was trained with. Backward sums each rank's gradient of
  the gathered K/V back to their owner (a reduce-scatter; all-reduce + slice on gloo, which has no
  reduce-scatter). Memory: the full sequence's K/V, but never the full activations.
- "torch" (CUDA): PyTorch's ring attention (torch.distributed.tensor.experimental.context_parallel)
  passes K/V blocks around the ring while it computes. It swaps SDPA's CUDA kernels; it has no CPU
  kernel, so on CPU probe_context_parallel reports why and the run is recorded as skipped.
- "auto" (the default): "torch" where it runs (probed on a GPU), else "ring"; `choose_cp_attention`
  says which ran and why.

TP4.5 (the student's TODO): the online-softmax merge of one block into the running result.

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


# ---- ring attention, from scratch ----

def _exchange(x, group, shift: int):
    """Send x to the rank `shift` places further along the ring, receive the same from `shift` places back."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    received = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), dist.get_global_rank(group, (rank + shift) % size), group),
           dist.P2POp(dist.irecv, received, dist.get_global_rank(group, (rank - shift) % size), group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


class _PassAlongRing(torch.autograd.Function):
    """Forward: this rank's block goes to the next rank, the previous rank's comes in. Backward: the
    gradient of what came in goes back to the rank it came from."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group, shift=1)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group, shift=-1), None


class RingAttention:
    """Replaces Attention.attend: this rank's queries against every rank's K/V blocks, one per ring step."""

    def __init__(self, group, q_positions, block_positions):
        self.group, self.q_positions = group, q_positions
        self.block_positions = block_positions  # block_positions[r]: the positions rank r holds
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def __call__(self, q, k, v):
        repeats = q.shape[1] // k.shape[1]
        scale = q.shape[-1] ** -0.5
        kv = torch.stack([k, v])  # one message per hop
        # running max of the scores, running sum of their exponentials, running (unnormalised) output
        running_max = torch.full(q.shape[:-1], float("-inf"), device=q.device, dtype=torch.float32)
        running_sum = torch.zeros_like(running_max)
        out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        for step in range(self.size):
            owner = (self.rank - step) % self.size  # the first block is this rank's own: no row is empty
            k_block, v_block = (t.repeat_interleave(repeats, dim=1) for t in kv)
            visible = self.block_positions[owner][None, :] <= self.q_positions[:, None]  # causal, global positions
            scores = (q.float() @ k_block.float().transpose(-1, -2)) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            # >>> SOLUTION TP4.5: merge this block into the running softmax: rescale what was summed so far to the new max
            block_max = scores.amax(dim=-1)
            new_max = torch.maximum(running_max, block_max).detach()  # any bound works: the result does not depend on it
            weights = torch.exp(scores - new_max[..., None])          # masked scores: exp(-inf) = 0
            rescale = torch.exp(running_max - new_max)                 # 0 on the first block
            running_sum = running_sum * rescale + weights.sum(dim=-1)
            out = out * rescale[..., None] + weights @ v_block.float()
            running_max = new_max
            # --- STUDENT
            # weights = torch.softmax(scores, dim=-1).nan_to_num()  # this block's softmax on its own...
            # running_sum = running_sum + 1
            # out = out + weights @ v_block.float()               # ...and the blocks averaged: wrong
            # <<< SOLUTION
            if step < self.size - 1:
                kv = _PassAlongRing.apply(kv, self.group)
        return (out / running_sum[..., None]).to(q.dtype)


class ContextParallel:
    """Installs the ring or all-gather attention in every block and cuts batches along the sequence."""

    def __init__(self, model, group, seq_len: int, device, attention: str = "ring"):
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.positions = load_balanced_positions(seq_len, rank, size).to(device)
        blocks = [load_balanced_positions(seq_len, r, size).to(device) for r in range(size)]
        if attention == "ring":
            attend = RingAttention(group, self.positions, blocks)
        elif attention == "allgather":
            attend = AllGatherKVAttention(group, self.positions, torch.cat(blocks))
        else:
            raise ValueError(f"unknown context-parallel attention {attention!r}; use 'ring' or 'allgather'")
        for block in model.layers.values():
            block.attention.attend = attend

    def prepare(self, inputs, targets):
        """The whole batch in; this rank's tokens, their positions and their targets out."""
        return (inputs[:, self.positions],), {"positions": self.positions}, targets[:, self.positions]


# ---- PyTorch's ring attention (CUDA) ----

def choose_cp_attention(requested: str, cp_mesh, device) -> tuple[str | None, str]:
    """(the attention that will run, why). "auto": PyTorch's ring where it works, else the one from
    scratch; "torch" where it does not run: (None, the reason), and the run is skipped."""
    if requested in ("ring", "allgather"):
        return requested, "asked for"
    works, reason = probe_context_parallel(cp_mesh, device)
    if works:
        return "torch", "PyTorch's ring attention runs here"
    if requested == "auto":
        return "ring", f"{reason}: the ring attention from scratch instead"
    return None, reason


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
