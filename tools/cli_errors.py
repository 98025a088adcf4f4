"""What a person at a terminal can cause, said in a line or two with the fix: the errors of reaching AWS and the
decision URL (no Region, no or expired credentials, an endpoint or decision URL out of reach, throttling, a
refusal), for every command of `tp` and `make outputs`.

`explain` is the one place that turns such an error into words; the commands raise, and their entry point
prints what `explain` says and exits 1 (`--debug` shows the traceback instead). Anything `explain` does not
know is a fault of ours and keeps its traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
    SSLError,
    SSOError,
    TokenRetrievalError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from botocore.parsers import ResponseParserError

from lambdas.shared.errors import is_transient
from stacks.outputs import BUDGET_STOP, TEAM_BUDGET

REGION_FIX = "pass --region, or set AWS_REGION (or TP_REGION, AWS_DEFAULT_REGION, or a region in your AWS profile)"
SIGN_IN = "sign in (aws sso login, or AWS_PROFILE naming a profile of ~/.aws/config) and try again"

# Codes AWS answers a request signed with credentials it no longer (or never) accepts.
_EXPIRED = {
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
}
_DENIED = {"AccessDenied", "AccessDeniedException", "AuthorizationError", "UnauthorizedOperation", "Forbidden"}


class UserError(Exception):
    """A condition the person can fix (a name not found, a decision URL out of reach); the message says how."""


def explain(error: BaseException, *, budget_contact: Callable[[str | None], str] | None = None) -> str | None:
    """The error in a line or two with its fix, or None for an error no user causes (a fault: keep its traceback).

    `budget_contact(team)` names whom to ask about a budget stop's deny (a team's, or the platform's for None).
    """
    if isinstance(error, UserError):
        return str(error)
    if isinstance(error, ClientError):
        return _refused(error, budget_contact)
    if isinstance(error, BotoCoreError):
        return _unreached(error)
    if isinstance(error, ResponseParserError):
        return (
            "the endpoint did not answer as AWS does (an error page?): if AWS_ENDPOINT_URL is set, it must name an AWS "
            "endpoint (the local platform's: `make demo ARGS=--serve`)"
        )
    return None


def _unreached(error: BotoCoreError) -> str | None:
    endpoint = error.kwargs.get("endpoint_url", "the AWS endpoint")
    said: list[tuple[type[BaseException] | tuple[type[BaseException], ...], str]] = [
        (NoRegionError, f"no AWS Region: {REGION_FIX}"),
        ((NoCredentialsError, PartialCredentialsError), f"no AWS credentials found ({error}): {SIGN_IN}"),
        (ProfileNotFound, f"{error}: name one that `aws configure list-profiles` lists, or unset AWS_PROFILE"),
        (
            (SSOError, TokenRetrievalError, CredentialRetrievalError),
            f"your AWS sign-in has expired or cannot be read ({error}): {SIGN_IN}",
        ),
        (
            SSLError,
            f"{error}: the endpoint's certificate is not trusted; AWS_CA_BUNDLE names the certificate to trust (the "
            "local platform's, for `make demo ARGS=--serve`)",
        ),
        (
            EndpointConnectionError,
            f"cannot reach {endpoint} (AWS_ENDPOINT_URL): start what it names (the local platform: `make demo "
            "ARGS=--serve`), or unset it to reach AWS"
            if os.environ.get("AWS_ENDPOINT_URL")
            else f"cannot reach {endpoint}: check the network, and that the Region is the stage's ({REGION_FIX})",
        ),
        (
            (BotocoreConnectionError, ConnectionClosedError, ReadTimeoutError),
            f"{error}: the endpoint did not answer in time; try again in a minute",
        ),
    ]
    return next((words for kinds, words in said if isinstance(error, kinds)), None)


def _refused(error: ClientError, budget_contact: Callable[[str | None], str] | None) -> str:
    details = error.response.get("Error", {})
    code, message = str(details.get("Code", "")), str(details.get("Message", ""))
    said = f"{error.operation_name}: {code}: {message}"
    if code in _EXPIRED:
        return f"{said}\nyour AWS credentials have expired or are not valid here: {SIGN_IN}"
    if code in _DENIED and budget_contact is not None and (kind := budget_stop(message)) is not None:
        return budget_refusal(kind, None, budget_contact)
    if code in _DENIED:
        return f"{said}\nask the platform team for this permission, or sign in as a role that has it"
    if is_transient(error):
        return f"{said}\nAWS is busy or throttling these calls: wait a minute and try again"
    return said


def budget_stop(text: str) -> str | None:
    """Whether `text` (an AWS refusal, a run's failure cause) is a budget stop's explicit deny: "team" (a team's
    stop), "platform" (the platform's), or None for anything else."""
    if "explicit deny" not in text:
        return None
    if re.search(rf"{TEAM_BUDGET}[A-Za-z0-9]*StopDeny", text):
        return "team"
    if f"{BUDGET_STOP}Deny" in text:
        return "platform"
    return None


def budget_refusal(kind: str, team: str | None, budget_contact: Callable[[str | None], str]) -> str:
    """A budget stop's deny in words: whose budget, what it stops, and whom to ask."""
    whose = (
        "the platform's monthly budget"
        if kind == "platform"
        else f"team {team}'s monthly budget"
        if team
        else "your team's monthly budget"
    )
    return (
        f"{whose} is spent: AWS Budgets has stopped new training jobs (jobs already training keep running). "
        f"Ask {budget_contact(team if kind == 'team' else None)} to raise the budget or to reverse the budget action."
    )
