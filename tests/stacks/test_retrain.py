"""Retraining on new data: its settings, checked at synth, and what it deploys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from localrun.aws.cfn import ACCOUNT, REGION
from stacks.settings import SettingsError, build_settings
from tests.conftest import RETRAIN_TRIGGER, cdk_context, platform_context
from tests.support.iam import AssemblyIam, Role
from tests.support.templates import resources, template

BASE = cdk_context()["platform"]


def _settings(*triggers: dict[str, Any], **platform: Any) -> Any:
    return build_settings({**BASE, **platform, "retrain": list(triggers)})


def test_no_triggers_by_default_and_none_deployed() -> None:
    assert build_settings(BASE).retrain == []
    assert "retrain" not in json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())["context"]


def test_the_readme_trigger_is_valid() -> None:
    (trigger,) = _settings(RETRAIN_TRIGGER).retrain
    assert trigger.template()["dataset"] == "fsx:///datasets/incoming/web-text/"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prefix": "/incoming/web-text/"}, r"retrain\.0\.prefix = '/incoming/web-text/': must be a folder"),
        ({"prefix": "incoming/../web-text/"}, "in its normal form.*has a '..' segment"),
        ({"prefix": "incoming/web-text"}, "ending in '/'"),
        ({"name": "Web Text"}, r"retrain\.0\.name = 'Web Text': must be 3-40 lowercase"),
        ({"quiet_minutes": 1}, r"retrain\.0\.quiet_minutes = 1: Input should be greater than or equal to 5"),
        ({"input": "examples/missing.json"}, "cannot read the template file 'examples/missing.json'"),
        ({"input": "README.md"}, "the template file 'README.md' is not JSON"),
        ({"prefix": "incoming/other/"}, r"dataset 'fsx:///datasets/incoming/web-text/' is not the new data's location"),
        ({"input": {"requester_proof": "x"}}, "drop `requester_proof`; the trigger proves who starts the run"),
        ({"input": {"dataset": 7}}, "dataset 7 is not the new data's location"),
    ],
)
def test_a_bad_trigger_stops_synth_naming_what_to_fix(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _settings({**RETRAIN_TRIGGER, **change})


def test_a_template_validate_would_reject_stops_synth_with_validates_own_words() -> None:
    bad = {
        **RETRAIN_TRIGGER,
        "input": {"run_name": "Nightly", "instance_type": "ml.p4d.24xlarge", "max_runtime_hours": 500},
    }
    with pytest.raises(SettingsError) as raised:
        _settings(bad)
    text = str(raised.value)
    assert "retrain trigger 'web-text': its input template (inline) would be rejected when new data arrives" in text
    assert "run_name 'Nightly': use 3-40 lowercase letters" in text
    assert "max_runtime_hours 500.0 exceeds the platform limit of 120.0" in text
    # Judged by this platform's settings: an instance type it does not allow is refused too.
    with pytest.raises(SettingsError, match=r"instance_type 'ml\.p4d\.24xlarge' is not allowed on this platform"):
        _settings(RETRAIN_TRIGGER, pipeline={"allowed_instance_types": ["ml.g5.2xlarge"]})


def test_trigger_names_are_unique_and_the_templates_fit_lambdas_environment() -> None:
    with pytest.raises(SettingsError, match="trigger names must be unique"):
        _settings(RETRAIN_TRIGGER, {**RETRAIN_TRIGGER, "prefix": "incoming/web-text/2026/", "input": _inline()})
    many = [
        {"name": f"t{i:02d}", "prefix": f"incoming/t{i:02d}/", "input": _inline(f"incoming/t{i:02d}/")}
        for i in range(20)
    ]
    with pytest.raises(SettingsError, match=r"take \d+ bytes, more than the 3072 a Lambda environment leaves"):
        _settings(*many)


def _inline(prefix: str = "incoming/web-text/2026/") -> dict[str, Any]:
    template = json.loads((Path(__file__).resolve().parents[2] / RETRAIN_TRIGGER["input"]).read_text())
    return {**template, "dataset": f"fsx:///datasets/{prefix}"}


def test_a_backend_the_pipeline_does_not_deploy_stops_synth(tmp_path: Path) -> None:
    from stacks.app_builder import build_platform

    context = platform_context()
    context["platform"]["retrain"] = [
        {**RETRAIN_TRIGGER, "input": {**_inline("incoming/web-text/"), "backend": "slurm"}}
    ]
    with pytest.raises(SettingsError, match="backend 'slurm': this platform deploys sagemaker, batch"):
        build_platform(context, outdir=str(tmp_path))


def test_the_datasets_bucket_sends_its_events_to_eventbridge(platform: Any) -> None:
    buckets = resources(platform, platform.data, "AWS::S3::Bucket")
    enabled = {k for k, b in buckets.items() if "NotificationConfiguration" in b["Properties"]}
    assert enabled == {"BucketsDatasets939DDD85"}  # the pinned, retained bucket: updated in place
    assert buckets["BucketsDatasets939DDD85"]["Properties"]["NotificationConfiguration"] == {
        "EventBridgeConfiguration": {"EventBridgeEnabled": True}
    }
    # Set on the bucket itself: no notifications custom resource (and its Lambda) in the data stack.
    assert resources(platform, platform.data, "Custom::S3BucketNotifications") == {}
    assert resources(platform, platform.data, "AWS::Lambda::Function") == {}


def test_the_rule_matches_object_created_under_the_registered_prefixes_only(platform: Any) -> None:
    t = template(platform, platform.pipeline)
    t.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.s3"],
                "detail-type": ["Object Created"],
                "detail": {
                    "bucket": {"name": [Match.any_value()]},
                    "object": {"key": [{"prefix": "incoming/web-text/"}]},
                },
            },
            "Targets": [
                Match.object_like(
                    {
                        "RetryPolicy": {"MaximumRetryAttempts": 8, "MaximumEventAgeInSeconds": 86400},
                        "DeadLetterConfig": Match.any_value(),
                    }
                )
            ],
        },
    )
    t.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(5 minutes)"})


@pytest.fixture(scope="module")
def iam(platform: Any) -> AssemblyIam:
    return AssemblyIam(Path(platform.assembly.directory))


def _role(iam: AssemblyIam, prefix: str) -> Role:
    (role,) = [r for r in iam.roles.values() if r.logical.startswith(prefix)]
    return role


def _arns(iam: AssemblyIam) -> tuple[str, str, str]:
    (machine,) = [
        str(iam.resolver.ref(stack, logical))
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        if stack.endswith("-pipeline")
    ]
    (table,) = [iam.arn(s, lg) for s, lg, _ in iam.resources("AWS::DynamoDB::Table") if lg.startswith("RetrainWindows")]
    (approvals,) = [iam.arn(s, lg) for s, lg, _ in iam.resources("AWS::DynamoDB::Table") if lg.startswith("Approvals")]
    return machine, table, approvals


def test_only_the_sweep_starts_runs_and_only_of_the_pipeline(iam: AssemblyIam) -> None:
    machine, table, approvals = _arns(iam)
    sweep, record = _role(iam, "RetrainSweepRole"), _role(iam, "RetrainRecordRole")
    assert sweep.may("states:StartExecution", machine)
    assert not sweep.may("states:StartExecution", f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:Other")
    assert not record.may("states:StartExecution", machine)
    assert sweep.may("dynamodb:GetItem", table) and sweep.may("dynamodb:UpdateItem", table)
    assert record.may("dynamodb:UpdateItem", table) and not record.may("dynamodb:GetItem", table)
    for role in (sweep, record):
        assert not role.may("dynamodb:DeleteItem", table)
        assert not role.may("dynamodb:UpdateItem", approvals)
    (key,) = [
        props["EncryptionConfiguration"]["KmsKeyId"]
        for stack, _, props in iam.resources("AWS::StepFunctions::StateMachine")
        if stack.endswith("-pipeline")
    ]
    # StartExecution encrypts the run's input with the execution key, through Step Functions only.
    context = {"kms:EncryptionContext:aws:states:stateMachineArn": machine}
    via = {"kms:ViaService": f"states.{REGION}.amazonaws.com"}
    assert iam.may_use_key(sweep, "kms:GenerateDataKey", key, **context, **via)
    assert not iam.may_use_key(sweep, "kms:Decrypt", key, **context, **via)
    assert not iam.may_use_key(record, "kms:GenerateDataKey", key, **context, **via)


def test_without_triggers_nothing_is_deployed(variant: Any) -> None:
    assert variant.settings.retrain == []
    for stack in (variant.data, variant.pipeline):
        template_json = variant.assembly.get_stack_by_name(stack.stack_name).template
        assert [k for k in template_json["Resources"] if "Retrain" in k] == []
    buckets = resources(variant, variant.data, "AWS::S3::Bucket")
    assert all("NotificationConfiguration" not in b["Properties"] for b in buckets.values())


def test_triggers_can_be_given_on_the_command_line() -> None:
    from stacks.settings import settings_from_context

    context = cdk_context()
    context["retrain"] = json.dumps([RETRAIN_TRIGGER])  # -c retrain='[...]' arrives as text
    (trigger,) = settings_from_context(context).retrain
    assert (trigger.name, trigger.prefix, trigger.quiet_minutes) == ("web-text", "incoming/web-text/", 30)
