"""Validate builds the request the state machine will send and refuses what SageMaker or AWS Batch would refuse:
botocore's validation, the model's maximums and patterns, and the documented limits the models do not encode."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from contract.config import HYPERPARAMETERS
from contract.execution_state import TrainingRequest
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.api_requests import LIMITS, TUNING_RANGES, api_problems, python_pattern, sent
from lambdas.validate.request import resolve
from lambdas.validate.trials import trainer_field
from tests.lambdas.test_handlers import LIMITS as PLATFORM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TUNING = json.loads((EXAMPLES / "tuning.json").read_text())
OPERATIONS = [
    ("sagemaker", "CreateTrainingJob"),
    ("sagemaker", "CreateHyperParameterTuningJob"),
    ("batch", "SubmitJob"),
]


def _refusal(execution_input: dict[str, Any], limits: Any = PLATFORM) -> str:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="exec-1", limits=limits)
    return str(raised.value)


def _tuning(ranges: dict[str, Any]) -> dict[str, Any]:
    execution_input = json.loads(json.dumps(TUNING))
    execution_input["tuning"]["ranges"] = ranges
    return execution_input


def _shapes(shape: Any, seen: frozenset[str] = frozenset()) -> list[Any]:
    if shape.name in seen:
        return []
    seen |= {shape.name}
    found = [shape]
    children = {
        "structure": lambda: list(shape.members.values()),
        "list": lambda: [shape.member],
        "map": lambda: [shape.key, shape.value],
    }.get(shape.type_name, list)()
    for child in children:
        found += _shapes(child, seen)
    return found


@pytest.mark.parametrize(("service", "operation"), OPERATIONS, ids=[o for _, o in OPERATIONS])
def test_every_pattern_of_the_three_operations_is_checked_in_python(service: str, operation: str) -> None:
    shape = botocore.session.get_session().get_service_model(service).operation_model(operation).input_shape
    patterns = {s.metadata["pattern"] for s in _shapes(shape) if "pattern" in s.metadata}
    for pattern in patterns:
        python_pattern(pattern)  # ValueError for a Java construct not translated
    tag = python_pattern(r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)")
    assert tag.fullmatch("Ünïcode tag 1_.:/=+-@") and not tag.fullmatch("a;b") and not tag.fullmatch("tab\there")


def test_more_ranges_than_sagemaker_tunes_are_refused_at_validate() -> None:
    """SageMaker's model allows 30 per kind of range; the documented limit is 30 in all."""
    fixed = {trainer_field(key) for key in TUNING["hyperparameters"]} | {"model.name", "distribution"}
    fields = [spec for name, spec in HYPERPARAMETERS.items() if name not in fixed and spec.default != ""]
    ranges = {spec.name: {"type": "categorical", "values": [spec.default]} for spec in fields[: TUNING_RANGES + 1]}
    assert len(ranges) == TUNING_RANGES + 1
    message = _refusal(_tuning(ranges))
    assert f"CreateHyperParameterTuningJob: {TUNING_RANGES + 1} ranges (" in message
    assert f"SageMaker tunes at most {TUNING_RANGES} at once" in message
    assert "API_ParameterRanges.html" in message
    del ranges[fields[0].name]
    resolve(_tuning(ranges), execution_name="exec-1", limits=PLATFORM)


def test_a_categorical_value_longer_than_sagemaker_takes_is_refused() -> None:
    factory = "models." + "m" * 289 + ":build_model"
    assert len(factory) == 308
    message = _refusal(_tuning({"model.factory": {"type": "categorical", "values": ["models.small:build", factory]}}))
    assert "CategoricalParameterRanges[model.factory].Values[1]" in message
    assert "has 308 characters; at most 256" in message


def test_a_tag_value_outside_sagemakers_pattern_is_refused() -> None:
    limits = dataclasses.replace(PLATFORM, tags={"team": "ml;ops"})
    message = _refusal(json.loads((EXAMPLES / "single-node-ddp.json").read_text()), limits)
    assert "CreateTrainingJob.Tags[team].Value: 'ml;ops' does not match" in message


def test_a_batch_job_whose_request_exceeds_batchs_payload_is_refused() -> None:
    execution_input = json.loads((EXAMPLES / "batch-multi-node.json").read_text())
    # Keys the SageMaker SDK injects: the trainer ignores them, the job's environment carries them.
    execution_input["hyperparameters"] |= {f"sagemaker_note_{i}": "n" * 2500 for i in range(13)}
    message = _refusal(execution_input)
    assert "SubmitJob: the job's request is" in message and "AWS Batch takes at most 30720" in message


def test_botocores_own_validation_and_the_models_maximums_name_the_field() -> None:
    request = TrainingRequest.parse(
        resolve(json.loads((EXAMPLES / "batch-multi-node.json").read_text()), execution_name="x", limits=PLATFORM)
    )
    ((service, operation, params),) = sent(request, 1)
    assert (service, operation) == ("batch", "SubmitJob")
    assert api_problems("batch", "SubmitJob", params) == []
    params["nodeOverrides"]["numNodes"] = "two"
    params["tags"] = {f"k{i}": "v" for i in range(51)}
    problems = api_problems("batch", "SubmitJob", params)
    assert any("nodeOverrides.numNodes" in p and "type" in p for p in problems), problems
    assert "SubmitJob.tags: " in " ".join(problems) and "has 51 entries; at most 50" in " ".join(problems)
    params = sent(request, 1)[0].params | {"jobName": "x" * 129}
    assert any("up to 128 letters" in p for p in api_problems("batch", "SubmitJob", params))


def test_the_limits_table_names_a_source_for_every_limit() -> None:
    for limit in LIMITS:
        assert limit.source.startswith("https://docs.aws.amazon.com/"), limit
        assert (limit.service, limit.operation) in OPERATIONS
