"""`make cost`: the monthly cost of a deployed platform while no run is going, from the synthesized templates.

Counts what AWS bills by the hour or month whether or not anything runs (the FSx file system's
capacity at its throughput tier, interface VPC endpoints in each of their subnets' AZs, KMS keys,
alarms, dashboards, NAT gateways); usage-billed parts (requests, storage written, logs ingested) are
zero while idle and left out. Prices: us-east-1, on-demand, as in PRICES.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOURS_PER_MONTH = 730
PRICES_REGION = "us-east-1"
PRICES_DATE = "2026-11-24"
# (USD, unit, source). On-demand list prices of the pages named, as recorded on PRICES_DATE without
# reading those pages (no AWS access here); a few were cross-checked against third-party calculators
# (docs/platform-team/cost.md: Idle cost). Check them before quoting a figure. FSx for Lustre PERSISTENT_2 SSD is
# priced per GB-month by throughput tier.
PRICES: dict[str, tuple[float, str, str]] = {
    "fsx_persistent2_125": (0.145, "GB-month", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_persistent2_250": (0.210, "GB-month", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_persistent2_500": (0.340, "GB-month", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_persistent2_1000": (0.600, "GB-month", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "interface_endpoint_az": (0.01, "endpoint-AZ-hour", "https://aws.amazon.com/privatelink/pricing/"),
    "nat_gateway": (0.045, "gateway-hour", "https://aws.amazon.com/vpc/pricing/"),
    "kms_key": (1.00, "key-month", "https://aws.amazon.com/kms/pricing/"),
    "alarm": (0.10, "standard-resolution alarm-month", "https://aws.amazon.com/cloudwatch/pricing/"),
    "dashboard": (3.00, "dashboard-month; an account's first 3 are free", "https://aws.amazon.com/cloudwatch/pricing/"),
}


@dataclass(frozen=True)
class Line:
    item: str
    quantity: float
    unit_usd: float
    monthly_usd: float


class CostError(ValueError):
    """A billed resource the calculation does not know how to price."""


def _fsx(props: Mapping[str, Any]) -> Line:
    lustre = props.get("LustreConfiguration", {})
    kind, tier = lustre.get("DeploymentType"), lustre.get("PerUnitStorageThroughput")
    key = f"fsx_persistent2_{tier}"
    if kind != "PERSISTENT_2" or key not in PRICES:
        raise CostError(f"no price for FSx for Lustre {kind} at {tier} MB/s/TiB: add it to PRICES")
    gib = float(props["StorageCapacity"])
    price = PRICES[key][0]
    return Line(f"FSx for Lustre {kind} {tier} MB/s/TiB, {gib:g} GiB", gib, price, gib * price)


def idle_cost(templates: Mapping[str, Mapping[str, Any]]) -> list[Line]:
    """One line per billed kind of resource across the stacks' templates."""
    lines: list[Line] = []
    counts = {"interface_endpoint_az": 0, "nat_gateway": 0, "kms_key": 0, "alarm": 0, "dashboard": 0}
    for template in templates.values():
        for resource in template.get("Resources", {}).values():
            type_, props = resource["Type"], resource.get("Properties", {})
            if type_ == "AWS::FSx::FileSystem":
                lines.append(_fsx(props))
            elif type_ == "AWS::EC2::VPCEndpoint" and props.get("VpcEndpointType") == "Interface":
                counts["interface_endpoint_az"] += len(props["SubnetIds"])  # one ENI, billed, per AZ
            elif type_ == "AWS::EC2::NatGateway":
                counts["nat_gateway"] += 1
            elif type_ == "AWS::KMS::Key":
                counts["kms_key"] += 1
            elif type_ == "AWS::CloudWatch::Alarm":
                counts["alarm"] += 1
            elif type_ == "AWS::CloudWatch::Dashboard":
                counts["dashboard"] += 1
    hourly = {"interface_endpoint_az", "nat_gateway"}
    for key, count in counts.items():
        price, unit, _ = PRICES[key]
        monthly = count * price * (HOURS_PER_MONTH if key in hourly else 1)
        lines.append(Line(f"{key.replace('_', ' ')} x {count} ({unit})", count, price, monthly))
    return lines


def read_templates(assembly: Path) -> dict[str, dict[str, Any]]:
    found = {p.name: json.loads(p.read_text()) for p in sorted(assembly.glob("*.template.json"))}
    if not found:
        raise CostError(f"no templates in {assembly}: run make synth first")
    return found


def render(lines: list[Line]) -> str:
    rows = [f"Idle monthly cost ({PRICES_REGION} list prices recorded {PRICES_DATE}, {HOURS_PER_MONTH} h a month):"]
    rows += [f"  {line.monthly_usd:9.2f} USD  {line.item}" for line in lines]
    rows.append(f"  {sum(line.monthly_usd for line in lines):9.2f} USD  total")
    return "\n".join(rows)


if __name__ == "__main__":
    print(render(idle_cost(read_templates(Path(sys.argv[1] if len(sys.argv) > 1 else "cdk.out")))))
