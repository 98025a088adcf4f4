"""A state machine's definition, rendered from its template (a Fn::Join of text and tokens), compared state by state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tools.review.values import differences

# Fields of a state that hold other states: those are compared as states of their own.
_NESTED = ("Branches", "Iterator", "ItemProcessor")


class DefinitionError(ValueError):
    """The definition does not render to JSON (a token outside a string, or an S3 location)."""


@dataclass(frozen=True)
class StateChange:
    change: str  # "added", "removed" or "changed"
    state: str  # nested states read `Parent › branch 2 › Child`
    type: str
    details: tuple[str, ...]


def definition(resource: dict[str, Any]) -> dict[str, Any]:
    """The definition of an AWS::StepFunctions::StateMachine resource, tokens written as `${Logical.Attr}`."""
    properties = resource.get("Properties", {})
    if "Definition" in properties:
        return _render_objects(properties["Definition"])  # type: ignore[no-any-return]
    if "DefinitionString" not in properties:
        raise DefinitionError("the definition is not in the template (DefinitionS3Location)")
    text = _text(properties["DefinitionString"])
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DefinitionError(f"the rendered DefinitionString is not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(parsed, dict):
        raise DefinitionError("the rendered DefinitionString is not a JSON object")
    return parsed


def token(value: Any) -> str:
    """An intrinsic as the CDK diff writes it: `${Logical}`, `${Logical.Attr}`, `${stack:Output}`."""
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Ref":
            return f"${{{arg}}}"
        if fn == "Fn::GetAtt":
            return f"${{{'.'.join(arg) if isinstance(arg, list) else arg}}}"
        if fn == "Fn::GetStackOutput" and isinstance(arg, dict):
            return f"${{{arg.get('StackName')}:{arg.get('OutputName')}}}"
        if fn == "Fn::ImportValue":
            return f"${{import:{_text(arg)}}}"
        if fn == "Fn::Join":
            return _text(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        delimiter, parts = value["Fn::Join"]
        return str(delimiter).join(_text(part) for part in parts)
    # Tokens sit inside JSON strings in a CDK-rendered definition: escape them as string content.
    return json.dumps(token(value))[1:-1]


def _render_objects(node: Any) -> Any:
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in ("Ref", "Fn::GetAtt", "Fn::GetStackOutput", "Fn::ImportValue"):
            return token(node)
        return {k: _render_objects(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_render_objects(v) for v in node]
    return node


def states(definition: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every state by name, nested ones (Parallel branches, Map processors) under their parent's name."""
    found: dict[str, dict[str, Any]] = {}
    for name, state in definition.get("States", {}).items():
        key = f"{prefix}{name}"
        found[key] = {k: v for k, v in state.items() if k not in _NESTED}
        for index, branch in enumerate(state.get("Branches", []), start=1):
            found.update(states(branch, f"{key} › branch {index} › "))
        for field in ("Iterator", "ItemProcessor"):
            if field in state:
                found.update(states(state[field], f"{key} › "))
    return found


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[StateChange]:
    """States added, removed and changed (with what changed) from `old` to `new`."""
    changes = []
    if old.get("StartAt") != new.get("StartAt"):
        changes.append(
            StateChange("changed", "(start)", "", (f"StartAt: {old.get('StartAt')} → {new.get('StartAt')}",))
        )
    before, after = states(old), states(new)
    for name, state in after.items():
        if name not in before:
            changes.append(StateChange("added", name, str(state.get("Type", "")), _transitions(state)))
    for name, state in before.items():
        if name not in after:
            changes.append(StateChange("removed", name, str(state.get("Type", "")), ()))
    for name, state in after.items():
        if name in before and before[name] != state:
            details = tuple(differences(before[name], state))
            changes.append(StateChange("changed", name, str(state.get("Type", "")), details))
    return changes


def _transitions(state: dict[str, Any]) -> tuple[str, ...]:
    targets = [f"Next: {state['Next']}"] if "Next" in state else []
    targets += [f"Choice → {c['Next']}" for c in state.get("Choices", []) if "Next" in c]
    targets += [f"Default: {state['Default']}"] if "Default" in state else []
    targets += [f"Catch {', '.join(c.get('ErrorEquals', []))} → {c['Next']}" for c in state.get("Catch", [])]
    if state.get("End"):
        targets.append("End")
    return tuple(targets)
