"""Tensor parallelism with DTensor: the same column-then-row split as parallel_tp_scratch.py,
declared as a plan; PyTorch inserts the communication.

Sequence parallelism (optional): between the sub-layers, activations are split along the
sequence instead of replicated, so the norms and residual adds are not computed twice; the
all-reduce becomes a reduce-scatter + an all-gather (same bytes, less activation memory).
"""
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)


def parallelize_sublayer(module, columns, rows, tp_mesh, sequence_parallel=False, extra_inputs=0):
    """The column linears (`columns`) then the row linear (`rows`) of one sub-layer (attention, feed-forward).

    Without sequence parallelism the sub-layer's input is whole on every rank; its gradient is summed once
    (one all-reduce) at the sub-layer's input, however many column linears read it. With it, the input arrives
    split along the sequence: one all-gather in, one reduce-scatter out (the row linear's Shard(1) output).
    `extra_inputs`: the sub-layer's other positional arguments (attention's rotary tables), left alone."""
    given = Shard(1) if sequence_parallel else Replicate()
    others = (None,) * extra_inputs
    parallelize_module(module, tp_mesh, PrepareModuleInput(
        input_layouts=(given, *others), desired_input_layouts=(Replicate(), *others), use_local_output=False))
    plan = {name: ColwiseParallel(input_layouts=Replicate()) for name in columns}
    plan[rows] = RowwiseParallel(output_layouts=given)
    parallelize_module(module, tp_mesh, plan)
    return module


def parallelize_tp(model, tp_mesh, sequence_parallel=False):
    for block in model.layers.values():
        parallelize_sublayer(block.attention, ("wq", "wk", "wv"), "wo", tp_mesh, sequence_parallel, extra_inputs=2)
        parallelize_sublayer(block.feed_forward, ("w1", "w3"), "w2", tp_mesh, sequence_parallel)
        if sequence_parallel:
            parallelize_module(block, tp_mesh, {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    if sequence_parallel:
        parallelize_module(model, tp_mesh, {
            # the embedding output is whole on every rank: keep this rank's part of the sequence
            "tok_embeddings": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                         use_local_output=True),
        })
    return model
