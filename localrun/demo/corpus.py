"""A small corpus generated offline, tokenized into the trainer's shard format.

The documents come from a tiny seeded grammar: structured enough that a tiny model's loss
falls visibly within a few dozen steps, and identical on every machine.
"""

from __future__ import annotations

import random
from pathlib import Path

from training.prepare import prepare
from training.tokenizer import ByteTokenizer

_SUBJECTS = ["the engineer", "a platform team", "the cluster", "every node", "the scheduler", "our model"]
_VERBS = ["trains", "checkpoints", "evaluates", "registers", "shards", "resumes", "streams"]
_OBJECTS = ["the dataset", "a new model", "its gradients", "the optimizer state", "every shard", "the weights"]
_ENDINGS = ["before noon.", "on spot capacity.", "across four hosts.", "without losing a step.", "in one subnet."]


def write_documents(folder: Path, *, documents: int = 240, seed: int = 7) -> list[Path]:
    """`documents` text files of 20 to 40 sentences each."""
    rng = random.Random(seed)  # noqa: S311 - reproducible text, not secrets
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(documents):
        sentences = [
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
            for _ in range(rng.randint(20, 40))
        ]
        path = folder / f"doc-{i:04d}.txt"
        path.write_text(" ".join(s.capitalize() for s in sentences) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def build_shards(workdir: Path) -> list[Path]:
    """Byte-level shards (every 10th document to validation, as `*val*.bin`) under workdir/shards."""
    write_documents(workdir / "text")
    written = prepare(workdir / "text", workdir / "shards", ByteTokenizer(), val_every=10)
    return [*written["train"], *written["val"]]
