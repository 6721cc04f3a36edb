"""Tensor parallelism with DTensor: the same column-then-row split as parallel_tp_scratch.py,
declared as a plan; PyTorch inserts the communication.

Sequence parallelism (optional): between the sub-layers, activations are split along the
sequence instead of replicated, so the norms and residual adds are not computed twice; the
all-reduce becomes a reduce-scatter + an all-gather (same bytes, less activation memory).
"""
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)


def parallelize_tp(model, tp_mesh, sequence_parallel=False):
    # Outputs of the row-parallel linears: whole (Replicate) or split along the sequence (Shard(1)).
    between = Shard(1) if sequence_parallel else Replicate()
    for block in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=between),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=between),
        }
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # all-gather the sequence before the column-parallel linears
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        parallelize_module(model, tp_mesh, {
            # the embedding output is whole on every rank: keep this rank's part of the sequence
            "tok_embeddings": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                         use_local_output=True),
        })
    return model
