"""The training backends the platform deploys, in the order the pipeline offers them
(docs/development/adding-a-backend.md). Validate, its environment, the pipeline's steps, the budget stop and the
local platform iterate these."""

from __future__ import annotations

from typing import Any

from lambdas.backends.backend import Backend
from lambdas.backends.batch import BATCH
from lambdas.backends.queue import QUEUE_BACKEND
from lambdas.backends.sagemaker import SAGEMAKER

BACKENDS: dict[str, Backend[Any]] = {backend.name: backend for backend in (SAGEMAKER, BATCH, QUEUE_BACKEND)}


def backend(name: str) -> Backend[Any]:
    """The backend of this name, or KeyError naming the ones there are."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"no training backend {name!r}; the platform has {', '.join(BACKENDS)}") from None


def deployed_backends(*, teams: bool) -> list[str]:
    """The backends a platform deploys: all, less those that need teams when its settings name none."""
    return [name for name, declared in BACKENDS.items() if teams or not declared.needs_teams]


def tuning_backends() -> list[str]:
    """The backends whose requests may ask for hyperparameter tuning."""
    return [name for name, declared in BACKENDS.items() if declared.tuning]


def fallback_backends() -> list[str]:
    """The backends whose requests may list `fallback` clusters."""
    return [name for name, declared in BACKENDS.items() if declared.capacity_fallback]


def training_plan_backends() -> list[str]:
    """The backends whose jobs run in the stage's training plan when on its instance type."""
    return [name for name, declared in BACKENDS.items() if declared.training_plans]
