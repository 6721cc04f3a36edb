"""How long one training step of a layout should take: compute at the peak, the communication it cannot hide, the
pipeline's bubble. The planner's (dlokit.layout_planner) second column, beside the memory model's bytes.

    hw = Hardware("this machine", peak_flops=80e9, busbw=bandwidth_curve(table))   # per rank; bytes/s
    t = step_time(config, Layout("fsdp", dp_shard=2), batch_size=8, seq_len=64, hardware=hw)
    t.total, t.compute, t.exposed, t.bubble, t.collectives      # seconds; the collectives it counted

compute   = FLOPs of the busiest rank / its peak: 6 per weight touched and token (forward 2, backward 4; the output
            projection too), 12 x layers x dim x seq per token for attention (model.flops_per_token), one forward
            more of the blocks under activation checkpointing; tensor parallelism divides the blocks' share (the
            embedding, norms and output projection are replicated in this kit), a pipeline stage holds layers / pp
            blocks and the last one the output.
exposed   = each collective's bytes / the measured bus bandwidth at its size, as nccl-tests defines it
            (time = size x bus factor / busbw: bus_bandwidth.collective_seconds). Data-parallel collectives (DDP's
            gradient all-reduce, FSDP2's all-gathers and reduce-scatters) hide behind compute where the hardware
            overlaps them (`overlap`: NCCL on its own streams), up to the compute time; on a CPU gloo works on the cores
            that compute, so nothing hides. Tensor-parallel all-reduces, pipeline sends and the context-parallel ring
            are on the critical path. A group that spans nodes (torchtitan's mesh order: tp innermost, then cp,
            dp_shard, dp_replicate, pp) runs at the inter-node bandwidth. Point-to-point sends (pipeline, ring) move
            bytes at the 2-rank all-gather's bus bandwidth (each rank sends half of it to the other: a link's rate).
bubble    = (p - 1) / v of a micro-batch's stage time (GPipe, 1F1B; interleaved: v stages per rank; naive: m = 1).
offload   = FSDP2's CPU offload moves the shards' weights to the device and their gradients back each step at
            `host_bw` (the host's optimizer step is not counted).

Not counted: kernel launches and the Python of every operation (a tiny model's step is mostly that), matmuls smaller
than the peak's, the optimizer step, the data. The notebook puts the prediction beside the measurement.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from dlokit.analysis.bus_bandwidth import collective_seconds
from dlokit.memory_model import parameter_counts, params_on_rank

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first, as train_llm.py builds its mesh
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb


@dataclass(frozen=True)
class Layout:
    """Parallel degrees and options of one job (train_llm.py's --mode and levers, or DeepSpeed's ZeRO stage)."""
    name: str
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0                  # 0 DDP, 1 ZeRO-1, 2 ZeRO-2 (DeepSpeed), 3 FSDP2 / ZeRO-3
    reshard: bool = True           # FSDP2: gather the weights again for backward
    pp_schedule: str = "gpipe"
    microbatches: int = 1
    virtual: int = 1
    activation_checkpointing: bool = False
    grad_accum: int = 1
    cpu_offload: bool = False
    sequence_parallel: bool = False
    script: str = "train_llm.py"
    argv: tuple = ()               # the script's options for this layout

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shard(self) -> int:
        """Ranks FSDP2 / ZeRO-3 shards over (the CP ranks when context parallel shards the model)."""
        if self.zero < 3:
            return 1
        return self.dp_shard if self.dp_shard > 1 else (self.cp if self.cp > 1 else self.dp_replicate)

    def extent(self, dim: str) -> int:
        """Consecutive ranks one group of `dim` spans: its size times the sizes of the dims inside it."""
        inner = MESH_ORDER[MESH_ORDER.index(dim):]
        return math.prod(getattr(self, d) for d in inner)


@dataclass(frozen=True)
class Hardware:
    """A device as the step model sees it: FLOP/s per rank, bus bandwidth busbw(op, ranks, bytes) in bytes/s."""
    name: str
    peak_flops: float
    busbw: Callable[[str, int, float], float]
    ranks_per_node: int = 1 << 30
    inter_node_busbw: Callable[[str, int, float], float] | None = None
    host_bw: float = math.inf      # device <-> host, bytes/s (CPU offload)
    overlap: bool = False          # data-parallel collectives hidden behind compute
    cuda: bool = False
    basis: str = ""


@dataclass(frozen=True)
class Collective:
    op: str               # all_reduce, all_gather, reduce_scatter, p2p
    size: float           # bytes, as nccl-tests counts them (p2p: the bytes sent)
    ranks: int
    count: float          # per step
    dim: str              # the mesh dim whose group runs it
    hidden: bool          # may hide behind compute (data parallel)
    seconds: float = 0.0  # all `count` of them


@dataclass
class StepTime:
    compute: float
    bubble: float
    exposed: float        # communication on the critical path, after what overlap hides
    communication: float  # all of it
    offload: float = 0.0
    collectives: list = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.exposed + self.offload


def _config(config):
    return SimpleNamespace(**config) if isinstance(config, dict) else config


def flops_per_token(config, seq_len: int, tp: int = 1, pp: int = 1, activation_checkpointing: bool = False) -> float:
    """Training FLOPs per token on the busiest rank (the last pipeline stage: its blocks and the output)."""
    c = _config(config)
    counts = parameter_counts(c)
    blocks = 6 * (counts["block_linear"] + counts["block_norms"]) + 12 * c.n_layers * c.dim * seq_len
    if activation_checkpointing:  # one forward more: a third of 6 per weight, of 12 for attention
        blocks *= 8 / 6
    return blocks / tp / pp + 6 * c.vocab_size * c.dim


def _seconds(hw: Hardware, layout: Layout, item: Collective) -> float:
    if item.ranks < 2 or item.size <= 0 or item.count <= 0:
        return 0.0
    spans = layout.extent(item.dim) > hw.ranks_per_node
    bandwidth = hw.inter_node_busbw if spans and hw.inter_node_busbw else hw.busbw
    if item.op == "p2p":  # the 2-rank all-gather of twice the bytes: each rank sends `size` to the other
        return item.count * collective_seconds("all_gather", 2, 2 * item.size, bandwidth("all_gather", 2, 2 * item.size))
    return item.count * collective_seconds(item.op, item.ranks, item.size, bandwidth(item.op, item.ranks, item.size))


def collectives(config, layout: Layout, *, batch_size: int, seq_len: int, dtype: str = "fp32") -> list[Collective]:
    """What one rank's step sends, per kind (see the module doc)."""
    c = _config(config)
    act = 2 if dtype == "bf16" else 4    # activations, and FSDP2's gathered weights (its param_dtype)
    grad = 4                             # gradients reduce in fp32 (--reduce-dtype fp32)
    params = params_on_rank(c, layout.tp, layout.pp)
    tokens_rank = batch_size * seq_len / layout.dp / layout.cp
    found = []
    add = lambda *args: found.append(Collective(*args))
    if layout.zero >= 3 and layout.shard > 1:
        counts = parameter_counts(c)
        block = (counts["block_linear"] / layout.tp + counts["block_norms"]) / c.n_layers
        root = counts["embedding"] + counts["output"] + counts["final_norm"]
        blocks, k, s = c.n_layers / layout.pp, layout.grad_accum, layout.shard
        dim = "dp_shard" if layout.dp_shard > 1 else ("cp" if layout.cp > 1 else "dp_replicate")
        gathers = blocks * k * (2 if layout.reshard else 1)
        add("all_gather", block * act, s, gathers, dim, True)
        add("all_gather", root * act, s, 1, dim, True)          # the root: gathered once, never resharded
        add("reduce_scatter", block * grad, s, blocks, dim, True)
        add("reduce_scatter", root * grad, s, 1, dim, True)
        if layout.dp_replicate > 1 and layout.dp_shard > 1:      # HSDP: the shards' gradients across the replicas
            add("all_reduce", params / s * grad, layout.dp_replicate, 1, "dp_replicate", True)
    elif layout.dp > 1:
        total = params * grad
        if layout.zero == 2:
            add("reduce_scatter", total, layout.dp, 1, "dp_replicate", True)
        else:
            buckets = max(1, math.ceil(total / DDP_BUCKET_BYTES))
            add("all_reduce", total / buckets, layout.dp, buckets, "dp_replicate", True)
        if layout.zero in (1, 2):  # each rank's updated share of the weights, to every rank
            add("all_gather", params * 4, layout.dp, 1, "dp_replicate", False)
    if layout.tp > 1:  # two all-reduces a block forward (attention, feed-forward), two backward; AC: its forward again
        forwards = 4 if layout.activation_checkpointing else 2
        add("all_reduce", tokens_rank * c.dim * act, layout.tp, c.n_layers / layout.pp * (forwards + 2), "tp", False)
    if layout.cp > 1:  # the ring: every other rank's keys and values, forward; keys, values and their gradients back
        kv = tokens_rank * 2 * c.n_kv_heads * (c.dim // c.n_heads) * act
        passes = 3 + (1 if layout.activation_checkpointing else 0)
        add("p2p", kv, layout.cp, (layout.cp - 1) * c.n_layers / layout.pp * passes, "cp", False)
    if layout.pp > 1:
        m = 1 if layout.pp_schedule == "naive" else layout.microbatches
        boundary = tokens_rank / m * c.dim * act
        sends = 2 * (m + layout.pp - 1) * layout.virtual  # forward and backward, the fill and drain on the path
        add("p2p", boundary, layout.pp, sends, "pp", False)
    return found


def step_time(config, layout: Layout, *, batch_size: int, seq_len: int, hardware: Hardware,
              dtype: str = "fp32") -> StepTime:
    """The step of the busiest rank, in seconds (see the module doc); batch_size is the global batch."""
    c = _config(config)
    tokens_rank = batch_size * seq_len / layout.dp / layout.cp
    flops = flops_per_token(c, seq_len, layout.tp, layout.pp, layout.activation_checkpointing) * tokens_rank
    stage = flops / hardware.peak_flops
    bubble = 0.0
    if layout.pp > 1:  # a micro-batch's stage time, (p - 1) / v of them idle
        m = 1 if layout.pp_schedule == "naive" else layout.microbatches
        v = layout.virtual if layout.pp_schedule == "interleaved" else 1
        bubble = stage / m * (layout.pp - 1) / v
    items = [Collective(**{**item.__dict__, "seconds": _seconds(hardware, layout, item)})
             for item in collectives(c, layout, batch_size=batch_size, seq_len=seq_len, dtype=dtype)]
    hidden = sum(i.seconds for i in items if i.hidden)
    exposed = sum(i.seconds for i in items if not i.hidden)
    exposed += max(0.0, hidden - stage) if hardware.overlap else hidden
    offload = 0.0
    if layout.cpu_offload and layout.zero >= 3 and math.isfinite(hardware.host_bw):
        offload = 2 * params_on_rank(c, layout.tp, layout.pp) / layout.shard * 4 / hardware.host_bw
    return StepTime(stage, bubble, exposed, sum(i.seconds for i in items), offload, items)
