"""The assembly's resources found by construct path: the state machine a local run deploys, the functions it names.

Logical IDs change whenever a construct moves (`Monitor/Function` becoming
`TrainingStep/Monitor/Function`); construct paths, from each stack's metadata, say what a resource
is. A function is named by the end of its construct path: the segments before `/Function/Resource`
joined without separators ("ApprovalDecide" is `Approval/Decide`; "Monitor" is `Monitor` or
`TrainingStep/Monitor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localrun.aws.cfn import Assembly, Resolver

# The pipeline stack's state machine, as stacks/pipeline_stack.py names its construct.
PIPELINE_STATE_MACHINE = "TrainingPipeline"
_FUNCTION = "/Function/Resource"


@dataclass(frozen=True)
class StateMachine:
    stack: str
    logical: str
    path: str  # construct path, e.g. "<stack>/TrainingPipeline"
    resource: dict[str, Any]

    def definition(self, resolver: Resolver) -> str:
        """Its definition as deployed: the DefinitionString with its references resolved as CloudFormation would."""
        return str(resolver.resolve(self.stack, self.resource["Properties"]["DefinitionString"]))


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


@dataclass(frozen=True)
class Function:
    """A Lambda function of the assembly."""

    name: str  # physical name: what Lambda, the state machine and EventBridge targets call it
    stack: str
    logical: str
    path: str  # as the stack's metadata writes it; "" where it has none
    resource: dict[str, Any]

    @property
    def key(self) -> str | None:
        """What names it: its construct path's segments between the stack and /Function/Resource, joined."""
        if not self.path.endswith(_FUNCTION):
            return None  # not a platform function (e.g. a CDK provider's handler)
        return "".join(self.path.removesuffix(_FUNCTION).strip("/").split("/")[1:])


class Functions:
    """Every Lambda function of the assembly, by physical name and by the end of its construct path."""

    def __init__(self, assembly: Assembly, resolver: Resolver) -> None:
        self._resolver = resolver
        self._by_name: dict[str, Function] = {}
        for stack, logical, resource in assembly.resources("AWS::Lambda::Function"):
            name = str(resolver.ref(stack, logical))
            path = assembly.construct_paths.get(stack, {}).get(logical, "")
            self._by_name[name] = Function(name=name, stack=stack, logical=logical, path=path, resource=resource)

    def __getitem__(self, physical_name: str) -> Function:
        return self._by_name[physical_name]

    def named(self, name: str) -> Function:
        """The one function whose construct path (before /Function/Resource, joined) ends with `name`."""
        named = [f for f in self._by_name.values() if f.key is not None]
        matches = [f for f in named if f.key is not None and f.key.endswith(name)]
        if not matches:
            raise KeyError(
                f"no function's construct path (before {_FUNCTION}, joined) ends with {name!r}; "
                f"the functions are {sorted(f.path for f in named)}"
            )
        if len(matches) > 1:
            raise KeyError(f"{name!r} names more than one function: {sorted(f.path for f in matches)}")
        return matches[0]

    def environment(self, function: Function) -> dict[str, str]:
        """The function's environment variables, resolved as a deploy would."""
        variables = function.resource["Properties"].get("Environment", {}).get("Variables", {})
        return {k: str(v) for k, v in self._resolver.resolve(function.stack, variables).items()}
