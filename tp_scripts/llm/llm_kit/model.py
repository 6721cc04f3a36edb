"""A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention.

The model knows nothing about parallelism; the parallelize_* files change it from the outside.
Layers live in a ModuleDict keyed by their index, so a pipeline stage can delete the layers it
does not own and the remaining parameter names stay the same as in the full model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int = 512
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


CONFIGS = {
    # CPU tests: bytes as tokens, a few hundred thousand parameters.
    "tiny": LlamaConfig(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=256, max_seq_len=64),
    # CPU tests of a tied model (as 125m, 1b, 3b) under every layout, the pipeline's two copies of the weight included.
    "tiny-tied": LlamaConfig(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=256, max_seq_len=64,
                             tie_embeddings=True),
    # CPU demos where the loss should visibly fall in a minute.
    "small": LlamaConfig(dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_dim=704, vocab_size=256, max_seq_len=256),
    # DDP out of memory, FSDP2 fits (Day 4): ~95 M weights, so model states (16 bytes a weight with AdamW
    # in fp32: 1.5 GB per DDP rank, half of it per FSDP rank on 2) dwarf the activations of a tiny batch.
    "oom-demo": LlamaConfig(dim=1024, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=2816, vocab_size=256,
                            max_seq_len=64),
    # TP4.2's batch scan on a CPU: wide and shallow, so that the weights' states (what FSDP2 shards) weigh ~100
    # sequences of 16 tokens of activations, which take ~0.6 GFLOP each to train: DDP and FSDP2 part visibly.
    "scan-demo": LlamaConfig(dim=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=1408, vocab_size=256,
                             max_seq_len=64),
    # GPT-2-small sized.
    "125m": LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32_000,
                        max_seq_len=1024, tie_embeddings=True),
    # Llama-3.2-1B shaped.
    "1b": LlamaConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128_256,
                      max_seq_len=2048, tie_embeddings=True),
    # Llama-3.2-3B shaped (the course's DDP-runs-out-of-memory example).
    "3b": LlamaConfig(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, vocab_size=128_256,
                      max_seq_len=2048, tie_embeddings=True),
}


def get_config(name: str, **overrides) -> LlamaConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; choose one of {', '.join(CONFIGS)}")
    config = replace(CONFIGS[name], **{k: v for k, v in overrides.items() if v is not None})
    if config.dim % config.n_heads or config.n_heads % config.n_kv_heads:
        raise ValueError(f"dim ({config.dim}) must divide by n_heads ({config.n_heads}) and n_heads by "
                         f"n_kv_heads ({config.n_kv_heads})")
    return config


def count_params(config: LlamaConfig, embedding: bool = True) -> int:
    """Parameters computed from the config (equals sum(p.numel()) of the built model)."""
    d, kv = config.dim, config.n_kv_heads * config.head_dim
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * config.ffn_dim + 2 * d
    total = config.n_layers * per_layer + d  # + final norm
    output = config.vocab_size * d
    if embedding:
        total += output + (0 if config.tie_embeddings else output)
    else:
        total += output  # the output projection still costs FLOPs even when tied
    return total


def flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 per weight touched (forward 2, backward 4) plus attention scores.

    The attention term counts QK^T and AV over the whole causal window (no saving for the mask),
    the usual convention for MFU.
    """
    weights = count_params(config, embedding=False)
    attention = 12 * config.n_layers * config.dim * seq_len
    return 6 * weights + attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(config: LlamaConfig, device=None):
    """cos and sin of the rotary angles, shape (max_seq_len, head_dim)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.max_seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x: (batch, seq, heads, head_dim); rotate each (first half, second half) pair of features."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos[:, None, :].to(x.dtype) + rotated * sin[:, None, :].to(x.dtype)


def causal_attention(q, k, v):
    """q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim)."""
    repeats = q.shape[1] // k.shape[1]  # grouped-query attention: each kv head serves `repeats` q heads
    k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.head_dim = config.head_dim
        kv_dim = config.n_kv_heads * config.head_dim
        self.wq = nn.Linear(config.dim, config.dim, bias=False)
        self.wk = nn.Linear(config.dim, kv_dim, bias=False)
        self.wv = nn.Linear(config.dim, kv_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        # softmax(q k^T / sqrt(d)) v over the causal window; context parallelism swaps it for a
        # version that fetches the keys and values of the other ranks' parts of the sequence.
        self.attend = causal_attention

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds only its share of the heads.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.n_layers)})
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, buffer_device=None):
        """Also called after building on the meta device and moving with to_empty().

        Each parameter is drawn whole from its own generator (seeded by torch's seed and the
        parameter's index), and a sharded parameter keeps its slice of that draw: the initial weights
        are the same whether the model is built whole or on the meta device and sharded over any
        number of ranks (drawing each shard from the global generator would give every rank the same
        numbers). Same values for the same device type (CPU and CUDA generators differ)."""
        self.rope_cos, self.rope_sin = rope_tables(self.config, device=buffer_device or self.rope_cos.device)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        base_seed = torch.initial_seed()
        for index, (name, param) in enumerate(self.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            local = param.to_local() if hasattr(param, "to_local") else param
            if local.is_meta:  # built on the meta device: drawn later, once allocated
                continue
            generator = torch.Generator(device=local.device).manual_seed((base_seed * 1_000_003 + index) % 2**63)
            full = torch.empty(param.shape, device=local.device).normal_(0.0, std, generator=generator)
            local.copy_(_local_part(param, full))

    def forward(self, x, positions=None):
        """x: token ids (batch, seq), or hidden states on a pipeline stage without the embedding.
        positions: the place of each of x's columns in the whole sequence, when x holds only some of
        them (context parallelism); by default 0, 1, ..., seq - 1."""
        seq = x.shape[1]  # read before the embedding: under sequence parallelism h holds only a slice
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if positions is None:
            cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def _local_part(param, full):
    """This rank's part of a full tensor: all of it, or the DTensor shard's slice."""
    if not hasattr(param, "device_mesh"):
        return full
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
