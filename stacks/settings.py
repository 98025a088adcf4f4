"""The platform's settings: one typed, validated object, built once in app.py.

Sources, later ones winning: the `platform` object in cdk.json's context, then the JSON object in
the PLATFORM_CONTEXT environment variable (make's `CONTEXT='{"stage": "prod"}'`), then `-c key=value`
overrides on the CDK command line whose key is a dotted settings path
(`-c stage=prod -c network.nat_gateways=1 -c notifications.alarm_emails='["a@b.org"]'`).
Any invalid value stops synth with a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract.catalog import INSTANCE_TYPES, UnknownInstanceTypeError, instance_type
from contract.layout import FSX_DATASETS, FSX_SCHEME, LocationError, normal_key
from lambdas.approvals.identity import Principal
from lambdas.backends import BACKENDS, deployed_backends
from lambdas.backends.backend import Deployment
from lambdas.queue.waits import MAX_WAIT_MINUTES, MIN_WAIT_MINUTES
from lambdas.retrain.window import NAME_PREFIX, Trigger, execution_input
from lambdas.shared import history
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.api_requests import python_pattern
from lambdas.validate.limits import PlatformLimits
from lambdas.validate.request import resolve
from lambdas.validate.service_models import service_model
from lambdas.validate.teams import QuotaShare, Team
from stacks.images import BaseImage, ImageTableError, resolve_base_image

# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
# AWS reserves the first four and the last address of every subnet.
AWS_RESERVED_IPS_PER_SUBNET = 5
# FSx for Lustre file servers take addresses in the training subnet too.
FSX_RESERVED_IPS = 16


def training_subnet_ips(mask: int) -> int:
    """The private IPs a training subnet of prefix length `mask` leaves for the cluster's instances."""
    return (1 << (32 - mask)) - AWS_RESERVED_IPS_PER_SUBNET - FSX_RESERVED_IPS


_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_PRINCIPAL = re.compile(r"^arn:aws(-[a-z]+)*:(iam|sts)::\d{12}:(role|user|assumed-role)/[\w+=,.@/-]+$")
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]{1,256}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")


class SettingsError(ValueError):
    """The settings are invalid; the message lists every problem and how to fix it."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ClusterSize(_Model):
    """The largest training cluster the network must hold."""

    instance_type: str = Field("ml.p5.48xlarge", description="SageMaker training instance type of the largest cluster.")
    count: int = Field(4, ge=1, le=512, description="Instances in the largest cluster.")

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        try:
            instance_type(value)
        except UnknownInstanceTypeError as exc:
            raise ValueError(str(exc)) from None
        return value


class NetworkSettings(_Model):
    vpc_cidr: str = Field("10.20.0.0/16", description="VPC IPv4 CIDR (private range, /16 to /22).")
    az_count: int = Field(2, ge=2, le=3, description="Availability Zones of the VPC (when none are named).")
    availability_zones: list[str] = Field(
        default_factory=list,
        description="AZ names (needs `region`); the first holds the training subnet, FSx and the cluster.",
    )
    training_subnet_mask: int = Field(
        20, ge=16, le=26, description="Prefix length of each training subnet (/20 = 4091 usable IPs)."
    )
    nat_gateways: int = Field(
        0, ge=0, le=3, description="NAT gateways; 0 keeps every subnet isolated (endpoints only)."
    )
    flow_log_retention_days: int = Field(365, description="VPC flow-log retention (CloudWatch values).")
    efa: bool = Field(True, description="Require EFA (the largest cluster's type must support it).")
    largest_cluster: ClusterSize = Field(default_factory=ClusterSize)  # type: ignore[arg-type]

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"must be an IPv4 network such as 10.20.0.0/16 ({exc})") from None
        if not net.is_private or not 16 <= net.prefixlen <= 22:
            raise ValueError("must be a private IPv4 range (10/8, 172.16/12, 192.168/16) of size /16 to /22")
        return value

    @field_validator("flow_log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return _log_retention(value)

    @model_validator(mode="after")
    def _capacity(self) -> NetworkSettings:
        cluster = instance_type(self.largest_cluster.instance_type)
        if self.efa and not cluster.supports_efa:
            efa_types = ", ".join(sorted(t.name for t in INSTANCE_TYPES.values() if t.supports_efa))
            raise ValueError(
                f"largest_cluster.instance_type {cluster.name!r} does not support EFA while network.efa "
                f"is true; use one of {efa_types}, or set network.efa=false"
            )
        usable = training_subnet_ips(self.training_subnet_mask)
        needed = self.largest_cluster.count * cluster.private_ips_needed
        if needed > usable:
            fit = next(
                (m for m in range(self.training_subnet_mask, 15, -1) if training_subnet_ips(m) >= needed),
                None,
            )
            hint = f"set network.training_subnet_mask to {fit} or less" if fit else "reduce the cluster"
            raise ValueError(
                f"the training subnet (/{self.training_subnet_mask}) has {usable} usable private IPs but "
                f"{self.largest_cluster.count} x {cluster.name} need {needed} "
                f"({cluster.private_ips_needed} each); {hint}"
            )
        vpc_size = ipaddress.IPv4Network(self.vpc_cidr).num_addresses
        wanted = (len(self.availability_zones) or self.az_count) * (
            2 ** (32 - self.training_subnet_mask) + 2**8 + (2**6 if self.nat_gateways else 0)
        )
        if wanted > vpc_size:
            raise ValueError(
                f"vpc_cidr {self.vpc_cidr} holds {vpc_size} addresses but "
                f"{len(self.availability_zones) or self.az_count} AZs of "
                f"/{self.training_subnet_mask} training + /24 service subnets need {wanted}; "
                "use a larger VPC or a longer training_subnet_mask"
            )
        return self


class StorageSettings(_Model):
    fsx_storage_capacity_gib: int = Field(
        1200, description="FSx for Lustre PERSISTENT_2 capacity: 1200 or a multiple of 2400 GiB."
    )
    fsx_throughput_per_tib: Literal[125, 250, 500, 1000] = Field(
        250, description="FSx throughput per TiB of storage (MB/s/TiB)."
    )
    fsx_compression: Literal["LZ4", "NONE"] = Field("LZ4", description="FSx data compression.")
    fsx_auto_export_prefix: str | None = Field(
        None,
        description="Optional artifacts-bucket prefix that `/results` on FSx exports to automatically.",
    )
    noncurrent_version_days: int = Field(
        30, ge=1, le=3650, description="Days a replaced or deleted S3 object version is kept."
    )
    incomplete_upload_days: int = Field(
        7, ge=1, le=365, description="Days before incomplete multipart uploads are aborted."
    )
    access_log_retention_days: int = Field(365, ge=90, le=3650, description="Days S3 server access logs are kept.")
    checkpoint_expiry_days: int | None = Field(
        None, ge=7, description="Expire checkpoint objects after this many days (default: keep)."
    )

    @field_validator("fsx_storage_capacity_gib")
    @classmethod
    def _capacity(cls, value: int) -> int:
        if value != 1200 and (value <= 0 or value % 2400):
            raise ValueError("PERSISTENT_2 file systems take 1200 GiB or a multiple of 2400 GiB")
        return value

    @field_validator("fsx_auto_export_prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9!_.*'()/-]{0,200}/", value):
            raise ValueError("must be an S3 key prefix ending in '/', such as 'results/'")
        return value


class ImageSettings(_Model):
    framework_version: str = Field(
        "2.10.0", description="PyTorch version of the SageMaker training DLC the image builds on."
    )
    python_version: str | None = Field(
        None, description="DLC Python tag such as py312 (default: the newest for that version)."
    )
    base_image_region: str | None = Field(
        None, description="Region whose DLC registry the build pulls from (default: `region`, else us-east-1)."
    )
    keep_images: int = Field(30, ge=1, le=1000, description="Tagged images kept in the ECR repository.")


class TagSettings(_Model):
    team: Annotated[str, Field(description="Value of the `team` tag on every resource.")]
    cost_centre: Annotated[str, Field(description="Value of the `cost-centre` tag on every resource.")]

    @field_validator("team", "cost_centre")
    @classmethod
    def _tag(cls, value: str) -> str:
        if not _TAG_VALUE.match(value):
            raise ValueError("must be 1-256 letters, digits, spaces or _ . : / = + - @")
        return value


class NotificationSettings(_Model):
    alarm_emails: list[str] = Field(default_factory=list, description="E-mail recipients of alarms.")
    budget_emails: list[str] = Field(default_factory=list, description="E-mail recipients of budget alerts.")
    approval_emails: list[str] = Field(
        default_factory=list, description="E-mail recipients of approval requests (the approvers' inboxes)."
    )
    run_emails: list[str] = Field(
        default_factory=list,
        description="Addresses a run's `notify` list may name; each receives only the runs that list it.",
    )

    @field_validator("alarm_emails", "budget_emails", "approval_emails", "run_emails")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not _EMAIL.match(v)]
        if bad:
            raise ValueError(f"not e-mail addresses: {bad}")
        return value


_TRAINING_PLAN = re.compile(
    r"^arn:aws(?:-[a-z]+)*:sagemaker:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):training-plan/(?P<name>.+)$"
)
_TRAINING_PLAN_NAME = service_model("sagemaker").shape_for("TrainingPlanName").metadata
"""The API's rule for a plan's name: its pattern (letters, digits, '-' inside) and length."""


class TrainingPlanSettings(_Model):
    """A SageMaker training plan: reserved capacity of one instance type that this stage's jobs on it use."""

    arn: str = Field(description="The plan's ARN (arn:aws:sagemaker:<region>:<account>:training-plan/<name>).")
    instance_type: str = Field(description="The plan's instance type: SageMaker takes the plan only for jobs on it.")

    @field_validator("arn")
    @classmethod
    def _arn(cls, value: str) -> str:
        match = _TRAINING_PLAN.match(value)
        name = match["name"] if match else ""
        if len(name) > _TRAINING_PLAN_NAME["max"] or not python_pattern(_TRAINING_PLAN_NAME["pattern"]).fullmatch(name):
            raise ValueError(
                "must be a training plan's ARN: arn:aws:sagemaker:<region>:<account>:training-plan/<name>, the name "
                f"1-{_TRAINING_PLAN_NAME['max']} letters, digits and '-', starting and ending with a letter or digit"
            )
        return value

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        try:
            instance_type(value)
        except UnknownInstanceTypeError as exc:
            raise ValueError(str(exc)) from None
        return value


class PipelineSettings(_Model):
    approval_threshold_usd: float = Field(
        500.0, ge=0, description="Runs whose on-demand estimate exceeds this need pre-launch approval."
    )
    approval_timeout_hours: int = Field(
        24, ge=1, le=168, description="An approval not decided in this time counts as a rejection."
    )
    poll_interval_seconds: int = Field(
        300, ge=30, le=3600, description="How often a running training job is described."
    )
    polls_per_execution: int = Field(
        history.poll_budget(),
        ge=2,
        le=history.poll_budget(),
        description="Polls of a run's job one execution makes before the run goes on in a new execution (a "
        "hand-over; default and most: what one execution's 25,000-event history affords, lambdas/shared/history.py).",
    )
    capacity_retries: int = Field(
        3,
        ge=0,
        le=10,
        description="New jobs (new names, fresh instances) after an insufficient-capacity failure or a failed "
        "pre-flight check.",
    )
    checkpoint_stale_minutes: int = Field(
        90, ge=5, le=1440, description="Warn when a training job has written no complete checkpoint for this long."
    )
    max_runtime_hours: float = Field(
        120, gt=0, le=672, description="Largest `max_runtime_hours` an execution may ask for."
    )
    volume_size_gb: int = Field(200, ge=1, le=16384, description="EBS volume per training instance.")
    inter_container_encryption: bool = Field(
        True, description="Encrypt traffic between training instances (slower collectives; off only if accepted)."
    )
    forbid_self_approval: bool = Field(
        True,
        description="Refuse a decision by whoever started the run; runs are started with `tp start`, "
        "which proves who starts them (off only where one person may both start and approve a run).",
    )
    network_isolation: bool = Field(
        True,
        description="Training containers reach nothing but their cluster (EnableNetworkIsolation); off only for "
        "training code that must call out.",
    )
    allowed_instance_types: list[str] | None = Field(
        None, description="Instance types runs may use (default: every type of the platform's catalog)."
    )
    monthly_budget_usd: float = Field(
        10000.0,
        gt=0,
        description="Monthly AWS Budgets limit for the platform's tag; at 100% of actual spend no new training "
        "job can be created.",
    )
    budget_contact: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Who to ask when the budget is spent (runs are refused naming them); default: "
        "`notifications.budget_emails`.",
    )
    spot_cost_fraction: tuple[float, float] = Field(
        (0.3, 0.7), description="Managed spot cost as a fraction of on-demand: the estimate's [low, high]."
    )
    price_overrides: dict[str, float] = Field(
        default_factory=dict, description="USD per instance-hour replacing the bundled list price of a type."
    )
    training_plan: TrainingPlanSettings | None = Field(
        None,
        description="`{arn, instance_type}` of a SageMaker training plan: this stage's on-demand SageMaker jobs of one "
        "instance group on its type run in its reserved capacity (docs/platform-team/training-plans.md).",
    )

    @field_validator("spot_cost_fraction")
    @classmethod
    def _fraction(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not 0 < low <= high <= 1:
            raise ValueError("must be [low, high] with 0 < low <= high <= 1")
        return value

    @field_validator("allowed_instance_types")
    @classmethod
    def _allowed_types(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("name at least one instance type")
        _known_type_names(value)
        return sorted(set(value))

    def instance_types(self) -> list[str]:
        """The types runs may use: the allow-list, or the whole catalog."""
        return sorted(self.allowed_instance_types or INSTANCE_TYPES)

    @field_validator("price_overrides")
    @classmethod
    def _prices(cls, value: dict[str, float]) -> dict[str, float]:
        _known_type_names(value)
        if any(v <= 0 for v in value.values()):
            raise ValueError("prices must be positive")
        return value


# Relative `retrain[].input` paths are read from the project root (where cdk.json is).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Lambda's environment holds 4 KB in all; the triggers' share leaves room for the other variables.
RETRAIN_ENVIRONMENT_BYTES = 3072
# What the synth-time check resolves a template against in place of the deployed names.
OFFLINE_DATASETS_BUCKET = "datasets-bucket"
"""The datasets bucket's stand-in where inputs are checked without a deployment."""
OFFLINE_ARTIFACTS_BUCKET = "artifacts-bucket"
"""The artifacts bucket's stand-in, likewise (a run's own code is named in it)."""


class RetrainTrigger(_Model):
    """A prefix of the datasets bucket whose new objects start a run, once per quiet period."""

    name: str = Field(description="3-40 of a-z, 0-9, '-'; names the trigger and its executions.")
    prefix: str = Field(description="Key prefix in the datasets bucket, ending in '/', e.g. 'incoming/web-text/'.")
    input: str | dict[str, Any] = Field(
        description="Execution-input template: a JSON file (relative to cdk.json) or an inline object."
    )
    quiet_minutes: int = Field(
        30, ge=5, le=1440, description="Start the run once no new object has arrived for this long."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,38}[a-z0-9]", value):
            raise ValueError(
                "must be 3-40 lowercase letters, digits and '-', starting and ending with a letter or digit"
            )
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.endswith("/") or len(value) > 201 or _abnormal(value):
            raise ValueError(
                "must be a folder of the datasets bucket in its normal form: a key prefix such as "
                f"'incoming/web-text/', ending in '/' ({_abnormal(value) or 'at most 200 characters before it'})"
            )
        return value

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        _load_template(value)
        return value

    @model_validator(mode="after")
    def _dataset(self) -> RetrainTrigger:
        template = self.template()
        if proofs := [field for field in ("requester_proof", "membership_proof") if field in template]:
            drop = " and ".join(f"`{p}`" for p in proofs)
            raise ValueError(f"input: drop {drop}; the trigger proves who starts the run itself")
        fsx = f"{FSX_SCHEME}{FSX_DATASETS}{self.prefix}"
        dataset = template.get("dataset")
        if dataset is not None and (not isinstance(dataset, str) or dataset.rstrip("/") + "/" != fsx):
            raise ValueError(
                f"input: dataset {dataset!r} is not the new data's location; leave `dataset` out (the run then "
                f"reads s3://<datasets bucket>/{self.prefix}) or set it to {fsx!r}"
            )
        return self

    def template(self) -> dict[str, Any]:
        """The execution-input template, read from its file where it names one."""
        return _load_template(self.input)

    def as_trigger(self) -> Trigger:
        return Trigger(name=self.name, prefix=self.prefix, quiet_minutes=self.quiet_minutes, input=self.template())


def _source(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else "inline"


def _load_template(value: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    path = PROJECT_ROOT / value
    try:
        loaded = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(
            f"cannot read the template file {value!r} ({exc.strerror}); paths are relative to cdk.json"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the template file {value!r} is not JSON ({exc})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"the template file {value!r} must hold a JSON object (docs/reference/run-input.md)")
    return loaded


# Batch's limit on a quota share's capacity limits is the five instance types.
MAX_QUOTA_SHARE_LIMITS = 5
_TEAM_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def _known_type_names(names: Iterable[str]) -> None:
    """ValueError naming every unknown instance type with its fix (contract/catalog.py's suggestion)."""
    unknown = []
    for name in names:
        try:
            instance_type(name)
        except UnknownInstanceTypeError as exc:
            unknown.append(str(exc))
    if unknown:
        raise ValueError("; ".join(unknown))


def _known_types(value: dict[str, int]) -> dict[str, int]:
    _known_type_names(value)
    bad = {k: v for k, v in value.items() if not isinstance(v, int) or v < 1}
    if bad:
        raise ValueError(f"instance counts must be whole numbers of at least 1; bad: {bad}")
    return value


MAX_PREEMPTION_RETRIES = 100


class ServiceEnvironmentSettings(_Model):
    """The AWS Batch service environment teams' SageMaker training jobs queue for (only with `teams`)."""

    capacity: dict[str, int] = Field(
        default_factory=dict,
        description="Instances of each SageMaker instance type the teams' jobs may hold at once, "
        'e.g. `{"ml.p5.48xlarge": 8}`; every team\'s quota share draws on it.',
    )
    preemption_retries: int = Field(
        20,
        ge=0,
        le=MAX_PREEMPTION_RETRIES,
        description="How often a team's job may be preempted (each time it resumes from its checkpoints) before "
        "the run fails; 0: the first preemption fails it.",
    )
    max_queue_wait_minutes: int = Field(
        MAX_WAIT_MINUTES,
        ge=MIN_WAIT_MINUTES,
        le=MAX_WAIT_MINUTES,
        description="The longest a team's job may wait for capacity at a time (after it is submitted, and again after "
        "each preemption): the queue terminates a job blocked at its head this long (AWS Batch allows 10 minutes to "
        "24 hours), the run's progress handler one that waited this long for any reason, and the run fails with "
        "QueueWaitExceeded. A run may ask for less (its input's `max_queue_wait_minutes`).",
    )

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: dict[str, int]) -> dict[str, int]:
        return _known_types(value)


class QuotaShareSettings(_Model):
    """A team's quota share of the service environment."""

    capacity: dict[str, int] = Field(
        description=f"Instances of each type (at most {MAX_QUOTA_SHARE_LIMITS} types) the team holds without borrowing."
    )
    sharing: Literal["RESERVE", "LEND", "LEND_AND_BORROW"] = Field(
        "RESERVE",
        description="RESERVE keeps idle capacity for the team; LEND lends it out; LEND_AND_BORROW also borrows.",
    )
    borrow_limit_percent: int | None = Field(
        None,
        ge=0,
        description="With LEND_AND_BORROW: the most it may borrow, as a percentage of its capacity "
        "(default: no limit).",
    )
    in_share_preemption: bool = Field(
        False, description="A higher-priority job of the team may preempt a lower-priority one of the same team."
    )

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: dict[str, int]) -> dict[str, int]:
        if not 1 <= len(value) <= MAX_QUOTA_SHARE_LIMITS:
            raise ValueError(f"must name 1 to {MAX_QUOTA_SHARE_LIMITS} instance types; it names {len(value)}")
        return _known_types(value)

    @field_validator("borrow_limit_percent")
    @classmethod
    def _borrowing(cls, value: int | None, info: ValidationInfo) -> int | None:
        sharing = info.data.get("sharing")
        if value is not None and sharing not in (None, "LEND_AND_BORROW"):
            raise ValueError(
                f"applies only to sharing LEND_AND_BORROW, not {sharing}: remove it or set sharing to LEND_AND_BORROW"
            )
        return value


class TeamSettings(_Model):
    """A team: who submits and approves, its data, its monthly budget and its quota share."""

    name: str = Field(description="Lowercase letters, digits and '-' (at most 32): the quota share and cost tag value.")
    members: list[str] = Field(default_factory=list, description="IAM role or user ARNs of the team's members.")
    member_tag: str | None = Field(
        None, description="A principal tag value (`platform-team`) that also makes a principal a member."
    )
    approvers: list[str] = Field(
        default_factory=list,
        description="IAM principal ARNs who alone decide the team's gates (none: the platform's `approvers` do).",
    )
    notification_emails: list[str] = Field(
        default_factory=list,
        description="The team's budget e-mails; they also receive its approval requests and the runs that list them.",
    )
    dataset_prefixes: list[str] = Field(
        default_factory=list, description="Keys under the datasets bucket the team's data lives in (end with '/')."
    )
    monthly_budget_usd: float = Field(gt=0, description="Monthly spend on the team's tag before its submissions stop.")
    quota_share: QuotaShareSettings

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _TEAM_NAME.match(value):
            raise ValueError("must start with a lowercase letter and hold at most 32 of a-z, 0-9, '-'")
        return value

    @field_validator("members", "approvers")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not _PRINCIPAL.match(v)]
        if bad:
            raise ValueError(f"must be IAM role/user ARNs (arn:aws:iam::123456789012:role/Name); bad: {bad}")
        return value

    @field_validator("member_tag")
    @classmethod
    def _tag(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("members") == []:
            raise ValueError("the team has no members: name IAM role ARNs in `members` or set `member_tag`")
        if value is not None and not _TAG_VALUE.match(value):
            raise ValueError("must be 1-256 letters, digits, spaces or _ . : / = + - @")
        return value

    @field_validator("notification_emails")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not _EMAIL.match(v)]
        if bad:
            raise ValueError(f"not e-mail addresses: {bad}")
        return value

    @field_validator("dataset_prefixes")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        bad = {v: _abnormal(v) or "does not end with '/'" for v in value if not v.endswith("/") or _abnormal(v)}
        if bad:
            raise ValueError(
                "must be key prefixes of the datasets bucket in their normal form, ending with '/': "
                + "; ".join(f"{v!r} {why}" for v, why in bad.items())
            )
        return value


def _abnormal(prefix: str) -> str | None:
    """Why a datasets-bucket key prefix is not in its normal form (contract/layout.py normal_key), or None."""
    try:
        normal_key(prefix)
    except LocationError as exc:
        return str(exc)
    return None


def settings_team_problems(
    teams: Sequence[TeamSettings], capacity: Mapping[str, int], allowed_types: Sequence[str]
) -> list[str]:
    """Every problem of the teams together and against the service environment, each with its fix."""
    problems: list[str] = []
    names = [team.name for team in teams]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"teams: the name {name!r} is used {names.count(name)} times; give each team its own name")
    if teams and not capacity:
        problems.append(
            "service_environment.capacity is empty but teams are set: name the instances of each type the teams "
            'share, e.g. {"ml.p5.48xlarge": 8}'
        )
    for type_, count in capacity.items():
        if type_ not in allowed_types:
            problems.append(
                f"service_environment.capacity[{type_!r}] = {count}: {type_} is not in "
                "pipeline.allowed_instance_types; add it there or remove it here"
            )
    for i, team in enumerate(teams):
        for type_, count in team.quota_share.capacity.items():
            where = f"teams[{i}].quota_share.capacity[{type_!r}] = {count}"
            if capacity and type_ not in capacity:
                problems.append(
                    f"{where}: the service environment has no {type_}; add it to service_environment.capacity "
                    "or remove it from the team's share"
                )
            elif type_ in capacity and count > capacity[type_]:
                problems.append(
                    f"{where}: above the service environment's {capacity[type_]}; lower it or raise "
                    f"service_environment.capacity[{type_!r}]"
                )
    owners = [(prefix, i, team.name) for i, team in enumerate(teams) for prefix in team.dataset_prefixes]
    for a, (prefix, i, name) in enumerate(owners):
        for other, j, other_name in owners[a + 1 :]:
            if prefix.startswith(other) or other.startswith(prefix):
                problems.append(
                    f"teams[{i}].dataset_prefixes {prefix!r} ({name}) overlaps teams[{j}].dataset_prefixes "
                    f"{other!r} ({other_name}): a key must belong to one team; make them disjoint"
                )
    return problems


class PlatformSettings(_Model):
    """Everything a platform team chooses; nothing else in the app is configurable."""

    stage: str = Field("dev", description="Stage name: prefixes stack names (lowercase, digits, '-').")
    account: str | None = Field(None, description="AWS account ID; leave unset for an environment-agnostic synth.")
    region: str | None = Field(None, description="AWS Region; leave unset for an environment-agnostic synth.")
    network: NetworkSettings = Field(default_factory=NetworkSettings)  # type: ignore[arg-type]
    storage: StorageSettings = Field(default_factory=StorageSettings)  # type: ignore[arg-type]
    image: ImageSettings = Field(default_factory=ImageSettings)  # type: ignore[arg-type]
    tags: TagSettings
    notifications: NotificationSettings = Field(default_factory=NotificationSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)  # type: ignore[arg-type]
    approvers: list[str] = Field(
        default_factory=list,
        description="IAM principal ARNs who decide approval gates: of runs without a team, and of teams that name "
        "no approvers.",
    )
    execution_data_readers: list[str] = Field(
        default_factory=list,
        description="IAM principal ARNs (administrators) allowed to decrypt execution inputs, outputs and history; "
        "the platform's own roles always can.",
    )
    service_environment: ServiceEnvironmentSettings = Field(default_factory=ServiceEnvironmentSettings)  # type: ignore[arg-type]
    teams: list[TeamSettings] = Field(
        default_factory=list,
        description="Teams whose SageMaker training jobs queue in AWS Batch under a quota share each "
        "(docs/platform-team/teams.md); none: no queue, no shares.",
    )
    retrain: list[RetrainTrigger] = Field(
        default_factory=list,
        description="Retrain triggers: `{name, prefix, input, quiet_minutes}` each; new objects under `prefix` "
        "start one run of `input` per quiet period (docs/platform-team/retraining.md).",
    )

    @field_validator("stage")
    @classmethod
    def _stage(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,19}", value):
            raise ValueError("must start with a lowercase letter and hold at most 20 of a-z, 0-9, '-'")
        return value

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{12}", value):
            raise ValueError("must be a 12-digit AWS account ID")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.match(value):
            raise ValueError("must be an AWS Region code such as us-east-1")
        return value

    @field_validator("approvers", "execution_data_readers")
    @classmethod
    def _approvers(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not _PRINCIPAL.match(v)]
        if bad:
            raise ValueError(f"must be IAM role/user ARNs (arn:aws:iam::123456789012:role/Name); bad: {bad}")
        return value

    def require_deployable(self) -> None:
        """Refuse a deploy whose approval gates no one could decide (synth and review accept it)."""
        if not self.approvers:
            raise SettingsError(
                "approvers is empty, but every run reaches the promotion gate (and runs estimated above "
                "pipeline.approval_threshold_usd the launch gate): no decision could be made and every run would "
                "time out. Name the IAM roles or users who decide, e.g. "
                'CONTEXT=\'{"approvers": ["arn:aws:iam::123456789012:role/MLLead"]}\' make deploy, '
                "-c approvers='[\"arn:aws:iam::123456789012:role/MLLead\"]' or cdk.json's platform.approvers"
            )

    @model_validator(mode="after")
    def _teams_fit(self) -> PlatformSettings:
        problems = settings_team_problems(self.teams, self.service_environment.capacity, self.pipeline.instance_types())
        if self.service_environment.capacity and not self.teams:
            problems.append("service_environment.capacity is set but no teams are: add teams or remove the capacity")
        if problems:
            raise ValueError("\n    ".join(["the teams do not fit together:", *problems]))
        return self

    @model_validator(mode="after")
    def _teams_runs_can_be_decided(self) -> PlatformSettings:
        """A member who is their team's only approver could never have a run decided where self-approval is refused."""
        if not self.pipeline.forbid_self_approval:
            return self
        problems = [
            f"teams[{i}] ({team.name}): {member} is both a member and the team's only approver, and "
            "pipeline.forbid_self_approval refuses a decision by whoever started the run, so no one could decide "
            "their runs: name another approver, or remove the team's approvers (the platform's approvers decide)"
            for i, team in enumerate(self.teams)
            for member in team.members
            if {Principal.parse(a) for a in team.approvers} == {Principal.parse(member)}
        ]
        if problems:
            raise ValueError("\n    ".join(["a team's runs could not be decided:", *problems]))
        return self

    @model_validator(mode="after")
    def _retrain_templates_run(self) -> PlatformSettings:
        names = [t.name for t in self.retrain]
        if len(set(names)) != len(names):
            raise ValueError(f"retrain: trigger names must be unique; {sorted(names)}")
        for trigger in self.retrain:
            problems = self.retrain_problems(trigger, backends=None)
            if problems:
                raise ValueError(f"retrain trigger {trigger.name!r}: {problems}")
        size = len(json.dumps([asdict(t.as_trigger()) for t in self.retrain]))
        if size > RETRAIN_ENVIRONMENT_BYTES:
            raise ValueError(
                f"retrain: the triggers and their templates take {size} bytes, more than the "
                f"{RETRAIN_ENVIRONMENT_BYTES} a Lambda environment leaves them; register fewer or smaller templates"
            )
        return self

    def retrain_problems(self, trigger: RetrainTrigger, *, backends: tuple[str, ...] | None) -> str | None:
        """What Validate would say of the trigger's run, or None; `backends` None skips the backend check."""
        run_input = execution_input(trigger.as_trigger(), OFFLINE_DATASETS_BUCKET)
        limits = self.offline_limits(
            backends=backends if backends is not None else (str(run_input.get("backend", "sagemaker")),)
        )
        try:
            # Who starts a retrain run is known only when it starts: its team's membership is judged then.
            resolve(
                run_input,
                execution_name=f"{NAME_PREFIX}{trigger.name}-0123456789abcdef",
                limits=limits,
                check_membership=False,
            )
        except InvalidRequest as exc:
            problems = str(exc).removeprefix("The training request cannot run:\n").replace("\n", "\n  ")
            return (
                f"its input template ({_source(trigger.input)}) would be rejected when new data arrives:\n  {problems}"
            )
        return None

    def offline_limits(self, *, datasets_bucket: str = "", backends: tuple[str, ...] | None = None) -> PlatformLimits:
        """The limits Validate applies, with stand-ins for what only a deployment names (its buckets and file
        system): for checking inputs without AWS (synth's retrain templates, `tp validate`)."""
        return self.platform_limits(
            datasets_bucket=datasets_bucket or OFFLINE_DATASETS_BUCKET,
            artifacts_bucket=OFFLINE_ARTIFACTS_BUCKET,
            fsx_file_system_id="fs-0123456789abcdef0",  # of the form SageMaker takes: the request is checked
            fsx_mount_name="offline",
            tags={},
            backends=deployed_backends(teams=bool(self.teams)) if backends is None else backends,
        )

    def platform_limits(
        self,
        *,
        datasets_bucket: str,
        artifacts_bucket: str,
        fsx_file_system_id: str,
        fsx_mount_name: str,
        tags: dict[str, str],
        backends: Sequence[str],
    ) -> PlatformLimits:
        """What Validate allows on the platform these settings deploy, beside what the deployment names
        (its datasets and artifacts buckets, its file system, the jobs' tags, the backends its pipeline runs)."""
        largest = self.network.largest_cluster
        deployment = Deployment(largest_cluster_type=largest.instance_type, largest_cluster_count=largest.count)
        return PlatformLimits(
            datasets_bucket=datasets_bucket,
            artifacts_bucket=artifacts_bucket,
            fsx_file_system_id=fsx_file_system_id,
            fsx_mount_name=fsx_mount_name,
            training_subnet_ips=training_subnet_ips(self.network.training_subnet_mask),
            max_runtime_hours=self.pipeline.max_runtime_hours,
            allowed_instance_types=tuple(self.pipeline.instance_types()),
            poll_interval_seconds=self.pipeline.poll_interval_seconds,
            capacity_retries=self.pipeline.capacity_retries,
            volume_size_gb=self.pipeline.volume_size_gb,
            run_emails=tuple(self.notifications.run_emails),
            tags=tags,
            backends=tuple(backends),
            backend_limits={name: backend.limits.from_deployment(deployment) for name, backend in BACKENDS.items()},
            training_plan_instance_type=plan.instance_type if (plan := self.pipeline.training_plan) else "",
            teams=tuple(
                Team(
                    name=team.name,
                    members=tuple(team.members),
                    member_tag=team.member_tag,
                    notification_emails=tuple(team.notification_emails),
                    dataset_prefixes=tuple(team.dataset_prefixes),
                    monthly_budget_usd=team.monthly_budget_usd,
                    quota_share=QuotaShare(
                        capacity=dict(team.quota_share.capacity),
                        sharing=team.quota_share.sharing,
                        borrow_limit_percent=team.quota_share.borrow_limit_percent,
                    ),
                )
                for team in self.teams
            ),
            service_capacity=dict(self.service_environment.capacity),
            code_python=(target := self.base_image().wheel_target).python,
            code_platform=target.platform,
            max_queue_wait_minutes=self.service_environment.max_queue_wait_minutes,
        )

    @model_validator(mode="after")
    def _training_plan_here(self) -> PlatformSettings:
        plan = self.pipeline.training_plan
        if plan is None:
            return self
        match = _TRAINING_PLAN.match(plan.arn)
        assert match is not None  # the field's own check
        for key, value in (("region", self.region), ("account", self.account)):
            if value is not None and match[key] != value:
                raise ValueError(
                    f"pipeline.training_plan.arn is of {key} {match[key]!r}, not this stage's {value!r}: "
                    "a job can use only a plan of its own account and Region"
                )
        if plan.instance_type not in self.pipeline.instance_types():
            raise ValueError(
                f"pipeline.training_plan.instance_type {plan.instance_type!r} is not in pipeline.allowed_instance_types"
            )
        return self

    @model_validator(mode="after")
    def _azs_in_region(self) -> PlatformSettings:
        azs = self.network.availability_zones
        if not azs:
            return self
        if self.region is None:
            raise ValueError("network.availability_zones needs `region` to be set (AZ names belong to a Region)")
        bad = [az for az in azs if not re.fullmatch(re.escape(self.region) + r"[a-z]", az)]
        if bad:
            raise ValueError(f"network.availability_zones {bad} are not AZs of region {self.region!r}")
        if not 2 <= len(azs) <= 3 or len(set(azs)) != len(azs):
            raise ValueError("network.availability_zones must name 2 or 3 distinct AZs")
        return self

    @model_validator(mode="after")
    def _image_resolvable(self) -> PlatformSettings:
        try:
            self.base_image()
        except ImageTableError as exc:
            raise ValueError(f"image: {exc}") from None
        return self

    def base_image(self) -> BaseImage:
        """The training DLC the platform image builds on, from the SDK's table."""
        region = self.image.base_image_region or self.region or "us-east-1"
        return resolve_base_image(self.image.framework_version, self.image.python_version, region)

    @property
    def budget_contact(self) -> str:
        """Who a run refused over budget is told to ask."""
        return (
            self.pipeline.budget_contact
            or ", ".join(self.notifications.budget_emails)
            or "the platform team that deployed this stack (no pipeline.budget_contact is set)"
        )

    @property
    def name_prefix(self) -> str:
        """Prefix of stack names, so two stages can share an account."""
        return stage_prefix(self.stage)


def stage_prefix(stage: str) -> str:
    """The prefix of a stage's stack names and its state machine's name."""
    return f"training-platform-{stage}"


def _log_retention(value: int) -> int:
    if value not in LOG_RETENTION_DAYS:
        raise ValueError(f"CloudWatch Logs accepts only {', '.join(map(str, LOG_RETENTION_DAYS))} days")
    return value


def _field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from _field_paths(sub, f"{path}.")
        else:
            yield path


SETTING_PATHS: tuple[str, ...] = tuple(_field_paths(PlatformSettings))
_SECTIONS = {p.split(".", 1)[0] for p in SETTING_PATHS}


def _coerce(raw: Any) -> Any:
    """`-c` values arrive as strings; JSON lists/objects/null are decoded, scalars left to pydantic."""
    if isinstance(raw, str) and (raw.startswith(("[", "{")) or raw == "null"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


# The environment variable `make` fills from CONTEXT='{...}': a JSON object merged over cdk.json's
# `platform` object (before `-c` overrides), read by every synth (make synth, deploy, review, demo).
OVERRIDES_VARIABLE = "PLATFORM_CONTEXT"
# The context flag `make deploy` sets: only a deploy refuses settings no one could operate.
DEPLOY_FLAG = "platform:deploy"


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        merged[key] = _merge(below, value) if isinstance(below, Mapping) and isinstance(value, Mapping) else value
    return merged


def parse_overrides(raw: str | None) -> dict[str, Any]:
    """The JSON object of PLATFORM_CONTEXT (make's CONTEXT=); empty when unset."""
    if raw is None or not raw.strip():
        return {}
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{OVERRIDES_VARIABLE} (make's CONTEXT=) is not JSON ({exc}): {raw!r}") from None
    if not isinstance(loaded, dict):
        raise SettingsError(
            f"{OVERRIDES_VARIABLE} (make's CONTEXT=) must be a JSON object of settings, "
            f'e.g. CONTEXT=\'{{"stage": "prod"}}\'; got {raw!r}'
        )
    return loaded


def settings_from_context(context: Mapping[str, Any], overrides: str | None = None) -> PlatformSettings:
    """Settings from the CDK context: cdk.json's `platform` object, the JSON object `overrides`
    (PLATFORM_CONTEXT) merged over it, then `-c dotted.key=value` overrides.

    Keys that are not settings paths are CDK's own (feature flags, `aws:cdk:*`) and are ignored,
    unless one is a near miss of a settings path: a typo must not be silently dropped. With the
    context flag `platform:deploy` set (make deploy), settings no one could operate are refused.
    """
    base = context.get("platform") or {}
    if not isinstance(base, Mapping):
        raise SettingsError("cdk.json context 'platform' must be an object of settings")
    base = _merge(base, parse_overrides(overrides))
    dotted: dict[str, Any] = {}
    for key, value in context.items():
        if key == "platform" or ":" in key or key.startswith("@"):
            continue
        if key in SETTING_PATHS or key in _SECTIONS or difflib.get_close_matches(key, SETTING_PATHS, n=1):
            dotted[key] = value
    settings = build_settings(base, dotted)
    if str(context.get(DEPLOY_FLAG, "")).lower() in ("true", "1"):
        settings.require_deployable()
    return settings


def build_settings(base: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> PlatformSettings:
    """Merge cdk.json's `platform` object with dotted overrides and validate the result."""
    tree: dict[str, Any] = json.loads(json.dumps(dict(base)))
    problems: list[str] = []
    for key, raw in sorted((overrides or {}).items()):
        if key not in SETTING_PATHS and key not in _SECTIONS:
            near = difflib.get_close_matches(key, SETTING_PATHS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(f"  - {key}: unknown setting{hint}; see docs/reference/settings.md")
            continue
        _set_path(tree, key, _coerce(raw))
    # The other settings are still judged: every problem is reported at once, the unknown keys first.
    try:
        settings = PlatformSettings.model_validate(tree)
    except ValidationError as exc:
        problems += _describe(exc, tree)
    if problems:
        raise SettingsError("\n".join([_INVALID, *problems]))
    return settings


_INVALID = "Invalid platform settings (cdk.json context 'platform' or -c key=value):"


def _describe(exc: ValidationError, tree: Mapping[str, Any]) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(loc, SETTING_PATHS, n=1)
            msg = "unknown setting" + (f" (did you mean {near[0]!r}?)" if near else "")
            lines.append(f"  - {loc}: {msg}")
            continue
        value = _lookup(tree, err["loc"]) if err["loc"] else _MISSING  # the root: the whole tree says nothing
        shown = f" = {value!r}" if value is not _MISSING else ""
        lines.append(f"  - {loc}{shown}: {msg}")
    return lines


_MISSING = object()


def _lookup(tree: Mapping[str, Any], loc: tuple[int | str, ...]) -> Any:
    node: Any = tree
    for part in loc:
        in_mapping = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_mapping or in_list:
            node = node[part]
        else:
            return _MISSING
    return node


def settings_table() -> str:
    """The settings reference page's table (docs/reference/settings.md), generated from the model so the two cannot
    drift."""
    rows = ["| Setting | Default | Description |", "| --- | --- | --- |"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                walk(sub, f"{prefix}{name}.")
                continue
            if field.is_required():
                default = "(required)"
            elif field.default_factory is not None:
                default = json.dumps(field.default_factory())  # type: ignore[call-arg]
            else:
                default = json.dumps(field.default)
            rows.append(f"| `{prefix}{name}` | `{default}` | {field.description or ''} |")

    walk(PlatformSettings, "")
    return "\n".join(rows)
