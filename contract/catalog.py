"""SageMaker training instance types the platform knows, one row each: size, accelerators, EFA, storage, price.

One table serves the settings validation at synth time, the Validate and Estimate-cost
handlers at run time, and the network sizing check, so the three can never disagree; Validate
also hands the launcher's pre-flight check what a host of the type must show (its CUDA GPUs,
the all-reduce bandwidth floor of its row).
Prices are SageMaker on-demand list prices for us-east-1 in USD per instance-hour, as
published when the table was last reviewed (see PRICES_REVIEWED); platforms that pay other
rates override them with the `pipeline.price_overrides` setting.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

PRICES_REVIEWED = "2026-11"

# SageMaker (and the EC2 EFA guide) require this many free private IPs per EFA-enabled instance
# at least; instances with more EFA network cards take one address per card.
MIN_IPS_PER_EFA_INSTANCE = 5
MIN_IPS_PER_INSTANCE = 2


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One `ml.*` training instance type: a row of the table below."""

    name: str
    vcpus: int
    memory_gib: int
    gpus: int
    """Accelerator devices per instance (GPUs, or Trainium devices)."""
    accelerator: str
    """Accelerator model ("" for CPU-only types); keys the trainer's MFU peak table."""
    cuda: bool
    """Whether a host's accelerators are CUDA's (NVIDIA GPUs); Trainium's devices are not."""
    efa_interfaces: int
    """EFA-capable network cards (0: no EFA)."""
    allreduce_floor_gbps: float
    """The least NCCL all-reduce bus bandwidth (GB/s) a healthy multi-node job of this type reaches over EFA;
    0 where there is no floor (see the rule above the table)."""
    local_storage: bool
    """Instance-store NVMe volumes: SageMaker rejects a VolumeKmsKeyId for these types (the NVMe is
    encrypted by the hardware), so their jobs are created without one."""
    price_per_hour: float

    @property
    def supports_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def cuda_gpus(self) -> int:
        """GPUs a host of this type shows CUDA (torch.cuda.device_count())."""
        return self.gpus if self.cuda else 0

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


# The all-reduce floor is the launcher's pre-flight: NCCL all-reduce bus bandwidth (busbw, GB/s as nccl-tests
# reports it) across more than one host of a type, over EFA. Each figure is an estimate, a fifth of the type's
# published EFA bandwidth (AWS's instance type pages, reviewed 2026-11: 100 Gbps is 12.5 GB/s, so 2.5 for
# g5.48xlarge, g6.48xlarge, p3dn.24xlarge; 400 Gbps 50 GB/s, so 10 for g6e.48xlarge, p4d and p4de; 3200 Gbps
# 400 GB/s, so 80 for the p5 family and p6-b200): well below what a healthy cluster reaches, well above NCCL's
# TCP sockets on the 400 Gbps and faster types. Checked against AWS's published nccl-tests results
# (aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md, "Results", as of
# 2026-02-21), all_reduce_perf on 2 hosts at 512 MiB, the pre-flight's size: p4de.24xlarge 74.3 GB/s (floor
# 10); p5.48xlarge 393.3 GB/s, and 279.0 GB/s in the same page's EKS run with NCCL 2.18.5 (floor 80). The other
# types have no published figure here: their floors follow the same rule. On the 100 Gbps types the floor
# catches a bad node rather than TCP (the pre-flight's log check catches TCP there). Trainium and CPU types run
# no NCCL and have no floor.
# Instance storage: the general purpose and compute families (m5, c5, c5n) and the V100 p3 sizes below
# 24xlarge are EBS-only.
# fmt: off
INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        #            name                 vCPUs   GiB GPUs accelerator CUDA  EFA  floor NVMe   $/hour
        # CPU: data preparation, smoke tests, the local demo's shape.
        InstanceType("ml.m5.xlarge",          4,   16,  0, "",          False,  0,  0.0, False, 0.23),
        InstanceType("ml.m5.2xlarge",         8,   32,  0, "",          False,  0,  0.0, False, 0.461),
        InstanceType("ml.m5.4xlarge",        16,   64,  0, "",          False,  0,  0.0, False, 0.922),
        InstanceType("ml.m5.12xlarge",       48,  192,  0, "",          False,  0,  0.0, False, 2.765),
        InstanceType("ml.m5.24xlarge",       96,  384,  0, "",          False,  0,  0.0, False, 5.53),
        InstanceType("ml.c5.2xlarge",         8,   16,  0, "",          False,  0,  0.0, False, 0.408),
        InstanceType("ml.c5.4xlarge",        16,   32,  0, "",          False,  0,  0.0, False, 0.816),
        InstanceType("ml.c5.18xlarge",       72,  144,  0, "",          False,  0,  0.0, False, 3.672),
        InstanceType("ml.c5n.18xlarge",      72,  192,  0, "",          False,  1,  0.0, False, 4.666),
        # NVIDIA T4 / A10G / L4 / L40S: single-node and small multi-node work.
        InstanceType("ml.g4dn.xlarge",        4,   16,  1, "T4",        True,   0,  0.0, True,  0.736),
        InstanceType("ml.g4dn.12xlarge",     48,  192,  4, "T4",        True,   0,  0.0, True,  4.89),
        InstanceType("ml.g5.xlarge",          4,   16,  1, "A10G",      True,   0,  0.0, True,  1.408),
        InstanceType("ml.g5.2xlarge",         8,   32,  1, "A10G",      True,   0,  0.0, True,  1.515),
        InstanceType("ml.g5.12xlarge",       48,  192,  4, "A10G",      True,   0,  0.0, True,  7.09),
        InstanceType("ml.g5.24xlarge",       96,  384,  4, "A10G",      True,   0,  0.0, True,  10.18),
        InstanceType("ml.g5.48xlarge",      192,  768,  8, "A10G",      True,   1,  2.5, True,  20.36),
        InstanceType("ml.g6.xlarge",          4,   16,  1, "L4",        True,   0,  0.0, True,  1.1684),
        InstanceType("ml.g6.12xlarge",       48,  192,  4, "L4",        True,   0,  0.0, True,  6.6206),
        InstanceType("ml.g6.48xlarge",      192,  768,  8, "L4",        True,   1,  2.5, True,  19.0291),
        InstanceType("ml.g6e.xlarge",         4,   32,  1, "L40S",      True,   0,  0.0, True,  2.6108),
        InstanceType("ml.g6e.12xlarge",      48,  384,  4, "L40S",      True,   0,  0.0, True,  14.5161),
        InstanceType("ml.g6e.48xlarge",     192, 1536,  8, "L40S",      True,   4, 10.0, True,  52.3742),
        # V100 / A100 / H100 / H200 / B200: large-scale distributed training.
        InstanceType("ml.p3.2xlarge",         8,   61,  1, "V100",      True,   0,  0.0, False, 3.825),
        InstanceType("ml.p3.16xlarge",       64,  488,  8, "V100",      True,   0,  0.0, False, 28.152),
        InstanceType("ml.p3dn.24xlarge",     96,  768,  8, "V100",      True,   1,  2.5, True,  35.894),
        InstanceType("ml.p4d.24xlarge",      96, 1152,  8, "A100",      True,   4, 10.0, True,  37.688),
        InstanceType("ml.p4de.24xlarge",     96, 1152,  8, "A100-80GB", True,   4, 10.0, True,  47.11),
        InstanceType("ml.p5.48xlarge",      192, 2048,  8, "H100",      True,  32, 80.0, True,  113.07),
        InstanceType("ml.p5e.48xlarge",     192, 2048,  8, "H200",      True,  32, 80.0, True,  124.59),
        InstanceType("ml.p5en.48xlarge",    192, 2048,  8, "H200",      True,  16, 80.0, True,  124.59),
        InstanceType("ml.p6-b200.48xlarge", 192, 2048,  8, "B200",      True,   8, 80.0, True,  136.63),
        # AWS Trainium.
        InstanceType("ml.trn1.2xlarge",       8,   32,  1, "Trainium",  False,  0,  0.0, True,  1.5484),
        InstanceType("ml.trn1.32xlarge",    128,  512, 16, "Trainium",  False,  8,  0.0, True,  24.725),
        InstanceType("ml.trn1n.32xlarge",   128,  512, 16, "Trainium",  False, 16,  0.0, True,  28.497),
    )
}
# fmt: on


class UnknownInstanceTypeError(ValueError):
    """The instance type is not a SageMaker training type this platform knows."""


def instance_type(name: str) -> InstanceType:
    """Look a type up, or raise with the fix (suggestion) so the user can correct a typo."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise UnknownInstanceTypeError(f"unknown training instance type {name!r}; {suggestion(name)}") from None


def suggestion(name: str) -> str:
    """How to fix a name that is not a known type: its `ml.` name, else its near misses, else its family's types."""
    if f"ml.{name}" in INSTANCE_TYPES:
        return f"did you mean 'ml.{name}'? (SageMaker's names start with ml.)"
    # Near misses by edit distance: difflib (stdlib), as contract/config.py suggests hyperparameters.
    if close := difflib.get_close_matches(name, list(INSTANCE_TYPES), n=3, cutoff=0.75):
        return f"did you mean {' or '.join(repr(c) for c in close)}?"
    family = name.rsplit(".", 1)[0]
    near = sorted(n for n in INSTANCE_TYPES if n.startswith(family)) or sorted(INSTANCE_TYPES)[:8]
    return f"e.g. {', '.join(near)} (docs/reference/instance-types.md)"


def instance_type_table() -> str:
    """The instance types reference page's table (docs/reference/instance-types.md), from INSTANCE_TYPES."""
    rows = [
        f"| Type | vCPUs | Memory (GiB) | Accelerators | EFA cards | USD/hour ({PRICES_REVIEWED}, us-east-1) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in INSTANCE_TYPES.values():
        accelerators = f"{t.gpus} x {t.accelerator}" if t.gpus else "-"
        rows.append(
            f"| `{t.name}` | {t.vcpus} | {t.memory_gib} | {accelerators} | {t.efa_interfaces or '-'} | "
            f"{t.price_per_hour} |"
        )
    return "\n".join(rows)
