"""The classifiers train_classifier.py trains: any torchvision model by name, with CIFAR's small-image stem on demand.

Shared by train_classifier.py and the race's scorer (dlokit/race/score_checkpoint.py): not part of any TP.
"""
from __future__ import annotations

import torch.nn as nn
import torchvision


def create_model(name: str, num_classes: int) -> nn.Module:
    extra = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    return torchvision.models.get_model(name, num_classes=num_classes, **extra)


def small_image_stem(model: nn.Module) -> nn.Module:
    """--cifar-stem: a ResNet's 7x7 stride-2 convolution and max-pool leave 8x8 of a 32 px image to the first
    block; a 3x3 stride-1 convolution without the pool keeps 32x32, as CIFAR ResNets do (more accurate,
    about 3-4x the compute per image on a CPU)."""
    model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model
