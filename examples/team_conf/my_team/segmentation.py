"""The team's segmentation task: a dataset of dict samples, a small encoder-decoder and its
loss. gpubench keeps the loader, the optimizer, AMP and the timing; the batch is a dict
({"image", "mask"}, moved to the device whole) and the loss is the team's (step=custom,
step.takes=batch: `loss(model, batch)`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset


class Shapes(Dataset):
    """`samples` images of random rectangles, each class painted in its own grey level, and
    their masks (0: background). The image and its mask are flipped together: a transform of
    the team's own, which gpubench's image-only transforms could not do."""

    def __init__(self, samples: int = 64, size: int = 32, num_classes: int = 4, seed: int = 0):
        self.samples, self.size, self.classes, self.seed = samples, size, num_classes, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        mask = torch.zeros(self.size, self.size, dtype=torch.int64)
        for c in range(1, self.classes):
            top, left = torch.randint(0, self.size // 2, (2,), generator=g).tolist()
            h, w = torch.randint(4, self.size // 2, (2,), generator=g).tolist()
            mask[top:top + h, left:left + w] = c
        image = (mask.float() / self.classes).expand(3, -1, -1)
        image = image + 0.1 * torch.randn(image.shape, generator=g)
        if torch.rand((), generator=g) < 0.5:
            image, mask = image.flip(-1), mask.flip(-1)
        return {"image": image.contiguous(), "mask": mask.contiguous()}


class TinySegNet(nn.Module):
    """Two strided convolutions down, one up: per-pixel logits of `num_classes`."""

    def __init__(self, num_classes: int = 4, width: int = 16):
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * width, width, 4, stride=4)
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.up(self.down(x))))


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """step.takes=batch: the model and the whole batch in, the loss out (a scalar tensor)."""
    return F.cross_entropy(model(batch["image"]), batch["mask"])
