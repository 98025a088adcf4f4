#!/usr/bin/env python3
"""The CDK app: settings -> stacks -> tags -> cdk-nag. Configuration lives in cdk.json (`platform`)."""

import sys

from stacks.app_builder import build_platform
from stacks.settings import SettingsError

if __name__ == "__main__":
    try:
        platform = build_platform()
    except SettingsError as exc:
        sys.exit(str(exc))
    platform.app.synth()
