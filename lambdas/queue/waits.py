"""How long a team's service job may wait for capacity, and how the teams' queue says it stopped a job waiting.

A service job waits RUNNABLE after it is submitted and again after each preemption. Two things bound each wait at
the run's maximum (its input's `max_queue_wait_minutes`, at most the settings' `service_environment.
max_queue_wait_minutes`): the queue itself terminates a job that is blocked at its head for the settings' maximum
(AWS Batch's `jobStateTimeLimitActions`, for the reasons below; AWS allows 10 minutes to 24 hours), and the progress
handler ends the run of a job that has waited longer than the run's maximum for any reason (behind other jobs too),
which the queue does not count. Either way the run fails with `QUEUE_WAIT_EXCEEDED` and the wait in words.
"""

from __future__ import annotations

MIN_WAIT_MINUTES = 10
"""JobStateTimeLimitAction.maxTimeSeconds' least: 600 seconds."""
MAX_WAIT_MINUTES = 24 * 60
"""JobStateTimeLimitAction.maxTimeSeconds' most: 86,400 seconds."""
QUEUE_WAIT_EXCEEDED = "QueueWaitExceeded"
"""The error of a run whose service job waited longer than the run allows."""

BLOCKED = {
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY": "SageMaker had too few instances of the job's type",
    "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE": (
        "the job needs more instances than the service environment holds (service_environment.capacity)"
    ),
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED": (
        "the job needs more instances than its team's quota share can hold (teams[].quota_share.capacity)"
    ),
}
"""The reasons a SAGEMAKER_TRAINING queue blocks a job at its head, for which the queue's time limit acts, in words
(AWS Batch user guide: "Jobs stuck in a RUNNABLE status")."""
TERMINATED_BY_QUEUE = "Terminated by JobStateTimeLimit action due to reason: "
"""How a service job's statusReason begins once the queue's time limit has terminated it."""


def queue_terminated(status_reason: str, *, waited_seconds: float) -> str | None:
    """Why the queue terminated a service job that had waited `waited_seconds`, in words; None when it did not."""
    if not status_reason.startswith(TERMINATED_BY_QUEUE):
        return None
    reason = status_reason.removeprefix(TERMINATED_BY_QUEUE).strip()
    return (
        f"the teams' queue terminated the job after it had waited {in_words(waited_seconds)} for capacity, blocked "
        f"at the head of the queue because {BLOCKED.get(reason, reason)} (the queue's limit: "
        "service_environment.max_queue_wait_minutes)"
    )


def in_words(seconds: float) -> str:
    """A duration as people say it: `2 h 5 min`, `40 min`, `30 s`."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min")) if n]
    return " ".join(parts[:2]) if parts else f"{secs} s"
