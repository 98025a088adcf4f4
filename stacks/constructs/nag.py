"""cdk-nag acknowledgements: one finding each, with its reason, at the narrowest scope."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

PACKS = ("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security")


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope` and below."""
    pack = next((p for p in PACKS if finding.startswith(f"{p}-")), None)
    if pack is None:
        raise ValueError(f"{finding!r} is not a rule of the packs this app applies ({', '.join(PACKS)})")
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {finding} needs a real reason, not {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{pack}::{finding}", reason=reason))


def acknowledge_all(scope: IConstruct, findings: dict[str, str]) -> None:
    """Several findings on one scope, each with its own reason."""
    for finding, reason in findings.items():
        acknowledge(scope, finding, reason)


def acknowledge_inline_policy(role: IConstruct) -> None:
    """NIST/HIPAA IAMNoInlinePolicy on a role whose policy CDK's grants generate for it alone."""
    for pack in ("NIST.800.53.R5", "HIPAA.Security"):
        acknowledge(
            role,
            f"{pack}-IAMNoInlinePolicy",
            "Least-privilege statements from CDK grants, bound to this one role; a managed policy would "
            "be a reusable object that could be attached elsewhere, with no tighter scope.",
        )
