"""Where moto behaves unlike AWS, one patch each: what moto does, and what AWS does instead.

Each function returns a patch (a context manager) for `LocalPlatform` to enter. Service behaviours
moto lacks altogether are in localrun/aws/services.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any
from unittest import mock

from moto.awslambda.models import LambdaBackend
from moto.iam.access_control import PermissionResult
from moto.iam.models import AWSManagedPolicy, IAMBackend
from moto.s3.models import FakeBucket
from moto.sagemaker.exceptions import ResourceInUseException
from moto.sagemaker.models import SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
from moto.stepfunctions.parser.asl.component.program.program import Program
from moto.stepfunctions.parser.asl.component.state.exec import execute_state
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
    state_task_service_aws_sdk as sdk,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
    state_task_service_sfn as optimized_sfn,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped
from moto.stepfunctions.parser.asl.utils.encoding import to_json_str
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.parser.models import StepFunctionsParserBackend
from moto.stepfunctions.responses import StepFunctionResponse

from lambdas.shared.errors import SERVICE_ERRORS
from localrun.aws.clock import Clock


# -- Lambda ------------------------------------------------------------------------------------------
def lambda_in_process(invoke: Callable[..., bytes]) -> Any:
    """moto runs a function's code in a Docker container; here `invoke` runs the project's handler in-process.

    `invoke(backend, function_name, qualifier, body, headers, response_headers)` answers as Lambda
    does: the handler's result, or its error with `x-amz-function-error` set.
    """

    def invoke_in_process(backend: Any, *args: Any) -> bytes:
        return invoke(backend, *args)

    return mock.patch.object(LambdaBackend, "invoke", invoke_in_process)


def lambda_service_error_names() -> Any:
    """Name a Lambda *service* error as Step Functions does (`Lambda.TooManyRequestsException`), not "Exception",
    and a function error without errorType (a timeout) `Lambda.Unknown`.

    moto's engine gives every ClientError of a Lambda task the name "Exception", so a Retry on
    Lambda's own errors (throttling, service faults) would never match.
    """
    from botocore.exceptions import ClientError  # noqa: PLC0415
    from moto.stepfunctions.parser.api import HistoryEventType, LambdaFunctionFailedEventDetails  # noqa: PLC0415
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import (  # noqa: PLC0415
        CustomErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent  # noqa: PLC0415
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import (  # noqa: PLC0415
        StateTaskLambda,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails  # noqa: PLC0415

    original = StateTaskLambda._from_error

    def from_error(state: Any, env: Any, ex: Exception) -> Any:
        if not isinstance(ex, ClientError):
            return original(state, env, _unknown_named(ex))
        code = ex.response["Error"]["Code"]
        name = f"Lambda.{code}" + ("" if code.endswith("Exception") else "Exception")
        details = LambdaFunctionFailedEventDetails(error=name, cause=ex.response["Error"]["Message"])
        return FailureEvent(
            env=env,
            error_name=CustomErrorName(name),
            event_type=HistoryEventType.LambdaFunctionFailed,
            event_details=EventDetails(lambdaFunctionFailedEventDetails=details),  # type: ignore[typeddict-item]
        )

    return mock.patch.object(StateTaskLambda, "_from_error", from_error)


UNKNOWN_CAUSE = "The cause could not be determined because Lambda did not return an error type. Returned payload:"


def _unknown_named(ex: Exception) -> Exception:
    """A function error that carries no errorType, named `Lambda.Unknown` as Step Functions names it."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils  # noqa: PLC0415

    if not isinstance(ex, lambda_eval_utils.LambdaFunctionErrorException):
        return ex
    try:
        if "errorType" in json.loads(ex.payload):
            return ex
    except (TypeError, ValueError):
        pass
    unknown = {"errorType": "Lambda.Unknown", "errorMessage": f"{UNKNOWN_CAUSE} {ex.payload}"}
    return lambda_eval_utils.LambdaFunctionErrorException(ex.function_error, json.dumps(unknown))


def lambda_unknown_errors() -> Any:
    """Name a function error that carries no errorType `Lambda.Unknown` (`arn:...:states:::lambda:invoke` tasks).

    Lambda reports a function that timed out or ran out of memory without an errorType; moto's engine
    names such an error "Exception". (Tasks whose resource is the function's ARN: `lambda_service_error_names`.)
    """
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_lambda import (  # noqa: PLC0415
        StateTaskServiceLambda,
    )

    original = StateTaskServiceLambda._from_error

    def from_error(state: Any, env: Any, ex: Exception) -> Any:
        return original(state, env, _unknown_named(ex))

    return mock.patch.object(StateTaskServiceLambda, "_from_error", from_error)


# -- IAM ---------------------------------------------------------------------------------------------
@functools.cache
def _aws_managed_policy_data() -> dict[str, Any]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data  # noqa: PLC0415

    return json.loads(aws_managed_policies_data)  # type: ignore[no-any-return]


def aws_managed_policies_only(names: Iterable[str]) -> Any:
    """Load only the AWS managed policies named (those the assembly attaches), parsed once per process.

    moto parses its copy of every AWS managed policy (about 1,600) again for each account and
    partition it touches: over a second of every local platform's start. The policies a role of
    the assembly does not attach cannot change what IAM allows it.
    """
    wanted = sorted(set(names))
    unknown = [name for name in wanted if name not in _aws_managed_policy_data()]
    if unknown:
        raise ValueError(f"not an AWS managed policy moto knows: {', '.join(unknown)}")

    def init_aws_policies(backend: IAMBackend) -> list[AWSManagedPolicy]:
        data = _aws_managed_policy_data()
        return [AWSManagedPolicy.from_data(n, backend.account_id, backend.region_name, data[n]) for n in wanted]

    return mock.patch.object(IAMBackend, "_init_aws_policies", init_aws_policies)


def roles_read_from_a_copy() -> Any:
    """moto finds a role (`get_role`, `get_role_by_arn`, on every call it judges) by iterating its dict of
    roles; a role created on another thread meanwhile ends that iteration with "dictionary changed size
    during iteration", and the call fails. AWS's IAM serves both at once. Here every lookup iterates a
    copy, which `list()` takes in one step under the GIL.

    The harness creates people's roles (`LocalPlatform.person`) while handlers and executions run on
    other threads.
    """

    def get_roles(backend: IAMBackend) -> list[Any]:
        return list(backend.roles.values())

    return mock.patch.object(IAMBackend, "get_roles", get_roles)


# -- KMS ---------------------------------------------------------------------------------------------
class _MaterialOnFirstUse:
    """moto's asymmetric key material for a key spec, made the first time Sign, Verify or GetPublicKey needs it."""

    def __init__(self, generate: Callable[[str], Any], key_spec: str) -> None:
        self._generate, self._key_spec = generate, key_spec

    @functools.cached_property
    def _material(self) -> Any:
        return self._generate(self._key_spec)

    def sign(self, message: bytes, signing_algorithm: str) -> bytes:
        return self._material.sign(message, signing_algorithm)  # type: ignore[no-any-return]

    def verify(self, message: bytes, signature: bytes, signing_algorithm: str) -> bool:
        return self._material.verify(message, signature, signing_algorithm)  # type: ignore[no-any-return]

    def public_key(self) -> bytes:
        return self._material.public_key()  # type: ignore[no-any-return]


def key_material_on_first_use() -> Any:
    """moto makes every key a private key when it creates it, a 2048-bit RSA key for a symmetric one too (a
    fifth of a second each, four keys a local platform); AWS's symmetric keys have none. Here the material is
    made when a call first uses it, the same material moto would have made; the platform's keys never need it.
    """
    from moto.kms import models  # noqa: PLC0415

    generate = models.generate_private_key  # type: ignore[attr-defined]
    return mock.patch.object(models, "generate_private_key", functools.partial(_MaterialOnFirstUse, generate))


# -- S3 ----------------------------------------------------------------------------------------------
def bucket_policies_left_to_local_iam() -> Any:
    """moto applies a bucket policy to object calls ignoring its conditions, so the TLS-only Deny denies
    every call; AWS evaluates the conditions. The local IAM (localrun/aws/iam.py) judges bucket policies
    with their conditions instead, so moto's own check is made neutral.
    """
    return mock.patch.object(FakeBucket, "get_permission", lambda *_: PermissionResult.NEUTRAL)


# -- Step Functions: time --------------------------------------------------------------------------
def wait_states_on(clock: Clock) -> Any:
    """moto's Wait states sleep the wall clock for their seconds; here they sleep `seconds * clock.wait_scale`.

    In AWS a Wait state lasts its seconds; the definition is unchanged, only local time is scaled
    (and each wait is recorded in `clock.waits`).
    """

    def wait(_self: Any, env: Any, wait_seconds: float) -> None:
        clock.waits.append(wait_seconds)
        if clock.wait_scale:
            env.program_state_event.wait(wait_seconds * clock.wait_scale)

    return mock.patch.object(WaitFunction, "_wait_interval", wait)


def retry_intervals_on(clock: Clock) -> Any:
    """moto sleeps a Retry's interval on the wall clock, as AWS waits it; here `interval * clock.retry_scale`.

    Each interval is recorded in `clock.retries`.
    """

    def retry_sleep(seconds: float) -> None:
        clock.retries.append(seconds)
        if clock.retry_scale:
            time.sleep(seconds * clock.retry_scale)

    return mock.patch.object(retrier_decl, "time", mock.Mock(sleep=retry_sleep))


def approval_timeouts_on(clock: Clock) -> Any:
    """A `.waitForTaskToken` task's TimeoutSeconds, multiplied by `clock.approval_timeout_scale`.

    Human approvals time out in hours, in moto as in AWS; a test can make that seconds without
    changing the definition.
    """
    original = execute_state.ExecutionState._evaluate_with_timeout

    def evaluate_with_timeout(state: Any, env: Any) -> None:
        timeout = state.timeout
        human = isinstance(state, StateTaskServiceCallback) and "waitForTaskToken" in str(state.resource.resource_arn)
        if human and isinstance(timeout, TimeoutSeconds) and clock.approval_timeout_scale != 1.0:
            scaled = max(1, round(timeout.timeout_seconds * clock.approval_timeout_scale))
            state.timeout = TimeoutSeconds(timeout_seconds=scaled)
        try:
            original(state, env)
        finally:
            state.timeout = timeout

    return mock.patch.object(execute_state.ExecutionState, "_evaluate_with_timeout", evaluate_with_timeout)


# -- Step Functions: executions --------------------------------------------------------------------
def stopped_executions_keep_error_and_cause() -> Any:
    """moto's StopExecution drops its `error` and `cause`; Step Functions records them: DescribeExecution and the
    execution's status change event say why it was stopped."""
    original = StepFunctionResponse.stop_execution

    def stop_execution(response: Any) -> Any:
        execution = response.stepfunction_backend.describe_execution(response._get_param("executionArn"))
        if execution.status == "RUNNING":  # before it stops: its status change event carries them
            execution.error, execution.cause = response._get_param("error"), response._get_param("cause")
        return original(response)

    return mock.patch.object(StepFunctionResponse, "stop_execution", stop_execution)


HISTORY_PAGE = 100
"""GetExecutionHistory's page without `maxResults` (Step Functions' default; it allows up to 1000)."""


def execution_history_in_pages() -> Any:
    """moto answers GetExecutionHistory with every event at once; Step Functions pages it: at most `maxResults`
    events (HISTORY_PAGE without it), in the order asked for (`reverseOrder`), and a `nextToken` for the rest."""
    original = StepFunctionResponse.get_execution_history

    def get_execution_history(response: Any) -> Any:
        answer = original(response)
        history: Any = answer.result
        events = list(history["events"] if isinstance(history, dict) else history)
        if response._get_param("reverseOrder"):
            events.reverse()
        start = int(response._get_param("nextToken") or 0)
        size = int(response._get_param("maxResults") or HISTORY_PAGE)
        page: dict[str, Any] = {"events": events[start : start + size]}
        if start + size < len(events):
            page["nextToken"] = str(start + size)
        return type(answer)(page)

    return mock.patch.object(StepFunctionResponse, "get_execution_history", get_execution_history)


def stopped_callback_tasks_end_quietly() -> Any:
    """A `.waitForTaskToken` task whose execution was stopped while its request ran (a gate's ApprovalRequest) goes
    on in moto to evaluate its timeout, which a stopped execution skips, and takes the value under it for the timeout:
    the task fails with States.Runtime ('>' not supported between 'dict' and 'int') and the stopped execution ends
    FAILED. Step Functions ends it ABORTED; here the task ends where the stop found it."""
    original = StateTaskServiceCallback._eval_integration_pattern

    def eval_integration_pattern(state: Any, env: Any, *args: Any, **kwargs: Any) -> None:
        if env.is_running():
            original(state, env, *args, **kwargs)

    return mock.patch.object(StateTaskServiceCallback, "_eval_integration_pattern", eval_integration_pattern)


def stopped_executions_stay_stopped() -> Any:
    """A task of a stopped execution that then fails (its Lambda raised, its request timed out) makes moto replace
    the stop with the failure: the execution ends FAILED (or TIMED_OUT). Step Functions ends a stopped execution
    ABORTED, with the stop's error and cause, whatever its task in flight does after."""
    set_error, set_timed_out = Environment.set_error, Environment.set_timed_out

    def unless_stopped(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def end(env: Any, *args: Any, **kwargs: Any) -> None:
            with env._state_mutex:  # the lock set_stop takes (reentrant): no stop lands between the look and the end
                if not isinstance(env._program_state, ProgramStopped):
                    original(env, *args, **kwargs)

        return end

    return mock.patch.multiple(
        Environment, set_error=unless_stopped(set_error), set_timed_out=unless_stopped(set_timed_out)
    )


def callbacks_pass_over_executions_not_started() -> Any:
    """moto's SendTaskSuccess, SendTaskFailure and SendTaskHeartbeat (and its map-run calls) look for the task token
    in the environment of every execution, which an execution whose worker has not started has not made yet: while
    any run was starting, every callback failed with AttributeError ('NoneType' object has no attribute
    'callback_pool_manager'). Such an execution holds no token and no map run: it is passed over."""
    listed = StepFunctionsParserBackend._get_executions

    def started(backend: StepFunctionsParserBackend, execution_status: Any = None) -> list[Any]:
        executions = listed(backend, execution_status)
        return [e for e in executions if e.exec_worker is not None and e.exec_worker.env is not None]

    return mock.patch.object(StepFunctionsParserBackend, "_get_executions", started)


WORKER_START_SECONDS = 30.0
"""The longest a stop waits for the execution's worker to take it (the worker starts in milliseconds)."""


def executions_stopped_before_their_worker_starts() -> Any:
    """moto's execution is RUNNING once StartExecution answers, but the environment a stop acts on is made, and set
    running, only as its worker's threads start: a stop before then (a platform closed right after a start) fails
    with AttributeError ('NoneType' object has no attribute 'set_stop'), or is lost once the environment exists but
    runs nothing yet. Step Functions stops an execution at any time: here such a stop is handed to the worker, which
    takes it before its first state, and the stop returns once it has: the execution ends ABORTED, having run nothing.
    """
    stop, evaluate = ExecutionWorker.stop, Program._eval_body
    lock = threading.Lock()
    handed: dict[str, tuple[datetime, str | None, str | None]] = {}

    def stop_worker(worker: ExecutionWorker, stop_date: datetime, error: str | None, cause: str | None) -> None:
        arn = worker._evaluation_details.execution_details.arn
        with lock:
            begun = worker.env is not None and worker.env._program_state is not None
            if not begun:
                handed[arn] = (stop_date, error, cause)
        if begun:
            stop(worker, stop_date=stop_date, error=error, cause=cause)
            return
        deadline = time.monotonic() + WORKER_START_SECONDS
        while arn in handed:  # until the worker took it, while these patches (and the mock) are still in place
            if time.monotonic() > deadline:
                with lock:
                    handed.pop(arn, None)
                raise TimeoutError(f"execution {arn}: its worker did not start in {WORKER_START_SECONDS} s")
            time.sleep(0.01)

    def evaluate_unless_stopped(program: Program, env: Environment) -> None:
        with lock:
            stopped = handed.pop(env.states.context_object.context_object_data["Execution"]["Id"], None)
        if stopped is not None:
            stop_date, error, cause = stopped
            env.set_stop(stop_date=stop_date, cause=cause, error=error)
        evaluate(program, env)

    return _together(
        mock.patch.object(ExecutionWorker, "stop", stop_worker),
        mock.patch.object(Program, "_eval_body", evaluate_unless_stopped),
    )


@contextlib.contextmanager
def _together(*patches: Any) -> Iterator[None]:
    """Several patches as one."""
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


# -- Step Functions: definitions -------------------------------------------------------------------
_VALID_DEFINITIONS: set[str] = set()


def definitions_validated_once() -> Any:
    """Validate a state machine definition once per process, not at every CreateStateMachine.

    moto validates by parsing the whole definition (over a second for the pipeline's); a definition
    it accepted before is accepted again. Invalid ones are parsed, and refused, every time.
    """
    validate = StepFunctionsParserBackend._validate_definition

    def validate_once(definition: str) -> None:
        if definition not in _VALID_DEFINITIONS:
            validate(definition)
            _VALID_DEFINITIONS.add(definition)

    return mock.patch.object(StepFunctionsParserBackend, "_validate_definition", staticmethod(validate_once))


# -- Step Functions: SDK integrations --------------------------------------------------------------
def sdk_results_as_json() -> Any:
    """moto leaves an SDK task's result as boto3 returned it (datetime objects); Step Functions
    serialises results to JSON, so timestamps reach the next state as ISO strings.

    And moto passes an SDK task's parameters to boto3 as written, and its result back as boto3 names
    it; Step Functions takes and gives every member name in PascalCase (`JobName`, `JobArn` for
    Batch's camelCase `jobName`, `jobArn`), map keys (tags) as they are.
    """
    original = sdk.StateTaskServiceAwsSdk._eval_service_task

    def eval_service_task(
        task: Any, env: Any, resource_runtime_part: Any, normalised_parameters: dict[str, Any], **kwargs: Any
    ) -> None:
        operation = _operation_model(task._get_boto_service_name(), task._get_boto_service_action())
        parameters = _to_member_names(normalised_parameters, operation.input_shape)
        original(
            task,
            env=env,
            resource_runtime_part=resource_runtime_part,
            normalised_parameters=parameters,
            **kwargs,
        )
        env.stack[-1] = _to_pascal_case(json.loads(to_json_str(env.stack[-1])), operation.output_shape)

    return mock.patch.object(sdk.StateTaskServiceAwsSdk, "_eval_service_task", eval_service_task)


def start_execution_as_step_functions_calls_it() -> Any:
    """moto's optimized Step Functions integration (states:startExecution) passes the task's parameters to boto3 as
    written and gives back boto3's answer; Step Functions takes and gives them in PascalCase (`StateMachineArn`,
    `ExecutionArn`, `StartDate`), as the SDK integrations do (`sdk_results_as_json`)."""
    original = optimized_sfn.StateTaskServiceSfn._eval_service_task

    def eval_service_task(
        task: Any, env: Any, resource_runtime_part: Any, normalised_parameters: dict[str, Any], **kwargs: Any
    ) -> None:
        operation = _operation_model("stepfunctions", task._get_boto_service_action())
        parameters = _to_member_names(normalised_parameters, operation.input_shape)
        original(task, env=env, resource_runtime_part=resource_runtime_part, normalised_parameters=parameters, **kwargs)
        env.stack[-1] = _to_pascal_case(json.loads(to_json_str(env.stack[-1])), operation.output_shape)

    return mock.patch.object(optimized_sfn.StateTaskServiceSfn, "_eval_service_task", eval_service_task)


def _operation_model(service: str, action: str) -> Any:
    import botocore.session  # noqa: PLC0415
    from botocore import xform_name  # noqa: PLC0415

    model = botocore.session.get_session().get_service_model(service)
    (name,) = [op for op in model.operation_names if xform_name(op) == action]
    return model.operation_model(name)


def _to_member_names(value: Any, shape: Any) -> Any:
    """Parameter names as the service's model spells them, matched without regard to case."""
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        names = {name.lower(): name for name in shape.members}
        out = {}
        for key, item in value.items():
            name = names.get(key.lower(), key)
            out[name] = _to_member_names(item, shape.members.get(name))
        return out
    if shape.type_name == "list" and isinstance(value, list):
        return [_to_member_names(item, shape.member) for item in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {key: _to_member_names(item, shape.value) for key, item in value.items()}
    return value


def _to_pascal_case(value: Any, shape: Any) -> Any:
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {key[:1].upper() + key[1:]: _to_pascal_case(item, shape.members.get(key)) for key, item in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_to_pascal_case(item, shape.member) for item in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {key: _to_pascal_case(item, shape.value) for key, item in value.items()}
    return value


def sdk_service_error_names() -> Any:
    """moto prefixes an SDK task's errors with the integration's name ("sagemaker", "batch"); Step Functions
    spells the service as its error names do (`SageMaker.ResourceLimitExceededException`, `Batch.ClientException`),
    as the definition's Retry and Catch do: every service of lambdas/shared/errors.py SERVICE_ERRORS.
    """
    return mock.patch.dict(sdk._SERVICE_ERROR_NAMES, {name: errors.prefix for name, errors in SERVICE_ERRORS.items()})


def sdk_generic_error_names() -> Any:
    """moto names an SDK error that the service's model does not declare `<Service>.<Service>Exception`; Step
    Functions names it by the service's generic exception (`SageMaker.AmazonSageMakerException`,
    `Batch.AWSBatchException`: throttling, most faults). Declared errors keep `<Service>.<Code>Exception`.
    """
    prefixes = {errors.prefix: errors for errors in SERVICE_ERRORS.values()}

    def error_name(service: str, exc: Exception) -> str:
        name = type(exc).__name__
        declared = name != "ClientError"
        if service in prefixes:
            return prefixes[service].named(name, declared=declared)
        return (
            f"{service}.{name}" + ("" if name.endswith("Exception") else "Exception")
            if declared
            else (f"{service}.Amazon{service}Exception")
        )

    return mock.patch.object(sdk.StateTaskServiceAwsSdk, "_normalise_exception_name", staticmethod(error_name))


def execution_start_time_as_iso() -> Any:
    """moto puts a datetime in the context object's `$$.Execution.StartTime`; in Step Functions the
    context object is JSON and the start time an ISO 8601 string (`2024-01-01T00:00:00.000Z`).
    """
    original = ExecutionWorker._get_evaluation_environment

    def evaluation_environment(worker: Any) -> Any:
        env = original(worker)
        execution = env.states.context_object.context_object_data["Execution"]
        start: Any = execution.get("StartTime")  # typed str by moto, a datetime at run time
        if isinstance(start, datetime):
            execution["StartTime"] = start.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return env

    return mock.patch.object(ExecutionWorker, "_get_evaluation_environment", evaluation_environment)


# -- SageMaker -------------------------------------------------------------------------------------
def create_training_job(created: Callable[[str, dict[str, Any], Any], None]) -> Any:
    """moto replaces a job whose name is taken, drops request fields and starts jobs Completed;
    SageMaker refuses a reused name and starts a job InProgress (Starting). `created(name, request, job)`
    receives the full request and decides what the job does next.
    """
    original = SageMakerResponse.create_training_job

    def create(response: Any) -> Any:
        request = json.loads(response.body)
        name = request["TrainingJobName"]
        backend = response.sagemaker_backend
        if name in backend.training_jobs:
            raise ResourceInUseException(f"Training job names must be unique within an account: {name} exists")
        result = original(response)
        job = backend.training_jobs[name]
        job.requested = request  # what DescribeTrainingJob answers with (`describe_training_job`)
        starting(job)
        created(name, request, job)
        return result

    return mock.patch.object(SageMakerResponse, "create_training_job", create)


def starting(job: Any) -> None:
    """moto's new training job as SageMaker starts one: InProgress (Starting), no metrics yet."""
    job.training_job_status = "InProgress"
    job.secondary_status = "Starting"
    job.final_metric_data_list = []
    job.secondary_status_transitions = [{"Status": "Starting", "StatusMessage": "Preparing the instances"}]


def start_training_job(backend: Any, name: str, request: dict[str, Any]) -> Any:
    """The training job `name` of the CreateTrainingJob `request`, made in moto's SageMaker `backend` as the service
    makes one it starts on its own authority (a service job's, a tuning job's trial), and `starting`."""
    job = backend.create_training_job(
        training_job_name=name,
        hyper_parameters=request.get("HyperParameters", {}),
        algorithm_specification=request["AlgorithmSpecification"],
        role_arn=request["RoleArn"],
        input_data_config=request.get("InputDataConfig", []),
        output_data_config=request["OutputDataConfig"],
        resource_config=request["ResourceConfig"],
        vpc_config=request.get("VpcConfig"),
        stopping_condition=request["StoppingCondition"],
        tags=request.get("Tags", []),
        enable_network_isolation=request.get("EnableNetworkIsolation", False),
        enable_inter_container_traffic_encryption=request.get("EnableInterContainerTrafficEncryption", False),
        enable_managed_spot_training=request.get("EnableManagedSpotTraining", False),
        checkpoint_config=request.get("CheckpointConfig"),
        debug_hook_config=None,
        debug_rule_configurations=None,
        tensor_board_output_config=None,
        experiment_config=None,
    )
    starting(job)
    return job


def describe_training_job(described: Callable[[str, Any], None]) -> Any:
    """moto's jobs never change after creation; a SageMaker job moves on while it runs.
    `described(name, job)` brings the job up to date before moto describes it.

    moto also answers a subset of the request (and metric definitions of its own); SageMaker answers every field
    the CreateTrainingJob request gave, with its defaults where the request gave none (`as_sagemaker_describes`).
    """
    original = SageMakerModelBackend.describe_training_job

    def describe(backend: Any, training_job_name: str) -> Any:
        job = backend.training_jobs.get(training_job_name)
        if job is not None:
            described(training_job_name, job)
        answer = original(backend, training_job_name)
        requested = getattr(job, "requested", None)
        if requested is None:
            return answer
        return {**answer, **as_sagemaker_describes({k: v for k, v in requested.items() if k != "Tags"})}

    return mock.patch.object(SageMakerModelBackend, "describe_training_job", describe)


def as_sagemaker_describes(request: dict[str, Any]) -> dict[str, Any]:
    """A CreateTrainingJob request's fields as DescribeTrainingJob answers them: its channels with their
    compression and record wrapping, the output's compression and the profiler's interval filled in."""
    answered: dict[str, Any] = json.loads(json.dumps(request))
    for channel in answered.get("InputDataConfig", []):
        channel.setdefault("CompressionType", "None")
        channel.setdefault("RecordWrapperType", "None")
    answered.get("OutputDataConfig", {}).setdefault("CompressionType", "GZIP")
    if "ProfilerConfig" in answered:
        answered["ProfilerConfig"].setdefault("ProfilingIntervalInMilliseconds", 500)
    return answered
