"""The synthesized assembly's IAM, resolved to concrete ARNs, for rules over the templates.

The rules ask the policy evaluator the local platform enforces with (localrun/aws/iam_policy.py)
whether a role may do something; they cover what no local run can exercise because the AWS
service, not the platform's code, makes the call (Lambda attaching to the VPC, SageMaker
pulling the image or encrypting volumes, S3 or DynamoDB using a key).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.aws.cfn import ACCOUNT, Assembly, Resolver
from localrun.aws.iam_policy import Policy, Request, allows, evaluate

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Role:
    arn: str
    logical: str
    trust: Policy
    policies: list[Policy] = field(default_factory=list)

    def may(self, action: str, resource: str, **context: Any) -> bool:
        return allows(self.policies, action, resource, **context)

    def trusted_by(self, service: str) -> bool:
        return service in json.dumps(self.trust.document)


class AssemblyIam:
    """Roles with their resolved policies; resources of a type with their resolved properties."""

    def __init__(self, directory: Path) -> None:
        self.assembly = Assembly.load(directory)
        self.resolver = Resolver(self.assembly)
        self.roles: dict[str, Role] = {}
        for stack, logical, resource in self.assembly.resources("AWS::IAM::Role"):
            props = self.resolver.resolve(stack, resource["Properties"])
            arn = self.resolver.get_att(stack, logical, "Arn")
            role = Role(
                arn, logical, Policy.parse(f"{logical} trust", props["AssumeRolePolicyDocument"], resource_policy=True)
            )
            role.policies += [Policy.parse(p["PolicyName"], p["PolicyDocument"]) for p in props.get("Policies", [])]
            self.roles[arn] = role
        # CDK moves what exceeds a role's inline policy size into managed "overflow" policies attached to it.
        policies = [*self.assembly.resources("AWS::IAM::Policy"), *self.assembly.resources("AWS::IAM::ManagedPolicy")]
        for stack, logical, resource in policies:
            props = self.resolver.resolve(stack, resource["Properties"])
            for name in props.get("Roles", []):
                (role_arn,) = [arn for arn in self.roles if arn.rsplit("/", 1)[-1] == name]
                self.roles[role_arn].policies.append(Policy.parse(logical, props["PolicyDocument"]))

    def resources(self, type_: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(stack, logical ID, resolved properties) of every resource of a type."""
        return [
            (stack, logical, self.resolver.resolve(stack, resource.get("Properties", {})))
            for stack, logical, resource in self.assembly.resources(type_)
        ]

    def arn(self, stack: str, logical: str) -> str:
        return str(self.resolver.get_att(stack, logical, "Arn"))

    def key_policy(self, key_arn: str) -> Policy:
        for stack, logical, props in self.resources("AWS::KMS::Key"):
            if self.arn(stack, logical) == key_arn:
                return Policy.parse(f"{logical} key policy", props["KeyPolicy"], resource_policy=True)
        raise KeyError(f"no key {key_arn} in the assembly")

    def may_use_key(self, role: Role, action: str, key_arn: str, **context: Any) -> bool:
        """KMS's rule: the key policy allows the role itself, or lets the account's IAM decide and IAM allows."""
        key_policy = self.key_policy(key_arn)
        direct = Request(action, key_arn, context, known_keys=None, principal_role=role.arn)
        if evaluate([key_policy], direct).allowed:
            return True
        delegated = Request(action, key_arn, context, known_keys=None, principal_role=f"arn:aws:iam::{ACCOUNT}:root")
        return evaluate([key_policy], delegated).allowed and role.may(action, key_arn, **context)

    def definition(self, stack: str, logical: str) -> dict[str, Any]:
        machine = self.assembly.templates[stack]["Resources"][logical]
        return json.loads(self.resolver.resolve(stack, machine["Properties"]["DefinitionString"]))  # type: ignore[no-any-return]


def named_states(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every state of a definition by name, in any nesting of Parallel branches or Map iterators."""
    found: dict[str, dict[str, Any]] = {}
    for name, state in definition.get("States", {}).items():
        found[name] = state
        for branch in [*state.get("Branches", []), state.get("ItemProcessor") or state.get("Iterator") or {}]:
            found |= named_states(branch)
    return found


def task_states(definition: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Task state of a definition, in any nesting of Parallel branches or Map iterators."""
    return [state for state in named_states(definition).values() if state["Type"] == "Task"]


def calls_in_handler(handler: str) -> set[str]:
    """Method names a handler can reach: `lambdas.approvals.handler.decide` -> {"send_task_success", ...}.

    Follows calls from the handler function through the `lambdas` modules it imports, resolving a
    called name to every function or method of that name (an over-approximation, never an under-).
    """
    module_name, entry = handler.rsplit(".", 1)
    functions: dict[str, list[ast.FunctionDef]] = {}
    pending, seen = [module_name], set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = REPO / module.replace(".", "/")
        tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, []).append(node)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lambdas"):
                pending.append(node.module)
                # `from lambdas.approvals import identity` imports a module too
                pending += [
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if (REPO / node.module.replace(".", "/") / f"{alias.name}.py").exists()
                ]
    called: set[str] = set()
    queue, visited = list(functions.get(entry, [])), set()
    while queue:
        function = queue.pop()
        if id(function) in visited:
            continue
        visited.add(id(function))
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                called.add(name)
                queue += functions.get(name, [])
    return called
