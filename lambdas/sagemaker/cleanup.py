"""SageMaker's cleanup: no training job outlives its execution, and a run's checkpoints stop growing.

Invoked two ways:
- by the state machine on every way out of a run (`stop` after an orchestration failure, `prune`
  after the job ended): stops the jobs of this execution (`Ended.owns`: tagged with it, and named after
  its run, which a tag alone cannot fake), then prunes the run's
  checkpoints in S3 to the newest one it may resume from (contract/ledger.py `resumable`) of the run, and of
  each of its tuning trials;
- by EventBridge when an execution ends ABORTED, TIMED_OUT or FAILED (a person's StopExecution, the
  execution's own timeout): the same, for the jobs of that execution.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import CLEANUP_EVENT, Ended, ended_execution, prune_runs
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def running_jobs(sagemaker: Any, ended: Ended) -> list[str]:
    """The names of the in-progress training jobs of the ended execution (`Ended.owns`)."""
    names = []
    for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress"):
        for summary in page["TrainingJobSummaries"]:
            tags = sagemaker.list_tags(ResourceArn=summary["TrainingJobArn"])["Tags"]
            if ended.owns(summary["TrainingJobName"], {t["Key"]: t["Value"] for t in tags}):
                names.append(summary["TrainingJobName"])
    return names


def stop_jobs(sagemaker: Any, ended: Ended) -> list[str]:
    """Stop every in-progress job of the ended execution; a job that ended meanwhile is left as it ended."""
    stopped = []
    for name in running_jobs(sagemaker, ended):
        try:
            sagemaker.stop_training_job(TrainingJobName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ValidationException":  # "already ended"
                raise
            continue
        stopped.append(name)
        logger.info("training job stopped", extra={"job": name, "execution": ended.execution})
    return stopped


def stop_tuning_jobs(sagemaker: Any, ended: Ended) -> list[str]:
    """Stop every in-progress tuning job of the ended execution (SageMaker then stops its trials)."""
    stopped = []
    for page in sagemaker.get_paginator("list_hyper_parameter_tuning_jobs").paginate(StatusEquals="InProgress"):
        for summary in page["HyperParameterTuningJobSummaries"]:
            name = summary["HyperParameterTuningJobName"]
            tags = sagemaker.list_tags(ResourceArn=summary["HyperParameterTuningJobArn"])["Tags"]
            if not ended.owns(name, {t["Key"]: t["Value"] for t in tags}):
                continue
            try:
                sagemaker.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ValidationException":  # "already ended"
                    raise
                continue
            stopped.append(name)
            logger.info("tuning job stopped", extra={"tuning_job": name, "execution": ended.execution})
    return stopped


def clean_up(ended: Ended, *, stores: CleanupEnvironment, sagemaker: Any, s3: Any) -> dict[str, Any]:
    """Stop the execution's tuning jobs and jobs, then prune its run's checkpoints and the stopped jobs'."""
    tuning_stopped = stop_tuning_jobs(sagemaker, ended)
    # A trial of a stopped tuning job is stopped here too when it still runs: it carries the execution's tag.
    stopped = stop_jobs(sagemaker, ended)
    runs = [ended.run] if ended.run is not None else []
    return {
        "stopped": stopped,
        "pruned": prune_runs(s3, stores, runs, stopped),
        "stopped_tuning_jobs": tuning_stopped,
    }


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """State machine: {"execution", "job_name_base"}; EventBridge: an Execution Status Change event."""
    stores = CleanupEnvironment.from_environ()
    ended = ended_execution(CLEANUP_EVENT.validate_python(event), boto3.client("stepfunctions"))
    result = clean_up(ended, stores=stores, sagemaker=boto3.client("sagemaker"), s3=boto3.client("s3"))
    logger.info("run cleaned up", extra={"execution": ended.execution, **result})
    return result
