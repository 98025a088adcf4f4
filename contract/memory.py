"""What a run's weights, gradients and optimizer states take on each GPU, against what the GPU holds.

A first bound, not a plan: activations, the framework's workspace and fragmentation come on top, so a run
is refused only when these states alone exceed the usable share of the GPU's memory. Per GPU, for P parameters
of which T are trained, on N processes:

    weights (fp32)            4·P     (FSDP: 4·P / N)
    gradients (fp32)          4·T     (FSDP: 4·T / N)
    AdamW's two moments       8·T     (FSDP: 8·T / N)

DDP keeps everything on every GPU; FSDP2 shards all three. Validate refuses with it and `tp estimate` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.catalog import INSTANCE_TYPES, InstanceType
from contract.distributions import DISTRIBUTIONS
from contract.execution_state import TRAIN_ROLE, BaseModelSource, InstanceGroup

GIB = 2**30
USABLE_FRACTION = 0.9
"""The share of a GPU's memory the run's states may take; the rest is left to activations and the CUDA context."""
ACCELERATOR_MEMORY_GIB = {
    "T4": 16,
    "A10G": 24,
    "L4": 24,
    "L40S": 48,
    "V100": 16,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
}
"""Memory per GPU by the catalog's accelerator (NVIDIA's datasheets)."""
TYPE_MEMORY_GIB = {"ml.p3dn.24xlarge": 32}
"""Types whose GPUs have more memory than their accelerator's row says (p3dn's V100s have 32 GB)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of the run's weights, gradients and optimizer states, and the GPU's usable memory."""

    weights: int
    gradients: int
    optimizer: int
    gpu_bytes: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def usable(self) -> int:
        return int(self.gpu_bytes * USABLE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB per GPU (weights {self.weights / GIB:.1f}, gradients "
            f"{self.gradients / GIB:.1f}, optimizer {self.optimizer / GIB:.1f}) of the "
            f"{self.usable / GIB:.1f} GiB usable ({USABLE_FRACTION:.0%} of {self.gpu_bytes / GIB:.0f} GiB)"
        )


def gpu_memory_bytes(instance: InstanceType) -> int | None:
    """Memory of one of the type's CUDA GPUs, or None (no CUDA GPUs, or an accelerator not in the table)."""
    if not instance.cuda_gpus:
        return None
    gib = TYPE_MEMORY_GIB.get(instance.name, ACCELERATOR_MEMORY_GIB.get(instance.accelerator))
    return gib * GIB if gib is not None else None


def training_memory(
    *, parameters: int, trained: int, processes: int, sharded: bool, instance: InstanceType
) -> MemoryEstimate | None:
    """The per-GPU bound for a run on `processes` GPUs of `instance`; None where the type has no known GPU memory."""
    gpu = gpu_memory_bytes(instance)
    if gpu is None:
        return None
    shards = max(processes, 1) if sharded else 1
    return MemoryEstimate(
        weights=-(-4 * parameters // shards),
        gradients=-(-4 * trained // shards),
        optimizer=-(-8 * trained // shards),
        gpu_bytes=gpu,
    )


def fine_tuning_memory(
    base_model: BaseModelSource, groups: list[InstanceGroup], distribution: str, processes: int
) -> MemoryEstimate | None:
    """The bound for a fine-tuning request on its (first) training group's GPUs; None when Validate did not read
    the model folder or the type's GPU memory is unknown."""
    training = [group for group in groups if group.role == TRAIN_ROLE]
    if not training or base_model.parameters is None or base_model.trained_parameters is None:
        return None
    strategy = DISTRIBUTIONS.get(distribution)
    return training_memory(
        parameters=base_model.parameters,
        trained=base_model.trained_parameters,
        processes=processes,
        sharded=strategy is not None and strategy.shards_parameters,
        instance=INSTANCE_TYPES[training[0].instance_type],
    )
