"""The review of two synthesized revisions: the diff engine's findings plus what it does not see.

The engine (`diff.mjs`, the CDK toolkit's own) gives each resource's change impact, the IAM
statements and the security-group rules. Added here: which changes touch stateful resources
(and whether the review must fail), the cdk-nag acknowledgements, and the state machine's
definition state by state.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tools.review.assembly import Stack
from tools.review.state_machine import DefinitionError, StateChange, compare, definition, token

# Resource types whose replacement or deletion loses data, or the key to it.
STATEFUL_TYPES = {
    "AWS::S3::Bucket": "bucket",
    "AWS::FSx::FileSystem": "file system",
    "AWS::EFS::FileSystem": "file system",
    "AWS::KMS::Key": "key",
    "AWS::DynamoDB::Table": "table",
    "AWS::DynamoDB::GlobalTable": "table",
    "AWS::ECR::Repository": "repository",
    "AWS::Logs::LogGroup": "log group",
    "AWS::SageMaker::ModelPackageGroup": "model registry",
    "AWS::RDS::DBCluster": "database",
    "AWS::RDS::DBInstance": "database",
}
RETAINED = frozenset({"Retain", "RetainExceptOnCreate", "Snapshot"})
# The engine's impacts that end the existing resource (a Retain policy keeps it, orphaned).
ENDS = {
    "WILL_REPLACE": "replaced",
    "MAY_REPLACE": "may be replaced",
    "WILL_DESTROY": "deleted",
    "WILL_ORPHAN": "removed from the stack (orphaned)",
}
# Where an IAM statement lives, by the type of the resource that holds it.
POLICY_KINDS = {
    "AWS::IAM::Policy": "identity policies",
    "AWS::IAM::ManagedPolicy": "identity policies",
    "AWS::S3::BucketPolicy": "bucket policies",
    "AWS::EC2::VPCEndpoint": "VPC endpoint policies",
    "AWS::KMS::Key": "KMS key policies",
    "AWS::Lambda::Permission": "Lambda invoke permissions",
}
TRUST = "trust policies (who can assume a role)"
OPEN_CIDRS = ("0.0.0.0/0", "::/0")
# An asset's content hash (sha256) in its S3 key or image tag: a rebuilt asset moves it, nothing else.
ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")
# Custom resources whose update starts long work on deploy: (type, property) -> what happens. The engine has no
# CloudFormation spec for a custom resource and gives its property changes no impact.
DEPLOY_WORK = {
    ("Custom::TrainingImage", "ImageTag"): (
        "the training image is rebuilt: CodeBuild builds and pushes it, which can take up to an hour"
    ),
}


@dataclass(frozen=True)
class PropertyChange:
    name: str
    impact: str | None
    old: Any
    new: Any
    # What the value reads from another stack that is replaced there: (stack, logical ID).
    replaced_sources: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ResourceChange:
    stack: str
    logical_id: str
    path: str | None
    type: str
    old_type: str | None
    change: str  # added, removed, updated
    impact: str
    deletion_policy: str | None  # of the resource as deployed (the base side)
    properties: tuple[PropertyChange, ...]
    other: tuple[str, ...]

    @property
    def stateful(self) -> str | None:
        """What makes the resource stateful, or None."""
        type_ = self.old_type or self.type
        if type_ in STATEFUL_TYPES:
            return STATEFUL_TYPES[type_]
        if self.deletion_policy in RETAINED:
            return f"DeletionPolicy {self.deletion_policy}"
        return None

    @property
    def ends(self) -> str | None:
        """How the deployed resource ends (replaced, deleted, ...), or None when it lives on."""
        if self.old_type and self.type != self.old_type:
            return "replaced (type changed)"
        return ENDS.get(self.impact) if self.change != "added" else None

    @property
    def blocks(self) -> bool:
        return self.stateful is not None and self.ends is not None

    @property
    def deploy_work(self) -> list[str]:
        """What a deploy of this change starts besides updating the resource (DEPLOY_WORK)."""
        return [
            DEPLOY_WORK[(self.type, p.name)]
            for p in self.properties
            if (self.type, p.name) in DEPLOY_WORK and p.old != p.new
        ]

    def reads_replaced(self, replaced: set[tuple[str, str]]) -> set[tuple[str, str]] | None:
        """The replaced resources (of `replaced`) this one changes for, when reading them is its only change."""
        if self.change != "updated" or self.other or self.stateful or not self.properties:
            return None
        found: set[tuple[str, str]] = set()
        for prop in self.properties:
            read = set(prop.replaced_sources) | ({(self.stack, i) for i in references(prop.new)} & replaced)
            if prop.old != prop.new or not read:
                return None
            found |= read
        return found


@dataclass(frozen=True)
class Statement:
    change: str  # "+" or "-"
    stack: str
    effect: str
    principals: tuple[str, ...]
    actions: tuple[str, ...]
    not_actions: bool
    resources: tuple[str, ...]
    not_resources: bool
    condition: Any
    sources: tuple[tuple[str, str], ...]  # (logical ID, resource type) of the policies that hold it

    @property
    def kind(self) -> str:
        for logical_id, type_ in self.sources:
            if type_ == "AWS::IAM::Role":
                # A role's own policies name it as the principal; its trust policy names who may assume it.
                return "identity policies" if self.principals == (f"AWS:${{{logical_id}}}",) else TRUST
            if type_ in POLICY_KINDS:
                return POLICY_KINDS[type_]
            if type_.endswith("Policy"):
                return "other resource policies"
        identity = bool(self.principals) and all(p.startswith("AWS:${") for p in self.principals)
        return "identity policies" if identity else "other resource policies"

    @property
    def notes(self) -> list[str]:
        notes = []
        if self.effect == "Allow":
            wild_actions = [a for a in self.actions if "*" in a]
            if self.not_actions or wild_actions:
                notes.append("wildcard actions" + (f" ({', '.join(wild_actions)})" if wild_actions else " (NotAction)"))
            if "*" in self.resources:
                notes.append("any resource")
            if self.not_resources:
                notes.append("NotResource")
            if any(fnmatch.fnmatchcase("iam:passrole", a.lower()) for a in self.actions) and not self.not_actions:
                notes.append("PassRole")
            if any(p in ("*", "AWS:*") for p in self.principals):
                notes.append("any principal" + (" (with a condition)" if self.condition else ""))
        if self.kind == TRUST:
            notes.append("trust")
        return notes


@dataclass(frozen=True)
class ManagedPolicyChange:
    change: str  # "+" or "-"
    stack: str
    identity: str  # the role, user or group, as `${LogicalId}`
    policy: str  # the managed policy's ARN


@dataclass(frozen=True)
class RuleChange:
    change: str  # "+" or "-"
    stack: str
    direction: str  # ingress, egress
    group: str
    protocol: str
    peer: str

    @property
    def open_to_internet(self) -> bool:
        return self.peer in OPEN_CIDRS


@dataclass(frozen=True)
class AcknowledgementChange:
    change: str  # "+", "-", "~" (reason changed)
    path: str
    rule: str
    reason: str
    old_reason: str | None = None


@dataclass(frozen=True)
class MachineChange:
    stack: str
    logical_id: str
    path: str | None
    change: str  # added, removed, changed
    states: tuple[StateChange, ...] = ()
    state_count: int = 0
    error: str | None = None


@dataclass
class Review:
    base: str
    stacks: dict[str, str]  # changed stack -> added / removed / changed
    resources: list[ResourceChange]
    statements: list[Statement]
    managed_policies: list[ManagedPolicyChange]
    rules: list[RuleChange]
    acknowledgements: list[AcknowledgementChange]
    machines: list[MachineChange]
    # (stack, logical ID) -> construct path, of every resource on either side
    paths: dict[tuple[str, str], str] = field(default_factory=dict)
    # (stack, output) -> what the output holds, e.g. `DataKey17AFBB84.Arn`, of both sides
    outputs: dict[tuple[str, str], str] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)  # outputs and template sections that changed
    notes: list[str] = field(default_factory=list)
    # Added statements that differ from a removed one only in an asset's hash: the same grant, on the rebuilt asset.
    asset_moves: list[Statement] = field(default_factory=list)
    # (stack, logical ID) of a stateful resource that ends -> what becomes of its data, old and new.
    data_fates: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.stacks or self.acknowledgements)

    @property
    def blocking(self) -> list[ResourceChange]:
        return [r for r in self.resources if r.blocks]

    def carried(self) -> dict[tuple[str, str], list[ResourceChange]]:
        """Each replaced resource that changes itself -> the resources that change only because they read it
        (directly, or through another that does)."""
        replaced = {(r.stack, r.logical_id) for r in self.resources if r.impact == "WILL_REPLACE"}
        reads = {(r.stack, r.logical_id): found for r in self.resources if (found := r.reads_replaced(replaced))}

        def roots(key: tuple[str, str], seen: frozenset[tuple[str, str]]) -> set[tuple[str, str]]:
            if key not in reads or key in seen:
                return {key}
            return {root for source in reads[key] for root in roots(source, seen | {key})}

        carried: dict[tuple[str, str], list[ResourceChange]] = {}
        for r in self.resources:
            key = (r.stack, r.logical_id)
            if key in reads:
                for root in sorted(roots(key, frozenset())):
                    carried.setdefault(root, []).append(r)
        return carried


def build(engine: dict[str, Any], base: dict[str, Stack], head: dict[str, Stack], label: str) -> Review:
    """The review of the engine's output (`diff.mjs`) for the base and head assemblies."""
    review = Review(
        base=label,
        stacks={s["stack"]: s["status"] for s in engine["stacks"]},
        resources=[],
        statements=[],
        managed_policies=[],
        rules=[],
        acknowledgements=_acknowledgements(base, head),
        machines=[],
        paths={
            (stack.name, logical_id): path
            for side in (base, head)
            for stack in side.values()
            for logical_id in stack.template.get("Resources", {})
            if (path := stack.path_of(logical_id)) is not None
        },
        outputs={
            (stack.name, name): token(output.get("Value")).removeprefix("${").removesuffix("}")
            for side in (base, head)
            for stack in side.values()
            for name, output in stack.template.get("Outputs", {}).items()
        },
    )
    for stack in engine["stacks"]:
        name = stack["stack"]
        review.resources.extend(_resource(name, r) for r in stack["resources"])
        for change, key in (("+", "added"), ("-", "removed")):
            review.statements.extend(_statement(change, name, s) for s in stack["iam"][key])
            review.managed_policies.extend(
                ManagedPolicyChange(change, name, str(m["identityArn"]), str(m["managedPolicyArn"]))
                for m in stack["iam"][f"managedPolicies{key.title()}"]
            )
        for change, key in (("+", "Added"), ("-", "Removed")):
            for direction in ("ingress", "egress"):
                review.rules.extend(
                    RuleChange(change, name, direction, r["groupId"], r["protocol"], _peer(r))
                    for r in stack["securityGroups"][f"{direction}{key}"]
                )
        review.other.extend(f"{name}: output {o['name']} {o['change']}" for o in stack["outputs"])
        review.other.extend(f"{name}: template {section} changed" for section in stack["sections"])
    review.machines = _machines(base, head, review.resources)
    review.statements, review.asset_moves = _asset_moves(review.statements)
    review.data_fates = {(r.stack, r.logical_id): data_fate(r, head.get(r.stack)) for r in review.blocking}
    return review


def _fields(statement: Statement) -> str:
    return json.dumps({k: v for k, v in statement.__dict__.items() if k != "change"}, sort_keys=True, default=str)


def _asset_moves(statements: list[Statement]) -> tuple[list[Statement], list[Statement]]:
    """(the statements, the added ones that only follow an asset to its new hash); each such pair is taken out."""
    removed: dict[str, list[Statement]] = {}
    for s in statements:
        if s.change == "-" and ASSET_HASH.search(_fields(s)):
            removed.setdefault(ASSET_HASH.sub("<asset>", _fields(s)), []).append(s)
    moves: list[Statement] = []
    taken: list[Statement] = []
    for s in statements:
        twins = removed.get(ASSET_HASH.sub("<asset>", _fields(s))) if s.change == "+" else None
        if twins:
            taken.append(twins.pop())
            moves.append(s)
    return [s for s in statements if not any(s is t for t in (*moves, *taken))], moves


def data_fate(resource: ResourceChange, head: Stack | None) -> str:
    """What becomes of a stateful resource's data when the deployed resource ends: the old one's and the new one's."""
    kind = STATEFUL_TYPES.get(resource.old_type or resource.type, "resource")
    if resource.deletion_policy in ("Retain", "RetainExceptOnCreate"):
        old = f"the deployed {kind} is retained: it stays, outside the stack, and is billed until someone deletes it"
    elif resource.deletion_policy == "Snapshot":
        old = f"the deployed {kind} is deleted after a final snapshot"
    else:
        old = f"the deployed {kind} is deleted, and what it holds with it"
    if resource.change == "removed":
        return old
    if kind == "key":
        return f"{old}; the new key cannot decrypt what the old one encrypted"
    new = f"the new {kind} starts empty"
    if resource.type == "AWS::FSx::FileSystem" and head is not None:
        new += _lustre_links(resource.logical_id, head)
    return f"{old}; {new}"


def _lustre_links(file_system: str, head: Stack) -> str:
    """How the new file system's data repository associations fill it."""
    said = []
    for association in head.resources("AWS::FSx::DataRepositoryAssociation").values():
        props = association.get("Properties", {})
        if file_system not in references(props.get("FileSystemId")):
            continue
        path = props.get("FileSystemPath", "?")
        if props.get("BatchImportMetaDataOnCreate"):
            said.append(f"{path} re-imports the linked S3 objects' metadata on creation (contents load on first read)")
        else:
            said.append(f"{path} imports nothing on creation")
    if not said:
        return ""
    return "; linked to S3: " + ", ".join(said) + "; files written only to the old file system are not on the new one"


def references(value: Any) -> set[str]:
    """The logical IDs a template value reads through Ref or Fn::GetAtt."""
    found: set[str] = set()
    if isinstance(value, dict):
        if set(value) == {"Ref"} and isinstance(value["Ref"], str):
            found.add(value["Ref"])
        elif set(value) == {"Fn::GetAtt"}:
            arg = value["Fn::GetAtt"]
            found.add(arg[0] if isinstance(arg, list) else str(arg).split(".")[0])
        for item in value.values():
            found |= references(item)
    elif isinstance(value, list):
        for item in value:
            found |= references(item)
    return found


def _resource(stack: str, raw: dict[str, Any]) -> ResourceChange:
    impact = raw["impact"]
    if impact == "NO_CHANGE" and any(p["old"] != p["new"] for p in raw["properties"]):
        impact = "WILL_UPDATE"  # a type without a CloudFormation spec (a custom resource): its handler runs
    return ResourceChange(
        stack=stack,
        logical_id=raw["logicalId"],
        path=_short_path(stack, raw["path"]),
        type=raw["newType"] or raw["oldType"],
        old_type=raw["oldType"],
        change=raw["change"],
        impact=impact,
        deletion_policy=raw["deletionPolicy"],
        properties=tuple(
            PropertyChange(
                p["name"],
                p["impact"],
                p["old"],
                p["new"],
                tuple(dict.fromkeys((v["stack"], replaced) for v in p["via"] for replaced in v["replaced"])),
            )
            for p in raw["properties"]
        ),
        other=tuple(raw["other"]),
    )


def _peer(rule: dict[str, Any]) -> str:
    peer = rule.get("peer") or {}
    return str(peer["ip"]) if peer.get("kind") == "cidr-ip" else str(rule["peerText"])


def _statement(change: str, stack: str, raw: dict[str, Any]) -> Statement:
    return Statement(
        change=change,
        stack=stack,
        effect=raw["effect"],
        principals=tuple(raw["principals"]["values"]),
        actions=tuple(raw["actions"]["values"]),
        not_actions=raw["actions"]["not"],
        resources=tuple(raw["resources"]["values"]),
        not_resources=raw["resources"]["not"],
        condition=raw["condition"],
        sources=tuple(dict.fromkeys((s["logicalId"], s["type"]) for s in raw["sources"])),
    )


def _short_path(stack: str, path: str | None) -> str | None:
    return path.removeprefix(f"{stack}/").removesuffix("/Resource") if path else None


def _acknowledgements(base: dict[str, Stack], head: dict[str, Stack]) -> list[AcknowledgementChange]:
    old = {key: reason for stack in base.values() for key, reason in stack.acknowledgements.items()}
    new = {key: reason for stack in head.values() for key, reason in stack.acknowledgements.items()}
    changes = [
        AcknowledgementChange("+", path, rule, new[(path, rule)]) for path, rule in new if (path, rule) not in old
    ]
    changes += [
        AcknowledgementChange("-", path, rule, old[(path, rule)]) for path, rule in old if (path, rule) not in new
    ]
    changes += [
        AcknowledgementChange("~", path, rule, new[(path, rule)], old[(path, rule)])
        for path, rule in new
        if (path, rule) in old and old[(path, rule)] != new[(path, rule)]
    ]
    return sorted(changes, key=lambda c: (c.path, c.rule, c.change))


def _machines(base: dict[str, Stack], head: dict[str, Stack], resources: list[ResourceChange]) -> list[MachineChange]:
    machine = "AWS::StepFunctions::StateMachine"
    touched = {(r.stack, r.logical_id) for r in resources if r.type == machine}
    changes = []
    for stack, logical_id in sorted(touched):
        old = base[stack].resources(machine).get(logical_id) if stack in base else None
        new = head[stack].resources(machine).get(logical_id) if stack in head else None
        side = head[stack] if new is not None else base[stack]
        path = side.path_of(logical_id)
        try:
            before = definition(old) if old is not None else None
            after = definition(new) if new is not None else None
        except DefinitionError as exc:
            changes.append(MachineChange(stack, logical_id, path, "changed", error=str(exc)))
            continue
        if before is None or after is None:
            present = after if after is not None else before
            count = len(present.get("States", {})) if present else 0
            changes.append(MachineChange(stack, logical_id, path, "added" if before is None else "removed", (), count))
            continue
        states = compare(before, after)
        if states:
            changes.append(MachineChange(stack, logical_id, path, "changed", tuple(states)))
    return changes


def exit_code(review: Review, *, allow_stateful: bool) -> int:
    """1 when a stateful resource would be replaced or removed (unless allowed), else 0."""
    return 1 if review.blocking and not allow_stateful else 0
