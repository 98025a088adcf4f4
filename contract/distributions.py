"""The data-parallel strategies a run may ask for, and what each means to every part of the platform.

Torch-free: Validate (at the request), the launcher (how to start workers), the trainer (how to
wrap the model) and the local demo (what to run instead on a laptop) all read this one table.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Distribution:
    name: str
    summary: str
    launcher: Literal["torchrun", "mpirun"]
    """How the launcher starts the workers on each host."""
    backend: str | None
    """The process group's backend where it is not the default (NCCL on GPUs, gloo on CPU)."""
    shards_parameters: bool
    """FSDP2 on a device mesh (contract/mesh.py): parameters, gradients and optimizer state sharded over
    parallel.dp_shard, replicated over parallel.dp_replicate (HSDP), with tensor and pipeline parallelism. The
    others keep a whole replica on every process: each process is a data-parallel replica."""
    required_module: str | None
    """A module the image must provide, checked before any worker starts; importing it registers `backend`."""
    instance_types: frozenset[str] | None
    """The only instance types it runs on (None: any)."""
    local_stand_in: str
    """What the local demo runs instead, where this machine cannot run it (no SMDDP, no mpirun)."""


# SageMaker's data-parallel library runs on these GPU types only.
_SMDDP_TYPES = frozenset(
    {"ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge"}
)

DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in (
        Distribution("ddp", "torch DDP", "torchrun", None, False, None, None, "ddp"),
        Distribution(
            "fsdp",
            "FSDP2 on a device mesh, with HSDP, tensor and pipeline parallelism",
            "torchrun",
            None,
            True,
            None,
            None,
            "fsdp",
        ),
        Distribution(
            "smddp",
            "DDP over SageMaker's backend",
            "torchrun",
            "smddp",
            False,
            "smdistributed.dataparallel.torch.torch_smddp",
            _SMDDP_TYPES,
            "ddp",
        ),
        Distribution("mpi", "DDP started by mpirun over SSH", "mpirun", None, False, None, None, "ddp"),
    )
}
NAMES = tuple(DISTRIBUTIONS)


def module_available(module: str) -> bool:
    """Whether `module` (dotted) can be imported here, without importing it."""
    import importlib.util  # noqa: PLC0415

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def distribution(name: str) -> Distribution:
    """The strategy named `name`; ValueError naming the choices otherwise."""
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(f"distribution {name!r} is not one of {', '.join(NAMES)}") from None


# mpirun (Open MPI) names a process's place in the job with these; torchrun, torch's env:// rendezvous and the
# user's script read torchrun's names.
MPI_TO_TORCHRUN = {
    "OMPI_COMM_WORLD_RANK": "RANK",
    "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "LOCAL_WORLD_SIZE",
}


def torchrun_variables(environ: MutableMapping[str, str]) -> None:
    """Set torchrun's names in `environ` from mpirun's, where mpirun set them and torchrun's are unset."""
    for mpi, name in MPI_TO_TORCHRUN.items():
        if mpi in environ and name not in environ:
            environ[name] = environ[mpi]


def global_rank(environ: Mapping[str, str]) -> int:
    """This process's rank in the job: torchrun's RANK, else mpirun's; 0 for a process started alone."""
    return int(environ.get("RANK", environ.get("OMPI_COMM_WORLD_RANK", "0")))
