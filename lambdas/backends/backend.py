"""What a training backend declares: its name, its limits, its Validate check, whether it tunes, what the budget
stop denies it, and the modules that run it (its pipeline step, its local player).

The registry of backends is lambdas/backends/__init__.py; each backend's declaration is a module beside it. The
step and the local player are named by dotted path, as a Lambda names its handler: the Lambda asset holds
lambdas/ only, and the stacks and the local platform import this registry, not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from lambdas.validate.inputs import ExecutionInput


@dataclass(frozen=True)
class Deployment:
    """What of the platform's settings (stacks/settings.py) a backend's limits are made from."""

    largest_cluster_type: str
    """network.largest_cluster.instance_type"""
    largest_cluster_count: int
    """network.largest_cluster.count"""


class BackendLimits(Protocol):
    """What Validate must know of a backend from the deployed settings; the stack hands it over in Validate's
    environment, which `environment` writes and `from_environment` reads back."""

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> Self: ...

    @classmethod
    def from_environment(cls) -> Self: ...

    def environment(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class NoLimits:
    """A backend that Validate needs to know nothing more of."""

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> NoLimits:
        return cls()

    @classmethod
    def from_environment(cls) -> NoLimits:
        return cls()

    def environment(self) -> dict[str, str]:
        return {}


L = TypeVar("L", bound=BackendLimits)


def no_problems(_request: ExecutionInput, _limits: BackendLimits) -> list[str]:
    return []


@dataclass(frozen=True)
class Backend(Generic[L]):
    """One training backend, as the request's `backend` names it."""

    name: str
    limits: type[L]
    check: Callable[[ExecutionInput, L], list[str]]
    """Why this backend cannot run a request Validate has parsed, one line each (empty when it can)."""
    step: str
    """The pipeline step that runs its jobs (a TrainingStep, stacks/pipeline/training_step.py): `module.Class`."""
    step_id: str
    """The step's construct ID in the pipeline stack (its resources' logical IDs derive from it)."""
    local: str | None
    """The function that makes its local player for the demo (a PlayerFactory, localrun/aws/engine.py):
    `module.function`; None where moto's own API plays it (SageMaker's, played by LocalPlatform `training`)."""
    tuning: bool = False
    """Whether a request on this backend may ask for hyperparameter tuning."""
    capacity_fallback: bool = False
    """Whether its step moves a new attempt onto the request's next `fallback` cluster after insufficient capacity."""
    training_plans: bool = False
    """Whether its jobs run in the stage's training plan (pipeline.training_plan) when on its instance type."""
    needs_teams: bool = False
    """Whether it exists only on a platform with teams (their AWS Batch queue, stacks/constructs/queue.py)."""
    denies: tuple[str, ...] = ()
    """The IAM actions that start its jobs: the budget stop denies them once the monthly budget is spent."""

    def problems(self, request: ExecutionInput, limits: BackendLimits) -> list[str]:
        if not isinstance(limits, self.limits):
            raise TypeError(f"backend {self.name!r} takes {self.limits.__name__}, not {type(limits).__name__}")
        return self.check(request, limits)
