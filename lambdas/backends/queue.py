"""The team queue backend: a team's SageMaker training job queued as an AWS Batch service job under the team's quota
share (stacks/pipeline/queue_step.py; settings `teams`, docs/platform-team/teams.md). Its requests are SageMaker's,
less what a queued job of one instance type cannot be; which team may run what is Validate's team check
(lambdas/validate/teams.py).
"""

from __future__ import annotations

from lambdas.backends.backend import Backend, NoLimits
from lambdas.validate.inputs import ExecutionInput

QUEUE = "queue"
"""The backend's name, as a request's `backend` gives it."""


def queue_problems(request: ExecutionInput, _limits: NoLimits) -> list[str]:
    """Why a team's queue cannot run this request, one line each (empty when it can)."""
    problems = []
    if request.team is None:
        problems.append(f'team: backend "{QUEUE}" queues the run under a team\'s quota share; name the team')
    if request.instance_groups is not None and len({g.instance_type for g in request.instance_groups}) > 1:
        problems.append(
            "instance_groups: a quota share counts instances of one type per job; give one instance type, or use "
            'backend "sagemaker"'
        )
    if request.fallback:
        problems.append(
            "fallback: a queued job waits for its share's capacity instead of falling back; remove it with "
            f'backend "{QUEUE}"'
        )
    if request.warm_pool_minutes:
        problems.append(
            f"warm_pool_minutes: warm instances would hold the team's quota after the job ends; set 0 with backend "
            f'"{QUEUE}"'
        )
    return problems


QUEUE_BACKEND = Backend(
    name=QUEUE,
    limits=NoLimits,
    check=queue_problems,
    step="stacks.pipeline.queue_step.QueueTraining",
    step_id="QueueTrainingStep",
    local=None,
    needs_teams=True,
    denies=("batch:SubmitServiceJob",),
)
