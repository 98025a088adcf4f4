"""A handler's environment: rendered for the stack, read back in the handler, every problem named at once."""

from __future__ import annotations

from typing import Any

import pytest

from lambdas.shared.env import HandlerEnvironment, HandlerEnvironmentError


class Example(HandlerEnvironment):
    checkpoints_bucket: str
    stale_minutes: int
    threshold_usd: float
    forbid_self_approval: bool
    approvers: list[str]
    price_overrides: dict[str, float]
    spot_fraction: tuple[float, float]


EXAMPLE = Example(
    checkpoints_bucket="${Token[TOKEN.42]}",
    stale_minutes=90,
    threshold_usd=1000.0,
    forbid_self_approval=False,
    approvers=["arn:aws:iam::123456789012:role/MLLead"],
    price_overrides={"ml.p5.48xlarge": 60.5},
    spot_fraction=(0.3, 0.7),
)


def test_variables_are_the_upper_cased_fields_in_order_as_text_json_and_true_false() -> None:
    assert list(EXAMPLE.variables().items()) == [
        ("CHECKPOINTS_BUCKET", "${Token[TOKEN.42]}"),
        ("STALE_MINUTES", "90"),
        ("THRESHOLD_USD", "1000.0"),
        ("FORBID_SELF_APPROVAL", "false"),
        ("APPROVERS", '["arn:aws:iam::123456789012:role/MLLead"]'),
        ("PRICE_OVERRIDES", '{"ml.p5.48xlarge": 60.5}'),
        ("SPOT_FRACTION", "[0.3, 0.7]"),
    ]


def test_the_handler_reads_back_what_the_stack_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in EXAMPLE.variables().items():
        monkeypatch.setenv(name, value)
    read = Example.from_environ()
    assert read == EXAMPLE
    assert read.stale_minutes == 90
    assert read.forbid_self_approval is False


def test_the_environment_is_parsed_once_per_set_of_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in EXAMPLE.variables().items():
        monkeypatch.setenv(name, value)
    assert Example.from_environ() is Example.from_environ()
    monkeypatch.setenv("STALE_MINUTES", "30")
    assert Example.from_environ().stale_minutes == 30


def test_every_missing_or_malformed_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    broken: dict[str, Any] = {
        **EXAMPLE.variables(),
        "STALE_MINUTES": "ninety",
        "FORBID_SELF_APPROVAL": "yes",
        "APPROVERS": "[not json",
        "PRICE_OVERRIDES": '{"ml.p5.48xlarge": "cheap"}',
    }
    del broken["CHECKPOINTS_BUCKET"]
    monkeypatch.delenv("CHECKPOINTS_BUCKET", raising=False)
    for name, value in broken.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(HandlerEnvironmentError) as raised:
        Example.from_environ()
    message = str(raised.value)
    assert message.startswith("Example: ")
    for problem in (
        "CHECKPOINTS_BUCKET is not set",
        "STALE_MINUTES: Input should be a valid integer",
        "'ninety'",
        "FORBID_SELF_APPROVAL must be true or false, not 'yes'",
        "APPROVERS is not JSON",
        "PRICE_OVERRIDES: Input should be a valid number",
    ):
        assert problem in message
    assert "THRESHOLD_USD" not in message
    assert "SPOT_FRACTION" not in message
