"""Policies for the classification study: the classifier's softmax is the policy over labels."""

from __future__ import annotations

from torch import nn


def build_model(name: str, in_features: int, num_classes: int, hidden: list[int], zero_head: bool = False) -> nn.Module:
    """`mlp` (digits1000 on a CPU: fast, ~0.36M parameters at 192-256-256-1000) or `resnet50` (ImageNet, scratch).
    zero_head (mlp): the output layer starts at zero, so every image starts at p = 1/num_classes exactly."""
    if name == "mlp":
        layers, width = [], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        head = nn.Linear(width, num_classes)
        if zero_head:
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        return nn.Sequential(*layers, head)
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50(weights=None, num_classes=num_classes)
    raise ValueError(f"unknown model {name!r}; choose mlp or resnet50")
