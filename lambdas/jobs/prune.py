"""The end of a run, for every backend's cleanup: which execution ended, and the prune of its runs' checkpoints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, Field, TypeAdapter

from contract import ledger
from contract.execution_state import EndedRun
from contract.layout import run_checkpoints, run_of
from contract.service_requests import EXECUTION_TAG
from contract.stored_checkpoints import list_checkpoints, newest_per_location
from lambdas.handover.proof import handed_run
from lambdas.jobs.environment import CleanupEnvironment
from lambdas.validate.request import run_identity, start_time


def prune_checkpoints(s3: Any, stores: CleanupEnvironment, run: str) -> dict[str, Any]:
    """Delete the run's checkpoints that the newest one it may resume from supersedes; versioning keeps them a while.

    What the run may resume from is one rule (contract/ledger.py `resumable`: complete, and as its ledger records
    it), so a recorded checkpoint whose bytes changed since is never kept in place of an intact one. Per location:
    the run's own checkpoints, and each tuning trial's under it, are pruned apart, so that every trial keeps its
    newest such checkpoint, the best trial's included. Only directories older than it go, complete or not; a
    location without one, and anything newer than it, is left as it is (nothing is known to supersede it).
    """
    prefix = run_checkpoints(run)
    listing = list_checkpoints(s3, stores.checkpoints_bucket, prefix)
    recorded = ledger.recorded(s3, stores.artifacts_bucket, run)
    kept = newest_per_location(ledger.resumable(listing.complete, recorded, run))
    doomed = []
    for directory, keys in listing.directories.items():
        location, step = directory.removesuffix("/").rsplit("/", 1)
        newest = kept.get(f"{location}/")
        if newest is not None and int(step.removeprefix("step-")) < newest.step:
            doomed.extend(keys)
    for start in range(0, len(doomed), 1000):
        batch = [{"Key": key} for key in doomed[start : start + 1000]]
        s3.delete_objects(Bucket=stores.checkpoints_bucket, Delete={"Objects": batch, "Quiet": True})
    return {"kept": [c.summary() for c in kept.values()], "deleted_objects": len(doomed)}


def prune_runs(s3: Any, stores: CleanupEnvironment, runs: list[str], stopped: list[str]) -> list[dict[str, Any]]:
    """Prune the checkpoints of `runs` and of the runs of the `stopped` jobs (named <run>-<attempt>)."""
    return [
        {"prefix": f"s3://{stores.checkpoints_bucket}/{run_checkpoints(run)}", **prune_checkpoints(s3, stores, run)}
        for run in sorted({*runs, *(run_of(name) for name in stopped)})
    ]


class ExecutionStatus(BaseModel):
    executionArn: str  # noqa: N815 (EventBridge's name)
    startDate: int  # noqa: N815 (EventBridge's name: epoch milliseconds)


class ExecutionEnded(EventBridgeModel):
    """EventBridge's Step Functions Execution Status Change, as the ended-execution rule matches it."""

    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    detail: ExecutionStatus


CLEANUP_EVENT: TypeAdapter[EndedRun | ExecutionEnded] = TypeAdapter(EndedRun | ExecutionEnded)
"""The state machine's `EndedRun`, or EventBridge's `ExecutionEnded`."""


@dataclass(frozen=True)
class Ended:
    """The execution a cleanup is for: its ARN, its run's job_name_base when the state machine says it, and its run's
    identity, which every job of the run carries in its name (lambdas/validate/request.py run_identity)."""

    execution: str
    run: str | None
    identity: str

    def owns(self, name: str, tags: Mapping[str, str]) -> bool:
        """Whether a job is the execution's: tagged with it (which anyone may do) and named after its run (which only
        the execution's own creates are: a name holds the run's identity, a hash of the execution and its start)."""
        return tags.get(EXECUTION_TAG) == self.execution and self.identity in name


def ended_execution(event: EndedRun | ExecutionEnded, sfn: Any = None) -> Ended:
    """The execution a cleanup event is for: the state machine's (which names its run), or EventBridge's. An
    execution a run was handed over to is cleaned up as the run's first execution, whose jobs it followed
    (lambdas/handover/proof.py; `sfn`: the Step Functions client that reads the proof)."""
    if isinstance(event, ExecutionEnded):
        execution = event.detail.executionArn
        first = handed_run(sfn, execution) if sfn is not None else None
        if first is not None:
            started = start_time(round(first.start_date.timestamp() * 1000))
            return Ended(first.execution, first.job_name_base, run_identity(first.execution, started))
        return Ended(execution, None, run_identity(execution, start_time(event.detail.startDate)))
    return Ended(event.execution, event.job_name_base, event.job_name_base.rsplit("-", 1)[-1])
