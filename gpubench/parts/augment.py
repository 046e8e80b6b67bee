"""Train-time transforms: on the host per sample (the ImageNet recipe), or on the device per
batch of fixed-size uint8 images (for a host whose workers cannot keep up)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # imported where used: it pulls in torch._dynamo (1.3 s at import here)
    from torchvision.transforms import v2

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def cpu_train_transform(image_size: int) -> v2.Compose:
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.RandomResizedCrop(image_size, antialias=True),
                       v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(MEAN, STD)])


def cpu_fixed_size(size: int) -> v2.Compose:  # a square uint8 image (preload, device augment)
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size),
                       v2.ToDtype(torch.uint8)])


class DeviceAugment:
    """RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3) + flip + normalize on a uint8 batch,
    with crop boxes drawn per sample (not one crop for the whole batch) via roi_align."""

    def __init__(self, image_size: int, device: str, seed: int):
        self.size = image_size
        self.g = torch.Generator(device="cpu").manual_seed(seed)
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def boxes(self, n: int, h: int, w: int) -> torch.Tensor:
        area = h * w * torch.empty(n).uniform_(0.08, 1.0, generator=self.g)
        r = torch.empty(n).uniform_(math.log(3 / 4), math.log(4 / 3), generator=self.g).exp()
        cw = torch.sqrt(area * r).clamp(max=w)
        ch = torch.sqrt(area / r).clamp(max=h)
        x0 = torch.rand(n, generator=self.g) * (w - cw)
        y0 = torch.rand(n, generator=self.g) * (h - ch)
        idx = torch.arange(n, dtype=torch.float32)
        return torch.stack([idx, x0, y0, x0 + cw, y0 + ch], dim=1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import roi_align

        n, _, h, w = x.shape
        # the boxes are made on the host (tiny) and copied with the batch; no sync involved
        boxes = self.boxes(n, h, w).to(x.device, non_blocking=True)
        out = roi_align(x.float(), boxes, output_size=self.size, aligned=True)
        flip = (torch.rand(n, generator=self.g) < 0.5).to(x.device, non_blocking=True)
        out = torch.where(flip.view(n, 1, 1, 1), out.flip(-1), out)
        return (out - self.mean) / self.std


class DeviceDecode:
    """nvJPEG decode (the CPU too, for tests), resized and centre-cropped to one square size so a
    batch stacks; a failed batch is retried image by image: one bad file costs one sample."""

    def __init__(self, size: int, device: str):
        self.size, self.device = size, device
        cuda = torch.device(device).type == "cuda"
        self.side = torch.cuda.Stream(device=device) if cuda else None

    def _decode_list(self, blobs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:  # one batched call: nvJPEG decodes the whole list at once
            return list(decode_jpeg(blobs, mode=ImageReadMode.RGB, device=self.device))
        except RuntimeError:
            out: list[torch.Tensor | None] = []
            for b in blobs:
                try:
                    out.append(decode_jpeg(b, mode=ImageReadMode.RGB, device=self.device))
                except RuntimeError:
                    out.append(None)
            return out

    def _decode(self, blobs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if self.side is None:
            return self._decode_list(blobs)
        # decode_jpegs_cuda allocates its outputs on the *current* stream, but nvJPEG writes them
        # on torchvision's pool stream, ordered after nothing of ours: a block the current stream
        # just freed (still read by queued kernels) could be overwritten early. So our side
        # stream is current, where no kernel of ours runs (torchvision makes it wait: event.block)
        main = torch.cuda.current_stream(self.side.device)
        self.side.wait_stream(main)  # nothing decoded here may start before the work queued so far
        with torch.cuda.stream(self.side):
            imgs = self._decode_list(blobs)
        main.wait_stream(self.side)  # the step's stream reads the images only once decoded
        for im in imgs:
            if im is not None:  # used on main: once freed, reused after main's queued work
                im.record_stream(main)
        return imgs

    def __call__(self, blobs: list[torch.Tensor], after_decode: Callable[[], None] | None = None
                 ) -> tuple[torch.Tensor | None, list[int]]:
        """(images, indices of the failed inputs). `after_decode`: called when the decode (it
        blocks the host) has returned: the step's device work starts there (DeviceStart)."""
        from torchvision.transforms import v2

        imgs = self._decode(blobs)
        if after_decode is not None:
            after_decode()
        failed = [i for i, im in enumerate(imgs) if im is None]
        crop = v2.functional.center_crop
        fixed = [crop(v2.functional.resize(im, self.size, antialias=True), [self.size] * 2)
                 for im in imgs if im is not None]
        return (torch.stack(fixed) if fixed else None), failed
