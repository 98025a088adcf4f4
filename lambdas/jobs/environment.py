"""The environments of every backend's job handlers: the monitors' and the cleanups' (stacks/pipeline sets them)."""

from __future__ import annotations

from typing import Any

from contract.service_requests import BatchJobConstants, ServiceJobConstants, TrainingJobConstants
from lambdas.shared.env import HandlerEnvironment
from lambdas.validate.api_requests import Deployment


class MonitorEnvironment(HandlerEnvironment):
    """A job monitor's: where the run's checkpoints and ledgers are, and when a checkpoint is stale."""

    checkpoints_bucket: str
    """Where SageMaker uploads the run's checkpoints."""
    artifacts_bucket: str
    """Where the run's checkpoint ledger (contract/ledger.py) and its jobs' goodput ledgers (goodput.py) are."""
    checkpoint_stale_minutes: int
    """A training job whose newest checkpoint is older than this is stale."""


class CleanupEnvironment(HandlerEnvironment):
    """A job cleanup's: where the run's checkpoints are pruned, and its ledger that says which to keep."""

    checkpoints_bucket: str
    """Where the run's checkpoints are pruned."""
    artifacts_bucket: str
    """Where the run's checkpoint ledger (contract/ledger.py) is."""


class JobQueueCleanupEnvironment(CleanupEnvironment):
    """The cleanup's of a backend whose jobs wait on an AWS Batch job queue (lambdas/jobs/queue_cleanup.py)."""

    job_queue: str
    """The queue whose jobs of an ended execution are terminated."""


class AdoptionEnvironment(HandlerEnvironment):
    """The adoption check's (lambdas/jobs/adoption.py): the constants of the platform's requests, which the stacks
    write (stacks/pipeline/adoption.py). Each is a constants dataclass's fields (contract/service_requests.py) as
    JSON; a backend the platform does not deploy leaves its own empty."""

    training_jobs: dict[str, Any]
    """SageMaker's (`TrainingJobConstants`): role, image, key, subnet, security group, buckets, flags, plan."""
    batch_jobs: dict[str, Any]
    """AWS Batch's (`BatchJobConstants`): the job queue, job definition and buckets."""
    service_jobs: dict[str, Any]
    """The teams' queue's (`ServiceJobConstants`): the job queue and how often a job may be preempted."""

    def deployment(self, execution: str) -> Deployment:
        """Every constant of the platform's requests, for `execution`'s jobs."""
        batch: dict[str, Any] = dict.fromkeys(
            ("job_queue", "job_definition", "checkpoints_bucket", "artifacts_bucket"), ""
        )
        queue: dict[str, Any] = {"team_queue": "", "preemption_retries": 0}
        return Deployment(
            training=TrainingJobConstants(**self.training_jobs),
            batch=BatchJobConstants(**(batch | self.batch_jobs)),
            queue=ServiceJobConstants(**(queue | self.service_jobs)),
            execution=execution,
        )
