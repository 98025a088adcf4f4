"""Build the whole platform app: settings -> stacks -> tags -> cdk-nag. Used by app.py and the tests."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import Annotations, App, Environment, Tags, Validations, cx_api
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks

from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.network_stack import NetworkStack
from stacks.outputs import pipeline_stack_name
from stacks.pipeline_stack import PipelineStack
from stacks.settings import OVERRIDES_VARIABLE, PlatformSettings, SettingsError, settings_from_context

NO_APPROVAL_EMAIL = "platform:no-approval-email"
"""The id of the synth's warning that approvers are named and no approval e-mail goes to them."""


class Platform:
    """The app and its stacks, so tests can reach each one."""

    def __init__(self, app: App, settings: PlatformSettings, revision: str) -> None:
        self.app = app
        self.settings = settings
        env = Environment(account=settings.account, region=settings.region)
        prefix = settings.name_prefix
        self.network = NetworkStack(
            app, f"{prefix}-network", settings=settings, env=env, description="Training platform: network"
        )
        self.data = DataStack(
            app,
            f"{prefix}-data",
            settings=settings,
            network=self.network.network,
            env=env,
            description="Training platform: data (stateful)",
        )
        self.image = ImageStack(
            app,
            f"{prefix}-image",
            settings=settings,
            key=self.data.key,
            env=env,
            description="Training platform: training image (stateful)",
        )
        self.pipeline = PipelineStack(
            app,
            pipeline_stack_name(prefix),
            settings=settings,
            network=self.network,
            data=self.data,
            image=self.image,
            revision=revision,
            env=env,
            description="Training platform: training pipeline (state machine, approvals, budget, alarms)",
        )
        self.stacks = (self.network, self.data, self.image, self.pipeline)
        if settings.approvers and not settings.notifications.approval_emails:
            Annotations.of(self.pipeline).add_warning_v2(
                NO_APPROVAL_EMAIL,
                "approvers are named but notifications.approval_emails is empty: approvers learn of a pending "
                "decision (and its decision URL) only from the pipeline's outputs or the console",
            )

        tags = Tags.of(app)
        tags.add("platform", "distributed-training")
        tags.add("stage", settings.stage)
        tags.add("team", settings.tags.team)
        tags.add("cost-centre", settings.tags.cost_centre)

        for pack in (AwsSolutionsChecks(app), NIST80053R5Checks(app), HIPAASecurityChecks(app)):
            Validations.of(app).add_plugins(pack)

    def synth(self) -> cx_api.CloudAssembly:
        """Synthesize every stack; cdk-nag findings without an acknowledgement raise here."""
        return self.app.synth()


def build_platform(
    context: Mapping[str, Any] | None = None,
    outdir: str | None = None,
    *,
    revision: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Platform:
    """A fresh App from cdk.json-style context (tests pass their own; app.py passes none), with
    PLATFORM_CONTEXT's settings (make's CONTEXT=) merged over cdk.json's."""
    # cfn-lint itself checks every template (make synth, make test); CDK's built-in port of its
    # rules would repeat that and double the synth time.
    app = App(
        context=dict(context) if context is not None else None,
        outdir=outdir,
        builtin_cloud_formation_validation=False,
    )
    settings = settings_from_context(app.node.get_all_context(), environ.get(OVERRIDES_VARIABLE))
    return Platform(app, settings, revision=revision or platform_revision())


REVISION_FILE = Path(__file__).resolve().parents[1] / "REVISION"
_REVISION = re.compile(r"^\S{1,64}$")


def platform_revision(environ: Mapping[str, str] = os.environ, revision_file: Path = REVISION_FILE) -> str:
    """The platform's revision, recorded in every registered model's lineage.

    `PLATFORM_REVISION` in the environment (make deploy and make diff set it from git), else the
    first line of a REVISION file beside app.py (a release archive without .git carries one), else
    "unknown". Synth never asks git, so a commit alone does not change the templates.
    """
    value = environ.get("PLATFORM_REVISION")
    source = "PLATFORM_REVISION"
    if value is None and revision_file.is_file():
        lines = revision_file.read_text().splitlines()
        value, source = (lines[0].strip() if lines else ""), str(revision_file)
    if value is None:
        return "unknown"
    if not _REVISION.match(value):
        raise SettingsError(
            f"{source} is {value!r}: give a revision of 1 to 64 characters without spaces "
            "(e.g. the output of git rev-parse --short=12 HEAD)"
        )
    return value
