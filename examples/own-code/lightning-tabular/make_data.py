"""Write a small table of labelled points, one CSV row each (8 features, then a class of 3), for the Lightning example.

python make_data.py --out data/train/points.csv --rows 32
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

FEATURES, CLASSES = 8, 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)  # noqa: S311 - made-up points, not secrets
    teacher = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(CLASSES)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow([f"x{i}" for i in range(FEATURES)] + ["label"])
        for _ in range(args.rows):
            x = [rng.gauss(0, 1) for _ in range(FEATURES)]
            scores = [sum(w * v for w, v in zip(weights, x, strict=True)) for weights in teacher]
            rows.writerow([f"{v:.5f}" for v in x] + [scores.index(max(scores))])


if __name__ == "__main__":
    main()
