"""Open the run's checkpoint ledger before its first job, copying in the checkpoint of a run it resumes.

Every run: the ledger's first object is written (contract/ledger.py), so that the ledger channel every
job reads is never empty (SageMaker refuses an input channel with no objects).

A run that resumes another (`resume_from`): the resumed run's newest checkpoint that is complete
now (contract/stored_checkpoints.py) and whose manifest still has the digest that run's ledger
recorded is copied into the new run's prefix and recorded in the new run's ledger, so that the new
run's trainer loads it as its own and nothing else of the old run. A retried call copies the same
bytes and finds its own records.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger

from contract import ledger
from contract.execution_state import ResumedCheckpoint, ResumeEvent, ResumeSource
from contract.layout import MANIFEST, run_checkpoints
from contract.stored_checkpoints import complete_checkpoints
from lambdas.resume.environment import ResumeEnvironment
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


class NothingToContinueError(Exception):
    """The resumed run has no checkpoint that is complete and still as the platform recorded it."""


def copy_resumed_checkpoint(
    continued: ResumeSource, run: str, *, execution: str, s3: Any, environment: ResumeEnvironment
) -> ResumedCheckpoint:
    """Copy the newest checkpoint of the resumed run that it may resume from (`ledger.resumable`) into `run`'s
    prefix; record it."""
    source = run_checkpoints(continued.run)
    stored = complete_checkpoints(s3, environment.checkpoints_bucket, source)
    newest = ledger.resumable(stored, ledger.recorded(s3, environment.artifacts_bucket, continued.run), continued.run)
    for skipped in stored[: stored.index(newest[0])] if newest else stored:
        logger.warning("not copied: not as the run's ledger records it", extra={"checkpoint": skipped.uri})
    for checkpoint in newest[:1]:
        relative = checkpoint.prefix.removeprefix(source)
        target = f"{run_checkpoints(run)}{relative}"
        for name in sorted(checkpoint.files, key=lambda n: n == MANIFEST):  # the manifest last
            s3.copy_object(
                Bucket=environment.checkpoints_bucket,
                Key=f"{target}{name}",
                CopySource={"Bucket": environment.checkpoints_bucket, "Key": f"{checkpoint.prefix}{name}"},
            )
        ledger.record(
            s3,
            environment.artifacts_bucket,
            run,
            checkpoint=relative,
            step=checkpoint.step,
            manifest_sha256=checkpoint.manifest_sha256,
            job=f"copied from {continued.run}",
            execution=execution,
        )
        carried = ResumedCheckpoint(
            execution=continued.execution,
            run=continued.run,
            step=checkpoint.step,
            manifest_sha256=checkpoint.manifest_sha256,
        )
        logger.info("checkpoint copied from the resumed run", extra=carried.model_dump())
        return carried
    raise NothingToContinueError(
        f"{continued.run} has no checkpoint that is complete and as the platform recorded it; start the run afresh"
    )


def open_run(event: ResumeEvent, *, s3: Any, environment: ResumeEnvironment) -> ResumedCheckpoint | None:
    """Copy the resumed run's checkpoint in (if the request resumes one), then open the run's ledger."""
    run = event.request.job_name_base
    continued = event.request.resume_from
    carried = (
        copy_resumed_checkpoint(continued, run, execution=event.execution, s3=s3, environment=environment)
        if continued is not None
        else None
    )
    ledger.open_ledger(
        s3,
        environment.artifacts_bucket,
        run,
        execution=event.execution,
        continues=carried.model_dump(mode="json") if carried is not None else None,
    )
    return carried


@classified
@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any] | None:
    """Event: {"request": <TrainingRequest>, "execution": $$.Execution.Id}; what was copied in, or null."""
    carried = open_run(
        ResumeEvent.model_validate(event), s3=boto3.client("s3"), environment=ResumeEnvironment.from_environ()
    )
    return carried.model_dump(mode="json") if carried is not None else None
