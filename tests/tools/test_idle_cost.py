"""`make cost` prices every resource billed while idle in the synthesized templates, each counted once."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cdk_context
from tools import idle_cost
from tools.idle_cost import HOURS_PER_MONTH, PRICES, CostError

AZS = 2  # the shipped settings' network.az_count: each interface endpoint has a subnet in each


def _templates(platform: Any) -> dict[str, dict[str, Any]]:
    return {s.stack_name: platform.assembly.get_stack_by_name(s.stack_name).template for s in platform.stacks}


def _by_kind(lines: list[idle_cost.Line]) -> dict[str, idle_cost.Line]:
    return {line.item.split(" x ")[0].split(",")[0]: line for line in lines}


def test_the_shipped_platforms_idle_cost_counts_each_billed_resource(platform: Any) -> None:
    lines = _by_kind(idle_cost.idle_cost(_templates(platform)))
    fsx = lines["FSx for Lustre PERSISTENT_2 250 MB/s/TiB"]
    assert fsx.quantity == platform.settings.storage.fsx_storage_capacity_gib == 1200
    assert fsx.monthly_usd == pytest.approx(1200 * PRICES["fsx_persistent2_250"][0])
    endpoints = lines["interface endpoint az"]
    assert endpoints.quantity % AZS == 0 and endpoints.quantity >= 10 * AZS
    assert endpoints.monthly_usd == pytest.approx(endpoints.quantity * 0.01 * HOURS_PER_MONTH)
    assert lines["kms key"].quantity == 4  # data, network (flow logs), pipeline, execution data
    assert lines["alarm"].quantity >= 20
    assert lines["dashboard"].quantity == 1
    assert lines["nat gateway"].quantity == platform.settings.network.nat_gateways == 0


def test_a_resource_added_to_a_template_changes_the_total(platform: Any) -> None:
    templates = _templates(platform)
    before = sum(line.monthly_usd for line in idle_cost.idle_cost(templates))
    grown = copy.deepcopy(templates)
    stack = next(iter(grown.values()))
    stack["Resources"]["ExtraKey"] = {"Type": "AWS::KMS::Key", "Properties": {}}
    stack["Resources"]["ExtraNat"] = {"Type": "AWS::EC2::NatGateway", "Properties": {}}
    after = sum(line.monthly_usd for line in idle_cost.idle_cost(grown))
    assert after - before == pytest.approx(1.00 + 0.045 * HOURS_PER_MONTH)


def test_an_fsx_tier_without_a_price_is_an_error_not_zero(platform: Any) -> None:
    templates = copy.deepcopy(_templates(platform))
    for template in templates.values():
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::FSx::FileSystem":
                resource["Properties"]["LustreConfiguration"]["PerUnitStorageThroughput"] = 40
    with pytest.raises(CostError, match="no price for FSx for Lustre PERSISTENT_2 at 40"):
        idle_cost.idle_cost(templates)


def test_the_cost_page_quotes_the_shipped_settings_total(tmp_path: Path) -> None:
    from stacks.app_builder import build_platform

    shipped = build_platform(cdk_context(approvers=[]), outdir=str(tmp_path))
    shipped.assembly = shipped.synth()
    total = sum(line.monthly_usd for line in idle_cost.idle_cost(_templates(shipped)))
    page = (Path(__file__).resolve().parents[2] / "docs" / "platform-team" / "cost.md").read_text()
    assert f"| **Total** | | | **{total:.2f}** |" in page
