#!/usr/bin/env python3
"""Decide a training platform approval request with your AWS credentials.

The decision URL (the approvals notification names it) accepts only SigV4-signed requests from
the approver principals configured in the platform settings; this signs with whatever
credentials boto3 finds (profile, SSO, environment).

    python tools/approve.py --url https://<id>.lambda-url.<region>.on.aws/ list
    python tools/approve.py --url ... approve <request id> --reason "budget confirmed"
    python tools/approve.py --url ... reject <request id> --reason "dataset not reviewed yet"
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from typing import Any

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

_URL = re.compile(r"^https://[a-z0-9]+\.lambda-url\.([a-z0-9-]+)\.on\.aws/?$")


def signed_request(url: str, method: str, body: dict[str, Any] | None, session: Any) -> urllib.request.Request:
    match = _URL.match(url)
    if match is None:
        raise SystemExit(f"{url} is not a Lambda function URL (https://<id>.lambda-url.<region>.on.aws/)")
    credentials = session.get_credentials()
    if credentials is None:
        raise SystemExit("no AWS credentials found: sign in (e.g. aws sso login) and try again")
    data = json.dumps(body).encode() if body is not None else None
    request = AWSRequest(method=method, url=url, data=data, headers={"content-type": "application/json"})
    SigV4Auth(credentials.get_frozen_credentials(), "lambda", match.group(1)).add_auth(request)
    return urllib.request.Request(url, data=data, headers=dict(request.headers), method=method)  # noqa: S310


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the decision URL from the approval notification")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list pending requests")
    for decision in ("approve", "reject"):
        command = commands.add_parser(decision, help=f"{decision} a request")
        command.add_argument("request_id")
        command.add_argument("--reason", required=True, help="recorded with the decision")
    args = parser.parse_args(argv)

    if args.command == "list":
        request = signed_request(args.url, "GET", None, boto3.Session())
    else:
        body = {"request_id": args.request_id, "decision": args.command, "reason": args.reason}
        request = signed_request(args.url, "POST", body, boto3.Session())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - https only, checked above
            print(json.dumps(json.loads(response.read()), indent=2))
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code}: {exc.read().decode()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
