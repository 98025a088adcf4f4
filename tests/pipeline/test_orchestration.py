"""No orphaned clusters and no run too long for its execution: every way out stops the job."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto.sagemaker.exceptions import SagemakerClientError
from moto.stepfunctions.parser.models import stepfunctions_parser_backends
from moto.stepfunctions.parser.utils import TMP_THREADS

from lambdas.shared import history
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.clock import Clock
from localrun.backends.scripted import Poll
from stacks.settings import PipelineSettings
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.stored import put_checkpoint

FOREVER = [Poll()]  # a job that trains until something stops it


def _failure_messages(pipeline: Pipeline) -> list[dict[str, Any]]:
    return [
        json.loads(m["Message"]) for m in pipeline.local.messages("TopicsRuns") if m["Subject"] == "Training run failed"
    ]


def test_a_throttled_handler_is_retried_with_backoff(pipeline: Pipeline) -> None:
    pipeline.local.faults.throttle["Monitor"] = 2  # reserved concurrency exhausted, twice
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert pipeline.training.stopped_names == []
    assert len(pipeline.local.clock.retries) == 2


def test_a_handler_that_keeps_failing_stops_the_job_and_records_why(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[FOREVER])
    pipeline.local.faults.throttle["Monitor"] = 1000
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described) == ("Lambda.TooManyRequestsException", "Rate exceeded")
    (job,) = pipeline.jobs()
    assert pipeline.training.stopped_names == [job]
    (message,) = _failure_messages(pipeline)
    assert message["error"] == "Lambda.TooManyRequestsException" and message["cleanup"]["stopped"] == [job]
    # A failed run's history, its retries and catches too, is read from moto's engine as the API answers it.
    history = pipeline.local.history(arn)
    assert history == pipeline.local.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    assert {e["type"] for e in history} >= {"LambdaFunctionFailed", "ExecutionFailed"}


def test_a_notification_that_cannot_be_sent_stops_the_job(pipeline_factory: Any) -> None:
    def started_long_ago(_name: str, _request: dict[str, Any], job: Any) -> None:
        job.training_start_time = datetime.now(UTC) - timedelta(hours=3)  # stale: no checkpoint for 3 h

    pipeline = pipeline_factory(scripts=[FOREVER])
    pipeline.training.on_create.append(started_long_ago)
    pipeline.local.faults.sns_failures = 1000  # the topic's key is throttled for good
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert described["status"] == "FAILED"
    assert "Warn stale checkpoints" in pipeline.local.states_entered(arn)
    assert "KMSThrottling" in described["cause"]
    assert pipeline.training.stopped_names == pipeline.jobs()


def test_stopping_the_execution_stops_its_job(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[FOREVER], clock=Clock(wait_scale=0.001))
    arn = pipeline.start(pipeline.input())
    pipeline.local.wait(arn, 30, until=lambda: "Check progress" in pipeline.local.states_entered(arn))
    (job,) = pipeline.jobs()
    pipeline.local.sfn.stop_execution(executionArn=arn, error="Cancelled", cause="an engineer stopped the run")
    # EventBridge delivers the status change to the rule's target (the cleanup handler), asynchronously.
    pipeline.local.wait(arn, 30, until=lambda: bool(pipeline.local.events.deliveries))
    pipeline.local.events.drain()
    # The AWS Batch backend's cleanup has a rule of its own; this is SageMaker's.
    (delivery,) = [d for d in pipeline.local.events.deliveries if d["function"].startswith("Cleanup")]
    assert delivery["event"]["detail"]["status"] == "ABORTED" and delivery["permitted"]
    assert delivery["result"]["stopped"] == [job]
    status = boto3.client("sagemaker", region_name="us-east-1").describe_training_job(TrainingJobName=job)
    assert status["TrainingJobStatus"] == "Stopped"


def test_the_state_machine_runs_under_the_name_its_template_gives(
    pipeline: Pipeline, deployed_definition: dict[str, Any]
) -> None:
    """The rules' event patterns and the policies name the machine by its StateMachineName, as they do in AWS; its
    definition is the one the tests that only read it share."""
    machine = pipeline.local.state_machine
    name = pipeline.local.resolver.resolve(machine.stack, machine.resource["Properties"]["StateMachineName"])
    assert pipeline.local.state_machine_arn.endswith(f":stateMachine:{name}")
    deployed = pipeline.local.sfn.describe_state_machine(stateMachineArn=pipeline.local.state_machine_arn)
    assert json.loads(deployed["definition"]) == deployed_definition


def test_a_create_that_succeeded_unanswered_is_adopted_not_repeated(pipeline: Pipeline) -> None:
    calls = {"n": 0}

    def answer_lost(_name: str, _request: dict[str, Any], _job: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:  # the job exists, but the answer never reaches the state machine
            raise SagemakerClientError("ThrottlingException", "Rate exceeded")

    pipeline.training.on_create.append(answer_lost)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert "Adopt the created job" in pipeline.local.states_entered(arn)
    assert len(pipeline.jobs()) == 1 and calls["n"] == 1  # the retry found the job; no second cluster


def test_a_run_keeps_only_its_newest_complete_checkpoint(pipeline: Pipeline) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]

    def checkpointed(name: str, _request: dict[str, Any], _job: Any) -> None:
        prefix = f"runs/{name.rsplit('-', 1)[0]}/checkpoints/"
        for step in (10, 20):
            put_checkpoint(s3, bucket, prefix, step)
        s3.put_object(Bucket=bucket, Key=f"{prefix}step-5/__0_0.distcp", Body=b"x")  # an older, interrupted save
        s3.put_object(Bucket=bucket, Key=f"{prefix}step-30/__0_0.distcp", Body=b"x")  # never completed

    pipeline.training.on_create.append(checkpointed)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    (job,) = pipeline.jobs()
    prefix = f"runs/{job.rsplit('-', 1)[0]}/checkpoints/"
    keys = [o["Key"].removeprefix(prefix) for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    # What the newest complete checkpoint supersedes goes; a newer partial one is left (nothing supersedes it).
    assert sorted(keys) == [
        "step-20/.metadata",
        "step-20/__0_0.distcp",
        "step-20/manifest.json",
        "step-30/__0_0.distcp",
    ]
    # Versioning keeps what was pruned for storage.noncurrent_version_days.
    versions = s3.list_object_versions(Bucket=bucket, Prefix=f"{prefix}step-10/")
    assert len(versions["DeleteMarkers"]) == 3 and len(versions["Versions"]) == 3


def test_an_approval_that_times_out_tells_the_requester(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(clock=Clock(approval_timeout_scale=3 / 86400))
    arn = pipeline.start(pipeline.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10))
    assert pipeline.error(pipeline.finish(arn, timeout=20))[0] == "ApprovalTimedOut"
    (told,) = [m for m in pipeline.local.messages("TopicsRuns") if "no approver decided" in m["Subject"]]
    assert json.loads(told["MessageAttributes"]["recipients"]["Value"]) == ["alice@example.org"]


def _events(pipeline: Pipeline, arn: str) -> int:
    return len(pipeline.local.history(arn))


def test_each_poll_adds_the_events_the_history_budget_assumes(pipeline_factory: Any) -> None:
    """Measured, not assumed: the events of one poll round, and of everything else in a run."""
    polls = 3
    # Two runs with both gates; the second job is polled `polls` times more than the first.
    pipeline = pipeline_factory(scripts=[[Poll(), COMPLETED], [Poll()] * (1 + polls) + [COMPLETED]])
    counts = []
    for name in ("short", "long"):
        arn = pipeline.start(
            pipeline.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10), name=name
        )
        pipeline.run_until(arn, "Approval gate (pre-launch)")
        pipeline.decide("launch", "approve")
        pipeline.run_until(arn, "Approval gate (promotion)")
        pipeline.decide("promotion", "approve")
        assert pipeline.finish(arn)["status"] == "SUCCEEDED"
        counts.append(_events(pipeline, arn))
    assert (counts[1] - counts[0]) / polls == history.EVENTS_PER_POLL
    two_polls = counts[0] - 2 * history.EVENTS_PER_POLL  # both gates, one attempt
    # Next attempt (Pass), Fall back to another cluster? (Choice), Choose the next cluster (Lambda task), its
    # request and price put in place (2 Pass), the run told why (SNS task), Reset progress (Pass), Volume
    # encryption? (Choice), create
    retry = 2 + 2 + 5 + 2 * 2 + 5 + 2 + 2 + 5
    assert two_polls + PipelineSettings().capacity_retries * retry <= history.RUN_EVENTS


def test_an_executions_budget_of_polls_fits_its_history() -> None:
    """However long a run, one execution makes at most `polls_per_execution` polls (then hands the run over), so the
    longest run the settings allow is polled at the platform's interval."""
    settings = PipelineSettings()
    events = history.RUN_EVENTS + settings.polls_per_execution * history.EVENTS_PER_POLL
    assert events <= 0.8 * history.HISTORY_LIMIT
    with pytest.raises(ValueError, match="polls_per_execution"):
        PipelineSettings(polls_per_execution=history.poll_budget() + 1)


def test_a_run_stopped_while_its_gate_asks_for_approval_ends_there_without_a_runtime_error(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    # A platform that closes stops its runs; one may be in its gate's request (the task that then waits for a token).
    local = pipeline.local
    asking, stopped = threading.Event(), threading.Event()
    run_handler, request = local._run_handler, local.functions.named("ApprovalRequest").name

    def held_at_the_request(function_name: str, event: Any) -> Any:
        if function_name == request:
            asking.set()
            stopped.wait(60)
        return run_handler(function_name, event)

    local._run_handler = held_at_the_request  # type: ignore[method-assign]
    arn = pipeline.start(pipeline.input())
    local.wait(arn, 120, until=asking.is_set)
    local.sfn.stop_execution(executionArn=arn, error="PlatformClosed", cause="local platform closed")
    stopped.set()
    # The execution's thread ends once the state's work after the request has: then nothing more happens to it.
    worker = stepfunctions_parser_backends[ACCOUNT][REGION].describe_execution(arn).exec_worker
    (thread,) = [t for t in TMP_THREADS if getattr(t, "_target", None) == worker._execution_logic]
    thread.join(60)
    assert not thread.is_alive()
    assert local.sfn.describe_execution(executionArn=arn)["status"] == "ABORTED"
    types = [e["type"] for e in local.history(arn)]
    assert types[-1] == "ExecutionAborted", types[-4:]
    assert not [r.getMessage() for r in caplog.records if "States.Runtime" in r.getMessage()]


def test_a_wait_answers_with_the_execution_as_it_was_when_what_it_awaited_held(pipeline: Pipeline) -> None:
    """What a wait returns is described after `until()` held, never before: a test that awaits an execution's end (or
    its hand-over) reads the ended execution, not the running one it looked at first."""
    local = pipeline.local
    arn = pipeline.start(pipeline.input(instance_count=0))  # Validate refuses it: the run ends at once

    def ended() -> bool:
        deadline = time.monotonic() + 60
        while local.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    assert local.wait(arn, 60, until=ended)["status"] == "FAILED"
