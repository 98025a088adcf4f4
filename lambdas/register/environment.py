"""The Register handler's environment (stacks/pipeline/outcome.py sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class RegisterEnvironment(HandlerEnvironment):
    artifacts_bucket: str
    """Where the lineage, dataset versions and metrics are written."""
    model_package_group: str
    image_uri: str
    platform_revision: str
    """The platform's git revision, recorded in the lineage."""
