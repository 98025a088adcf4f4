"""Fixtures for the training tests: a small corpus and an in-process world of one."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

# The repo root (for `import training`) and this folder (for `import training_helpers`), whatever
# pytest's import mode.
for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from training.prepare import prepare  # noqa: E402
from training.tokenizer import ByteTokenizer  # noqa: E402

_SENTENCE = "the quick brown fox jumps over a lazy dog while small cats sit on warm mats"
_WORDS = _SENTENCE.split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-level shards of a seeded pseudo-English corpus: train_*.bin and val_*.bin."""
    root = tmp_path_factory.mktemp("corpus")
    texts = root / "texts"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(10):
        sentences = (
            " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 10))).capitalize() + "." for _ in range(200)
        )
        (texts / f"doc{i:02d}.txt").write_text(" ".join(sentences))
    shards = root / "shards"
    prepare(texts, shards, ByteTokenizer(), shard_tokens=60_000, val_every=5)
    return shards


@pytest.fixture(scope="session")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An uninterrupted CHECKPOINTED_JOB run (checkpoints at steps 4, 8 and 12) and its log; tests copy it."""
    from training_helpers import CHECKPOINTED_JOB, make_opt_ml, run_in_process

    root = tmp_path_factory.mktemp("reference")
    make_opt_ml(root, {}, corpus=corpus)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    return root, log
