"""How much memory does one rank need to train a Llama-style transformer? A calculator.

    from dlokit.memory_model import estimate
    b = estimate(config, batch_size=8, seq_len=512, dp=4, zero=3, precision="bf16-mixed")
    b.as_dict()      # bytes per category, for a bar chart;  b.total_gib

`config` is anything with dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, tie_embeddings
(the Day-4 model's LlamaConfig, or a SimpleNamespace).

Model states, bytes per parameter (Ψ parameters):
    precision "fp32":        weights 4Ψ, gradients 4Ψ, Adam m and v 8Ψ                 = 16Ψ
    precision "bf16-mixed":  weights 2Ψ, gradients 2Ψ, fp32 master + m + v 12Ψ         = 16Ψ
      (ZeRO paper accounting; FSDP2's MixedPrecisionPolicy keeps fp32 sharded weights and grads
      and gathers bf16 copies on the fly: the same 16Ψ, split 4 + 4 + 8, plus the gathered blocks)
ZeRO stage over dp ranks: 1 shards the optimizer states, 2 also the gradients, 3 (FSDP) also the
weights; stage 3 adds a transient: about two blocks of gathered weights (the one computing and the
one prefetched) and one block of unsharded gradients.
Tensor parallel (tp): the block linears are split, norms/embedding/output replicated (as in this kit).
Pipeline parallel (pp): the rank holding the most parameters (first stage with the embedding, or
last stage with the output projection).

Activations: what autograd keeps for backward, counted tensor by tensor on the Day-4 model
(elements per token; h = dim, f = ffn_dim, a = n_heads, V = vocab):
    per block: 2 RMSNorms x (input h, 1/rms 1, normalised h, scaled output h)  = 6h + 2
               q, repeated k and v, attention output h each, logsumexp a     = 4h + a
               SwiGLU: w1 out, w3 out, silu out, product                     = 4f
    head:      final norm 3h + 1, log-probabilities V (always fp32)
    (flash/efficient attention: no seq x seq matrix is stored)
With activation checkpointing only each block's input (h) is kept, plus one block recomputed.
Sequence parallel divides the norms' share by tp too. Pipeline: GPipe keeps all m micro-batches
in flight, 1F1B at most p; each micro-batch is batch/m sequences.
Not counted: temporaries of the backward pass, allocator caching and fragmentation, the CUDA
context (~0.5 GiB), communication buffers. Measured peaks are therefore higher than this estimate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

GIB = 1024**3

STATE_BYTES = {  # precision -> (weights, gradients, optimizer states) bytes per parameter, with Adam
    "fp32": (4, 4, 8),
    "bf16-mixed": (2, 2, 12),
}
ACTIVATION_BYTES = {"fp32": 4, "bf16-mixed": 2}


@dataclass
class MemoryBreakdown:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    transient: float  # FSDP's gathered blocks (ZeRO-3 only)

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def as_dict(self, unit: str = "B") -> dict:
        scale = {"B": 1, "MiB": 1024**2, "GiB": GIB}[unit]
        return {k: v / scale for k, v in {**asdict(self), "total": self.total}.items()}


def parameter_counts(config) -> dict:
    """Parameters by kind: what tensor parallelism splits ('block_linear') and what it does not."""
    h, f = config.dim, config.ffn_dim
    kv = config.n_kv_heads * (h // config.n_heads)
    embedding = config.vocab_size * h
    return {
        "block_linear": config.n_layers * (2 * h * h + 2 * h * kv + 3 * h * f),
        "block_norms": config.n_layers * 2 * h,
        "embedding": embedding,
        "output": 0 if config.tie_embeddings else embedding,
        "final_norm": h,
    }


def params_on_rank(config, tp: int = 1, pp: int = 1) -> float:
    """Parameters held by the busiest rank before any ZeRO sharding."""
    c = parameter_counts(config)
    blocks = (c["block_linear"] / tp + c["block_norms"]) / pp
    if pp == 1:
        return blocks + c["embedding"] + c["output"] + c["final_norm"]
    first, last = c["embedding"], c["output"] + c["final_norm"]
    if config.tie_embeddings:  # an untied copy is needed on each end
        last += c["embedding"]
    return blocks + max(first, last)


def activation_elements_per_token(config, tp: int = 1, sequence_parallel: bool = False) -> tuple[float, float, float]:
    """(per block, head, per block when checkpointed) in elements per token; see the module doc."""
    h, f, a = config.dim, config.ffn_dim, config.n_heads
    norms = 6 * h + 2
    if tp > 1 and sequence_parallel:
        norms = 2 * (2 * h + 1) / tp + 2 * h  # the gathered (scaled) norm output stays whole
    split = (4 * h + a + 4 * f) / tp
    per_block = norms + split
    head = 3 * h + 1  # the final norm; the fp32 log-probs are added in bytes by the caller
    return per_block, head, h


def estimate(config, *, batch_size: int, seq_len: int, dp: int = 1, zero: int = 0, tp: int = 1, pp: int = 1,
             cp: int = 1, precision: str = "bf16-mixed", activation_checkpointing: bool = False,
             sequence_parallel: bool = False, microbatches: int = 1, pp_schedule: str = "1f1b") -> MemoryBreakdown:
    """Bytes on the busiest rank. batch_size: sequences per data-parallel rank (the local batch)."""
    if precision not in STATE_BYTES:
        raise ValueError(f"precision must be one of {list(STATE_BYTES)}")
    if zero not in (0, 1, 2, 3):
        raise ValueError("zero must be 0 (plain DDP), 1, 2 or 3 (FSDP)")
    w_bytes, g_bytes, o_bytes = STATE_BYTES[precision]
    params = params_on_rank(config, tp, pp)
    weights = params * w_bytes / (dp if zero >= 3 else 1)
    gradients = params * g_bytes / (dp if zero >= 2 else 1)
    optimizer = params * o_bytes / (dp if zero >= 1 else 1)

    transient = 0.0
    if zero >= 3 and dp > 1:
        c = parameter_counts(config)
        block = (c["block_linear"] / tp + c["block_norms"]) / config.n_layers
        transient = block * (2 * ACTIVATION_BYTES[precision] + g_bytes)

    e = ACTIVATION_BYTES[precision]
    per_block, head, checkpointed = activation_elements_per_token(config, tp, sequence_parallel)
    layers_here = config.n_layers / pp
    tokens = batch_size * seq_len / cp
    if pp > 1:  # micro-batches alive at once on the first stage
        in_flight = microbatches if pp_schedule in ("gpipe", "naive") else min(pp, microbatches)
        tokens = tokens / microbatches * in_flight
    if activation_checkpointing:
        blocks = layers_here * checkpointed + per_block  # inputs kept + one block recomputed
    else:
        blocks = layers_here * per_block
    # The head (final norm, fp32 log-probs) sits on the last stage; adding it to the first stage's
    # blocks makes the pipeline figure an upper bound.
    activations = tokens * (blocks * e + head * e + 4 * config.vocab_size)
    return MemoryBreakdown(weights, gradients, optimizer, activations, transient)


def fits(breakdown: MemoryBreakdown, device_gib: float, headroom: float = 0.9) -> bool:
    """Whether the estimate fits in `headroom` of the device memory."""
    return breakdown.total <= headroom * device_gib * GIB
