"""Read a synthesized cloud assembly: each stack's template and its cdk-nag acknowledgements."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACKNOWLEDGED = "aws:cdk:acknowledged-rules"


@dataclass(frozen=True)
class Stack:
    name: str
    template: dict[str, Any]
    # (construct path, rule) -> reason, as `Validations.of(scope).acknowledge` records them.
    acknowledgements: dict[tuple[str, str], str]

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template.get("Resources", {}).items() if v.get("Type") == type_}

    def path_of(self, logical_id: str) -> str | None:
        """The construct path of a resource, without the stack and the trailing `/Resource`."""
        resource = self.template.get("Resources", {}).get(logical_id)
        path = (resource or {}).get("Metadata", {}).get("aws:cdk:path")
        if not isinstance(path, str):
            return None
        return path.removeprefix(f"{self.name}/").removesuffix("/Resource")


def read_assembly(directory: Path) -> dict[str, Stack]:
    """The stacks of the assembly in `directory`, by stack name."""
    manifest = json.loads((directory / "manifest.json").read_text())
    stacks = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact["properties"]
        name = properties.get("stackName", artifact_id)
        template = json.loads((directory / properties["templateFile"]).read_text())
        metadata = artifact.get("metadata", {})
        if "additionalMetadataFile" in artifact:
            metadata = json.loads((directory / artifact["additionalMetadataFile"]).read_text())
        stacks[name] = Stack(name=name, template=template, acknowledgements=_acknowledgements(metadata))
    return stacks


def _acknowledgements(metadata: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], str]:
    found = {}
    for path, entries in metadata.items():
        for entry in entries:
            if entry.get("type") == ACKNOWLEDGED:
                for rule, reason in entry["data"].items():
                    found[(path.lstrip("/"), rule)] = str(reason)
    return found
