"""The parallel layout: hyperparameters -> degrees on a cluster, with every refusal's fix (contract/mesh.py)."""

from __future__ import annotations

import pytest

from contract.config import ConfigError, from_hyperparameters
from contract.mesh import Layout, layout_problems, microbatches_in_flight, resolve_layout, stage_blocks
from contract.resume import resume_problems

LLAMA = {"model": "llama-tiny", "distribution": "fsdp", "seq_len": "32", "batch_size": "4"}
# A GPT-2 shape whose heads, widths, vocabulary and sequence 2, 3, 4 and 6 all divide.
WIDE = {"model": "tiny", "model.dim": "96", "model.n_heads": "12", "model.vocab_size": "384", "seq_len": "48"}


def _layout(processes: int = 16, per_host: int = 8, **hp: str) -> Layout:
    return resolve_layout(from_hyperparameters({**LLAMA, **hp}), processes, per_host)


def _problems(processes: int = 16, per_host: int = 8, **hp: str) -> list[str]:
    return [p.message for p in layout_problems(from_hyperparameters({**LLAMA, **hp}), processes, per_host)]


def test_data_parallelism_takes_the_processes_tensor_and_pipeline_parallelism_leave() -> None:
    assert _layout() == Layout(dp_shard=16)
    assert _layout(**{"parallel.tp": "2"}) == Layout(dp_shard=8, tp=2)
    assert _layout(**{"parallel.tp": "2", "parallel.pp": "2"}).shape == (2, 1, 4, 2)
    # HSDP: one of the two data-parallel degrees given, the other derived.
    assert _layout(**{"parallel.dp_shard": "8"}) == Layout(dp_replicate=2, dp_shard=8)
    assert _layout(**{"parallel.dp_replicate": "4"}) == Layout(dp_replicate=4, dp_shard=4)
    # DDP: every process a replica.
    ddp = resolve_layout(from_hyperparameters({**LLAMA, "distribution": "ddp"}), 16, 8)
    assert (ddp.dp_replicate, ddp.dp_shard, ddp.dp) == (16, 1, 16)


def test_a_tensor_parallel_group_stays_on_a_host_and_the_fix_names_the_degree_that_would() -> None:
    (problem,) = _problems(**WIDE, **{"parallel.tp": "3"})
    assert problem.startswith("16 processes cannot be tp=3: tp must divide 8, the GPUs per host")
    assert problem.endswith("use parallel.tp=2")
    (problem,) = _problems(processes=8, per_host=4, **WIDE, **{"parallel.tp": "6"})
    assert "tp must divide 4, the GPUs per host" in problem and problem.endswith("use parallel.tp=4")


def test_every_problem_of_a_layout_is_named_at_once() -> None:
    problems = _problems(processes=20, per_host=4, **WIDE, **{"parallel.tp": "6", "parallel.pp": "2"})
    assert len(problems) == 2
    assert "tp must divide 4" in problems[0]
    # Judged at the suggested tp=4: 20 processes are not a multiple of 4 x 2.
    assert "20 processes cannot be tp=4 x pp=2: tp x pp must divide the processes" in problems[1]


def test_data_parallel_degrees_that_do_not_fit_the_processes_are_refused() -> None:
    (problem,) = _problems(**{"parallel.dp_replicate": "2", "parallel.dp_shard": "4"})
    assert "2 x parallel.dp_shard=4 = 8" in problem and "leave 16 data-parallel processes" in problem
    (problem,) = _problems(**{"parallel.dp_shard": "3"})
    assert "parallel.dp_shard=3 must divide the 16 data-parallel processes" in problem


def test_the_global_batch_divides_over_the_data_parallel_processes_only() -> None:
    # 16 processes at tp=4 are 4 data-parallel ones: a global batch of 16 = 4 x 4, no accumulation.
    assert _problems(**WIDE, **{"parallel.tp": "4", "train.global_batch_size": "16"}) == []
    (problem,) = _problems(**WIDE, **{"parallel.tp": "4", "train.global_batch_size": "24"})
    assert "with 4 data-parallel processes x micro_batch_size 4 use a multiple of 16" in problem


def test_model_parallelism_needs_fsdp_and_a_built_in_model() -> None:
    with pytest.raises(ConfigError, match=r"parallel.tp=2 need distribution=fsdp .*distribution=ddp keeps a whole"):
        from_hyperparameters({**LLAMA, "distribution": "ddp", "parallel.tp": "2"})
    with pytest.raises(ConfigError, match=r"parallel\.dp_shard=2 need distribution=fsdp"):
        from_hyperparameters({**LLAMA, "distribution": "ddp", "parallel.dp_shard": "2"})
    with pytest.raises(ConfigError, match=r"split the built-in architectures only; model\.factory='a\.b:c'"):
        from_hyperparameters({**LLAMA, "model.factory": "a.b:c", "parallel.pp": "2"})


def test_tensor_parallelism_must_split_the_models_sizes_evenly() -> None:
    # llama-tiny: 4 heads, 2 KV heads, width 64, vocabulary 320.
    with pytest.raises(ConfigError, match=r"parallel.tp=4 must divide the model's KV heads=2.*use parallel.tp=2"):
        from_hyperparameters({**LLAMA, "parallel.tp": "4"})
    with pytest.raises(ConfigError, match=r"data.seq_len \(sequence parallelism\)=31"):
        from_hyperparameters({**LLAMA, "parallel.tp": "2", "seq_len": "31"})


def test_a_pipeline_needs_blocks_for_its_stages_and_micro_batches_that_cut_the_batch() -> None:
    with pytest.raises(ConfigError, match="8 stages exceed the model's 2 blocks"):
        from_hyperparameters({**LLAMA, "parallel.pp": "8"})
    with pytest.raises(ConfigError, match=r"parallel\.pp_microbatches=3 must divide train\.micro_batch_size=4"):
        from_hyperparameters({**LLAMA, "parallel.pp": "2", "parallel.pp_microbatches": "3"})
    with pytest.raises(ConfigError, match="schedule 1f1b needs at least one per stage"):
        from_hyperparameters({**LLAMA, "parallel.pp": "4", "parallel.pp_microbatches": "2", "model.n_layers": "4"})
    with pytest.raises(ConfigError, match="interleaved1f1b runs at least 2 stages per process"):
        from_hyperparameters(
            {**LLAMA, "parallel.pp_schedule": "interleaved1f1b", "parallel.pp_stages_per_process": "1"}
        )
    with pytest.raises(ConfigError, match="runs one stage per process"):
        from_hyperparameters({**LLAMA, "parallel.pp_stages_per_process": "2"})
    interleaved = _layout(processes=4, per_host=4, **{"parallel.pp": "2", "parallel.pp_schedule": "interleaved1f1b"})
    assert (interleaved.stages, interleaved.microbatches, interleaved.stages_per_process) == (4, 4, 2)


def test_stages_share_the_blocks_with_the_embedding_and_head_counted_as_one_each() -> None:
    assert stage_blocks(2, 2) == [range(0, 1), range(1, 2)]
    # 4 blocks + embedding + head over 4 stages: the first two take one unit more.
    assert stage_blocks(4, 4) == [range(0, 1), range(1, 3), range(3, 4), range(4, 4)]
    assert stage_blocks(80, 4) == [range(0, 20), range(20, 41), range(41, 61), range(61, 80)]
    for layers, stages in ((2, 2), (7, 3), (32, 8), (80, 16)):
        blocks = stage_blocks(layers, stages)
        assert [i for r in blocks for i in r] == list(range(layers))


def test_ranks_are_laid_out_with_tensor_parallelism_innermost() -> None:
    layout = Layout(dp_replicate=2, dp_shard=2, tp=2, pp=2)
    assert [layout.coordinates(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert layout.coordinates(15) == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
    # The data-parallel share is the same for the ranks of one tensor-parallel group and of one pipeline.
    assert [layout.dp_rank(r) for r in (0, 1, 8, 9)] == [0, 0, 0, 0]
    assert [layout.dp_rank(r) for r in (2, 4, 6)] == [1, 2, 3]


def test_one_f_one_b_holds_fewer_micro_batches_on_later_stages() -> None:
    layout = Layout(pp=4, microbatches=8)
    assert [microbatches_in_flight(layout, r) for r in range(4)] == [4, 3, 2, 1]
    gpipe = Layout(pp=4, microbatches=8, pp_schedule="gpipe")
    assert microbatches_in_flight(gpipe, 3) == 8


def test_a_resume_may_change_the_layout_but_not_the_batch() -> None:
    old = from_hyperparameters({**LLAMA, "parallel.tp": "2"})
    assert resume_problems(old, 4, from_hyperparameters(LLAMA), 2) == []
    (problem,) = resume_problems(old, 4, from_hyperparameters(LLAMA), 4)
    assert "this run's batch is 16 sequences per step, the continued run's 8" in problem


def test_a_layout_asks_for_itself_in_hyperparameters() -> None:
    layout = _layout(processes=8, per_host=8, **{"parallel.tp": "2", "parallel.pp": "2"})
    again = _layout(processes=8, per_host=8, **layout.hyperparameters())
    assert again == layout
    assert layout.describe() == "pp=2 x dp_shard=2 x tp=2 x 1f1b x 2 micro-batches"


def test_interleaved_1f1b_holds_what_torch_s_order_leaves_in_flight() -> None:
    layout = Layout(pp=2, microbatches=4, stages_per_process=2, pp_schedule="interleaved1f1b")
    # Process 0 runs 0F0 0F1 2F0 2F1 0F2 before its first backward; process 1's last stage keeps all 4
    # micro-batches' activations until the step ends (measured: tests/training/test_memory_plan.py).
    assert [microbatches_in_flight(layout, r) for r in range(2)] == [5, 6]
