"""Build the whole platform app: settings -> stacks -> tags -> cdk-nag. Used by app.py and the tests."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Environment, Tags, Validations, cx_api
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks

from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.network_stack import NetworkStack
from stacks.pipeline_stack import PipelineStack
from stacks.settings import PlatformSettings, settings_from_context


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
            f"{prefix}-pipeline",
            settings=settings,
            network=self.network,
            data=self.data,
            image=self.image,
            revision=revision,
            env=env,
            description="Training platform: training pipeline (state machine, approvals, budget, alarms)",
        )
        self.stacks = (self.network, self.data, self.image, self.pipeline)

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


def build_platform(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> Platform:
    """A fresh App from cdk.json-style context (tests pass their own; app.py passes none)."""
    # cfn-lint itself checks every template (make synth, make test); CDK's built-in port of its
    # rules would repeat that and double the synth time.
    app = App(
        context=dict(context) if context is not None else None,
        outdir=outdir,
        builtin_cloud_formation_validation=False,
    )
    settings = settings_from_context(app.node.get_all_context())
    return Platform(app, settings, revision=git_revision())


def git_revision() -> str:
    """The platform's commit, recorded in every registered model's lineage ("unknown" outside git)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"
