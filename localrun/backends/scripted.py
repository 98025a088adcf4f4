"""A training backend that plays scripted job histories (for tests of the state machine's paths)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3

from contract.layout import split_s3_uri
from localrun.aws.cfn import REGION
from localrun.aws.iam import acting_as


@dataclass
class Poll:
    """What one DescribeTrainingJob reports."""

    status: str = "InProgress"
    secondary: str = "Training"
    failure_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    billable_seconds: int | None = None
    training_seconds: int | None = None
    effect: Callable[[str, dict[str, Any]], None] | None = None
    """Called with the job's name and CreateTrainingJob request when this poll is reported: what the job (or
    anything else) does meanwhile, e.g. upload a checkpoint."""


@dataclass
class ScriptedTraining:
    """Job n (in creation order) follows script n; its last poll repeats once reached."""

    scripts: list[list[Poll]] = field(default_factory=lambda: [[Poll(), Poll("Completed", "Completed")]])
    on_create: list[Any] = field(default_factory=list)
    created_names: list[str] = field(default_factory=list)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped_names: list[str] = field(default_factory=list)
    _cursor: dict[str, int] = field(default_factory=dict)
    _uploaded: set[str] = field(default_factory=set)

    def bind(self, credentials: Any) -> None:
        """Scripted jobs make no AWS calls of their own (SageMaker uploads a completed job's model)."""

    def created(self, name: str, request: dict[str, Any], job: Any) -> None:
        self.created_names.append(name)
        self.requests[name] = request
        for hook in self.on_create:
            hook(name, request, job)

    def stopped(self, name: str, job: Any) -> None:
        self.stopped_names.append(name)

    def described(self, name: str, job: Any) -> None:
        if name in self.stopped_names:  # a stopped job ends Stopped, whatever its script said
            job.training_job_status, job.secondary_status = "Stopped", "Stopped"
            return
        script = self.scripts[min(self.created_names.index(name), len(self.scripts) - 1)]
        index = self._cursor.get(name, 0)
        poll = script[min(index, len(script) - 1)]
        self._cursor[name] = index + 1
        if poll.effect is not None:
            poll.effect(name, self.requests[name])
        if job.secondary_status != poll.secondary:
            job.secondary_status_transitions.append(
                {"Status": poll.secondary, "StartTime": datetime.now(UTC), "StatusMessage": poll.secondary}
            )
        job.training_job_status = poll.status
        job.secondary_status = poll.secondary
        job.training_start_time = job.training_start_time or datetime.now(UTC)
        if poll.status in ("Completed", "Failed", "Stopped"):
            job.training_end_time = job.training_end_time or datetime.now(UTC)
        if poll.status == "Completed" and name not in self._uploaded:
            self._uploaded.add(name)
            _upload_model(name, job.model_artifacts["S3ModelArtifacts"])
        if poll.failure_reason is not None:
            job.failure_reason = poll.failure_reason
        if poll.metrics:
            job.final_metric_data_list = [
                {"MetricName": k, "Value": v, "Timestamp": datetime.now(UTC)} for k, v in poll.metrics.items()
            ]
        if poll.billable_seconds is not None:
            job.billable_time_in_seconds = poll.billable_seconds
        if poll.training_seconds is not None:
            job.training_time_in_seconds = poll.training_seconds


def _upload_model(name: str, uri: str) -> None:
    """What SageMaker uploads when a job completes: its model archive, at the URI DescribeTrainingJob reports."""
    bucket, key = split_s3_uri(uri)
    with acting_as(None):  # SageMaker's own upload, not the describing handler's
        boto3.client("s3", region_name=REGION).put_object(Bucket=bucket, Key=key, Body=f"model of {name}".encode())
