"""The adoption check as the stacks make it: one handler (lambdas/jobs/adoption.py) and the states that ask it.

A create step that finds a job under its attempt's name (a create whose answer was lost, then retried) asks the
handler whether that job is the one the platform asked for, and adopts it only then. The handler builds the request
the step would have sent from the same definition (contract/service_requests.py), with the constants each backend
writes into its environment (`AdoptionEnvironment`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ERROR, REQUEST, RUN, TRAIN, JobKind
from contract.service_requests import BatchJobConstants, ServiceJobConstants
from lambdas.jobs.environment import AdoptionEnvironment
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import invoke
from stacks.pipeline.create_training_job import DistributedTrainingJob
from stacks.pipeline.parts import Handlers, obj, stack_arn, string

# What a create records when a job of its name exists and is not the one the platform asked for.
JOB_NAME_CONFLICT = "JobNameConflict"

FOUND = {
    "arns.$": "$.JobSummaryList[*].JobArn",
    "names.$": "$.JobSummaryList[*].JobName",
    "ids.$": "$.JobSummaryList[*].JobId",
}
"""A listing's jobs (Batch's ListJobs, ListServiceJobs) as `FoundJobs`: lists of fields, read with
States.ArrayGetItem (a path through an index, $.JobSummaryList[0].JobArn, is a string in AWS's engine and a list in
the local one)."""


class AdoptionCheck:
    """The adoption check's handler, with SageMaker's constants (`job`) and what describing its training and tuning
    jobs takes; a backend that adopts jobs of its own service adds its constants and grants (`add_batch`,
    `add_queue`)."""

    def __init__(self, scope: Construct, handlers: Handlers, job: DistributedTrainingJob) -> None:
        self._stack = Stack.of(scope)
        self.handler = handlers.function(
            "AdoptionCheck",
            "lambdas.jobs.adoption.handler",
            "Judges a job found under a run's attempt name against the request the platform would have sent",
            AdoptionEnvironment(training_jobs={}, batch_jobs={}, service_jobs={}).variables(),
        )
        self._add_constants("training_jobs", job.constants)
        jobs = [stack_arn(scope, "sagemaker", f"{kind}/*") for kind in ("training-job", "hyper-parameter-tuning-job")]
        self.handler.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="DescribeExistingJobs",
                actions=[
                    "sagemaker:DescribeTrainingJob",
                    "sagemaker:DescribeHyperParameterTuningJob",
                    "sagemaker:ListTags",
                ],
                resources=jobs,
            )
        )
        for resource in jobs:
            acknowledge_wildcard(
                self.handler.role,
                resource,
                "Describes the job a create found under its attempt's name; names are per run.",
            )

    def _add_constants(self, field: str, constants: Any) -> None:
        value = self._stack.to_json_string(dataclasses.asdict(constants))
        self.handler.function.add_environment(AdoptionEnvironment.variable(field), value)

    def add_batch(self, constants: BatchJobConstants) -> None:
        """AWS Batch's constants, and describing a job and its job definition (the reference lets neither name a
        resource)."""
        self._add_constants("batch_jobs", constants)
        self.handler.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="DescribeExistingBatchJobs",
                actions=["batch:DescribeJobs", "batch:DescribeJobDefinitions"],
                resources=["*"],
            )
        )

    def add_queue(self, constants: ServiceJobConstants, grant_describe: Any) -> None:
        """The teams' queue's constants; `grant_describe(role)` lets the handler describe a service job."""
        self._add_constants("service_jobs", constants)
        grant_describe(self.handler.role)

    def states(
        self,
        scope: Construct,
        label: str,
        *,
        kind: JobKind,
        job: str,
        adopt: sfn.IChainable,
        not_created: sfn.IChainable,
    ) -> sfn.IChainable:
        """After a create found a job under its attempt's name (`job`: a JSONPath or intrinsic giving its name, or
        its ID on AWS Batch): adopt it only when the check finds it the one asked for; any other job fails the
        create, with the differences as the cause."""
        verify = invoke(
            scope,
            f"Is the existing {label} the one asked for?",
            self.handler,
            {
                "request": obj(REQUEST),
                "execution": string(RUN.execution),
                "attempt": sfn.JsonPath.number_at(str(TRAIN.attempt)),
                "kind": kind,
                "job": sfn.JsonPath.string_at(job),
            },
            str(TRAIN.adoption),
        )
        verify.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
        conflict = sfn.Pass(
            scope,
            f"Existing {label} is not the one asked for",
            comment="Never follow or adopt a job the platform did not ask for: the run fails, naming what differs",
            parameters={"Error": JOB_NAME_CONFLICT, "Cause": string(TRAIN.adoption.cause)},
            result_path=str(ERROR),
        ).next(not_created)
        choice = (
            sfn.Choice(scope, f"Adopt the existing {label}?")
            .when(sfn.Condition.boolean_equals(str(TRAIN.adoption.adopt), True), adopt)
            .otherwise(conflict)
        )
        return sfn.Chain.start(verify).next(choice)

    def found_states(
        self,
        scope: Construct,
        label: str,
        *,
        kind: JobKind,
        fields: tuple[str, ...],
        wait: sfn.IChainable,
        not_created: sfn.IChainable,
    ) -> sfn.IChainable:
        """`states` for the first job a listing found (`$.train.found`, by `FOUND`), which on adoption becomes the
        attempt's job with `fields` of `CreatedJob`, followed from `wait`."""
        found = {"arn": TRAIN.found.arns, "job_name": TRAIN.found.names, "job_id": TRAIN.found.ids}
        adopt = sfn.Pass(
            scope,
            f"Adopt the submitted {label}",
            comment="The submit happened though its answer was lost, as it asked for it: follow that job, do not "
            "start another",
            parameters={
                name: sfn.JsonPath.array_get_item(sfn.JsonPath.list_at(str(found[name])), 0) for name in fields
            },
            result_path=str(TRAIN.job),
        ).next(wait)
        job = f"States.ArrayGetItem({TRAIN.found.ids}, 0)"
        return self.states(scope, label, kind=kind, job=job, adopt=adopt, not_created=not_created)
