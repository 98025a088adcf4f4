"""Run the synthesized training pipeline offline: moto's Step Functions engine, the real handlers.

`LocalPlatform` "deploys" a cloud assembly into moto (buckets, table, topics, model package
group, the state machine with its definition resolved exactly as CloudFormation would) and
routes every Lambda task to the project's handler, imported in-process with the environment
its template gives it. A training backend decides what SageMaker jobs do: scripted outcomes
for tests, or real local training for the demo.

Where moto behaves unlike AWS, localrun/aws/moto_fixes.py patches it, one named patch each (Lambda
tasks run in-process, AWS's error names and JSON results, Wait states, retries and approval
timeouts on a configurable clock); what moto lacks altogether is in localrun/aws/services.py.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import json
import logging
import os
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

import boto3
from botocore.credentials import Credentials
from moto import mock_aws
from moto.stepfunctions.parser.models import stepfunctions_parser_backends

from lambdas.backends import BACKENDS, backend
from lambdas.validate import start_proof
from localrun.aws import construct_paths, moto_fixes
from localrun.aws.cfn import ACCOUNT, REGION, Assembly, Resolver
from localrun.aws.clock import Clock
from localrun.aws.decision_url import function_url_event
from localrun.aws.environ import handler_environment, handler_stdout
from localrun.aws.iam import LAMBDA, SAGEMAKER, LocalIam, acting_as
from localrun.aws.services import (
    EventRules,
    Faults,
    execution_status_changes,
    failing_publish,
    first_call_fails,
    injected_api_errors,
    lambda_throttle,
    lambda_timeout,
    object_created_events,
    stop_training_job,
)
from localrun.backends import queue as local_queue
from localrun.backends.tuning import LocalTuning
from localrun.demo.jobs import Job

REST_SECONDS = 0.1
"""The least time `LocalPlatform.wait` rests between two looks at what it waits for."""

REQUESTER = f"arn:aws:iam::{ACCOUNT}:role/MLEngineer"
"""Who starts the local platform's runs unless told otherwise: not an approver, as a person who asks for a run."""


class TrainingBackend(Protocol):
    """What happens to training jobs the state machine creates."""

    def bind(self, credentials: Callable[[str], Credentials]) -> None:
        """Receive how to act as a job's execution role (a session per role ARN)."""

    def created(self, name: str, request: dict[str, Any], job: Any) -> None: ...

    def described(self, name: str, job: Any) -> None: ...

    def stopped(self, name: str, job: Any) -> None:
        """StopTrainingJob was called: stop the job's instances; describe then reports it Stopped."""


class LocalPlayer(Protocol):
    """A backend other than SageMaker, played on this machine: it answers its service's API in moto's place.

    Each backend's declaration (lambdas/backends/) names the function that makes its player for the demo
    (`PlayerFactory`); SageMaker's jobs are moto's own, played by the platform's `training`.
    """

    datasets_bucket: str
    local_hyperparameters: dict[str, str]
    """What its jobs run instead of the request's hyperparameters (the demo's local scale)."""

    def patches(self) -> list[Any]:
        """moto's responses for the backend's API, answered by the player."""

    def bind(self, platform: LocalPlatform) -> None:
        """The platform is deployed: take what the player needs of it (roles, resources of the assembly)."""

    def job_facts(self) -> list[Job]:
        """Its jobs, as the run report shows them."""

    def close(self) -> None:
        """Stop whatever still runs."""


class PlayerFactory(Protocol):
    def __call__(
        self, root: Path, *, max_hosts: int, spot_interrupt: bool, on_line: Callable[[str, str], None]
    ) -> LocalPlayer: ...


def player_factories() -> dict[str, PlayerFactory]:
    """How the demo plays each registered backend that has a local player, by name."""
    factories = {}
    for name, declared in BACKENDS.items():
        if declared.local is not None:
            module, _, attribute = declared.local.rpartition(".")
            factories[name] = cast(PlayerFactory, getattr(importlib.import_module(module), attribute))
    return factories


@dataclass
class LambdaCall:
    function: str
    handler: str
    event: Any
    result: Any = None
    error: str | None = None
    message: str = ""
    """The error's message, with `error` its type."""


class _Context:
    """The parts of the Lambda context object the handlers (and Powertools) read."""

    def __init__(self, name: str) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _as_answered(event: dict[str, Any]) -> dict[str, Any]:
    """An event of moto's history as GetExecutionHistory answers it: its time (ISO 8601, to the ms) a datetime."""
    return {**_without_empty(event), "timestamp": datetime.fromisoformat(event["timestamp"])}


def _without_empty(value: Any) -> Any:
    """No empty fields, names as strings: what the API's serializer leaves of a value."""
    if isinstance(value, dict):
        return {key: _without_empty(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_empty(item) for item in value]
    return value.value if isinstance(value, enum.Enum) else value


# Handlers run one at a time: their modules' globals (Powertools loggers, cached clients) are shared
# in this process, where in Lambda each function has its own.
_HANDLER_LOCK = threading.Lock()


class LocalPlatform:
    """The platform's pipeline, deployed into moto from a cloud assembly.

    `state_machine` is the construct path of the state machine to run (default: the pipeline
    stack's `TrainingPipeline`). Functions are named by the end of their construct path
    (localrun/aws/construct_paths.py): `invoke("ApprovalDecide", ...)`, `environment("Monitor")`.
    """

    def __init__(
        self,
        assembly_dir: Path,
        *,
        training: TrainingBackend,
        clock: Clock | None = None,
        handler_log: TextIO | None = None,
        enforce_iam: bool = True,
        state_machine: str | None = None,
        players: dict[str, LocalPlayer] | None = None,
    ) -> None:
        self.assembly = Assembly.load(assembly_dir)
        self.resolver = Resolver(self.assembly)
        self.state_machine = construct_paths.state_machine(self.assembly, state_machine)
        self.training = training
        self.players = dict(players or {})
        """What each other backend's jobs do, by backend name (e.g. localrun/backends/batch.py); a backend without
        one is left to moto's own API."""
        for name in self.players:
            backend(name)  # a registered backend, or KeyError naming them
        self.clock = clock or Clock()
        self.lambda_calls: list[LambdaCall] = []
        # Where the handlers' (Powertools) log lines go; None leaves them on stdout, as in Lambda.
        self.handler_log = handler_log
        self._redirected: list[logging.StreamHandler[Any]] = []
        self.training_requests: dict[str, dict[str, Any]] = {}
        self.functions = construct_paths.Functions(self.assembly, self.resolver)
        # Executions run on moto's threads; none may outlive this platform into the next mock.
        self._started: list[str] = []
        self._inflight = threading.Condition()
        self._handlers_running = 0
        self._closed = False
        self._stack = contextlib.ExitStack()
        self.pipeline_stack = self.state_machine.stack
        self.enforce_iam = enforce_iam
        self.queue = local_queue.from_assembly(self.assembly, self.resolver)
        """The teams' Batch queue (settings `teams`), played locally; None when the assembly has none."""

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LocalPlatform:
        self._stack.enter_context(
            mock_aws(
                config={
                    "stepfunctions": {"execute_state_machine": True},
                    # Roles of the image stack attach AWS managed policies (CDK provider functions).
                    "iam": {"load_aws_managed_policies": True},
                }
            )
        )
        for patch in self._moto_fixes() + [p for player in self.players.values() for p in player.patches()]:
            self._stack.enter_context(patch)
        self.faults = Faults(function_named=lambda name: self.functions.named(name).name)
        self.events = EventRules(self.assembly, self.resolver, invoke=self._run_handler, now=self.clock.now)
        # SageMaker's tuning jobs, whose trials the training backend runs as it runs any job.
        self.tuning = LocalTuning(created=self._training_job_created, stopped=self.training.stopped)
        for patch in (
            failing_publish(self.faults),
            injected_api_errors(self.faults),
            stop_training_job(self.training.stopped),
            execution_status_changes(self.events),
            object_created_events(self.events),
            *self.tuning.patches(),
            *(self.queue.patches() if self.queue is not None else []),
        ):
            self._stack.enter_context(patch)
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        # The harness deploys and inspects as the account's administrator: moto's fake keys.
        self.iam = LocalIam(self.assembly, self.resolver, operator_key=os.environ["AWS_ACCESS_KEY_ID"])
        self._deploy()
        if self.enforce_iam:
            self._stack.enter_context(self.iam.enforced())
            self.training.bind(lambda role: self.iam.credentials(role, SAGEMAKER))
        for player in self.players.values():
            player.bind(self)
        if self.queue is not None:
            self.queue.bind(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.close()  # executions stopped on closing are not runs ending: nothing to deliver
        # Executions the platform started itself (a retrain sweep) are stopped like the harness's own.
        running = self.sfn.list_executions(stateMachineArn=self.state_machine_arn, statusFilter="RUNNING")
        for arn in dict.fromkeys([*self._started, *(e["executionArn"] for e in running["executions"])]):
            if self.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
                self.sfn.stop_execution(executionArn=arn, error="PlatformClosed", cause="local platform closed")
        with self._inflight:
            self._closed = True
            self._inflight.wait_for(lambda: self._handlers_running == 0, timeout=30)
        for player in self.players.values():
            player.close()
        self._stack.close()
        for handler in self._redirected:  # the handler modules outlive this platform
            handler.setStream(sys.stdout)

    # -- what the tests and the demo use -----------------------------------------------------
    def start(self, execution_input: Any, name: str | None = None, *, requester: str | None = REQUESTER) -> str:
        """Start a run as `tp start` does: with a start proof signed by a session of `requester`.

        An input that holds a proof already is sent as it is; `requester=None` sends no proof.
        """
        name = name or uuid.uuid4().hex
        if requester is not None and isinstance(execution_input, dict) and start_proof.FIELD not in execution_input:
            credentials = self.person(requester, "starter").get_credentials()
            execution_input = start_proof.attach(
                execution_input,
                state_machine=self.state_machine_arn,
                execution_name=name,
                credentials=credentials.get_frozen_credentials(),
                artifacts_bucket=self.environment("Validate")["ARTIFACTS_BUCKET"],
            )
        arn = str(
            self.sfn.start_execution(
                stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(execution_input)
            )["executionArn"]
        )
        self._started.append(arn)
        return arn

    def wait(
        self, execution_arn: str, timeout: float = 60.0, *, until: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """Describe the execution once `until()` holds (without `until`, once it ends); fail after `timeout` seconds.
        The description is taken after `until()` held: it is never older than what `until()` saw.

        An ended execution does not end the wait for `until`: what follows its end (the EventBridge
        deliveries of its status change) happens on other threads, after the status is ABORTED.
        """
        deadline = time.monotonic() + timeout
        while True:
            checked = time.monotonic()
            if until is None or until():
                described: dict[str, Any] = self.sfn.describe_execution(executionArn=execution_arn)
                if until is not None or described["status"] != "RUNNING":
                    return described
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"what was awaited did not happen in {timeout} s: {self.explain(execution_arn)}; "
                    f"states entered: {self.states_entered(execution_arn)}"
                )
            # A check holds the GIL the execution's own thread needs: resting at least twice as long as it took leaves
            # that thread two thirds of this one's share, and a tenth of a second between looks keeps the wait itself
            # from being the work (nothing awaited here happens in less).
            time.sleep(max(REST_SECONDS, 2 * (time.monotonic() - checked)))

    def explain(self, *execution_arns: str) -> str:
        """What a wait that failed needs said: each execution's status, error and cause; every handler that raised."""
        ended = []
        if not execution_arns:
            listed = self.sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]
            execution_arns = tuple(e["executionArn"] for e in listed)
        for arn in execution_arns:
            described = self.sfn.describe_execution(executionArn=arn)
            ended.append(
                f"{described['name']} {described['status']} (error {described.get('error')!r}, "
                f"cause {described.get('cause')!r})"
            )
        failed = [f"{c.function}: {c.error}: {c.message}" for c in self.lambda_calls if c.error]
        return f"{'; '.join(ended)}; handlers that raised: {failed or 'none'}"

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        """The execution's events, oldest first, as GetExecutionHistory answers them: read from moto's engine, without
        the API's request and answer, which took 50 times the CPU (the tests and the demo read it at every look)."""
        _, _, _, region, account, _ = execution_arn.split(":", 5)
        events = stepfunctions_parser_backends[account][region].get_execution_history(execution_arn)["events"]
        return [_as_answered(cast(dict[str, Any], event)) for event in events]

    def states_entered(self, execution_arn: str) -> list[str]:
        return [
            e["stateEnteredEventDetails"]["name"]
            for e in self.history(execution_arn)
            if e["type"].endswith("StateEntered")
        ]

    def invoke(self, function: str, event: dict[str, Any]) -> Any:
        """Call a platform handler directly (e.g. the approval decision behind the function URL)."""
        return self._run_handler(self.functions.named(function).name, event)

    def person(
        self, role_arn: str, session_name: str = "person", *, tags: dict[str, str] | None = None
    ) -> boto3.Session:
        """A person's AWS session in this account (as SSO would give): the role is created if needed (with `tags`,
        which then become its principal tags), then assumed."""
        iam = boto3.client("iam", region_name=REGION)
        name = role_arn.rsplit("/", 1)[-1]
        path = "/" + role_arn.split(":role/", 1)[1].rsplit("/", 1)[0] + "/" if role_arn.count("/") > 1 else "/"
        trust = {
            "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": "sts:AssumeRole"}
            ]
        }
        with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
            iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument=json.dumps(trust))
        if tags:
            iam.tag_role(RoleName=name, Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
        credentials = boto3.client("sts", region_name=REGION).assume_role(
            RoleArn=role_arn, RoleSessionName=session_name
        )
        keys = credentials["Credentials"]
        return boto3.Session(
            aws_access_key_id=keys["AccessKeyId"],
            aws_secret_access_key=keys["SecretAccessKey"],
            aws_session_token=keys["SessionToken"],
            region_name=REGION,
        )

    def call_decision_url(
        self,
        session: boto3.Session,
        method: str,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """What `tp approve|reject|pending` sends to the decision URL, delivered as the function URL delivers it."""
        from tools.tp import signed_request  # noqa: PLC0415 - the CLI approvers use

        url = self.environment("ApprovalRequest")["DECISION_URL"]
        request = signed_request(url, method, body, session, query=query)
        data = request.data if isinstance(request.data, bytes) else None
        event = function_url_event(
            method, dict(request.header_items()), urllib.parse.urlsplit(request.full_url).query, data
        )
        return self.invoke("ApprovalDecide", event)

    def function_session(self, function: str) -> Credentials:
        """The credentials a platform function runs with (a session of its execution role)."""
        return self._role(self.functions.named(function).name)

    def training_key_arn(self) -> str:
        """The platform key, as the training job's request names it (OutputDataConfig.KmsKeyId)."""
        for state in self.definition["States"].values():
            parameters = state.get("Parameters", {})
            if "OutputDataConfig" in parameters:
                return str(parameters["OutputDataConfig"]["KmsKeyId"])
        raise KeyError("the state machine creates no training job")

    def environment(self, function: str) -> dict[str, str]:
        """A platform function's environment variables, as its template gives them."""
        return self.functions.environment(self.functions.named(function))

    # -- deploy ------------------------------------------------------------------------------
    def _deploy(self) -> None:
        self.iam.deploy_roles()
        s3 = boto3.client("s3", region_name=REGION)
        for stack, logical, bucket in self.assembly.resources("AWS::S3::Bucket"):
            name = self.resolver.ref(stack, logical)
            s3.create_bucket(Bucket=name)
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
            notifications = bucket["Properties"].get("NotificationConfiguration", {})
            if notifications.get("EventBridgeConfiguration", {}).get("EventBridgeEnabled"):
                s3.put_bucket_notification_configuration(
                    Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
                )
        for stack, _, policy in self.assembly.resources("AWS::S3::BucketPolicy"):
            props = self.resolver.resolve(stack, policy["Properties"])
            s3.put_bucket_policy(Bucket=props["Bucket"], Policy=json.dumps(props["PolicyDocument"]))
        self._deploy_keys()
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        for stack, logical, resource in self.assembly.resources("AWS::DynamoDB::Table"):
            props = resource["Properties"]
            indexes = [
                {k: index[k] for k in ("IndexName", "KeySchema", "Projection")}
                for index in props.get("GlobalSecondaryIndexes", [])
            ]
            dynamodb.create_table(
                TableName=self.resolver.ref(stack, logical),
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode="PAY_PER_REQUEST",
                **({"GlobalSecondaryIndexes": indexes} if indexes else {}),
            )
        sns = boto3.client("sns", region_name=REGION)
        self.topics = {}
        for _stack, logical, _ in self.assembly.resources("AWS::SNS::Topic"):
            self.topics[logical] = sns.create_topic(Name=logical)["TopicArn"]
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        for stack, _, resource in self.assembly.resources("AWS::SageMaker::ModelPackageGroup"):
            sagemaker.create_model_package_group(
                ModelPackageGroupName=self.resolver.resolve(stack, resource["Properties"]["ModelPackageGroupName"])
            )
        machine = self.state_machine
        properties = machine.resource["Properties"]
        definition = machine.definition(self.resolver)
        self.definition = json.loads(definition)
        self.state_machine_role_arn = str(self.resolver.resolve(machine.stack, properties["RoleArn"]))
        # Under the name CloudFormation gives it (its StateMachineName), which the rules' patterns and policies name.
        name = str(self.resolver.resolve(machine.stack, properties.get("StateMachineName", machine.logical)))
        self.state_machine_arn = self.sfn.create_state_machine(
            name=name, definition=definition, roleArn=self.state_machine_role_arn
        )["stateMachineArn"]
        self._sqs_subscriptions(sns)

    def _deploy_keys(self) -> None:
        """Every KMS key with its key policy, under the key ID the templates' references resolve to."""
        from moto.kms.models import kms_backends  # noqa: PLC0415 - moto loads backends lazily

        backend = kms_backends[ACCOUNT][REGION]
        for stack, logical, resource in self.assembly.resources("AWS::KMS::Key"):
            wanted = str(self.resolver.ref(stack, logical))
            policy = self.resolver.resolve(stack, resource["Properties"].get("KeyPolicy"))
            key = backend.create_key(json.dumps(policy), "ENCRYPT_DECRYPT", "SYMMETRIC_DEFAULT", logical, None)
            del backend.keys[key.id]
            key.id, key.arn = wanted, f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{wanted}"
            backend.keys[wanted] = key

    def _sqs_subscriptions(self, sns: Any) -> None:
        """An SQS queue on every topic, so tests and the demo can read what was published."""
        sqs = boto3.client("sqs", region_name=REGION)
        self.queues = {}
        for logical, arn in self.topics.items():
            url = sqs.create_queue(QueueName=f"{logical}-inbox")["QueueUrl"]
            queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "false"})
            self.queues[logical] = url

    def messages(self, topic_prefix: str) -> list[dict[str, Any]]:
        """Everything published to a topic so far (SNS envelopes: Subject, Message, MessageAttributes)."""
        sqs = boto3.client("sqs", region_name=REGION)
        (url,) = [u for name, u in self.queues.items() if name.startswith(topic_prefix)]
        out: list[dict[str, Any]] = []
        while True:
            batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not batch:
                return out
            for message in batch:
                out.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    # -- Lambda -------------------------------------------------------------------------------
    def _run_handler(self, function_name: str, event: Any) -> Any:
        function = self.functions[function_name]
        handler_path = function.resource["Properties"]["Handler"]
        module_name, _, attribute = handler_path.rpartition(".")
        handler = getattr(importlib.import_module(module_name), attribute)
        if self.handler_log is not None:
            self._redirect_handler_logs()
        call = LambdaCall(function=function_name, handler=handler_path, event=event)
        with self._inflight:
            if self._closed:  # a stopped execution's thread, late: it must not reach the next platform
                raise RuntimeError("the local platform is closed")
            self._handlers_running += 1
        self.lambda_calls.append(call)
        try:
            environment = self.functions.environment(function)
            with (
                _HANDLER_LOCK,
                handler_environment(environment),
                handler_stdout(self.handler_log),
                acting_as(self._role(function_name), s3_endpoint=self._s3_endpoint(function_name)),
                first_call_fails(self.faults.api_error(function_name)),
            ):
                try:
                    call.result = handler(event, _Context(function_name))
                except Exception as exc:
                    call.error, call.message = type(exc).__name__, str(exc)
                    raise
        finally:
            with self._inflight:
                self._handlers_running -= 1
                self._inflight.notify_all()
        return call.result

    def _s3_endpoint(self, function_name: str) -> str | None:
        """The VPC's S3 gateway endpoint, for a function that runs in the VPC (its only route to S3)."""
        if not self.functions[function_name].resource["Properties"].get("VpcConfig"):
            return None
        (endpoint,) = [
            self.resolver.ref(stack, logical)
            for stack, logical, resource in self.assembly.resources("AWS::EC2::VPCEndpoint")
            if resource["Properties"].get("VpcEndpointType") == "Gateway"
            and str(self.resolver.resolve(stack, resource["Properties"]["ServiceName"])).endswith(".s3")
        ]
        return str(endpoint)

    def _role(self, function_name: str) -> Credentials:
        """The credentials Lambda gives the function: a session of its execution role."""
        function = self.functions[function_name]
        role = self.resolver.resolve(function.stack, function.resource["Properties"]["Role"])
        return self.iam.credentials(role, LAMBDA, f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}")

    def _redirect_handler_logs(self) -> None:
        """Point every stdout log handler (Powertools writes JSON lines to stdout) at `handler_log`."""
        for logger in [logging.getLogger(), *logging.root.manager.loggerDict.values()]:
            if isinstance(logger, logging.Logger):
                for handler in logger.handlers:
                    if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                        handler.setStream(self.handler_log)
                        self._redirected.append(handler)

    def _invoke(
        self, _backend: Any, function_name: str, _qualifier: Any, body: Any, _headers: Any, response_headers: Any
    ) -> bytes:
        name = function_name.rsplit(":function:", maxsplit=1)[-1].split(":", maxsplit=1)[0]
        if self.faults.throttled(name):
            raise lambda_throttle()
        if self.faults.timed_out(name):  # Lambda ends the invocation at its timeout: the handler's work is lost
            response_headers["x-amz-function-error"] = "Unhandled"
            timeout = self.functions[name].resource["Properties"].get("Timeout", 3)
            return json.dumps(lambda_timeout(name, timeout)).encode()
        event = json.loads(body) if body else {}
        try:
            result = self._run_handler(name, event)
        except Exception as exc:  # the Lambda service reports any handler exception this way
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc), "trace": []}).encode()
        return json.dumps(result).encode()

    # -- SageMaker ------------------------------------------------------------------------------
    def _training_job_created(self, name: str, request: dict[str, Any], job: Any) -> None:
        self.training_requests[name] = request  # the full request: moto keeps only some fields
        self.training.created(name, request, job)

    # -- patches --------------------------------------------------------------------------------
    def _moto_fixes(self) -> list[Any]:
        clock = self.clock
        return [
            moto_fixes.lambda_in_process(self._invoke),
            moto_fixes.lambda_service_error_names(),
            moto_fixes.lambda_unknown_errors(),
            moto_fixes.bucket_policies_left_to_local_iam(),
            moto_fixes.wait_states_on(clock),
            moto_fixes.retry_intervals_on(clock),
            moto_fixes.approval_timeouts_on(clock),
            moto_fixes.sdk_results_as_json(),
            moto_fixes.start_execution_as_step_functions_calls_it(),
            moto_fixes.sdk_service_error_names(),
            moto_fixes.sdk_generic_error_names(),
            moto_fixes.execution_start_time_as_iso(),
            moto_fixes.stopped_executions_keep_error_and_cause(),
            moto_fixes.execution_history_in_pages(),
            moto_fixes.stopped_callback_tasks_end_quietly(),
            moto_fixes.stopped_executions_stay_stopped(),
            moto_fixes.executions_stopped_before_their_worker_starts(),
            moto_fixes.callbacks_pass_over_executions_not_started(),
            moto_fixes.create_training_job(self._training_job_created),
            moto_fixes.describe_training_job(self.training.described),
            moto_fixes.aws_managed_policies_only(self._aws_managed_policies()),
            moto_fixes.roles_read_from_a_copy(),
            moto_fixes.definitions_validated_once(),
            moto_fixes.key_material_on_first_use(),
        ]

    def _aws_managed_policies(self) -> list[str]:
        """The names of the AWS managed policies that roles of the assembly attach."""
        arns = [
            arn
            for stack, _, role in self.assembly.resources("AWS::IAM::Role")
            for arn in self.resolver.resolve(stack, role["Properties"].get("ManagedPolicyArns", []))
        ]
        return [arn.rsplit("/", 1)[1] for arn in arns if ":iam::aws:policy/" in arn]
