"""The pipeline's grants on the teams' AWS Batch queue (stacks/constructs/team_queue.py)."""

from __future__ import annotations

from aws_cdk import aws_iam as iam

from stacks.pipeline.context import PipelineContext


def grant_service_jobs(context: PipelineContext, principal: iam.IRole, *, execution_role: iam.IRole) -> None:
    """Let `principal` submit, follow and terminate the teams' service jobs run as `execution_role`; nothing
    without teams."""
    if context.teams is not None:
        context.teams.grant_service_jobs(principal, execution_role=execution_role)
