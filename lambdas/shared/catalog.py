"""SageMaker training instance types the platform knows: size, accelerators, EFA, list price.

One table serves the settings validation at synth time, the Validate and Estimate-cost
handlers at run time, and the network sizing check, so the three can never disagree; Validate
also hands the launcher's pre-flight check what a host of the type must show (its CUDA GPUs,
the all-reduce bandwidth floor beside the table).
Prices are SageMaker on-demand list prices for us-east-1 in USD per instance-hour, as
published when the table was last reviewed (see PRICES_REVIEWED); platforms that pay other
rates override them with the `pipeline.price_overrides` setting.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_REVIEWED = "2026-11"

# SageMaker (and the EC2 EFA guide) require this many free private IPs per EFA-enabled instance
# at least; instances with more EFA network cards take one address per card.
MIN_IPS_PER_EFA_INSTANCE = 5
MIN_IPS_PER_INSTANCE = 2


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One `ml.*` training instance type."""

    name: str
    vcpus: int
    memory_gib: int
    gpus: int
    accelerator: str
    """Accelerator model ("" for CPU-only types); keys the trainer's MFU peak table."""
    efa_interfaces: int
    """EFA-capable network cards (0: no EFA)."""
    price_per_hour: float
    local_storage: bool
    """Instance-store NVMe volumes: SageMaker rejects a VolumeKmsKeyId for these types (the NVMe is
    encrypted by the hardware), so their jobs are created without one."""

    @property
    def supports_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def cuda_gpus(self) -> int:
        """GPUs a host of this type shows CUDA (torch.cuda.device_count()); Trainium devices are not CUDA's."""
        return 0 if self.accelerator in NON_CUDA_ACCELERATORS else self.gpus

    @property
    def allreduce_floor_gbps(self) -> float:
        """The least NCCL all-reduce bus bandwidth (GB/s) a healthy multi-node job of this type reaches over EFA;
        0 where there is no floor (see ALLREDUCE_FLOOR_GBPS)."""
        return ALLREDUCE_FLOOR_GBPS.get(self.name, 0.0)

    @property
    def ec2_name(self) -> str:
        """The EC2 type behind the SageMaker one (for launch templates and AWS Batch)."""
        return self.name.removeprefix("ml.")

    @property
    def private_ips_needed(self) -> int:
        """Private IPs one instance takes in the training subnet."""
        if self.supports_efa:
            return max(MIN_IPS_PER_EFA_INSTANCE, self.efa_interfaces)
        return MIN_IPS_PER_INSTANCE


def _t(name: str, vcpus: int, mem: int, gpus: int, acc: str, efa: int, price: float) -> InstanceType:  # noqa: PLR0917
    # EBS-only families: general purpose and compute (m5, c5, c5n) and the V100 p3 sizes below 24xlarge.
    ebs_only = name.startswith(("ml.m5.", "ml.c5.", "ml.c5n.", "ml.p3."))
    return InstanceType(name, vcpus, mem, gpus, acc, efa, price, local_storage=not ebs_only)


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        # CPU: data preparation, smoke tests, the local demo's shape.
        _t("ml.m5.xlarge", 4, 16, 0, "", 0, 0.23),
        _t("ml.m5.2xlarge", 8, 32, 0, "", 0, 0.461),
        _t("ml.m5.4xlarge", 16, 64, 0, "", 0, 0.922),
        _t("ml.m5.12xlarge", 48, 192, 0, "", 0, 2.765),
        _t("ml.m5.24xlarge", 96, 384, 0, "", 0, 5.53),
        _t("ml.c5.2xlarge", 8, 16, 0, "", 0, 0.408),
        _t("ml.c5.4xlarge", 16, 32, 0, "", 0, 0.816),
        _t("ml.c5.18xlarge", 72, 144, 0, "", 0, 3.672),
        _t("ml.c5n.18xlarge", 72, 192, 0, "", 1, 4.666),
        # NVIDIA T4 / A10G / L4 / L40S: single-node and small multi-node work.
        _t("ml.g4dn.xlarge", 4, 16, 1, "T4", 0, 0.736),
        _t("ml.g4dn.12xlarge", 48, 192, 4, "T4", 0, 4.89),
        _t("ml.g5.xlarge", 4, 16, 1, "A10G", 0, 1.408),
        _t("ml.g5.2xlarge", 8, 32, 1, "A10G", 0, 1.515),
        _t("ml.g5.12xlarge", 48, 192, 4, "A10G", 0, 7.09),
        _t("ml.g5.24xlarge", 96, 384, 4, "A10G", 0, 10.18),
        _t("ml.g5.48xlarge", 192, 768, 8, "A10G", 1, 20.36),
        _t("ml.g6.xlarge", 4, 16, 1, "L4", 0, 1.1684),
        _t("ml.g6.12xlarge", 48, 192, 4, "L4", 0, 6.6206),
        _t("ml.g6.48xlarge", 192, 768, 8, "L4", 1, 19.0291),
        _t("ml.g6e.xlarge", 4, 32, 1, "L40S", 0, 2.6108),
        _t("ml.g6e.12xlarge", 48, 384, 4, "L40S", 0, 14.5161),
        _t("ml.g6e.48xlarge", 192, 1536, 8, "L40S", 4, 52.3742),
        # V100 / A100 / H100 / H200 / B200: large-scale distributed training.
        _t("ml.p3.2xlarge", 8, 61, 1, "V100", 0, 3.825),
        _t("ml.p3.16xlarge", 64, 488, 8, "V100", 0, 28.152),
        _t("ml.p3dn.24xlarge", 96, 768, 8, "V100", 1, 35.894),
        _t("ml.p4d.24xlarge", 96, 1152, 8, "A100", 4, 37.688),
        _t("ml.p4de.24xlarge", 96, 1152, 8, "A100-80GB", 4, 47.11),
        _t("ml.p5.48xlarge", 192, 2048, 8, "H100", 32, 113.07),
        _t("ml.p5e.48xlarge", 192, 2048, 8, "H200", 32, 124.59),
        _t("ml.p5en.48xlarge", 192, 2048, 8, "H200", 16, 124.59),
        _t("ml.p6-b200.48xlarge", 192, 2048, 8, "B200", 8, 136.63),
        # AWS Trainium.
        _t("ml.trn1.2xlarge", 8, 32, 1, "Trainium", 0, 1.5484),
        _t("ml.trn1.32xlarge", 128, 512, 16, "Trainium", 8, 24.725),
        _t("ml.trn1n.32xlarge", 128, 512, 16, "Trainium", 16, 28.497),
    )
}


# AWS's own accelerators: the training image's CUDA path sees none of them.
NON_CUDA_ACCELERATORS = frozenset({"Trainium"})

# The floor of the launcher's pre-flight: NCCL all-reduce bus bandwidth (busbw, GB/s as nccl-tests
# reports it) across more than one host of a type, over EFA. Each figure is an estimate, a fifth of
# the type's published EFA bandwidth (AWS's instance type pages, reviewed 2026-11: 100 Gbps is
# 12.5 GB/s, 400 Gbps 50 GB/s, 3200 Gbps 400 GB/s): well below what a healthy cluster reaches, well
# above NCCL's TCP sockets on the 400 Gbps and faster types. Checked against AWS's published
# nccl-tests results (aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md,
# "Results", as of 2026-02-21), all_reduce_perf on 2 hosts at 512 MiB, the pre-flight's size:
# p4de.24xlarge 74.3 GB/s (floor 10); p5.48xlarge 393.3 GB/s, and 279.0 GB/s in the same page's
# EKS run with NCCL 2.18.5 (floor 80). The other types have no published figure here: their floors
# follow the same rule. On the 100 Gbps types the floor catches a bad node rather than TCP (the
# pre-flight's log check catches TCP there). Trainium and CPU types run no NCCL and have no floor.
ALLREDUCE_FLOOR_GBPS: dict[str, float] = {
    "ml.g5.48xlarge": 2.5,  # 100 Gbps EFA
    "ml.g6.48xlarge": 2.5,  # 100 Gbps EFA
    "ml.p3dn.24xlarge": 2.5,  # 100 Gbps EFA
    "ml.g6e.48xlarge": 10.0,  # 400 Gbps EFA
    "ml.p4d.24xlarge": 10.0,  # 400 Gbps EFA
    "ml.p4de.24xlarge": 10.0,  # 400 Gbps EFA
    "ml.p5.48xlarge": 80.0,  # 3200 Gbps EFA
    "ml.p5e.48xlarge": 80.0,  # 3200 Gbps EFA
    "ml.p5en.48xlarge": 80.0,  # 3200 Gbps EFA
    "ml.p6-b200.48xlarge": 80.0,  # 3200 Gbps EFA
}


class UnknownInstanceTypeError(ValueError):
    """The instance type is not a SageMaker training type this platform knows."""


def instance_type(name: str) -> InstanceType:
    """Look a type up, or raise with the close matches so the user can fix a typo."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        family = name.rsplit(".", 1)[0]
        near = sorted(n for n in INSTANCE_TYPES if n.startswith(family)) or sorted(INSTANCE_TYPES)[:6]
        raise UnknownInstanceTypeError(
            f"unknown training instance type {name!r}; known types of that family: {', '.join(near)}"
        ) from None
