"""Build an ImageFolder (class sub-folders of JPEGs) from real photographs shipped with
scikit-image, so decode cost is that of real photos rather than noise. Nothing is downloaded:
the photos are read straight from the files inside the installed `skimage.data` package.

Each class is cut from one photo (classes cycle through the photos when there are more classes
than photos) by random crops with random aspect ratio, rescales and flips; the same --seed gives
byte-identical files.

    python scripts/make_imagefolder.py /tmp/folder --classes 8 --per-class 100 --size 256

Also importable: `from make_imagefolder import make_imagefolder` (tests do).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from importlib import resources
from pathlib import Path

# Colour photographs bundled in the scikit-image wheel (grey textures and charts left out).
PHOTOS = (
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
)


def load_photos(names: tuple[str, ...] = PHOTOS) -> list:
    """The photos as RGB PIL images, read from the package's own files (never fetched)."""
    from PIL import Image

    folder = resources.files("skimage.data")
    photos = []
    for name in names:
        with Image.open(folder / name) as im:
            photos.append(im.convert("RGB"))
    return photos


def random_view(photo, size: int, rng: random.Random):
    """A random crop (10-100% of the area, aspect 3/4-4/3), rescaled so its shorter side is
    `size` (like photos in a real training set, not all square), flipped half the time."""
    from PIL import Image

    w, h = photo.size
    for _ in range(10):
        area = w * h * rng.uniform(0.1, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            break
    else:
        cw, ch = min(w, h), min(w, h)
    x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
    crop = photo.crop((x0, y0, x0 + cw, y0 + ch))
    scale = size / min(cw, ch)
    out = crop.resize((max(size, round(cw * scale)), max(size, round(ch * scale))), Image.BICUBIC)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return out


def make_imagefolder(
    root: str | Path,
    classes: int = 8,
    per_class: int = 16,
    size: int = 64,
    quality: int = 90,
    seed: int = 0,
) -> dict:
    """Write `classes` x `per_class` JPEGs under root/<class>/; return a summary dict."""
    if classes < 1 or per_class < 1 or size < 8 or not 1 <= quality <= 100:
        raise ValueError("need classes >= 1, per_class >= 1, size >= 8, 1 <= quality <= 100")
    root = Path(root)
    rng = random.Random(seed)
    photos = load_photos()
    t0 = time.perf_counter()
    total = 0
    for c in range(classes):
        photo_idx = c % len(photos)
        name = f"{c:03d}_{Path(PHOTOS[photo_idx]).stem}"
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = folder / f"{i:05d}.jpg"
            random_view(photos[photo_idx], size, rng).save(path, format="JPEG", quality=quality)
            total += path.stat().st_size
    n = classes * per_class
    return {
        "root": str(root),
        "classes": classes,
        "images": n,
        "size": size,
        "quality": quality,
        "seed": seed,
        "bytes": total,
        "mean_bytes": total / n,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="folder to create (class sub-folders go inside)")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--per-class", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="shorter side of each image, px")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality 1-100")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    summary = make_imagefolder(a.root, a.classes, a.per_class, a.size, a.quality, a.seed)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
