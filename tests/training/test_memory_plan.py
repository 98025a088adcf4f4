"""The memory plan (contract/memory.py) against the bytes 2 processes measure on CPU (training/bench_memory.py):
parameters, gradients and optimizer states exactly; activations within 20% of the most bytes autograd held for
the backward at once (every layout and pipeline schedule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# llama-tiny with a vocabulary and widths that FSDP's 2 shards and tp=2 cut unevenly nowhere, and GPT-2 tiny's
# biases and tied head. Each schedule's pipeline; the interleaved one with 4 blocks, one in each of its 4 stages.
LAYOUTS = [
    "",
    "parallel.tp=2",
    "parallel.tp=2,parallel.activation_checkpointing=true",
    "parallel.pp=2",
    "parallel.pp=2,parallel.pp_schedule=gpipe",
    "parallel.pp=2,parallel.pp_schedule=interleaved1f1b,model.n_layers=4",
]


@pytest.mark.parametrize("model", ["llama-tiny", "tiny"])
def test_the_plan_matches_the_measured_bytes(model: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "training.bench_memory"]
    command += [f"--hp={hp}" for hp in (f"model={model}", "seq_len=64", "batch_size=4", "distribution=fsdp")]
    command += [f"--layout={layout}" for layout in LAYOUTS]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [row["layout"] for row in rows] == LAYOUTS
    for row in rows:
        for rank in row["ranks"]:
            measured, planned, where = rank["measured"], rank["planned"], (row["layout"], rank["rank"])
            for kind in ("parameters", "gradients", "optimizer_states"):
                assert measured[kind] == planned[kind], (*where, kind)
            # What autograd saves, except under activation checkpointing, whose recomputation saves under hooks of
            # its own: there MemTracker's activations (which, at the peak of all memory, in the backward, miss
            # the saved tensors freed by then).
            checkpointed = "activation_checkpointing" in row["layout"]
            activations = measured["peak"]["_MemRefType.ACT"] if checkpointed else measured["saved_peak"]
            assert abs(planned["activations"] - activations) <= 0.2 * activations, (*where, measured)
