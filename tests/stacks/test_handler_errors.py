"""Every handler classifies its errors, and every task that invokes one retries what passes within a budget."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from lambdas.shared.errors import SERVICE_ERRORS
from stacks.constructs.tasks import (
    BATCH_TRANSIENT,
    GATE_TRANSIENT,
    HANDOVER_TRANSIENT,
    NOTIFY_TRANSIENT,
    POLLING,
    SAGEMAKER_TRANSIENT,
    SHORT,
    TRANSIENT,
    RetryBudget,
)
from tests.support.iam import AssemblyIam, named_states, task_states


@pytest.fixture(scope="module")
def iam(platform: Any) -> AssemblyIam:
    return AssemblyIam(Path(platform.assembly.directory))


def test_every_handler_of_every_stack_classifies_its_errors(iam: AssemblyIam) -> None:
    handlers = {
        props["Handler"]
        for _, _, function in iam.resources("AWS::Lambda::Function")
        if (props := function).get("Handler", "").startswith("lambdas.")
    }
    assert len(handlers) >= 15, handlers
    unclassified = []
    for path in sorted(handlers):
        module, _, name = path.rpartition(".")
        if not getattr(getattr(importlib.import_module(module), name), "classified", False):
            unclassified.append(path)
    assert unclassified == [], "wrap these entry points in lambdas.shared.errors.classified"


def _budget(retry: dict[str, Any]) -> RetryBudget:
    return RetryBudget(
        interval_seconds=retry["IntervalSeconds"],
        backoff_rate=retry["BackoffRate"],
        max_delay_seconds=retry["MaxDelaySeconds"],
        attempts=retry["MaxAttempts"],
    )


def _handler_arns(iam: AssemblyIam) -> set[str]:
    """The ARNs of the platform's handlers (a CDK provider's functions are not)."""
    return {
        iam.arn(stack, logical)
        for stack, logical, function in iam.resources("AWS::Lambda::Function")
        if function.get("Handler", "").startswith("lambdas.")
    }


def _handler_tasks(iam: AssemblyIam) -> list[dict[str, Any]]:
    """The task states that invoke a platform handler and wait for its answer."""
    handlers = _handler_arns(iam)
    machines = [(stack, logical) for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")]
    return [
        state
        for stack, logical in machines
        for state in task_states(iam.definition(stack, logical))
        if state["Resource"] in handlers
    ]


def test_every_handler_task_retries_what_passes_within_its_budget_and_nothing_else(iam: AssemblyIam) -> None:
    tasks = _handler_tasks(iam)
    invoked = {state["Resource"].rsplit(":", 1)[1].rstrip("0123456789ABCDEF") for state in tasks}
    assert {"ValidateFunction", "MonitorFunction", "TuningProgressFunction", "PollBatchJobFunction"} <= invoked
    for state in tasks:
        (retry,) = state["Retry"]
        assert retry["ErrorEquals"] == TRANSIENT, state
        assert retry["JitterStrategy"] == "FULL"
        assert _budget(retry) in (POLLING, SHORT), retry


def test_polling_handlers_ride_through_tens_of_minutes_of_faults_and_the_others_a_few(iam: AssemblyIam) -> None:
    checks = {
        name: _budget(state["Retry"][0])
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        for name, state in iam.definition(stack, logical)["States"].items()
        if name.startswith("Check progress")
    }
    # SageMaker, SageMaker (tuning), Batch: each backend's progress handler.
    assert set(checks) == {"Check progress", "Check progress (tuning)", "Check progress (Batch)"}
    assert set(checks.values()) == {POLLING}
    assert POLLING.expected_seconds() >= 20 * 60 and POLLING.longest_seconds() <= 60 * 60
    assert SHORT.expected_seconds() >= 60 and SHORT.longest_seconds() <= 5 * 60


# What passes, by the integration a task state calls (its Resource after "arn:<partition>:states:::").
PASSES = {
    "lambda:invoke.waitForTaskToken": GATE_TRANSIENT,
    "aws-sdk:sagemaker:": SAGEMAKER_TRANSIENT,
    "aws-sdk:batch:": BATCH_TRANSIENT,
    "sns:publish": NOTIFY_TRANSIENT,
    "states:startExecution": HANDOVER_TRANSIENT,
}


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_every_task_state_retries_what_passes_in_what_it_calls(built: str, request: pytest.FixtureRequest) -> None:
    """A throttle at a gate, a notification or an SDK call never ends a run (a handler's task: the test above);
    a gate's own timeout (the approvers' time) is never retried."""
    iam = AssemblyIam(Path(request.getfixturevalue(built).assembly.directory))
    handlers = _handler_arns(iam)
    checked: dict[str, int] = {}
    missing = []
    for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine"):
        states = named_states(iam.definition(stack, logical))
        if not any(state.get("Resource") in handlers for state in states.values()):
            continue  # not the platform's (a CDK provider's waiter)
        for name, state in states.items():
            if state["Type"] != "Task" or state["Resource"] in handlers:
                continue
            integration = state["Resource"].split(":::", 1)[1]
            (errors,) = [errors for prefix, errors in PASSES.items() if integration.startswith(prefix)] or [None]
            assert errors is not None, f"{name}: what passes in {integration}? (add it to PASSES)"
            checked[integration] = checked.get(integration, 0) + 1
            if integration == "aws-sdk:batch:submitJob":
                # Batch takes no client token: a failed submit is followed by a look for the job it may have made,
                # unless Batch refused it (it made nothing).
                refused, caught = state["Catch"]
                assert refused["ErrorEquals"] == SERVICE_ERRORS["batch"].not_retried(), name
                assert states[refused["Next"]]["Type"] == "Pass", name  # recorded as not created
                assert caught["ErrorEquals"] == ["States.ALL"], name
                assert states[caught["Next"]]["Resource"].endswith(":::aws-sdk:batch:listJobs"), name
                continue
            retried = {error for retry in state.get("Retry", []) for error in retry["ErrorEquals"]}
            if not any(set(errors) <= set(retry["ErrorEquals"]) for retry in state.get("Retry", [])):
                missing.append(f"{name} ({integration}): {state.get('Retry', [])}")
            if integration.endswith(".waitForTaskToken"):
                assert "States.Timeout" not in retried and "States.ALL" not in retried, name
    assert missing == [], "these task states end the run on a passing error:\n" + "\n".join(missing)
    assert checked.get("lambda:invoke.waitForTaskToken") == 2 and checked.get("sns:publish", 0) >= 8, checked
    if built == "variant":  # the teams' queue: its submit takes a client token, and is retried
        assert checked.get("aws-sdk:batch:submitServiceJob") == 1, checked


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_no_task_retries_an_error_that_lasts(built: str, request: pytest.FixtureRequest) -> None:
    """A bad request or a missing resource (Batch's ClientException: a missing quota share) fails the run at once
    with the service's cause, instead of being sent again for minutes."""
    iam = AssemblyIam(Path(request.getfixturevalue(built).assembly.directory))
    lasting = {name for errors in SERVICE_ERRORS.values() for name in errors.not_retried()}
    retried = {
        (name, error)
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        for name, state in named_states(iam.definition(stack, logical)).items()
        for retry in state.get("Retry", [])
        for error in retry["ErrorEquals"]
    }
    assert {(name, error) for name, error in retried if error in lasting} == set()
    assert {error for _, error in retried} >= set(SERVICE_ERRORS["batch"].retried())


def test_the_table_names_errors_as_step_functions_does() -> None:
    batch = SERVICE_ERRORS["batch"]
    assert batch.named("TooManyRequestsException", declared=False) == "Batch.AWSBatchException"
    assert batch.named("ClientException", declared=True) == "Batch.ClientException"
    sagemaker = SERVICE_ERRORS["sagemaker"]
    assert sagemaker.named("ResourceLimitExceeded", declared=True) == "SageMaker.ResourceLimitExceededException"
    assert sagemaker.named("ThrottlingException", declared=False) == "SageMaker.AmazonSageMakerException"
    for errors in SERVICE_ERRORS.values():
        assert not set(errors.passing) & set(errors.lasting), errors
        assert errors.source.startswith("https://docs.aws.amazon.com/"), errors
