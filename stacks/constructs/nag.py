"""cdk-nag acknowledgements: one finding each, with its reason, at the narrowest scope."""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

PACKS = ("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security")
# Tests switch this off to see every finding the packs report (and prove each acknowledgement matches one).
ENABLED = True


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope` and below."""
    pack = next((p for p in PACKS if finding.startswith(f"{p}-")), None)
    if pack is None:
        raise ValueError(f"{finding!r} is not a rule of the packs this app applies ({', '.join(PACKS)})")
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {finding} needs a real reason, not {reason!r}")
    if not ENABLED:
        return
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{pack}::{finding}", reason=reason))


def acknowledge_all(scope: IConstruct, findings: dict[str, str]) -> None:
    """Several findings on one scope, each with its own reason."""
    for finding, reason in findings.items():
        acknowledge(scope, finding, reason)


def acknowledge_inline_policy(role: IConstruct) -> None:
    """NIST/HIPAA IAMNoInlinePolicy on a role (or policy) whose statements serve that one role alone."""
    for pack in ("NIST.800.53.R5", "HIPAA.Security"):
        acknowledge(
            role,
            f"{pack}-IAMNoInlinePolicy",
            "Least-privilege statements for this one role (CDK grants and scoped statements); a managed "
            "policy would be a reusable object that could be attached elsewhere, with no tighter scope.",
        )


def flatten(scope: IConstruct, value: Any) -> str:
    """A token as cdk-nag writes it in finding IDs (its flattenCfnReference), for stack-local tokens.

    `arn:${Partition}:s3:::bucket/*` becomes `arn:<AWS::Partition>:s3:::bucket/*`, a GetAtt
    `<LogicalId.Arn>`; a reference into another stack cannot be flattened and is an error here.
    """

    def visit(node: Any) -> str:
        if isinstance(node, str):
            return node.replace("${", "<").replace("}", ">")
        if isinstance(node, dict) and len(node) == 1:
            ((fn, arg),) = node.items()
            if fn == "Fn::Join":
                delimiter, items = arg
                return str(delimiter).join(visit(i) for i in items)
            if fn == "Fn::Sub":
                return visit(arg)
            if fn == "Fn::GetAtt":
                return f"<{visit(arg[0])}.{visit(arg[1])}>"
            if fn == "Fn::ImportValue":
                return visit(arg)
            if fn == "Ref":
                return f"<{visit(arg)}>"
        raise ValueError(f"cannot flatten {node!r} the way cdk-nag does; keep the reference stack-local")

    return visit(Stack.of(scope).resolve(value))


def acknowledge_wildcard(scope: IConstruct, resource: Any, reason: str) -> None:
    """AwsSolutions-IAM5 for one wildcard resource (given as the token the policy uses)."""
    acknowledge(scope, f"AwsSolutions-IAM5[Resource::{flatten(scope, resource)}]", reason)
