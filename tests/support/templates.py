"""Read synthesized templates and query them."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Template


def template(platform: Any, stack: Any) -> Template:
    """The synthesized template of one stack of a synthesized Platform."""
    artifact = platform.assembly.get_stack_by_name(stack.stack_name)
    return Template.from_json(artifact.template)


def resources(platform: Any, stack: Any, type_: str) -> dict[str, dict[str, Any]]:
    artifact = platform.assembly.get_stack_by_name(stack.stack_name)
    return {k: v for k, v in artifact.template["Resources"].items() if v["Type"] == type_}


def get_att(logical_id: str, attribute: str) -> dict[str, list[str]]:
    return {"Fn::GetAtt": [logical_id, attribute]}


def logical_id(platform: Any, stack: Any, type_: str, contains: str) -> str:
    """The one logical ID of `type_` whose ID contains `contains`."""
    matches = [k for k in resources(platform, stack, type_) if contains in k]
    assert len(matches) == 1, f"expected one {type_} with {contains!r} in its ID, found {matches}"
    return matches[0]
