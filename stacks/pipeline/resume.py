"""The run's checkpoint ledger is opened before its first job; a run that names `resume_from` starts from
the resumed run's newest recorded checkpoint.

After the launch approval and before the first job, the handler (lambdas/resume) opens the run's
ledger (contract/ledger.py) and, for a resuming run, copies that checkpoint into the run's own
prefix and records it there; `$.resumed` says what was copied in, or null. A resuming run with
nothing intact to start from ends here, before any instance starts.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import REQUEST, RESUMED
from contract.layout import ANY_CHECKPOINT, ANY_LEDGER_RECORD
from lambdas.resume.environment import ResumeEnvironment
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import invoke
from stacks.naming import CHECKPOINT_WRITERS_PATH
from stacks.pipeline.parts import Buckets, Handlers, obj
from stacks.pipeline.polled_job import list_runs

NOTHING_TO_CONTINUE = "NothingToContinueError"


class ResumeStep(Construct):
    """`start`: open the run's ledger, copying in the resumed run's checkpoint when the request names one;
    then `then()`."""

    def __init__(self, scope: Construct, id_: str, *, handlers: Handlers, buckets: Buckets) -> None:
        super().__init__(scope, id_)
        self.opener = handlers.function(
            "OpenLedger",
            "lambdas.resume.handler.handler",
            "Opens a run's checkpoint ledger; copies in a resumed run's newest recorded checkpoint",
            ResumeEnvironment(
                checkpoints_bucket=buckets.checkpoints.bucket_name,
                artifacts_bucket=buckets.artifacts.bucket_name,
            ).variables(),
            timeout=Duration.minutes(10),
            role_path=CHECKPOINT_WRITERS_PATH,  # it copies a resumed run's checkpoint in
        )
        function = self.opener.function
        checkpoints = f"{buckets.checkpoints.bucket_arn}/{ANY_CHECKPOINT}"
        records = f"{buckets.artifacts.bucket_arn}/{ANY_LEDGER_RECORD}"
        # Listing, of the runs' prefixes only, as every other handler that lists the buckets.
        function.add_to_role_policy(list_runs(buckets.checkpoints.bucket_arn, "ListRunCheckpoints"))
        function.add_to_role_policy(list_runs(buckets.artifacts.bucket_arn, "ListRunArtifacts"))
        for sid, actions, resources in (
            ("CopyCheckpoints", ["s3:GetObject", "s3:PutObject"], [checkpoints]),
            ("LedgerRecords", ["s3:GetObject", "s3:PutObject"], [records]),
        ):
            function.add_to_role_policy(iam.PolicyStatement(sid=sid, actions=actions, resources=resources))
        buckets.key.grant(function, "kms:GenerateDataKey", "kms:Decrypt")
        for resource, reason in {
            checkpoints: "Reads the resumed run's checkpoint and writes it under the resuming run's prefix.",
            records: "Opens the run's ledger; reads a resumed run's and records the copied checkpoint.",
        }.items():
            acknowledge_wildcard(self.opener.role, resource, reason)
        self.start = invoke(
            self,
            "Open the checkpoint ledger",
            self.opener,
            {"request": obj(REQUEST), "execution": sfn.JsonPath.execution_id},
            str(RESUMED),
        )
        nothing = sfn.Fail(
            self,
            "Nothing to continue",
            error=NOTHING_TO_CONTINUE,
            cause="The run resume_from names has no checkpoint that is complete and as the platform recorded it",
        )
        self.start.add_catch(nothing, errors=[NOTHING_TO_CONTINUE], result_path="$.error")

    @property
    def functions(self) -> list[PlatformFunction]:
        return [self.opener]

    def then(self, training: sfn.IChainable) -> None:
        self.start.next(training)
