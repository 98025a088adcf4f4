"""The settings model: defaults, overrides from `-c`, and a clear error for every bad value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stacks.constructs.logs import _RETENTION
from stacks.settings import (
    DEPLOY_FLAG,
    LOG_RETENTION_DAYS,
    PlatformSettings,
    SettingsError,
    build_settings,
    settings_from_context,
    settings_table,
)
from tests.conftest import cdk_context

REPO = Path(__file__).resolve().parents[2]
BASE = cdk_context()["platform"]


def test_cdk_json_is_valid() -> None:
    settings = settings_from_context(cdk_context())
    assert isinstance(settings, PlatformSettings)
    assert settings.account is None and settings.region is None  # environment-agnostic synth
    assert settings.network.nat_gateways == 0
    assert settings.network.largest_cluster.instance_type == "ml.p5.48xlarge"
    assert settings.name_prefix == "training-platform-dev"


def test_cli_overrides_are_dotted_paths_and_parse_json() -> None:
    context = cdk_context()
    context.update(
        {
            "stage": "prod",
            "network.nat_gateways": "1",
            "network.largest_cluster.count": "8",
            "notifications.alarm_emails": '["oncall@example.org"]',
            "@aws-cdk/core:newStyleStackSynthesis": True,  # CDK's own keys are ignored
            "aws:cdk:enable-path-metadata": True,
        }
    )
    settings = settings_from_context(context)
    assert settings.stage == "prod"
    assert settings.network.nat_gateways == 1
    assert settings.network.largest_cluster.count == 8
    assert settings.notifications.alarm_emails == ["oncall@example.org"]


BAD_VALUES = [
    ("stage", "Prod_1", "stage = 'Prod_1'", "lowercase"),
    ("account", "12345", "account = '12345'", "12-digit"),
    ("region", "useast1", "region = 'useast1'", "Region code"),
    ("network.vpc_cidr", "10.20.0.0/33", "network.vpc_cidr = '10.20.0.0/33'", "IPv4 network"),
    ("network.vpc_cidr", "8.8.0.0/16", "network.vpc_cidr = '8.8.0.0/16'", "private IPv4 range"),
    ("network.nat_gateways", "7", "network.nat_gateways = '7'", "less than or equal to 3"),
    ("network.flow_log_retention_days", "42", "network.flow_log_retention_days = '42'", "accepts only"),
    ("network.largest_cluster.instance_type", "ml.p5.4xlarge", "ml.p5.4xlarge", "ml.p5.48xlarge"),
    ("storage.fsx_storage_capacity_gib", "2000", "storage.fsx_storage_capacity_gib = '2000'", "1200 GiB or"),
    ("storage.fsx_throughput_per_tib", "300", "storage.fsx_throughput_per_tib = '300'", "125"),
    ("storage.fsx_compression", "GZIP", "storage.fsx_compression = 'GZIP'", "'LZ4' or 'NONE'"),
    ("storage.fsx_auto_export_prefix", "results", "storage.fsx_auto_export_prefix = 'results'", "ending in '/'"),
    ("storage.noncurrent_version_days", "0", "storage.noncurrent_version_days = '0'", "greater than or equal to 1"),
    ("image.framework_version", "1.99.0", "1.99.0", "known versions"),
    ("image.python_version", "py27", "py27", "DLCs exist for"),
    ("tags.team", "bad|tag", "tags.team = 'bad|tag'", "letters, digits"),
    ("notifications.alarm_emails", '["not-an-email"]', "not-an-email", "not e-mail addresses"),
    ("approvers", '["alice"]', "alice", "IAM role/user ARNs"),
]


@pytest.mark.parametrize(("key", "value", "shown", "allowed"), BAD_VALUES, ids=[f"{k}={v}" for k, v, *_ in BAD_VALUES])
def test_bad_value_names_key_value_and_what_is_allowed(key: str, value: str, shown: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as err:
        build_settings(BASE, {key: value})
    message = str(err.value)
    assert shown in message
    assert allowed in message


def test_unknown_setting_suggests_the_closest_name() -> None:
    with pytest.raises(
        SettingsError, match=r"network\.nat_gatways: unknown setting \(did you mean 'network\.nat_gateways'\?\)"
    ):
        build_settings(BASE, {"network.nat_gatways": "1"})
    context = cdk_context()
    context["stgae"] = "prod"  # near miss of a top-level setting given with -c
    with pytest.raises(SettingsError, match="did you mean 'stage'"):
        settings_from_context(context)


def test_unknown_key_in_cdk_json_is_an_error() -> None:
    with pytest.raises(SettingsError, match=r"network\.efa_enabled: unknown setting"):
        build_settings({**BASE, "network": {**BASE["network"], "efa_enabled": True}})


def test_missing_required_tags_are_reported() -> None:
    base = {k: v for k, v in BASE.items() if k != "tags"}
    with pytest.raises(SettingsError, match="tags: Field required"):
        build_settings(base)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(SettingsError) as err:
        build_settings(BASE, {"stage": "X", "network.nat_gateways": "9"})
    assert "stage" in str(err.value) and "network.nat_gateways" in str(err.value)


def test_training_subnet_too_small_for_the_largest_cluster() -> None:
    # 64 x p5.48xlarge take 32 IPs each (one per EFA card): 2048 > a /22's 1003 usable.
    with pytest.raises(SettingsError) as err:
        build_settings(
            BASE,
            {"network.largest_cluster.count": "64", "network.training_subnet_mask": "22"},
        )
    message = str(err.value)
    assert "has 1003 usable private IPs but 64 x ml.p5.48xlarge need 2048 (32 each)" in message
    assert "set network.training_subnet_mask to 20 or less" in message


def test_non_efa_instances_need_two_ips_each() -> None:
    settings = build_settings(
        BASE,
        {
            "network.efa": "false",
            "network.largest_cluster.instance_type": "ml.g5.12xlarge",
            "network.largest_cluster.count": "490",
            "network.training_subnet_mask": "22",
        },
    )
    assert settings.network.largest_cluster.count == 490  # 980 IPs fit in 1003
    with pytest.raises(SettingsError, match="need 1004 "):
        build_settings(
            BASE,
            {
                "network.efa": "false",
                "network.largest_cluster.instance_type": "ml.g5.12xlarge",
                "network.largest_cluster.count": "502",
                "network.training_subnet_mask": "22",
            },
        )


def test_efa_requested_on_a_type_without_efa() -> None:
    with pytest.raises(SettingsError) as err:
        build_settings(BASE, {"network.largest_cluster.instance_type": "ml.g5.12xlarge"})
    message = str(err.value)
    assert "'ml.g5.12xlarge' does not support EFA while network.efa is true" in message
    assert "ml.p4d.24xlarge" in message and "network.efa=false" in message


def test_named_azs_need_a_region_and_must_belong_to_it() -> None:
    with pytest.raises(SettingsError, match="needs `region`"):
        build_settings(BASE, {"network.availability_zones": '["us-east-1a", "us-east-1b"]'})
    with pytest.raises(SettingsError, match=r"\['eu-west-1a'\] are not AZs of region 'us-east-1'"):
        build_settings(BASE, {"region": "us-east-1", "network.availability_zones": '["us-east-1a", "eu-west-1a"]'})
    ok = build_settings(BASE, {"region": "us-east-1", "network.availability_zones": '["us-east-1c", "us-east-1a"]'})
    assert ok.network.availability_zones[0] == "us-east-1c"


def test_log_retention_values_match_cdk_enum() -> None:
    assert tuple(_RETENTION) == LOG_RETENTION_DAYS


def test_settings_reference_page_is_current() -> None:
    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    table = settings_table()
    assert table in page, "docs/reference/settings.md is stale: regenerate it with `make docs`"
    for path in re.findall(r"^\| `([^`]+)` \|", table, flags=re.M):
        assert f"`{path}`" in page


def test_shipped_settings_synthesize_and_only_a_deploy_needs_approvers() -> None:
    shipped = cdk_context(approvers=[])
    assert settings_from_context(shipped).approvers == []
    with pytest.raises(SettingsError, match=r"approvers is empty.*every run would time out.*CONTEXT="):
        settings_from_context({**shipped, DEPLOY_FLAG: "true"})
    assert settings_from_context({**cdk_context(), DEPLOY_FLAG: "true"}).approvers


def test_context_json_merges_over_cdk_json_before_dotted_overrides() -> None:
    overrides = json.dumps({"stage": "prod", "network": {"nat_gateways": 1}, "approvers": []})
    settings = settings_from_context({**cdk_context(), "stage": "qa"}, overrides)
    assert settings.stage == "qa"  # -c wins over CONTEXT
    assert settings.network.nat_gateways == 1
    assert settings.network.vpc_cidr == BASE["network"]["vpc_cidr"]  # merged, not replaced
    assert settings.approvers == []
    with pytest.raises(SettingsError, match=r"PLATFORM_CONTEXT .*must be a JSON object"):
        settings_from_context(cdk_context(), '["prod"]')
    with pytest.raises(SettingsError, match=r"PLATFORM_CONTEXT .*not JSON"):
        settings_from_context(cdk_context(), "{stage: prod}")
    with pytest.raises(SettingsError, match=r"network.nat_gatways: unknown setting \(did you mean"):
        settings_from_context(cdk_context(), '{"network": {"nat_gatways": 1}}')


def test_a_type_without_ml_suggests_its_sagemaker_name_and_an_unknown_key_hides_no_other_problem() -> None:
    given = {"network.largest_cluster.instance_type": "p5.48xlarge", "network.nat_gatways": "1", "stage": "Prod_1"}
    with pytest.raises(SettingsError) as err:
        build_settings(BASE, given)
    message = str(err.value)
    assert "did you mean 'ml.p5.48xlarge'? (SageMaker's names start with ml.)" in message
    assert "network.nat_gatways: unknown setting (did you mean 'network.nat_gateways'?)" in message
    assert "stage = 'Prod_1'" in message
    with pytest.raises(SettingsError, match=r"'ml\.g5\.12xlarg'; did you mean 'ml\.g5\.12xlarge'"):
        build_settings(BASE, {"pipeline.allowed_instance_types": '["ml.g5.12xlarg"]'})


def test_unknown_keys_given_with_c_or_context_hide_no_other_problem() -> None:
    context = {**cdk_context(), "network.nat_gatways": "1", "stage": "Prod_1"}  # as `cdk synth -c` passes them
    overrides = json.dumps({"storage": {"fsx_capacity": 1200}, "network": {"vpc_cidr": "8.8.0.0/16"}})  # CONTEXT=
    with pytest.raises(SettingsError) as err:
        settings_from_context(context, overrides)
    message = str(err.value)
    for expected in (
        "network.nat_gatways: unknown setting (did you mean 'network.nat_gateways'?)",
        "storage.fsx_capacity: unknown setting",
        "stage = 'Prod_1'",
        "network.vpc_cidr = '8.8.0.0/16'",
    ):
        assert expected in message, message
