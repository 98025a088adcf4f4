"""Hand-over: a run whose execution has made its budget of polls goes on in a new execution of the state machine.

Step Functions ends an execution at 25,000 history events (lambdas/shared/history.py). The poll that makes an
execution's budget (settings `pipeline.polls_per_execution`) answers `hand_over` (lambdas/jobs/pacing.py), and the
polling loop (stacks/pipeline/polled_job.py) starts a new execution of this state machine, named
`<job_name_base>-handover-<n>`, with `{"handover": {"from": <this execution>, "state": <its state>}}`, then
succeeds with `{"continues_in": <the new execution>, "run": ...}`. The new execution's first state sees the
hand-over; TakeOver (lambdas/handover/handler.py) proves it from the `from` execution's history and answers the
state, which goes on at the Wait of the loop that handed over: the same job, no second approval. A hand-over it
cannot prove fails the execution (HandOverRefused) before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ERROR, HANDED_TO, HANDOVER, REQUEST, RUN
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.constructs.function import PlatformFunction
from stacks.constructs.tasks import HANDOVER_TRANSIENT, SDK, invoke, retry
from stacks.pipeline.parts import Handlers, obj, string

START_EXECUTION = "states:startExecution"


class HandOver(Construct):
    """TakeOver, the execution's first Choice (`start`), and each polling loop's way out to a new execution."""

    def __init__(self, scope: Construct, id_: str, *, handlers: Handlers, state_machine_name: str) -> None:
        super().__init__(scope, id_)
        # The state machine's own ARN by its name: its definition cannot refer to the machine itself.
        self.state_machine_arn = Stack.of(self).format_arn(
            service="states",
            resource="stateMachine",
            resource_name=state_machine_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.function = handlers.function(
            "TakeOver",
            "lambdas.handover.handler.handler",
            "Proves that an execution was handed a run, from the history of the execution that handed it over",
            {},
        )
        self._take_over = invoke(
            self,
            "Take over the run",
            self.function,
            {"handover": obj(HANDOVER), "execution": sfn.JsonPath.execution_id},
            # The answer replaces the state: the proven state of the execution that handed the run over.
            "$",
        )
        self._cleanups: list[PlatformFunction] = []
        self._continue = sfn.Choice(self, "Continue which loop?")
        self._continue.otherwise(
            sfn.Fail(self, "No such polling loop", error="HandOverRefused", cause="the hand-over names no loop")
        )
        self._take_over.next(self._continue)

    def start(self, fresh: sfn.IChainable) -> sfn.IChainable:
        """The execution's first state: a hand-over is taken over, any other input goes to `fresh`."""
        return (
            sfn.Choice(self, "Handed over?")
            .when(sfn.Condition.is_present(str(HANDOVER)), self._take_over)
            .otherwise(fresh)
        )

    def way_out(
        self, scope: Construct, names: Callable[[str], str], wait: sfn.Wait, stop: sfn.IChainable
    ) -> sfn.IChainable:
        """A loop's hand-over: start the new execution, then succeed naming it; the new one resumes at `wait`."""
        loop = wait.state_id
        self._continue.when(sfn.Condition.string_equals(str(RUN.loop), loop), wait)
        count = sfn.Pass(
            scope,
            names("Count the hand-over"),
            parameters={
                "execution": string(RUN.execution),
                "handovers": sfn.JsonPath.math_add(sfn.JsonPath.number_at(str(RUN.handovers)), 1),
                "loop": loop,
            },
            result_path=str(RUN),
        )
        start = sfn.CustomState(
            scope,
            names("Hand the run over"),
            state_json={
                "Type": "Task",
                "Resource": f"arn:{Stack.of(scope).partition}:states:::{START_EXECUTION}",
                "Comment": "Plain, not .sync: this execution ends once the new one has started",
                "Parameters": {
                    "StateMachineArn": self.state_machine_arn,
                    "Name.$": f"States.Format('{{}}-handover-{{}}', {REQUEST.job_name_base}, {RUN.handovers})",
                    "Input": {"handover": {"from.$": "$$.Execution.Id", "state.$": "$"}},
                },
                "ResultSelector": {"ExecutionArn.$": "$.ExecutionArn"},
                "ResultPath": str(HANDED_TO),
                "TimeoutSeconds": 60,
            },
        )
        retry(start, HANDOVER_TRANSIENT, SDK)
        start.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        answer = sfn.Pass(
            scope,
            names("Handed over"),
            parameters={"continues_in": string(HANDED_TO.ExecutionArn), "run": obj(RUN)},
        )
        return count.next(start).next(answer).next(sfn.Succeed(scope, names("Run goes on in a new execution")))

    def cleans_up(self, cleanup: PlatformFunction) -> None:
        """`cleanup` (a backend's) cleans up ended executions: of one a run was handed over to, it reads the proof,
        and stops the jobs of the run's first execution (lambdas/jobs/prune.py `ended_execution`)."""
        self._cleanups.append(cleanup)

    def bind(self, state_machine: sfn.StateMachine, execution_key: ExecutionDataKey) -> None:
        """The state machine may start executions of itself (no other); TakeOver reads the one that handed over,
        and so does each backend's cleanup."""
        state_machine.add_to_role_policy(
            iam.PolicyStatement(
                sid="HandRunsOver", actions=["states:StartExecution"], resources=[self.state_machine_arn]
            )
        )
        execution_key.allow_reading_executions(
            self,
            "ReadHandingExecutions",
            self.function.role,
            state_machine,
            why="The execution a hand-over names, which is one of this state machine's.",
        )
        for cleanup in self._cleanups:
            execution_key.allow_reading_executions(
                cleanup,
                "ReadHandedOverRuns",
                cleanup.role,
                state_machine,
                why="An ended execution a run was handed over to, and the one that handed it over.",
            )

    @property
    def functions(self) -> list[PlatformFunction]:
        return [self.function]
