"""`make outputs`: print the pipeline stack's outputs of a deployed stage (needs AWS credentials).

The stage comes from the settings (cdk.json's `platform`, with make's CONTEXT= merged over it);
the Region from the settings or the AWS environment (tools/aws_session.py). What a user can cause (no Region,
no credentials, an endpoint out of reach) is said in a line with its fix (`--debug`: the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from stacks.outputs import OUTPUTS, pipeline_stack_name
from stacks.settings import OVERRIDES_VARIABLE, SettingsError, settings_from_context
from tools import aws_session
from tools.cli_errors import explain

REPO = Path(__file__).resolve().parents[1]


class OutputsError(RuntimeError):
    """The stage's pipeline stack cannot be read; the message says why."""


def read_outputs(cloudformation: Any, stack_name: str) -> dict[str, str]:
    """The stack's outputs by key, in stacks/outputs.py's order; a missing one is an error."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except cloudformation.exceptions.ClientError as exc:
        if "does not exist" not in str(exc):
            raise  # a refusal: said with its fix by the entry point
        region = cloudformation.meta.region_name
        raise OutputsError(
            f"{stack_name} is not deployed in {region}: deploy it (make deploy) or name its Region"
        ) from None
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
    parser.add_argument("--debug", action="store_true", help="on an error, show its traceback, not its explanation")
    args = parser.parse_args(argv)
    try:
        context = json.loads((REPO / "cdk.json").read_text())["context"]
        settings = settings_from_context(context, os.environ.get(OVERRIDES_VARIABLE))
        session = aws_session.session(settings_region=settings.region)
        outputs = read_outputs(session.client("cloudformation"), pipeline_stack_name(settings.name_prefix))
    except (SettingsError, OutputsError) as exc:
        print(exc, file=sys.stderr)
        return 1
    except Exception as exc:
        said = explain(exc)
        if said is None or args.debug:
            raise
        print(said, file=sys.stderr)
        return 1
    print(json.dumps(outputs, indent=2) if args.json else render(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
