"""What a continuing run (`resume_from`) may change: contract/resume.py."""

from __future__ import annotations

from contract.config import from_hyperparameters
from contract.resume import resume_problems

BASE = {"model": "tiny", "train.micro_batch_size": "4", "train.global_batch_size": "16", "data.seq_len": "64"}


def _problems(new: dict[str, str], old_processes: int = 2, new_processes: int = 2) -> list[str]:
    return resume_problems(
        from_hyperparameters(BASE), old_processes, from_hyperparameters({**BASE, **new}), new_processes
    )


def test_the_same_settings_resume_and_so_do_what_leaves_the_state_its_shape() -> None:
    assert _problems({}) == []
    assert _problems({"model.dropout": "0.1", "optim.lr": "0.001", "train.max_steps": "5000"}) == []
    # The global batch is fixed, so another number of processes keeps the optimisation.
    assert _problems({}, old_processes=2, new_processes=4) == []


def test_every_model_shape_setting_is_refused_with_the_old_value() -> None:
    for key, value in (("model.dim", "96"), ("model.n_layers", "3"), ("model.vocab_size", "300"), ("model", "gpt2")):
        problems = _problems({key: value})
        assert problems, key
        assert "resumed run's" in problems[0]


def test_a_sequence_length_change_is_refused() -> None:
    (problem,) = _problems({"data.seq_len": "32"})
    assert "data.seq_len: 32 differs from the resumed run's 64" in problem


def test_an_unfixed_batch_on_another_process_count_names_the_batch_to_fix() -> None:
    problems = resume_problems(
        from_hyperparameters({"model": "tiny", "train.micro_batch_size": "4"}),
        2,
        from_hyperparameters({"model": "tiny", "train.micro_batch_size": "4"}),
        4,
    )
    (problem,) = problems
    assert "set train.global_batch_size=8" in problem
