"""Heterogeneous clusters: how Validate resolves instance groups, and every bad input it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contract.catalog import INSTANCE_TYPES
from contract.execution_state import TrainingRequest
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "heterogeneous-cluster.json"
S3_DATASET = f"s3://{LIMITS.datasets_bucket}/corpus/"


def _input(groups: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    base = {
        "run_name": "hetero",
        "model": "tiny",
        "dataset": S3_DATASET,
        "instance_groups": groups,
        "max_runtime_hours": 2,
    }
    return base | overrides


GPU = {"name": "gpu", "instance_type": "ml.p4d.24xlarge", "instance_count": 2}
CPU = {"name": "cpu", "instance_type": "ml.c5.4xlarge", "instance_count": 3, "role": "auxiliary"}


def _problems(execution_input: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="e", limits=LIMITS)
    return str(raised.value)


def test_groups_resolve_with_their_roles_types_and_what_the_launcher_is_told() -> None:
    request = TrainingRequest.parse(resolve(_input([GPU, CPU]), execution_name="e", limits=LIMITS))
    gpu, cpu = request.instance_groups
    assert (gpu.role, gpu.efa, gpu.gpus, gpu.local_storage) == ("train", True, 8, True)
    # The auxiliary group never joins NCCL: no EFA, GPUs or bandwidth floor expected of it.
    assert (cpu.role, cpu.efa, cpu.gpus, cpu.allreduce_floor_gbps) == ("auxiliary", False, 0, 0.0)
    assert request.heterogeneous and request.training_groups == "gpu"
    assert request.sagemaker_instance_groups == [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "cpu", "InstanceType": "ml.c5.4xlarge", "InstanceCount": 3},
    ]
    assert request.cluster == "2 x ml.p4d.24xlarge (gpu) + 3 x ml.c5.4xlarge (cpu)"
    # Pre-flight expectations are the training group's; any instance-store group drops the volume key.
    assert (request.gpus, request.instance_type, request.instance_count, request.local_storage) == (
        8,
        "ml.p4d.24xlarge",
        5,
        True,
    )
    assert all("InstanceGroupNames" not in c["DataSource"]["S3DataSource"] for c in request.channels)


def test_one_group_is_the_homogeneous_request_it_always_was() -> None:
    request = TrainingRequest.parse(
        resolve(_input([], instance_groups=None, instance_type="ml.g5.2xlarge"), execution_name="e", limits=LIMITS)
    )
    assert not request.heterogeneous and request.cluster == "1 x ml.g5.2xlarge" and request.training_groups == "train"


def test_channels_limited_to_groups_name_their_receivers() -> None:
    groups = [GPU, CPU | {"channels": ["validation"]}]
    resolved = resolve(
        _input(groups, validation_dataset=f"s3://{LIMITS.datasets_bucket}/held-out/"), execution_name="e", limits=LIMITS
    )
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"] for c in resolved["channels"]}
    assert channels["train"]["InstanceGroupNames"] == ["gpu"]
    assert "InstanceGroupNames" not in channels["validation"]  # every group takes it


def test_the_example_is_a_heterogeneous_request() -> None:
    request = TrainingRequest.parse(resolve(json.loads(EXAMPLE.read_text()), execution_name="e", limits=LIMITS))
    assert request.heterogeneous and [g.role for g in request.instance_groups] == ["train", "auxiliary"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"instance_groups": [GPU]}, "instance_groups: give 2 to 5 groups"),
        ({"instance_groups": [GPU | {"name": f"g{i}"} for i in range(6)]}, "give 2 to 5 groups (SageMaker's limit)"),
        ({"instance_groups": [GPU, CPU | {"name": "gpu"}]}, "the name 'gpu' is used twice"),
        ({"instance_groups": [GPU, CPU | {"name": "CPU_1"}]}, "name 'CPU_1' must be 1-63 of a-z, 0-9, '-'"),
        ({"instance_groups": [GPU, CPU | {"role": "preprocess"}]}, "role 'preprocess' must be 'train' or 'auxiliary'"),
        ({"instance_groups": [GPU | {"role": "auxiliary"}, CPU]}, "no group has role 'train'"),
        ({"instance_type": "ml.g5.2xlarge"}, "drop instance_type and instance_count from the top level"),
        (
            {"instance_groups": [GPU, CPU | {"instance_type": "ml.c5.nope"}]},
            "'ml.c5.nope' is not a known training type",
        ),
        (
            {"instance_groups": [GPU, CPU | {"channels": ["labels"]}]},
            "channel 'labels' is not one of train, validation",
        ),
        ({"instance_groups": [GPU | {"channels": []}, CPU]}, "a group that trains reads every channel; add train"),
        (
            {"instance_groups": [GPU, CPU | {"channels": ["validation"]}]},
            "channel 'validation' is not in this run (it has train)",
        ),
        (
            {"instance_groups": [GPU, CPU | {"channels": []}], "dataset": "fsx:///datasets/corpus/"},
            "channel 'train' reads FSx, which every host of the job mounts",
        ),
        (
            {"instance_groups": [GPU, CPU | {"role": "train"}]},
            "the groups that train must have as many GPUs per instance as each other",
        ),
        (
            {"instance_groups": [GPU, CPU], "efa": True, "warm_pool_minutes": 10},
            "warm pools do not support heterogeneous",
        ),
        (
            {"instance_groups": [GPU, CPU | {"instance_type": "ml.c5.2xlarge", "instance_count": 3000}]},
            "instance_groups need ",
        ),
        (
            {"instance_groups": [GPU, CPU | {"role": "train", "instance_type": "ml.g5.2xlarge"}], "efa": True},
            "efa is true but ml.g5.2xlarge has no EFA",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_groups_are_refused_with_what_to_fix(overrides: dict[str, Any], expected: str) -> None:
    assert expected in _problems(_input([GPU, CPU]) | overrides)


def test_a_request_with_neither_a_type_nor_groups_says_to_give_one() -> None:
    assert "instance_type: Field required; name an instance type, or give instance_groups" in _problems(
        {k: v for k, v in _input([GPU, CPU]).items() if k != "instance_groups"}
    )


def test_the_whole_clusters_interfaces_must_fit_the_subnet() -> None:
    """Every group's interfaces together: exactly enough fits, one instance more does not."""
    ips = INSTANCE_TYPES["ml.p4d.24xlarge"].private_ips_needed * 2 + INSTANCE_TYPES["ml.c5.2xlarge"].private_ips_needed
    fits = TrainingRequest.parse(
        resolve(
            _input([GPU, CPU | {"instance_type": "ml.c5.2xlarge", "instance_count": 1}]),
            execution_name="e",
            limits=LIMITS.__class__(**{**LIMITS.__dict__, "training_subnet_ips": ips}),
        )
    )
    assert fits.instance_count == 3
    with pytest.raises(InvalidRequest, match=rf"need {ips + 2} private IPs .* the training subnet holds {ips}"):
        resolve(
            _input([GPU, CPU | {"instance_type": "ml.c5.2xlarge", "instance_count": 2}]),
            execution_name="e",
            limits=LIMITS.__class__(**{**LIMITS.__dict__, "training_subnet_ips": ips}),
        )


def test_replacing_stragglers_needs_the_training_groups_on_one_instance_type() -> None:
    p5 = {"name": "p5", "instance_type": "ml.p5.48xlarge", "instance_count": 1}
    mixed = _problems(_input([GPU, p5], hyperparameters={"stragglers.action": "replace"}))
    assert "hyperparameters.stragglers.action: 'replace' needs the training groups on one instance type" in mixed
    assert "ml.p4d.24xlarge, ml.p5.48xlarge" in mixed and "use 'warn' or one type" in mixed
    # Warning is fine on mixed types, and replacing is fine beside an auxiliary group of another type.
    for accepted in (_input([GPU, p5], hyperparameters={"stragglers.action": "warn"}), _input([GPU, CPU])):
        assert resolve(accepted, execution_name="e", limits=LIMITS)
