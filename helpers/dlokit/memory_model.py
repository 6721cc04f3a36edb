"""How much memory does one rank need to train a Llama-style transformer? A calculator.

    from dlokit.memory_model import estimate, estimate_for_run, calculator
    b = estimate(config, batch_size=8, seq_len=512, dp=4, zero=3, precision="bf16-mixed")
    b.as_dict()      # bytes per category, for a bar chart;  b.total_gib
    estimate_for_run(run.config)   # what a train_llm.py run should hold per rank (its record's config)
    calculator()                   # the notebook widget: sliders and menus -> a table of bytes per rank

`config` is anything with dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, tie_embeddings
(the Day-4 model's LlamaConfig, a dict of those fields, or a SimpleNamespace).

Model states, bytes per parameter (Ψ parameters), with Adam(W) (m and v, fp32: 8 bytes):
    precision "fp32":        weights 4Ψ, gradients 4Ψ, Adam m and v 8Ψ                  = 16Ψ
    precision "bf16-mixed":  weights 2Ψ, gradients 2Ψ, fp32 master + m + v 12Ψ          = 16Ψ
      (the ZeRO paper's accounting: bf16 weights and gradients, the fp32 copy in the optimizer)
    precision "bf16-amp":    weights 4Ψ, gradients 4Ψ, m and v 8Ψ; activations and gathered weights in bf16
      (what PyTorch keeps: autocast, and FSDP2's MixedPrecisionPolicy with fp32 sharded weights)
Optimizers: "adamw"/"adam" 8 bytes of state a weight, "sgd-momentum" 4, "sgd" 0 (+ the master copy).
ZeRO stage over dp ranks: 1 shards the optimizer states, 2 also the gradients, 3 (FSDP) also the
weights. Stage 3 adds what is gathered: the root's weights (embedding, final norm, output: this kit
never reshards them) plus two blocks (the one computing and the one prefetched), or every block
when the weights are not resharded after forward; and one block of unsharded gradients (the
reduce-scatter's input). DeepSpeed's ZeRO (train_deepspeed.py) keeps an fp32 master copy of the weights in its
optimizer states at every precision (`master`: 4 bytes a weight more, sharded from stage 1 on) and reduces gradients
through a bucket (`bucket` elements, with the gradients). ZeRO-1/2 with dp ranks: batch_size is the local batch of each rank. HSDP:
pass dp = the shard degree (the replicas hold the same).
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
With activation checkpointing only each block's input (h) is kept through the forward pass; during
backward one block at a time is recomputed (`recomputed`, a transient).
Sequence parallel divides the norms' share by tp too. Pipeline: GPipe keeps all m micro-batches
in flight, 1F1B at most p; each micro-batch is batch/m sequences.
On CUDA (`cuda=True`) AdamW's foreach step also allocates temporaries: one fp32 tensor per weight it updates
(the square root of v), 4 bytes a weight of this rank's optimizer share (`optimizer_step`, a transient); not under
FSDP2's CPU offload, whose shards step on the host.
Not counted: other temporaries of the backward pass and of the optimizer step, allocator caching and
fragmentation, the CUDA context (~0.5 GiB), communication buffers, the keys and values a context-
parallel attention fetches from the other ranks. Measured peaks are therefore higher than this estimate.

Checked against train_llm.py's own measurement on CPU (tiny config, fp32; tests/test_day4_memory.py):
parameters, gradients and optimizer states agree to within 1 % under DDP, ZeRO-1 and FSDP2 on 2 ranks,
saved activations to within 5 %.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

GIB = 1024**3

# precision -> (weight bytes, gradient bytes, fp32 master copy in the optimizer, activation / gathered-weight bytes)
PRECISIONS = {
    "fp32": (4, 4, 0, 4),
    "bf16-mixed": (2, 2, 4, 2),
    "bf16-amp": (4, 4, 0, 2),
}
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0}  # fp32 states per weight
STATE_BYTES = {name: (w, g, master + 8) for name, (w, g, master, _) in PRECISIONS.items()}  # with Adam
ACTIVATION_BYTES = {name: a for name, (_, _, _, a) in PRECISIONS.items()}
ZERO_STAGES = {0: "DDP (ZeRO-0): everything replicated", 1: "ZeRO-1: optimizer states sharded",
               2: "ZeRO-2: + gradients sharded", 3: "ZeRO-3 / FSDP: + weights sharded"}

# Llama 3 shapes (for the calculator; the Day-4 model's own configs can be passed in too)
PRESETS = {
    "Llama-3.2-1B": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128_256,
                         tie_embeddings=True),
    "Llama-3.2-3B": dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, vocab_size=128_256,
                         tie_embeddings=True),
    "Llama-3.1-8B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14_336, vocab_size=128_256,
                         tie_embeddings=False),
    "Llama-3.1-70B": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28_672, vocab_size=128_256,
                          tie_embeddings=False),
}


@dataclass
class MemoryBreakdown:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    gathered: float = 0.0          # ZeRO-3: weights all-gathered at once (root + blocks in flight)
    unsharded_grads: float = 0.0   # ZeRO-3: one block's full gradients before the reduce-scatter
    recomputed: float = 0.0        # activation checkpointing: one block's activations, recomputed in backward
    optimizer_step: float = 0.0    # CUDA: AdamW's foreach temporaries, 4 bytes a weight it updates
    host: float = 0.0              # FSDP2's CPU offload: the weights', gradients' and states' shards in host memory

    @property
    def transient(self) -> float:
        """What exists only for a while: FSDP's gathered weights and unsharded gradients, the block that
        activation checkpointing recomputes, the optimizer step's temporaries (added: an upper bound)."""
        return self.gathered + self.unsharded_grads + self.recomputed + self.optimizer_step

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def as_dict(self, unit: str = "B") -> dict:
        scale = {"B": 1, "MiB": 1024**2, "GiB": GIB}[unit]
        values = {**asdict(self), "transient": self.transient, "total": self.total}
        return {k: v / scale for k, v in values.items()}


def _config(config):
    return SimpleNamespace(**config) if isinstance(config, dict) else config


def parameter_counts(config) -> dict:
    """Parameters by kind: what tensor parallelism splits ('block_linear') and what it does not."""
    config = _config(config)
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
    config = _config(config)
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
    config = _config(config)
    h, f, a = config.dim, config.ffn_dim, config.n_heads
    norms = 6 * h + 2
    if tp > 1 and sequence_parallel:
        norms = 2 * (2 * h + 1) / tp + 2 * h  # the gathered (scaled) norm output stays whole
    split = (4 * h + a + 4 * f) / tp
    per_block = norms + split
    head = 3 * h + 1  # the final norm; the fp32 log-probs are added in bytes by the caller
    return per_block, head, h


def estimate(config, *, batch_size: int, seq_len: int, dp: int = 1, zero: int = 0, tp: int = 1, pp: int = 1,
             cp: int = 1, precision: str = "bf16-mixed", optimizer: str = "adamw",
             activation_checkpointing: bool = False, reshard_after_forward: bool = True,
             sequence_parallel: bool = False, microbatches: int = 1, pp_schedule: str = "1f1b",
             cuda: bool = False, master: bool = False, bucket: int = 0, grad_accum: int = 1,
             cpu_offload: bool = False) -> MemoryBreakdown:
    """Bytes on the busiest rank. batch_size: sequences per data-parallel rank (the local batch);
    dp: the ranks ZeRO shards over; cuda: count AdamW's foreach temporaries (PyTorch's default on CUDA);
    master: an fp32 master copy of the weights in the optimizer states whatever the precision (DeepSpeed's ZeRO
    keeps one, sharded as the states are); bucket: elements of ZeRO's gradient reduce bucket (DeepSpeed's
    reduce_bucket_size), counted with the gradients (its gradients' peak in backward); grad_accum: micro-batches a
    step (train_llm.py --grad-accum), each holding batch_size / grad_accum sequences of activations, and under ZeRO-3
    (FSDP2, no gradient sync but on the last) the whole gradients added up until the last; cpu_offload: FSDP2's
    sharded weights, gradients and optimizer states kept in host memory (`host`), out of the device's total."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZER_STATE_BYTES)}")
    if zero not in ZERO_STAGES:
        raise ValueError("zero must be 0 (plain DDP), 1, 2 or 3 (FSDP)")
    if min(dp, tp, pp, cp, batch_size, seq_len) < 1:
        raise ValueError("dp, tp, pp, cp, batch_size and seq_len must be at least 1")
    config = _config(config)
    w_bytes, g_bytes, master_bytes, a_bytes = PRECISIONS[precision]
    o_bytes = max(master_bytes, 4 if master else 0) + OPTIMIZER_STATE_BYTES[optimizer]
    params = params_on_rank(config, tp, pp)
    weights = params * w_bytes / (dp if zero >= 3 else 1)
    gradients = params * g_bytes / (dp if zero >= 2 and grad_accum == 1 else 1) + bucket * g_bytes
    optimizer_bytes = params * o_bytes / (dp if zero >= 1 else 1)
    offloaded = cpu_offload and zero >= 3
    # foreach AdamW: sqrt(v) as a whole new fp32 list; offloaded shards step on the host, where AdamW loops instead
    foreach = OPTIMIZER_STATE_BYTES[optimizer] > 0 and cuda and not offloaded
    step_temporaries = params * 4 / (dp if zero >= 1 else 1) if foreach else 0.0

    gathered = unsharded_grads = 0.0
    if zero >= 3 and dp > 1:
        c = parameter_counts(config)
        block = (c["block_linear"] / tp + c["block_norms"]) / config.n_layers
        root = c["embedding"] + c["output"] + c["final_norm"]
        blocks = config.n_layers / pp if not reshard_after_forward else min(2, config.n_layers / pp)
        gathered = (root + blocks * block) * a_bytes
        unsharded_grads = block * g_bytes

    per_block, head, checkpointed = activation_elements_per_token(config, tp, sequence_parallel)
    layers_here = config.n_layers / pp
    tokens = batch_size * seq_len / cp / grad_accum
    if pp > 1:  # micro-batches alive at once on the first stage
        in_flight = microbatches if pp_schedule in ("gpipe", "naive") else min(pp, microbatches)
        tokens = tokens / microbatches * in_flight
    blocks_elements = layers_here * (checkpointed if activation_checkpointing else per_block)
    recomputed = tokens * per_block * a_bytes if activation_checkpointing else 0.0
    # The head (final norm, fp32 log-probs) sits on the last stage; adding it to the first stage's
    # blocks makes the pipeline figure an upper bound.
    activations = tokens * (blocks_elements * a_bytes + head * a_bytes + 4 * config.vocab_size)
    host = 0.0
    if offloaded:
        host, weights, gradients, optimizer_bytes = weights + gradients + optimizer_bytes, 0.0, 0.0, 0.0
    return MemoryBreakdown(weights, gradients, optimizer_bytes, activations, gathered, unsharded_grads, recomputed,
                           step_temporaries, host)


def fits(breakdown: MemoryBreakdown, device_gib: float, headroom: float = 0.9) -> bool:
    """Whether the estimate fits in `headroom` of the device memory."""
    return breakdown.total <= headroom * device_gib * GIB


# ---- a train_llm.py run, as the model sees it ----------------------------------------------------

ZERO_OF_DATA_PARALLEL = {None: 0, "ddp": 0, "zero1": 1, "fsdp": 3, "hsdp": 3}


def _deepspeed(config: dict) -> dict:
    """A train_deepspeed.py run's ZeRO options: its stage, and from stage 1 on the fp32 master copy and the reduce
    bucket its JSON config (`ds_config`) asked for."""
    stage = int(config.get("zero_stage") or 0)
    zero_options = (config.get("ds_config") or {}).get("zero_optimization") or {}
    return {"zero": stage, "master": stage >= 1,
            "bucket": int(zero_options.get("reduce_bucket_size") or 0) if stage >= 1 else 0}


def estimate_for_run(config: dict, cuda: bool = False) -> MemoryBreakdown:
    """The estimate for a train_llm.py run, from its record's config (run.json): the model's shape,
    the global batch split over the data-parallel ranks, the degrees, the dtype and the options
    (cuda: on a GPU, with the optimizer step's temporaries, and FSDP2's CPU offload moving its shards to the host)."""
    shape = config["model"]
    dp = int(config.get("dp") or 1)
    data_parallel = config.get("data_parallel")
    shard = int(config.get("dp_shard") or 1) if data_parallel in ("fsdp", "hsdp") else dp
    cp = int(config.get("cp") or 1)
    if data_parallel == "fsdp" and cp > 1:  # FSDP over the context-parallel ranks
        shard = cp
    pp = int(config.get("pp") or 1)
    virtual = int(config.get("pp_virtual") or 1) if config.get("pp_schedule") == "interleaved" else 1
    microbatches = 1 if config.get("pp_schedule") == "naive" else int(config.get("microbatches") or 1)
    zero = (_deepspeed(config) if data_parallel == "deepspeed"
            else {"zero": ZERO_OF_DATA_PARALLEL.get(data_parallel, 0)})
    return estimate(shape, batch_size=int(config["batch_size"]) // dp, seq_len=int(config["seq_len"]), dp=shard,
                    **zero, tp=int(config.get("tp") or 1), pp=pp,
                    cp=cp, precision="fp32" if config.get("dtype", "fp32") == "fp32" else "bf16-amp",
                    optimizer="adamw", activation_checkpointing=bool(config.get("activation_checkpointing")),
                    reshard_after_forward=not config.get("no_reshard_after_forward"),
                    sequence_parallel=bool(config.get("sequence_parallel")),
                    microbatches=microbatches * virtual, pp_schedule=config.get("pp_schedule") or "1f1b", cuda=cuda,
                    grad_accum=int(config.get("grad_accum") or 1),
                    cpu_offload=bool(config.get("cpu_offload")) and cuda)  # on a CPU the shards stay where they are


# ---- the calculator ------------------------------------------------------------------------------

def per_rank_table(config, **options):
    """A one-column DataFrame of GiB per rank by category (weights ... total), from estimate(**options)."""
    import pandas as pd

    b = estimate(config, **options).as_dict("GiB")
    rows = {"weights": b["weights"], "gradients": b["gradients"], "optimizer states": b["optimizer"],
            "activations": b["activations"],
            "transient: gathered weights, unsharded gradients (ZeRO-3), recomputed block (AC), optimizer step (CUDA)":
                b["transient"],
            "total": b["total"]}
    return pd.DataFrame({"GiB per rank": rows}).round(3)


def calculator(configs: dict | None = None, device_gib: float = 80.0, predict=None):
    """The notebook widget: a model, its batch and sequence, data-parallel ranks, ZeRO stage, tensor, pipeline and
    context degrees, precision, optimizer and activation checkpointing -> a table of GiB per rank, whether it fits on
    one `device_gib` device, and `predict(config, **the widget's options)`'s sentence (the Day 4 notebook passes
    dlokit.layout_planner.predicted_step: the step time of that layout on a datasheet's GPUs).
    `configs`: name -> config (e.g. the Day-4 model's CONFIGS) added to the Llama 3 presets."""
    import ipywidgets as widgets

    choices = {**PRESETS, **(configs or {})}
    degrees = [1, 2, 4, 8]
    w = {
        "model": widgets.Dropdown(options=list(choices), value="Llama-3.2-3B", description="model"),
        "batch_size": widgets.IntSlider(value=1, min=1, max=64, description="batch / rank"),
        "seq_len": widgets.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048, description="seq len"),
        "dp": widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=8, description="dp ranks"),
        "zero": widgets.Dropdown(options=[(text, stage) for stage, text in ZERO_STAGES.items()], value=0,
                                 description="ZeRO"),
        "tp": widgets.Dropdown(options=degrees, value=1, description="tensor"),
        "pp": widgets.Dropdown(options=degrees, value=1, description="pipeline"),
        "microbatches": widgets.Dropdown(options=[1, 2, 4, 8, 16, 32], value=4, description="micro-batches"),
        "cp": widgets.Dropdown(options=degrees, value=1, description="context"),
        "precision": widgets.Dropdown(options=list(PRECISIONS), value="bf16-mixed", description="precision"),
        "optimizer": widgets.Dropdown(options=list(OPTIMIZER_STATE_BYTES), value="adamw", description="optimizer"),
        "activation_checkpointing": widgets.Checkbox(value=False, description="activation checkpointing"),
    }
    output = widgets.Output()

    def show(_=None):
        options = {k: v.value for k, v in w.items() if k != "model"}
        config = choices[w["model"].value]
        table = per_rank_table(config, cuda=True, **options)  # a GPU's: foreach AdamW
        total = table.loc["total", "GiB per rank"]
        verdict = "fits" if total <= 0.9 * device_gib else "does NOT fit"
        output.outputs = ()  # written directly (not `with output:`), so it also works outside a kernel
        output.append_display_data(table)
        output.append_stdout(f"{total:.1f} GiB per rank: {verdict} on a {device_gib:g} GB GPU (90 % usable)\n")
        if predict is not None:
            output.append_stdout(predict(config, **options) + "\n")

    for widget in w.values():
        widget.observe(show, names="value")
    show()
    return widgets.VBox([*w.values(), output])
