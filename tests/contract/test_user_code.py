"""The `code.*` hyperparameters as the launcher reads them (contract/user_code.py)."""

from __future__ import annotations

import pytest

from contract.user_code import (
    EntryPoint,
    UserCode,
    UserCodeError,
    parse_entry_point,
    script_hyperparameters,
)

SHA = "ab" * 32


def test_a_script_or_a_module_is_an_entry_point_and_nothing_else() -> None:
    assert parse_entry_point("src/train.py") == EntryPoint(script="src/train.py")
    assert parse_entry_point(" -m pkg.train ") == EntryPoint(module="pkg.train")
    assert parse_entry_point("-m pkg.train").argv() == ["-m", "pkg.train"]
    for bad in ("/abs/train.py", "../train.py", "train.sh", "-m pkg/train", "-m 1pkg", "a//b.py", "./train.py"):
        with pytest.raises(UserCodeError, match=r"code\.entry_point"):
            parse_entry_point(bad)


def test_the_code_hyperparameters_parse_and_every_problem_is_named_at_once() -> None:
    hps = {
        "code.entry_point": "train.py",
        "code.sha256": SHA,
        "code.args": '["--epochs", "3"]',
        "code.requirements": "requirements.txt",
        "code.retry_on_exit_codes": "[75, 76]",
        "lr": "0.1",
    }
    assert UserCode.from_hyperparameters(hps) == UserCode(
        EntryPoint(script="train.py"), SHA, ("--epochs", "3"), "requirements.txt", frozenset({75, 76})
    )
    assert UserCode.from_hyperparameters({"lr": "0.1"}) is None
    with pytest.raises(UserCodeError) as raised:
        UserCode.from_hyperparameters(
            {
                "code.entry_point": "train.sh",
                "code.sha256": "nope",
                "code.args": "--epochs 3",
                "code.retry_on_exit_codes": "[0, true]",
                "code.entrypoint": "x",
            }
        )
    message = str(raised.value)
    for part in (
        "unknown hyperparameter 'code.entrypoint'",
        "code.entry_point=",
        "code.sha256=",
        "code.args=",
        "code.retry_on",
    ):
        assert part in message, part
    with pytest.raises(UserCodeError, match=r"without code\.entry_point"):
        UserCode.from_hyperparameters({"code.sha256": SHA})


def test_the_script_receives_its_own_hyperparameters_only() -> None:
    hps = {
        "code.entry_point": "train.py",
        "code.sha256": SHA,
        "distribution": "ddp",
        "preflight": "false",
        "hang.minutes": "5",
        "stragglers.action": "warn",
        "sagemaker_program": "train.py",
        "_tuning_objective_metric": "loss",
        "lr": "0.1",
        "epochs": 3,
        "model": "resnet18",
    }
    assert script_hyperparameters(hps) == {"lr": "0.1", "epochs": "3", "model": "resnet18"}
