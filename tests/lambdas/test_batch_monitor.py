"""PollBatchJob: AWS Batch's job description and the nodes' results, as the step's JobProgress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from contract.execution_state import JobProgress
from lambdas.batch.monitor import CAPACITY_REASON, STOP_REASON, capacity_wait_exceeded, summarize

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
MS = 1000


def _ms(minutes_ago: float) -> int:
    return int((NOW - timedelta(minutes=minutes_ago)).timestamp() * MS)


def _job(status: str, **extra: Any) -> dict[str, Any]:
    return {"jobName": "run-abc-1", "status": status, "nodeProperties": {"numNodes": 2, "mainNode": 0}, **extra}


def _summary(describe: dict[str, Any], results: list[dict[str, Any]] | None = None, **kwargs: Any) -> JobProgress:
    summary = summarize(
        describe,
        results=results or [],
        checkpoint=None,
        now=NOW,
        stale_minutes=30,
        hourly_usd=100.0,
        **kwargs,
    )
    JobProgress.model_validate(summary)  # what the state machine and the later handlers read
    return summary


def test_a_running_job_is_in_progress_and_training() -> None:
    summary = _summary(_job("RUNNING", startedAt=_ms(5)))
    assert (summary.status, summary.secondary_status, summary.finished) == ("InProgress", "Training", False)
    assert _summary(_job("RUNNABLE")).secondary_status == "Starting"


def test_a_succeeded_job_reports_the_main_nodes_metrics_model_and_on_demand_cost() -> None:
    attempts = [
        {"startedAt": _ms(90), "stoppedAt": _ms(60), "statusReason": "Host EC2 (instance i-0abc) terminated."},
        {"startedAt": _ms(59), "stoppedAt": _ms(29), "statusReason": "Essential container in task exited"},
    ]
    results = [
        {"node": 1, "exit_code": 0, "failure": None},
        {"node": 0, "exit_code": 0, "final_metrics": {"validation:loss": 2.1}, "model_artifacts": "s3://a/m.tar.gz"},
    ]
    summary = _summary(_job("SUCCEEDED", attempts=attempts), results)
    assert (summary.status, summary.error, summary.interruptions) == ("Completed", None, 1)
    assert summary.final_metrics == {"validation:loss": 2.1} and summary.model_artifacts == "s3://a/m.tar.gz"
    assert summary.billable_seconds == 3600
    assert summary.cost.actual_usd == 100.0 and summary.cost.spot_savings_usd == 0.0


def test_success_without_a_model_in_s3_is_a_failure() -> None:
    summary = _summary(_job("SUCCEEDED"), [{"node": 0, "exit_code": 0}])
    assert (summary.status, summary.error) == ("Failed", "TrainingJobFailed")
    assert "recorded no model" in summary.failure_reason


def test_a_failed_preflight_is_retried_on_new_nodes_and_other_failures_are_not() -> None:
    preflight = [{"node": 1, "exit_code": 4, "failure": "PreflightFailed: host node-1 sees 7 GPUs, expected 8"}]
    summary = _summary(_job("FAILED", statusReason="Essential container in task exited"), preflight)
    assert (summary.error, summary.retry_on_new_nodes) == ("PreflightFailed", True)
    assert summary.failure_reason.startswith("PreflightFailed: host node-1")
    slow = [{"node": 0, "exit_code": 1, "failure": "StragglerDetected: host node-1 (ranks 8) computed its steps ..."}]
    summary = _summary(_job("FAILED"), slow)
    assert (summary.error, summary.retry_on_new_nodes) == ("StragglerDetected", True)
    hung = [
        {"node": 1, "exit_code": 5, "failure": "HangDetected: no training step for 612 s after step 1200 on node-1"}
    ]
    summary = _summary(_job("FAILED"), hung)
    assert (summary.error, summary.retry_on_new_nodes) == ("HangDetected", True)
    assert summary.failure_reason == hung[0]["failure"]
    # A node whose training failed left its peer hanging: that failure, not the peer's hang, is the cause.
    crashed_peer = [{**hung[0], "node": 0}, {"node": 1, "exit_code": 1, "failure": "NonFiniteLossError: loss is nan"}]
    summary = _summary(_job("FAILED"), crashed_peer)
    assert (summary.error, summary.retry_on_new_nodes) == ("TrainingJobFailed", False)
    assert summary.failure_reason == "NonFiniteLossError: loss is nan"
    crashed = [{"node": 0, "exit_code": 1, "failure": "training failed: workers exited with status 1"}]
    summary = _summary(_job("FAILED"), crashed)
    assert (summary.error, summary.retry_on_new_nodes) == ("TrainingJobFailed", False)


def test_terminated_by_the_platform_is_stopped_and_waiting_too_long_is_insufficient_capacity() -> None:
    stopped = _summary(_job("FAILED", statusReason=f"{STOP_REASON}: execution x ended"))
    assert (stopped.status, stopped.error) == ("Stopped", "TrainingJobStopped")
    stuck = _job("RUNNABLE", createdAt=_ms(31))
    assert capacity_wait_exceeded(stuck, NOW, 30) and not capacity_wait_exceeded(
        _job("RUNNABLE", createdAt=_ms(29)), NOW, 30
    )
    summary = _summary(stuck, capacity_error=f"{CAPACITY_REASON}: the job waited 30 minutes for its nodes")
    assert (summary.status, summary.error, summary.retry_on_new_nodes) == (
        "Failed",
        "InsufficientCapacity",
        True,
    )


def test_a_scripts_own_failure_is_not_retried_and_its_peers_lost_link_does_not_make_it_so() -> None:
    own = {"node": 1, "exit_code": 1, "failure": "UserCodeFailed: the script exited with status 3 on node-1 (rank 1)"}
    lost = {"node": 0, "exit_code": 1, "failure": "CommunicationFailed: the script's collective communication failed"}
    summary = _summary(_job("FAILED"), [lost, own])
    assert (summary.error, summary.retry_on_new_nodes) == ("TrainingJobFailed", False)
    assert summary.failure_reason == own["failure"]
    summary = _summary(_job("FAILED"), [lost])  # a node lost on its own: a platform fault
    assert (summary.error, summary.retry_on_new_nodes) == ("CommunicationFailed", True)
    listed = {"node": 0, "exit_code": 1, "failure": "RetryableExit: the script exited with status 75 on node-0"}
    summary = _summary(_job("FAILED"), [listed])
    assert (summary.error, summary.retry_on_new_nodes) == ("RetryableExit", True)
