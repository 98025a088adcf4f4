"""The training step: what the pipeline needs of a way to train, whichever service runs the job.

A backend is a construct with three chains, a method and its dead-letter queues. The pipeline
enters at `start` with `$.request` (a `TrainingRequest`) and `$.estimate`; the step leaves by
`succeeded` with `$.job` (a `JobProgress` whose `final_metrics` and `model_artifacts` evaluation
and registration read), or by `failed` with `$.failure` (a `Failure`). Every way out has stopped
the run's jobs and pruned its checkpoints. `bind` is called once the state machine exists: the
machine's role gets what the step's states call, and anything that watches the machine's
executions is set up. The pipeline alarms on the handlers the step makes (through the context)
and on messages in its `dead_letters`.

`SageMakerTraining` (stacks/pipeline/sagemaker_training.py) is the first backend.
"""

from __future__ import annotations

from typing import Protocol

from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn


class TrainingStep(Protocol):
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
