"""The local SageMaker's clusters without capacity (`make demo ARGS='--fault insufficient-capacity'`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contract.layout import INSUFFICIENT_CAPACITY
from lambdas.sagemaker.monitor import retry_cause
from localrun.backends.sagemaker import LocalTraining, cluster_of
from localrun.demo.jobs import Job
from localrun.demo.report import clusters


def _request(instance_type: str, count: int) -> dict[str, Any]:
    return {"ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count}, "InputDataConfig": []}


def _described(training: LocalTraining, name: str, request: dict[str, Any]) -> Any:
    job = SimpleNamespace(secondary_status_transitions=[], training_job_status="InProgress")
    training.created(name, request, job)
    training.described(name, job)
    return job


def test_a_cluster_without_capacity_fails_its_jobs_as_sagemaker_does_and_the_monitor_classifies_it(
    tmp_path: Path,
) -> None:
    lines: list[tuple[str, str]] = []
    training = LocalTraining(root=tmp_path, datasets_bucket="", short_clusters=1, on_line=lambda *a: lines.append(a))
    first = _described(training, "run-1", _request("ml.p5.48xlarge", 2))
    again = _described(training, "run-2", _request("ml.p5.48xlarge", 2))  # a retry on the same cluster
    for job in (first, again):
        assert (job.training_job_status, job.secondary_status) == ("Failed", "Failed")
        assert retry_cause(job.training_job_status, job.failure_reason) == INSUFFICIENT_CAPACITY
        assert not hasattr(job, "billable_time_in_seconds")  # never started: nothing billed
    assert job.failure_reason.startswith("CapacityError: ")
    assert not list(tmp_path.iterdir())  # no host was laid out, none started
    assert lines[0] == ("run-1", "-- no capacity for 2 x ml.p5.48xlarge: the job fails before any instance starts --")


def test_the_report_names_each_cluster_and_what_its_jobs_came_to() -> None:
    def job(name: str, cluster: str, status: str, failure: str | None) -> Job:
        return Job(name, "", [], [], status, status, failure, [], [], {}, "s3://c/", [], cluster=cluster)

    ran = [
        job("run-1", "2 x ml.p5.48xlarge", "Failed", "CapacityError: Unable to provision"),
        job("run-2", "4 x ml.p4d.24xlarge", "Completed", None),
    ]
    assert clusters(ran) == "2 x ml.p5.48xlarge: failed (CapacityError); 4 x ml.p4d.24xlarge: completed"
    heterogeneous = {"ResourceConfig": {"InstanceGroups": [
        {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "aux", "InstanceType": "ml.c5.4xlarge", "InstanceCount": 1},
    ]}}  # fmt: skip
    assert cluster_of(heterogeneous) == "2 x ml.p4d.24xlarge + 1 x ml.c5.4xlarge"
