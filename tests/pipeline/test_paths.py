"""Every path of the state machine, executed: rejections, approvals, capacity, failures, spot, quality."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

import boto3
import pytest
from moto.sagemaker.exceptions import SagemakerClientError

from contract.catalog import INSTANCE_TYPES
from contract.layout import EXPECTED_GPUS_ENV
from lambdas.validate.request import RUN_ID_HEX
from localrun.aws.clock import Clock
from localrun.backends.scripted import Poll
from localrun.demo.cli import _Printer
from tests.conftest import APPROVER
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.stored import put_checkpoint

CAPACITY = Poll("Failed", "Failed", failure_reason="CapacityError: Unable to provision requested ML compute capacity.")
# What SageMaker reports when the launcher's pre-flight check fails: the failure file's first line.
PREFLIGHT = Poll(
    "Failed",
    "Failed",
    failure_reason="AlgorithmError: PreflightFailed: GPUs missing (torch.cuda.device_count()): host algo-2 sees 7 "
    "of the 8 expected",
)


def test_above_threshold_waits_for_launch_approval(pipeline: Pipeline) -> None:
    # 4 x p5.48xlarge for 10 h on demand: thousands of dollars, above the 500 USD threshold.
    arn = pipeline.start(pipeline.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    assert pipeline.jobs() == []
    request = pipeline.pending("launch")
    summary = json.loads(request["summary"])
    assert summary["instances"] == "4 x ml.p5.48xlarge" and float(summary["max_cost_usd"]) > 500
    assert summary["worst_case"] == "the run's own cluster: 4 x ml.p5.48xlarge"
    # What the approver decides on besides the cost: how long it may run, and whether it fits the month's budget.
    assert int(summary["max_runtime_seconds"]) == 10 * 3600
    assert summary["budget_warning"] == ""  # $4,522.80 of the shipped $10,000
    pipeline.decide("launch", "approve", reason="budgeted for Q4")
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert len(pipeline.jobs()) == 1


def test_launch_rejection_names_who_and_why(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    pipeline.decide("launch", "reject", reason="too expensive this month")
    described = pipeline.finish(arn)
    assert pipeline.error(described) == ("LaunchRejected", f"Rejected by {APPROVER}: too expensive this month")
    assert pipeline.jobs() == []
    item = (
        boto3.resource("dynamodb", region_name="us-east-1")
        .Table(pipeline.local.environment("ApprovalDecide")["TABLE_NAME"])
        .scan()["Items"][0]
    )
    assert (item["status"], item["decided_by"], item["reason"]) == ("REJECTED", APPROVER, "too expensive this month")


def test_approval_timeout_is_a_rejection(pipeline_factory: Any) -> None:
    # The 24 h approval timeout, on a clock where it lasts three seconds.
    pipeline = pipeline_factory(clock=Clock(approval_timeout_scale=3 / 86400))
    arn = pipeline.start(pipeline.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    request_id = pipeline.pending("launch")["request_id"]
    described = pipeline.finish(arn, timeout=20)
    assert pipeline.error(described)[0] == "ApprovalTimedOut"
    assert "treated as a rejection" in pipeline.error(described)[1]
    late = pipeline.decide_raw(
        APPROVER, body={"request_id": request_id, "decision": "approve", "reason": "sorry, late"}
    )
    assert late["statusCode"] == 410
    assert "rejected" in json.loads(late["body"])["error"]
    assert pipeline.jobs() == []
    # The audit record says what happened: the request expired; the late decision is kept apart, refused.
    item = (
        boto3.resource("dynamodb", region_name="us-east-1")
        .Table(pipeline.local.environment("ApprovalDecide")["TABLE_NAME"])
        .get_item(Key={"request_id": request_id})["Item"]
    )
    assert item["status"] == "EXPIRED" and "decided_by" not in item and "reason" not in item, item
    assert (item["refused_decision"]["decision"], item["refused_decision"]["by"]) == ("approved", APPROVER)
    assert item["refused_because"].startswith("the gate had timed out")


def test_decisions_are_authenticated_checked_and_final(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request_id = pipeline.pending("promotion")["request_id"]

    def answer(caller: str, **body: Any) -> tuple[int, str]:
        response = pipeline.decide_raw(caller, body={"request_id": request_id, **body})
        return response["statusCode"], json.loads(response["body"]).get("error", "")

    intruder = "arn:aws:sts::123456789012:assumed-role/DataScientist/mallory"
    assert answer(intruder, decision="approve", reason="let me in")[0] == 403
    assert answer(APPROVER, decision="approve", reason="")[0] == 400
    assert answer(APPROVER, decision="maybe", reason="hmm")[0] == 400
    status, _ = (
        pipeline.decide_raw(APPROVER, body={"request_id": "nope", "decision": "approve", "reason": "x"})["statusCode"],
        None,
    )
    assert status == 404
    # An assumed-role session of the approver role counts as the approver.
    session = "arn:aws:sts::123456789012:assumed-role/MLLead/jane"
    assert answer(session, decision="approve", reason="metrics reviewed")[0] == 200
    replay_status, replay_error = answer(APPROVER, decision="reject", reason="changed my mind")
    assert replay_status == 409
    assert replay_error.startswith(f"request {request_id} was already approved by {APPROVER} at ")
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"


def test_promotion_rejection_marks_the_model_rejected(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "reject", reason="regressed on eval set B")
    described = pipeline.finish(arn)
    assert pipeline.error(described) == ("PromotionRejected", f"Rejected by {APPROVER}: regressed on eval set B")
    (package,) = pipeline.model_packages()
    assert package["ModelApprovalStatus"] == "Rejected"


def test_capacity_error_then_success_with_a_new_job_name(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll("InProgress", "Starting"), CAPACITY], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    assert re.fullmatch(rf"gpt2-small-[0-9a-f]{{{RUN_ID_HEX}}}-1", first)
    assert second == first[: -len("1")] + "2"
    requests = pipeline.local.training_requests
    # The new job resumes from the same run-level checkpoints.
    assert requests[first]["CheckpointConfig"] == requests[second]["CheckpointConfig"]
    assert "Next attempt" in pipeline.local.states_entered(arn)


# One g5.2xlarge GPU, then the fallback's 4 on one g5.12xlarge, at 32 sequences per step on both.
FALLBACK = {
    "fallback": [{"instance_type": "ml.g5.12xlarge", "instance_count": 1}],
    "hyperparameters": {"max_steps": 100, "batch_size": 8, "train.global_batch_size": 32},
}


def _retry_lines(pipeline: Pipeline, arn: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the demo's terminal says of the execution's new attempts, read from its history."""
    capsys.readouterr()
    _Printer(verbose=False).states(pipeline.local, arn, started=time.monotonic())
    return [line.strip() for line in capsys.readouterr().out.splitlines() if "retrying:" in line]


def test_insufficient_capacity_moves_the_next_attempt_onto_the_fallback_cluster(
    pipeline_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = pipeline_factory(scripts=[[CAPACITY], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input(**FALLBACK))
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    requests = pipeline.local.training_requests
    shapes = [
        (r["ResourceConfig"]["InstanceType"], r["ResourceConfig"]["InstanceCount"], r["Environment"][EXPECTED_GPUS_ENV])
        for r in (requests[first], requests[second])
    ]
    assert shapes == [("ml.g5.2xlarge", 1, "1"), ("ml.g5.12xlarge", 1, "4")]
    assert requests[first]["CheckpointConfig"] == requests[second]["CheckpointConfig"]  # it resumes the same run
    (message,) = [m for m in pipeline.local.messages("TopicsRuns") if "retrying" in m.get("Subject", "")]
    told = json.loads(message["Message"])
    assert (told["error"], told["next_cluster"]) == ("InsufficientCapacity", "1 x ml.g5.12xlarge")
    # The demo's terminal names the cluster the new attempt moved to, as the notification does.
    cause = CAPACITY.failure_reason
    assert _retry_lines(pipeline, arn, capsys) == [
        f"retrying: attempt 2, a new job on the fallback cluster 1 x ml.g5.12xlarge, after {cause}"
    ]
    # The handler's answer is emptied once used: the state holds one copy of the request.
    *_, used = [
        e for e in pipeline.local.history(arn) if e.get("stateEnteredEventDetails", {}).get("name") == "Reset progress"
    ]
    state = json.loads(used["stateEnteredEventDetails"]["input"])  # as the second attempt starts
    assert state["next_cluster"] == {} and state["request"]["cluster"] == "1 x ml.g5.12xlarge"
    # The job that trained is costed at its own cluster's price (COMPLETED bills half an hour).
    assert pipeline.lineage()["cost"]["actual_usd"] == round(INSTANCE_TYPES["ml.g5.12xlarge"].price_per_hour / 2, 4)


def test_a_failed_preflight_retries_on_the_same_cluster_despite_a_fallback(
    pipeline_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = pipeline_factory(scripts=[[PREFLIGHT], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input(**FALLBACK))
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    requests = pipeline.local.training_requests
    assert requests[first]["ResourceConfig"] == requests[second]["ResourceConfig"]
    assert "Choose the next cluster" not in pipeline.local.states_entered(arn)
    cause = PREFLIGHT.failure_reason
    assert _retry_lines(pipeline, arn, capsys) == [f"retrying: attempt 2, a new job on fresh instances, after {cause}"]


def test_capacity_retries_are_bounded(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[CAPACITY]])
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described)[0] == "InsufficientCapacity"
    assert len(pipeline.jobs()) == 4  # the first attempt plus pipeline.capacity_retries (3)


def test_a_failed_preflight_check_retries_on_fresh_instances_from_the_checkpoints(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll("InProgress", "Training"), PREFLIGHT], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input(instance_type="ml.p4d.24xlarge", instance_count=2))
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    assert second == first[: -len("1")] + "2"
    requests = pipeline.local.training_requests
    # A new job (SageMaker gives it new instances), resuming from the same run-level checkpoints.
    assert requests[first]["CheckpointConfig"] == requests[second]["CheckpointConfig"]
    # The run is told why, and the attempt records it.
    (told,) = [m for m in pipeline.local.messages("TopicsRuns") if m["Subject"].startswith("Training job replaced")]
    body = json.loads(told["Message"])
    assert (body["failed_job"], body["error"], body["attempt"]) == (first, "PreflightFailed", 2)
    assert body["reason"] == PREFLIGHT.failure_reason
    (entered,) = [
        e for e in pipeline.local.history(arn) if e.get("stateExitedEventDetails", {}).get("name") == "Next attempt"
    ]
    train = json.loads(entered["stateExitedEventDetails"]["output"])["train"]
    assert train == {
        "attempt": 2,
        "retried_after": {"error": "PreflightFailed", "cause": PREFLIGHT.failure_reason},
        "billed": {"actual_usd": 0.0, "on_demand_usd": 0.0, "spot_savings_usd": 0.0},  # the failed job billed none
        "polls": 2,  # the execution's polls, of every attempt: its history's budget is the execution's
    }


# What SageMaker reports when the launcher killed workers that made no training step for the hang limit.
HANG = Poll(
    "Failed",
    "Failed",
    failure_reason="AlgorithmError: HangDetected: no training step for 612 s after step 1200 on algo-2",
)


def test_a_hang_retries_on_fresh_instances_and_the_run_is_told_the_cause(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll("InProgress", "Training"), HANG], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input(instance_type="ml.p4d.24xlarge", instance_count=2))
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    requests = pipeline.local.training_requests
    assert requests[first]["CheckpointConfig"] == requests[second]["CheckpointConfig"]
    (told,) = [m for m in pipeline.local.messages("TopicsRuns") if m["Subject"].startswith("Training job replaced")]
    body = json.loads(told["Message"])
    assert (body["failed_job"], body["error"], body["attempt"]) == (first, "HangDetected", 2)
    assert body["reason"] == HANG.failure_reason


def finished_jobs_costs(pipeline: Pipeline, arn: str) -> dict[str, float]:
    """Each finished job's actual cost, as its progress handler's poll answered it (the execution's history)."""
    exits = [e["stateExitedEventDetails"] for e in pipeline.local.history(arn) if "stateExitedEventDetails" in e]
    polls = [json.loads(e["output"])["job"] for e in exits if e["name"] == "Check progress"]
    return {p["job_name"]: p["cost"]["actual_usd"] for p in polls if p["finished"] and p["cost"]}


def test_a_retried_runs_lineage_costs_every_job_it_was_billed_for(pipeline_factory: Any) -> None:
    # The hung job ran (and was billed) 10 minutes before the launcher killed it; its replacement completed.
    billed_hang = dataclasses.replace(HANG, billable_seconds=600)
    pipeline = pipeline_factory(scripts=[[Poll("InProgress", "Training"), billed_hang], [Poll(), COMPLETED]])
    arn = pipeline.start(pipeline.input(instance_type="ml.p4d.24xlarge", instance_count=2))
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    costs = finished_jobs_costs(pipeline, arn)
    hourly = 2 * INSTANCE_TYPES["ml.p4d.24xlarge"].price_per_hour
    assert costs == {first: round(hourly * 600 / 3600, 4), second: round(hourly * 1800 / 3600, 4)}
    lineage = pipeline.lineage()
    assert lineage["cost"]["actual_usd"] == round(costs[first] + costs[second], 4)
    assert lineage["cost"]["on_demand_usd"] == lineage["cost"]["actual_usd"]  # on demand: nothing saved
    assert lineage["cost"]["spot_savings_usd"] == 0
    (package,) = pipeline.model_packages()
    assert package["CustomerMetadataProperties"]["cost_actual_usd"] == str(lineage["cost"]["actual_usd"])


def test_preflight_retries_share_the_capacity_retry_limit(pipeline_factory: Any) -> None:
    # Pre-flight, capacity, pre-flight, pre-flight: the first attempt plus pipeline.capacity_retries (3), then failed.
    pipeline = pipeline_factory(scripts=[[PREFLIGHT], [CAPACITY], [PREFLIGHT], [PREFLIGHT]])
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert len(pipeline.jobs()) == 4
    error, cause = pipeline.error(described)
    assert error == "PreflightFailed" and "host algo-2 sees 7 of the 8 expected" in cause
    told = [m for m in pipeline.local.messages("TopicsRuns") if m["Subject"].startswith("Training job replaced")]
    assert [json.loads(m["Message"])["error"] for m in told] == [
        "PreflightFailed",
        "InsufficientCapacity",
        "PreflightFailed",
    ]


@pytest.mark.filterwarnings("ignore:Exception\\(SagemakerClientError\\) with code ThrottlingException:UserWarning")
def test_throttled_create_is_retried_under_the_same_name(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.sagemaker.models import SageMakerModelBackend

    original = SageMakerModelBackend.create_training_job
    calls = {"n": 0}

    def throttled(backend: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise SagemakerClientError("ThrottlingException", "Rate exceeded")
        return original(backend, **kwargs)

    monkeypatch.setattr(SageMakerModelBackend, "create_training_job", throttled)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    (name,) = pipeline.jobs()
    assert name.endswith("-1")  # attempt 1: the throttled create created nothing, the retry creates it
    (interval,) = pipeline.local.clock.retries  # one retry, full jitter over the first 5 s interval
    assert 0 <= interval <= 5


def test_job_failure_reports_the_reason(pipeline_factory: Any) -> None:
    reason = "AlgorithmError: CUDA out of memory (see /opt/ml/output/failure)"
    pipeline = pipeline_factory(scripts=[[Poll(), Poll("Failed", "Failed", failure_reason=reason)]])
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described) == ("TrainingJobFailed", reason)
    failure = [m for m in pipeline.local.messages("TopicsRuns") if m["Subject"] == "Training run failed"]
    assert json.loads(failure[0]["Message"])["reason"] == reason
    assert pipeline.model_packages() == []


def test_spot_interruption_is_recorded_and_the_run_completes(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(
        scripts=[[Poll(), Poll("InProgress", "Interrupted"), Poll("InProgress", "Training"), COMPLETED]]
    )
    arn = pipeline.start(pipeline.input(spot=True))
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"
    lineage = pipeline.lineage()
    assert lineage["cluster"]["spot"] is True
    assert lineage["cluster"]["interruptions"] == 1
    assert len(pipeline.jobs()) == 1  # SageMaker resumes a managed spot job itself


def test_max_wait_time_exceeded_fails_the_run(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll("InProgress", "Starting"), Poll("Stopped", "MaxWaitTimeExceeded")]])
    arn = pipeline.start(pipeline.input(spot=True))
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert error == "MaxWaitTimeExceeded"
    assert "MaxWaitTimeExceeded" in cause
    assert len(pipeline.jobs()) == 1


def test_below_quality_threshold_is_not_registered(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll("Completed", "Completed", metrics={"validation:loss": 3.7})]])
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described) == ("QualityBelowThreshold", "validation:loss = 3.7 does not meet <= 3.0")
    assert pipeline.model_packages() == []
    subjects = [m["Subject"] for m in pipeline.local.messages("TopicsRuns")]
    assert "Training run finished below its quality gate: not registered" in subjects


def test_stale_checkpoints_warn_once(pipeline_factory: Any) -> None:
    from datetime import UTC, datetime, timedelta

    def started_long_ago(_name: str, _request: dict[str, Any], job: Any) -> None:
        job.training_start_time = datetime.now(UTC) - timedelta(hours=3)

    pipeline = pipeline_factory(scripts=[[Poll(), Poll(), Poll(), COMPLETED]])
    pipeline.training.on_create.append(started_long_ago)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    warnings = [m for m in pipeline.local.messages("TopicsRuns") if "not checkpointed" in m["Subject"]]
    assert len(warnings) == 1
    assert json.loads(warnings[0]["Message"])["checkpoint_age_minutes"] > 170


def test_registration_records_the_full_lineage(pipeline: Pipeline) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = pipeline.datasets_bucket
    versions = {
        key: s3.put_object(Bucket=bucket, Key=key, Body=b"tokens")["VersionId"]
        for key in ("corpus/train_000.bin", "corpus/val_000.bin")
    }
    s3.put_object(Bucket=bucket, Key="other/ignored.bin", Body=b"x")
    arn = pipeline.start(pipeline.input(dataset=f"s3://{bucket}/corpus/", spot=True))
    pipeline.local.wait(arn, 30, until=lambda: bool(pipeline.jobs()))
    (job,) = pipeline.jobs()
    base = job.rsplit("-", 1)[0]
    checkpoints = pipeline.local.environment("Monitor")["CHECKPOINTS_BUCKET"]
    put_checkpoint(s3, checkpoints, f"runs/{base}/checkpoints/", 40)
    pipeline.run_until(arn, "Approval gate (promotion)")

    lineage = pipeline.lineage()
    assert lineage["dataset"]["s3_uri"] == f"s3://{bucket}/corpus/"
    assert lineage["dataset"]["objects"] == 2
    manifest = s3.get_object(
        Bucket=lineage["dataset"]["versions_uri"].split("/")[2],
        Key=lineage["dataset"]["versions_uri"].split("/", 3)[3],
    )["Body"].read()
    recorded = {json.loads(line)["key"]: json.loads(line)["version_id"] for line in manifest.splitlines()}
    assert recorded == versions
    assert "@sha256:" in lineage["image"]
    assert re.fullmatch(r"[0-9a-f]{12}|unknown", lineage["platform_revision"])
    assert lineage["hyperparameters"]["lr"] == "0.0006"
    assert lineage["checkpoints"]["step"] == 40
    assert lineage["checkpoints"]["uri"].endswith(f"runs/{base}/checkpoints/step-40/")
    assert lineage["metrics"] == {"validation:loss": 2.5, "train:loss": 2.4}
    assert lineage["cost"]["billable_seconds"] == 1800
    assert lineage["cost"]["actual_usd"] == round(1.515 * 0.5, 4)
    (package,) = pipeline.model_packages()
    metadata = package["CustomerMetadataProperties"]
    assert metadata["training_job"] == job
    assert metadata["lineage"].endswith(f"runs/{base}/lineage/lineage.json")
    assert metadata["dataset_versions_sha256"] == lineage["dataset"]["versions_sha256"]
    assert package["ModelApprovalStatus"] == "PendingManualApproval"
    assert package["MetadataProperties"]["GeneratedBy"] == arn


def test_task_tokens_never_reach_logs_or_messages(pipeline: Pipeline, capsys: pytest.CaptureFixture[str]) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.pending("promotion")  # the request is stored
    table = pipeline.local.environment("ApprovalDecide")["TABLE_NAME"]
    (item,) = boto3.resource("dynamodb", region_name="us-east-1").Table(table).scan()["Items"]
    history = pipeline.local.history(arn)
    scheduled = [
        json.loads(e["taskScheduledEventDetails"]["parameters"]) for e in history if e["type"] == "TaskScheduled"
    ]
    (token,) = [p["Payload"]["token"] for p in scheduled if "token" in p.get("Payload", {})]
    sealed = item["sealed_token"]
    pipeline.decide("promotion", "approve")
    pipeline.finish(arn)
    captured = capsys.readouterr()
    published = json.dumps(pipeline.local.messages("TopicsRuns"))
    listing = pipeline.decide_raw(APPROVER, method="GET")["body"]
    for secret in (token, sealed):
        assert secret not in captured.out + captured.err
        assert secret not in published
        assert secret not in listing
    assert item["request_id"] in published  # approvers refer to the request by its ID


def test_the_requests_efa_choice_reaches_the_job_environment(pipeline: Pipeline) -> None:
    # ml.p4d.24xlarge has EFA: used unless the input turns it off (then NCCL stays on TCP sockets).
    for name, efa in (("efa-default", None), ("efa-off", False)):
        overrides: dict[str, Any] = {"instance_type": "ml.p4d.24xlarge", "max_runtime_hours": 1}
        if efa is not None:
            overrides["efa"] = efa
        arn = pipeline.start(pipeline.input(**overrides), name=name)
        pipeline.run_until(arn, "Approval gate (promotion)")
    environments = [request["Environment"] for request in pipeline.local.training_requests.values()]
    assert [e["TRAINING_EFA"] for e in environments] == ["true", "false"]
    # The pre-flight check's expectations, from the instance catalog: 8 GPUs, and EFA's floor only with EFA.
    assert [e["TRAINING_EXPECTED_GPUS"] for e in environments] == ["8", "8"]
    assert [float(e["TRAINING_MIN_BUSBW_GBPS"]) for e in environments] == [10.0, 0.0]


def test_the_registry_holds_the_models_metrics_and_the_lineage_also_the_jobs_phases(pipeline_factory: Any) -> None:
    final = {
        "validation:loss": 2.5,
        "train:loss": 2.4,
        **{f"phases:{phase}_seconds": 100.0 for phase in ("wall", "startup", "preflight", "checkpoint_load")},
        **{f"phases:{phase}_seconds": 100.0 for phase in ("train", "checkpoint", "eval", "export")},
        "stragglers:hosts": 0.0,
        "stragglers:slowdown": 1.02,
    }
    done = Poll("Completed", "Completed", metrics=final, billable_seconds=1800)
    pipeline = pipeline_factory(scripts=[[Poll(), done]])
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    (package,) = pipeline.model_packages()
    metadata = package["CustomerMetadataProperties"]
    assert json.loads(metadata["metrics"]) == {"validation:loss": 2.5, "train:loss": 2.4}
    lineage_uri = metadata["lineage"]
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket, key = lineage_uri.split("/")[2], lineage_uri.split("/", 3)[3]
    lineage = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert lineage["metrics"] == final
    statistics = s3.get_object(Bucket=bucket, Key=key.replace("lineage.json", "metrics.json"))["Body"].read()
    assert json.loads(statistics) == {"validation:loss": 2.5, "train:loss": 2.4}
