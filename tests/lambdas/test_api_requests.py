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
from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate.api_requests import (
    _FROM_INPUT,
    LIMITS,
    TUNING_RANGES,
    api_problems,
    input_field,
    python_pattern,
    refusals,
    sent,
)
from lambdas.validate.inputs import ExecutionInput
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


def _problems(execution_input: dict[str, Any], limits: Any = PLATFORM) -> list[Problem]:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="exec-1", limits=limits)
    return raised.value.problems


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


def _too_many_ranges() -> dict[str, Any]:
    fixed = {trainer_field(key) for key in TUNING["hyperparameters"]} | {"model.name", "distribution"}
    fields = [spec for name, spec in HYPERPARAMETERS.items() if name not in fixed and spec.default != ""]
    ranges = {spec.name: {"type": "categorical", "values": [spec.default]} for spec in fields[: TUNING_RANGES + 1]}
    assert len(ranges) == TUNING_RANGES + 1
    return _tuning(ranges)


def test_more_ranges_than_sagemaker_tunes_are_refused_at_validate_naming_the_field() -> None:
    """SageMaker's model allows 30 per kind of range; the documented limit is 30 in all."""
    execution_input = _too_many_ranges()
    # The model's limit on one kind of range, and the documented limit on all kinds together.
    per_kind, problem = _problems(execution_input)
    assert "CategoricalParameterRanges; tune fewer" in per_kind.message
    assert (per_kind.field, per_kind.value) == ("tuning.ranges", execution_input["tuning"]["ranges"])
    assert (problem.field, problem.value) == ("tuning.ranges", execution_input["tuning"]["ranges"])
    assert problem.message.startswith(f"tuning.ranges: {TUNING_RANGES + 1} ranges (")
    assert f"SageMaker tunes at most {TUNING_RANGES} at once" in problem.message
    assert "API_ParameterRanges.html" in problem.message
    assert "CreateHyperParameterTuningJob.HyperParameterTuningJobConfig.ParameterRanges" in problem.message
    assert problem.message.endswith("tune fewer hyperparameters in one run (split the search over several runs)")
    del execution_input["tuning"]["ranges"][next(iter(execution_input["tuning"]["ranges"]))]
    resolve(execution_input, execution_name="exec-1", limits=PLATFORM)


def _long_categorical() -> dict[str, Any]:
    factory = "models." + "m" * 289 + ":build_model"
    assert len(factory) == 308
    return _tuning({"model.factory": {"type": "categorical", "values": ["models.small:build", factory]}})


def test_a_categorical_value_longer_than_sagemaker_takes_is_refused_naming_its_range() -> None:
    execution_input = _long_categorical()
    (problem,) = _problems(execution_input)
    assert problem.field == "tuning.ranges.model.factory"
    assert problem.value == execution_input["tuning"]["ranges"]["model.factory"]
    assert "CategoricalParameterRanges[model.factory].Values[1]" in problem.message
    assert "has 308 characters; at most 256" in problem.message
    assert problem.message.endswith("shorten or drop what SageMaker refuses of this range")


def test_a_tag_value_outside_sagemakers_pattern_is_refused_as_the_settings() -> None:
    limits = dataclasses.replace(PLATFORM, tags={"team": "ml;ops"})
    (problem,) = _problems(json.loads((EXAMPLES / "single-node-ddp.json").read_text()), limits)
    assert problem.field == ""  # no input field sets it
    assert "CreateTrainingJob.Tags[team].Value: 'ml;ops' does not match" in problem.message
    assert "the platform's settings" in problem.message


def _batch_payload() -> dict[str, Any]:
    execution_input = json.loads((EXAMPLES / "batch-multi-node.json").read_text())
    # Keys the SageMaker SDK injects: the trainer ignores them, the job's environment carries them.
    execution_input["hyperparameters"] |= {f"sagemaker_note_{i}": "n" * 2500 for i in range(13)}
    return execution_input


def test_a_batch_job_whose_request_exceeds_batchs_payload_is_refused_as_its_hyperparameters() -> None:
    (problem,) = _problems(_batch_payload())
    assert problem.field == "hyperparameters"
    assert problem.message.startswith("hyperparameters: the job's request is")
    assert "AWS Batch takes at most 30720" in problem.message and "in SubmitJob.nodeOverrides;" in problem.message


def _many_hyperparameters() -> dict[str, Any]:
    execution_input = json.loads((EXAMPLES / "single-node-ddp.json").read_text())
    execution_input["hyperparameters"] |= {f"sagemaker_note_{i}": "n" for i in range(101)}
    return execution_input


OVER_LIMITS = {
    "too many ranges": _too_many_ranges,
    "a long categorical value": _long_categorical,
    "a batch payload": _batch_payload,
    "too many hyperparameters": _many_hyperparameters,
}


@pytest.mark.parametrize("over", OVER_LIMITS, ids=list(OVER_LIMITS))
def test_every_service_limit_a_run_can_exceed_names_its_input_field_and_value(over: str) -> None:
    execution_input = OVER_LIMITS[over]()
    problems = _problems(execution_input)
    assert problems
    for problem in problems:
        assert problem.field.split(".")[0].split("[")[0] in ExecutionInput.model_fields, problem
        assert problem.value is not None, problem
        assert problem.message.startswith(f"{problem.field}: "), problem


def test_every_field_the_requests_map_back_to_is_an_input_field() -> None:
    for _pattern, field, fix in _FROM_INPUT:
        assert field.split(".")[0] in ExecutionInput.model_fields, field
        assert fix, field


def test_botocore_names_a_list_item_as_the_models_checks_do() -> None:
    params = {"Tags": [{"Key": "run", "Value": 1}]}
    (refused,) = [r for r in refusals("sagemaker", "AddTags", params) if "type" in r.problem]
    assert refused.member == "Tags[run].Value"
    assert input_field(refused) == ("run_name", "use a shorter run_name")


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
