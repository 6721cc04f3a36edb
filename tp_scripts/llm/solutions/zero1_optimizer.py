"""The optimizer of train_llm.py: AdamW, or under --mode zero1 AdamW with its states sharded over the replicas (ZeRO-1).

AdamW keeps two states per weight (2 x 4 bytes in fp32): under DDP every replica holds all of them. ZeRO stage 1
keeps DDP's layout (llm_kit/parallel_ddp.py) and shards only these states. Your TODO (TP4.1): build_optimizer's
ZeRO-1 optimizer. Run by notebooks/day4_large_models.ipynb (TP4.1: memory per rank).
"""
import torch


def build_optimizer(args, modules, dims, dp_group):
    params = [p for module in modules for p in module.parameters()]
    adamw = {"lr": args.lr, "weight_decay": args.weight_decay, "betas": (0.9, 0.95)}
    if dims.zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # a second to import: only where it is used

        # >>> SOLUTION TP4.1: ZeRO-1: each replica keeps the AdamW states (2 x 4 bytes a weight) of its share of the weights only
        # ZeroRedundancyOptimizer gives each rank a partition of the parameters; after the all-reduced
        # gradients, each rank updates its partition and broadcasts the new weights to the others.
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=dp_group, **adamw)
        # --- STUDENT
        # return torch.optim.AdamW(params, **adamw)
        # <<< SOLUTION
    return torch.optim.AdamW(params, **adamw)


def checkpointed(optimizer):
    """What the checkpoint saves of the optimizer: ZeRO-1's own partition (its inner AdamW), under the
    weights' full names; DCP puts the partitions of every rank together."""
    return optimizer.optim if type(optimizer).__name__ == "ZeroRedundancyOptimizer" else optimizer
