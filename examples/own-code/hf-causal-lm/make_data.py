"""Write a small JSONL text set, one {"text": ...} per line, for the causal-LM example.

python make_data.py --out data/train/stories.jsonl --lines 400   (or --out data/train: its stories.jsonl)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SUBJECTS = ("the cat", "a small dog", "the old sailor", "my neighbour", "a robot", "the teacher")
VERBS = ("found", "painted", "lost", "carried", "repaired", "watched")
OBJECTS = ("a red kite", "the broken clock", "two green apples", "an empty boat", "the last train", "a paper map")
PLACES = ("in the garden", "by the river", "at the station", "under the bridge", "on the hill", "near the market")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl file, or a folder to write stories.jsonl in")
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)  # noqa: S311 - made-up sentences, not secrets
    path = args.out if args.out.suffix == ".jsonl" else args.out / "stories.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for _ in range(args.lines):
            text = " ".join(rng.choice(words) for words in (SUBJECTS, VERBS, OBJECTS, PLACES)).capitalize() + "."
            out.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
