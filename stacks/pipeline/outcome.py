"""After training: evaluation against the run's quality gate, registration with lineage, promotion.

A model below its gate is not registered. A registered model version waits for a promotion
decision; approval or rejection is written to the model package (ModelApprovalStatus), so a
deployment pipeline watching the group sees only approved versions. An approved version is approved
only while its model archive and lineage still hold the bytes registration pinned (lambdas/register/verify.py);
otherwise it is rejected with the cause.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from contract.execution_state import (
    ESTIMATE,
    EVALUATION,
    JOB,
    PROMOTION_APPROVAL,
    REGISTRATION,
    REQUEST,
    RESUMED,
    RUN,
)
from contract.layout import ANY_LINEAGE, ANY_OUTPUT
from lambdas.register.environment import RegisterEnvironment
from lambdas.register.verify import ModelChangedError
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import LAMBDA_TASK_TIMEOUT, SAGEMAKER_TRANSIENT, SDK, invoke, retry
from stacks.pipeline.approvals import Approvals, decided
from stacks.pipeline.parts import Buckets, Handlers, Notifier, obj, stack_arn, string
from stacks.pipeline.polled_job import list_runs


class Evaluation(Construct):
    """`start` compares the finished job's final metrics with the request's quality gate."""

    def __init__(self, scope: Construct, id_: str, *, handlers: Handlers, notifier: Notifier) -> None:
        super().__init__(scope, id_)
        self.evaluate = handlers.function(
            "Evaluate",
            "lambdas.evaluate.handler.handler",
            "Compares a finished job's final metrics with the run's quality gate",
            {},
        )
        self.start = invoke(
            self,
            "Evaluate model",
            self.evaluate,
            {"quality": obj(REQUEST.quality), "final_metrics": obj(JOB.final_metrics)},
            str(EVALUATION),
        )
        self._below = notifier.notify(
            self,
            "Notify below quality",
            subject="Training run finished below its quality gate: not registered",
            fields={"evaluation": obj(EVALUATION)},
        ).next(
            sfn.Fail(self, "Below quality threshold", error="QualityBelowThreshold", cause_path=str(EVALUATION.reason))
        )

    @property
    def functions(self) -> list[PlatformFunction]:
        return [self.evaluate]

    def then(self, passed: sfn.IChainable) -> None:
        """Where a model that meets its gate goes."""
        self.start.next(
            sfn.Choice(self, "Quality gate met?")
            .when(sfn.Condition.boolean_equals(str(EVALUATION.passed), True), passed)
            .otherwise(self._below)
        )


class Registration(Construct):
    """`start` registers the model version in the platform's model package group, with its lineage."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        handlers: Handlers,
        buckets: Buckets,
        registry: sagemaker.CfnModelPackageGroup,
        image_uri: str,
        revision: str,
    ) -> None:
        """`revision`: the platform's, recorded in every registered model's lineage."""
        super().__init__(scope, id_)
        group = registry.model_package_group_name
        self.packages = stack_arn(self, "sagemaker", f"model-package/{group}/*")
        """The versions of the platform's model package group."""
        self.register = handlers.function(
            "Register",
            "lambdas.register.handler.handler",
            "Registers the trained model with its lineage",
            RegisterEnvironment(
                artifacts_bucket=buckets.artifacts.bucket_name,
                model_package_group=group,
                image_uri=image_uri,
                platform_revision=revision,
            ).variables(),
            timeout=Duration.minutes(5),
        )
        lineage = f"{buckets.artifacts.bucket_arn}/{ANY_LINEAGE}"
        models = f"{buckets.artifacts.bucket_arn}/{ANY_OUTPUT}"
        function = self.register.function
        # Lineage lists the dataset's object versions (it reads no dataset object) and writes its records
        # once; a retried Register reads back a record to see whether its execution wrote it.
        for sid, actions, resources in (
            ("DatasetVersions", ["s3:ListBucketVersions"], [buckets.datasets.bucket_arn]),
            ("WriteLineage", ["s3:PutObject", "s3:GetObject", "s3:GetObjectVersion"], [lineage]),
            ("PinModels", ["s3:GetObject", "s3:GetObjectVersion"], [models]),
        ):
            function.add_to_role_policy(iam.PolicyStatement(sid=sid, actions=actions, resources=resources))
        # The run's goodput ledgers, one per job, are listed under its lineage and read (WriteLineage).
        function.add_to_role_policy(list_runs(buckets.artifacts.bucket_arn, "ListRunLedgers"))
        buckets.key.grant(function, "kms:GenerateDataKey", "kms:Decrypt")
        function.add_to_role_policy(
            iam.PolicyStatement(
                sid="RegisterModels",
                actions=["sagemaker:CreateModelPackage", "sagemaker:AddTags"],
                resources=[self.packages, registry.attr_model_package_group_arn],
            )
        )
        for resource, reason in {
            lineage: "Lineage files are written under runs/<job>/lineage/ of the run being registered.",
            self.packages: "New model package versions in the platform's one model package group.",
            models: "Reads the registered job's model archive (runs/<job>/output/) to pin its version and digest.",
        }.items():
            acknowledge_wildcard(self.register.role, resource, reason)
        self.verify = self._verifier(handlers, buckets, lineage=lineage, models=models)
        self.start = invoke(
            self,
            "Register model",
            self.register,
            {
                "request": obj(REQUEST),
                "job": obj(JOB),
                "estimate": obj(ESTIMATE),
                "evaluation": obj(EVALUATION),
                "execution": string(RUN.execution),
                "resumed": obj(RESUMED),
            },
            str(REGISTRATION),
        )

    def _verifier(self, handlers: Handlers, buckets: Buckets, *, lineage: str, models: str) -> PlatformFunction:
        """VerifyModel: reads a package's pins and what its artifacts' keys hold now, before promotion."""
        verify = handlers.function(
            "VerifyModel",
            "lambdas.register.verify.handler",
            "Checks that a registered model's archive and lineage still hold the bytes registration pinned",
            {},
            timeout=Duration.minutes(15),
        )
        verify.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="ReadPinnedArtifacts", actions=["s3:GetObject", "s3:GetObjectVersion"], resources=[lineage, models]
            )
        )
        verify.function.add_to_role_policy(
            iam.PolicyStatement(sid="ReadModels", actions=["sagemaker:DescribeModelPackage"], resources=[self.packages])
        )
        buckets.key.grant(verify.function, "kms:Decrypt")
        for resource, reason in {
            lineage: "Reads the lineage record of the model version to promote, by the version it pins.",
            models: "Reads the model archive of the version to promote, under runs/<job>/output/, to check its bytes.",
            self.packages: "Describes the model package version to promote, in the platform's one group.",
        }.items():
            acknowledge_wildcard(verify.role, resource, reason)
        return verify

    @property
    def functions(self) -> list[PlatformFunction]:
        return [self.register, self.verify]


class Promotion(Construct):
    """`start` asks an approver to promote the registered version; the decision is written to it."""

    def __init__(
        self, scope: Construct, id_: str, *, notifier: Notifier, approvals: Approvals, registration: Registration
    ) -> None:
        super().__init__(scope, id_)
        self._packages = registration.packages
        no_decision = self._set_approval("Reject model (no decision)", "Rejected", "No decision in time")
        self.start, promoted = approvals.gate.gate(
            self,
            "Approval gate (promotion)",
            name="promotion",
            summary={
                "model_package": string(REGISTRATION.model_package_arn),
                "evaluation": string(EVALUATION.reason),
                "lineage": string(REGISTRATION.lineage_uri),
                "code": string(REQUEST.code_summary),
            },
            result=PROMOTION_APPROVAL,
            on_timeout=no_decision.next(approvals.timed_out),
        )
        approve = self._set_approval("Approve model", "Approved", decided("Approved", PROMOTION_APPROVAL))
        succeeded = notifier.notify(
            self,
            "Notify success",
            subject="Training run finished: model registered and approved",
            fields={
                "model_package": string(REGISTRATION.model_package_arn),
                "lineage": string(REGISTRATION.lineage_uri),
                "metrics": obj(JOB.final_metrics),
                "estimate": obj(ESTIMATE),
            },
        ).next(sfn.Succeed(self, "Model promoted"))
        reject = self._set_approval("Reject model", "Rejected", decided("Rejected", PROMOTION_APPROVAL))
        rejected = approvals.rejected(
            self,
            PROMOTION_APPROVAL,
            subject="Trained model rejected at promotion",
            state="Promotion rejected",
            error="PromotionRejected",
        )
        verify = invoke(
            self,
            "Verify model bytes",
            registration.verify,
            {"model_package_arn": string(REGISTRATION.model_package_arn)},
            sfn.JsonPath.DISCARD,
        )
        verify.add_catch(self._changed(notifier), errors=[ModelChangedError.__name__], result_path="$.error")
        self.start.next(
            sfn.Choice(self, "Promotion approved?")
            .when(promoted, verify.next(approve).next(succeeded))
            .otherwise(reject.next(rejected))
        )

    def _changed(self, notifier: Notifier) -> sfn.Chain:
        """A model whose bytes changed since registration: rejected in the registry, the run told why, failed."""
        reject = self._set_approval("Reject model (changed)", "Rejected", "Changed after registration")
        notify = notifier.notify(
            self,
            "Notify model changed",
            subject="Trained model not promoted: its bytes changed after registration",
            fields={
                "model_package": string(REGISTRATION.model_package_arn),
                "cause": sfn.JsonPath.string_at("$.error.Cause"),
            },
        )
        failed = sfn.Fail(self, "Model changed", error="ModelChanged", cause_path="$.error.Cause")
        return reject.next(notify).next(failed)

    def _set_approval(self, id_: str, status: str, description: str) -> tasks.CallAwsService:
        approval = tasks.CallAwsService(
            self,
            id_,
            service="sagemaker",
            action="updateModelPackage",
            parameters={
                "ModelPackageArn": string(REGISTRATION.model_package_arn),
                "ModelApprovalStatus": status,
                "ApprovalDescription": description,
            },
            iam_resources=[self._packages],
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(LAMBDA_TASK_TIMEOUT),
        )
        retry(approval, SAGEMAKER_TRANSIENT, SDK)  # setting the same status again is the same update
        return approval
