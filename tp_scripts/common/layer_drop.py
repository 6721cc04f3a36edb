"""--layer-drop P: stochastic depth by the batch (Huang et al., 2016), for TP2.3's unused parameters.

Each residual block that keeps its input's shape is skipped for a whole batch with probability P: it returns its
input, and its parameters take no part in that step's loss. Under DDP their gradients never arrive, so the
next step stops with PyTorch's "Expected to have finished reduction in the prior iteration" unless DDP was told
`find_unused_parameters=True`. (torchvision's own stochastic depth drops branches per *sample*: every block
still gets a gradient, so it cannot show this.)
"""
from __future__ import annotations

import torch
import torch.nn as nn


class DroppableBlock(nn.Module):
    def __init__(self, block: nn.Module, p: float):
        super().__init__()
        self.block, self.p, self.skipped = block, p, 0

    def forward(self, x):
        if self.training and torch.rand(()) < self.p:  # the global stream: each rank draws its own
            self.skipped += 1
            return x
        return self.block(x)


def shape_keeping_blocks(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of each torchvision ResNet block without a downsample (its output has its input's shape)."""
    return [(layer, name) for layer_name in ("layer1", "layer2", "layer3", "layer4")
            for layer in [getattr(model, layer_name, None)] if isinstance(layer, nn.Sequential)
            for name, block in layer.named_children() if getattr(block, "downsample", "absent") is None]


def add_layer_drop(model: nn.Module, p: float) -> nn.Module:
    blocks = shape_keeping_blocks(model)
    if not blocks:
        raise ValueError(f"--layer-drop: {type(model).__name__} has no residual block to skip (a ResNet has)")
    for parent, name in blocks:
        setattr(parent, name, DroppableBlock(getattr(parent, name), p))
    return model


def skipped_blocks(model: nn.Module) -> dict:
    """The summary fields: how many times a block was skipped in this rank's training (none without --layer-drop)."""
    blocks = [m for m in model.modules() if isinstance(m, DroppableBlock)]
    return {"layer_drop_skipped": sum(b.skipped for b in blocks), "layer_drop_blocks": len(blocks)} if blocks else {}
