"""SageMaker hyperparameter tuning jobs, played locally (moto creates them Completed, with a made-up best job).

A tuning job here launches its trials as training jobs of its definition, named as SageMaker names
them (`<tuning job>-<NNN>-<8 hex>`), with the definition's static hyperparameters, the sampled
tuned values and `_tuning_objective_metric` (which SageMaker adds), and the tuning job's tags. At
most MaxParallelTrainingJobs run at once; each is run by the platform's training backend, as any
created job is (real local training in the demo, scripted histories in tests). Each
DescribeHyperParameterTuningJob brings it up to date: ended trials are counted, new ones start,
and once MaxNumberOfTrainingJobs have ended the best by the objective's final metric is reported.

What is not SageMaker's: values are sampled at random (seeded by the tuning job's name) whatever the
strategy, as Bayesian and Hyperband search are SageMaker's own; Hyperband stops no trial early here.
Each trial checkpoints under `<CheckpointConfig.S3Uri><trial>/` so that trials never resume from one
another; how SageMaker lays out a tuning job's checkpoints is not verified here.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse

from localrun.aws.iam import acting_as
from localrun.aws.moto_fixes import start_training_job

_ENDED = ("Completed", "Failed", "Stopped")


@dataclass
class Trial:
    name: str
    tuned: dict[str, str]
    job: Any


@dataclass
class TuningJob:
    name: str
    request: dict[str, Any]
    job: Any
    """moto's record (what ListHyperParameterTuningJobs and ListTags read)."""
    trials: list[Trial] = field(default_factory=list)
    status: str = "InProgress"
    failure_reason: str = ""
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended_at: datetime | None = None

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.request["HyperParameterTuningJobConfig"])


def sample(ranges: dict[str, Any], rng: random.Random) -> dict[str, str]:
    """One value per range, drawn uniformly on the range's scale."""
    values: dict[str, str] = {}
    for spec in ranges.get("CategoricalParameterRanges", []):
        values[spec["Name"]] = rng.choice(spec["Values"])
    for kind in ("ContinuousParameterRanges", "IntegerParameterRanges"):
        for spec in ranges.get(kind, []):
            low, high = float(spec["MinValue"]), float(spec["MaxValue"])
            scaling = spec.get("ScalingType", "Auto")
            if scaling == "Logarithmic":
                value = math.exp(rng.uniform(math.log(low), math.log(high)))
            elif scaling == "ReverseLogarithmic":
                value = 1 - math.exp(rng.uniform(math.log(1 - high), math.log(1 - low)))
            else:
                value = rng.uniform(low, high)
            values[spec["Name"]] = (
                str(min(int(high), max(int(low), round(value)))) if kind == "IntegerParameterRanges" else f"{value:.6g}"
            )
    return values


@dataclass
class LocalTuning:
    """The tuning jobs of one local platform; `created` and `stopped` are its training backend's hooks."""

    created: Callable[[str, dict[str, Any], Any], None]
    stopped: Callable[[str, Any], None]
    jobs: dict[str, TuningJob] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()

    def patches(self) -> list[Any]:
        return [
            mock.patch.object(SageMakerResponse, "create_hyper_parameter_tuning_job", self._create_response()),
            mock.patch.object(SageMakerModelBackend, "describe_hyper_parameter_tuning_job", self._describe()),
            mock.patch.object(SageMakerResponse, "stop_hyper_parameter_tuning_job", self._stop_response(), create=True),
            mock.patch.object(
                SageMakerResponse,
                "list_training_jobs_for_hyper_parameter_tuning_job",
                self._list_trials_response(),
                create=True,
            ),
        ]

    def trial_summaries(self) -> list[dict[str, Any]]:
        """Every trial of every tuning job, as ListTrainingJobsForHyperParameterTuningJob summarises it."""
        with self._lock:
            return [self._trial_summary(tuning, trial) for tuning in self.jobs.values() for trial in tuning.trials]

    # -- the API ----------------------------------------------------------------------------------
    def _create_response(self) -> Callable[[Any], Any]:
        original = SageMakerResponse.create_hyper_parameter_tuning_job

        def create(response: Any) -> Any:
            request = json.loads(response.body)
            result = original(response)  # moto refuses a name in use, and keeps the job and its tags
            name = request["HyperParameterTuningJobName"]
            record = response.sagemaker_backend.hyper_parameter_tuning_jobs[name]
            record.hyper_parameter_tuning_job_status = "InProgress"
            with self._lock:
                self.jobs[name] = TuningJob(name, request, record)
            return result

        return create

    def _describe(self) -> Callable[[Any, str], dict[str, Any]]:
        original = SageMakerModelBackend.describe_hyper_parameter_tuning_job

        def describe(backend: Any, hyper_parameter_tuning_job_name: str) -> dict[str, Any]:
            name = hyper_parameter_tuning_job_name
            tuning = self.jobs.get(name)
            if tuning is None:
                return dict(original(backend, name))
            with self._lock:
                self._advance(backend, tuning)
                return self._description(tuning)

        return describe

    def _stop_response(self) -> Callable[[Any], str]:
        def stop(response: Any) -> str:
            name = json.loads(response.body)["HyperParameterTuningJobName"]
            tuning = self.jobs.get(name)
            if tuning is None:
                raise ValidationError(message=f"Requested resource not found: tuning job {name}")
            with self._lock:
                if tuning.status != "InProgress":
                    raise ValidationError(message=f"The tuning job {name} is not in progress ({tuning.status})")
                self._set_status(tuning, "Stopping")
                for trial in tuning.trials:
                    if trial.job.training_job_status == "InProgress":
                        trial.job.training_job_status = trial.job.secondary_status = "Stopping"
                        self.stopped(trial.name, trial.job)
            return "{}"

        return stop

    def _list_trials_response(self) -> Callable[[Any], str]:
        """ListTrainingJobsForHyperParameterTuningJob: the trials by name, MaxResults (default 10) a page."""

        def list_trials(response: Any) -> str:
            params = json.loads(response.body)
            name = params["HyperParameterTuningJobName"]
            tuning = self.jobs.get(name)
            if tuning is None:
                raise ValidationError(message=f"Requested resource not found: tuning job {name}")
            with self._lock:
                trials = sorted(tuning.trials, key=lambda t: t.name)
                start = int(params.get("NextToken") or 0)
                end = start + int(params.get("MaxResults") or 10)
                page = [self._trial_summary(tuning, t) for t in trials[start:end]]
            for summary in page:
                summary["CreationTime"] = summary["CreationTime"].timestamp()
            return json.dumps({"TrainingJobSummaries": page, **({"NextToken": str(end)} if end < len(trials) else {})})

        return list_trials

    # -- what a tuning job does ---------------------------------------------------------------------
    def _advance(self, backend: Any, tuning: TuningJob) -> None:
        if tuning.status in _ENDED:
            return
        for trial in tuning.trials:
            if trial.job.training_job_status not in _ENDED:
                backend.describe_training_job(trial.name)  # the training backend brings it up to date
        running = [t for t in tuning.trials if t.job.training_job_status not in _ENDED]
        if tuning.status == "Stopping":
            if not running:
                self._end(tuning, "Stopped")
            return
        limits = tuning.config["ResourceLimits"]
        while (
            len(running) < limits["MaxParallelTrainingJobs"] and len(tuning.trials) < limits["MaxNumberOfTrainingJobs"]
        ):
            running.append(self._launch(backend, tuning))
        if not running:
            if self._best(tuning) is None:
                tuning.failure_reason = "No training job completed with the objective metric: " + "; ".join(
                    f"{t.name}: {t.job.failure_reason or t.job.training_job_status}" for t in tuning.trials
                )
                self._end(tuning, "Failed")
            else:
                self._end(tuning, "Completed")

    def _launch(self, backend: Any, tuning: TuningJob) -> Trial:
        index = len(tuning.trials) + 1
        name = f"{tuning.name}-{index:03d}-{hashlib.sha256(f'{tuning.name}/{index}'.encode()).hexdigest()[:8]}"
        rng = random.Random(f"{tuning.name}/{index}")  # noqa: S311 - sampling, not secrets
        tuned = sample(tuning.config["ParameterRanges"], rng)
        definition = tuning.request["TrainingJobDefinition"]
        objective = tuning.config["HyperParameterTuningJobObjective"]["MetricName"]
        hyperparameters = {
            **definition.get("StaticHyperParameters", {}),
            **tuned,
            "_tuning_objective_metric": objective,
        }
        checkpoint = definition.get("CheckpointConfig")
        if checkpoint is not None:
            checkpoint = {**checkpoint, "S3Uri": f"{checkpoint['S3Uri'].rstrip('/')}/{name}/"}
        request = {
            **{k: v for k, v in definition.items() if k not in ("StaticHyperParameters", "CheckpointConfig")},
            "TrainingJobName": name,
            "HyperParameters": hyperparameters,
            **({"CheckpointConfig": checkpoint} if checkpoint else {}),
            "Tags": tuning.request.get("Tags", []),
        }
        job = start_training_job(backend, name, request)
        trial = Trial(name, tuned, job)
        tuning.trials.append(trial)
        # SageMaker starts trials on its own authority, not as whoever happened to describe the tuning job.
        with acting_as(None):
            self.created(name, request, job)
        return trial

    def _objective(self, tuning: TuningJob, trial: Trial) -> float | None:
        metric = tuning.config["HyperParameterTuningJobObjective"]["MetricName"]
        for entry in trial.job.final_metric_data_list or []:
            if entry["MetricName"] == metric:
                return float(entry["Value"])
        return None

    def _best(self, tuning: TuningJob) -> Trial | None:
        scored = [
            (value, trial)
            for trial in tuning.trials
            if trial.job.training_job_status == "Completed" and (value := self._objective(tuning, trial)) is not None
        ]
        if not scored:
            return None
        maximize = tuning.config["HyperParameterTuningJobObjective"]["Type"] == "Maximize"
        return (max if maximize else min)(scored, key=lambda s: s[0])[1]

    def _set_status(self, tuning: TuningJob, status: str) -> None:
        tuning.status = status
        tuning.job.hyper_parameter_tuning_job_status = status

    def _end(self, tuning: TuningJob, status: str) -> None:
        self._set_status(tuning, status)
        tuning.ended_at = datetime.now(UTC)

    def _description(self, tuning: TuningJob) -> dict[str, Any]:
        statuses = [t.job.training_job_status for t in tuning.trials]
        counters = {
            "Completed": statuses.count("Completed"),
            "InProgress": sum(1 for s in statuses if s not in _ENDED),
            "RetryableError": 0,
            "NonRetryableError": statuses.count("Failed"),
            "Stopped": statuses.count("Stopped"),
        }
        described: dict[str, Any] = {
            "HyperParameterTuningJobName": tuning.name,
            "HyperParameterTuningJobArn": tuning.job.arn,
            "HyperParameterTuningJobConfig": tuning.config,
            "TrainingJobDefinition": tuning.request["TrainingJobDefinition"],
            "HyperParameterTuningJobStatus": tuning.status,
            "CreationTime": tuning.created_at,
            "LastModifiedTime": datetime.now(UTC),
            "TrainingJobStatusCounters": counters,
            "ObjectiveStatusCounters": {
                "Succeeded": sum(1 for t in tuning.trials if self._objective(tuning, t) is not None),
                "Pending": counters["InProgress"],
                "Failed": counters["NonRetryableError"],
            },
        }
        if tuning.ended_at is not None:
            described["HyperParameterTuningEndTime"] = tuning.ended_at
        if tuning.failure_reason:
            described["FailureReason"] = tuning.failure_reason[:1024]
        best = self._best(tuning)
        if best is not None:
            described["BestTrainingJob"] = self._trial_summary(tuning, best)
        return described

    def _trial_summary(self, tuning: TuningJob, trial: Trial) -> dict[str, Any]:
        """A trial as SageMaker summarises it (HyperParameterTrainingJobSummary)."""
        summary: dict[str, Any] = {
            "TrainingJobName": trial.name,
            "TrainingJobArn": trial.job.arn,
            "TuningJobName": tuning.name,
            "CreationTime": tuning.created_at,
            "TrainingJobStatus": trial.job.training_job_status,
            "TunedHyperParameters": trial.tuned,
        }
        value = self._objective(tuning, trial)
        if value is not None:
            objective = tuning.config["HyperParameterTuningJobObjective"]
            summary["FinalHyperParameterTuningJobObjectiveMetric"] = {
                "Type": objective["Type"],
                "MetricName": objective["MetricName"],
                "Value": value,
            }
            summary["ObjectiveStatus"] = "Succeeded"
        return summary
