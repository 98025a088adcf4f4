"""`make outputs`: print the pipeline stack's outputs of a deployed stage (needs AWS credentials).

The stage comes from the settings (cdk.json's `platform`, with make's CONTEXT= merged over it);
the Region from the settings or the AWS environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import boto3

from stacks.outputs import OUTPUTS, pipeline_stack_name
from stacks.settings import OVERRIDES_VARIABLE, SettingsError, settings_from_context

REPO = Path(__file__).resolve().parents[1]


class OutputsError(RuntimeError):
    """The stage's pipeline stack cannot be read; the message says why."""


def read_outputs(cloudformation: Any, stack_name: str) -> dict[str, str]:
    """The stack's outputs by key, in stacks/outputs.py's order; a missing one is an error."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except cloudformation.exceptions.ClientError as exc:
        raise OutputsError(f"cannot describe {stack_name}: {exc} (is the stage deployed in this Region?)") from None
    found = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    missing = [key for key in OUTPUTS if key not in found]
    if missing:
        raise OutputsError(f"{stack_name} has no output {', '.join(missing)}: deploy this revision (make deploy)")
    return {key: found[key] for key in OUTPUTS}


def render(outputs: dict[str, str]) -> str:
    width = max(map(len, outputs))
    return "\n".join(f"{key:<{width}}  {value}" for key, value in outputs.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    args = parser.parse_args(argv)
    try:
        context = json.loads((REPO / "cdk.json").read_text())["context"]
        settings = settings_from_context(context, os.environ.get(OVERRIDES_VARIABLE))
        session = boto3.Session(region_name=settings.region) if settings.region else boto3.Session()
        outputs = read_outputs(session.client("cloudformation"), pipeline_stack_name(settings.name_prefix))
    except (SettingsError, OutputsError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(outputs, indent=2) if args.json else render(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
