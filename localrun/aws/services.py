"""What the AWS services do that moto does not, played locally.

- SageMaker StopTrainingJob (moto has none): the job goes Stopping, its instances are stopped,
  and the next DescribeTrainingJob reports Stopped.
- EventBridge delivering a Step Functions execution's status change, and an S3 object created in a
  bucket whose EventBridge notifications are on, to the rules' Lambda targets (moto's rules deliver
  to SQS, logs and buses only), checked against the target function's resource policy as Lambda
  checks it.
- Faults a test injects where AWS could produce them: a throttled Lambda, a function that times out, an AWS
  call inside a handler that fails (throttled, 5xx, access denied), a failing SNS publish.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from botocore.client import BaseClient
from moto.awslambda.exceptions import LambdaClientError
from moto.events.models import EventPattern
from moto.s3 import notifications as s3_notifications
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.responses import SageMakerResponse
from moto.sns.exceptions import SNSException
from moto.sns.models import SNSBackend
from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication

from localrun.aws.cfn import ACCOUNT, REGION, Assembly, Resolver


class PerFunction(dict[str, Any]):
    """Function -> what to inject, each function named as LocalPlatform names it (the end of its construct
    path); a name that matches no function, or several, is refused when it is set.
    """

    def __init__(self, function_named: Callable[[str], str]) -> None:
        super().__init__()
        self.function_named = function_named

    def __setitem__(self, function: str, value: Any) -> None:
        self.function_named(function)
        super().__setitem__(function, value)

    def take(self, function_name: str) -> Any:
        """The next fault queued for the function of physical name `function_name` (None when there is none).

        A count gives True that many times; a list gives its items in turn.
        """
        for function, left in self.items():
            if left and self.function_named(function) == function_name:
                if isinstance(left, int):
                    super().__setitem__(function, left - 1)
                    return True
                super().__setitem__(function, left[1:])
                return left[0]
        return None


@dataclass
class Faults:
    """Failures to inject, per function (named as LocalPlatform names it), each used up by one invocation:

    - `throttle["Monitor"] = 3`: Lambda refuses the next three invocations (reserved concurrency exhausted);
    - `api_errors["Monitor"] = ["ThrottlingException"] * 3`: in each of the next three invocations, the
      handler's first AWS call fails with that error code (`API_ERRORS` says how AWS answers each);
    - `timeouts["Monitor"] = 2`: the next two invocations time out, as Lambda reports it;
    - `sns_failures = 2`: the next two SNS publishes fail;
    - `sdk_errors["SubmitServiceJob"] = ["TooManyRequestsException"] * 2`: the state machine's next two calls of
      that operation (its SDK tasks' operations, which no handler calls) fail with that error code.

    `function_named` maps such a name to the function's physical name (or raises, naming the candidates).
    """

    function_named: Callable[[str], str]
    throttle: PerFunction = field(init=False)
    api_errors: PerFunction = field(init=False)
    timeouts: PerFunction = field(init=False)
    sns_failures: int = 0
    sdk_errors: dict[str, list[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.throttle = PerFunction(self.function_named)
        self.api_errors = PerFunction(self.function_named)
        self.timeouts = PerFunction(self.function_named)

    def throttled(self, function_name: str) -> bool:
        with self._lock:
            return bool(self.throttle.take(function_name))

    def timed_out(self, function_name: str) -> bool:
        with self._lock:
            return bool(self.timeouts.take(function_name))

    def api_error(self, function_name: str) -> str | None:
        with self._lock:
            code = self.api_errors.take(function_name)
        if code is not None and code not in API_ERRORS:
            raise ValueError(f"api_errors: {code!r} is not an injectable error code; use one of {sorted(API_ERRORS)}")
        return code  # type: ignore[no-any-return]

    def sdk_error(self, operation: str) -> str | None:
        """The error code the next call of `operation` fails with, used up; None when none is queued."""
        with self._lock:
            queued = self.sdk_errors.get(operation) or []
            if not queued:
                return None
            self.sdk_errors[operation] = queued[1:]
        if queued[0] not in API_ERRORS:
            raise ValueError(
                f"sdk_errors: {queued[0]!r} is not an injectable error code; use one of {sorted(API_ERRORS)}"
            )
        return queued[0]

    def publish_fails(self) -> bool:
        with self._lock:
            if self.sns_failures > 0:
                self.sns_failures -= 1
                return True
            return False


def lambda_throttle() -> LambdaClientError:
    """What Lambda answers when reserved concurrency is exhausted."""
    error = LambdaClientError("TooManyRequestsException", "Rate exceeded")
    error.code = 429
    return error


def lambda_timeout(function_name: str, seconds: float) -> dict[str, str]:
    """The payload of a function error Lambda reports for an invocation that ran out of time: no errorType."""
    moment = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"errorMessage": f"{moment} {uuid.uuid4()} Task timed out after {seconds:.2f} seconds ({function_name})"}


# Error code -> (HTTP status, message), as the services answer.
API_ERRORS: dict[str, tuple[int, str]] = {
    "ThrottlingException": (400, "Rate exceeded"),
    "InternalFailure": (500, "The request processing has failed because of an unknown error."),
    "ServiceUnavailable": (503, "Service is unavailable."),
    "AccessDeniedException": (400, "User is not authorized to perform this action (injected)"),
    # AWS Batch: throttling is undeclared in its model (Step Functions: Batch.AWSBatchException); its declared errors.
    "TooManyRequestsException": (429, "Too Many Requests"),
    "ClientException": (400, "The quota share does not exist (injected)"),
    "ServerException": (500, "Internal server error (injected)"),
}
_PENDING_API_ERROR = threading.local()


@contextmanager
def first_call_fails(code: str | None) -> Iterator[None]:
    """Within the block, on this thread, the first AWS API call fails with `code` (None: no fault)."""
    _PENDING_API_ERROR.code = code
    try:
        yield
    finally:
        _PENDING_API_ERROR.code = None


def injected_api_errors(faults: Faults | None = None) -> Any:
    """botocore's API call, failing once with the error `first_call_fails` set on the calling thread, or with the
    next of `faults.sdk_errors` queued for its operation."""
    original = BaseClient._make_api_call

    def make_api_call(client: Any, operation_name: str, api_params: Any) -> Any:
        code = getattr(_PENDING_API_ERROR, "code", None)
        if code is not None:
            _PENDING_API_ERROR.code = None
        elif faults is not None:
            code = faults.sdk_error(operation_name)
        if code is not None:
            status, message = API_ERRORS[code]
            metadata = {"HTTPStatusCode": status, "RequestId": str(uuid.uuid4())}
            response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": metadata}
            raise client.exceptions.from_code(code)(response, operation_name)
        return original(client, operation_name, api_params)

    return mock.patch.object(BaseClient, "_make_api_call", make_api_call)


def failing_publish(faults: Faults) -> Any:
    """SNS publish refused while `faults` say so (as when the topic's KMS key is throttled)."""
    original = SNSBackend.publish

    def publish(backend: Any, *args: Any, **kwargs: Any) -> Any:
        if faults.publish_fails():
            raise SNSException("KMSThrottling", "The request was denied due to request throttling by AWS KMS")
        return original(backend, *args, **kwargs)

    return mock.patch.object(SNSBackend, "publish", publish)


def stop_training_job(stopped: Callable[[str, Any], None]) -> Any:
    """moto has no StopTrainingJob: mark the job Stopping and let the training backend stop it."""

    def stop(response: Any) -> str:
        name = json.loads(response.body)["TrainingJobName"]
        job = response.sagemaker_backend.training_jobs.get(name)
        if job is None:
            raise ValidationError(message=f"Requested resource not found: training job {name}")
        if job.training_job_status != "InProgress":
            raise ValidationError(message=f"The training job {name} is not in progress ({job.training_job_status})")
        job.training_job_status = "Stopping"
        job.secondary_status = "Stopping"
        job.secondary_status_transitions.append({"Status": "Stopping", "StartTime": datetime.now(UTC)})
        stopped(name, job)
        return "{}"

    return mock.patch.object(SageMakerResponse, "stop_training_job", stop, create=True)


@dataclass
class EventRules:
    """The assembly's EventBridge rules, delivering to their Lambda targets as EventBridge does (asynchronously)."""

    assembly: Assembly
    resolver: Resolver
    invoke: Callable[[str, Any], Any]
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    """When events happen: the local Clock's time, so a test can let a quiet period pass."""
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    def rules(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for stack, logical, rule in self.assembly.resources("AWS::Events::Rule"):
            props = self.resolver.resolve(stack, rule["Properties"])
            if props.get("State", "ENABLED") == "ENABLED":
                yield f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{logical}", props

    def _permitted(self, function_arn: str, rule_arn: str) -> bool:
        """Lambda runs an EventBridge delivery only if its resource policy lets that rule invoke it."""
        for stack, _, permission in self.assembly.resources("AWS::Lambda::Permission"):
            props = self.resolver.resolve(stack, permission["Properties"])
            if (
                props["FunctionName"] == function_arn
                and props["Principal"] == "events.amazonaws.com"
                and props.get("SourceArn") in (None, rule_arn)
            ):
                return True
        return False

    def put(self, event: dict[str, Any]) -> None:
        """Deliver an event to the targets of every rule whose pattern matches it."""
        for rule_arn, props in self.rules():
            pattern = props.get("EventPattern")
            if pattern is not None and EventPattern(None, pattern).matches_event(event):  # type: ignore[arg-type]
                self._targets(rule_arn, props, event)

    def schedule_due(self, function: str | None = None) -> None:
        """Deliver one "Scheduled Event" to the targets of every schedule rule, as EventBridge does when due; with
        `function` (a physical name), only of the rules that target it."""
        for rule_arn, props in self.rules():
            targets = [target["Arn"].rsplit(":function:", 1)[-1] for target in props.get("Targets", [])]
            if "ScheduleExpression" in props and function in (None, *targets):
                event = event_envelope("Scheduled Event", "aws.events", rule_arn, {}, time=self.now())
                self._targets(rule_arn, props, event)

    def _targets(self, rule_arn: str, props: dict[str, Any], event: dict[str, Any]) -> None:
        if self._closed:
            return
        for target in props.get("Targets", []):
            name = target["Arn"].rsplit(":function:", 1)[-1]
            # Lambda refuses what its policy does not permit; EventBridge retries, then the dead-letter queue.
            permitted = self._permitted(target["Arn"], rule_arn)
            delivery = {"rule": rule_arn, "function": name, "event": event, "permitted": permitted}
            # A delivery is listed together with its thread, so that `drain` waits for every listed one.
            with self._lock:
                self.deliveries.append(delivery)
                if permitted:
                    thread = threading.Thread(target=self._deliver, args=(delivery, name, event), daemon=True)
                    thread.start()
                    self._threads.append(thread)

    def _deliver(self, delivery: dict[str, Any], name: str, event: dict[str, Any]) -> None:
        try:
            delivery["result"] = self.invoke(name, event)
        except Exception as exc:  # EventBridge would retry and then dead-letter it
            delivery["error"] = f"{type(exc).__name__}: {exc}"

    def drain(self, timeout: float = 30) -> None:
        """Wait for the deliveries under way to finish."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=timeout)

    def close(self, timeout: float = 30) -> None:
        self._closed = True
        self.drain(timeout)


def event_envelope(
    detail_type: str, source: str, resource: str, detail: dict[str, Any], *, time: datetime | None = None
) -> dict[str, Any]:
    """An event as EventBridge delivers it to a target."""
    moment = time or datetime.now(UTC)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT,
        "time": moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "region": REGION,
        "resources": [resource],
        "detail": detail,
    }


def execution_status_changes(rules: EventRules) -> Any:
    """Publish "Step Functions Execution Status Change" when an execution ends, as Step Functions does."""
    original = BaseExecutionWorkerCommunication.terminated

    def terminated(communication: Any) -> None:
        original(communication)
        execution = communication.execution
        rules.put(
            event_envelope(
                "Step Functions Execution Status Change",
                "aws.states",
                execution.exec_arn,
                {
                    "executionArn": execution.exec_arn,
                    "stateMachineArn": execution.state_machine_arn,
                    "name": execution.name,
                    "status": execution.exec_status.value,
                    "startDate": int(execution.start_date.timestamp() * 1000),
                    "error": execution.error,
                    "cause": execution.cause,
                },
            )
        )

    return mock.patch.object(BaseExecutionWorkerCommunication, "terminated", terminated)


def object_created_events(rules: EventRules) -> Any:
    """S3 sends "Object Created" to EventBridge for buckets whose notification configuration turns it on.

    moto builds that event for its own rules only; here it is built as S3 sends it (at the local
    Clock's time) and delivered to the assembly's rules.
    """

    def send(_account_id: str, bucket: Any, event_name: str, key: Any) -> None:
        if not event_name.startswith("s3:ObjectCreated:"):
            return
        detail = {
            "version": "0",
            "bucket": {"name": bucket.name},
            "object": {
                "key": key.name,
                "size": key.size,
                "etag": key.etag.replace('"', ""),
                "version-id": key.version_id,
                "sequencer": uuid.uuid4().hex[:16].upper(),
            },
            "request-id": uuid.uuid4().hex[:16].upper(),
            "requester": ACCOUNT,
            "reason": event_name.split(":")[2].replace("Put", "PutObject"),
        }
        rules.put(event_envelope("Object Created", "aws.s3", f"arn:aws:s3:::{bucket.name}", detail, time=rules.now()))

    return mock.patch.object(s3_notifications, "_send_event_bridge_message", send)
