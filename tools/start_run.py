#!/usr/bin/env python3
"""Start a training run with a proof of who starts it (needed where pipeline.forbid_self_approval is on).

The proof is an STS GetCallerIdentity request signed with your credentials and bound to this state
machine, execution name and input (lambdas/validate/start_proof.py). Validate has STS attest it,
accepts it within 5 minutes of signing and for this one execution only, and the approval gates
then refuse your own decisions on the run.

    python tools/start_run.py --state-machine <TrainingPipeline ARN> --name gpt2-124m-001 \\
        --input examples/single-node-ddp.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's own modules, from tools/
from lambdas.validate import start_proof


def with_proof(execution_input: dict[str, Any], state_machine: str, name: str, session: Any) -> dict[str, Any]:
    """The input plus `requester_proof`, bound to this state machine, execution name and input."""
    credentials = session.get_credentials()
    if credentials is None:
        raise SystemExit("no AWS credentials found: sign in (e.g. aws sso login) and try again")
    return start_proof.attach(
        execution_input,
        state_machine=state_machine,
        execution_name=name,
        credentials=credentials.get_frozen_credentials(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-machine", required=True, help="the TrainingPipeline state machine ARN")
    parser.add_argument("--name", required=True, help="the execution name (unique per state machine)")
    parser.add_argument("--input", required=True, type=Path, help="the execution input JSON file")
    args = parser.parse_args(argv)
    region = args.state_machine.split(":")[3]
    execution_input = json.loads(args.input.read_text())
    if not isinstance(execution_input, dict):
        raise SystemExit(f"{args.input} must hold a JSON object (README: Starting a training run)")
    session = boto3.Session(region_name=region)
    started = session.client("stepfunctions").start_execution(
        stateMachineArn=args.state_machine,
        name=args.name,
        input=json.dumps(with_proof(execution_input, args.state_machine, args.name, session)),
    )
    print(started["executionArn"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
