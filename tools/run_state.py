"""A run as `tp` reads it: its execution history, its jobs (SageMaker training jobs, a tuning job's trials, AWS
Batch jobs), their log streams in CloudWatch and what the newest lines say, and its goodput so far.

`tp watch`, `tp logs` and `tp show` print from here. The latest step, loss and validation loss are read from the
job's own log lines (contract/metrics.py parses them as SageMaker's metric definitions do), so they are current
while the job trains; the platform's progress polls see only committed checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from contract import goodput
from contract.config import ConfigError, from_hyperparameters
from contract.layout import run_of, split_s3_uri
from contract.metrics import TOKENS_PER_SEC, TRAIN_LOSS, VALIDATION_LOSS, parse_line
from lambdas.batch.monitor import status_of as batch_status
from lambdas.handover import chain as handover_chain
from lambdas.sagemaker.monitor import sagemaker_transitions
from stacks.outputs import BATCH_JOB_LOG_GROUP, SAGEMAKER_TRAINING_LOG_GROUP

TAIL_EVENTS = 200
"""The newest log events of a stream read for its latest metrics: several metrics lines at any log interval."""


# -- the execution history --------------------------------------------------------------------------------


def history(sfn: Any, execution_arn: str) -> list[dict[str, Any]]:
    return [
        e
        for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
        for e in page["events"]
    ]


_SUCCEEDED = {
    "TaskSucceeded": "taskSucceededEventDetails",
    "LambdaFunctionSucceeded": "lambdaFunctionSucceededEventDetails",
}


def task_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the run's tasks returned, in order (a Lambda task's Payload unwrapped; truncated outputs skipped)."""
    results = []
    for event in events:
        details = event.get(_SUCCEEDED.get(event["type"], ""))
        if not details or details.get("outputDetails", {}).get("truncated"):
            continue
        output = json.loads(details.get("output") or "null")
        if isinstance(output, dict):
            payload = output.get("Payload", output)
            results.append(payload if isinstance(payload, dict) else output)
    return results


def _scheduled(events: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for event in events:
        if event["type"] == "TaskScheduled":
            yield json.loads(event["taskScheduledEventDetails"]["parameters"])


def training_jobs(events: list[dict[str, Any]]) -> list[str]:
    """The training jobs a run created, from its execution history, in order. A team's run queues them as service
    jobs, and Batch names the training jobs: those are the ones its progress polls followed."""
    names: list[str] = []
    queued: set[str] = set()
    for parameters in _scheduled(events):
        name = parameters.get("TrainingJobName")
        if isinstance(name, str) and name not in names:
            names.append(name)
        if "ServiceRequestPayload" in parameters:
            queued.add(parameters["JobName"])
    if queued:
        followed = [r.get("job_name") for r in task_results(events) if {"queued", "preemptions"} <= r.keys()]
        names += [n for n in dict.fromkeys(followed) if isinstance(n, str) and n not in queued and n not in names]
    return names


def tuning_jobs(events: list[dict[str, Any]]) -> list[str]:
    """The hyperparameter tuning jobs a run created, in order."""
    names = (p.get("HyperParameterTuningJobName") for p in _scheduled(events))
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))


def batch_jobs(events: list[dict[str, Any]]) -> list[str]:
    """The AWS Batch jobs a run submitted (their ids), from SubmitJob's answers, in order."""
    ids = (r.get("JobId") for r in task_results(events) if ":job/" in str(r.get("JobArn", "")))
    return list(dict.fromkeys(i for i in ids if isinstance(i, str)))


def validation(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Validate's answer ({"valid", "message", "request"}), once it has answered."""
    return next((r["validation"] for r in task_results(events) if isinstance(r.get("validation"), dict)), None)


def estimate(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in reversed(results) if {"hourly_usd", "max_cost_usd"} <= r.keys()), None)


def decisions(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gates' decisions, as the approvers recorded them (contract/execution_state.py Decision)."""
    return [r for r in results if {"decision", "by", "gate", "request_id"} <= r.keys()]


def model_package(results: list[dict[str, Any]]) -> str | None:
    return next((str(r["model_package_arn"]) for r in results if r.get("model_package_arn")), None)


# -- the jobs' log streams ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One host's log stream of one of the run's jobs."""

    job: str
    host: str
    group: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.job}/{self.host}"


def streams(session: Any, events: list[dict[str, Any]]) -> list[Stream]:
    """Every log stream of the run's jobs: SageMaker's per host (a tuning job's trials included), Batch's per node."""
    logs = session.client("logs")
    jobs = training_jobs(events)
    if tuning := tuning_jobs(events):
        jobs += [trial for name in tuning for trial in _trials(session.client("sagemaker"), name) if trial not in jobs]
    found = [stream for job in jobs for stream in _sagemaker_streams(logs, job)]
    if batch := batch_jobs(events):
        found += _batch_streams(session.client("batch"), batch)
    return found


def _trials(sagemaker: Any, tuning_job: str) -> list[str]:
    pages = sagemaker.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
        HyperParameterTuningJobName=tuning_job
    )
    return sorted(s["TrainingJobName"] for page in pages for s in page["TrainingJobSummaries"])


def _sagemaker_streams(logs: Any, job: str) -> list[Stream]:
    """SageMaker names a job's streams <job>/<host>-<epoch seconds>, one per host (and per restart of it)."""
    try:
        pages = logs.get_paginator("describe_log_streams").paginate(
            logGroupName=SAGEMAKER_TRAINING_LOG_GROUP, logStreamNamePrefix=f"{job}/"
        )
        names = [s["logStreamName"] for page in pages for s in page["logStreams"]]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return []  # no job of the account has logged yet
        raise
    return [Stream(job, name.split("/", 1)[1].rsplit("-", 1)[0], SAGEMAKER_TRAINING_LOG_GROUP, name) for name in names]


def _batch_streams(batch: Any, job_ids: list[str]) -> list[Stream]:
    """A multi-node job's nodes are its child jobs <id>#<node>; each names its container's stream, per attempt."""
    found: list[Stream] = []
    for parent in batch.describe_jobs(jobs=job_ids)["jobs"]:
        nodes = int(parent.get("nodeProperties", {}).get("numNodes", 1))
        children = [f"{parent['jobId']}#{node}" for node in range(nodes)]
        for child in batch.describe_jobs(jobs=children)["jobs"]:
            names = [a.get("container", {}).get("logStreamName") for a in child.get("attempts", [])]
            names.append(child.get("container", {}).get("logStreamName"))
            host = f"node-{child['jobId'].rsplit('#', 1)[-1]}"
            found += [Stream(parent["jobName"], host, BATCH_JOB_LOG_GROUP, n) for n in dict.fromkeys(names) if n]
    return found


def events_of(
    logs: Any, chosen: list[Stream], *, since_ms: int | None = None
) -> Iterator[tuple[Stream, dict[str, Any]]]:
    """The streams' events from `since_ms` on, in time order within each log group."""
    for group in dict.fromkeys(s.group for s in chosen):
        by_name = {s.name: s for s in chosen if s.group == group}
        names = list(by_name)
        for start in range(0, len(names), 100):  # FilterLogEvents takes at most 100 stream names
            kwargs: dict[str, Any] = {"logGroupName": group, "logStreamNames": names[start : start + 100]}
            if since_ms is not None:
                kwargs["startTime"] = since_ms
            for page in logs.get_paginator("filter_log_events").paginate(**kwargs):
                for event in page["events"]:
                    yield by_name[event["logStreamName"]], event


# -- what the newest lines say ------------------------------------------------------------------------------


def latest(logs: Any, job_streams: list[Stream]) -> dict[str, Any] | None:
    """The newest metrics the job logged: its step, loss, tokens/s and validation loss, and its steps per second
    over the newest lines (None: no metrics line yet)."""
    points: list[tuple[int, int, dict[str, float]]] = []  # (timestamp ms, step, values)
    for stream in job_streams:
        answer = logs.get_log_events(
            logGroupName=stream.group, logStreamName=stream.name, startFromHead=False, limit=TAIL_EVENTS
        )
        for event in answer["events"]:
            if parsed := parse_line(event["message"]):
                points.append((int(event["timestamp"]), *parsed))
    trained = sorted((p for p in points if TRAIN_LOSS in p[2]), key=lambda p: (p[1], p[0]))
    if not trained:
        return None
    at, step, values = trained[-1]
    validated = [p for p in points if VALIDATION_LOSS in p[2]]
    newest_eval = max(validated, key=lambda p: (p[1], p[0])) if validated else None
    first = next((p for p in trained if p[0] >= at - 300_000), trained[-1])  # the last five minutes' rate
    rate = (step - first[1]) / ((at - first[0]) / 1000) if at > first[0] and step > first[1] else None
    return {
        "step": step,
        "loss": values[TRAIN_LOSS],
        "tokens_per_sec": values.get(TOKENS_PER_SEC),
        "logged_at": datetime.fromtimestamp(at / 1000, UTC).isoformat(),
        "validation_loss": newest_eval[2][VALIDATION_LOSS] if newest_eval else None,
        "validation_step": newest_eval[1] if newest_eval else None,
        "steps_per_second": round(rate, 4) if rate else None,
    }


# -- goodput -------------------------------------------------------------------------------------------------


def finished_goodput(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The goodput of the run's finished jobs, from the ledgers their last progress polls returned."""
    ledgers = {r["job_name"]: r["goodput"] for r in results if r.get("goodput") and "job_name" in r}
    if not ledgers:
        return None
    run = goodput.RunLedger([goodput.JobLedger.from_json(body) for body in ledgers.values()])
    return {**run.to_json(), "summary": run.summary()}


def running_goodput(s3: Any, job: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """A running SageMaker job's ledger so far: its billed time until now against its trainer's progress records in
    the run's checkpoints (the ledger its progress handler writes when it ends, provisionally). None when the
    job has not started training or keeps no checkpoints."""
    started = job.get("TrainingStartTime")
    location = job.get("CheckpointConfig", {}).get("S3Uri")
    if not isinstance(started, datetime) or not location:
        return None
    bucket, _ = split_s3_uri(location)
    name = job["TrainingJobName"]
    groups = job.get("ResourceConfig", {}).get("InstanceGroups") or [job.get("ResourceConfig", {})]
    ledger = goodput.job_ledger(
        name,
        instances=sum(int(g.get("InstanceCount", 1)) for g in groups),
        billed_start=started,
        billed_end=now,
        transitions=sagemaker_transitions(job),
        records=goodput.stored_records(s3, bucket, run_of(name), name),
    )
    return {**ledger.to_json(), "summary": goodput.RunLedger([ledger]).summary()}


def max_steps(hyperparameters: dict[str, str]) -> int | None:
    try:
        return from_hyperparameters(hyperparameters).train.max_steps
    except ConfigError:
        return None


# -- the run now ------------------------------------------------------------------------------------------


def snapshot(session: Any, execution_arn: str, *, now: datetime | None = None) -> dict[str, Any]:
    """The run now: its state (an ended run's error and cause), its latest training job (status; the step, loss,
    tokens/s and validation loss it last logged; its ETA at the current rate), its cost so far at the estimate's
    list price (every job it started, spot billing included once SageMaker reports it), its newest checkpoint as
    the platform's last progress poll saw it, and its goodput: of its finished jobs, and of the running one so far.

    What the caller may not read (the logs, the checkpoints bucket) is left out and said in `notes`."""
    now = now or datetime.now(UTC)
    sfn = session.client("stepfunctions")
    # A run handed over to new executions: the one it is in now, and the events of all of them.
    chain = handover_chain.executions(sfn, execution_arn)
    described = chain[-1][1]
    events = [event for arn, _ in chain for event in history(sfn, arn)]
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if e["type"].endswith("StateEntered")]
    results = task_results(events)
    cost = estimate(results)
    progress = next((r for r in reversed(results) if {"checkpoint", "interruptions"} <= r.keys()), None)
    state: dict[str, Any] = {
        "run": chain[0][1]["name"],
        "status": described["status"],
        "state": entered[-1] if entered else None,
        "error": described.get("error"),
        "cause": described.get("cause"),
        "team": ((validation(events) or {}).get("request") or {}).get("team"),
        "job": None,
        "cost_so_far_usd": None,
        "max_cost_usd": cost["max_cost_usd"] if cost else None,
        "checkpoint": (progress or {}).get("checkpoint"),
        "interruptions": (progress or {}).get("interruptions"),
        "queued": (progress or {}).get("queued"),
        "preemptions": (progress or {}).get("preemptions"),
        "goodput": finished_goodput(results),
        "running_goodput": None,
        "notes": [],
    }
    sagemaker = session.client("sagemaker")
    described_jobs = [job for job in (_described_job(sagemaker, name) for name in training_jobs(events)) if job]
    if not described_jobs:
        if batch := batch_jobs(events):
            _with_batch_job(session, state, batch, most=_requested_steps(events), cost=cost, now=now)
        return state
    if cost:
        seconds = sum(_billed_seconds(job, now) for job in described_jobs)
        state["cost_so_far_usd"] = round(cost["hourly_usd"] * seconds / 3600, 2)
    job = described_jobs[-1]
    state["job"] = _job_state(job, state["checkpoint"], now)
    logs = session.client("logs")
    newest = _readable(state, "its log lines", lambda: latest(logs, _sagemaker_streams(logs, job["TrainingJobName"])))
    _with_latest(state["job"], newest)
    if job["TrainingJobStatus"] == "InProgress":
        s3 = session.client("s3")
        state["running_goodput"] = _readable(state, "its progress records", lambda: running_goodput(s3, job, now))
    return state


def _job_state(job: dict[str, Any], checkpoint: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    metrics = {m["MetricName"]: m["Value"] for m in job.get("FinalMetricDataList", [])}
    return {
        **_job_view(
            job["TrainingJobName"],
            (job["TrainingJobStatus"], job.get("SecondaryStatus")),
            checkpoint,
            max_steps(job.get("HyperParameters", {})),
            _trained_seconds(job, now),
        ),
        "loss": metrics.get(TRAIN_LOSS),
        "tokens_per_sec": metrics.get(TOKENS_PER_SEC),
        "validation_loss": metrics.get(VALIDATION_LOSS),
        "billable_seconds": job.get("BillableTimeInSeconds"),
        "training_seconds": job.get("TrainingTimeInSeconds"),
        "max_runtime_seconds": job.get("StoppingCondition", {}).get("MaxRuntimeInSeconds"),
    }


def _job_view(
    name: str, status: tuple[str, str | None], checkpoint: dict[str, Any] | None, most: int | None, training: float
) -> dict[str, Any]:
    """A job as `tp watch` shows it, in SageMaker's vocabulary whatever ran it, until its log lines say more."""
    step = (checkpoint or {}).get("step")
    return {
        "name": name,
        "status": status[0],
        "secondary_status": status[1],
        "loss": None,
        "tokens_per_sec": None,
        "validation_loss": None,
        "step": step,
        "checkpointed_step": step,
        "max_steps": most,
        "eta_seconds": round((most - step) * training / step) if step and most and training else None,
        "latest": None,
        "billable_seconds": None,
        "training_seconds": round(training),
        "max_runtime_seconds": None,
    }


def _with_batch_job(
    session: Any, state: dict[str, Any], ids: list[str], *, most: int | None, cost: dict[str, Any] | None, now: datetime
) -> None:
    """A Batch run's newest job (its status, step, loss and ETA from its nodes' newest log lines), and its cost so
    far over every job it submitted, priced as its progress polls price them (lambdas/batch/monitor.py)."""
    batch = session.client("batch")
    jobs = {job["jobId"]: job for job in batch.describe_jobs(jobs=ids)["jobs"]}
    if not jobs:
        return
    if cost:
        seconds = sum(_batch_seconds(job, now) for job in jobs.values())
        state["cost_so_far_usd"] = round(cost["hourly_usd"] * seconds / 3600, 2)
    job = jobs[next(i for i in reversed(ids) if i in jobs)]
    state["job"] = _job_view(job["jobName"], batch_status(job), state["checkpoint"], most, _batch_seconds(job, now))
    logs = session.client("logs")
    newest = _readable(state, "its log lines", lambda: latest(logs, _batch_streams(batch, [job["jobId"]])))
    _with_latest(state["job"], newest)


def _batch_seconds(job: dict[str, Any], now: datetime) -> float:
    """The seconds a Batch job's attempts ran, the running one until now."""
    spans = [(a.get("startedAt"), a.get("stoppedAt")) for a in job.get("attempts", [])]
    if job.get("startedAt") and not job.get("stoppedAt"):
        spans.append((job["startedAt"], None))
    now_ms = now.timestamp() * 1000
    return float(sum(((stop or now_ms) - start) / 1000 for start, stop in spans if start))


def _requested_steps(events: list[dict[str, Any]]) -> int | None:
    """The run's max_steps as Validate resolved its request."""
    request = (validation(events) or {}).get("request") or {}
    return max_steps(request.get("hyperparameters") or {})


def _with_latest(job: dict[str, Any], newest: dict[str, Any] | None) -> None:
    """The job's state from its newest log lines: they are ahead of its last checkpoint and of SageMaker's metrics."""
    if newest is None:
        return
    job["latest"] = newest
    job["step"] = newest["step"]
    job["loss"] = newest["loss"]
    job["tokens_per_sec"] = newest["tokens_per_sec"] or job["tokens_per_sec"]
    if newest["validation_loss"] is not None:
        job["validation_loss"] = newest["validation_loss"]
    if job["status"] == "InProgress" and job["max_steps"] and newest["steps_per_second"]:
        job["eta_seconds"] = round(max(0, job["max_steps"] - newest["step"]) / newest["steps_per_second"])


def _readable(state: dict[str, Any], what: str, read: Any) -> Any:
    """`read()`, or None with a note in the state when AWS refuses the caller (a role may not read logs or S3)."""
    try:
        return read()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") not in ("AccessDenied", "AccessDeniedException"):
            raise
        state["notes"].append(f"not shown: {what} ({exc.operation_name} was denied: {error.get('Message')})")
        return None


def _described_job(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob, or None for a job the run asked for that SageMaker has not created yet."""
    try:
        return dict(sagemaker.describe_training_job(TrainingJobName=name))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationException":
            return None
        raise


def _billed_seconds(job: dict[str, Any], now: datetime) -> float:
    """SageMaker's billable seconds once it reports them; until then the seconds trained."""
    billable = job.get("BillableTimeInSeconds")
    return float(billable) if billable is not None else _trained_seconds(job, now)


def _trained_seconds(job: dict[str, Any], now: datetime) -> float:
    """SageMaker's training seconds once it reports them; until then the time since training started."""
    if job.get("TrainingTimeInSeconds") is not None:
        return float(job["TrainingTimeInSeconds"])
    started, ended = job.get("TrainingStartTime"), job.get("TrainingEndTime")
    if not isinstance(started, datetime):
        return 0.0
    return max(0.0, ((ended if isinstance(ended, datetime) else now) - started).total_seconds())
