"""Write a small image set in torchvision's ImageFolder layout: <out>/<class>/<n>.png.

Each class is a colour and a stripe direction, with noise, so a small network learns it in a few dozen steps:

    python make_data.py --out data/train --per-class 24
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("red-horizontal", "green-vertical", "blue-diagonal", "grey-checks")


def image(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size]
    period = rng.integers(3, 7)
    pattern = [y // period % 2, x // period % 2, (x + y) // period % 2, (x // period + y // period) % 2][kind]
    colour = np.zeros(3)
    colour[kind % 3] = 1.0
    if kind == 3:
        colour[:] = 0.6
    pixels = pattern[..., None] * colour * 200 + rng.normal(0, 30, (size, size, 3)) + 20
    return np.clip(pixels, 0, 255).astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-class", type=int, default=24)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for kind, name in enumerate(CLASSES):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(args.per_class):
            Image.fromarray(image(kind, args.size, rng)).save(folder / f"{n:04d}.png")


if __name__ == "__main__":
    main()
