"""Validate handler: execution input -> resolved request, or InvalidRequest with every problem."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lambdas.shared.env import env_int, env_json, env_str
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import PlatformLimits, resolve

logger = Logger(service="training-platform")


def limits_from_env() -> PlatformLimits:
    return PlatformLimits(
        datasets_bucket=env_str("DATASETS_BUCKET"),
        fsx_file_system_id=env_str("FSX_FILE_SYSTEM_ID"),
        fsx_mount_name=env_str("FSX_MOUNT_NAME"),
        training_subnet_ips=env_int("TRAINING_SUBNET_IPS"),
        max_runtime_hours=float(env_str("MAX_RUNTIME_HOURS")),
        volume_size_gb=env_int("VOLUME_SIZE_GB"),
        run_emails=tuple(env_json("RUN_EMAILS")),
        tags=dict(env_json("JOB_TAGS")),
    )


@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {"input": <execution input>, "execution_name": $$.Execution.Name}.

    An invalid input is an answer, not a fault: it returns `valid: false` with the message (so
    handler-error alarms mean platform faults only) and the state machine ends the run there.
    """
    try:
        request = resolve(event["input"], execution_name=event["execution_name"], limits=limits_from_env())
    except InvalidRequest as exc:
        logger.info("request rejected", extra={"problems": str(exc)})
        return {"valid": False, "message": str(exc), "request": None}
    logger.info("request resolved", extra={"run_name": request["run_name"], "job": request["job_name_base"]})
    return {"valid": True, "message": "", "request": request}
