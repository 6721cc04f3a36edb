"""FSDP2 (ZeRO-3): each block's parameters, gradients and optimizer states are sharded over the
data-parallel ranks; a block's full weights exist only while it computes.

Apply in this order (torchtitan's): tensor parallel -> activation checkpointing -> compile -> FSDP.
"""
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_activation_checkpointing(model):
    """Keep only each block's input; recompute the block's activations during backward."""
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model):
    """Compile block by block: the blocks are identical, so one compilation serves them all."""
    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block, fullgraph=True)


def parallelize_fsdp(model, dp_mesh, param_dtype="fp32", reduce_dtype="fp32", cpu_offload=False,
                     reshard_after_forward=True):
    """fully_shard every block, then the root (embedding, final norm, output).

    param_dtype: dtype of the gathered weights used in forward/backward; the sharded weights
    the optimizer updates stay fp32 (they are the "master" copy).
    reshard_after_forward=False keeps gathered weights until backward (ZeRO-2-like memory,
    one all-gather fewer per block).
    """
    options = {
        "mesh": dp_mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype]),
    }
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=reshard_after_forward, **options)
    # The root's parameters are needed again right at the start of backward: never reshard them.
    fully_shard(model, reshard_after_forward=False, **options)
    return model
