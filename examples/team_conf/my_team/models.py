"""The team's network: gpubench builds it from `model._target_` with `model.kwargs`, and passes
`num_classes` because the constructor takes it."""

from __future__ import annotations

import torch
from torch import nn


class SmallConvNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, depth: int = 2):
        super().__init__()
        layers, c = [], 3
        for i in range(depth):
            layers += [nn.Conv2d(c, width * 2**i, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(width * 2**i), nn.ReLU(inplace=True)]
            c = width * 2**i
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))
