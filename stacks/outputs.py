"""The pipeline stack's CloudFormation outputs: the names tools read a deployed stage by (`make outputs`)."""

from __future__ import annotations

# SageMaker writes every training job's logs here (a stream per host); AWS names it, not the platform.
SAGEMAKER_TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# AWS Batch's containers log here (the awslogs driver's default group, a stream per node); AWS names it too.
BATCH_JOB_LOG_GROUP = "/aws/batch/job"

STATE_MACHINE_ARN = "StateMachineArn"
DECISION_URL = "DecisionUrl"
DATASETS_BUCKET = "DatasetsBucket"
ARTIFACTS_BUCKET = "ArtifactsBucket"
DASHBOARD_URL = "DashboardUrl"
TRAINING_LOG_GROUP = "TrainingLogGroup"

# The budget stops' construct IDs (stacks/pipeline_stack.py): their deny policies' names begin with them, which is how
# tools tell a budget stop's explicit deny from any other refusal (tools/cli_errors.py).
BUDGET_STOP = "BudgetStop"
TEAM_BUDGET = "TeamBudget"

# Each output's key and what it is, in the order `make outputs` prints them.
OUTPUTS: dict[str, str] = {
    STATE_MACHINE_ARN: "The training pipeline's state machine: start runs here",
    DECISION_URL: "The approval decision URL (IAM-authenticated function URL; approvers only)",
    DATASETS_BUCKET: "Bucket for training datasets",
    ARTIFACTS_BUCKET: "Bucket for checkpoints, models and reports",
    DASHBOARD_URL: "The platform's CloudWatch dashboard",
    TRAINING_LOG_GROUP: "CloudWatch log group of the SageMaker training jobs (a stream per host)",
}


def pipeline_stack_name(name_prefix: str) -> str:
    """The stack that holds the outputs, from the settings' `name_prefix` (app_builder names it so)."""
    return f"{name_prefix}-pipeline"
