"""IAM policy evaluation: Allow, explicit Deny, wildcards and condition operators, as AWS documents them.

moto can evaluate identity policies, but it matches actions only: outside S3 it authorizes every
request against the resource `*` and it ignores conditions, so a statement scoped to a table ARN
never applies and a statement conditioned on a subnet applies to any subnet. This module is the
evaluation logic the local platform uses instead (localrun/aws/iam.py feeds it the request), and the
template rules in tests/stacks use it to ask "may this role do that?" of a synthesized policy.

Written by hand because no maintained library evaluates IAM policies offline: the one
authoritative evaluator is AWS's policy simulator, which needs an account.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Keys every request carries (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html).
GLOBAL_KEY_PREFIXES = ("aws:",)
_NEGATED = {
    "StringNotEquals",
    "StringNotEqualsIgnoreCase",
    "StringNotLike",
    "ArnNotEquals",
    "ArnNotLike",
    "NumericNotEquals",
}


class UnmodelledConditionKey(Exception):  # noqa: N818 - a gap in the local model, named for what is missing
    """A statement that would apply conditions on a key the request model gives no value for."""


@dataclass(frozen=True)
class Request:
    """One action on one resource, with the condition context AWS would evaluate."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)
    """Condition keys present in the request; a list value is a multivalued key."""
    known_keys: frozenset[str] | None = frozenset()
    """Service keys the model computes for this action (present or absent); others are a modelling gap.
    None: treat every key not in `context` as absent from the request."""
    principal: str = ""
    """The caller's ARN (an assumed-role session), for resource policies."""
    principal_role: str = ""
    """The IAM role behind the session."""
    principal_service: str = ""
    """A service principal (e.g. lambda.amazonaws.com) assuming a role, for trust policies."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


@dataclass(frozen=True)
class Policy:
    """A policy document with a name for messages; `resource_policy` marks bucket/key/topic policies."""

    name: str
    document: Mapping[str, Any]
    resource_policy: bool = False

    @classmethod
    def parse(cls, name: str, document: str | Mapping[str, Any], *, resource_policy: bool = False) -> Policy:
        return cls(name, json.loads(document) if isinstance(document, str) else document, resource_policy)

    def statements(self) -> list[Mapping[str, Any]]:
        statements = self.document.get("Statement", [])
        return [statements] if isinstance(statements, Mapping) else list(statements)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _glob(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM wildcards: `*` any run of characters (including `:` and `/`), `?` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def action_matches(pattern: str, action: str) -> bool:
    """Actions are case-insensitive (`sagemaker:updateModelPackage` is `UpdateModelPackage`)."""
    return _glob(pattern, action, case_sensitive=False)


def resource_matches(pattern: str, resource: str) -> bool:
    if "${" in pattern:
        raise UnmodelledConditionKey(f"policy variables are not modelled locally: {pattern}")
    return _glob(pattern, resource)


def _principal_matches(principal: Any, request: Request) -> bool:
    """Whether a resource policy's Principal names the caller (`*`, its session or its role)."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    if request.principal_service:
        return request.principal_service in _as_list(principal.get("Service", []))
    names = _as_list(principal.get("AWS", []))
    return "*" in names or request.principal in names or request.principal_role in names


# -- conditions ---------------------------------------------------------------------------------
def _compare(operator: str, expected: str, actual: Any) -> bool:
    base = operator.removesuffix("IfExists")
    text = str(actual).lower() if isinstance(actual, bool) else str(actual)
    if base in ("StringEquals", "StringNotEquals", "ArnEquals", "ArnNotEquals"):
        return text == expected if base.startswith("String") else _glob(expected, text)
    if base in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
        return text.lower() == expected.lower()
    if base in ("StringLike", "StringNotLike", "ArnLike", "ArnNotLike"):
        return _glob(expected, text)
    if base == "Bool":
        return text.lower() == expected.lower()
    if base.startswith("Numeric"):
        a, e = float(text), float(expected)
        return {
            "NumericEquals": a == e,
            "NumericNotEquals": a == e,
            "NumericLessThan": a < e,
            "NumericLessThanEquals": a <= e,
            "NumericGreaterThan": a > e,
            "NumericGreaterThanEquals": a >= e,
        }[base]
    raise UnmodelledConditionKey(f"condition operator {operator} is not modelled locally")


def _absent_key_holds(qualifier: str, operator: str) -> bool:
    """A condition on a key the request does not carry (AWS: "Condition keys not present")."""
    if qualifier in ("ForAllValues", "ForAnyValue"):
        return qualifier == "ForAllValues"  # vacuously true for all, false for any
    return operator.endswith("IfExists") or operator.removesuffix("IfExists") in _NEGATED


def _condition_holds(qualified: str, key: str, expected: Any, request: Request) -> bool:
    qualifier, _, operator = qualified.rpartition(":")
    expected_values = [str(v) for v in _as_list(expected)]
    context = {k.lower(): v for k, v in request.context.items()}  # condition keys are case-insensitive
    known = None if request.known_keys is None else {k.lower() for k in request.known_keys}
    present = context.get(key.lower()) is not None
    if operator == "Null":
        return (not present) == (expected_values[0].lower() == "true")
    if not present:
        if known is not None and key.lower() not in known and not key.lower().startswith(GLOBAL_KEY_PREFIXES):
            raise UnmodelledConditionKey(
                f"{request.action}: the local request model gives no value for condition key {key}; "
                "add it to localrun/aws/iam.py so the statement is evaluated, not guessed"
            )
        return _absent_key_holds(qualifier, operator)
    negated = operator.removesuffix("IfExists") in _NEGATED
    matched = [any(_compare(operator, e, value) for e in expected_values) for value in _as_list(context[key.lower()])]
    if negated:  # "no value matches"; with ForAnyValue, "some value does not match"
        return not all(matched) if qualifier == "ForAnyValue" else not any(matched)
    return all(matched) if qualifier == "ForAllValues" else any(matched)


def conditions_hold(conditions: Mapping[str, Mapping[str, Any]], request: Request) -> bool:
    return all(
        _condition_holds(operator, key, expected, request)
        for operator, block in conditions.items()
        for key, expected in block.items()
    )


# -- statements and policies --------------------------------------------------------------------
def _applies(statement: Mapping[str, Any], request: Request) -> bool:
    actions = _as_list(statement.get("Action", statement.get("NotAction", [])))
    if any(action_matches(p, request.action) for p in actions) != ("Action" in statement):
        return False
    if "Resource" in statement or "NotResource" in statement:
        resources = _as_list(statement.get("Resource", statement.get("NotResource", [])))
        if any(resource_matches(p, request.resource) for p in resources) != ("Resource" in statement):
            return False
    return conditions_hold(statement.get("Condition", {}), request)


def evaluate(policies: Iterable[Policy], request: Request) -> Decision:
    """AWS's order within one account: an explicit Deny anywhere wins, then any Allow, else implicit deny."""
    allowed_by: str | None = None
    for policy in policies:
        for index, statement in enumerate(policy.statements()):
            if policy.resource_policy and not _principal_matches(statement.get("Principal"), request):
                continue
            if not _applies(statement, request):
                continue
            where = f"{policy.name} statement {statement.get('Sid') or index}"
            if statement["Effect"] == "Deny":
                return Decision(False, f"explicit deny in {where}")
            allowed_by = allowed_by or where
    if allowed_by is not None:
        return Decision(True, f"allowed by {allowed_by}")
    return Decision(False, f"no identity-based policy allows the {request.action} action")


def allows(policies: Sequence[Policy], action: str, resource: str, **context: Any) -> bool:
    """For template rules: may these policies do `action` on `resource`? Keys not given are absent."""
    return evaluate(policies, Request(action, resource, context=context, known_keys=None)).allowed
