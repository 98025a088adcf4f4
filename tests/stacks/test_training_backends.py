"""The training step as a plug-in: one backend is used as it is; several are chosen by the request's `backend`."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk.assertions import Template
from constructs import Construct
from moto import mock_aws

from lambdas.backends import BACKENDS, deployed_backends
from stacks.pipeline.training_step import BackendChoice, by_backend
from tests.support.templates import resources


class FakeStep(Construct):
    """A backend whose job succeeds unless the input says `fail`."""

    def __init__(self, scope: Construct, name: str) -> None:
        super().__init__(scope, name)
        self.name, self.bound = name, []
        self.start = sfn.Pass(self, f"{name} runs", result=sfn.Result.from_string(name), result_path="$.ran")
        self.succeeded = sfn.Pass(self, f"{name} succeeded")
        self.failed = sfn.Pass(self, f"{name} failed")
        self.start.next(
            sfn.Choice(self, f"{name} outcome?")
            .when(sfn.Condition.boolean_equals("$.fail", True), self.failed)
            .otherwise(self.succeeded)
        )
        self.queue = sqs.Queue(self, "DeadLetters")

    @property
    def backends(self) -> list[str]:
        return [self.name]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {self.name: self.queue}

    @property
    def functions(self) -> list[Any]:
        return [f"{self.name} monitor", f"{self.name} cleanup"]

    @property
    def goodput_writers(self) -> list[Any]:
        return [f"{self.name} monitor"]

    def bind(self, state_machine: sfn.StateMachine) -> None:
        self.bound.append(state_machine)


def _run(machine: str, name: str, execution_input: dict[str, Any]) -> tuple[str, list[str]]:
    client = boto3.client("stepfunctions", region_name="us-east-1")
    arn = client.start_execution(stateMachineArn=machine, name=name, input=json.dumps(execution_input))["executionArn"]
    for _ in range(100):
        described = client.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            break
        time.sleep(0.05)
    events = client.get_execution_history(executionArn=arn)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]
    return described["status"], entered


def test_one_backend_is_used_as_it_is() -> None:
    stack = Stack(App(), "Test")
    step = FakeStep(stack, "sagemaker")
    assert by_backend(stack, step) is step


def test_two_backends_are_chosen_by_the_request() -> None:
    stack = Stack(App(), "Test")
    sagemaker, batch = FakeStep(stack, "sagemaker"), FakeStep(stack, "batch")
    step = by_backend(stack, sagemaker, batch)
    assert isinstance(step, BackendChoice)
    assert step.backends == ["sagemaker", "batch"]
    assert set(step.dead_letters) == {"sagemaker", "batch"}
    # What the pipeline alarms on and graphs, in the order the steps were made.
    assert step.functions == ["sagemaker monitor", "sagemaker cleanup", "batch monitor", "batch cleanup"]
    assert step.goodput_writers == ["sagemaker monitor", "batch monitor"]
    step.succeeded.next(sfn.Succeed(stack, "Evaluate"))
    step.failed.next(sfn.Fail(stack, "Training failed", error="TrainingFailed"))
    machine = sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(step.start))
    step.bind(machine)
    assert sagemaker.bound == batch.bound == [machine]
    (resource,) = Template.from_stack(stack).find_resources("AWS::StepFunctions::StateMachine").values()
    definition = json.loads(resource["Properties"]["DefinitionString"])

    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):  # type: ignore[arg-type]
        machine_arn = boto3.client("stepfunctions", region_name="us-east-1").create_state_machine(
            name="backends", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]
        assert _run(machine_arn, "batch", {"request": {"backend": "batch"}, "fail": False}) == (
            "SUCCEEDED",
            ["Training backend?", "batch runs", "batch outcome?", "batch succeeded", "Backend succeeded", "Evaluate"],
        )
        status, entered = _run(machine_arn, "sagemaker", {"request": {"backend": "sagemaker"}, "fail": True})
        assert (status, entered[-3:]) == ("FAILED", ["sagemaker failed", "Backend failed", "Training failed"])
        status, entered = _run(machine_arn, "tpu", {"request": {"backend": "tpu"}, "fail": False})
        assert (status, entered) == ("FAILED", ["Training backend?", "No such training backend"])


def test_two_steps_may_not_claim_one_backend() -> None:
    stack = Stack(App(), "Test")
    with pytest.raises(ValueError, match="two training steps claim the same backend"):
        by_backend(stack, FakeStep(stack, "sagemaker"), FakeStep(Construct(stack, "Other"), "sagemaker"))


def test_validate_accepts_the_backends_the_pipeline_runs(platform: Any) -> None:
    (validate,) = [
        props
        for props in (r["Properties"] for r in resources(platform, platform.pipeline, "AWS::Lambda::Function").values())
        if props["Handler"] == "lambdas.validate.handler.handler"
    ]
    assert json.loads(validate["Environment"]["Variables"]["TRAINING_BACKENDS"]) == ["sagemaker", "batch"]


@pytest.mark.parametrize("teams", [False, True], ids=["shipped", "with teams"])
def test_the_pipeline_runs_one_step_per_backend_its_settings_deploy(teams: bool, platform: Any, variant: Any) -> None:
    built = variant if teams else platform
    for name, declared in BACKENDS.items():
        step = built.pipeline.node.try_find_child(declared.step_id)
        if name not in deployed_backends(teams=teams):
            assert step is None and declared.needs_teams, name
            continue
        assert type(step).__module__ + "." + type(step).__name__ == declared.step
        assert step.backends == [name]


@pytest.mark.parametrize("teams", [False, True], ids=["shipped", "with teams"])
def test_the_budget_stop_denies_what_starts_every_deployed_backends_jobs(
    teams: bool, platform: Any, variant: Any
) -> None:
    built = variant if teams else platform
    (deny,) = [
        props
        for logical, props in resources(built, built.pipeline, "AWS::IAM::ManagedPolicy").items()
        if "BudgetStopDeny" in logical
    ]
    (statement,) = [s for s in deny["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "NoNewTrainingJobs"]
    deployed = deployed_backends(teams=teams)
    assert sorted(statement["Action"]) == sorted(a for name in deployed for a in BACKENDS[name].denies)
