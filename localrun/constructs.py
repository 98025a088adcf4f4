"""The assembly's resources found by construct path: the state machine a local run deploys.

Logical IDs change whenever a construct moves; construct paths, from each stack's metadata, say
what a resource is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localrun.cfn import Assembly

# The pipeline stack's state machine, as stacks/pipeline_stack.py names its construct.
PIPELINE_STATE_MACHINE = "TrainingPipeline"


@dataclass(frozen=True)
class StateMachine:
    stack: str
    logical: str
    path: str  # construct path, e.g. "training-platform-dev-pipeline/TrainingPipeline"
    resource: dict[str, Any]


def _construct(metadata_path: str) -> str:
    """The construct path of a CloudFormation resource's L2 construct: no leading '/', no '/Resource'."""
    return metadata_path.strip("/").removesuffix("/Resource")


def state_machine(assembly: Assembly, path: str | None = None) -> StateMachine:
    """The state machine at construct `path`; by default `<pipeline stack>/TrainingPipeline`."""
    if path is None:
        path = f"{assembly.stack_named('-pipeline')}/{PIPELINE_STATE_MACHINE}"
    machines: dict[str, StateMachine] = {}
    for stack, logical, resource in assembly.resources("AWS::StepFunctions::StateMachine"):
        metadata_path = assembly.construct_paths.get(stack, {}).get(logical)
        construct = _construct(metadata_path) if metadata_path else f"{stack} (logical ID {logical}, no construct path)"
        machines[construct] = StateMachine(stack=stack, logical=logical, path=construct, resource=resource)
    wanted = _construct(path)
    if wanted not in machines:
        raise KeyError(f"no state machine at construct path {wanted!r}; the assembly has {sorted(machines)}")
    return machines[wanted]
