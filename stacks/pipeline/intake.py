"""Intake: an execution input becomes a validated request with a cost estimate, or the run ends here.

Nothing is created for an input that cannot run: Validate resolves the input into a
`TrainingRequest` (contract/execution_state.py) or rejects it with every problem listed; Estimate
bounds its cost and says whether it needs approval.
"""

from __future__ import annotations

import json

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ESTIMATE, INPUT, REQUEST, VALIDATION
from contract.layout import ANY_CODE, ANY_LEDGER_RECORD, ANY_MANIFEST
from lambdas.validate.limits import PlatformLimits
from stacks.constructs.cost_controls import BUDGET_PROBE_JOB, COST_TAG
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.constructs.function import PlatformFunction
from stacks.constructs.lustre import LustreDataRepository
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import invoke
from stacks.pipeline.parts import Buckets, Handlers, obj
from stacks.pipeline.polled_job import list_runs
from stacks.settings import PlatformSettings


class Intake(Construct):
    """`start`: the execution's first state; `estimated`: the request with `$.estimate`, ready to go on."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        handlers: Handlers,
        settings: PlatformSettings,
        buckets: Buckets,
        lustre: LustreDataRepository,
        start_proofs: dynamodb.ITable,
        backends: list[str],
    ) -> None:
        """`backends`: the ones the pipeline's training step runs (stacks/pipeline_stack.py)."""
        super().__init__(scope, id_)
        limits = self._limits(settings, buckets=buckets, lustre=lustre, backends=backends)
        self.validate = self._validate_function(handlers, settings, limits, buckets=buckets, start_proofs=start_proofs)
        pipeline = settings.pipeline
        self.estimate = handlers.function(
            "Estimate",
            "lambdas.estimate.handler.handler",
            "Estimates a run's cost bound and whether it needs approval",
            {
                "APPROVAL_THRESHOLD_USD": str(pipeline.approval_threshold_usd),
                "SPOT_COST_FRACTION": json.dumps(list(pipeline.spot_cost_fraction)),
                "PRICE_OVERRIDES": json.dumps(pipeline.price_overrides, sort_keys=True),
                "MONTHLY_BUDGET_USD": str(pipeline.monthly_budget_usd),
                "TEAM_BUDGETS_USD": json.dumps(
                    {team.name: team.monthly_budget_usd for team in settings.teams}, sort_keys=True
                ),
            },
        )
        self.start = sfn.Pass(self, "Receive input", parameters={"input": sfn.JsonPath.object_at("$")})
        validate = invoke(
            self,
            "Validate request",
            self.validate,
            {
                "input": obj(INPUT),
                "execution_name": sfn.JsonPath.string_at("$$.Execution.Name"),
                "execution": sfn.JsonPath.execution_id,
                "started": sfn.JsonPath.execution_start_time,
            },
            # The answer replaces the state: the input comes back without its start proof.
            "$",
        )
        rejected = sfn.Fail(self, "Request rejected", error="InvalidRequest", cause_path=str(VALIDATION.message))
        # The run is this execution's: its jobs are tagged with it, and every execution it is handed over to names it.
        accept = sfn.Pass(
            self,
            "Accept request",
            parameters={
                "input": obj(INPUT),
                "request": obj(VALIDATION.request),
                "run": {"execution": sfn.JsonPath.execution_id, "handovers": 0},
            },
        )
        self.estimated = invoke(self, "Estimate cost", self.estimate, {"request": obj(REQUEST)}, str(ESTIMATE))
        self.start.next(validate).next(
            sfn.Choice(self, "Request valid?")
            .when(sfn.Condition.boolean_equals(str(VALIDATION.valid), False), rejected)
            .otherwise(accept)
        )
        accept.next(self.estimated)

    @property
    def functions(self) -> list[PlatformFunction]:
        return [self.validate, self.estimate]

    @staticmethod
    def _limits(
        settings: PlatformSettings, *, buckets: Buckets, lustre: LustreDataRepository, backends: list[str]
    ) -> PlatformLimits:
        """What Validate holds requests to: the settings' limits and the deployment's names and tags."""
        cost_tag_key, cost_tag_value = COST_TAG.split("$")
        return settings.platform_limits(
            datasets_bucket=buckets.datasets.bucket_name,
            artifacts_bucket=buckets.artifacts.bucket_name,
            fsx_file_system_id=lustre.file_system_id,
            fsx_mount_name=lustre.mount_name,
            tags={
                cost_tag_key: cost_tag_value,
                "stage": settings.stage,
                "team": settings.tags.team,
                "cost-centre": settings.tags.cost_centre,
            },
            backends=backends,
        )

    @staticmethod
    def _validate_function(
        handlers: Handlers,
        settings: PlatformSettings,
        limits: PlatformLimits,
        *,
        buckets: Buckets,
        start_proofs: dynamodb.ITable,
    ) -> PlatformFunction:
        pipeline = settings.pipeline
        function = handlers.function(
            "Validate",
            "lambdas.validate.handler.handler",
            "Validates an execution input into a complete training request",
            {
                **limits.environment(),
                "FORBID_SELF_APPROVAL": str(pipeline.forbid_self_approval).lower(),
                "BUDGET_PROBE_JOB": BUDGET_PROBE_JOB,
                "MONTHLY_BUDGET_USD": str(pipeline.monthly_budget_usd),
                "BUDGET_CONTACT": settings.budget_contact,
                "START_PROOFS_TABLE": start_proofs.table_name,
                "CHECKPOINTS_BUCKET": buckets.checkpoints.bucket_name,
            },
        )
        # `resume_from` given as a run id is looked up in that run's ledger.
        function.function.add_to_role_policy(list_runs(buckets.artifacts.bucket_arn, "ListRuns"))
        records = f"{buckets.artifacts.bucket_arn}/{ANY_LEDGER_RECORD}"
        function.function.add_to_role_policy(
            iam.PolicyStatement(sid="LedgerRecords", actions=["s3:GetObject"], resources=[records])
        )
        acknowledge_wildcard(function.role, records, "Reads the ledger of the run an input's resume_from names.")
        # ...and its checkpoints judged: whether one is complete and as the ledger records it (contract/ledger.py).
        function.function.add_to_role_policy(list_runs(buckets.checkpoints.bucket_arn, "ListRunCheckpoints"))
        manifests = f"{buckets.checkpoints.bucket_arn}/{ANY_MANIFEST}"
        function.function.add_to_role_policy(
            iam.PolicyStatement(sid="CheckpointManifests", actions=["s3:GetObject"], resources=[manifests])
        )
        acknowledge_wildcard(function.role, manifests, "Reads the manifests of the run an input's resume_from names.")
        # A fine-tuning run's model folder (init_from) and its dataset's first records are read before any job starts:
        # headers and heads of files, by ranged GETs, in the datasets bucket only.
        function.function.add_to_role_policy(
            iam.PolicyStatement(sid="ListDatasets", actions=["s3:ListBucket"], resources=[buckets.datasets.bucket_arn])
        )
        datasets = buckets.datasets.arn_for_objects("*")
        function.function.add_to_role_policy(
            iam.PolicyStatement(sid="ReadDatasets", actions=["s3:GetObject"], resources=[datasets])
        )
        acknowledge_wildcard(
            function.role,
            datasets,
            "Reads init_from's model folder and a dataset's first records, which any key names.",
        )
        # An input's `code` is checked in the run's code prefix: the archive's size, digest and pack record.
        code = f"{buckets.artifacts.bucket_arn}/{ANY_CODE}"
        function.function.add_to_role_policy(
            iam.PolicyStatement(sid="PackedCode", actions=["s3:GetObject"], resources=[code])
        )
        acknowledge_wildcard(function.role, code, "Reads the packed code an input names, in the run's own code prefix.")
        # Recording a used proof is a conditional PutItem; nothing else on the table.
        start_proofs.grant(function.function, "dynamodb:PutItem")
        buckets.key.grant(function.function, "kms:Decrypt", "kms:GenerateDataKey")
        return function

    def read_ended_runs(self, state_machine: sfn.StateMachine, execution_key: ExecutionDataKey) -> None:
        """Let Validate read the executions of `state_machine` that `resume_from` names: status and history.

        A policy of its own, not the role's default one: the function must not wait for the state
        machine that invokes it.
        """
        execution_key.allow_reading_executions(
            self,
            "ReadEndedRuns",
            self.validate.role,
            state_machine,
            why="Executions of this state machine, which resume_from may name.",
        )
