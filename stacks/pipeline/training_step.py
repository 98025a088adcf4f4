"""The training step: what the pipeline needs of a way to train, whichever service runs the job.

A backend is a construct with three chains, a method and its dead-letter queues. The pipeline
enters at `start` with `$.request` (a `TrainingRequest`) and `$.estimate`; the step leaves by
`succeeded` with `$.job` (a `JobProgress` whose `final_metrics` and `model_artifacts` evaluation
and registration read), or by `failed` with `$.failure` (a `Failure`). Every way out has stopped
the run's jobs and pruned its checkpoints. `bind` is called once the state machine exists: the
machine's role gets what the step's states call, and anything that watches the machine's
executions is set up. The pipeline alarms on the handlers the step makes (through the context)
and on messages in its `dead_letters`.

`SageMakerTraining` (stacks/pipeline/sagemaker_step.py) is the first backend. The pipeline builds one step per
backend of the registry (lambdas/backends/), each from the class its declaration names (`backend_steps`).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, cast

from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import REQUEST
from lambdas.backends import BACKENDS, deployed_backends
from lambdas.backends.backend import Backend
from stacks.pipeline.context import PipelineContext


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

    def bind(self, state_machine: sfn.StateMachine) -> None: ...


class StepClass(Protocol):
    """How the pipeline makes a backend's step."""

    def __call__(self, scope: Construct, id_: str, *, context: PipelineContext) -> TrainingStep: ...


def step_class(backend: Backend[Any]) -> StepClass:
    """The step class a backend's declaration names (`module.Class`)."""
    module, _, name = backend.step.rpartition(".")
    return cast(StepClass, getattr(importlib.import_module(module), name))


def backend_steps(scope: Construct, *, context: PipelineContext) -> dict[str, TrainingStep]:
    """One step per registered backend the settings deploy, by name; each must run its own backend and no other."""
    steps = {}
    for name in deployed_backends(teams=context.teams is not None):
        backend = BACKENDS[name]
        step = steps[name] = step_class(backend)(scope, backend.step_id, context=context)
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
