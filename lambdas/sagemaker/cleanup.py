"""SageMaker's cleanup: no training job outlives its execution, and a run's checkpoints stop growing.

Invoked two ways:
- by the state machine on every way out of a run (`stop` after an orchestration failure, `prune`
  after the job ended): stops the jobs tagged with this execution, then prunes the run's
  checkpoints in S3 to the newest one it may resume from (contract/ledger.py `resumable`) of the run, and
  of each of its tuning trials;
- by EventBridge when an execution ends ABORTED, TIMED_OUT or FAILED (a person's StopExecution, the
  execution's own timeout): the same, for the jobs tagged with that execution.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from contract.service_requests import EXECUTION_TAG
from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import CLEANUP_EVENT, ended_execution, prune_runs
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def running_jobs(sagemaker: Any, execution: str) -> list[str]:
    """The names of the in-progress training jobs tagged with this execution."""
    names = []
    for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress"):
        for summary in page["TrainingJobSummaries"]:
            tags = sagemaker.list_tags(ResourceArn=summary["TrainingJobArn"])["Tags"]
            if {"Key": EXECUTION_TAG, "Value": execution} in tags:
                names.append(summary["TrainingJobName"])
    return names


def stop_jobs(sagemaker: Any, execution: str) -> list[str]:
    """Stop every in-progress job of `execution`; a job that ended meanwhile is left as it ended."""
    stopped = []
    for name in running_jobs(sagemaker, execution):
        try:
            sagemaker.stop_training_job(TrainingJobName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ValidationException":  # "already ended"
                raise
            continue
        stopped.append(name)
        logger.info("training job stopped", extra={"job": name, "execution": execution})
    return stopped


def stop_tuning_jobs(sagemaker: Any, execution: str) -> list[str]:
    """Stop every in-progress tuning job of `execution` (SageMaker then stops its trials)."""
    stopped = []
    for page in sagemaker.get_paginator("list_hyper_parameter_tuning_jobs").paginate(StatusEquals="InProgress"):
        for summary in page["HyperParameterTuningJobSummaries"]:
            tags = sagemaker.list_tags(ResourceArn=summary["HyperParameterTuningJobArn"])["Tags"]
            if {"Key": EXECUTION_TAG, "Value": execution} not in tags:
                continue
            name = summary["HyperParameterTuningJobName"]
            try:
                sagemaker.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ValidationException":  # "already ended"
                    raise
                continue
            stopped.append(name)
            logger.info("tuning job stopped", extra={"tuning_job": name, "execution": execution})
    return stopped


def clean_up(execution: str, *, runs: list[str], stores: CleanupEnvironment, sagemaker: Any, s3: Any) -> dict[str, Any]:
    """Stop the execution's tuning jobs and jobs, then prune the given runs' checkpoints and the stopped jobs'."""
    tuning_stopped = stop_tuning_jobs(sagemaker, execution)
    # A trial of a stopped tuning job is stopped here too when it still runs: it carries the execution's tag.
    stopped = stop_jobs(sagemaker, execution)
    return {
        "stopped": stopped,
        "pruned": prune_runs(s3, stores, runs, stopped),
        "stopped_tuning_jobs": tuning_stopped,
    }


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """State machine: {"execution", "job_name_base"}; EventBridge: an Execution Status Change event."""
    execution, run = ended_execution(CLEANUP_EVENT.validate_python(event))
    result = clean_up(
        execution,
        runs=[run] if run is not None else [],
        stores=CleanupEnvironment.from_environ(),
        sagemaker=boto3.client("sagemaker"),
        s3=boto3.client("s3"),
    )
    logger.info("run cleaned up", extra={"execution": execution, **result})
    return result
