"""The pipeline's human decisions: the pre-launch gate, and what every gate does on a timeout or a rejection.

The gates share one `ApprovalGate` (its request and decide functions, the decision URL). A run
whose cost estimate is under the threshold goes straight on; above it, an approver decides: one of
the run's team's approvers when the team names any, else one of the platform's. No
decision within `pipeline.approval_timeout_hours` counts as a rejection.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ESTIMATE, LAUNCH_APPROVAL, REQUEST, Path
from stacks.constructs.approval_gate import ApprovalGate
from stacks.constructs.network import TrainingNetwork
from stacks.pipeline.parts import Notifier, obj, string
from stacks.settings import PlatformSettings


class Approvals(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: PlatformSettings,
        table: dynamodb.ITable,
        notifier: Notifier,
        key: kms.IKey,
        network: TrainingNetwork,
    ) -> None:
        """`table`: the approvals table; the gate is made at the stack's scope."""
        super().__init__(scope, id_)
        self._notifier = notifier
        pipeline = settings.pipeline
        self.gate = ApprovalGate(
            Stack.of(self),
            "Approval",
            table=table,
            topic=notifier.topic,
            key=key,
            approvers=settings.approvers,
            team_approvers={team.name: team.approvers for team in settings.teams},
            forbid_self_approval=pipeline.forbid_self_approval,
            timeout=Duration.hours(pipeline.approval_timeout_hours),
            vpc=network.vpc,
            subnets=network.services_subnets,
            security_group=network.services_sg,
        )
        no_decision = f"No approver decided within {pipeline.approval_timeout_hours} h; treated as a rejection."
        self.timed_out = notifier.notify(
            self,
            "Notify approval timed out",
            subject="Training run rejected: no approver decided in time",
            fields={"reason": no_decision},
        )
        """Where a gate with no decision in time goes: the run's recipients hear of it, then the run fails."""
        timed_out_fail = sfn.Fail(self, "Approval timed out", error="ApprovalTimedOut", cause=no_decision)
        self.timed_out.add_catch(timed_out_fail, errors=["States.ALL"], result_path="$.notify_error")
        self.timed_out.next(timed_out_fail)

    def before_launch(self, then: sfn.IChainable) -> sfn.Choice:
        """Approval when the estimate needs it, then `then`; a rejection or no decision ends the run."""
        gate, approved = self.gate.gate(
            self,
            "Approval gate (pre-launch)",
            name="launch",
            summary={
                "instances": string(REQUEST.cluster),
                "spot": string(REQUEST.spot),
                "max_cost_usd": string(ESTIMATE.max_cost_usd),
                # The cluster the cost is of: with fallback clusters, the dearest one the run may use.
                "worst_case": string(ESTIMATE.worst_case),
                "threshold_usd": string(ESTIMATE.threshold_usd),
                "max_runtime_seconds": string(REQUEST.max_runtime_seconds),
                "budget_warning": string(ESTIMATE.budget_warning),
                "dataset": string(REQUEST.dataset.uri),
                # What will run: the platform's trainer, or the run's own code by its digest.
                "code": string(REQUEST.code_summary),
            },
            result=LAUNCH_APPROVAL,
            on_timeout=self.timed_out,
        )
        rejected = self.rejected(
            self,
            LAUNCH_APPROVAL,
            subject="Training run rejected before launch",
            state="Launch rejected",
            error="LaunchRejected",
        )
        return (
            sfn.Choice(self, "Approval needed?")
            .when(
                sfn.Condition.boolean_equals(str(ESTIMATE.approval_required), True),
                gate.next(sfn.Choice(self, "Launch approved?").when(approved, then).otherwise(rejected)),
            )
            .otherwise(then)
        )

    def rejected(self, scope: Construct, decision: Path, *, subject: str, state: str, error: str) -> sfn.Chain:
        """Tell the run's recipients, then fail with who rejected the gate and why."""
        notify = self._notifier.notify(
            scope, f"Notify {state[0].lower()}{state[1:]}", subject=subject, fields={"decision": obj(decision)}
        )
        return notify.next(sfn.Fail(scope, state, error=error, cause_path=decided("Rejected", decision)))


def decided(verb: str, decision: Path) -> str:
    """ "<verb> by <approver>: <reason>", from a gate's decision."""
    return sfn.JsonPath.format(f"{verb} by {{}}: {{}}", string(decision.by), string(decision.reason))
