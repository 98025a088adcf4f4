"""The training step: what the pipeline needs of a way to train, whichever service runs the job.

A backend is a construct with three chains, a method and its dead-letter queues. The pipeline
enters at `start` with `$.request` (a `TrainingRequest`) and `$.estimate`; the step leaves by
`succeeded` with `$.job` (a `JobProgress` whose `final_metrics` and `model_artifacts` evaluation
and registration read), or by `failed` with `$.failure` (a `Failure`). Every way out has stopped
the run's jobs and pruned its checkpoints. `bind` is called once the state machine exists: the
machine's role gets what the step's states call, and anything that watches the machine's
executions is set up. The pipeline alarms on the handlers the step makes (`functions`) and on
messages in its `dead_letters`, and graphs what its `goodput_writers` log.

`SageMakerTraining` (stacks/pipeline/sagemaker_step.py) is the first backend. The pipeline builds one step per
backend of the registry (lambdas/backends/), each by the `build` of the class its declaration names (`backend_steps`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, cast

from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import REQUEST
from lambdas.backends import BACKENDS
from lambdas.backends.backend import Backend
from stacks.constructs.function import PlatformFunction
from stacks.constructs.queue import TeamQueue
from stacks.constructs.training_image import TrainingImage
from stacks.network_stack import NetworkStack
from stacks.pipeline.adoption import AdoptionCheck
from stacks.pipeline.create_training_job import DistributedTrainingJob
from stacks.pipeline.parts import StepParts
from stacks.settings import PlatformSettings


class TrainingStep(Protocol):
    @property
    def backends(self) -> list[str]:
        """The request's `backend` values this step runs (one name per backend)."""
        ...

    @property
    def start(self) -> sfn.IChainable: ...

    @property
    def succeeded(self) -> sfn.INextable:
        """Ends the step; the pipeline chains evaluation after it."""
        ...

    @property
    def failed(self) -> sfn.INextable:
        """Ends the step; the pipeline chains the failure notification after it."""
        ...

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        """Queues where the step's asynchronous work that failed for good is kept, by name (alarmed on)."""
        ...

    @property
    def functions(self) -> list[PlatformFunction]:
        """The handlers the step made (alarmed on, on the dashboard)."""
        ...

    @property
    def goodput_writers(self) -> list[PlatformFunction]:
        """Its progress handlers, which write and log jobs' goodput ledgers (the dashboard reads their logs)."""
        ...

    def bind(self, state_machine: sfn.StateMachine) -> None: ...


@dataclass(frozen=True)
class TrainingResources:
    """What the pipeline has made that a backend's step may use (`StepClass.build` takes its own)."""

    settings: PlatformSettings
    job: DistributedTrainingJob
    """SageMaker's execution role and CreateTrainingJob request."""
    network: NetworkStack
    image: TrainingImage
    file_system: fsx.LustreFileSystem
    teams: TeamQueue | None
    """The teams' Batch queue and quota shares; None when settings name no teams."""
    adoption: AdoptionCheck
    """What judges a job a create found under its attempt's name, before it is adopted (every backend's)."""


class StepClass(Protocol):
    """How the pipeline makes a backend's step: the class takes what it uses of the parts and resources."""

    def build(self, scope: Construct, id_: str, parts: StepParts, resources: TrainingResources) -> TrainingStep: ...


def step_class(backend: Backend[Any]) -> StepClass:
    """The step class a backend's declaration names (`module.Class`)."""
    module, _, name = backend.step.rpartition(".")
    return cast(StepClass, getattr(importlib.import_module(module), name))


def backend_steps(
    scope: Construct, backends: list[str], parts: StepParts, resources: TrainingResources
) -> dict[str, TrainingStep]:
    """One step per backend the settings deploy, by name; each must run its own backend and no other."""
    steps = {}
    for name in backends:
        backend = BACKENDS[name]
        step = steps[name] = step_class(backend).build(scope, backend.step_id, parts, resources)
        if step.backends != [name]:
            raise ValueError(f"{backend.step} runs {step.backends}, not the {name!r} backend that names it")
    return steps


def by_backend(scope: Construct, *steps: TrainingStep) -> TrainingStep:
    """One step as it is; several behind a Choice on the request's `backend`."""
    return steps[0] if len(steps) == 1 else BackendChoice(scope, "Backends", steps)


class StepChoice(Construct):
    """A Choice between steps (`start`), all of which end where the pipeline goes on."""

    def __init__(
        self, scope: Construct, id_: str, *, steps: tuple[TrainingStep, ...], start: sfn.Choice, outcome: str
    ) -> None:
        super().__init__(scope, id_)
        self._steps, self._start = steps, start
        self._succeeded = sfn.Pass(self, f"{outcome} succeeded")
        self._failed = sfn.Pass(self, f"{outcome} failed")
        for step in steps:
            step.succeeded.next(self._succeeded)
            step.failed.next(self._failed)

    @property
    def backends(self) -> list[str]:
        return list(dict.fromkeys(name for step in self._steps for name in step.backends))

    @property
    def start(self) -> sfn.IChainable:
        return self._start

    @property
    def succeeded(self) -> sfn.INextable:
        return self._succeeded

    @property
    def failed(self) -> sfn.INextable:
        return self._failed

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {name: queue for step in self._steps for name, queue in step.dead_letters.items()}

    @property
    def functions(self) -> list[PlatformFunction]:
        return [function for step in self._steps for function in step.functions]

    @property
    def goodput_writers(self) -> list[PlatformFunction]:
        return [function for step in self._steps for function in step.goodput_writers]

    def bind(self, state_machine: sfn.StateMachine) -> None:
        for step in self._steps:
            step.bind(state_machine)


class BackendChoice(StepChoice):
    """The request's `backend` picks the step."""

    def __init__(self, scope: Construct, id_: str, steps: tuple[TrainingStep, ...]) -> None:
        names = [name for step in steps for name in step.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"two training steps claim the same backend: {names}")
        choice = sfn.Choice(scope, "Training backend?")
        for step in steps:
            condition = sfn.Condition.or_(
                *(sfn.Condition.string_equals(str(REQUEST.backend), n) for n in step.backends)
            )
            choice.when(condition, step.start)
        # Validate accepts only `backends`; this is the answer to a request that did not pass it.
        choice.otherwise(sfn.Fail(scope, "No such training backend", error="InvalidRequest", cause=", ".join(names)))
        super().__init__(scope, id_, steps=steps, start=choice, outcome="Backend")
