"""How the tools find the Region and reach AWS: one rule for `tp` and `make outputs`.

The Region is, in order: the one the command is given (`--region`), the settings' `region` (where the stage is
deployed, when they name one), then TP_REGION, AWS_REGION, AWS_DEFAULT_REGION, and the AWS profile's. botocore
reads only the last two; AWS_REGION is what the AWS SDKs of other languages and AWS's own runtimes set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import boto3
from botocore.exceptions import NoRegionError

REGION_VARIABLES = ("TP_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")


@dataclass(frozen=True)
class FoundRegion:
    name: str | None
    source: str
    """Where it was found: "--region", "the settings", an environment variable's name, or "the AWS profile"."""


def find_region(given: str | None = None, *, settings_region: str | None = None) -> FoundRegion:
    """The Region by the rule above, and where it came from; FoundRegion(None, "") when nothing names one."""
    if given:
        return FoundRegion(given, "--region")
    if settings_region:
        return FoundRegion(settings_region, "the settings")
    for variable in REGION_VARIABLES:
        if os.environ.get(variable):
            return FoundRegion(os.environ[variable], variable)
    profile = boto3.Session().region_name  # the profile's (AWS_DEFAULT_REGION is read above)
    return FoundRegion(profile, "the AWS profile") if profile else FoundRegion(None, "")


def session(given: str | None = None, *, settings_region: str | None = None) -> boto3.Session:
    """A boto3 session in the Region found; NoRegionError (tools/cli_errors.py says how to name one) if none is."""
    region = find_region(given, settings_region=settings_region).name
    if region is None:
        raise NoRegionError()
    return boto3.Session(region_name=region)
