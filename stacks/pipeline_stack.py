"""Pipeline stack: the training state machine, its handlers, approval gates, notifications, budget, alarms.

An ML engineer starts an execution with a small JSON input (README: "Starting a training run");
the state machine validates it, estimates its cost, asks for approval when it is expensive,
runs the SageMaker training job to its end, evaluates it, registers the model with its lineage
and asks for promotion.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from stacks.constructs.approval_gate import ApprovalGate
from stacks.constructs.cost_controls import COST_TAG, PipelineAlarms, PlatformBudget
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.constructs.function import PlatformFunction
from stacks.constructs.logs import encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.constructs.notifications import PlatformTopics
from stacks.constructs.tasks import invoke
from stacks.constructs.training_job import DistributedTrainingJob
from stacks.constructs.training_step import SageMakerTrainingStep
from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.naming import bucket_name
from stacks.network_stack import NetworkStack
from stacks.settings import AWS_RESERVED_IPS_PER_SUBNET, FSX_RESERVED_IPS, PlatformSettings

LAMBDA_TASK_TIMEOUT = Duration.seconds(60)
NOTIFY_TIMEOUT = Duration.seconds(30)


class PipelineStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: PlatformSettings,
        network: NetworkStack,
        data: DataStack,
        image: ImageStack,
        revision: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        self.settings = settings
        self.revision = revision
        pipeline = settings.pipeline
        net = network.network
        key = data.key
        datasets, checkpoints, artifacts = (
            s3.Bucket.from_bucket_attributes(
                self,
                f"{purpose.title()}Bucket",
                bucket_name=bucket_name(self, settings.stage, purpose),
                encryption_key=key,
            )
            for purpose in ("datasets", "checkpoints", "artifacts")
        )
        self.topics = PlatformTopics(self, "Topics", key=key, settings=settings.notifications)
        self._placement: dict[str, Any] = {
            "vpc": net.vpc,
            "vpc_subnets": net.services_subnets,
            "security_groups": [net.services_sg],
        }
        self._key = key

        training_ips = (
            2 ** (32 - settings.network.training_subnet_mask) - AWS_RESERVED_IPS_PER_SUBNET - FSX_RESERVED_IPS
        )
        self.validate = self._function(
            "Validate",
            "lambdas.validate.handler.handler",
            "Validates an execution input into a complete training request",
            {
                "DATASETS_BUCKET": datasets.bucket_name,
                "FSX_FILE_SYSTEM_ID": data.lustre.file_system_id,
                "FSX_MOUNT_NAME": data.lustre.mount_name,
                "TRAINING_SUBNET_IPS": str(training_ips),
                "MAX_RUNTIME_HOURS": str(pipeline.max_runtime_hours),
                "ALLOWED_INSTANCE_TYPES": json.dumps(pipeline.instance_types()),
                "FORBID_SELF_APPROVAL": str(pipeline.forbid_self_approval).lower(),
                "POLL_INTERVAL_SECONDS": str(pipeline.poll_interval_seconds),
                "CAPACITY_RETRIES": str(pipeline.capacity_retries),
                "VOLUME_SIZE_GB": str(pipeline.volume_size_gb),
                "RUN_EMAILS": json.dumps(settings.notifications.run_emails),
                "JOB_TAGS": json.dumps(
                    {
                        COST_TAG.split("$")[0]: COST_TAG.split("$")[1],
                        "stage": settings.stage,
                        "team": settings.tags.team,
                        "cost-centre": settings.tags.cost_centre,
                    }
                ),
            },
        )
        self.estimate = self._function(
            "Estimate",
            "lambdas.estimate.handler.handler",
            "Estimates a run's cost bound and whether it needs approval",
            {
                "APPROVAL_THRESHOLD_USD": str(pipeline.approval_threshold_usd),
                "SPOT_COST_FRACTION": json.dumps(list(pipeline.spot_cost_fraction)),
                "PRICE_OVERRIDES": json.dumps(pipeline.price_overrides, sort_keys=True),
            },
        )
        self.monitor = self._function(
            "Monitor",
            "lambdas.monitor.handler.handler",
            "Summarises a running job: status, spot interruptions, checkpoint freshness",
            {
                "CHECKPOINTS_BUCKET": checkpoints.bucket_name,
                "CHECKPOINT_STALE_MINUTES": str(pipeline.checkpoint_stale_minutes),
            },
        )
        # It lists checkpoint manifests (key names and dates); it never reads an object.
        self.monitor.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="ListRunCheckpoints",
                actions=["s3:ListBucket"],
                resources=[checkpoints.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["runs/*"]}},
            )
        )
        self.cleanup = self._cleanup_function(checkpoints, key)
        self.evaluate = self._function(
            "Evaluate",
            "lambdas.evaluate.handler.handler",
            "Compares a finished job's final metrics with the run's quality gate",
            {},
        )
        training_image = image.training_image
        self.register = self._function(
            "Register",
            "lambdas.register.handler.handler",
            "Registers the trained model with its lineage",
            {
                "ARTIFACTS_BUCKET": artifacts.bucket_name,
                "MODEL_PACKAGE_GROUP": data.model_registry.model_package_group_name,
                "IMAGE_URI": training_image.image_uri,
                "PLATFORM_REVISION": revision,
            },
            timeout=Duration.minutes(5),
        )
        # Lineage lists the dataset's object versions (it reads no object) and writes its records.
        self.register.function.add_to_role_policy(
            _statement(["s3:ListBucketVersions"], [datasets.bucket_arn], sid="DatasetVersions")
        )
        lineage = f"{artifacts.bucket_arn}/runs/*/lineage/*"
        self.register.function.add_to_role_policy(_statement(["s3:PutObject"], [lineage], sid="WriteLineage"))
        key.grant(self.register.function, "kms:GenerateDataKey")
        group = data.model_registry.model_package_group_name
        packages = f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:model-package/{group}/*"
        self._packages = packages
        self.register.function.add_to_role_policy(
            _statement(
                ["sagemaker:CreateModelPackage", "sagemaker:AddTags"],
                [packages, data.model_registry.attr_model_package_group_arn],
                sid="RegisterModels",
            )
        )
        _acknowledge_grants(
            self.register.role,
            {},
            wildcards={
                lineage: "Lineage files are written under runs/<job>/lineage/ of the run being registered.",
                packages: "New model package versions in the platform's one model package group.",
            },
        )

        self.approval = ApprovalGate(
            self,
            "Approval",
            table=data.approvals,
            topic=self.topics.runs,
            key=key,
            approvers=settings.approvers,
            forbid_self_approval=pipeline.forbid_self_approval,
            timeout=Duration.hours(pipeline.approval_timeout_hours),
            vpc=net.vpc,
            subnets=net.services_subnets,
            security_group=net.services_sg,
        )
        self.training = DistributedTrainingJob(
            self,
            "Training",
            image_uri=training_image.image_uri,
            repository=training_image.repository,
            key=key,
            datasets=datasets,
            checkpoints=checkpoints,
            artifacts=artifacts,
            vpc=net.vpc,
            subnet=net.training_subnet,
            security_group=net.training_sg,
            file_system_arn=data.lustre.file_system_arn,
            inter_container_encryption=pipeline.inter_container_encryption,
            network_isolation=pipeline.network_isolation,
            instance_types=pipeline.instance_types(),
            max_runtime_seconds=math.ceil(pipeline.max_runtime_hours * 3600),
        )

        self.execution_key = ExecutionDataKey(self, "ExecutionData", readers=settings.execution_data_readers)
        self.state_machine = self._state_machine()
        self.execution_key.allow(self.state_machine.role, self.approval.decide.role)
        self.execution_key.bind_log_delivery()
        self.training.grant_run(self.state_machine.role)
        stack_arn = f"arn:{self.partition}:sagemaker:{self.region}:{self.account}"
        self.training.grant_follow(self.monitor.role)
        self.training.grant_stop(self.cleanup.role)
        for role, reason in (
            (self.monitor.role, "Describes the run's job; job names are per run and attempt."),
            (self.cleanup.role, "Lists the tags of in-progress jobs and stops those of the execution that ended."),
        ):
            acknowledge_wildcard(role, f"{stack_arn}:training-job/*", reason)
        self._stop_jobs_when_executions_end()
        # Publishing to the runs topic, which the platform key encrypts.
        key.grant(self.state_machine, "kms:GenerateDataKey", "kms:Decrypt")
        self.approval.grant_decisions(self.state_machine)
        acknowledge_inline_policy(self.state_machine.role)
        _acknowledge_grants(
            self.state_machine.role,
            {
                "AwsSolutions-IAM5[Resource::*]": (
                    "Step Functions log delivery and X-Ray (logs:CreateLogDelivery..., xray:PutTraceSegments...) "
                    "take no resource scope."
                ),
            },
            wildcards={
                f"{stack_arn}:training-job/*": (
                    "Job names are per run and attempt; CreateTrainingJob is further limited by condition to the "
                    "platform's subnet, security group and output key."
                ),
                packages: "Approving or rejecting versions in the platform's one model package group.",
                **{
                    f"{fn.function.function_arn}:*": "Step Functions invokes any version of the platform's own handler."
                    for fn in (
                        self.validate,
                        self.estimate,
                        self.monitor,
                        self.cleanup,
                        self.evaluate,
                        self.register,
                        self.approval.request,
                    )
                },
            },
        )

        PlatformBudget(
            self,
            "Budget",
            limit_usd=pipeline.monthly_budget_usd,
            topic=self.topics.alarms,
            emails=settings.notifications.budget_emails,
        )
        PipelineAlarms(
            self,
            "Alarms",
            state_machine=self.state_machine,
            functions={
                name: fn.function
                for name, fn in {
                    "Validate": self.validate,
                    "Estimate": self.estimate,
                    "Monitor": self.monitor,
                    "Evaluate": self.evaluate,
                    "Register": self.register,
                    "ApprovalRequest": self.approval.request,
                    "ApprovalDecide": self.approval.decide,
                }.items()
            },
            topic=self.topics.alarms,
        )

    def _cleanup_function(self, checkpoints: s3.IBucket, key: kms.IKey) -> PlatformFunction:
        """The handler that stops a run's jobs and prunes its checkpoints (state machine and EventBridge)."""
        # EventBridge invokes Cleanup asynchronously: what fails there for good is kept here.
        self.cleanup_dead_letters = sqs.Queue(
            self,
            "CleanupDeadLetters",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        cleanup = PlatformFunction(
            self,
            "Cleanup",
            handler="lambdas.cleanup.handler.handler",
            description="Stops a run's training jobs and prunes its checkpoints when the run ends",
            log_key=key,
            environment={"CHECKPOINTS_BUCKET": checkpoints.bucket_name},
            timeout=Duration.minutes(5),
            dead_letter_queue=self.cleanup_dead_letters,
            **self._placement,
        )
        # Lambda sends failed events to the dead-letter queue with the function's role.
        key.grant(cleanup.function, "kms:GenerateDataKey", "kms:Decrypt")
        cleanup.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="ListRunCheckpoints",
                actions=["s3:ListBucket"],
                resources=[checkpoints.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["runs/*"]}},
            )
        )
        superseded = f"{checkpoints.bucket_arn}/runs/*/checkpoints/*"
        cleanup.function.add_to_role_policy(_statement(["s3:DeleteObject"], [superseded], sid="PruneRunCheckpoints"))
        _acknowledge_grants(
            cleanup.role,
            {},
            wildcards={
                superseded: "Superseded checkpoints of the run that ended (the bucket keeps their versions a while).",
            },
        )
        return cleanup

    def _stop_jobs_when_executions_end(self) -> None:
        """An execution aborted by a person, timed out or failed: its training jobs are stopped (cleanup handler)."""
        events.Rule(
            self,
            "ExecutionEnded",
            description="Stops the training jobs of a pipeline execution that was aborted, timed out or failed",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [self.state_machine.state_machine_arn],
                    "status": ["ABORTED", "TIMED_OUT", "FAILED"],
                },
            ),
            targets=[
                targets.LambdaFunction(
                    self.cleanup.function,
                    dead_letter_queue=self.cleanup_dead_letters,
                    retry_attempts=8,
                    max_event_age=Duration.hours(6),
                )
            ],
        )

    def _function(
        self, id_: str, handler: str, description: str, environment: dict[str, str], timeout: Duration | None = None
    ) -> PlatformFunction:
        return PlatformFunction(
            self,
            id_,
            handler=handler,
            description=description,
            log_key=self._key,
            environment=environment,
            timeout=timeout,
            **self._placement,
        )

    def _invoke(
        self, id_: str, function: PlatformFunction, payload: dict[str, Any], result_path: str
    ) -> tasks.LambdaInvoke:
        return invoke(self, id_, function, payload, result_path)

    def _notify(
        self, id_: str, *, kind: str, subject: str, fields: dict[str, Any], scope: Construct | None = None
    ) -> tasks.SnsPublish:
        """A run notification; subscribers filter on `kind` and on the run's `recipients`."""
        return tasks.SnsPublish(
            scope or self,
            id_,
            topic=self.topics.runs,
            subject=subject,
            message=sfn.TaskInput.from_object(fields),
            message_attributes={
                "kind": tasks.MessageAttribute(value=kind),
                "recipients": tasks.MessageAttribute(
                    # SNS takes a String.Array as the JSON text of the array.
                    value=sfn.JsonPath.json_to_string(sfn.JsonPath.list_at("$.request.recipients")),
                    data_type=tasks.MessageAttributeDataType.STRING_ARRAY,
                ),
            },
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(NOTIFY_TIMEOUT),
        )

    def _state_machine(self) -> sfn.StateMachine:
        pipeline = self.settings.pipeline
        run = {
            "run_name": sfn.JsonPath.string_at("$.request.run_name"),
            "execution": sfn.JsonPath.execution_id,
        }

        # 1. Validate: nothing is created for an input that cannot run.
        receive = sfn.Pass(self, "Receive input", parameters={"input": sfn.JsonPath.object_at("$")})
        validate = self._invoke(
            "Validate request",
            self.validate,
            {
                "input": sfn.JsonPath.object_at("$.input"),
                "execution_name": sfn.JsonPath.string_at("$$.Execution.Name"),
                "execution": sfn.JsonPath.execution_id,
            },
            "$.validation",
        )
        rejected = sfn.Fail(self, "Request rejected", error="InvalidRequest", cause_path="$.validation.message")
        accept = sfn.Pass(
            self,
            "Accept request",
            parameters={
                "input": sfn.JsonPath.object_at("$.input"),
                "request": sfn.JsonPath.object_at("$.validation.request"),
            },
        )

        # 2. Estimate cost; 3. pre-launch approval above the threshold.
        estimate = self._invoke(
            "Estimate cost", self.estimate, {"request": sfn.JsonPath.object_at("$.request")}, "$.estimate"
        )
        no_decision = f"No approver decided within {pipeline.approval_timeout_hours} h; treated as a rejection."
        timed_out = self._notify(
            "Notify approval timed out",
            kind="run",
            subject="Training run rejected: no approver decided in time",
            fields={**run, "reason": no_decision},
        )
        timed_out_fail = sfn.Fail(self, "Approval timed out", error="ApprovalTimedOut", cause=no_decision)
        timed_out.add_catch(timed_out_fail, errors=["States.ALL"], result_path="$.notify_error")
        timed_out.next(timed_out_fail)
        launch_gate, launch_approved = self.approval.gate(
            self,
            "Approval gate (pre-launch)",
            name="launch",
            summary={
                "instances": sfn.JsonPath.format(
                    "{} x {}",
                    sfn.JsonPath.string_at("$.request.instance_count"),
                    sfn.JsonPath.string_at("$.request.instance_type"),
                ),
                "spot": sfn.JsonPath.string_at("$.request.spot"),
                "max_cost_usd": sfn.JsonPath.string_at("$.estimate.max_cost_usd"),
                "threshold_usd": sfn.JsonPath.string_at("$.estimate.threshold_usd"),
                "dataset": sfn.JsonPath.string_at("$.request.dataset.uri"),
            },
            result_path="$.launch_approval",
            on_timeout=timed_out,
        )
        launch_rejected = self._rejected(
            "launch", subject="Training run rejected before launch", state="Launch rejected", error="LaunchRejected"
        )

        # 4. Train: the training step (create, poll, retry on capacity; stop and prune on every way out).
        training = SageMakerTrainingStep(
            self,
            "TrainingStep",
            job=self.training,
            monitor=self.monitor,
            cleanup=self.cleanup,
            capacity_retries=pipeline.capacity_retries,
            warn_stale=lambda scope, id_: self._notify(
                id_,
                kind="run",
                subject="Training run has not checkpointed recently",
                fields={
                    **run,
                    "job": sfn.JsonPath.string_at("$.job.job_name"),
                    "checkpoint_age_minutes": sfn.JsonPath.string_at("$.job.checkpoint_age_minutes"),
                    "latest_checkpoint": sfn.JsonPath.object_at("$.job.checkpoint"),
                },
                scope=scope,
            ),
        )
        first_attempt = training.start
        job_failed = self._notify(
            "Notify training failed",
            kind="run",
            subject="Training run failed",
            fields={
                **run,
                "error": sfn.JsonPath.string_at("$.failure.error"),
                "reason": sfn.JsonPath.string_at("$.failure.cause"),
                "cleanup": sfn.JsonPath.object_at("$.cleanup"),
            },
        )
        training_failed = sfn.Fail(self, "Training failed", error_path="$.failure.error", cause_path="$.failure.cause")
        job_failed.add_catch(training_failed, errors=["States.ALL"], result_path="$.notify_error")
        training.failed.next(job_failed).next(training_failed)

        # 5. Evaluate; 6. register with lineage; 3b. promotion approval; 7. notify.
        evaluate = self._invoke(
            "Evaluate model",
            self.evaluate,
            {
                "quality": sfn.JsonPath.object_at("$.request.quality"),
                "final_metrics": sfn.JsonPath.object_at("$.job.final_metrics"),
            },
            "$.evaluation",
        )
        below = self._notify(
            "Notify below quality",
            kind="run",
            subject="Training run finished below its quality gate: not registered",
            fields={**run, "evaluation": sfn.JsonPath.object_at("$.evaluation")},
        ).next(
            sfn.Fail(self, "Below quality threshold", error="QualityBelowThreshold", cause_path="$.evaluation.reason")
        )
        register = self._invoke(
            "Register model",
            self.register,
            {
                "request": sfn.JsonPath.object_at("$.request"),
                "job": sfn.JsonPath.object_at("$.job"),
                "estimate": sfn.JsonPath.object_at("$.estimate"),
                "evaluation": sfn.JsonPath.object_at("$.evaluation"),
                "execution": sfn.JsonPath.execution_id,
            },
            "$.registration",
        )
        promotion_timed_out = self._set_approval("Reject model (no decision)", "Rejected", "No decision in time").next(
            timed_out
        )
        promotion_gate, promoted = self.approval.gate(
            self,
            "Approval gate (promotion)",
            name="promotion",
            summary={
                "model_package": sfn.JsonPath.string_at("$.registration.model_package_arn"),
                "evaluation": sfn.JsonPath.string_at("$.evaluation.reason"),
                "lineage": sfn.JsonPath.string_at("$.registration.lineage_uri"),
            },
            result_path="$.promotion_approval",
            on_timeout=promotion_timed_out,
        )
        approve = self._set_approval(
            "Approve model", "Approved", sfn.JsonPath.format("Approved by {}: {}", *_decision("$.promotion_approval"))
        )
        succeeded = self._notify(
            "Notify success",
            kind="run",
            subject="Training run finished: model registered and approved",
            fields={
                **run,
                "model_package": sfn.JsonPath.string_at("$.registration.model_package_arn"),
                "lineage": sfn.JsonPath.string_at("$.registration.lineage_uri"),
                "metrics": sfn.JsonPath.object_at("$.job.final_metrics"),
                "estimate": sfn.JsonPath.object_at("$.estimate"),
            },
        ).next(sfn.Succeed(self, "Model promoted"))
        reject = self._set_approval(
            "Reject model", "Rejected", sfn.JsonPath.format("Rejected by {}: {}", *_decision("$.promotion_approval"))
        )
        promotion_rejected = self._rejected(
            "promotion",
            subject="Trained model rejected at promotion",
            state="Promotion rejected",
            error="PromotionRejected",
        )

        training.succeeded.next(evaluate)
        evaluate.next(
            sfn.Choice(self, "Quality gate met?")
            .when(sfn.Condition.boolean_equals("$.evaluation.passed", True), register)
            .otherwise(below)
        )
        register.next(promotion_gate).next(
            sfn.Choice(self, "Promotion approved?")
            .when(promoted, approve.next(succeeded))
            .otherwise(reject.next(promotion_rejected))
        )
        definition = receive.next(validate).next(
            sfn.Choice(self, "Request valid?")
            .when(sfn.Condition.boolean_equals("$.validation.valid", False), rejected)
            .otherwise(accept)
        )
        accept.next(estimate).next(
            sfn.Choice(self, "Approval needed?")
            .when(
                sfn.Condition.boolean_equals("$.estimate.approval_required", True),
                launch_gate.next(
                    sfn.Choice(self, "Launch approved?").when(launch_approved, first_attempt).otherwise(launch_rejected)
                ),
            )
            .otherwise(first_attempt)
        )

        log_group = encrypted_log_group(self, "StateMachineLogs", key=self._key, retention_days=365)
        hours = (
            2 * pipeline.approval_timeout_hours + (pipeline.capacity_retries + 1) * 2 * pipeline.max_runtime_hours + 1
        )
        return sfn.StateMachine(
            self,
            "TrainingPipeline",
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            comment="Validate -> estimate -> approve -> train (create + poll) -> evaluate -> register -> promote",
            timeout=Duration.hours(min(hours, 365 * 24)),
            tracing_enabled=True,
            encryption_configuration=sfn.CustomerManagedEncryptionConfiguration(
                self.execution_key.key, Duration.minutes(5)
            ),
            # Execution data stays out of the logs: inputs and task tokens are not log material.
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        )

    def _rejected(self, gate: str, *, subject: str, state: str, error: str) -> sfn.Chain:
        """Tell the run's recipients, then fail with who rejected the gate and why."""
        decision = f"$.{gate}_approval"
        run = {"run_name": sfn.JsonPath.string_at("$.request.run_name"), "execution": sfn.JsonPath.execution_id}
        notify = self._notify(
            f"Notify {state[0].lower()}{state[1:]}",
            kind="run",
            subject=subject,
            fields={**run, "decision": sfn.JsonPath.object_at(decision)},
        )
        cause = sfn.JsonPath.format("Rejected by {}: {}", *_decision(decision))
        return notify.next(sfn.Fail(self, state, error=error, cause_path=cause))

    def _set_approval(self, id_: str, status: str, description: str) -> tasks.CallAwsService:
        return tasks.CallAwsService(
            self,
            id_,
            service="sagemaker",
            action="updateModelPackage",
            parameters={
                "ModelPackageArn": sfn.JsonPath.string_at("$.registration.model_package_arn"),
                "ModelApprovalStatus": status,
                "ApprovalDescription": description,
            },
            iam_resources=[self._packages],
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(LAMBDA_TASK_TIMEOUT),
        )


def _acknowledge_grants(role: iam.IRole, findings: dict[str, str], *, wildcards: dict[str, str]) -> None:
    for finding, reason in findings.items():
        acknowledge(role, finding, reason)
    for resource, reason in wildcards.items():
        acknowledge_wildcard(role, resource, reason)


def _decision(path: str) -> tuple[str, str]:
    return sfn.JsonPath.string_at(f"{path}.by"), sfn.JsonPath.string_at(f"{path}.reason")


def _statement(actions: list[str], resources: list[str], *, sid: str) -> iam.PolicyStatement:
    return iam.PolicyStatement(sid=sid, actions=actions, resources=resources)
