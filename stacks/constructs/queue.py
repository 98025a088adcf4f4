"""Teams' SageMaker training jobs queued in AWS Batch: a quota-managed service environment, its queue, a share each.

Batch runs a service job as a SageMaker training job once the service environment has capacity of its
instance type; each team's quota share holds its capacity limits and how it lends and borrows idle
capacity. What submits to the queue is granted by `grant_service_jobs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Stack
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from constructs import Construct

from contract.service_requests import TEAM_TAG
from lambdas.queue.waits import BLOCKED
from stacks.constructs.nag import acknowledge_wildcard
from stacks.settings import TeamSettings


class TeamQueue(Construct):
    """The scheduling policy, service environment (of `capacity`), job queue and one quota share per team; a job
    blocked at the queue's head is terminated after `max_wait_minutes`."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        capacity: Mapping[str, int],
        teams: Sequence[TeamSettings],
        max_wait_minutes: int,
    ) -> None:
        super().__init__(scope, id_)
        self.policy = batch.CfnSchedulingPolicy(
            self,
            "SchedulingPolicy",
            quota_share_policy=batch.CfnSchedulingPolicy.QuotaSharePolicyProperty(
                idle_resource_assignment_strategy="FIFO"
            ),
        )
        self.environment = batch.CfnServiceEnvironment(
            self,
            "ServiceEnvironment",
            service_environment_type="SAGEMAKER_TRAINING",
            # Quota-managed: one limit per instance type, the type as the unit.
            capacity_limits=[
                batch.CfnServiceEnvironment.CapacityLimitProperty(capacity_unit=type_, max_capacity=count)
                for type_, count in sorted(capacity.items())
            ],
        )
        self.queue = batch.CfnJobQueue(
            self,
            "Queue",
            priority=1,
            job_queue_type="SAGEMAKER_TRAINING",
            scheduling_policy_arn=self.policy.attr_arn,
            service_environment_order=[
                batch.CfnJobQueue.ServiceEnvironmentOrderProperty(
                    order=1, service_environment=self.environment.attr_service_environment_arn
                )
            ],
            # A job blocked at the head of the queue (too few instances, more than the environment or its share
            # holds) is terminated after `max_wait_minutes`, and the next job moves up (lambdas/queue/waits.py).
            job_state_time_limit_actions=[
                batch.CfnJobQueue.JobStateTimeLimitActionProperty(
                    action="TERMINATE", max_time_seconds=60 * max_wait_minutes, reason=reason, state="RUNNABLE"
                )
                for reason in BLOCKED
            ],
        )
        self.shares: dict[str, batch.CfnQuotaShare] = {team.name: self._share(team) for team in teams}

    @property
    def queue_arn(self) -> str:
        return self.queue.attr_job_queue_arn

    def share_arn(self, team: str) -> str:
        """The team's quota share ARN (job-queue/<queue>/quota-share/<team>)."""
        return self.shares[team].attr_quota_share_arn

    def _share(self, team: TeamSettings) -> batch.CfnQuotaShare:
        share = team.quota_share
        return batch.CfnQuotaShare(
            self,
            f"Share-{team.name}",
            # SubmitServiceJob names the share: the team's name is what the pipeline passes.
            quota_share_name=team.name,
            job_queue=self.queue.attr_job_queue_arn,
            capacity_limits=[
                batch.CfnQuotaShare.QuotaShareCapacityLimitProperty(capacity_unit=type_, max_capacity=count)
                for type_, count in sorted(share.capacity.items())
            ],
            resource_sharing_configuration=batch.CfnQuotaShare.QuotaShareResourceSharingConfigurationProperty(
                strategy=share.sharing, borrow_limit=share.borrow_limit_percent
            ),
            preemption_configuration=batch.CfnQuotaShare.QuotaSharePreemptionConfigurationProperty(
                in_share_preemption="ENABLED" if share.in_share_preemption else "DISABLED"
            ),
            tags={TEAM_TAG: team.name},
        )

    def grant_terminate(self, principal: iam.IRole) -> None:
        """Terminate the teams' service jobs (those tagged with one of the platform's teams)."""
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="TerminateServiceJobs",
                actions=["batch:TerminateServiceJob"],
                resources=[self.service_jobs],
                conditions={"StringEquals": {f"aws:ResourceTag/{TEAM_TAG}": sorted(self.shares)}},
            )
        )
        acknowledge_wildcard(
            principal,
            self.service_jobs,
            "Service job IDs are Batch's, known only after submission; submitting and terminating are limited "
            f"by condition to jobs tagged with one of the platform's teams ({TEAM_TAG}).",
        )

    @property
    def service_jobs(self) -> str:
        stack = Stack.of(self)
        return f"arn:{stack.partition}:batch:{stack.region}:{stack.account}:service-job/*"

    def grant_service_jobs(self, principal: iam.IRole, *, execution_role: iam.IRole) -> None:
        """Submit SageMaker training service jobs to the teams' shares (tagged with their team) and pass them the
        SageMaker execution role; following and terminating them is the queue step's handlers'."""
        teams = sorted(self.shares)
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SubmitServiceJobs",
                # The queue, the share and the new job are each authorized; tagging on create is TagResource.
                actions=["batch:SubmitServiceJob", "batch:TagResource"],
                resources=[self.queue_arn, *(self.share_arn(t) for t in teams), self.service_jobs],
                conditions={"StringEquals": {f"aws:RequestTag/{TEAM_TAG}": teams}},
            )
        )
        # A submit that failed finds the job it may have queued by name; the reference lets ListServiceJobs name
        # no resource.
        principal.add_to_principal_policy(
            iam.PolicyStatement(sid="FindServiceJobs", actions=["batch:ListServiceJobs"], resources=["*"])
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="PassTheTrainingRoleToServiceJobs",
                actions=["iam:PassRole"],
                resources=[execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        acknowledge_wildcard(
            principal,
            self.service_jobs,
            "Service job IDs are Batch's, known only after submission; submitting is limited by condition to jobs "
            f"tagged with one of the platform's teams ({TEAM_TAG}).",
        )
