"""The demo's `--fault` switch: what each fault injects into the local platform, and what the run made of it.

`monitor-throttle` and `monitor-timeout` hit the backend's progress handler (transient: the run rides through);
`insufficient-capacity` leaves the run's first cluster without instances, as SageMaker reports it
(localrun/backends/sagemaker.py NO_CAPACITY), so the pipeline falls back to the request's next cluster.
"""

from __future__ import annotations

import json

from localrun.aws.engine import LocalPlatform
from localrun.backends.sagemaker import LocalTraining
from localrun.demo.jobs import Job
from stacks.pipeline.polled_job import CHECK_PROGRESS

# A burst longer than the short retry budget (stacks/constructs/tasks.py), well within the polling one.
BURST = ["ThrottlingException", "InternalFailure", "ServiceUnavailable"] * 3 + ["ThrottlingException"]
INSUFFICIENT_CAPACITY = "insufficient-capacity"
FAULTS = ("monitor-throttle", "monitor-timeout", INSUFFICIENT_CAPACITY)
SHORT_CLUSTERS = 1
"""How many of the run's clusters `insufficient-capacity` leaves without instances: its first."""


def progress_handlers(platform: LocalPlatform) -> list[str]:
    """The progress handler of every backend (LocalPlatform's names): what the Check progress states invoke."""
    definition = json.loads(
        platform.sfn.describe_state_machine(stateMachineArn=platform.state_machine_arn)["definition"]
    )
    physical = [
        state["Resource"].rsplit(":function:", 1)[1]
        for name, state in definition["States"].items()
        if name.startswith(CHECK_PROGRESS) and ":function:" in state.get("Resource", "")
    ]
    return [str(platform.functions[name].key) for name in physical]


def inject(platform: LocalPlatform, training: LocalTraining, fault: str) -> None:
    """Queue `fault` (one of FAULTS): at every backend's progress handler, or in the local SageMaker's capacity."""
    if fault == INSUFFICIENT_CAPACITY:
        training.short_clusters = SHORT_CLUSTERS
        return
    for function in progress_handlers(platform):
        if fault == "monitor-throttle":
            platform.faults.api_errors[function] = list(BURST)
        elif fault == "monitor-timeout":
            platform.faults.timeouts[function] = 3
        else:
            raise ValueError(f"--fault {fault!r}: use one of {', '.join(FAULTS)}")


def ridden(platform: LocalPlatform, arn: str, fault: str, jobs: list[Job]) -> str:
    """What the injected fault did: the clusters without capacity and the one that trained, or the handler
    failures the execution met and the retries that followed."""
    if fault == INSUFFICIENT_CAPACITY:
        return capacity_story(jobs)
    failures = [
        details["error"]
        for event in platform.history(arn)
        for key, details in event.items()
        if key == "lambdaFunctionFailedEventDetails"
    ]
    counts = ", ".join(f"{failures.count(error)} {error}" for error in sorted(set(failures)))
    waits = platform.clock.retries
    return f"handler failures: {counts or 'none'}; {len(waits)} retries, {sum(waits) / 60:.1f} min of backoff"


def capacity_story(jobs: list[Job]) -> str:
    """The jobs that found no capacity, by cluster, and the cluster that trained (if one did)."""
    short = [job for job in jobs if job.failure and job.failure.startswith("CapacityError")]
    lines = [f"{job.name} on {job.cluster}: {str(job.failure).rstrip('.')}" for job in short]
    trained = [job.cluster for job in jobs if job.status == "Completed"]
    lines.append(f"trained on {trained[-1]}" if trained else "no cluster trained")
    return "; ".join(lines)
