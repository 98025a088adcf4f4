"""The pipeline stack's safety nets: what stops orphaned jobs, and what pages the platform team."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match

from lambdas.approvals.environment import ApprovalsEnvironment, DecideEnvironment, RequestEnvironment
from lambdas.batch.environment import BatchCleanupEnvironment, BatchMonitorEnvironment
from lambdas.estimate.environment import EstimateEnvironment
from lambdas.jobs.environment import CleanupEnvironment, MonitorEnvironment
from lambdas.register.environment import RegisterEnvironment
from lambdas.retrain.environment import RecordEnvironment, SweepEnvironment
from lambdas.shared.env import HandlerEnvironment
from stacks import outputs
from tests.support.templates import get_att, logical_id, resources, template


def test_an_execution_that_ends_badly_stops_its_jobs(platform: Any) -> None:
    stack = platform.pipeline
    t = template(platform, stack)
    machine = logical_id(platform, stack, "AWS::StepFunctions::StateMachine", "TrainingPipeline")
    cleanup = logical_id(platform, stack, "AWS::Lambda::Function", "CleanupFunction")
    # One such rule per training backend; this is SageMaker's, whose target is its Cleanup function.
    (rule,) = [
        r
        for r in resources(platform, stack, "AWS::Events::Rule").values()
        if r["Properties"].get("EventPattern", {}).get("source") == ["aws.states"]
        and r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [cleanup, "Arn"]}
    ]
    assert rule["Properties"]["EventPattern"] == {
        "source": ["aws.states"],
        "detail-type": ["Step Functions Execution Status Change"],
        "detail": {"stateMachineArn": [{"Ref": machine}], "status": ["ABORTED", "TIMED_OUT", "FAILED"]},
    }
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [cleanup, "Arn"]}
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 21600, "MaximumRetryAttempts": 8}
    assert "DeadLetterConfig" in target  # deliveries that keep failing are kept, not lost
    t.has_resource_properties(
        "AWS::Lambda::Permission",
        {"FunctionName": {"Fn::GetAtt": [cleanup, "Arn"]}, "Principal": "events.amazonaws.com"},
    )


def test_failed_aborted_timed_out_and_throttled_executions_alarm(platform: Any) -> None:
    t = template(platform, platform.pipeline)
    for metric in ("ExecutionsFailed", "ExecutionsAborted", "ExecutionsTimedOut", "ExecutionThrottled"):
        t.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {"MetricName": metric, "Namespace": "AWS/States", "Threshold": 1, "AlarmActions": Match.any_value()},
        )


def test_a_cleanup_that_fails_pages_the_platform_team(platform: Any) -> None:
    """Cleanup stops a run's GPU jobs: its errors, and events that failed every retry, raise alarms."""
    stack = platform.pipeline
    t = template(platform, stack)
    cleanup = logical_id(platform, stack, "AWS::Lambda::Function", "CleanupFunction")
    queue = logical_id(platform, stack, "AWS::SQS::Queue", "CleanupDeadLetters")
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "Errors",
            "Namespace": "AWS/Lambda",
            "Dimensions": [{"Name": "FunctionName", "Value": {"Ref": cleanup}}],
            "AlarmActions": Match.any_value(),
        },
    )
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "Namespace": "AWS/SQS",
            "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}],
            "Threshold": 1,
            "AlarmActions": Match.any_value(),
        },
    )


HANDLER_ENVIRONMENTS: dict[str, type[HandlerEnvironment]] = {
    "lambdas.estimate.handler.handler": EstimateEnvironment,
    "lambdas.sagemaker.monitor.handler": MonitorEnvironment,
    "lambdas.sagemaker.cleanup.handler": CleanupEnvironment,
    "lambdas.batch.monitor.handler": BatchMonitorEnvironment,
    "lambdas.batch.cleanup.handler": BatchCleanupEnvironment,
    "lambdas.register.handler.handler": RegisterEnvironment,
    "lambdas.approvals.handler.decide": DecideEnvironment,
    "lambdas.approvals.handler.request": RequestEnvironment,
    "lambdas.approvals.handler.report_pending": ApprovalsEnvironment,
    "lambdas.retrain.handler.record_handler": RecordEnvironment,
    "lambdas.retrain.handler.sweep_handler": SweepEnvironment,
}


def test_every_handler_reads_the_environment_its_stack_gives_it(platform: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    functions = resources(platform, platform.pipeline, "AWS::Lambda::Function")
    handlers = {f["Properties"]["Handler"]: f["Properties"]["Environment"]["Variables"] for f in functions.values()}
    assert set(HANDLER_ENVIRONMENTS) <= set(handlers)
    for handler, model in HANDLER_ENVIRONMENTS.items():
        variables = handlers[handler]
        assert set(variables) - {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_LOG_LEVEL"} == {
            name.upper() for name in model.model_fields
        }, handler
        with monkeypatch.context() as env:
            for name, value in variables.items():
                env.setenv(name, value if isinstance(value, str) else "resolved-at-deploy")  # a Ref, a GetAtt
            model.from_environ()


def test_the_pipeline_outputs_what_a_deployed_stage_is_found_by(platform: Any) -> None:
    pipeline = template(platform, platform.pipeline)
    found = pipeline.find_outputs("*")
    assert sorted(found) == sorted(outputs.OUTPUTS)
    machine = logical_id(platform, platform.pipeline, "AWS::StepFunctions::StateMachine", "")
    assert found[outputs.STATE_MACHINE_ARN]["Value"] == {"Ref": machine}
    pipeline.has_resource_properties("AWS::StepFunctions::StateMachine", {"StateMachineName": "training-platform-dev"})
    url = logical_id(platform, platform.pipeline, "AWS::Lambda::Url", "")
    assert found[outputs.DECISION_URL]["Value"] == get_att(url, "FunctionUrl")
    board = logical_id(platform, platform.pipeline, "AWS::CloudWatch::Dashboard", "")
    dashboard = json.dumps(found[outputs.DASHBOARD_URL]["Value"])
    assert "cloudwatch/home?region=" in dashboard and "#dashboards:name=" in dashboard and board in dashboard
    assert found[outputs.TRAINING_LOG_GROUP]["Value"] == "/aws/sagemaker/TrainingJobs"
    names = [
        json.dumps(b["Properties"]["BucketName"])
        for b in resources(platform, platform.data, "AWS::S3::Bucket").values()
    ]
    for key, purpose in ((outputs.DATASETS_BUCKET, "datasets"), (outputs.ARTIFACTS_BUCKET, "artifacts")):
        value = json.dumps(found[key]["Value"])
        assert f"-{purpose}-" in value and value in names  # the data stack's own bucket, by its name
