"""The instance catalog's pre-flight expectations: CUDA GPUs per host and the all-reduce floor."""

from __future__ import annotations

from contract.catalog import INSTANCE_TYPES, instance_type

ALLREDUCE_FLOOR_GBPS = {t.name: t.allreduce_floor_gbps for t in INSTANCE_TYPES.values() if t.allreduce_floor_gbps}


def test_cuda_gpus_count_nvidia_gpus_only() -> None:
    assert instance_type("ml.p5.48xlarge").cuda_gpus == 8
    assert instance_type("ml.g5.xlarge").cuda_gpus == 1
    assert instance_type("ml.m5.xlarge").cuda_gpus == 0
    # Trainium's devices are Neuron cores, which CUDA does not see.
    assert instance_type("ml.trn1.32xlarge").gpus == 16
    assert instance_type("ml.trn1.32xlarge").cuda_gpus == 0
    assert {t.accelerator for t in INSTANCE_TYPES.values() if t.gpus and not t.cuda} == {"Trainium"}
    assert not any(t.cuda for t in INSTANCE_TYPES.values() if not t.gpus)


def test_every_floor_belongs_to_a_cuda_type_with_efa() -> None:
    for name, floor in ALLREDUCE_FLOOR_GBPS.items():
        instance = INSTANCE_TYPES[name]
        assert instance.supports_efa and instance.cuda_gpus > 0, name
        assert instance.allreduce_floor_gbps == floor > 0
    assert instance_type("ml.p4d.24xlarge").allreduce_floor_gbps == 10.0
    assert instance_type("ml.c5n.18xlarge").allreduce_floor_gbps == 0.0  # EFA, but no GPUs
    assert instance_type("ml.trn1.32xlarge").allreduce_floor_gbps == 0.0
    assert instance_type("ml.g5.12xlarge").allreduce_floor_gbps == 0.0  # no EFA


def test_every_cuda_type_with_efa_and_several_gpus_has_a_floor() -> None:
    missing = [
        t.name
        for t in INSTANCE_TYPES.values()
        if t.supports_efa and t.cuda_gpus > 1 and t.name not in ALLREDUCE_FLOOR_GBPS
    ]
    assert not missing, f"give {missing} an all-reduce floor in the catalog"


def test_instance_types_reference_page_is_current() -> None:
    from pathlib import Path

    from contract.catalog import instance_type_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "instance-types.md").read_text()
    table = instance_type_table()
    assert all(f"`{name}`" in table for name in INSTANCE_TYPES)
    assert table in page, "docs/reference/instance-types.md is stale: regenerate it with `make docs`"
