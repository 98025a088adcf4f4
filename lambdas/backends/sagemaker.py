"""The SageMaker backend: SageMaker training jobs (stacks/pipeline/sagemaker_step.py), the platform's first; its
requests are what Validate's own checks are written for, and it alone runs tuning jobs."""

from __future__ import annotations

from lambdas.backends.backend import Backend, NoLimits, no_problems

SAGEMAKER = Backend(
    name="sagemaker",
    limits=NoLimits,
    check=no_problems,
    step="stacks.pipeline.sagemaker_step.SageMakerTraining",
    step_id="TrainingStep",
    local=None,
    tuning=True,
    capacity_fallback=True,
    training_plans=True,
    denies=("sagemaker:CreateTrainingJob",),
)
