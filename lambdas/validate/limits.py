"""What the deployed platform allows: the stack writes it into Validate's environment, and Validate reads it back.

`environment` and `from_environment` are each other's inverse; stacks/settings.py builds the limits from the
settings (`PlatformSettings.platform_limits`), each backend's part from its declaration (lambdas/backends/).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from lambdas.backends import BACKENDS, backend
from lambdas.backends.backend import BackendLimits
from lambdas.queue.waits import MAX_WAIT_MINUTES
from lambdas.shared.env import env_int, env_json, env_str
from lambdas.validate.inputs import ExecutionInput
from lambdas.validate.teams import Team, teams_from_json, teams_json

CODE_PYTHON_ENV = "CODE_PYTHON"
CODE_PLATFORM_ENV = "CODE_PLATFORM"
"""The image's Python and platform, which a run's own code's wheels must be packed for (the local platform, whose
hosts run this machine's interpreter, sets its own)."""


@dataclass(frozen=True)
class PlatformLimits:
    """What the deployed platform allows; the stack passes these through the environment."""

    datasets_bucket: str
    artifacts_bucket: str
    """Where each run's checkpoint ledger is, which every job reads as its ledger channel (contract/ledger.py)."""
    fsx_file_system_id: str
    fsx_mount_name: str
    training_subnet_ips: int
    max_runtime_hours: float
    allowed_instance_types: tuple[str, ...]
    poll_interval_seconds: int
    capacity_retries: int
    volume_size_gb: int
    run_emails: tuple[str, ...]
    tags: dict[str, str]
    backends: tuple[str, ...]
    """The backends a request may name (those the pipeline's training step runs)."""
    backend_limits: Mapping[str, BackendLimits]
    """Each registered backend's limits, by name (lambdas/backends/)."""
    training_plan_instance_type: str = ""
    """The instance type of the stage's SageMaker training plan (pipeline.training_plan; empty: none)."""
    teams: tuple[Team, ...] = ()
    """The teams of the settings, as far as Validate judges a run's team (lambdas/validate/teams.py)."""
    service_capacity: Mapping[str, int] = field(default_factory=dict)
    """The service environment's instances of each type, which every team's quota share draws on."""
    code_python: str = ""
    """The image's Python (e.g. "3.12"), for which a run's own code's wheels must be packed ("": not judged)."""
    code_platform: str = ""
    """The image's platform tag (e.g. "manylinux_2_35_x86_64"), likewise."""
    max_queue_wait_minutes: int = MAX_WAIT_MINUTES
    """The longest a team's job may wait for capacity at a time (service_environment.max_queue_wait_minutes)."""

    @classmethod
    def from_environment(cls) -> PlatformLimits:
        return cls(
            datasets_bucket=env_str("DATASETS_BUCKET"),
            artifacts_bucket=env_str("ARTIFACTS_BUCKET"),
            fsx_file_system_id=env_str("FSX_FILE_SYSTEM_ID"),
            fsx_mount_name=env_str("FSX_MOUNT_NAME"),
            training_subnet_ips=env_int("TRAINING_SUBNET_IPS"),
            max_runtime_hours=float(env_str("MAX_RUNTIME_HOURS")),
            allowed_instance_types=tuple(env_json("ALLOWED_INSTANCE_TYPES")),
            poll_interval_seconds=env_int("POLL_INTERVAL_SECONDS"),
            capacity_retries=env_int("CAPACITY_RETRIES"),
            volume_size_gb=env_int("VOLUME_SIZE_GB"),
            run_emails=tuple(env_json("RUN_EMAILS")),
            tags=dict(env_json("JOB_TAGS")),
            backends=tuple(env_json("TRAINING_BACKENDS")),
            backend_limits={name: declared.limits.from_environment() for name, declared in BACKENDS.items()},
            training_plan_instance_type=env_str("TRAINING_PLAN_INSTANCE_TYPE"),
            teams=teams_from_json(env_json("TEAMS")),
            service_capacity=dict(env_json("SERVICE_CAPACITY")),
            code_python=env_str(CODE_PYTHON_ENV),
            code_platform=env_str(CODE_PLATFORM_ENV),
            max_queue_wait_minutes=env_int("MAX_QUEUE_WAIT_MINUTES"),
        )

    def environment(self) -> dict[str, str]:
        """Validate's environment variables that `from_environment` reads."""
        variables = {
            "DATASETS_BUCKET": self.datasets_bucket,
            "ARTIFACTS_BUCKET": self.artifacts_bucket,
            "FSX_FILE_SYSTEM_ID": self.fsx_file_system_id,
            "FSX_MOUNT_NAME": self.fsx_mount_name,
            "TRAINING_SUBNET_IPS": str(self.training_subnet_ips),
            "MAX_RUNTIME_HOURS": str(self.max_runtime_hours),
            "ALLOWED_INSTANCE_TYPES": json.dumps(list(self.allowed_instance_types)),
            "POLL_INTERVAL_SECONDS": str(self.poll_interval_seconds),
            "CAPACITY_RETRIES": str(self.capacity_retries),
            "VOLUME_SIZE_GB": str(self.volume_size_gb),
            "RUN_EMAILS": json.dumps(list(self.run_emails)),
            "JOB_TAGS": json.dumps(self.tags),
            "TRAINING_BACKENDS": json.dumps(list(self.backends)),
            "TRAINING_PLAN_INSTANCE_TYPE": self.training_plan_instance_type,
            "TEAMS": json.dumps(teams_json(self.teams)),
            "SERVICE_CAPACITY": json.dumps(dict(self.service_capacity), sort_keys=True),
            CODE_PYTHON_ENV: self.code_python,
            CODE_PLATFORM_ENV: self.code_platform,
            "MAX_QUEUE_WAIT_MINUTES": str(self.max_queue_wait_minutes),
        }
        for limits in self.backend_limits.values():
            variables |= limits.environment()
        return variables

    def problems(self, name: str, request: ExecutionInput) -> list[str]:
        """Why backend `name`, which this platform deploys, cannot run the request (empty when it can). A name no
        backend is registered under has no rules here: settings check a retrain template before the pipeline says
        which backends it runs, and that check refuses the name."""
        limits = self.backend_limits.get(name)
        return [] if limits is None else backend(name).problems(request, limits)
