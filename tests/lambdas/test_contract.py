"""The typed contract: what Validate hands on is a TrainingRequest, and JSONPaths only name real fields."""

from __future__ import annotations

import json
from pathlib import Path as FilePath

import pytest
from pydantic import ValidationError

from contract.distributions import DISTRIBUTIONS
from contract.distributions import distribution as named
from contract.execution_state import JOB, REQUEST, Path, TrainingRequest
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

EXAMPLE = json.loads((FilePath(__file__).resolve().parents[2] / "examples" / "single-node-ddp.json").read_text())


def test_paths_are_generated_from_the_models() -> None:
    assert str(REQUEST.dataset.uri) == "$.request.dataset.uri"
    assert str(REQUEST.instance_type) == "$.request.instance_type"  # a computed field is addressable too
    assert str(REQUEST.quality.metric) == "$.request.quality.metric"  # through Optional
    assert str(JOB.final_metrics) == "$.job.final_metrics"


def test_a_renamed_field_fails_where_the_path_is_written() -> None:
    with pytest.raises(AttributeError, match=r"TrainingRequest has no field 'instance_typ'; it has run_name"):
        _ = REQUEST.instance_typ
    with pytest.raises(AttributeError, match="Dataset has no field 'bucket'"):
        _ = REQUEST.dataset.bucket
    with pytest.raises(AttributeError):  # below a plain value there are no fields to check against
        _ = Path(None, "$.x").y


def test_what_validate_returns_parses_back_and_keeps_its_computed_fields() -> None:
    resolved = resolve(EXAMPLE, execution_name="exec-1", limits=LIMITS)
    request = TrainingRequest.parse(resolved)
    assert request.model_dump(mode="json") == resolved
    assert resolved["instance_type"] == resolved["instance_groups"][0]["instance_type"] == EXAMPLE["instance_type"]
    assert resolved["efa"] is True  # ml.p4d.24xlarge has EFA and the example does not turn it off


def test_a_request_with_a_stray_key_is_rejected() -> None:
    resolved = resolve(EXAMPLE, execution_name="exec-1", limits=LIMITS)
    with pytest.raises(ValidationError, match="instance_typo"):
        TrainingRequest.parse(resolved | {"instance_typo": "ml.p5.48xlarge"})


def test_efa_off_is_carried_to_the_group() -> None:
    off = resolve(EXAMPLE | {"efa": False}, execution_name="e", limits=LIMITS)
    # A g5.2xlarge's one A10G holds 16 of the example's sequences of 1024 (its memory plan), not 32.
    fits = {**EXAMPLE["hyperparameters"], "batch_size": 16}
    without = resolve(
        EXAMPLE | {"instance_type": "ml.g5.2xlarge", "hyperparameters": fits}, execution_name="e", limits=LIMITS
    )
    assert (off["efa"], without["efa"]) == (False, False)


def test_the_preflights_expectations_come_from_the_catalog() -> None:
    p4d = resolve(EXAMPLE, execution_name="e", limits=LIMITS)
    assert (p4d["gpus"], p4d["allreduce_floor_gbps"]) == (8, 10.0)
    # Over TCP sockets the EFA floor does not apply; GPUs are expected all the same.
    off = resolve(EXAMPLE | {"efa": False}, execution_name="e", limits=LIMITS)
    assert (off["gpus"], off["allreduce_floor_gbps"]) == (8, 0.0)
    cpu = resolve(EXAMPLE | {"instance_type": "ml.m5.xlarge"}, execution_name="e", limits=LIMITS)
    assert (cpu["gpus"], cpu["allreduce_floor_gbps"]) == (0, 0.0)
    # A request resolved before these fields existed (an execution in flight across a deploy) still parses.
    group = {k: v for k, v in p4d["instance_groups"][0].items() if k not in ("gpus", "allreduce_floor_gbps")}
    older = TrainingRequest.parse(p4d | {"instance_groups": [group]})
    assert (older.gpus, older.allreduce_floor_gbps) == (0, 0.0)


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_distribution_has_a_local_stand_in_that_runs_here(name: str) -> None:
    stand_in = named(DISTRIBUTIONS[name].local_stand_in)
    assert stand_in.launcher == "torchrun" and stand_in.required_module is None


def test_an_unknown_distribution_names_the_choices() -> None:
    with pytest.raises(ValueError, match="ddp, fsdp, smddp, mpi"):
        named("zero3")
