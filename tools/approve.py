#!/usr/bin/env python3
"""Decide a training platform approval request with your AWS credentials.

The decision URL (the approvals notification names it) accepts only SigV4-signed requests from
the approver principals configured in the platform settings, and every request carries a proof
of who you are that STS attests, bound to exactly what you ask (see lambdas/approvals/identity.py).
This signs both with whatever credentials boto3 finds (profile, SSO, environment).

    python tools/approve.py --url https://<id>.lambda-url.<region>.on.aws/ list [--limit 20] [--cursor <next>]
    python tools/approve.py --url ... approve <request id> --reason "budget confirmed"
    python tools/approve.py --url ... reject <request id> --reason "dataset not reviewed yet"
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's own modules, from tools/
from lambdas.approvals import identity
from lambdas.approvals.store import PAGE_SIZE

_URL = re.compile(r"^https://[a-z0-9]+\.lambda-url\.([a-z0-9-]+)\.on\.aws/?$")


def _credentials(session: Any) -> Any:
    credentials = session.get_credentials()
    if credentials is None:
        raise SystemExit("no AWS credentials found: sign in (e.g. aws sso login) and try again")
    return credentials.get_frozen_credentials()


def signed_request(
    url: str, method: str, body: dict[str, Any] | None, session: Any, *, query: dict[str, str] | None = None
) -> urllib.request.Request:
    """The call to the decision URL: an identity proof for what it asks, the whole request SigV4-signed."""
    match = _URL.match(url)
    if match is None:
        raise SystemExit(f"{url} is not a Lambda function URL (https://<id>.lambda-url.<region>.on.aws/)")
    region = match.group(1)
    credentials = _credentials(session)
    if method == "GET":
        page = {"cursor": (query or {}).get("cursor", ""), "limit": (query or {}).get("limit", str(PAGE_SIZE))}
        asked = identity.binding("list", page)
    else:
        asked = identity.binding(
            "decide", {k: str((body or {}).get(k, "")) for k in ("request_id", "decision", "reason")}
        )
    full_url = url + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    headers = {
        "content-type": "application/json",
        identity.PROOF_HEADER: identity.make_proof(credentials, region, asked),
    }
    request = AWSRequest(method=method, url=full_url, data=data, headers=headers)
    SigV4Auth(credentials, "lambda", region).add_auth(request)
    return urllib.request.Request(full_url, data=data, headers=dict(request.headers), method=method)  # noqa: S310


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the decision URL from the approval notification")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list pending requests, newest first")
    listing.add_argument("--cursor", help="the `next` value of the previous page")
    listing.add_argument("--limit", type=int, help=f"requests per page (1-{PAGE_SIZE})")
    for decision in ("approve", "reject"):
        command = commands.add_parser(decision, help=f"{decision} a request")
        command.add_argument("request_id")
        command.add_argument("--reason", required=True, help="recorded with the decision (at most 512 characters)")
    args = parser.parse_args(argv)

    if args.command == "list":
        page = {"cursor": args.cursor, "limit": None if args.limit is None else str(args.limit)}
        query = {k: v for k, v in page.items() if v} or None
        request = signed_request(args.url, "GET", None, boto3.Session(), query=query)
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
