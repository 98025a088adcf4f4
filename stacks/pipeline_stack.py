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
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
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
from stacks.constructs.training_job import DistributedTrainingJob, poll_wait
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
        # Publishing to the runs topic, which the platform key encrypts.
        key.grant(self.state_machine, "kms:GenerateDataKey", "kms:Decrypt")
        self.approval.grant_decisions(self.state_machine)
        acknowledge_inline_policy(self.state_machine.role)
        stack_arn = f"arn:{self.partition}:sagemaker:{self.region}:{self.account}"
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
        timeout = function.function.timeout or LAMBDA_TASK_TIMEOUT
        return tasks.LambdaInvoke(
            self,
            id_,
            lambda_function=function.function,
            payload=sfn.TaskInput.from_object(payload),
            payload_response_only=True,
            result_path=result_path,
            task_timeout=sfn.Timeout.duration(Duration.seconds(timeout.to_seconds() + 30)),
            retry_on_service_exceptions=True,
        )

    def _notify(self, id_: str, *, kind: str, subject: str, fields: dict[str, Any]) -> tasks.SnsPublish:
        """A run notification; subscribers filter on `kind` and on the run's `recipients`."""
        return tasks.SnsPublish(
            self,
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
            {"input": sfn.JsonPath.object_at("$.input"), "execution_name": sfn.JsonPath.string_at("$$.Execution.Name")},
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
        timed_out = sfn.Fail(
            self,
            "Approval timed out",
            error="ApprovalTimedOut",
            cause=f"No approver decided within {pipeline.approval_timeout_hours} h; treated as a rejection.",
        )
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

        # 4. Train: create, then poll (Wait -> Describe -> Monitor -> Choice).
        first_attempt = sfn.Pass(
            self, "First attempt", result=sfn.Result.from_object({"attempt": 1}), result_path="$.train"
        )
        create_kms = self.training.create_state(self, "Create training job", kms_volume=True)
        create_local = self.training.create_state(self, "Create training job (instance storage)", kms_volume=False)
        not_created = self._notify(
            "Notify job not created",
            kind="run",
            subject="Training job could not be created",
            fields={**run, "error": sfn.JsonPath.object_at("$.error")},
        ).next(sfn.Fail(self, "Training job not created", error="TrainingJobNotCreated", cause_path="$.error.Cause"))
        for create_state in (create_kms, create_local):
            create_state.add_catch(not_created, errors=["States.ALL"], result_path="$.error")
        create = (
            sfn.Choice(self, "Volume encryption?", comment="Instance-store types take no volume KMS key")
            .when(sfn.Condition.boolean_equals("$.request.local_storage", True), create_local)
            .otherwise(create_kms)
        )
        wait = poll_wait(self, "Wait for training", seconds=pipeline.poll_interval_seconds)
        create_kms.next(wait)
        create_local.next(wait)
        describe = self.training.describe_state(self, "Describe training job")
        monitor = self._invoke(
            "Check progress",
            self.monitor,
            {"request": sfn.JsonPath.object_at("$.request"), "job": sfn.JsonPath.object_at("$.job")},
            "$.job",
        )
        stale = self._notify(
            "Warn stale checkpoints",
            kind="run",
            subject="Training run has not checkpointed recently",
            fields={
                **run,
                "job": sfn.JsonPath.string_at("$.job.job_name"),
                "checkpoint_age_minutes": sfn.JsonPath.string_at("$.job.checkpoint_age_minutes"),
                "latest_checkpoint": sfn.JsonPath.object_at("$.job.checkpoint"),
            },
        ).next(wait)
        next_attempt = sfn.Pass(
            self,
            "Next attempt",
            comment="Insufficient capacity: a new job, with a new name, resuming from the run's checkpoints",
            parameters={"attempt": sfn.JsonPath.math_add(sfn.JsonPath.number_at("$.train.attempt"), 1)},
            result_path="$.train",
        ).next(create)
        job_failed = self._notify(
            "Notify training failed",
            kind="run",
            subject="Training run failed",
            fields={
                **run,
                "job": sfn.JsonPath.string_at("$.job.job_name"),
                "error": sfn.JsonPath.string_at("$.job.error"),
                "reason": sfn.JsonPath.string_at("$.job.failure_reason"),
                "latest_checkpoint": sfn.JsonPath.object_at("$.job.checkpoint"),
            },
        ).next(sfn.Fail(self, "Training failed", error_path="$.job.error", cause_path="$.job.failure_reason"))

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

        job_state = (
            sfn.Choice(self, "Job finished?")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals("$.job.finished", False),
                    sfn.Condition.boolean_equals("$.job.warn_stale", True),
                ),
                stale,
            )
            .when(sfn.Condition.boolean_equals("$.job.finished", False), wait)
            .when(sfn.Condition.string_equals("$.job.status", "Completed"), evaluate)
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals("$.job.capacity_error", True),
                    sfn.Condition.number_less_than("$.train.attempt", pipeline.capacity_retries + 1),
                ),
                next_attempt,
            )
            .otherwise(job_failed)
        )
        wait.next(describe).next(monitor).next(job_state)
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
        first_attempt.next(create)

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
